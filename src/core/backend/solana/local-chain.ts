import {readFileSync} from 'node:fs'
import {dirname, join} from 'node:path'
import {fileURLToPath} from 'node:url'
import {
  AccountRole,
  appendTransactionMessageInstructions,
  generateKeyPairSigner,
  getProgramDerivedAddress,
  createTransactionMessage,
  getTransactionSize,
  lamports,
  pipe,
  setTransactionMessageFeePayerSigner,
  setTransactionMessageLifetimeUsingBlockhash,
  signTransactionMessageWithSigners,
  type Address,
  type Instruction,
  type TransactionSigner,
} from '@solana/kit'
import {Clock, FailedTransactionMetadata, FeatureSet, LiteSVM} from 'litesvm'
import {oversized, programErrorName, type Chain, type SendResult} from './chain.js'
import {SYSTEM_PROGRAM, withComputeBudget, withUnits} from './instructions.js'
import {addressBytes} from './layout.js'

export type {SendResult} from './chain.js'

/** The built coordinator program (committed; `npm run build:programs` rebuilds it). */
const BUILD = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..', '..', 'programs', 'build')
export const COORDINATOR_PROGRAM_PATH = join(BUILD, 'psyche_coordinator.so')
/** The built authorizer program (permissioned runs). */
export const AUTHORIZER_PROGRAM_PATH = join(BUILD, 'psyche_authorizer.so')
/** The built treasurer program (token rewards for points). */
export const TREASURER_PROGRAM_PATH = join(BUILD, 'psyche_treasurer.so')

/** The builds of a program for `features`: sBPF v3 for a current cluster, v0 for one without SIMD-0500. */
export function programPath(path: string, features: ChainFeatures): string {
  return features === 'legacy' ? path.replace(/\.so$/, '.v0.so') : path
}

const UPGRADEABLE_LOADER = 'BPFLoaderUpgradeab1e11111111111111111111111' as Address
const RENT_SYSVAR = 'SysvarRent111111111111111111111111111111111' as Address
const CLOCK_SYSVAR = 'SysvarC1ock11111111111111111111111111111111' as Address

/** disable_sbpf_v0_v1_v2_deployment (SIMD-0500): a cluster with it refuses to deploy sBPF v0, v1 and v2 programs. */
const SIMD_0500_FEATURE = 'B8JJXCy5amZyWG9r7EnUYLwzXSXTxG7GZ1qZ1qggo83g' as Address

/**
 * The features a chain runs with: 'current' is every feature this runtime knows active, as a current
 * solana-test-validator has them (SIMD-0500 included); 'legacy' is the same without SIMD-0500, as a cluster that still
 * deploys sBPF v0.
 */
export type ChainFeatures = 'current' | 'legacy'

function runtime(features: ChainFeatures): LiteSVM {
  const set = FeatureSet.allEnabled()
  if (features === 'legacy') set.deactivate(addressBytes(SIMD_0500_FEATURE))
  return LiteSVM.default()
    .withFeatureSet(set)
    .withBuiltins()
    .withSysvars()
    .withPrecompiles()
    .withDefaultPrograms()
    .withLamports(1_000_000_000_000_000_000n)
    .withSigverify(true)
    .withBlockhashCheck(true)
}

/**
 * A Solana runtime in this process (LiteSVM: the real SVM, loader and syscalls, no network) with the
 * coordinator program loaded, and every feature of a current cluster active (`features`). Time is what `setTime`
 * says, so tests and simulations are repeatable.
 */
export class LocalChain implements Chain {
  readonly svm: LiteSVM

  /** `programBytes` null: nothing is loaded (deploy programs with `deploy`). */
  constructor(
    readonly programId: Address,
    programBytes: Uint8Array | null = readFileSync(COORDINATOR_PROGRAM_PATH),
    readonly features: ChainFeatures = 'current',
  ) {
    this.svm = runtime(features)
    if (programBytes) this.svm.addProgram(programId, programBytes)
  }

  /**
   * Deploys a program as a cluster does: through the upgradeable BPF loader's DeployWithMaxDataLen, whose deploy-time
   * checks apply (the strict ELF parser, the verifier, and the sBPF versions the features allow: with SIMD-0500 active,
   * v0, v1 and v2 are refused). The program account and the buffer are written directly (no keypair holds the program
   * id); the program runs from the next slot, which this moves to. Throws, with the loader's logs, when refused.
   */
  async deploy(programId: Address, bytes: Uint8Array): Promise<void> {
    const authority = await generateKeyPairSigner()
    this.airdrop(authority.address, 1_000n)
    const buffer = (await generateKeyPairSigner()).address
    // UpgradeableLoaderState::Buffer {authority_address: Some(authority)} (bincode), then the program
    const data = Buffer.alloc(37 + bytes.length)
    data.writeUInt32LE(1, 0)
    data[4] = 1
    Buffer.from(addressBytes(authority.address)).copy(data, 5)
    Buffer.from(bytes).copy(data, 37)
    const account = (address: Address, content: Uint8Array) =>
      this.svm.setAccount({
        address,
        lamports: lamports(this.rentExemption(content.length)),
        data: content,
        programAddress: UPGRADEABLE_LOADER,
        executable: false,
        space: BigInt(content.length),
      })
    account(buffer, data)
    account(programId, new Uint8Array(36)) // UpgradeableLoaderState::Uninitialized, the size of a Program
    const [programData] = await getProgramDerivedAddress({programAddress: UPGRADEABLE_LOADER, seeds: [addressBytes(programId)]})
    const deploy = Buffer.alloc(12)
    deploy.writeUInt32LE(2, 0) // DeployWithMaxDataLen
    deploy.writeBigUInt64LE(BigInt(bytes.length), 4)
    const r = await this.send(authority, [
      withUnits(
        {
          programAddress: UPGRADEABLE_LOADER,
          data: deploy,
          accounts: [
            {address: authority.address, role: AccountRole.WRITABLE_SIGNER, signer: authority},
            {address: programData, role: AccountRole.WRITABLE},
            {address: programId, role: AccountRole.WRITABLE},
            {address: buffer, role: AccountRole.WRITABLE},
            {address: RENT_SYSVAR, role: AccountRole.READONLY},
            {address: CLOCK_SYSVAR, role: AccountRole.READONLY},
            {address: SYSTEM_PROGRAM, role: AccountRole.READONLY},
            {address: authority.address, role: AccountRole.READONLY_SIGNER, signer: authority},
          ],
        },
        1_400_000,
      ),
    ])
    if (!r.ok) throw new Error(`deploying ${programId} failed: ${r.logs.filter((l) => !l.startsWith('Program ComputeBudget')).join('; ') || r.error}`)
    const clock = this.svm.getClock()
    this.setClock(Number(clock.unixTimestamp), Number(clock.slot) + 1)
  }

  /** Deploys another program (e.g. the authorizer at AUTHORIZER_PROGRAM_PATH). */
  addProgram(programId: Address, bytes: Uint8Array): void {
    this.svm.addProgram(programId, bytes)
  }

  airdrop(address: Address, sol = 100n): void {
    const r = this.svm.airdrop(address, lamports(sol * 1_000_000_000n))
    if (r instanceof FailedTransactionMetadata) throw new Error(`airdrop to ${address} failed: ${r.toString()}`)
  }

  /** Sets the cluster clock's unix time (seconds), which the program reads as "now", and moves to the next slot. */
  setTime(unixSeconds: number): void {
    this.setClock(unixSeconds, Number(this.svm.getClock().slot) + 1)
  }

  /** Sets the cluster clock's unix time (seconds) and slot. */
  setClock(unixSeconds: number, slot: number): void {
    const c = this.svm.getClock()
    this.svm.setClock(new Clock(BigInt(slot), c.epochStartTimestamp, c.epoch, c.leaderScheduleEpoch, BigInt(unixSeconds)))
  }

  rentExemption(bytes: number): bigint {
    return this.svm.minimumBalanceForRentExemption(BigInt(bytes))
  }

  accountData(address: Address): Uint8Array | undefined {
    const account = this.svm.getAccount(address)
    return account.exists ? Uint8Array.from(account.data) : undefined
  }

  async fetchAccount(address: Address): Promise<Uint8Array | undefined> {
    return this.accountData(address)
  }

  async minimumBalance(bytes: number): Promise<bigint> {
    return this.rentExemption(bytes)
  }

  /** Signs and executes one transaction; failures are returned, not thrown. */
  async send(payer: TransactionSigner, instructions: Instruction[]): Promise<SendResult> {
    // Several senders may share this chain: each send expires the blockhash, so a transaction signed while another
    // was sent is signed again with the new one.
    let tx
    let blockhash: ReturnType<LiteSVM['latestBlockhash']>
    do {
      blockhash = this.svm.latestBlockhash()
      const message = pipe(
        createTransactionMessage({version: 0}),
        (m) => setTransactionMessageFeePayerSigner(payer, m),
        (m) => setTransactionMessageLifetimeUsingBlockhash({blockhash, lastValidBlockHeight: 0n}, m),
        (m) => appendTransactionMessageInstructions(withComputeBudget(instructions), m),
      )
      tx = await signTransactionMessageWithSigners(message)
    } while (blockhash !== this.svm.latestBlockhash())
    // as a cluster: a transaction over 1,232 bytes is refused before it runs (LiteSVM would run it)
    const tooLarge = oversized(tx)
    if (tooLarge) return {ok: false, error: `TransactionTooLarge: ${tooLarge}`, logs: [], computeUnits: 0n}
    const bytes = getTransactionSize(tx)
    const r = this.svm.sendTransaction(tx)
    this.svm.expireBlockhash() // the same instruction may be sent again (ticks): give it a new signature
    if (r instanceof FailedTransactionMetadata) {
      const meta = r.meta()
      const err = r.err() as unknown as {err?: () => unknown}
      const inner = typeof err.err === 'function' ? (err.err() as {code?: number}) : undefined
      const code = typeof inner?.code === 'number' ? inner.code : undefined
      return {
        ok: false,
        code,
        error: code !== undefined ? programErrorName(meta.logs(), code) : r.toString(),
        logs: meta.logs(),
        computeUnits: meta.computeUnitsConsumed(),
        bytes,
      }
    }
    return {ok: true, logs: r.logs(), computeUnits: r.computeUnitsConsumed(), bytes}
  }
}
