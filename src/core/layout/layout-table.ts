/**
 * THE table of what the TypeScript and the Solana programs share, in one place: capacities (also the reference
 * coordinator's), the run-id length, the config fields, every account's structs field by field, and the enums.
 *
 * - `npm run build:programs` (scripts/gen-layout.ts) writes programs/include/psyche_layout.h from it: the C
 *   `#define`s, enums and `typedef struct`s, with a `_Static_assert` on every field's offset, so clang checks the
 *   offsets computed here.
 * - src/core/backend/solana/layout.ts decodes and encodes accounts with the offsets `structLayout` computes from it.
 * - config/run-config.ts takes the config field names from `CONFIG_FIELDS`.
 *
 * To add an account field: add a row to its struct below (a `u64` keeps every later field aligned), raise
 * `LAYOUT_VERSION` when existing accounts cannot be read any more, run `npm run build:programs -- --force`, use the
 * field in programs/coordinator/coordinator.c and in layout.ts, and commit the header and the .so with it.
 * test/solana/layout-table.test.ts fails while the committed header is older than this table.
 *
 * It imports nothing, so every layer, the generator and the tests may read it: the run configuration's validator
 * (config/run-config.ts) and the coordinator (coordinator/) both do, and neither imports the other through it.
 */

/** Numeric constants: name → [value, what it bounds]. */
export const CONSTANTS = {
  MAX_CLIENTS: [256, 'clients in an epoch and joiners waiting, together (Psyche holds 256); also exited clients, warmup reports, a round roster'],
  MAX_WITNESSES: [32, 'witness proofs per round (the automatic witness count, Psyche SOLANA_MAX_NUM_WITNESSES)'],
  MAX_ACCUSATIONS: [256, 'accusations per round (one per accuser, accused and reason)'],
  BLOOM_MAX: [312, 'bytes of one witness bloom: the filter for MAX_CLIENTS trainers (witnessBloomParams), rounded up to 8'],
  RUN_ID_MAX: [32, 'bytes of a run id (a program address seed is at most 32 bytes)'],
  REPO_MAX: [96, 'bytes of a Hub repo id'],
  REVISION_MAX: [64, 'bytes of a Hub revision'],
  MODEL_JSON_MAX: [4096, 'bytes of model.LLM JSON (the rest of the model config)'],
  SHUFFLE_ROUNDS: [90, 'rounds of the swap-or-not shuffle (shuffle.ts)'],
  PEER_ADDRS_MAX: [768, 'bytes of multiaddrs in a peer record (one set_peer transaction stays under 1,232 bytes)'],
  NAME_MAX: [64, 'bytes of a run name'],
  DESCRIPTION_MAX: [512, 'bytes of a run description'],
  MAX_DELEGATES: [16, 'delegates of one authorization'],
  MAX_CHECKPOINTERS: [8, 'designated checkpointers of a run (config.checkpointers)'],
  LEDGER_MAX: [512, "clients the rewards ledger holds (points per client key); past it, a new key's entry reuses one that holds nothing, or it earns nothing"],
  POINTS_PER_BATCH: [1000, 'points for one accepted batch at full weight, until set_rates changes it (rewards.ts POINTS_PER_BATCH)'],
  MAX_POINTS_PER_BATCH: [1000000, 'the most points per batch set_rates accepts (points stay far from u64 overflow)'],
  MAX_TOKEN_RATE: [1000000000000, 'the most token base units per point set_rates accepts'],
  WEIGHT_ONE: [1000000, "a points weight of 1 in the ledger's fixed point (parts per million)"],
  SCORE_ONE: [1000000, "a verifier's score of 1 in the ledger's fixed point (parts per million: scores are in [-SCORE_ONE, SCORE_ONE])"],
  FULL_WEIGHT_SCORE: [200000, 'the score (fixed point) at which points earn full weight (rewards.ts FULL_WEIGHT_SCORE)'],
  REPORT_SCORES_MAX: [64, 'score entries in one report_scores (8 + 6 × 64 bytes of data: one transaction holds them)'],
  UPDATE_MAX: [4673, "bytes of an update's data: flags, Config, MAX_CHECKPOINTERS keys, the model with MODEL_JSON_MAX of JSON (what an update buffer holds)"],
} as const satisfies Record<string, readonly [number, string]>

/** Magic numbers (the first u64 of each account) and the coordinator layout's version. */
export const MAGICS = {
  MAGIC: [0x44524f4f43595350n, '"PSYCOORD": a coordinator account'],
  LAYOUT_VERSION: [
    11n,
    "11: Round.trainers (a round's blooms are sized for its trainers, recorded at its start); 10: Round.data_seed (a round's batches are known one round ahead); 9: inner_steps (SparseLoCo's H) beside max_seq_len; 8: max_trainers_per_round in Config; 7: the run's current model (step and agreed parameter hash, recorded at every epoch's end); 6: verifiers' scores in the ledger (report_scores; Points.weight derived from them), claims move to the treasurer program (no claimed points, no treasury mint here); 5: the rewards ledger (points per client), rates; 4: checkpointers, Cooldown hash witnesses, the checkpoint hash (3: 256 clients, precomputed bloom probes; 2: times in unix milliseconds)",
  ],
  PEER_MAGIC: [0x5245455043595350n, '"PSYCPEER": a peer record'],
  METADATA_MAGIC: [0x4154454d43595350n, '"PSYCMETA": a run metadata record'],
  AUTH_MAGIC: [0x4854554148595350n, '"PSYHAUTH": an authorization'],
  STATE_LOG_MAGIC: [0x4554415453595350n, '"PSYSTATE": a phase-change log (sol_log_data)'],
  BUFFER_MAGIC: [0x4646554243595350n, '"PSYCBUFF": an update buffer'],
  TREASURY_MAGIC: [0x5341455254595350n, '"PSYTREAS": a treasury of the treasurer program'],
  PARTICIPANT_MAGIC: [0x5452415054595350n, '"PSYTPART": a participant record of the treasurer program (what a client claimed)'],
} as const satisfies Record<string, readonly [bigint, string]>

type ConstantName = keyof typeof CONSTANTS

/** A field: its name, its C type with array dimensions (numbers or CONSTANTS names), e.g. `u8[MAX_CLIENTS][32]`. */
type Row = readonly [name: string, type: string, doc?: string]

/**
 * Every struct, in dependency order. Types: u8, u16, u32, u64, i64 or a struct above. Fields are laid out as a C compiler
 * does (natural alignment); the generator refuses implicit padding, so every byte of an account is a named field.
 */
export const STRUCTS = {
  Config: [
    ['warmup_time', 'u64'],
    ['cooldown_time', 'u64'],
    ['epoch_time', 'u64'],
    ['rounds_per_epoch', 'u64', '0: not set'],
    ['max_round_train_time', 'u64'],
    ['round_witness_time', 'u64'],
    ['min_clients', 'u64'],
    ['init_min_clients', 'u64'],
    ['witness_nodes', 'u64'],
    ['verification_percent', 'u64'],
    ['global_batch_size_start', 'u64'],
    ['global_batch_size_end', 'u64'],
    ['global_batch_size_warmup_tokens', 'u64'],
    ['total_steps', 'u64'],
    ['waiting_for_members_extra_time', 'u64'],
    ['max_trainers_per_round', 'u64', '0: not set (every member trains)'],
  ],
  Checkpoint: [
    ['kind', 'u8', 'CheckpointKind'],
    ['repo_len', 'u8'],
    ['revision_len', 'u8'],
    ['has_revision', 'u8'],
    ['pad', 'u8[4]'],
    ['repo', 'u8[REPO_MAX]'],
    ['revision', 'u8[REVISION_MAX]'],
  ],
  ClientRec: [
    ['key', 'u8[32]'],
    ['state', 'u64', 'ClientState'],
    ['exited_height', 'u64'],
    ['probe', 'u64', "the bloom probe of the client's participant key (h1 | h2 << 32), computed once at join"],
    ['ledger', 'u64', "1 + the client's entry in the rewards ledger (0: none, the ledger was full)"],
  ],
  Points: [
    ['key', 'u8[32]', 'the client'],
    ['rounds', 'u64', 'accepted results in settled epochs'],
    ['batches', 'u64', 'accepted batches in settled epochs'],
    ['epoch_rounds', 'u64', "accepted results in the current epoch (settled at the epoch's end)"],
    ['epoch_batches', 'u64', 'accepted batches in the current epoch'],
    ['earned', 'u64', 'points earned in settled epochs'],
    ['slashed', 'u64', 'points withheld: the client was ejected in their epoch'],
    ['last_epoch', 'u64', 'the last epoch the client joined or began (an entry holding nothing is reused 3 epochs later)'],
    ['score', 'i64', "moving average of the verifiers' scores, fixed point (SCORE_ONE = 1; rewards.ts ClientRewards.score; none while count is 0): its points' weight"],
    ['last', 'i64', "the mean of last_step's reports (fixed point)"],
    ['before', 'i64', 'the average before last_step (when has_before)'],
    ['sum', 'i64', "the sum of last_step's reports"],
    ['last_step', 'u64', 'the last step scored'],
    ['count', 'u64', 'score reports received (0: never scored, which earns nothing in a run with verifiers)'],
    ['verifiers', 'u32', 'verifiers that reported last_step'],
    ['has_before', 'u32', '0: last_step is the first step scored'],
  ],
  Witness: [
    ['from', 'u8[32]'],
    ['participant_bloom', 'u8[BLOOM_MAX]'],
    ['broadcast_bloom', 'u8[BLOOM_MAX]'],
  ],
  HashWitness: [
    ['from', 'u8[32]'],
    ['param_hash', 'u8[32]', 'SHA-256 of the witness parameters after applying the epoch last round'],
  ],
  Accusation: [
    ['from', 'u8[32]'],
    ['accused', 'u8[32]'],
    ['reason', 'u64', 'AccusationReason'],
  ],
  Round: [
    ['step', 'u64'],
    ['height', 'u64'],
    ['data_index', 'u64'],
    ['batch_size', 'u64'],
    ['started_at', 'u64'],
    ['roster_len', 'u64'],
    ['witness_len', 'u64'],
    ['accusation_len', 'u64'],
    ['excluded_len', 'u64'],
    ['complete_witnesses', 'u64', 'proofs whose participant bloom names every trainer'],
    ['trainers', 'u64', 'members that train this round (trainerCount at its start): its batches and witness blooms follow it'],
    ['seed', 'u8[32]'],
    ['data_seed', 'u8[32]', "the data shuffle's seed: the epoch's first round's own seed, then SHA-256(the previous round's seed ‖ \"next-data\")"],
    ['roster', 'u8[MAX_CLIENTS][32]'],
    ['roster_probe', 'u64[MAX_CLIENTS]', "each roster member's ClientRec.probe"],
    ['witnesses', 'Witness[MAX_WITNESSES]'],
    ['accusations', 'Accusation[MAX_ACCUSATIONS]'],
    ['excluded', 'u8[MAX_CLIENTS][32]'],
    ['roster_mark', 'u8[MAX_CLIENTS]', 'per roster member: the witnesses whose participant bloom holds it (low 7 bits), 0x80 when its result is excluded'],
    ['roster_ledger', 'u16[MAX_CLIENTS]', "each roster member's ClientRec.ledger"],
    ['extra_rounds', 'u64', 'rounds of the inverse shuffle that finds the members with one batch more, run so far (by the witness proofs)'],
    ['extra_at', 'u8[MAX_CLIENTS]', 'that shuffle in progress: where the followed positions are'],
    ['scores_reported', 'u8[32]', 'a bit per roster member (MAX_CLIENTS bits): it reported its scores of the previous round (report_scores)'],
  ],
  State: [
    ['magic', 'u64', 'MAGIC'],
    ['version', 'u64', 'LAYOUT_VERSION'],
    ['run_id', 'u8[RUN_ID_MAX]'],
    ['run_id_len', 'u64'],
    ['bump', 'u64'],
    ['main_authority', 'u8[32]'],
    ['join_authority', 'u8[32]', 'all zeros: anyone may join'],
    ['authorizer', 'u8[32]', 'the program whose authorizations admit clients'],
    ['run_state', 'u64', 'RunState'],
    ['run_state_start', 'u64', 'unix milliseconds'],
    ['has_config', 'u64'],
    ['config', 'Config'],
    ['max_seq_len', 'u64'],
    ['cold_start_warmup_steps', 'u64'],
    ['inner_steps', 'u64', "model.LLM.optimizer's inner steps per round (SparseLoCo's H; 1 for every other optimizer): a round's batch is this many global batches"],
    ['checkpoint', 'Checkpoint'],
    ['checkpoint_fallback', 'Checkpoint'],
    ['seed', 'u8[32]'],
    ['progress_epoch', 'u64'],
    ['progress_step', 'u64'],
    ['epoch_start_data_index', 'u64'],
    ['epoch_start_time', 'u64'],
    ['epoch_start_step', 'u64'],
    ['first_round', 'u64'],
    ['checkpointed', 'u64'],
    ['cold_start', 'u64'],
    ['clients_len', 'u64'],
    ['exited_len', 'u64'],
    ['warmup_len', 'u64'],
    ['pending_len', 'u64'],
    ['has_round', 'u64'],
    ['has_previous_round', 'u64'],
    ['pending_pause', 'u64'],
    ['clients', 'ClientRec[MAX_CLIENTS]'],
    ['exited', 'ClientRec[MAX_CLIENTS]'],
    ['warmup_witnesses', 'u8[MAX_CLIENTS][32]'],
    ['pending', 'u8[MAX_CLIENTS][32]'],
    ['pending_probe', 'u64[MAX_CLIENTS]', "each joiner's bloom probe (ClientRec.probe)"],
    ['pending_client', 'u64[MAX_CLIENTS]', '1 + where the joiner was in clients when it was queued, 0 if it was not there'],
    ['round', 'Round'],
    ['previous_round', 'Round'],
    ['model_json_len', 'u64'],
    ['model_json', 'u8[MODEL_JSON_MAX]', 'the rest of model.LLM as JSON'],
    ['checkpointers_len', 'u64', 'config.checkpointers (0: not set, any epoch member may checkpoint)'],
    ['checkpointers', 'u8[MAX_CHECKPOINTERS][32]'],
    ['hash_witness_len', 'u64'],
    ['hash_witnesses', 'HashWitness[MAX_WITNESSES]', 'Cooldown: parameter hashes attested by the epoch last round witnesses'],
    ['has_checkpoint_hash', 'u64'],
    ['checkpoint_hash_step', 'u64', 'the step of the model the recorded checkpoint holds'],
    ['checkpoint_hash', 'u8[32]', 'the parameter hash the witnesses agreed on, recorded with the checkpoint'],
    ['checkpoint_hash_repo', 'Checkpoint', 'the Hub repository the hash was recorded with (kind Hub)'],
    ['pending_ledger', 'u64[MAX_CLIENTS]', "each joiner's ClientRec.ledger"],
    ['points_per_batch', 'u64', 'points per accepted batch at full weight (POINTS_PER_BATCH; set_rates)'],
    ['token_rate', 'u64', "token base units the treasurer program's claim pays per point (0: nothing to claim; set_rates)"],
    ['next_points_per_batch', 'u64', 'set_rates: the rates the next epoch starts with (when has_next_rates)'],
    ['next_token_rate', 'u64'],
    ['has_next_rates', 'u64'],
    ['ledger_len', 'u64'],
    ['ledger', 'Points[LEDGER_MAX]', 'the rewards ledger (rewards.ts): per client key, accepted results and points'],
    ['has_current_model', 'u64', "0: no epoch has recorded the run's model yet (its starting checkpoint is its model)"],
    ['current_model_step', 'u64', "the run's current model: the step of the last epoch's last round (recorded at every epoch's end)"],
    ['has_current_model_hash', 'u64', '0: no witness quorum agreed on its parameter hash'],
    ['current_model_hash', 'u8[32]', 'the parameter hash its witnesses agreed on: every model a client loads is checked against it'],
  ],
  Peer: [
    ['magic', 'u64', 'PEER_MAGIC'],
    ['coordinator', 'u8[32]'],
    ['client', 'u8[32]'],
    ['addrs_len', 'u64'],
    ['addrs', 'u8[PEER_ADDRS_MAX]', 'multiaddrs, newline-separated UTF-8'],
  ],
  Metadata: [
    ['magic', 'u64', 'METADATA_MAGIC'],
    ['coordinator', 'u8[32]'],
    ['name_len', 'u64'],
    ['name', 'u8[NAME_MAX]'],
    ['description_len', 'u64'],
    ['description', 'u8[DESCRIPTION_MAX]'],
  ],
  UpdateBuffer: [
    ['magic', 'u64', 'BUFFER_MAGIC'],
    ['coordinator', 'u8[32]'],
    ['authority', 'u8[32]', "the run's main authority, who writes it"],
    ['len', 'u64', "the update's length, set by buffer_init"],
    ['written', 'u64', 'bytes written so far (chunks are appended in order)'],
    ['data', 'u8[UPDATE_MAX]', "the update instruction's data after its tag"],
    ['pad', 'u8[7]'],
  ],
  Authorization: [
    ['magic', 'u64', 'AUTH_MAGIC'],
    ['grantor', 'u8[32]'],
    ['grantee', 'u8[32]', 'all zeros: anyone'],
    ['active', 'u64'],
    ['delegates_len', 'u64'],
    ['delegates', 'u8[MAX_DELEGATES][32]'],
  ],
  Treasury: [
    ['magic', 'u64', 'TREASURY_MAGIC'],
    ['coordinator', 'u8[32]', "the run's coordinator account"],
    ['coordinator_program', 'u8[32]', 'the program that owns it (its owner when the treasury was created)'],
    ['authority', 'u8[32]', "the run's main authority when the treasury was created: claims are paid only while it still is"],
    ['mint', 'u8[32]', 'the SPL token claims pay in'],
    ['vault', 'u8[32]', "the treasury's token account: the program address ['vault', treasury], its token owner the treasury"],
    ['bump', 'u64', "the bump of the treasury's program address"],
    ['funded', 'u64', 'token base units the authority paid in with fund (transfers from others are gifts, not counted)'],
    ['claimed', 'u64', 'points paid out, all clients'],
    ['paid', 'u64', 'token base units paid out by claims'],
  ],
  Participant: [
    ['magic', 'u64', 'PARTICIPANT_MAGIC'],
    ['treasury', 'u8[32]'],
    ['client', 'u8[32]'],
    ['claimed', 'u64', "points paid: the client's earned points at its last claim"],
    ['paid', 'u64', 'token base units paid to the client'],
  ],
} as const satisfies Record<string, readonly Row[]>

export type StructName = keyof typeof STRUCTS

/** The coordinator's phases (the Psyche book's run states): a state.toml's run_state, and the C enum RunState. */
export const RUN_STATES = ['Uninitialized', 'WaitingForMembers', 'Warmup', 'RoundTrain', 'RoundWitness', 'Cooldown', 'Finished', 'Paused'] as const

/**
 * Enums: the C names are the prefix and the value in SNAKE_CASE (RoundTrain → ROUND_TRAIN, update → IX_UPDATE). `values`
 * maps a name to its number; a list numbers from 0.
 */
export const ENUMS = {
  RunState: {prefix: '', values: RUN_STATES},
  ClientState: {prefix: '', values: ['Healthy', 'Dropped', 'Withdrawn', 'Ejected']},
  CheckpointKind: {prefix: 'CK_', values: ['None', 'Ephemeral', 'Dummy', 'Hub', 'P2P']},
  AccusationReason: {prefix: 'REASON_', values: ['invalid_result', 'low_score']},
  Instruction: {
    prefix: 'IX_',
    values: [
      'init_coordinator',
      'update',
      'set_paused',
      'join_run',
      'tick',
      'witness',
      'warmup_witness',
      'health_check',
      'checkpoint',
      'free_coordinator',
      'withdraw',
      'eject',
      'grow',
      'accuse',
      'set_peer',
      'equivocation',
      'set_metadata',
      'close_peer',
      'buffer_init',
      'buffer_write',
      'update_from_buffer',
      'hash_witness',
      'set_rates',
      'report_scores',
    ],
  },
  /** The treasurer program's instructions (programs/treasurer). */
  TreasurerInstruction: {prefix: 'TIX_', values: ['init_treasury', 'fund', 'claim']},
  /** Custom program errors: 1..21 are the reference's RejectionCodes, 100.. the programs' own. */
  Error: {
    prefix: 'E_',
    values: {
      Halted: 1,
      InvalidRunState: 2,
      AlreadyJoined: 3,
      UnknownClient: 4,
      InvalidWithdraw: 5,
      InvalidWitness: 6,
      DuplicateWitness: 7,
      WrongStep: 8,
      NoActiveRound: 9,
      InvalidHealthCheck: 10,
      InvalidAccusation: 11,
      DuplicateAccusation: 12,
      InvalidProof: 13,
      AlreadyCheckpointed: 14,
      CannotResume: 15,
      InvalidConfig: 16,
      InvalidEvent: 17,
      Banned: 18,
      NotCheckpointer: 19,
      HashNotAgreed: 20,
      CheckpointHashMismatch: 21,
      InvalidInstruction: 100,
      WrongAccount: 101,
      Unauthorized: 102,
      CapacityExceeded: 103,
      MissingSignature: 104,
      NotWritable: 105,
      WrongProgramAddress: 106,
      NotPermitted: 107,
      AlreadyExists: 108,
      NothingToClaim: 109,
      TreasuryEmpty: 110,
      InvalidScores: 111,
      DuplicateScores: 112,
    },
  },
} as const

/** The value of a capacity constant. */
export function constant(name: ConstantName): number {
  return CONSTANTS[name][0]
}

/** The config fields the coordinator account holds (u64 each, in this order); run-config.ts knows these and a few more. */
export const CONFIG_FIELDS = STRUCTS.Config.map(([name]) => name)

/** Capacity of one coordinator, in both coordinators. */
export const MAX_CLIENTS = constant('MAX_CLIENTS')
export const MAX_WITNESSES = constant('MAX_WITNESSES')
export const MAX_ACCUSATIONS = constant('MAX_ACCUSATIONS')
/** A run id is 1 to RUN_ID_MAX bytes (a program address seed on Solana). */
export const RUN_ID_MAX = constant('RUN_ID_MAX')

// ---- layout: offsets and sizes, as a C compiler lays the structs out ----

const SCALARS: Record<string, number> = {u8: 1, u16: 2, u32: 4, u64: 8, i64: 8}

interface FieldLayout {
  name: string
  /** The element type: a scalar or a struct name. */
  type: string
  /** Array dimensions (empty for a single value). */
  dims: number[]
  /** Dimensions as written (numbers or constant names), for the C header. */
  dimNames: (number | string)[]
  offset: number
  /** Bytes of the whole field. */
  size: number
  /** Bytes of one element of the outermost dimension (the field's size when it is not an array). */
  stride: number
  doc?: string
}

interface StructLayout {
  name: string
  size: number
  align: number
  fields: FieldLayout[]
  /** The fields by name. */
  at: Record<string, FieldLayout>
}

const cache = new Map<string, StructLayout>()

/** Parses `u8[MAX_CLIENTS][32]` into its element type and dimensions. */
function parseType(type: string): {base: string; dims: (number | string)[]} {
  const m = /^([A-Za-z_][A-Za-z0-9_]*)((?:\[[A-Za-z0-9_]+\])*)$/.exec(type)
  if (!m) throw new Error(`layout table: malformed type ${JSON.stringify(type)}`)
  const dims = [...m[2].matchAll(/\[([A-Za-z0-9_]+)\]/g)].map((d) => (/^[0-9]+$/.test(d[1]) ? Number(d[1]) : d[1]))
  return {base: m[1], dims}
}

function dimValue(d: number | string): number {
  if (typeof d === 'number') return d
  if (!(d in CONSTANTS)) throw new Error(`layout table: unknown constant ${d}`)
  return constant(d as ConstantName)
}

/** Offsets and sizes of a struct of the table (C layout: natural alignment; implicit padding is refused). */
export function structLayout(name: StructName): StructLayout {
  const hit = cache.get(name)
  if (hit) return hit
  const rows = STRUCTS[name] as readonly Row[]
  let offset = 0
  let align = 1
  const fields: FieldLayout[] = []
  for (const [fieldName, type, doc] of rows) {
    const {base, dims: dimNames} = parseType(type)
    let elemSize: number
    let elemAlign: number
    if (base in SCALARS) elemSize = elemAlign = SCALARS[base]
    else if (base in STRUCTS) {
      const inner = structLayout(base as StructName)
      elemSize = inner.size
      elemAlign = inner.align
    } else throw new Error(`layout table: ${name}.${fieldName} has unknown type ${base}`)
    if (offset % elemAlign !== 0) throw new Error(`layout table: ${name}.${fieldName} at ${offset} is not ${elemAlign}-aligned: add explicit padding`)
    const dims = dimNames.map(dimValue)
    const size = dims.reduce((a, d) => a * d, elemSize)
    const stride = dims.length ? size / dims[0] : size
    fields.push({name: fieldName, type: base, dims, dimNames, offset, size, stride, ...(doc ? {doc} : {})})
    offset += size
    align = Math.max(align, elemAlign)
  }
  if (offset % align !== 0) throw new Error(`layout table: ${name} ends at ${offset}, not a multiple of its alignment ${align}: add explicit padding`)
  const layout: StructLayout = {name, size: offset, align, fields, at: Object.fromEntries(fields.map((f) => [f.name, f]))}
  cache.set(name, layout)
  return layout
}

/** An enum's values as name → number. */
export function enumValues(name: keyof typeof ENUMS): Record<string, number> {
  const values = ENUMS[name].values as readonly string[] | Record<string, number>
  return Array.isArray(values) ? Object.fromEntries((values as readonly string[]).map((v, i) => [v, i])) : {...(values as Record<string, number>)}
}
