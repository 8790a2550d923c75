import {readFileSync} from 'node:fs'
import {dirname, join} from 'node:path'
import {fileURLToPath} from 'node:url'
import {
  appendTransactionMessageInstructions,
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
import {Clock, FailedTransactionMetadata, LiteSVM} from 'litesvm'
import {oversized, programErrorName, type Chain, type SendResult} from './chain.js'
import {withComputeBudget} from './instructions.js'

export type {SendResult} from './chain.js'

/** The built coordinator program (committed; `npm run build:programs` rebuilds it). */
const BUILD = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..', '..', 'programs', 'build')
export const COORDINATOR_PROGRAM_PATH = join(BUILD, 'psyche_coordinator.so')
/** The built authorizer program (permissioned runs). */
export const AUTHORIZER_PROGRAM_PATH = join(BUILD, 'psyche_authorizer.so')

/**
 * A Solana runtime in this process (LiteSVM: the real SVM, loader and syscalls, no network) with the
 * coordinator program deployed. Time is what `setTime` says, so tests and simulations are repeatable.
 */
export class LocalChain implements Chain {
  readonly svm: LiteSVM

  constructor(
    readonly programId: Address,
    programBytes: Uint8Array = readFileSync(COORDINATOR_PROGRAM_PATH),
  ) {
    this.svm = new LiteSVM()
    this.svm.addProgram(programId, programBytes)
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
