import type {EquivocationProof} from './equivocation.js'
import type {CheckpointConfig, CoordinatorConfig, HubRepo, LLMConfig, RunState} from '../config/types.js'

export type {RunState} from '../config/types.js'

/** A client's standing in the current epoch (Psyche's ClientState). */
export const CLIENT_STATES = ['Healthy', 'Dropped', 'Withdrawn', 'Ejected'] as const
export type ClientState = (typeof CLIENT_STATES)[number]

/** A client identity: its public key or peer id, as text. Compared exactly. */
export type ClientId = string

export interface Client {
  id: ClientId
  state: ClientState
}

export interface ExitedClient extends Client {
  /** Height of the round at whose end the client left the epoch. */
  exited_height: number
}

/** A witness proof as the coordinator keeps it: who sent it and its two bloom filters (base64). */
export interface WitnessRecord {
  from: ClientId
  /** Clients whose results this witness received (keys from participantKey). */
  participant_bloom: string
  /** (client, batch range, commitment) triples it received (keys from broadcastKey). */
  broadcast_bloom: string
}

/** One training round: everything a client needs to compute its batches and whether it witnesses. */
export interface Round {
  step: number
  /** Index of the round within its epoch, from 0. */
  height: number
  /** First batch id of the round; its batches are [data_index, data_index + batch_size). */
  data_index: number
  /** The global batch size for this round (ramped over tokens). */
  batch_size: number
  /** 32-byte hex seed: witness and verifier selection derive from it. */
  seed: string
  /**
   * 32-byte hex seed the round's data shuffle derives from (rules.ts assignBatches): the epoch's first round's own
   * seed, then each round's from the previous round's seed (rules.ts nextDataSeed), so a client knows its batches of
   * the next round while this one runs (docs/ARCHITECTURE.md, "Knowing the next round's batches"). Absent in states
   * saved before it: the round's own seed.
   */
  data_seed?: string
  /** Unix milliseconds when the round's RoundTrain began. */
  started_at: number
  /** Client ids in epoch order at the round's start: the trainers. */
  roster: ClientId[]
  witnesses: WitnessRecord[]
  /** Accusations against this round's results by its witnesses (one per accuser and accused). */
  accusations: Accusation[]
  /**
   * Trainers whose results of this round no replica applies: a witness quorum found them invalid, or the
   * producer equivocated (signed two results for the step). Final with the round, like its witness records.
   */
  excluded: ClientId[]
  /**
   * How many of `witnesses` attest every trainer with batches in their participant bloom (counted when each
   * proof is accepted, so ticks stay O(1)). When it reaches the round's witness count, every witness has
   * attested every trainer's result and the witness window closes early.
   */
  complete_witnesses: number
  /**
   * How many members train this round: trainerCount (max_trainers_per_round) at its start, recorded so that a
   * configuration changed while Paused changes neither its batches nor its witness blooms (rules.ts roundTrainers).
   * Absent in states saved before it: trainerCount of the configuration.
   */
  trainers?: number
}

/**
 * Why a trainer of a round is accused: 'invalid_result' by a witness (its result fails validation);
 * 'low_score' by a verifier (its results' scores stayed below the threshold: src/core/verify/score.ts).
 */
export type AccusationReason = 'invalid_result' | 'low_score'

export interface Accusation {
  from: ClientId
  accused: ClientId
  reason: AccusationReason
}

export interface EpochState {
  /** When the epoch's Warmup began, unix milliseconds (epoch_time counts from here). */
  start_time: number
  start_step: number
  first_round: boolean
  checkpointed: boolean
  /** The epoch started after a pause: clients warm the optimizer up again (cold_start_warmup_steps). */
  cold_start: boolean
  clients: Client[]
  exited: ExitedClient[]
  /** Clients that reported their model loaded during Warmup. */
  warmup_witnesses: ClientId[]
  /**
   * In Cooldown: the parameter hashes the epoch's last round's witnesses attested after applying that round (one
   * per witness). A hash a quorum of them attests is the epoch's agreed hash (rules.ts agreedParamHash).
   */
  hash_witnesses: HashWitness[]
  round: Round | null
  previous_round: Round | null
}

/** A witness of an epoch's last round attests the hash of the parameters it holds after applying that round. */
export interface HashWitness {
  from: ClientId
  /** The worker's parameter hash: SHA-256, 64 lowercase hex digits. */
  param_hash: string
}

/**
 * The Hub checkpoint the coordinator took last, with the parameter hash the epoch's witnesses agreed on: a client
 * that loads that repository and revision checks the parameters it loaded against `param_hash`.
 */
export interface CheckpointHash {
  repo: HubRepo
  /** The step the checkpoint's model is at (the epoch's last round). */
  step: number
  param_hash: string
}

/**
 * The run's current model, as the coordinator records it at every epoch's end: the step of the epoch's last round and
 * the parameter hash a quorum of that round's witnesses attested after applying it (null: no quorum agreed on one).
 * Every model a client loads — from its peers, the Hub or its disk — is checked against it (rules.ts modelMismatch).
 */
export interface ModelRecord {
  step: number
  param_hash: string | null
}

/** The coordinator's whole state: serializable (serializeState), and never mutated by this module. */
export interface CoordinatorState {
  /** 2: times in unix milliseconds (version 1 kept whole seconds; deserializeState migrates it). */
  version: 2
  run_id: string
  run_state: RunState
  /** Unix milliseconds when run_state was entered; phase timeouts count from here. */
  run_state_start: number
  config: CoordinatorConfig
  model: {LLM: LLMConfig}
  /** The last non-P2P checkpoint, which new clients fall back to if every previous client has left. */
  checkpoint_fallback: CheckpointConfig | null
  /** The parameter hash recorded with the last Hub checkpoint the coordinator took (null: none taken with one). */
  checkpoint_hash: CheckpointHash | null
  /**
   * The run's current model (recorded at every epoch's end), or null while no epoch has changed the model: the run's
   * starting checkpoint is then its model. A joiner loads only this model; when no member holds it and no checkpoint
   * of it is known, the run waits (rules.ts modelWanted) rather than fall back to an older one.
   */
  current_model: ModelRecord | null
  /** 32-byte hex; each round's seed is derived from the previous one (and the tick's entropy). */
  seed: string
  progress: {epoch: number; step: number; epoch_start_data_index: number}
  epoch: EpochState
  /** Clients that will take part in the next epoch, in join order. */
  pending: ClientId[]
  pending_pause: boolean
}

export interface WitnessProof {
  participant_bloom: string
  broadcast_bloom: string
}

/**
 * What can happen to a run. `now` (unix milliseconds) is passed beside the event (applyEvent), never read from a clock.
 * - join / withdraw: a client asks to take part in (or leave) the run.
 * - tick: time passed; `entropy` (text, optional) is mixed into the next round's seed by backends that have some
 *   (a witness event may start a round too, and carries it the same way). On Solana it is the cluster clock's
 *   `clockEntropy(slot, unix_timestamp)`, which the program reads itself.
 * - witness: a witness proof for `step` (in Warmup: "my model is loaded", blooms ignored; in Cooldown: a witness
 *   of the epoch's last round attests `param_hash`, the hash of its parameters after applying that round).
 * - health_check: `from` says the `accused` trained nothing its witnesses saw in the previous round.
 * - pause / resume / config_update: the run's authority.
 * - checkpoint: a client uploaded the model at the end of the epoch (Cooldown); `param_hash` is the hash of what it
 *   uploaded, which must be the hash the last round's witnesses agreed on. Outside Cooldown, a checkpoint of the run's
 *   current model (`current_model`'s hash) is taken too: an upload that finished after its Cooldown, which a run
 *   whose members all left resumes from.
 * - eject: the authority removes a client (ours: Psyche has the state but no event).
 * - accuse: a witness of the current round found `accused`'s result invalid (it does not decode or validate
 *   against the run's model), or a verifier of the current round scored its results low. A quorum of the
 *   round's witnesses (resp. verifiers) accusing the same trainer for the same reason ejects it and excludes its
 *   result from the round.
 * - equivocation: `proof` holds two different results' announcements signed by one producer for one step;
 *   the producer is ejected at once, and if the step is the current round, excluded from it.
 */
export type CoordinatorEvent =
  | {type: 'join'; id: ClientId}
  | {type: 'withdraw'; id: ClientId}
  | {type: 'tick'; entropy?: string}
  | {type: 'witness'; from: ClientId; step: number; proof: WitnessProof; entropy?: string; param_hash?: string}
  | {type: 'health_check'; from: ClientId; accused: ClientId[]}
  | {type: 'pause'}
  | {type: 'resume'}
  | {type: 'checkpoint'; from: ClientId; repo: HubRepo; param_hash?: string}
  | {type: 'config_update'; config?: CoordinatorConfig; model?: {LLM: LLMConfig}}
  | {type: 'eject'; id: ClientId}
  | {type: 'accuse'; from: ClientId; step: number; accused: ClientId; reason: AccusationReason}
  | {type: 'equivocation'; from: ClientId; proof: EquivocationProof}

export type RejectionCode =
  | 'Halted'
  | 'InvalidRunState'
  | 'AlreadyJoined'
  /** The client was ejected from the current or last epoch (it may join once the next epoch has begun). */
  | 'Banned'
  | 'UnknownClient'
  | 'InvalidWithdraw'
  | 'InvalidWitness'
  | 'DuplicateWitness'
  | 'WrongStep'
  | 'NoActiveRound'
  | 'InvalidHealthCheck'
  | 'InvalidAccusation'
  | 'DuplicateAccusation'
  | 'InvalidProof'
  | 'AlreadyCheckpointed'
  /** The client is not one of the run's designated checkpointers (config.checkpointers). */
  | 'NotCheckpointer'
  /** No quorum of the epoch's last round's witnesses has attested a parameter hash (yet): nothing to check it against. */
  | 'HashNotAgreed'
  /** The checkpoint's declared parameter hash is not the one the epoch's witnesses agreed on. */
  | 'CheckpointHashMismatch'
  | 'CannotResume'
  | 'InvalidConfig'
  | 'InvalidEvent'
  /** A capacity of the coordinator (the layout table's MAX_CLIENTS, MAX_ACCUSATIONS) is reached. */
  | 'CapacityExceeded'

/** Why an event was rejected; the state is then unchanged. Plain data, so a backend can send it back. */
export interface Rejection {
  code: RejectionCode
  message: string
}

export interface ApplyResult {
  state: CoordinatorState
  error?: Rejection
}
