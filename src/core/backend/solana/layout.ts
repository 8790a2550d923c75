import {getAddressDecoder, getAddressEncoder, type Address} from '@solana/kit'
import type {CheckpointConfig, CoordinatorConfig, HubRepo, LLMConfig, SparseLoCoConfig} from '../../config/types.js'
import {innerSteps} from '../../config/run-config.js'
import type {
  Accusation,
  AccusationReason,
  CheckpointHash,
  Client,
  ClientState,
  CoordinatorState,
  ExitedClient,
  HashWitness,
  ModelRecord,
  Round,
  WitnessRecord,
} from '../../coordinator/types.js'
import {DEFAULT_VERIFICATION_SAMPLE, verifierCount, witnessBloomParams} from '../../coordinator/rules.js'
import {pointsFor, rewardWeight, scoreFromFixed, WEIGHT_ONE, type RewardRow, scoreRowsOf, type scoreRows} from '../../coordinator/rewards.js'
import {CONFIG_FIELDS, ENUMS, MAGICS, MAX_CLIENTS, RUN_ID_MAX, RUN_STATES, STRUCTS, constant, enumValues, structLayout} from '../../layout/layout-table.js'

/**
 * The coordinator account of programs/coordinator (its `State` struct), byte for byte. Everything is
 * little-endian; lists are fixed arrays with a length field. See programs/README.md for the table.
 */

/** Capacity limits of one coordinator account: the layout table (layout/layout-table.ts), as the program's header. */
export {MAX_CLIENTS, RUN_ID_MAX}
const MAX_WITNESSES = constant('MAX_WITNESSES')
const MAX_ACCUSATIONS = constant('MAX_ACCUSATIONS')
const BLOOM_MAX = constant('BLOOM_MAX')
const REPO_MAX = constant('REPO_MAX')
const REVISION_MAX = constant('REVISION_MAX')
const MODEL_JSON_MAX = constant('MODEL_JSON_MAX')
const MAX_CHECKPOINTERS = constant('MAX_CHECKPOINTERS')
const MAGIC = MAGICS.MAGIC[0]
const LAYOUT_VERSION = MAGICS.LAYOUT_VERSION[0]

const CONFIG_SIZE = structLayout('Config').size
const ROUND = structLayout('Round').at
const WITNESS = structLayout('Witness').at
const ACCUSATION = structLayout('Accusation').at
const CLIENT = structLayout('ClientRec').at
const CHECKPOINT = structLayout('Checkpoint').at
const HASH_WITNESS = structLayout('HashWitness')
const ACCUSATION_REASONS = ENUMS.AccusationReason.values as readonly AccusationReason[]

/** Byte offsets of the State fields. */
const OFFSETS = Object.fromEntries(structLayout('State').fields.map((f) => [f.name, f.offset])) as Record<(typeof STRUCTS.State)[number][0], number>

/** Size of a coordinator account in bytes. */
export const STATE_SIZE = structLayout('State').size

const CLIENT_STATES = ENUMS.ClientState.values as readonly ClientState[]
const CHECKPOINT_KINDS = ENUMS.CheckpointKind.values

/** What the account holds beside the reference's CoordinatorState. */
export interface OnChainCoordinator {
  state: CoordinatorState
  main_authority: Address
  /** null: anyone may join. */
  join_authority: Address | null
  /** The authorizer program whose authorizations (granted by the join authority) admit clients. */
  authorizer: Address
  bump: number
  /** False until the first update: the run cannot be resumed before. */
  has_config: boolean
}

const addressDecoder = getAddressDecoder()
const addressEncoder = getAddressEncoder()

export function addressBytes(address: string): Uint8Array {
  return Uint8Array.from(addressEncoder.encode(address as Address))
}

const HEX_ID = /^[0-9a-f]{64}$/

/**
 * A client's id (ClientId) is its ed25519 public key in lowercase hex, as everywhere in psyche (p2p announcements,
 * libp2p peer ids); on Solana the same key is an address, spelled in base58. These convert between the two.
 */
export function clientIdOf(address: string): string {
  return Buffer.from(addressBytes(address)).toString('hex')
}

export function addressOfClient(id: string): Address {
  if (!HEX_ID.test(id)) throw new RangeError(`client id ${JSON.stringify(id.slice(0, 80))} is not a 32-byte lowercase hex public key`)
  return addressDecoder.decode(Buffer.from(id, 'hex'))
}

/** The 32 key bytes of a client id (hex) or of a base58 address. */
export function keyBytes(idOrAddress: string): Uint8Array {
  return HEX_ID.test(idOrAddress) ? Uint8Array.from(Buffer.from(idOrAddress, 'hex')) : addressBytes(idOrAddress)
}

function num(b: Buffer, offset: number, field: string): number {
  const v = b.readBigUInt64LE(offset)
  if (v > BigInt(Number.MAX_SAFE_INTEGER)) throw new RangeError(`coordinator account: ${field} = ${v} exceeds 2^53`)
  return Number(v)
}

function readCheckpoint(b: Buffer, o: number): CheckpointConfig | null {
  const kind = CHECKPOINT_KINDS[b[o + CHECKPOINT.kind.offset]]
  if (kind === undefined) throw new RangeError(`coordinator account: checkpoint kind ${b[o]} is unknown`)
  if (kind === 'None') return null
  if (kind === 'Ephemeral') return 'Ephemeral'
  const at = o + CHECKPOINT.repo.offset
  const repo: HubRepo = {repo_id: b.toString('utf8', at, at + b[o + CHECKPOINT.repo_len.offset])}
  const rev = o + CHECKPOINT.revision.offset
  if (b[o + CHECKPOINT.has_revision.offset]) repo.revision = b.toString('utf8', rev, rev + b[o + CHECKPOINT.revision_len.offset])
  return {[kind]: repo} as CheckpointConfig
}

function readRound(b: Buffer, o: number, config: Pick<CoordinatorConfig, 'max_trainers_per_round'>): Round {
  const field = (name: keyof typeof ROUND): number => num(b, o + ROUND[name].offset, `round.${name}`)
  const rosterLen = field('roster_len')
  const witnessLen = field('witness_len')
  const accusationLen = field('accusation_len')
  const excludedLen = field('excluded_len')
  if (rosterLen > MAX_CLIENTS || witnessLen > MAX_WITNESSES || accusationLen > MAX_ACCUSATIONS || excludedLen > MAX_CLIENTS)
    throw new RangeError('coordinator account: round lists exceed their capacity')
  const key = (at: number): string => b.toString('hex', at, at + 32)
  const roster = Array.from({length: rosterLen}, (_, i) => key(o + ROUND.roster.offset + i * ROUND.roster.stride))
  const trainers = field('trainers')
  if (trainers > rosterLen) throw new RangeError('coordinator account: a round with more trainers than members')
  const bloomBytes = witnessBloomParams(config, {roster, trainers}).bits / 8
  const witnesses: WitnessRecord[] = Array.from({length: witnessLen}, (_, i) => {
    const w = o + ROUND.witnesses.offset + i * ROUND.witnesses.stride
    const bloom = (name: 'participant_bloom' | 'broadcast_bloom'): string => b.subarray(w + WITNESS[name].offset, w + WITNESS[name].offset + bloomBytes).toString('base64')
    return {from: key(w + WITNESS.from.offset), participant_bloom: bloom('participant_bloom'), broadcast_bloom: bloom('broadcast_bloom')}
  })
  const accusations: Accusation[] = Array.from({length: accusationLen}, (_, i) => {
    const a = o + ROUND.accusations.offset + i * ROUND.accusations.stride
    const reason = ACCUSATION_REASONS[num(b, a + ACCUSATION.reason.offset, 'accusation.reason')]
    if (!reason) throw new RangeError('coordinator account: unknown accusation reason')
    return {from: key(a + ACCUSATION.from.offset), accused: key(a + ACCUSATION.accused.offset), reason}
  })
  return {
    step: field('step'),
    height: field('height'),
    data_index: field('data_index'),
    batch_size: field('batch_size'),
    seed: key(o + ROUND.seed.offset),
    data_seed: key(o + ROUND.data_seed.offset),
    started_at: field('started_at'),
    roster,
    witnesses,
    accusations,
    excluded: Array.from({length: excludedLen}, (_, i) => key(o + ROUND.excluded.offset + i * ROUND.excluded.stride)),
    complete_witnesses: field('complete_witnesses'),
    trainers,
  }
}

function readClients(b: Buffer, o: number, count: number): ExitedClient[] {
  if (count > MAX_CLIENTS) throw new RangeError('coordinator account: client list exceeds MAX_CLIENTS')
  return Array.from({length: count}, (_, i) => {
    const c = o + i * structLayout('ClientRec').size
    const state = CLIENT_STATES[num(b, c + CLIENT.state.offset, 'client.state')]
    if (!state) throw new RangeError('coordinator account: unknown client state')
    const k = c + CLIENT.key.offset
    return {id: b.toString('hex', k, k + 32), state, exited_height: num(b, c + CLIENT.exited_height.offset, 'client.exited_height')}
  })
}

function readKeys(b: Buffer, o: number, count: number): string[] {
  if (count > MAX_CLIENTS) throw new RangeError('coordinator account: key list exceeds MAX_CLIENTS')
  return Array.from({length: count}, (_, i) => b.toString('hex', o + i * 32, o + i * 32 + 32))
}

function readHashWitnesses(b: Buffer): HashWitness[] {
  const count = num(b, OFFSETS.hash_witness_len, 'hash_witness_len')
  if (count > MAX_WITNESSES) throw new RangeError('coordinator account: hash witnesses exceed MAX_WITNESSES')
  return Array.from({length: count}, (_, i) => {
    const w = OFFSETS.hash_witnesses + i * HASH_WITNESS.size
    const at = (name: 'from' | 'param_hash') => w + HASH_WITNESS.at[name].offset
    return {from: b.toString('hex', at('from'), at('from') + 32), param_hash: b.toString('hex', at('param_hash'), at('param_hash') + 32)}
  })
}

function readCheckpointHash(b: Buffer): CheckpointHash | null {
  if (b.readBigUInt64LE(OFFSETS.has_checkpoint_hash) === 0n) return null
  const checkpoint = readCheckpoint(b, OFFSETS.checkpoint_hash_repo)
  if (typeof checkpoint !== 'object' || checkpoint === null || !('Hub' in checkpoint)) throw new RangeError('coordinator account: the checkpoint hash names no Hub repository')
  return {
    repo: checkpoint.Hub,
    step: num(b, OFFSETS.checkpoint_hash_step, 'checkpoint_hash_step'),
    param_hash: b.toString('hex', OFFSETS.checkpoint_hash, OFFSETS.checkpoint_hash + 32),
  }
}

function readCurrentModel(b: Buffer): ModelRecord | null {
  if (b.readBigUInt64LE(OFFSETS.has_current_model) === 0n) return null
  const hash = b.readBigUInt64LE(OFFSETS.has_current_model_hash) !== 0n ? b.toString('hex', OFFSETS.current_model_hash, OFFSETS.current_model_hash + 32) : null
  return {step: num(b, OFFSETS.current_model_step, 'current_model_step'), param_hash: hash}
}

/**
 * model.LLM.optimizer with the account's inner_steps put back (encodeUpdate takes SparseLoCo's inner_steps out of the
 * model JSON: the program sizes each round by the account's field, so that field is its only place). Every optimizer
 * but SparseLoCo has 1; a JSON that says otherwise is refused. `h` 0: no update has set the model yet.
 */
function withInnerSteps(optimizer: unknown, h: number): {optimizer?: LLMConfig['optimizer']} {
  if (h === 0) return optimizer === undefined ? {} : {optimizer: optimizer as LLMConfig['optimizer']}
  const sparse = typeof optimizer === 'object' && optimizer !== null && 'SparseLoCo' in optimizer ? (optimizer as {SparseLoCo: unknown}).SparseLoCo : undefined
  if (sparse === undefined) {
    if (h !== 1) throw new RangeError(`coordinator account: inner_steps ${h}, but the model's optimizer is not SparseLoCo (which alone has inner steps)`)
    return optimizer === undefined ? {} : {optimizer: optimizer as LLMConfig['optimizer']}
  }
  if (typeof sparse !== 'object' || sparse === null || Array.isArray(sparse) || 'inner_steps' in sparse)
    throw new RangeError("coordinator account: the model JSON's SparseLoCo must be an object without inner_steps (the account's inner_steps field holds it)")
  return {optimizer: {SparseLoCo: {inner_steps: h, ...(sparse as Omit<SparseLoCoConfig, 'inner_steps'>)}}}
}

/** Decodes a coordinator account into the reference's CoordinatorState (and the on-chain extras). */
export function decodeCoordinator(data: Uint8Array): OnChainCoordinator {
  const b = Buffer.from(data.buffer, data.byteOffset, data.byteLength)
  if (b.length !== STATE_SIZE) throw new RangeError(`coordinator account: ${b.length} bytes, expected ${STATE_SIZE}`)
  if (b.readBigUInt64LE(OFFSETS.magic) !== MAGIC) throw new RangeError('coordinator account: wrong magic (not a psyche coordinator)')
  if (b.readBigUInt64LE(OFFSETS.version) !== LAYOUT_VERSION)
    throw new RangeError(`coordinator account: layout version ${b.readBigUInt64LE(OFFSETS.version)}, expected ${LAYOUT_VERSION}`)
  const O = OFFSETS
  const config = {} as Record<string, number>
  for (const f of structLayout('Config').fields) config[f.name] = num(b, O.config + f.offset, `config.${f.name}`)
  if (config.rounds_per_epoch === 0) delete config.rounds_per_epoch
  if (config.max_trainers_per_round === 0) delete config.max_trainers_per_round
  const checkpointersLen = num(b, O.checkpointers_len, 'checkpointers_len')
  if (checkpointersLen > MAX_CHECKPOINTERS) throw new RangeError('coordinator account: checkpointers exceed MAX_CHECKPOINTERS')
  const checkpointers = Array.from({length: checkpointersLen}, (_, i) => b.toString('hex', O.checkpointers + i * 32, O.checkpointers + i * 32 + 32))
  const jsonLen = num(b, O.model_json_len, 'model_json_len')
  if (jsonLen > MODEL_JSON_MAX) throw new RangeError('coordinator account: model JSON exceeds MODEL_JSON_MAX')
  const hasConfig = b.readBigUInt64LE(O.has_config) !== 0n
  let rest: Partial<LLMConfig> = {}
  if (jsonLen) {
    try {
      rest = JSON.parse(b.toString('utf8', O.model_json, O.model_json + jsonLen)) as Partial<LLMConfig>
    } catch (error) {
      throw new RangeError(`coordinator account: model JSON does not parse: ${(error as Error).message}`)
    }
    if (typeof rest !== 'object' || rest === null || Array.isArray(rest)) throw new RangeError('coordinator account: model JSON is not an object')
  }
  const checkpoint = readCheckpoint(b, O.checkpoint) ?? 'Ephemeral'
  const llm = {
    ...rest,
    ...withInnerSteps(rest.optimizer, num(b, O.inner_steps, 'inner_steps')),
    max_seq_len: num(b, O.max_seq_len, 'max_seq_len'),
    cold_start_warmup_steps: num(b, O.cold_start_warmup_steps, 'cold_start_warmup_steps'),
    checkpoint,
  } as LLMConfig
  const runState = RUN_STATES[num(b, O.run_state, 'run_state')]
  if (!runState) throw new RangeError('coordinator account: unknown run state')
  const exited = readClients(b, O.exited, num(b, O.exited_len, 'exited_len'))
  const clients: Client[] = readClients(b, O.clients, num(b, O.clients_len, 'clients_len')).map(({id, state}) => ({id, state}))
  const join = b.subarray(O.join_authority, O.join_authority + 32)
  const state: CoordinatorState = {
    version: 2,
    run_id: b.toString('utf8', O.run_id, O.run_id + num(b, O.run_id_len, 'run_id_len')),
    run_state: runState,
    run_state_start: num(b, O.run_state_start, 'run_state_start'),
    config: (checkpointersLen ? {...config, checkpointers} : config) as unknown as CoordinatorConfig,
    model: {LLM: llm},
    checkpoint_fallback: readCheckpoint(b, O.checkpoint_fallback),
    checkpoint_hash: readCheckpointHash(b),
    current_model: readCurrentModel(b),
    seed: b.toString('hex', O.seed, O.seed + 32),
    progress: {
      epoch: num(b, O.progress_epoch, 'progress.epoch'),
      step: num(b, O.progress_step, 'progress.step'),
      epoch_start_data_index: num(b, O.epoch_start_data_index, 'epoch_start_data_index'),
    },
    epoch: {
      start_time: num(b, O.epoch_start_time, 'epoch.start_time'),
      start_step: num(b, O.epoch_start_step, 'epoch.start_step'),
      first_round: b.readBigUInt64LE(O.first_round) !== 0n,
      checkpointed: b.readBigUInt64LE(O.checkpointed) !== 0n,
      cold_start: b.readBigUInt64LE(O.cold_start) !== 0n,
      clients,
      exited,
      warmup_witnesses: readKeys(b, O.warmup_witnesses, num(b, O.warmup_len, 'warmup_len')),
      hash_witnesses: readHashWitnesses(b),
      round: b.readBigUInt64LE(O.has_round) !== 0n ? readRound(b, O.round, config) : null,
      previous_round: b.readBigUInt64LE(O.has_previous_round) !== 0n ? readRound(b, O.previous_round, config) : null,
    },
    pending: readKeys(b, O.pending, num(b, O.pending_len, 'pending_len')),
    pending_pause: b.readBigUInt64LE(O.pending_pause) !== 0n,
  }
  return {
    state,
    main_authority: addressDecoder.decode(b.subarray(O.main_authority, O.main_authority + 32)),
    join_authority: join.every((x) => x === 0) ? null : addressDecoder.decode(join),
    authorizer: addressDecoder.decode(b.subarray(O.authorizer, O.authorizer + 32)),
    bump: b[O.bump],
    has_config: hasConfig,
  }
}

// ---- instruction data ----

/** Instruction tags (the program's first data byte), from the layout table. */
export const IX = enumValues('Instruction') as Record<(typeof ENUMS.Instruction.values)[number], number>

/** The program's custom error codes: 1..18 are the reference's RejectionCodes, 100.. the program's own (layout table). */
export const PROGRAM_ERRORS: Record<number, string> = Object.fromEntries(Object.entries(enumValues('Error')).map(([name, code]) => [code, name]))

function u64(n: number | bigint): Buffer {
  const b = Buffer.alloc(8)
  b.writeBigUInt64LE(BigInt(n))
  return b
}

function repoBytes(repo: HubRepo): Buffer {
  const id = Buffer.from(repo.repo_id, 'utf8')
  const revision = Buffer.from(repo.revision ?? '', 'utf8')
  if (id.length > REPO_MAX) throw new RangeError(`repo_id ${JSON.stringify(repo.repo_id)} exceeds ${REPO_MAX} bytes`)
  if (revision.length > REVISION_MAX) throw new RangeError(`revision ${JSON.stringify(repo.revision)} exceeds ${REVISION_MAX} bytes`)
  return Buffer.concat([Buffer.from([id.length]), id, Buffer.from([repo.revision === undefined ? 0 : 1, revision.length]), revision])
}

export function encodeInit(runId: string, mainAuthority: string, joinAuthority: string | null, authorizer: string | null, lamports: bigint): Uint8Array {
  const id = Buffer.from(runId, 'utf8')
  if (id.length < 1 || id.length > RUN_ID_MAX) throw new RangeError(`run id ${JSON.stringify(runId)} must be 1 to ${RUN_ID_MAX} bytes`)
  return Buffer.concat([
    Buffer.from([IX.init_coordinator, id.length]),
    id,
    addressBytes(mainAuthority),
    joinAuthority ? addressBytes(joinAuthority) : Buffer.alloc(32),
    authorizer ? addressBytes(authorizer) : Buffer.alloc(32),
    u64(lamports),
  ])
}

function withoutInnerSteps(sparse: SparseLoCoConfig): Omit<SparseLoCoConfig, 'inner_steps'> {
  const {inner_steps: _, ...rest} = sparse
  return rest
}

/** update: the whole [config] and/or [model.LLM] (validate it with validateRunConfig first). */
export function encodeUpdate(config: CoordinatorConfig | undefined, model: {LLM: LLMConfig} | undefined): Uint8Array {
  // rounds_per_epoch 0 is how the account spells "not set": a 0 in the config would silently mean that
  if (config?.rounds_per_epoch === 0) throw new RangeError('config.rounds_per_epoch must be at least 1 (leave it out for no limit)')
  if (config?.max_trainers_per_round === 0) throw new RangeError('config.max_trainers_per_round must be at least 1 (leave it out for no limit)')
  // Not in the coordinator account yet: refused rather than silently dropped (the clients would use the default).
  if (config?.verification_sample !== undefined && config.verification_sample !== DEFAULT_VERIFICATION_SAMPLE)
    throw new RangeError(`config.verification_sample: the Solana coordinator program does not store it yet; leave it out (default ${DEFAULT_VERIFICATION_SAMPLE})`)
  const parts: Buffer[] = [Buffer.from([IX.update, config ? 1 : 0])]
  const c = Buffer.alloc(CONFIG_SIZE)
  if (config) CONFIG_FIELDS.forEach((f, i) => c.writeBigUInt64LE(BigInt((config as unknown as Record<string, number | undefined>)[f] ?? 0), i * 8))
  parts.push(c)
  // config.checkpointers (with the config; the program refuses more than MAX_CHECKPOINTERS, and duplicates)
  const checkpointers = config?.checkpointers ?? []
  if (checkpointers.length > 255) throw new RangeError('config.checkpointers: at most 255 client ids fit the update')
  parts.push(Buffer.from([checkpointers.length]), ...checkpointers.map((id) => Buffer.from(keyBytes(id))))
  if (!model) parts.push(Buffer.from([0]))
  else {
    const {max_seq_len, cold_start_warmup_steps, checkpoint, ...llm} = model.LLM
    // SparseLoCo's inner steps travel as a field of their own (the program sizes each round by them), not in the JSON
    const h = innerSteps(llm.optimizer)
    const rest = typeof llm.optimizer === 'object' && 'SparseLoCo' in llm.optimizer ? {...llm, optimizer: {SparseLoCo: withoutInnerSteps(llm.optimizer.SparseLoCo)}} : llm
    if (typeof checkpoint !== 'object' || !('Hub' in checkpoint || 'P2P' in checkpoint || 'Dummy' in checkpoint)) {
      throw new RangeError('model.LLM.checkpoint must be Hub, P2P or Dummy for a run on Solana')
    }
    const kind = 'Hub' in checkpoint ? 'Hub' : 'P2P' in checkpoint ? 'P2P' : 'Dummy'
    const repo = (checkpoint as Record<string, HubRepo>)[kind]
    const json = Buffer.from(JSON.stringify(rest), 'utf8')
    if (json.length > MODEL_JSON_MAX) throw new RangeError(`the model configuration is ${json.length} bytes of JSON, more than the account holds (${MODEL_JSON_MAX})`)
    const len = Buffer.alloc(2)
    len.writeUInt16LE(json.length)
    parts.push(Buffer.from([1]), u64(max_seq_len), u64(cold_start_warmup_steps ?? 0), u64(h), Buffer.from([CHECKPOINT_KINDS.indexOf(kind)]), repoBytes(repo), len, json)
  }
  return Buffer.concat(parts)
}

// ---- the update buffer (an update too large for one transaction) ----

/** Size of a run's update buffer account: magic, coordinator, authority, len u64, written u64, data [UPDATE_MAX]. */
export const UPDATE_BUFFER_SIZE = structLayout('UpdateBuffer').size
const UPDATE_MAX = constant('UPDATE_MAX')

/** buffer_init: the rent of a new buffer, and the length of the update's data (without its tag) to be written. */
export function encodeBufferInit(length: number, lamports: bigint): Uint8Array {
  if (!Number.isInteger(length) || length < 1 || length > UPDATE_MAX) throw new RangeError(`an update is 1 to ${UPDATE_MAX} bytes, not ${length}`)
  const len = Buffer.alloc(2)
  len.writeUInt16LE(length)
  return Buffer.concat([Buffer.from([IX.buffer_init]), u64(lamports), len])
}

/** buffer_write: a chunk of the update's data at `offset` (chunks are appended in order). */
export function encodeBufferWrite(offset: number, chunk: Uint8Array): Uint8Array {
  if (!Number.isInteger(offset) || offset < 0 || offset + chunk.length > UPDATE_MAX || chunk.length === 0) throw new RangeError('buffer_write: the chunk lies outside the update')
  const at = Buffer.alloc(2)
  at.writeUInt16LE(offset)
  return Buffer.concat([Buffer.from([IX.buffer_write]), at, chunk])
}

/** set_rates: the rates the next epoch starts with (checked against the table's bounds, as the program does). */
export function encodeSetRates(pointsPerBatch: number, tokenRate: number): Uint8Array {
  if (!Number.isSafeInteger(pointsPerBatch) || pointsPerBatch < 0 || pointsPerBatch > constant('MAX_POINTS_PER_BATCH'))
    throw new RangeError(`points per batch must be a whole number from 0 to ${constant('MAX_POINTS_PER_BATCH')}`)
  if (!Number.isSafeInteger(tokenRate) || tokenRate < 0 || tokenRate > constant('MAX_TOKEN_RATE'))
    throw new RangeError(`token rate must be a whole number from 0 to ${constant('MAX_TOKEN_RATE')}`)
  const b = Buffer.alloc(17)
  b[0] = IX.set_rates
  b.writeBigUInt64LE(BigInt(pointsPerBatch), 1)
  b.writeBigUInt64LE(BigInt(tokenRate), 9)
  return b
}

export function encodeSetPaused(paused: boolean): Uint8Array {
  return Uint8Array.from([IX.set_paused, paused ? 1 : 0])
}

export function encodeWitness(step: number, participantBloom: Uint8Array, broadcastBloom: Uint8Array): Uint8Array {
  if (participantBloom.length !== broadcastBloom.length || participantBloom.length > BLOOM_MAX)
    throw new RangeError(`witness blooms must have equal sizes of at most ${BLOOM_MAX} bytes`)
  const len = Buffer.alloc(2)
  len.writeUInt16LE(participantBloom.length)
  return Buffer.concat([Buffer.from([IX.witness]), u64(step), len, participantBloom, broadcastBloom])
}

export function encodeHealthCheck(accused: string[]): Uint8Array {
  if (accused.length > 255) throw new RangeError('at most 255 accused clients per health check')
  return Buffer.concat([Buffer.from([IX.health_check, accused.length]), ...accused.map(keyBytes)])
}

/** checkpoint: the repository and the uploaded parameters' hash (64 hex digits; checked against the witnesses' agreed hash). */
export function encodeCheckpoint(repo: HubRepo, paramHash?: string): Uint8Array {
  const hash = paramHash === undefined ? Buffer.alloc(32) : hashBytes(paramHash)
  return Buffer.concat([Buffer.from([IX.checkpoint, paramHash === undefined ? 0 : 1]), hash, repoBytes(repo)])
}

/** hash_witness (Cooldown): as a witness of the epoch's last round `step`, our parameters' hash after applying it. */
export function encodeHashWitness(step: number, paramHash: string): Uint8Array {
  return Buffer.concat([Buffer.from([IX.hash_witness]), u64(step), hashBytes(paramHash)])
}

function hashBytes(hex: string): Buffer {
  if (!HEX_ID.test(hex)) throw new RangeError(`parameter hash ${JSON.stringify(hex.slice(0, 80))} is not 64 lowercase hex digits`)
  return Buffer.from(hex, 'hex')
}

export function encodeAccuse(step: number, accused: string, reason: AccusationReason): Uint8Array {
  const r = ACCUSATION_REASONS.indexOf(reason)
  if (r < 0) throw new RangeError(`unknown accusation reason ${JSON.stringify(reason)}`)
  return Buffer.concat([Buffer.from([IX.accuse]), u64(step), keyBytes(accused), Buffer.from([r])])
}

/**
 * report_scores: the scored step, then per trainer its index in the scored round's roster (u16) and its score in fixed
 * point (i32, rewards.ts scoreToFixed), at most REPORT_SCORES_MAX entries.
 */
export function encodeReportScores(step: number, entries: readonly {index: number; score: number}[]): Uint8Array {
  if (entries.length > REPORT_SCORES_MAX) throw new RangeError(`report_scores: at most ${REPORT_SCORES_MAX} entries`)
  const b = Buffer.alloc(9 + 6 * entries.length)
  b[0] = IX.report_scores
  b.writeBigUInt64LE(BigInt(step), 1)
  entries.forEach((e, i) => {
    b.writeUInt16LE(e.index, 9 + 6 * i)
    b.writeInt32LE(e.score, 11 + 6 * i)
  })
  return b
}

export function encodeEject(id: string): Uint8Array {
  return Buffer.concat([Buffer.from([IX.eject]), keyBytes(id)])
}

export function encodeTag(tag: number): Uint8Array {
  return Uint8Array.from([tag])
}

// ---- the peer directory (set_peer) ----

/** What one set_peer may carry: its transaction, with a priority fee, stays under 1,232 bytes (programs/coordinator). */
export const PEER_ADDRS_MAX = constant('PEER_ADDRS_MAX')
const PEER_MAGIC = MAGICS.PEER_MAGIC[0]
const PEER = structLayout('Peer').at
/** Size of a peer account: magic, coordinator [32], client [32], addrs_len u64, addrs [PEER_ADDRS_MAX]. */
export const PEER_SIZE = structLayout('Peer').size

interface PeerRecord {
  coordinator: Address
  /** The client id (hex public key). */
  client: string
  addrs: string[]
}

/** set_peer's data: the rent of a new peer account, then the multiaddrs, newline-separated. */
export function encodeSetPeer(addrs: string[], lamports: bigint): Uint8Array {
  for (const a of addrs) if (a.includes('\n') || a.length === 0) throw new RangeError(`peer address ${JSON.stringify(a)} is empty or holds a newline`)
  const bytes = Buffer.from(addrs.join('\n'), 'utf8')
  if (bytes.length > PEER_ADDRS_MAX) throw new RangeError(`the peer addresses are ${bytes.length} bytes, more than a peer account holds (${PEER_ADDRS_MAX})`)
  const len = Buffer.alloc(2)
  len.writeUInt16LE(bytes.length)
  return Buffer.concat([Buffer.from([IX.set_peer]), u64(lamports), len, bytes])
}

/** The addresses, in order, that fit one peer record (the rest are left out: a dialer needs one that works). */
export function fitPeerAddrs(addrs: string[]): string[] {
  const out: string[] = []
  let bytes = 0
  for (const a of addrs) {
    const n = Buffer.byteLength(a, 'utf8') + (out.length ? 1 : 0)
    if (bytes + n > PEER_ADDRS_MAX) continue
    out.push(a)
    bytes += n
  }
  return out
}

/** Decodes a peer account (RangeError when it is not one). */
export function decodePeer(data: Uint8Array): PeerRecord {
  const b = Buffer.from(data.buffer, data.byteOffset, data.byteLength)
  if (b.length !== PEER_SIZE) throw new RangeError(`peer account: ${b.length} bytes, expected ${PEER_SIZE}`)
  if (b.readBigUInt64LE(PEER.magic.offset) !== PEER_MAGIC) throw new RangeError('peer account: wrong magic (not a psyche peer record)')
  const n = b.readBigUInt64LE(PEER.addrs_len.offset)
  if (n > BigInt(PEER_ADDRS_MAX)) throw new RangeError('peer account: addresses exceed PEER_ADDRS_MAX')
  const text = b.toString('utf8', PEER.addrs.offset, PEER.addrs.offset + Number(n))
  const coordinator = addressDecoder.decode(b.subarray(PEER.coordinator.offset, PEER.coordinator.offset + 32))
  return {coordinator, client: b.toString('hex', PEER.client.offset, PEER.client.offset + 32), addrs: text === '' ? [] : text.split('\n')}
}

// ---- a run's name and description (set_metadata) ----

const NAME_MAX = constant('NAME_MAX')
export const DESCRIPTION_MAX = constant('DESCRIPTION_MAX')
const METADATA_MAGIC = MAGICS.METADATA_MAGIC[0]
const METADATA = structLayout('Metadata').at
/** Size of a metadata account: magic, coordinator [32], name_len u64, name [64], description_len u64, description [512]. */
export const METADATA_SIZE = structLayout('Metadata').size

export interface RunMetadata {
  name: string
  description: string
}

export function encodeSetMetadata(m: RunMetadata, lamports: bigint): Uint8Array {
  const name = Buffer.from(m.name, 'utf8')
  const description = Buffer.from(m.description, 'utf8')
  if (name.length > NAME_MAX) throw new RangeError(`the run name is ${name.length} bytes, more than ${NAME_MAX}`)
  if (description.length > DESCRIPTION_MAX) throw new RangeError(`the run description is ${description.length} bytes, more than ${DESCRIPTION_MAX}`)
  const len = Buffer.alloc(2)
  len.writeUInt16LE(description.length)
  return Buffer.concat([Buffer.from([IX.set_metadata]), u64(lamports), Buffer.from([name.length]), name, len, description])
}

/** Decodes a metadata account (RangeError when it is not one). */
export function decodeMetadata(data: Uint8Array): RunMetadata & {coordinator: Address} {
  const b = Buffer.from(data.buffer, data.byteOffset, data.byteLength)
  if (b.length !== METADATA_SIZE) throw new RangeError(`metadata account: ${b.length} bytes, expected ${METADATA_SIZE}`)
  if (b.readBigUInt64LE(METADATA.magic.offset) !== METADATA_MAGIC) throw new RangeError('metadata account: wrong magic (not a psyche run metadata record)')
  const nameLen = Number(b.readBigUInt64LE(METADATA.name_len.offset))
  const descLen = Number(b.readBigUInt64LE(METADATA.description_len.offset))
  if (nameLen > NAME_MAX || descLen > DESCRIPTION_MAX) throw new RangeError('metadata account: lengths exceed their capacity')
  return {
    coordinator: addressDecoder.decode(b.subarray(METADATA.coordinator.offset, METADATA.coordinator.offset + 32)),
    name: b.toString('utf8', METADATA.name.offset, METADATA.name.offset + nameLen),
    description: b.toString('utf8', METADATA.description.offset, METADATA.description.offset + descLen),
  }
}

// ---- state-transition logs (sol_log_data) ----

const STATE_LOG_MAGIC = MAGICS.STATE_LOG_MAGIC[0]

/** A phase change as the program logs it: the new phase, when (unix ms), the step and the epoch. */
interface StateLog {
  run_state: (typeof RUN_STATES)[number]
  run_state_start: number
  step: number
  epoch: number
}

/** The program's phase changes in a transaction's logs ("Program data: " lines it wrote with sol_log_data). */
export function decodeStateLogs(logs: string[]): StateLog[] {
  const out: StateLog[] = []
  for (const line of logs) {
    if (!line.startsWith('Program data: ')) continue
    const b = Buffer.from(line.slice('Program data: '.length).trim(), 'base64')
    if (b.length !== 40 || b.readBigUInt64LE(0) !== STATE_LOG_MAGIC) continue
    const state = RUN_STATES[Number(b.readBigUInt64LE(8))]
    if (!state) continue
    out.push({run_state: state, run_state_start: Number(b.readBigUInt64LE(16)), step: Number(b.readBigUInt64LE(24)), epoch: Number(b.readBigUInt64LE(32))})
  }
  return out
}

const POINTS = structLayout('Points')
const LEDGER_MAX = constant('LEDGER_MAX')
const SCORE_ONE = constant('SCORE_ONE')
/** Score entries one report_scores holds. */
export const REPORT_SCORES_MAX = constant('REPORT_SCORES_MAX')

/** One client's entry in the coordinator account's rewards ledger (the program's `Points`). */
export interface OnChainPoints {
  client_id: string
  rounds: number
  batches: number
  epoch_rounds: number
  epoch_batches: number
  earned: number
  slashed: number
  last_epoch: number
  /** The moving average of its verifiers' scores, fixed point (rewards.ts; null: never scored), and as rewards.ts keeps it. */
  score: number | null
  last: number | null
  last_step: number
  verifiers: number
  count: number
}

export interface OnChainLedger {
  points_per_batch: number
  /** Token base units a claim pays per point (0: nothing to claim). */
  token_rate: number
  /** set_rates: the rates the next epoch starts with (null: none set). */
  next: {points_per_batch: number; token_rate: number} | null
  entries: OnChainPoints[]
}

/** The rewards ledger of a coordinator account (rewards.ts's rule as the program keeps it), entries in ledger order. */
export function decodeLedger(data: Uint8Array): OnChainLedger {
  const b = Buffer.from(data.buffer, data.byteOffset, data.byteLength)
  if (b.length !== STATE_SIZE) throw new RangeError(`coordinator account: ${b.length} bytes, expected ${STATE_SIZE}`)
  const len = num(b, OFFSETS.ledger_len, 'ledger_len')
  if (len > LEDGER_MAX) throw new RangeError('coordinator account: ledger_len exceeds LEDGER_MAX')
  const entries = Array.from({length: len}, (_, i): OnChainPoints => {
    const o = OFFSETS.ledger + i * POINTS.size
    const field = (name: keyof typeof POINTS.at) => num(b, o + POINTS.at[name].offset, `ledger[${i}].${name}`)
    return {
      client_id: b.toString('hex', o + POINTS.at.key.offset, o + POINTS.at.key.offset + 32),
      rounds: field('rounds'),
      batches: field('batches'),
      epoch_rounds: field('epoch_rounds'),
      epoch_batches: field('epoch_batches'),
      earned: field('earned'),
      slashed: field('slashed'),
      last_epoch: field('last_epoch'),
      ...scoreFields(b, o, i),
    }
  })
  const next =
    b.readBigUInt64LE(OFFSETS.has_next_rates) === 0n
      ? null
      : {points_per_batch: num(b, OFFSETS.next_points_per_batch, 'next_points_per_batch'), token_rate: num(b, OFFSETS.next_token_rate, 'next_token_rate')}
  return {points_per_batch: num(b, OFFSETS.points_per_batch, 'points_per_batch'), token_rate: num(b, OFFSETS.token_rate, 'token_rate'), next, entries}
}

/** A ledger entry's scores: fixed point in [-SCORE_ONE, SCORE_ONE] (refused otherwise), null while never scored. */
function scoreFields(b: Buffer, o: number, i: number): Pick<OnChainPoints, 'score' | 'last' | 'last_step' | 'verifiers' | 'count'> {
  const fixed = (name: 'score' | 'last') => {
    const v = b.readBigInt64LE(o + POINTS.at[name].offset)
    if (v < -BigInt(SCORE_ONE) || v > BigInt(SCORE_ONE)) throw new RangeError(`coordinator account: ledger[${i}].${name} = ${v} is outside [-SCORE_ONE, SCORE_ONE]`)
    return Number(v)
  }
  const count = num(b, o + POINTS.at.count.offset, `ledger[${i}].count`)
  return {
    score: count ? fixed('score') : null,
    last: count ? fixed('last') : null,
    last_step: num(b, o + POINTS.at.last_step.offset, `ledger[${i}].last_step`),
    verifiers: b.readUInt32LE(o + POINTS.at.verifiers.offset),
    count,
  }
}

/** The verification scores the program keeps, as watchers get them from a server (rewards.ts scoreRows): scored clients, in id order. */
export function ledgerScores(ledger: OnChainLedger): ReturnType<typeof scoreRows> {
  return scoreRowsOf(ledger.entries)
}

/**
 * The ledger as `psyche rewards` shows it (rewardRows' columns, in client id order; what was claimed is the treasurer's): the points
 * pending for the current epoch are what its accepted batches would earn at the entry's weight (none for a client
 * ejected in it), by rewards.ts's rule (rewardWeight, pointsFor); scores as decimals.
 */
export function ledgerRows(ledger: OnChainLedger, state: CoordinatorState): RewardRow[] {
  const verified = verifierCount(state.config, 1) > 0
  const ejected = new Set([...state.epoch.clients, ...state.epoch.exited].filter((c) => c.state === 'Ejected').map((c) => c.id))
  return ledger.entries
    .filter((e) => e.rounds + e.epoch_rounds + e.earned + e.slashed > 0 || e.score !== null)
    .map((e) => {
      const weight = rewardWeight(e.score, verified)
      return {
        client_id: e.client_id,
        score: e.score === null ? null : scoreFromFixed(e.score),
        weight: weight / WEIGHT_ONE,
        rounds: e.rounds + e.epoch_rounds,
        batches: e.batches + e.epoch_batches,
        pending: ejected.has(e.client_id) ? 0 : pointsFor(e.epoch_batches, weight, ledger.points_per_batch),
        earned: e.earned,
        slashed: e.slashed,
      }
    })
    .sort((a, b) => (a.client_id < b.client_id ? -1 : a.client_id > b.client_id ? 1 : 0))
}
