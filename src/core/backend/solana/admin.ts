import {
  appendTransactionMessageInstructions,
  createKeyPairSignerFromBytes,
  createTransactionMessage,
  getTransactionSize,
  pipe,
  setTransactionMessageFeePayerSigner,
  setTransactionMessageLifetimeUsingBlockhash,
  signTransactionMessageWithSigners,
  type Address,
  type Blockhash,
  type Instruction,
  type KeyPairSigner,
  type TransactionSigner,
} from '@solana/kit'
import {programRefusal, programUnsupported} from '../../config/support.js'
import type {RunConfigFile} from '../../config/types.js'
import {PsycheError} from '../../errors.js'
import {readSecretFile} from '../../secret-file.js'
import {AUTHORIZATION_SIZE, authorizationAddress, decodeAuthorization, delegatesInstruction, grantInstruction, revokeInstruction, type Authorization} from './authorizer.js'
import {TRANSACTION_SIZE_LIMIT, type Chain} from './chain.js'
import {
  closePeerInstruction,
  coordinatorAddress,
  initCoordinatorInstructions,
  metadataAddress,
  peerAddress,
  setMetadataInstruction,
  setPausedInstruction,
  setRatesInstruction,
  bufferedUpdateTransactions,
  updateBufferAddress,
  updateInstruction,
  withComputeBudget,
} from './instructions.js'
import {
  METADATA_SIZE,
  STATE_SIZE,
  UPDATE_BUFFER_SIZE,
  addressOfClient,
  decodeCoordinator,
  decodeLedger,
  decodeMetadata,
  type OnChainCoordinator,
  type OnChainLedger,
  type RunMetadata,
} from './layout.js'
import type {SendResult} from './local-chain.js'
import {associatedTokenAccountInstruction, associatedTokenAddress, tokenBalance} from './spl.js'
import {
  PARTICIPANT_SIZE,
  TOKEN_ACCOUNT_SIZE,
  TREASURY_SIZE,
  claimInstruction,
  decodeParticipant,
  decodeTreasury,
  fundInstruction,
  initTreasuryInstruction,
  participantAddress,
  treasuryAddress,
  type Treasury,
} from './treasurer.js'

/**
 * What a run creator does on Solana (the commands create-run, update-config, set-paused, authorize):
 * each builds the program's instructions, sends them through a Chain and reports the outcome.
 */

/** Reads a Solana CLI keypair file (a JSON array of 64 numbers: secret key then public key). */
export async function loadKeypair(path: string): Promise<KeyPairSigner> {
  return (await loadKeypairWithSeed(path)).signer
}

/** A keypair file's signer and its 32-byte ed25519 seed (a psyche identity is the same key: identityFromSeed). */
export async function loadKeypairWithSeed(path: string): Promise<{signer: KeyPairSigner; seed: Uint8Array}> {
  let bytes: unknown
  try {
    bytes = JSON.parse(await readSecretFile(path, 'Solana keypair'))
  } catch (error) {
    if (error instanceof PsycheError) throw error
    throw new PsycheError(`${path}: cannot read a Solana keypair: ${(error as Error).message}`, {code: 'EKEYPAIR'})
  }
  if (!Array.isArray(bytes) || bytes.length !== 64 || !bytes.every((b) => Number.isInteger(b) && b >= 0 && b <= 255)) {
    throw new PsycheError(`${path}: a Solana keypair file is a JSON array of 64 bytes (solana-keygen new -o ${path})`, {code: 'EKEYPAIR'})
  }
  try {
    return {signer: await createKeyPairSignerFromBytes(Uint8Array.from(bytes)), seed: Uint8Array.from(bytes.slice(0, 32))}
  } catch (error) {
    throw new PsycheError(`${path}: not a valid ed25519 keypair: ${(error as Error).message}`, {code: 'EKEYPAIR'})
  }
}

function check(r: SendResult, what: string): void {
  if (r.ok) return
  const why = r.logs.filter((l) => l.startsWith('Program log: ')).map((l) => l.slice('Program log: '.length))
  throw new PsycheError(`${what} refused: ${r.error}${why.length ? ` (${why.join('; ')})` : ''}`, {code: 'EREFUSED'})
}

interface RunTarget {
  chain: Chain
  programId: Address
  runId: string
}

export async function readRun(t: RunTarget): Promise<OnChainCoordinator> {
  const address = await coordinatorAddress(t.programId, t.runId)
  const data = await t.chain.fetchAccount(address)
  if (!data) throw new PsycheError(`run ${JSON.stringify(t.runId)}: no coordinator account ${address} (create it with psyche create-run)`, {code: 'ENORUN'})
  return decodeCoordinator(data)
}

/** The run's coordinator account and its rewards ledger (one read). */
export async function readRunLedger(t: RunTarget): Promise<{run: OnChainCoordinator; ledger: OnChainLedger}> {
  const address = await coordinatorAddress(t.programId, t.runId)
  const data = await t.chain.fetchAccount(address)
  if (!data) throw new PsycheError(`run ${JSON.stringify(t.runId)}: no coordinator account ${address} (create it with psyche create-run)`, {code: 'ENORUN'})
  return {run: decodeCoordinator(data), ledger: decodeLedger(data)}
}

/** init_coordinator (+ grow) for the run id; the payer funds the account's rent exemption. */
export async function createRun(t: RunTarget & {payer: TransactionSigner; mainAuthority: Address; joinAuthority: Address | null; authorizer: Address | null}): Promise<Address> {
  const coordinator = await coordinatorAddress(t.programId, t.runId)
  const lamports = await t.chain.minimumBalance(STATE_SIZE)
  const r = await t.chain.send(
    t.payer,
    initCoordinatorInstructions({
      programId: t.programId,
      coordinator,
      payer: t.payer,
      runId: t.runId,
      mainAuthority: t.mainAuthority,
      joinAuthority: t.joinAuthority,
      authorizer: t.authorizer,
      lamports,
    }),
  )
  check(r, `create-run ${t.runId}`)
  return coordinator
}

/**
 * The transactions that set a run configuration file, checked before anything is sent: the file must have a [config]
 * and be encodable for the program (a Hub, P2P or Dummy checkpoint; model JSON within MODEL_JSON_MAX). One `update`
 * when its transaction fits the 1,232 bytes a cluster accepts; otherwise the run's update buffer (buffer_init, chunks,
 * update_from_buffer), each transaction of which fits.
 */
export async function prepareUpdate(t: RunTarget & {authority: TransactionSigner; file: RunConfigFile}): Promise<Instruction[][]> {
  if (!t.file.config) throw new PsycheError(`${t.file.path}: no [config] table: update-config needs the run's configuration`, {code: 'ECONFIG'})
  const unsupported = programUnsupported(t.file)
  if (unsupported.length > 0) throw new PsycheError(programRefusal(t.file.path, unsupported), {code: 'ECONFIG'})
  const coordinator = await coordinatorAddress(t.programId, t.runId)
  let ix: Instruction
  try {
    ix = updateInstruction(t.programId, coordinator, t.authority, t.file.config, t.file.model)
  } catch (error) {
    throw new PsycheError(`${t.file.path}: ${(error as Error).message}`, {code: 'ECONFIG'})
  }
  if ((await transactionSize(t.authority, [ix])) <= TRANSACTION_SIZE_LIMIT) return [[ix]]
  const buffer = await updateBufferAddress(t.programId, coordinator)
  const plan = bufferedUpdateTransactions(t.programId, coordinator, t.authority, buffer, await t.chain.minimumBalance(UPDATE_BUFFER_SIZE), t.file.config, t.file.model)
  for (const tx of plan) {
    const size = await transactionSize(t.authority, tx)
    if (size > TRANSACTION_SIZE_LIMIT) throw new Error(`an update buffer transaction is ${size} bytes, more than a cluster accepts (${TRANSACTION_SIZE_LIMIT})`)
  }
  return plan
}

/** Sends an update's transactions (prepareUpdate) in order; the first refusal ends it (a later run starts the buffer anew). */
export async function sendUpdate(chain: Chain, authority: TransactionSigner, plan: Instruction[][]): Promise<SendResult> {
  let r: SendResult = {ok: true, logs: [], computeUnits: 0n}
  for (const tx of plan) {
    r = await chain.send(authority, tx)
    if (!r.ok) return r
  }
  return r
}

/** The wire size of a transaction of these instructions (signed offline, on a placeholder blockhash). */
async function transactionSize(payer: TransactionSigner, instructions: Instruction[]): Promise<number> {
  const message = pipe(
    createTransactionMessage({version: 0}),
    (m) => setTransactionMessageFeePayerSigner(payer, m),
    (m) => setTransactionMessageLifetimeUsingBlockhash({blockhash: PLACEHOLDER_BLOCKHASH, lastValidBlockHeight: 0n}, m),
    (m) => appendTransactionMessageInstructions(withComputeBudget(instructions, 1n), m),
  )
  return getTransactionSize(await signTransactionMessageWithSigners(message))
}
const PLACEHOLDER_BLOCKHASH = '11111111111111111111111111111111' as Blockhash

/** update: the run's [config] and [model.LLM] from a validated run configuration file. */
export async function updateConfig(t: RunTarget & {authority: TransactionSigner; file: RunConfigFile}): Promise<void> {
  check(await sendUpdate(t.chain, t.authority, await prepareUpdate(t)), `update-config ${t.runId}`)
}

/** set_metadata: the run's name and description (Psyche's create-run --name --description). */
export async function setMetadata(t: RunTarget & {authority: TransactionSigner; metadata: RunMetadata}): Promise<Address> {
  const coordinator = await coordinatorAddress(t.programId, t.runId)
  const record = await metadataAddress(t.programId, coordinator)
  let ix
  try {
    ix = setMetadataInstruction(t.programId, coordinator, t.authority, record, t.metadata, await t.chain.minimumBalance(METADATA_SIZE))
  } catch (error) {
    throw new PsycheError(`run ${t.runId}: ${(error as Error).message}`, {code: 'EUSAGE'})
  }
  check(await t.chain.send(t.authority, [ix]), `set the name and description of ${t.runId}`)
  return record
}

/** A client leaves the run's peer directory: its peer record is closed (its rent returned); false when it had none. */
export async function closePeerRecord(t: RunTarget & {client: TransactionSigner}): Promise<boolean> {
  const coordinator = await coordinatorAddress(t.programId, t.runId)
  const record = await peerAddress(t.programId, coordinator, t.client.address)
  if (!(await t.chain.fetchAccount(record))) return false
  check(await t.chain.send(t.client, [closePeerInstruction(t.programId, coordinator, t.client, record)]), `closing the peer record of ${t.client.address}`)
  return true
}

/** The run's name and description, when set. */
export async function readMetadata(t: RunTarget): Promise<RunMetadata | undefined> {
  const data = await t.chain.fetchAccount(await metadataAddress(t.programId, await coordinatorAddress(t.programId, t.runId)))
  if (!data) return undefined
  const {name, description} = decodeMetadata(data)
  return {name, description}
}

export async function setPaused(t: RunTarget & {authority: TransactionSigner; paused: boolean}): Promise<void> {
  const coordinator = await coordinatorAddress(t.programId, t.runId)
  check(await t.chain.send(t.authority, [setPausedInstruction(t.programId, coordinator, t.authority, t.paused)]), `set-paused ${t.paused ? 'pause' : 'resume'} ${t.runId}`)
}

/** set_rates: the rates the run's next epoch starts with (main authority). */
export async function setRates(t: RunTarget & {authority: TransactionSigner; pointsPerBatch: number; tokenRate: number}): Promise<void> {
  const coordinator = await coordinatorAddress(t.programId, t.runId)
  check(await t.chain.send(t.authority, [setRatesInstruction(t.programId, coordinator, t.authority, t.pointsPerBatch, t.tokenRate)]), `set-rates ${t.runId}`)
}

interface TreasuryTarget extends RunTarget {
  /** The treasurer program. */
  treasurer: Address
}

/** A run's treasury (treasurer program), its address, and its vault's token balance; undefined when it has none. */
export async function readTreasury(t: TreasuryTarget): Promise<{address: Address; treasury: Treasury; balance: bigint} | undefined> {
  const address = await treasuryAddress(t.treasurer, await coordinatorAddress(t.programId, t.runId))
  const data = await t.chain.fetchAccount(address)
  if (!data) return undefined
  const treasury = decodeTreasury(data)
  const vault = await t.chain.fetchAccount(treasury.vault)
  return {address, treasury, balance: tokenBalance(vault)}
}

/**
 * init_treasury (when the run has none; `mint` then required) and fund: the run's main authority creates the run's
 * treasury for an SPL token mint and moves `amount` token base units from its token account `source` into it.
 */
export async function fundTreasury(t: TreasuryTarget & {authority: TransactionSigner; mint?: Address; source?: Address; amount: bigint}): Promise<{created: boolean}> {
  const coordinator = await coordinatorAddress(t.programId, t.runId)
  const existing = await readTreasury(t)
  if (existing && t.mint && existing.treasury.mint !== t.mint)
    throw new PsycheError(`run ${t.runId}: its treasury pays in ${existing.treasury.mint}, not ${t.mint} (a run has one treasury, of one mint)`, {code: 'EUSAGE'})
  if (!existing && !t.mint) throw new PsycheError(`run ${t.runId} has no treasury yet: --mint names the SPL token mint to create it for`, {code: 'EUSAGE'})
  const instructions: Instruction[] = []
  if (!existing) {
    const rent = {treasury: await t.chain.minimumBalance(TREASURY_SIZE), vault: await t.chain.minimumBalance(TOKEN_ACCOUNT_SIZE)}
    instructions.push(await initTreasuryInstruction(t.treasurer, coordinator, t.authority, t.mint!, rent))
  }
  if (t.amount > 0n) {
    // by default, from the authority's associated token account of the mint
    const source = t.source ?? (await associatedTokenAddress(t.authority.address, existing?.treasury.mint ?? t.mint!))
    instructions.push(await fundInstruction(t.treasurer, coordinator, t.authority, source, t.amount))
  }
  if (instructions.length) check(await t.chain.send(t.authority, instructions), `rewards fund ${t.runId}`)
  return {created: !existing}
}

/**
 * claim (treasurer): the signer's points not yet claimed × the run's token rate, from the run's treasury to
 * `destination`; by default to the signer's associated token account of the treasury's mint, created (the signer pays)
 * in the same transaction when it does not exist. Returns the account paid.
 */
export async function claimRewards(t: TreasuryTarget & {client: TransactionSigner; mint: Address; destination?: Address}): Promise<Address> {
  const coordinator = await coordinatorAddress(t.programId, t.runId)
  const destination = t.destination ?? (await associatedTokenAddress(t.client.address, t.mint))
  const create = t.destination ? [] : [await associatedTokenAccountInstruction(t.client, t.client.address, t.mint)]
  const ix = await claimInstruction(t.treasurer, coordinator, t.client, destination, await t.chain.minimumBalance(PARTICIPANT_SIZE))
  check(await t.chain.send(t.client, [...create, ix]), `rewards claim ${t.runId}`)
  return destination
}

/**
 * Rows of a run's rewards ledger (ledgerRows) with what each client claimed from the run's treasury: `treasurer`
 * undefined, claimed is null (the treasurer program is not known).
 */
export async function withClaims<T extends {client_id: string}>(t: RunTarget & {treasurer?: Address}, rows: T[]): Promise<(T & {claimed: number | null})[]> {
  if (!t.treasurer) return rows.map((r) => ({...r, claimed: null}))
  const claims = await readClaims(
    {...t, treasurer: t.treasurer},
    rows.map((r) => addressOfClient(r.client_id)),
  )
  return rows.map((r) => ({...r, claimed: claims.get(addressOfClient(r.client_id))!.claimed}))
}

/** The points each client claimed from the run's treasury (its participant records), by client address; 0 for none. */
export async function readClaims(t: TreasuryTarget, clients: Address[]): Promise<Map<Address, {claimed: number; paid: bigint}>> {
  const treasury = await treasuryAddress(t.treasurer, await coordinatorAddress(t.programId, t.runId))
  const out = new Map<Address, {claimed: number; paid: bigint}>()
  const BATCH = 16
  for (let i = 0; i < clients.length; i += BATCH) {
    await Promise.all(
      clients.slice(i, i + BATCH).map(async (client) => {
        const data = await t.chain.fetchAccount(await participantAddress(t.treasurer, treasury, client))
        const record = data ? decodeParticipant(data) : undefined
        out.set(client, {claimed: record?.claimed ?? 0, paid: record?.paid ?? 0n})
      }),
    )
  }
  return out
}

interface AuthorizerTarget {
  chain: Chain
  authorizer: Address
}

export async function grant(t: AuthorizerTarget & {grantor: TransactionSigner; grantee: Address}): Promise<Address> {
  const r = await t.chain.send(t.grantor, [await grantInstruction(t.authorizer, t.grantor, t.grantee, await t.chain.minimumBalance(AUTHORIZATION_SIZE))])
  check(r, `authorize grant to ${t.grantee}`)
  return authorizationAddress(t.authorizer, t.grantor.address, t.grantee)
}

export async function setDelegates(t: AuthorizerTarget & {grantee: TransactionSigner; grantor: Address; delegates: Address[]}): Promise<Address> {
  const authorization = await authorizationAddress(t.authorizer, t.grantor, t.grantee.address)
  check(await t.chain.send(t.grantee, [delegatesInstruction(t.authorizer, t.grantee, authorization, t.delegates)]), 'authorize delegates')
  return authorization
}

export async function revoke(t: AuthorizerTarget & {grantor: TransactionSigner; grantee: Address}): Promise<Address> {
  const authorization = await authorizationAddress(t.authorizer, t.grantor.address, t.grantee)
  check(await t.chain.send(t.grantor, [revokeInstruction(t.authorizer, t.grantor, authorization, t.grantor.address)]), `authorize revoke of ${t.grantee}`)
  return authorization
}

export async function readAuthorization(t: AuthorizerTarget & {grantor: Address; grantee: Address}): Promise<Authorization | undefined> {
  const data = await t.chain.fetchAccount(await authorizationAddress(t.authorizer, t.grantor, t.grantee))
  return data ? decodeAuthorization(data) : undefined
}
