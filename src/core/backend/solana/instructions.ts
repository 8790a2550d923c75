import {AccountRole, getAddressEncoder, getProgramDerivedAddress, type Address, type Instruction, type TransactionSigner} from '@solana/kit'
import type {CoordinatorConfig, HubRepo, LLMConfig} from '../../config/types.js'
import type {AccusationReason} from '../../coordinator/types.js'
import {announcementSigningBytes} from '../../primitives/announcement.js'
import type {EquivocationProof} from '../../coordinator/equivocation.js'
import {
  IX,
  MAX_CLIENTS,
  STATE_SIZE,
  encodeAccuse,
  encodeBufferInit,
  encodeBufferWrite,
  encodeCheckpoint,
  encodeHashWitness,
  encodeEject,
  encodeHealthCheck,
  encodeReportScores,
  encodeInit,
  encodeSetMetadata,
  encodeSetPeer,
  encodeSetPaused,
  encodeSetRates,
  encodeTag,
  keyBytes,
  encodeUpdate,
  encodeWitness,
  type RunMetadata,
} from './layout.js'

/** Instructions of the coordinator program, as @solana/kit instructions (signers attached). */

export const SYSTEM_PROGRAM = '11111111111111111111111111111111' as Address

export const COMPUTE_BUDGET_PROGRAM = 'ComputeBudget111111111111111111111111111111' as Address
/** The most compute units a transaction may ask for. */
const MAX_COMPUTE_UNITS = 1_400_000
/** What the runtime grants an instruction that names no limit; psyche's budget for an instruction it did not build. */
const DEFAULT_INSTRUCTION_UNITS = 200_000
/** A builtin program's instruction (system, compute budget, Ed25519): a few hundred CU; this leaves room. */
const BUILTIN_UNITS = 3_000
const BUILTINS = new Set<string>(['11111111111111111111111111111111', 'ComputeBudget111111111111111111111111111111', 'Ed25519SigVerify111111111111111111111111111'])

/**
 * Compute units each instruction psyche builds may use, at the programs' capacity limits (measured with `npm run bench --
 * solana`, with headroom): a transaction asks for the sum, not the 1.4M maximum, since the scheduler prefers small
 * requests (its priority is the fee per requested unit), and a cluster enforces what was asked.
 */
export const INSTRUCTION_UNITS = {
  init_coordinator: 30_000,
  grow: 500,
  update: 30_000,
  set_paused: 30_000,
  set_rates: 5_000,
  join_run: 40_000,
  tick: 60_000,
  /**
   * a tick in RoundWitness may close the round: it credits the accepted results to the rewards ledger and finishes the
   * shuffle that finds who had one batch more, which the witness proofs run in slices (24k CU at 256 trainers and 32
   * witnesses; with one witness, most of it: test/solana/rewards-program.test.ts)
   */
  tick_close_round: 250_000,
  /** its bloom over the roster and its slice of the rewards ledger's shuffle: 84k CU at 256 trainers, ~150k with 1 or 2 witnesses */
  witness: 180_000,
  warmup_witness: 40_000,
  /** per accused client (a shuffle and a quorum count over the witness blooms), plus health_check_base */
  health_check_per_accused: 40_000,
  health_check_base: 10_000,
  /** the agreed hash: a quadratic scan of at most 32 hash witnesses (6.9k CU at 32) */
  checkpoint: 30_000,
  /** a shuffle (is_witness) and a scan of the Cooldown's hash witnesses: 27k CU at 8 trainers, 40k at 256 (2026-11-24) */
  hash_witness: 60_000,
  free_coordinator: 10_000,
  withdraw: 30_000,
  eject: 30_000,
  /** is_witness, or (a low score) the verifier's, the accused's and its previous batch range's shuffles, plus its batch range: ~5 shuffles */
  accuse: 200_000,
  /** the verifier's shuffle and one per distinct scored trainer (a window of at most VERIFICATION_SAMPLE + 1), one more each when the scored round had fewer batches than trainers */
  report_scores: 300_000,
  set_peer: 25_000,
  equivocation: 30_000,
  set_metadata: 25_000,
  close_peer: 10_000,
  buffer_init: 25_000,
  buffer_write: 10_000,
  update_from_buffer: 30_000,
  grant: 25_000,
  delegates: 10_000,
  revoke: 10_000,
  /** treasurer: three program addresses (the coordinator's checked too), two accounts created, the vault's InitializeAccount3 */
  init_treasury: 30_000,
  fund: 10_000,
  /** treasurer: the ledger scan, the participant address (created on a first claim) and the token program's transfer */
  claim: 20_000,
  /** the associated token account program's CreateIdempotent (creating the account: ~20k) */
  associated_token_account: 40_000,
  /** an SPL token program instruction (InitializeMint2, MintTo, Transfer: a few thousand) */
  token: 10_000,
} as const

/** Accused clients per health_check transaction: the batch stays under the default 200,000 compute units. */
export const HEALTH_CHECK_BATCH = 4

const BUDGETS = new WeakMap<Instruction, number>()

/** Records the compute units `ix` may use (withComputeBudget sums them). */
export function withUnits<T extends Instruction>(ix: T, units: number): T {
  BUDGETS.set(ix, units)
  return ix
}

/** The compute units a transaction of these instructions asks for. */
export function computeUnitsFor(instructions: Instruction[]): number {
  let units = 0
  for (const ix of instructions) units += BUDGETS.get(ix) ?? (BUILTINS.has(ix.programAddress) ? BUILTIN_UNITS : DEFAULT_INSTRUCTION_UNITS)
  return Math.min(MAX_COMPUTE_UNITS, units + 2 * BUILTIN_UNITS)
}

/** ComputeBudgetInstruction::SetComputeUnitLimit. */
export function computeUnitLimitInstruction(units = MAX_COMPUTE_UNITS): Instruction {
  const data = Buffer.alloc(5)
  data[0] = 2
  data.writeUInt32LE(units, 1)
  return {programAddress: COMPUTE_BUDGET_PROGRAM, accounts: [], data}
}

/** ComputeBudgetInstruction::SetComputeUnitPrice: the priority fee, in micro-lamports per requested compute unit. */
function computeUnitPriceInstruction(microLamports: bigint): Instruction {
  const data = Buffer.alloc(9)
  data[0] = 3
  data.writeBigUInt64LE(microLamports, 1)
  return {programAddress: COMPUTE_BUDGET_PROGRAM, accounts: [], data}
}

/**
 * The instructions preceded by a compute unit limit sized for them (unless they set one) and, with a priority fee
 * (micro-lamports per compute unit), its price.
 */
export function withComputeBudget(instructions: Instruction[], priorityFee = 0n): Instruction[] {
  if (instructions.some((ix) => ix.programAddress === COMPUTE_BUDGET_PROGRAM)) return instructions
  const budget = [computeUnitLimitInstruction(computeUnitsFor(instructions))]
  if (priorityFee > 0n) budget.push(computeUnitPriceInstruction(priorityFee))
  return [...budget, ...instructions]
}

/** One instruction may grow an account by this much (the runtime's MAX_PERMITTED_DATA_INCREASE). */
const GROW_STEP = 10240

/** The coordinator account of a run: the program address of ("coordinator", run id). */
export async function coordinatorAddress(programId: Address, runId: string): Promise<Address> {
  const [address] = await getProgramDerivedAddress({programAddress: programId, seeds: ['coordinator', Buffer.from(runId, 'utf8')]})
  return address
}

/** A client's peer record in a run (the peer directory): the program address of ("peer", coordinator, client key). */
/** The SPL token program, which the treasurer program's claims pay through. */
export const TOKEN_PROGRAM = 'TokenkegQfeZyiNwAJbNbGKPFXCWuBvf9Ss623VQ5DA' as Address

export async function peerAddress(programId: Address, coordinator: Address, client: Address): Promise<Address> {
  const [address] = await getProgramDerivedAddress({
    programAddress: programId,
    seeds: ['peer', getAddressEncoder().encode(coordinator), getAddressEncoder().encode(client)],
  })
  return address
}

/** set_peer: the client's libp2p addresses into its peer record (created on first use; `lamports`: its rent, PEER_SIZE bytes). */
export function setPeerInstruction(programId: Address, coordinator: Address, client: TransactionSigner, peer: Address, addrs: string[], lamports: bigint): Instruction {
  return withUnits(
    {
      programAddress: programId,
      accounts: [signerMeta(client, true), {address: coordinator, role: AccountRole.READONLY}, writable(peer), {address: SYSTEM_PROGRAM, role: AccountRole.READONLY}],
      data: encodeSetPeer(addrs, lamports),
    },
    INSTRUCTION_UNITS.set_peer,
  )
}

export function signerMeta(signer: TransactionSigner, writable = false) {
  return {address: signer.address, role: writable ? AccountRole.WRITABLE_SIGNER : AccountRole.READONLY_SIGNER, signer}
}

const writable = (address: Address) => ({address, role: AccountRole.WRITABLE})

/**
 * init_coordinator followed by the grow instructions that bring the account to its full size (one
 * instruction may add 10 KiB); send them in one transaction. `lamports`: rent exemption for STATE_SIZE.
 */
export function initCoordinatorInstructions(o: {
  programId: Address
  coordinator: Address
  payer: TransactionSigner
  runId: string
  mainAuthority: Address
  /** null: anyone may join. Otherwise the grantor of the authorizations that admit clients. */
  joinAuthority: Address | null
  /** The authorizer program (required with a join authority). */
  authorizer?: Address | null
  lamports: bigint
}): Instruction[] {
  if (o.joinAuthority && !o.authorizer) throw new RangeError('a permissioned run (join authority) needs the authorizer program id')
  const out: Instruction[] = [
    withUnits(
      {
        programAddress: o.programId,
        accounts: [signerMeta(o.payer, true), writable(o.coordinator), {address: SYSTEM_PROGRAM, role: AccountRole.READONLY}],
        data: encodeInit(o.runId, o.mainAuthority, o.joinAuthority, o.authorizer ?? null, o.lamports),
      },
      INSTRUCTION_UNITS.init_coordinator,
    ),
  ]
  for (let size = GROW_STEP; size < STATE_SIZE; size += GROW_STEP)
    out.push(withUnits({programAddress: o.programId, accounts: [writable(o.coordinator)], data: encodeTag(IX.grow)}, INSTRUCTION_UNITS.grow))
  return out
}

function signed(programId: Address, coordinator: Address, signer: TransactionSigner, data: Uint8Array, units: number, extra: Instruction['accounts'] = []): Instruction {
  return withUnits({programAddress: programId, accounts: [signerMeta(signer), writable(coordinator), ...(extra ?? [])], data}, units)
}

export const updateInstruction = (programId: Address, coordinator: Address, authority: TransactionSigner, config?: CoordinatorConfig, model?: {LLM: LLMConfig}) =>
  signed(programId, coordinator, authority, encodeUpdate(config, model), INSTRUCTION_UNITS.update)

/** Bytes of an update's data per buffer_write: its transaction stays under 1,232 bytes with a priority fee and a second signer (a separate fee payer). */
const UPDATE_CHUNK = 700

/** A run's update buffer: the program address of ("update", coordinator). */
export async function updateBufferAddress(programId: Address, coordinator: Address): Promise<Address> {
  const [address] = await getProgramDerivedAddress({programAddress: programId, seeds: ['update', getAddressEncoder().encode(coordinator)]})
  return address
}

/**
 * The transactions that send a run's configuration through its update buffer, for an update too large for one
 * transaction: buffer_init (creates or empties the buffer; `lamports`: its rent, UPDATE_BUFFER_SIZE bytes), the data in
 * chunks (buffer_write, in order), then update_from_buffer (applies it as `update` would and closes the buffer,
 * returning the rent). Send them in order, each after the previous one is confirmed.
 */
export function bufferedUpdateTransactions(
  programId: Address,
  coordinator: Address,
  authority: TransactionSigner,
  buffer: Address,
  lamports: bigint,
  config?: CoordinatorConfig,
  model?: {LLM: LLMConfig},
): Instruction[][] {
  const data = Buffer.from(updateInstruction(programId, coordinator, authority, config, model).data!).subarray(1)
  const system = {address: SYSTEM_PROGRAM, role: AccountRole.READONLY}
  const out: Instruction[][] = [
    [
      withUnits(
        {programAddress: programId, accounts: [signerMeta(authority, true), writable(coordinator), writable(buffer), system], data: encodeBufferInit(data.length, lamports)},
        INSTRUCTION_UNITS.buffer_init,
      ),
    ],
  ]
  for (let at = 0; at < data.length; at += UPDATE_CHUNK)
    out.push([signed(programId, coordinator, authority, encodeBufferWrite(at, data.subarray(at, at + UPDATE_CHUNK)), INSTRUCTION_UNITS.buffer_write, [writable(buffer)])])
  out.push([
    withUnits(
      {programAddress: programId, accounts: [signerMeta(authority, true), writable(coordinator), writable(buffer)], data: encodeTag(IX.update_from_buffer)},
      INSTRUCTION_UNITS.update_from_buffer,
    ),
  ])
  return out
}

/** set_rates (main authority): points per accepted batch and token base units per point, from the next epoch on. */
export const setRatesInstruction = (programId: Address, coordinator: Address, authority: TransactionSigner, pointsPerBatch: number, tokenRate: number) =>
  signed(programId, coordinator, authority, encodeSetRates(pointsPerBatch, tokenRate), INSTRUCTION_UNITS.set_rates)
export const setPausedInstruction = (programId: Address, coordinator: Address, authority: TransactionSigner, paused: boolean) =>
  signed(programId, coordinator, authority, encodeSetPaused(paused), INSTRUCTION_UNITS.set_paused)
/** join_run; in a permissioned run, pass the authorization (authorizer program) that admits the client. */
export const joinRunInstruction = (programId: Address, coordinator: Address, client: TransactionSigner, authorization?: Address) =>
  signed(programId, coordinator, client, encodeTag(IX.join_run), INSTRUCTION_UNITS.join_run, authorization ? [{address: authorization, role: AccountRole.READONLY}] : [])
export const withdrawInstruction = (programId: Address, coordinator: Address, client: TransactionSigner) =>
  signed(programId, coordinator, client, encodeTag(IX.withdraw), INSTRUCTION_UNITS.withdraw)
/** tick; `closesRound`: sent in RoundWitness, where it may close the round (a larger compute budget). */
export const tickInstruction = (programId: Address, coordinator: Address, closesRound = false): Instruction =>
  withUnits({programAddress: programId, accounts: [writable(coordinator)], data: encodeTag(IX.tick)}, closesRound ? INSTRUCTION_UNITS.tick_close_round : INSTRUCTION_UNITS.tick)
export const witnessInstruction = (programId: Address, coordinator: Address, client: TransactionSigner, step: number, participant: Uint8Array, broadcast: Uint8Array) =>
  signed(programId, coordinator, client, encodeWitness(step, participant, broadcast), INSTRUCTION_UNITS.witness)
export const warmupWitnessInstruction = (programId: Address, coordinator: Address, client: TransactionSigner) =>
  signed(programId, coordinator, client, encodeTag(IX.warmup_witness), INSTRUCTION_UNITS.warmup_witness)
export const healthCheckInstruction = (programId: Address, coordinator: Address, client: TransactionSigner, accused: string[]) => {
  if (accused.length > MAX_CLIENTS) throw new RangeError(`at most ${MAX_CLIENTS} accused clients`)
  return signed(programId, coordinator, client, encodeHealthCheck(accused), INSTRUCTION_UNITS.health_check_base + accused.length * INSTRUCTION_UNITS.health_check_per_accused)
}
export const accuseInstruction = (
  programId: Address,
  coordinator: Address,
  accuser: TransactionSigner,
  step: number,
  accused: string,
  reason: AccusationReason = 'invalid_result',
) => signed(programId, coordinator, accuser, encodeAccuse(step, accused, reason), INSTRUCTION_UNITS.accuse)
/** A verifier's scores of the previous round's results: the scored round's roster index and fixed-point score per trainer. */
export const reportScoresInstruction = (programId: Address, coordinator: Address, verifier: TransactionSigner, step: number, entries: readonly {index: number; score: number}[]) =>
  signed(programId, coordinator, verifier, encodeReportScores(step, entries), INSTRUCTION_UNITS.report_scores)
export const checkpointInstruction = (programId: Address, coordinator: Address, client: TransactionSigner, repo: HubRepo, paramHash?: string) =>
  signed(programId, coordinator, client, encodeCheckpoint(repo, paramHash), INSTRUCTION_UNITS.checkpoint)
/** Cooldown: as a witness of the epoch's last round `step`, the hash of our parameters after applying it. */
export const hashWitnessInstruction = (programId: Address, coordinator: Address, client: TransactionSigner, step: number, paramHash: string) =>
  signed(programId, coordinator, client, encodeHashWitness(step, paramHash), INSTRUCTION_UNITS.hash_witness)
export const ejectInstruction = (programId: Address, coordinator: Address, authority: TransactionSigner, id: string) =>
  signed(programId, coordinator, authority, encodeEject(id), INSTRUCTION_UNITS.eject)
export const freeCoordinatorInstruction = (programId: Address, coordinator: Address, authority: TransactionSigner, recipient: Address) =>
  signed(programId, coordinator, authority, encodeTag(IX.free_coordinator), INSTRUCTION_UNITS.free_coordinator, [writable(recipient)])

const ED25519_PROGRAM = 'Ed25519SigVerify111111111111111111111111111' as Address
const INSTRUCTIONS_SYSVAR = 'Sysvar1nstructions1111111111111111111111111' as Address

/**
 * The Ed25519 program's instruction that has the runtime verify signatures (the transaction fails otherwise): each
 * entry's public key, signature and message are held in the instruction itself.
 */
function ed25519Instruction(entries: {publicKey: Uint8Array; signature: Uint8Array; message: Uint8Array}[]): Instruction {
  const header = 2 + 14 * entries.length
  const parts: Buffer[] = []
  const offsets = Buffer.alloc(header)
  offsets[0] = entries.length
  let at = header
  entries.forEach((x, k) => {
    const o = 2 + 14 * k
    const pk = at
    const sig = pk + 32
    const msg = sig + 64
    offsets.writeUInt16LE(sig, o)
    offsets.writeUInt16LE(0xffff, o + 2)
    offsets.writeUInt16LE(pk, o + 4)
    offsets.writeUInt16LE(0xffff, o + 6)
    offsets.writeUInt16LE(msg, o + 8)
    offsets.writeUInt16LE(x.message.length, o + 10)
    offsets.writeUInt16LE(0xffff, o + 12)
    parts.push(Buffer.from(x.publicKey), Buffer.from(x.signature), Buffer.from(x.message))
    at = msg + x.message.length
  })
  return {programAddress: ED25519_PROGRAM, accounts: [], data: Buffer.concat([offsets, ...parts])}
}

/**
 * An equivocation proof on chain: the Ed25519 program's instruction verifying both signed announcements, right
 * before the coordinator's equivocation instruction (which reads it through the instructions sysvar). Send both in
 * one transaction.
 */
export function equivocationInstructions(programId: Address, coordinator: Address, reporter: TransactionSigner, proof: EquivocationProof): Instruction[] {
  const entries = [proof.a, proof.b].map((x) => ({
    publicKey: keyBytes(x.client_id),
    signature: Buffer.from(x.signature, 'hex'),
    message: announcementSigningBytes(x),
  }))
  const data = Buffer.alloc(1 + 8 + 32)
  data[0] = IX.equivocation
  data.writeBigUInt64LE(BigInt(proof.a.step), 1)
  Buffer.from(keyBytes(proof.a.client_id)).copy(data, 9)
  return [
    ed25519Instruction(entries),
    withUnits(
      {programAddress: programId, accounts: [signerMeta(reporter), writable(coordinator), {address: INSTRUCTIONS_SYSVAR, role: AccountRole.READONLY}], data},
      INSTRUCTION_UNITS.equivocation,
    ),
  ]
}

/** A run's metadata record: the program address of ("metadata", coordinator). */
export async function metadataAddress(programId: Address, coordinator: Address): Promise<Address> {
  const [address] = await getProgramDerivedAddress({programAddress: programId, seeds: ['metadata', getAddressEncoder().encode(coordinator)]})
  return address
}

/** set_metadata: the run's name and description (main authority only; `lamports`: rent of a new record, METADATA_SIZE bytes). */
export function setMetadataInstruction(
  programId: Address,
  coordinator: Address,
  authority: TransactionSigner,
  record: Address,
  metadata: RunMetadata,
  lamports: bigint,
): Instruction {
  return withUnits(
    {
      programAddress: programId,
      accounts: [signerMeta(authority, true), {address: coordinator, role: AccountRole.READONLY}, writable(record), {address: SYSTEM_PROGRAM, role: AccountRole.READONLY}],
      data: encodeSetMetadata(metadata, lamports),
    },
    INSTRUCTION_UNITS.set_metadata,
  )
}

/** close_peer: the client leaves the run's peer directory; its record's rent goes back to it. */
export function closePeerInstruction(programId: Address, coordinator: Address, client: TransactionSigner, peer: Address): Instruction {
  return withUnits(
    {programAddress: programId, accounts: [signerMeta(client, true), {address: coordinator, role: AccountRole.READONLY}, writable(peer)], data: encodeTag(IX.close_peer)},
    INSTRUCTION_UNITS.close_peer,
  )
}
