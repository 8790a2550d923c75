import {BloomFilter, bloomParamsFor, type BloomParams} from '../primitives/bloom.js'
import type {CheckpointConfig, CoordinatorConfig} from '../config/types.js'
import {DEFAULT_VERIFICATION_SAMPLE, innerSteps} from '../config/run-config.js'
import {sha256, subSeed, u64le} from '../primitives/seed.js'
import {isRoundPhase} from './phases.js'
import {shuffleAll, shuffledIndex, unshuffledIndex} from '../primitives/shuffle.js'
import type {ClientId, CoordinatorState, Round} from './types.js'
import {MAX_WITNESSES} from '../layout/layout-table.js'

/**
 * The coordinator's derived rules, as pure functions anyone can call: the coordinator to check a
 * proof, a client to find its batches, a verifier to recompute either.
 */

/** With witness_nodes = 0, every client witnesses, up to this many (Psyche's SOLANA_MAX_NUM_WITNESSES; the layout table's MAX_WITNESSES). */
const MAX_AUTO_WITNESSES = MAX_WITNESSES
/** Witness blooms are sized for this false-positive rate (Psyche's BLOOM_FALSE_RATE). */
const WITNESS_BLOOM_FALSE_RATE = 0.01

/** Batch ids [start, end) (end exclusive). */
export interface BatchRange {
  start: number
  end: number
}

/**
 * The global batch size once `tokensProcessed` tokens have been trained on: linear from start to end
 * over global_batch_size_warmup_tokens, rounded to the nearest batch (Psyche's get_batch_size).
 */
export function globalBatchSize(config: CoordinatorConfig, tokensProcessed: number): number {
  const {global_batch_size_start: start, global_batch_size_end: end, global_batch_size_warmup_tokens: warmup} = config
  if (tokensProcessed >= warmup) return end
  return Math.round(start + ((end - start) * tokensProcessed) / warmup)
}

/**
 * The batches of a round that starts at batch `dataIndex`: the global batch size times the optimizer's inner steps
 * per round (SparseLoCo's H, 1 for every other optimizer). So each trainer gets H times its share, the worker trains
 * them as H inner steps, and no batch is trained twice.
 */
export function roundBatchSize(state: Pick<CoordinatorState, 'config' | 'model'>, dataIndex: number): number {
  return globalBatchSize(state.config, dataIndex * state.model.LLM.max_seq_len) * innerSteps(state.model.LLM.optimizer)
}

/** The first batch id of the next round to start. Rounds follow each other without gaps or overlap. */
export function nextDataIndex(state: CoordinatorState): number {
  const round = state.epoch.round
  return round ? round.data_index + round.batch_size : state.progress.epoch_start_data_index
}

/**
 * The batch size of round `step` (roundBatchSize; default: the current round, or the next one if none is active).
 * Known for the current and previous round, and for the next step; other steps throw a RangeError.
 */
export function batchSizeForStep(state: CoordinatorState, step?: number): number {
  const {round, previous_round: previous} = state.epoch
  const active = round && isRoundPhase(state.run_state)
  const wanted = step ?? (active ? round!.step : state.progress.step)
  if (round && round.step === wanted) return round.batch_size
  if (previous && previous.step === wanted) return previous.batch_size
  if (wanted === state.progress.step) return roundBatchSize(state, nextDataIndex(state))
  throw new RangeError(`step ${wanted} is neither the current, the previous nor the next round`)
}

/** How many witnesses a round with `rosterSize` trainers has. */
export function witnessCount(config: CoordinatorConfig, rosterSize: number): number {
  const wanted = config.witness_nodes === 0 ? MAX_AUTO_WITNESSES : config.witness_nodes
  return Math.min(wanted, rosterSize)
}

/** Witness proofs needed for a quorum among `witnesses` witnesses: Psyche's 1→1, 2→2, 3→2, n→⌊2n/3⌋. */
export function witnessQuorum(witnesses: number): number {
  if (witnesses <= 2) return witnesses
  if (witnesses === 3) return 2
  return Math.floor((witnesses * 2) / 3)
}

/** The current round, or throws if there is none (before the first RoundTrain of an epoch). */
function roundOf(state: CoordinatorState, round?: Round | null): Round {
  const r = round ?? state.epoch.round
  if (!r) throw new RangeError('no round in this epoch yet')
  return r
}

/** The seed of a round's data shuffle (Round.data_seed; a round saved before it: its own seed). */
function dataSeed(r: Pick<Round, 'seed' | 'data_seed'>): Buffer {
  return subSeed(r.data_seed ?? r.seed, 'data')
}

/**
 * The data seed (Round.data_seed) of the round after one whose seed is `seed`: drawn from that round's seed, so it is
 * known, with the round's roster and data index, as soon as that round starts. The epoch's first round has its own
 * seed as its data seed (machine.ts startRoundTrain; coordinator.c start_round_train).
 */
export function nextDataSeed(seed: string): string {
  return subSeed(seed, 'next-data').toString('hex')
}

/**
 * The next round as the state in round `state.epoch.round` predicts it, for a client to begin training it early
 * (client/decide.ts `speculate`): its roster is the epoch's Healthy members now, its batches follow this round's, and
 * its data seed is nextDataSeed of this round's. It is the round the coordinator starts (startRoundTrain) unless
 * somebody leaves, is dropped or ejected first, or the epoch ends; a client checks its range against the real round
 * before using the work. Undefined outside a round.
 */
export function predictNextRound(state: CoordinatorState): Round | undefined {
  const round = state.epoch.round
  if (!round || !isRoundPhase(state.run_state)) return undefined
  const dataIndex = round.data_index + round.batch_size
  return {
    step: round.step + 1,
    height: round.height + 1,
    data_index: dataIndex,
    batch_size: roundBatchSize(state, dataIndex),
    seed: round.seed,
    data_seed: nextDataSeed(round.seed),
    started_at: round.started_at,
    roster: state.epoch.clients.filter((c) => c.state === 'Healthy').map((c) => c.id),
    witnesses: [],
    accusations: [],
    excluded: [],
    complete_witnesses: 0,
    trainers: trainerCount(state.config, state.epoch.clients.filter((c) => c.state === 'Healthy').length),
  }
}

const assignmentMemo = new WeakMap<Round, Map<ClientId, BatchRange>>()
const witnessMemo = new WeakMap<Round, ClientId[]>()
/** A client asks whether it witnesses on every result it receives: one shuffle per client and round, not per result. */
const isWitnessMemo = new WeakMap<Round, Map<ClientId, boolean>>()

/**
 * How many members of a round with `rosterSize` members train: config.max_trainers_per_round (G) when the roster is
 * larger, else all of them. Those the round's data shuffle puts at the first positions train; the others verify,
 * witness and serve, and wait for a round that chooses them (each round's seed draws again, so every member is chosen
 * with the same chance G / n every round, whatever it did before).
 */
export function trainerCount(config: Pick<CoordinatorConfig, 'max_trainers_per_round'>, rosterSize: number): number {
  const cap = config.max_trainers_per_round
  return cap !== undefined && cap > 0 && cap < rosterSize ? cap : rosterSize
}

/** How many members of `round` train: the count it recorded at its start (Round.trainers), else trainerCount. */
export function roundTrainers(config: Pick<CoordinatorConfig, 'max_trainers_per_round'>, round: Pick<Round, 'roster' | 'trainers'>): number {
  return round.trainers ?? trainerCount(config, round.roster.length)
}

/**
 * The batch range of the member at shuffled `position` when `trainers` members train: the first `trainers` positions
 * get contiguous ranges, sizes differing by at most one; the others (not chosen this round), an empty one.
 */
export function rangeForPosition(round: Pick<Round, 'data_index' | 'batch_size'>, trainers: number, position: number): BatchRange {
  if (position >= trainers) return {start: round.data_index + round.batch_size, end: round.data_index + round.batch_size}
  const base = Math.floor(round.batch_size / trainers)
  const extra = round.batch_size % trainers
  const start = round.data_index + position * base + Math.min(position, extra)
  return {start, end: start + base + (position < extra ? 1 : 0)}
}

/**
 * Every member's batch range for the round (default: current): the round's batches split into contiguous ranges,
 * handed out in an order shuffled by the round's data seed (Round.data_seed: known one round ahead). Members past trainerCount (max_trainers_per_round), and with
 * more trainers than batches the last positions, get empty ranges (start = end): they produce nothing this round.
 */
export function assignBatches(state: CoordinatorState, round?: Round | null): Map<ClientId, BatchRange> {
  const r = roundOf(state, round)
  const hit = assignmentMemo.get(r)
  if (hit) return hit
  const n = r.roster.length
  const positions = shuffleAll(n, dataSeed(r))
  const trainers = roundTrainers(state.config, r)
  const out = new Map<ClientId, BatchRange>()
  for (let i = 0; i < n; i++) out.set(r.roster[i], rangeForPosition(r, trainers, positions[i]))
  assignmentMemo.set(r, out)
  return out
}

/** One client's batch range (O(1) hashes, unlike assignBatches), or undefined if it is not a trainer of the round. */
export function batchRangeFor(state: CoordinatorState, id: ClientId, round?: Round | null): BatchRange | undefined {
  const r = roundOf(state, round)
  const memo = assignmentMemo.get(r)
  if (memo) return memo.get(id)
  const index = r.roster.indexOf(id)
  if (index < 0) return undefined
  const n = r.roster.length
  return rangeForPosition(r, roundTrainers(state.config, r), shuffledIndex(index, n, dataSeed(r)))
}

/** The round's witnesses (default: current round), in witness order: those the seed shuffles to the first positions. */
export function selectWitnesses(state: CoordinatorState, round?: Round | null): ClientId[] {
  const r = roundOf(state, round)
  const hit = witnessMemo.get(r)
  if (hit) return hit
  const n = r.roster.length
  const seed = subSeed(r.seed, 'witness')
  const out: ClientId[] = []
  for (let p = 0; p < witnessCount(state.config, n); p++) out.push(r.roster[unshuffledIndex(p, n, seed)])
  witnessMemo.set(r, out)
  return out
}

export function isWitness(state: CoordinatorState, id: ClientId, round?: Round | null): boolean {
  const r = roundOf(state, round)
  let known = isWitnessMemo.get(r)
  if (!known) isWitnessMemo.set(r, (known = new Map()))
  const hit = known.get(id)
  if (hit !== undefined) return hit
  const index = r.roster.indexOf(id)
  const out = index >= 0 && shuffledIndex(index, r.roster.length, subSeed(r.seed, 'witness')) < witnessCount(state.config, r.roster.length)
  known.set(id, out)
  return out
}

/** How many verifiers a round with `rosterSize` trainers has: verification_percent of them, at least one when it is not 0. */
export function verifierCount(config: CoordinatorConfig, rosterSize: number): number {
  if (!config.verification_percent || rosterSize === 0) return 0
  return Math.min(rosterSize, Math.max(1, Math.ceil((config.verification_percent * rosterSize) / 100)))
}

/** Whether `id` verifies in the round (default: current): the seed shuffles the verifiers to the first positions, like witnesses. */
export function isVerifier(state: CoordinatorState, id: ClientId, round?: Round | null): boolean {
  const r = roundOf(state, round)
  const index = r.roster.indexOf(id)
  if (index < 0) return false
  return shuffledIndex(index, r.roster.length, subSeed(r.seed, 'verify')) < verifierCount(state.config, r.roster.length)
}

/** The round's verifiers (default: current round), in verifier order. */
export function selectVerifiers(state: CoordinatorState, round?: Round | null): ClientId[] {
  const r = roundOf(state, round)
  const n = r.roster.length
  const seed = subSeed(r.seed, 'verify')
  const out: ClientId[] = []
  for (let p = 0; p < verifierCount(state.config, n); p++) out.push(r.roster[unshuffledIndex(p, n, seed)])
  return out
}

/**
 * Size of both witness blooms of `round`: a filter for its trainers (roundTrainers), since a witness adds only members
 * with batches (client decide.ts: trainersWithBatches), each once to each bloom. With max_trainers_per_round (G) below
 * the roster that is G entries, so a proof costs O(G) bytes, not O(roster). The one rule for every place that builds,
 * checks or decodes a bloom (the program mirrors it: coordinator.c bloom_size).
 */
export function witnessBloomParams(config: Pick<CoordinatorConfig, 'max_trainers_per_round'>, round: Pick<Round, 'roster' | 'trainers'>): BloomParams {
  return bloomParamsFor(roundTrainers(config, round), WITNESS_BLOOM_FALSE_RATE)
}

/** The participant-bloom key of a client: a witness adds it once it received that client's results. */
export function participantKey(id: ClientId): Buffer {
  return sha256(Buffer.from('psyche/participant\0', 'utf8'), Buffer.from(id, 'utf8'))
}

/** The broadcast-bloom key of one result: (client, batch range, commitment hash). */
function broadcastKey(id: ClientId, range: BatchRange, commitment: Uint8Array): Buffer {
  return sha256(Buffer.from('psyche/broadcast\0', 'utf8'), Buffer.from(id, 'utf8'), Buffer.from([0]), u64le(range.start), u64le(range.end), commitment)
}

/** Builds a witness proof's blooms for a round (of a run with `config`) from what the witness received. */
export function buildWitnessProof(
  config: Pick<CoordinatorConfig, 'max_trainers_per_round'>,
  round: Round,
  seen: {id: ClientId; range: BatchRange; commitment: Uint8Array}[],
): {participant_bloom: string; broadcast_bloom: string} {
  const params = witnessBloomParams(config, round)
  const participants = new BloomFilter(params)
  const broadcasts = new BloomFilter(params)
  for (const s of seen) {
    participants.add(participantKey(s.id))
    broadcasts.add(broadcastKey(s.id, s.range, s.commitment))
  }
  return {participant_bloom: participants.toBase64(), broadcast_bloom: broadcasts.toBase64()}
}

function blooms(config: CoordinatorConfig, round: Round, which: 'participant_bloom' | 'broadcast_bloom'): BloomFilter[] {
  const params = witnessBloomParams(config, round)
  return round.witnesses.map((w) => BloomFilter.fromBase64(params, w[which]))
}

/** How many of the round's witnesses saw results from `id` (Psyche's trainer_healthy_score_by_witnesses). */
function trainerHealthScore(config: CoordinatorConfig, round: Round, id: ClientId): number {
  const key = participantKey(id)
  return blooms(config, round, 'participant_bloom').filter((b) => b.contains(key)).length
}

/**
 * Whether `id` was ejected in the epoch the state records (the current one, or the last one until the next
 * Warmup): such a client may not join until the next epoch begins. The coordinator refuses its join (Banned);
 * the client itself waits instead of asking.
 */
export function wasEjected(state: CoordinatorState, id: ClientId): boolean {
  return state.epoch.clients.some((c) => c.id === id && c.state === 'Ejected') || state.epoch.exited.some((c) => c.id === id && c.state === 'Ejected')
}

/** A trainer is healthy in a round when a quorum of that round's witnesses saw its results. */
export function isTrainerHealthy(state: CoordinatorState, round: Round, id: ClientId): boolean {
  return trainerHealthScore(state.config, round, id) >= witnessQuorum(witnessCount(state.config, round.roster.length))
}

/** True when a quorum of the round's witnesses saw this exact result: clients apply only such results. */
export function isResultWitnessed(state: CoordinatorState, round: Round, id: ClientId, range: BatchRange, commitment: Uint8Array): boolean {
  const key = broadcastKey(id, range, commitment)
  const score = blooms(state.config, round, 'broadcast_bloom').filter((b) => b.contains(key)).length
  return score >= witnessQuorum(witnessCount(state.config, round.roster.length))
}

/**
 * Whether the coordinator takes a checkpoint report now. In the Cooldown of an epoch, once per epoch (of the hash the
 * epoch's last round's witnesses agree on). In any other phase, only one of the run's current model (the hash recorded
 * at the last epoch's end), once: an upload that finished after its Cooldown, which a run waiting for its model resumes
 * from. Undefined when it does; else the rejection it answers (the machine's onCheckpoint, and a checkpointer deciding
 * whether a finished upload is still worth reporting).
 */
export function checkpointRefusal(s: CoordinatorState): {code: 'InvalidRunState' | 'AlreadyCheckpointed'; reason: string} | undefined {
  if (s.run_state === 'Cooldown') return s.epoch.checkpointed ? {code: 'AlreadyCheckpointed', reason: 'this epoch is already checkpointed'} : undefined
  const model = s.current_model
  if (model?.param_hash == null)
    return {
      code: 'InvalidRunState',
      reason: `checkpoints are reported in Cooldown, not ${s.run_state} (outside it only a checkpoint of the run's current model, and no epoch has recorded its parameter hash)`,
    }
  if (s.checkpoint_hash?.param_hash === model.param_hash) return {code: 'AlreadyCheckpointed', reason: `the run's current model (step ${model.step}) is already checkpointed`}
  return undefined
}

/**
 * Whether `checkpoint` holds the run's current model: any checkpoint before an epoch recorded one (the run's starting
 * checkpoint is its model), then only the Hub checkpoint the coordinator recorded with the current model's parameter
 * hash. The coordinator names a checkpoint for a run whose members all left only when it is (tickWaitingForMembers).
 */
export function isCurrentCheckpoint(s: CoordinatorState, checkpoint: CheckpointConfig | null): boolean {
  const model = s.current_model
  if (model === null) return true
  const recorded = s.checkpoint_hash
  if (model.param_hash === null || !recorded || recorded.param_hash !== model.param_hash) return false
  if (typeof checkpoint !== 'object' || checkpoint === null || !('Hub' in checkpoint)) return false
  return checkpoint.Hub.repo_id === recorded.repo.repo_id && (checkpoint.Hub.revision ?? null) === (recorded.repo.revision ?? null)
}

/**
 * Why a model a client loaded is not the run's current model, or undefined when it is: `param_hash` is the hash of the
 * parameters it loaded, `step` the step its source claims (a manifest's, a psyche-checkpoint.json's; undefined: none).
 * Before any epoch recorded a model, the run's starting checkpoint is its model; then the hash must be the recorded one
 * (whatever step its source claims: a round nobody trained leaves the parameters as they were), or, when no witness
 * quorum agreed on a hash, the source must claim the recorded step.
 */
export function modelMismatch(s: CoordinatorState, param_hash: string, step: number | undefined): string | undefined {
  const model = s.current_model
  if (model === null) return undefined
  if (model.param_hash !== null) {
    return param_hash === model.param_hash ? undefined : `its parameters hash to ${param_hash}, the run's model (step ${model.step}) to ${model.param_hash}`
  }
  if (step === model.step) return undefined
  return `it is ${step === undefined ? 'a model of no recorded step' : `the model at step ${step}`}, the run's model is at step ${model.step} (no witness quorum recorded its parameter hash)`
}

/**
 * What the run waits for when it cannot start training for want of its model: the step (and hash) of the run's current
 * model, once the last Warmup ended with no member holding it, or while the next epoch would start with none of the
 * members that held it and no checkpoint of it. Undefined otherwise. `status`, the dashboard and `join` show it.
 */
export function modelWanted(s: CoordinatorState): {step: number; param_hash: string | null; detail: string} | undefined {
  const model = s.current_model
  if (model === null || (s.run_state !== 'WaitingForMembers' && s.run_state !== 'Warmup')) return undefined
  const hash = model.param_hash === null ? '' : `, parameter hash ${model.param_hash.slice(0, 12)}…`
  const wanted = (why: string) => ({
    step: model.step,
    param_hash: model.param_hash,
    detail: `no member holds step ${model.step} (the run's model${hash}): ${why}; the run waits for a member that holds it or a designated checkpointer's upload of it, and never falls back to an older model`,
  })
  // An aborted Warmup (tickWarmup): its epoch record has no round, and nobody reported the model loaded.
  const aborted = s.epoch.round === null && s.epoch.clients.length > 0 && s.epoch.warmup_witnesses.length === 0
  if (s.run_state === 'WaitingForMembers' && aborted && s.epoch.start_step === s.progress.step) return wanted('the last Warmup ended with none of its members loaded')
  if (s.run_state !== 'WaitingForMembers' || s.epoch.round === null || s.pending.length === 0) return undefined
  // The members at the last epoch's end; when its last round had no witness at all, every one of them was withdrawn
  // (it applied nothing: they still hold the model).
  const last = s.epoch.round
  const withdrawnAll = last.witnesses.length === 0 ? s.epoch.exited.filter((c) => c.state === 'Withdrawn' && c.exited_height === last.height) : []
  const holders = new Set([...s.epoch.clients, ...withdrawnAll].map((c) => c.id))
  if (s.pending.some((id) => holders.has(id))) return undefined
  const checkpoint = s.model.LLM.checkpoint
  const repo = typeof checkpoint === 'object' && 'P2P' in checkpoint ? {Hub: checkpoint.P2P} : checkpoint
  if (isCurrentCheckpoint(s, s.checkpoint_fallback) || isCurrentCheckpoint(s, repo)) return undefined
  return wanted('every member that held it has left, and no checkpoint of it was reported')
}

/**
 * The trainers of `round` with batches whom no witness quorum saw (the participant blooms of its record): those a
 * closing round drops (machine.ts tickRoundWitness), and a health check may accuse. Blooms decoded once per round.
 */
export function unseenTrainers(state: CoordinatorState, round: Round): ClientId[] {
  const params = witnessBloomParams(state.config, round)
  const filters = round.witnesses.map((w) => BloomFilter.fromBase64(params, w.participant_bloom))
  const quorum = witnessQuorum(witnessCount(state.config, round.roster.length))
  const out: ClientId[] = []
  for (const [id, range] of assignBatches(state, round)) {
    if (range.end === range.start) continue
    const key = participantKey(id)
    if (filters.filter((b) => b.contains(key)).length < quorum) out.push(id)
  }
  return out
}

/** A parameter hash as the worker computes it (SHA-256 over the parameters): 64 lowercase hex digits. */
export function isParamHash(x: unknown): x is string {
  return typeof x === 'string' && /^[0-9a-f]{64}$/.test(x)
}

/**
 * The parameter hash the epoch's witnesses agreed on: in Cooldown, the hash that a quorum of the last round's
 * witnesses attested (the same quorum that confirms a round's results), or undefined while none has.
 */
export function agreedParamHash(s: CoordinatorState): string | undefined {
  const round = s.epoch.round
  if (s.run_state !== 'Cooldown' || !round) return undefined
  const quorum = witnessQuorum(witnessCount(s.config, round.roster.length))
  if (quorum === 0) return undefined
  const counts = new Map<string, number>()
  for (const w of s.epoch.hash_witnesses) {
    const n = (counts.get(w.param_hash) ?? 0) + 1
    if (n >= quorum) return w.param_hash
    counts.set(w.param_hash, n)
  }
  return undefined
}

/** Results a verifier scores per round when the config leaves verification_sample out (a default of the run config). */
export {DEFAULT_VERIFICATION_SAMPLE}

/** The most results one verifier scores per round: config.verification_sample, or DEFAULT_VERIFICATION_SAMPLE. */
function verificationSample(config: CoordinatorConfig): number {
  return config.verification_sample ?? DEFAULT_VERIFICATION_SAMPLE
}

/**
 * Who scores whom. The results of round `scored` are scored by the verifiers of the round after it (`verifying`, step
 * scored.step + 1, which runs while they score), each at most K = verification_sample of them. Every replica
 * recomputes it from the two rounds; no verifier chooses whom it scores, and without `verifying`'s seed (drawn after
 * the scored results were committed) nobody can predict it.
 *
 * The rule, over the n clients of `verifying`'s roster in the order its seed shuffles them for verification (the V
 * verifiers first, selectVerifiers): the verifier at position j owns slot ⌊j·n/V⌋ — the slots spread evenly round
 * that cycle — and scores the clients in the K = min(verification_sample, n − 1) positions after its slot, stepping
 * over itself (its window is then one longer), that trained in `scored` with a non-empty batch range. So a client
 * is scored by the verifiers owning the K slots before it, ⌊V·K/n⌋ or ⌈V·K/n⌉ of them (one more where a window
 * stepped over its own verifier, which needs K close to n), exactly K when every client verifies; when V·K < n
 * the rounds' seeds rotate who is left out. A check is O(1) hashes (isScoreAssigned: the ledger, and a program
 * that must stay cheap); a verifier's list, O(K) (assignedTrainers: the client).
 */
function scoreWindow(state: CoordinatorState, verifying: Round, verifier: ClientId): {slot: number; size: number; seed: Buffer} | undefined {
  const n = verifying.roster.length
  const index = verifying.roster.indexOf(verifier)
  if (index < 0) return undefined
  const seed = subSeed(verifying.seed, 'verify')
  const v = verifierCount(state.config, n)
  const j = shuffledIndex(index, n, seed)
  if (j >= v) return undefined
  return {...windowAt(j, n, v, verificationSample(state.config)), seed}
}

/** The window of the verifier at shuffled position `j` of `n`, with `v` verifiers and a sample of `sample` (scoreWindow). */
function windowAt(j: number, n: number, v: number, sample: number): {slot: number; size: number} {
  const slot = Math.floor((j * n) / v)
  const k = Math.min(sample, n - 1)
  const self = (j - slot + n) % n
  return {slot, size: self >= 1 && self <= k ? k + 1 : k}
}

/** Whether shuffled position `position` of `n` lies in the window `w` (the slot itself counts as distance n). */
function inWindow(w: {slot: number; size: number}, position: number, n: number): boolean {
  return ((position - w.slot + n) % n || n) <= w.size
}

function trainedIn(state: CoordinatorState, scored: Round, id: ClientId): boolean {
  const range = batchRangeFor(state, id, scored)
  return range !== undefined && range.end > range.start
}

/** Whether `verifier`, as a verifier of `verifying`, is assigned `trainer`'s result of `scored` (see scoreWindow). */
export function isScoreAssigned(state: CoordinatorState, verifying: Round, scored: Round, verifier: ClientId, trainer: ClientId): boolean {
  if (verifying.step !== scored.step + 1 || trainer === verifier) return false
  const w = scoreWindow(state, verifying, verifier)
  const index = verifying.roster.indexOf(trainer)
  if (!w || index < 0 || !trainedIn(state, scored, trainer)) return false
  return inWindow(w, shuffledIndex(index, verifying.roster.length, w.seed), verifying.roster.length)
}

/**
 * How many verifiers of `verifying` are assigned `trainer`'s result of `scored` (those isScoreAssigned accepts):
 * the judges of a low-score accusation against it (onAccuse). O(1) hashes: the windows are positions.
 */
export function scoreAssignedCount(state: CoordinatorState, verifying: Round, scored: Round, trainer: ClientId): number {
  const index = verifying.roster.indexOf(trainer)
  if (verifying.step !== scored.step + 1 || index < 0 || !trainedIn(state, scored, trainer)) return 0
  const n = verifying.roster.length
  const v = verifierCount(state.config, n)
  const t = shuffledIndex(index, n, subSeed(verifying.seed, 'verify'))
  let count = 0
  for (let j = 0; j < v; j++) if (j !== t && inWindow(windowAt(j, n, v, verificationSample(state.config)), t, n)) count++
  return count
}

/** The trainers of `scored` whose results `verifier` scores as a verifier of `verifying`, in window order (see scoreWindow). */
export function assignedTrainers(state: CoordinatorState, verifying: Round, scored: Round, verifier: ClientId): ClientId[] {
  const w = verifying.step === scored.step + 1 ? scoreWindow(state, verifying, verifier) : undefined
  if (!w) return []
  const n = verifying.roster.length
  const out: ClientId[] = []
  for (let d = 1; d <= w.size; d++) {
    const id = verifying.roster[unshuffledIndex((w.slot + d) % n, n, w.seed)]
    if (id !== verifier && trainedIn(state, scored, id)) out.push(id)
  }
  return out
}
