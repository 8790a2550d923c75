import {formatIssue} from '../config/read.js'
import {validateRunConfig} from '../config/run-config.js'
import type {CheckpointConfig, CoordinatorConfig, HubRepo, LLMConfig, RunConfigFile} from '../config/types.js'
import {BloomFilter, type BloomParams} from '../primitives/bloom.js'
import {checkEquivocation} from './equivocation.js'
import {fromHex, sha256, u64le} from '../primitives/seed.js'
import {
  agreedParamHash,
  assignBatches,
  batchRangeFor,
  checkpointRefusal,
  isCurrentCheckpoint,
  isParamHash,
  roundBatchSize,
  isTrainerHealthy,
  isVerifier,
  isWitness,
  nextDataIndex,
  nextDataSeed,
  isScoreAssigned,
  scoreAssignedCount,
  wasEjected,
  witnessBloomParams,
  witnessCount,
  witnessQuorum,
  participantKey,
  unseenTrainers,
  trainerCount,
  roundTrainers,
} from './rules.js'
import {ACTIVE_PHASES, EPOCH_PHASES, HALTED_PHASES, isCheckpointP2P, isRoundPhase} from './phases.js'
import type {ApplyResult, Client, ClientId, CoordinatorEvent, CoordinatorState, EpochState, ModelRecord, Rejection, RejectionCode, Round, RunState} from './types.js'
import {MAX_ACCUSATIONS, MAX_CLIENTS} from '../layout/layout-table.js'

/**
 * The coordinator state machine: (state, event, now) -> state. Pure — no I/O, no clock, no
 * randomness but the seed the state carries — so the TCP server and the Solana program run the same
 * rules and every client can replay them. States are never mutated: each event returns a new state
 * that shares what did not change.
 *
 * Rejected events do not throw: applyEvent returns the unchanged state and a Rejection {code, message}.
 *
 * Time. `now` and every time in the state are unix milliseconds; the config's durations are seconds, as
 * in Psyche's files (integers there; fractions are our extension, at millisecond resolution). A duration
 * of d seconds has passed when now >= start + msOf(d): an integer config means exactly what it means in
 * Psyche, measured on a finer clock, so a round no longer ends on the next whole-second boundary.
 */

/** A config duration (seconds, possibly fractional) in whole milliseconds. */
function msOf(seconds: number): number {
  return Math.round(seconds * 1000)
}

class Reject extends Error {
  constructor(
    readonly code: RejectionCode,
    message: string,
  ) {
    super(message)
  }
}

function emptyEpoch(now: number, startStep: number): EpochState {
  return {
    start_time: now,
    start_step: startStep,
    first_round: true,
    checkpointed: false,
    cold_start: false,
    clients: [],
    exited: [],
    warmup_witnesses: [],
    hash_witnesses: [],
    round: null,
    previous_round: null,
  }
}

interface CreateOptions {
  /** 64 hex digits. Default: SHA-256 of the run id, so a run's seeds are reproducible from its config. */
  seed?: string
  /** When the run starts (unix milliseconds). */
  now?: number
}

/** A fresh coordinator for a run configuration file (a state.toml; a config.toml starts Uninitialized). */
export function createCoordinator(file: Pick<RunConfigFile, 'run_id' | 'run_state' | 'config' | 'model'>, options: CreateOptions = {}): CoordinatorState {
  if (!file.config) throw new RangeError('a run configuration without [config] cannot start a coordinator')
  const runId = file.run_id ?? ''
  const seed = options.seed ?? sha256(Buffer.from(`psyche/run\0${runId}`, 'utf8')).toString('hex')
  fromHex(seed)
  const now = options.now ?? 0
  return {
    version: 2,
    run_id: runId,
    run_state: file.run_state ?? 'Uninitialized',
    run_state_start: now,
    config: file.config,
    model: file.model,
    checkpoint_fallback: null,
    checkpoint_hash: null,
    current_model: null,
    seed,
    progress: {epoch: 0, step: 1, epoch_start_data_index: 0},
    epoch: emptyEpoch(now, 1),
    pending: [],
    pending_pause: false,
  }
}

// ---- helpers over a state (all return new objects) ----

function changeState(s: CoordinatorState, now: number, next: RunState): CoordinatorState {
  return {...s, run_state: next, run_state_start: now}
}

/**
 * Psyche's check_timeout: `duration` seconds have passed since the phase began, and not at the same instant
 * (so a zero duration still waits for a later tick: at most one transition per tick and time).
 */
function timedOut(s: CoordinatorState, now: number, duration: number): boolean {
  return now !== s.run_state_start && now >= s.run_state_start + msOf(duration)
}

function clientIndex(s: CoordinatorState, id: ClientId): number {
  return s.epoch.clients.findIndex((c) => c.id === id)
}

function setClientState(s: CoordinatorState, index: number, state: Client['state']): CoordinatorState {
  const clients = s.epoch.clients.slice()
  clients[index] = {id: clients[index].id, state}
  return {...s, epoch: {...s.epoch, clients}}
}

/** Clients that are no longer Healthy leave the epoch's list (Psyche's move_clients_to_exited). */
function moveExited(s: CoordinatorState, height: number): CoordinatorState {
  if (s.epoch.clients.every((c) => c.state === 'Healthy')) return s
  const clients: Client[] = []
  const exited = s.epoch.exited.slice()
  for (const c of s.epoch.clients) {
    if (c.state === 'Healthy') clients.push(c)
    else exited.push({id: c.id, state: c.state, exited_height: height})
  }
  return {...s, epoch: {...s.epoch, clients, exited}}
}

function currentHeight(s: CoordinatorState): number {
  return s.epoch.round?.height ?? 0
}

/** Healthy clients of the epoch stay on for the next one: they go first in the pending list. */
function keepHealthyAsPending(s: CoordinatorState): CoordinatorState {
  const carried = s.epoch.clients.filter((c) => c.state === 'Healthy').map((c) => c.id)
  const kept = new Set(carried)
  return {...s, pending: [...carried, ...s.pending.filter((id) => !kept.has(id))]}
}

/**
 * How many clients the next epoch would hold: the healthy clients (keepHealthyAsPending carries them) and the joiners
 * that are not among them. A join that would raise it past MAX_CLIENTS is refused (CapacityExceeded), in both
 * coordinators (the program's arrays hold MAX_CLIENTS).
 */
function nextEpochSize(s: CoordinatorState): number {
  const healthy = new Set(s.epoch.clients.filter((c) => c.state === 'Healthy').map((c) => c.id))
  return healthy.size + s.pending.filter((id) => !healthy.has(id)).length
}

/** Back to WaitingForMembers (or Finished when the run is done), keeping the healthy clients. */
function startWaitingForMembers(s: CoordinatorState, now: number): CoordinatorState {
  const next = s.progress.step > s.config.total_steps ? 'Finished' : 'WaitingForMembers'
  return changeState(keepHealthyAsPending(s), now, next)
}

/** After an epoch the newest model lives in the clients: new joiners fetch it peer to peer. */
function checkpointToP2P(s: CoordinatorState): CoordinatorState {
  const checkpoint = s.model.LLM.checkpoint
  if (isCheckpointP2P(checkpoint) || typeof checkpoint !== 'object') return s
  let repo: HubRepo
  if ('Hub' in checkpoint) repo = checkpoint.Hub
  else if ('Dummy' in checkpoint) repo = checkpoint.Dummy
  else if ('Local' in checkpoint) repo = {repo_id: ''}
  else return s // Gcs variants: not served by us, left as they are
  return {...s, checkpoint_fallback: checkpoint, model: {LLM: {...s.model.LLM, checkpoint: {P2P: repo}}}}
}

function startRoundTrain(s: CoordinatorState, now: number, entropy: string | undefined): CoordinatorState {
  s = moveExited(s, currentHeight(s))
  const previous = s.epoch.first_round ? null : s.epoch.round
  const dataIndex = previous ? nextDataIndex(s) : s.progress.epoch_start_data_index
  const seed = sha256(fromHex(s.seed), u64le(s.progress.step), Buffer.from(entropy ?? '', 'utf8')).toString('hex')
  const round: Round = {
    step: s.progress.step,
    height: previous ? previous.height + 1 : 0,
    data_index: dataIndex,
    batch_size: roundBatchSize(s, dataIndex),
    seed,
    // The data shuffle is known one round ahead: drawn from the previous round's seed (the epoch's first: its own).
    data_seed: previous ? nextDataSeed(previous.seed) : seed,
    started_at: now,
    roster: s.epoch.clients.map((c) => c.id),
    witnesses: [],
    accusations: [],
    excluded: [],
    complete_witnesses: 0,
    trainers: trainerCount(s.config, s.epoch.clients.length),
  }
  return changeState({...s, seed, epoch: {...s.epoch, first_round: false, round, previous_round: previous}}, now, 'RoundTrain')
}

function startCooldown(s: CoordinatorState, now: number): CoordinatorState {
  return changeState(s, now, 'Cooldown')
}

// ---- ticks, one per phase ----

function tickWaitingForMembers(s: CoordinatorState, now: number): CoordinatorState {
  if (s.pending.length < s.config.init_min_clients || !timedOut(s, now, s.config.waiting_for_members_extra_time)) return s
  const pending = new Set(s.pending)
  // A member of the last epoch that ran (one whose Warmup ended with nothing loaded holds nobody we know has the model).
  const previousPresent = s.epoch.round !== null && s.epoch.clients.some((c) => pending.has(c.id))
  // Nobody who holds the trained model is back: new clients load the last uploaded checkpoint, if it is the run's
  // current model (Psyche switches to it whatever it holds). Else the epoch stays P2P: its members take the model from
  // whoever holds it, or from a checkpoint of it reported since; if none can, its Warmup ends with nothing loaded and
  // the run waits (tickWarmup). It never falls back to an older model, such as the config's starting one.
  if (!previousPresent && isCheckpointP2P(s.model.LLM.checkpoint) && s.checkpoint_fallback && isCurrentCheckpoint(s, s.checkpoint_fallback)) {
    s = {...s, model: {LLM: {...s.model.LLM, checkpoint: s.checkpoint_fallback}}}
  }
  const epoch = emptyEpoch(now, s.progress.step)
  epoch.cold_start = s.epoch.cold_start
  epoch.clients = s.pending.map((id) => ({id, state: 'Healthy'}))
  return changeState({...s, pending: [], epoch}, now, 'Warmup')
}

function tickWarmup(s: CoordinatorState, now: number, entropy: string | undefined): CoordinatorState {
  s = moveExited(s, 0)
  if (s.epoch.clients.length < s.config.min_clients) return startWaitingForMembers(s, now)
  if (!timedOut(s, now, s.config.warmup_time)) return s
  // Nobody reported the model loaded (our rule; Psyche starts the round anyway): nobody could train, and rounds nobody
  // trains would count steps past the run's model. The run waits for members again, its step unchanged.
  if (s.epoch.warmup_witnesses.length === 0) return startWaitingForMembers(s, now)
  return startRoundTrain(s, now, entropy)
}

function tickRoundTrain(s: CoordinatorState, now: number): CoordinatorState {
  return timedOut(s, now, s.config.max_round_train_time) ? changeState(s, now, 'RoundWitness') : s
}

function epochOver(s: CoordinatorState, now: number, round: Round): boolean {
  const byTime = now >= s.epoch.start_time + msOf(s.config.epoch_time)
  const byRounds = s.config.rounds_per_epoch !== undefined && round.height + 1 >= s.config.rounds_per_epoch
  return byTime || byRounds
}

/**
 * Every witness of the round has sent a proof attesting every trainer's result: nothing more can arrive for
 * this round, so waiting out round_witness_time would be dead time (our extension; Psyche always waits).
 * When every member trains, the proofs are counted as they arrive (complete_witnesses). With max_trainers_per_round
 * below the roster, once every witness has sent its proof: each chosen trainer is in every proof's participant
 * bloom (the program finds the chosen ones then, with the shuffle its round close runs anyway). Either way only when
 * every trainer has batches.
 */
function allAttested(s: CoordinatorState, round: Round): boolean {
  const n = round.roster.length
  const witnesses = witnessCount(s.config, n)
  const trainers = roundTrainers(s.config, round)
  if (trainers === n) return round.complete_witnesses >= witnesses
  if (round.witnesses.length < witnesses || trainers > round.batch_size) return false
  const params = witnessBloomParams(s.config, round)
  const proofs = round.witnesses.map((w) => BloomFilter.fromBase64(params, w.participant_bloom))
  const positions = trainerPositions(params, round)
  const ranges = assignBatches(s, round)
  return round.roster.every((id, i) => {
    const range = ranges.get(id)!
    return range.end === range.start || proofs.every((p) => p.containsPositions(positions[i]))
  })
}

function tickRoundWitness(s: CoordinatorState, now: number, entropy: string | undefined): CoordinatorState {
  const round = s.epoch.round!
  // round_witness_time stays the upper bound, for witnesses still downloading; it ends early once all attested.
  if (!timedOut(s, now, s.config.round_witness_time) && !allAttested(s, round)) return s
  s = {...s, progress: {...s.progress, step: s.progress.step + 1}}
  s = dropUnseen(s, round)
  s = moveExited(s, round.height)
  const witnessed = round.witnesses.length
  if (witnessed === 0) {
    // No witness at all: we cannot tell who is still there, so everyone leaves and rejoins (Psyche does the same).
    const clients = s.epoch.clients.map((c) => ({id: c.id, state: 'Withdrawn' as const}))
    return startCooldown({...s, epoch: {...s.epoch, clients}}, now)
  }
  if (
    epochOver(s, now, round) ||
    s.epoch.clients.length < s.config.min_clients ||
    witnessed < witnessQuorum(witnessCount(s.config, round.roster.length)) ||
    s.progress.step > s.config.total_steps ||
    s.pending_pause
  ) {
    return startCooldown(s, now)
  }
  return startRoundTrain(s, now, entropy)
}

/**
 * A closing round judges its trainers (our rule): those with batches whom its witness quorum did not see are Dropped, as
 * a witness's health check in the next round would drop them (onHealthCheck). So a member that never trains leaves
 * at the first round it misses, even when no next round comes to judge it (an epoch whose time fits one round). A round
 * without a witness quorum judges nobody: it cannot tell who is there.
 */
function dropUnseen(s: CoordinatorState, round: Round): CoordinatorState {
  if (round.witnesses.length < witnessQuorum(witnessCount(s.config, round.roster.length))) return s
  let clients: Client[] | undefined
  for (const id of unseenTrainers(s, round)) {
    const i = clientIndex(s, id)
    if (i >= 0 && s.epoch.clients[i].state === 'Healthy') {
      clients ??= s.epoch.clients.slice()
      clients[i] = {id, state: 'Dropped'}
    }
  }
  return clients ? {...s, epoch: {...s.epoch, clients}} : s
}

/**
 * The run's model at the end of an epoch (in its Cooldown): the last round's step, with the hash its witnesses agreed on
 * (null when no quorum did). An epoch whose only round no witness attested applied nothing: its model is the one it
 * began with (the record's hash stays; null stays null, the run's starting model).
 */
function modelAtEpochEnd(s: CoordinatorState): ModelRecord | null {
  const round = s.epoch.round
  if (!round) return s.current_model
  const agreed = agreedParamHash(s)
  if (agreed !== undefined) return {step: round.step, param_hash: agreed}
  if (round.height === 0 && round.witnesses.length === 0) return s.current_model && {step: round.step, param_hash: s.current_model.param_hash}
  return {step: round.step, param_hash: null}
}

function tickCooldown(s: CoordinatorState, now: number): CoordinatorState {
  // The book: Cooldown waits for its time to pass or for a checkpoint to have been uploaded.
  if (!timedOut(s, now, s.config.cooldown_time) && !s.epoch.checkpointed) return s
  s = {...s, current_model: modelAtEpochEnd(s)}
  s = moveExited(s, currentHeight(s))
  s = checkpointToP2P(s)
  s = {...s, progress: {...s.progress, epoch: s.progress.epoch + 1, epoch_start_data_index: nextDataIndex(s)}}
  if (s.pending_pause) {
    // The next epoch after a pause is a cold start (the LR warms up again: cold_start_warmup_steps).
    return changeState(keepHealthyAsPending({...s, pending_pause: false, epoch: {...s.epoch, cold_start: true}}), now, 'Paused')
  }
  return startWaitingForMembers({...s, epoch: {...s.epoch, cold_start: false}}, now)
}

// ---- events ----

function onTick(s: CoordinatorState, now: number, entropy: string | undefined): CoordinatorState {
  switch (s.run_state) {
    case 'WaitingForMembers':
      return tickWaitingForMembers(s, now)
    case 'Warmup':
      return tickWarmup(s, now, entropy)
    case 'RoundTrain':
      return tickRoundTrain(s, now)
    case 'RoundWitness':
      return tickRoundWitness(s, now, entropy)
    case 'Cooldown':
      return tickCooldown(s, now)
    default:
      throw new Reject('Halted', `the run is ${s.run_state}: nothing to tick`)
  }
}

function onJoin(s: CoordinatorState, id: ClientId): CoordinatorState {
  if (s.run_state === 'Finished') throw new Reject('Halted', 'the run is Finished')
  if (s.pending.includes(id)) throw new Reject('AlreadyJoined', `client ${id} is already waiting to join`)
  const i = clientIndex(s, id)
  const inEpoch = i >= 0 && s.epoch.clients[i].state === 'Healthy' && EPOCH_PHASES.has(s.run_state)
  if (inEpoch) throw new Reject('AlreadyJoined', `client ${id} is already training in this epoch`)
  // An ejected client sits out the rest of its epoch and the whole next one: the epoch's record of who left
  // (clients and exited, kept until the next epoch's Warmup) is the ban list, so it needs no state of its own.
  if (wasEjected(s, id)) {
    throw new Reject('Banned', `client ${id} was ejected from the current or last epoch; it may join again once the next epoch has begun`)
  }
  const carried = i >= 0 && s.epoch.clients[i].state === 'Healthy'
  if (!carried && nextEpochSize(s) >= MAX_CLIENTS) {
    throw new Reject('CapacityExceeded', `the run is full: MAX_CLIENTS = ${MAX_CLIENTS} clients and joiners for the next epoch`)
  }
  return {...s, pending: [...s.pending, id]}
}

function onWithdraw(s: CoordinatorState, id: ClientId): CoordinatorState {
  const p = s.pending.indexOf(id)
  if (p >= 0) {
    const pending = s.pending.slice()
    pending.splice(p, 1)
    s = {...s, pending}
  }
  const i = clientIndex(s, id)
  const inEpoch = i >= 0 && s.epoch.clients[i].state === 'Healthy' && EPOCH_PHASES.has(s.run_state)
  if (inEpoch) return setClientState(s, i, 'Withdrawn')
  if (p >= 0) return s
  throw new Reject('InvalidWithdraw', `client ${id} is neither training nor waiting to join`)
}

function onEject(s: CoordinatorState, id: ClientId): CoordinatorState {
  const p = s.pending.indexOf(id)
  if (p >= 0) s = {...s, pending: s.pending.filter((x) => x !== id)}
  const i = clientIndex(s, id)
  if (i >= 0 && s.epoch.clients[i].state === 'Healthy') return setClientState(s, i, 'Ejected')
  if (p >= 0) return s
  throw new Reject('UnknownClient', `client ${id} is neither training nor waiting to join`)
}

function decodeBloom(text: unknown, params: BloomParams, field: string): BloomFilter {
  if (typeof text !== 'string') throw new Reject('InvalidWitness', `${field} must be base64 text`)
  try {
    return BloomFilter.fromBase64(params, text)
  } catch (error) {
    throw new Reject('InvalidWitness', `${field}: ${(error as Error).message}`)
  }
}

/**
 * Whether a participant bloom names every trainer of the round. Only rounds where every member trains count: at least
 * as many batches as members, and no max_trainers_per_round below the roster (the usual case). A round with more
 * members than batches never closes early, because telling them apart costs a shuffle per member, more than the Solana
 * program's compute budget allows (programs/coordinator mirrors this rule); one with max_trainers_per_round below its
 * roster is judged once all its proofs are in (allAttested). A bloom can only err towards "present" (1 % false
 * positives by design), so at worst the window closes early for a result the witness lacks — which is then
 * judged exactly as when the window times out: by the quorum rules on the final witness record. (A witness
 * that finds a result invalid leaves it out of its proof, so accusations are never cut short.)
 */
function attestsEveryTrainer(config: CoordinatorConfig, round: Round, participants: BloomFilter): boolean {
  const n = round.roster.length
  if (n > round.batch_size || roundTrainers(config, round) < n) return false
  return trainerPositions(participants.params, round).every((positions) => participants.containsPositions(positions))
}

const trainerPositionsMemo = new WeakMap<readonly ClientId[], {params: BloomParams; positions: number[][]}>()

/**
 * The participant-bloom bit positions (in a bloom of `params`, the round's witnessBloomParams) of each roster member:
 * hashed once per round (memoized by its roster, which every copy of the round shares), so checking a proof costs bit
 * lookups only.
 */
function trainerPositions(params: BloomParams, round: Round): number[][] {
  const hit = trainerPositionsMemo.get(round.roster)
  if (hit && hit.params.bits === params.bits && hit.params.hashes === params.hashes) return hit.positions
  const positions = round.roster.map((id) => BloomFilter.positionsFor(params, participantKey(id)))
  trainerPositionsMemo.set(round.roster, {params, positions})
  return positions
}

function onWitness(s: CoordinatorState, now: number, event: Extract<CoordinatorEvent, {type: 'witness'}>, entropy?: string): CoordinatorState {
  const {from} = event
  // A parameter hash is attested in Cooldown only (no proof of results then).
  if (event.param_hash !== undefined) {
    if (s.run_state !== 'Cooldown') throw new Reject('InvalidRunState', `parameter hashes are attested in Cooldown, not ${s.run_state}`)
    return onHashWitness(s, event)
  }
  if (s.run_state === 'Warmup') {
    // Any client may say "model loaded"; when as many as the witnesses of a round have, training starts.
    const i = clientIndex(s, from)
    if (i < 0 || s.epoch.clients[i].state !== 'Healthy') throw new Reject('InvalidWitness', `client ${from} is not in this epoch`)
    if (s.epoch.warmup_witnesses.includes(from)) throw new Reject('DuplicateWitness', `client ${from} already reported in Warmup`)
    const warmup_witnesses = [...s.epoch.warmup_witnesses, from]
    s = {...s, epoch: {...s.epoch, warmup_witnesses}}
    return warmup_witnesses.length >= witnessCount(s.config, s.epoch.clients.length) ? startRoundTrain(s, now, entropy) : s
  }
  if (!isRoundPhase(s.run_state)) throw new Reject('InvalidRunState', `witness proofs are accepted in Warmup, RoundTrain and RoundWitness, not ${s.run_state}`)
  const round = s.epoch.round!
  if (event.step !== round.step) throw new Reject('WrongStep', `witness proof for step ${event.step}, but the round is step ${round.step}`)
  if (!isWitness(s, from, round)) throw new Reject('InvalidWitness', `client ${from} is not a witness of step ${round.step}`)
  if (round.witnesses.some((w) => w.from === from)) throw new Reject('DuplicateWitness', `client ${from} already sent a proof for step ${round.step}`)
  const n = round.roster.length
  const params = witnessBloomParams(s.config, round)
  const participants = decodeBloom(event.proof?.participant_bloom, params, 'participant_bloom')
  decodeBloom(event.proof?.broadcast_bloom, params, 'broadcast_bloom')
  const witnesses = [...round.witnesses, {from, participant_bloom: event.proof.participant_bloom, broadcast_bloom: event.proof.broadcast_bloom}]
  const complete_witnesses = round.complete_witnesses + (attestsEveryTrainer(s.config, round, participants) ? 1 : 0)
  s = {...s, epoch: {...s.epoch, round: {...round, witnesses, complete_witnesses}}}
  // Opportunistic witnessing: a quorum of proofs ends training early.
  if (s.run_state === 'RoundTrain' && witnesses.length >= witnessQuorum(witnessCount(s.config, n))) return changeState(s, now, 'RoundWitness')
  return s
}

/**
 * Cooldown's witness: a witness of the epoch's last round, still in the epoch, attests the hash of its parameters
 * after applying that round (blooms ignored). A quorum of equal hashes is the epoch's agreed hash (agreedParamHash),
 * which a checkpoint must match.
 */
function onHashWitness(s: CoordinatorState, event: Extract<CoordinatorEvent, {type: 'witness'}>): CoordinatorState {
  const {from} = event
  const round = s.epoch.round
  if (!round) throw new Reject('NoActiveRound', 'this epoch had no round to attest')
  if (event.step !== round.step) throw new Reject('WrongStep', `parameter hash for step ${event.step}, but the epoch's last round is step ${round.step}`)
  const i = clientIndex(s, from)
  if (i < 0 || s.epoch.clients[i].state !== 'Healthy' || !isWitness(s, from, round))
    throw new Reject('InvalidWitness', `client ${from} is not a witness of step ${round.step} still in the epoch`)
  if (!isParamHash(event.param_hash)) throw new Reject('InvalidWitness', 'a Cooldown witness must attest param_hash: 64 lowercase hex digits')
  if (s.epoch.hash_witnesses.some((w) => w.from === from)) throw new Reject('DuplicateWitness', `client ${from} already attested the parameters of step ${round.step}`)
  return {...s, epoch: {...s.epoch, hash_witnesses: [...s.epoch.hash_witnesses, {from, param_hash: event.param_hash}]}}
}

function onHealthCheck(s: CoordinatorState, event: Extract<CoordinatorEvent, {type: 'health_check'}>): CoordinatorState {
  if (!isRoundPhase(s.run_state)) throw new Reject('InvalidRunState', `health checks are accepted during rounds, not in ${s.run_state}`)
  const judged = s.epoch.previous_round
  // Results arrive one round late, so a round can only be judged once the next one is under way.
  if (!judged) throw new Reject('NoActiveRound', 'no finished round in this epoch to judge yet')
  const reporter = clientIndex(s, event.from)
  if (reporter < 0 || s.epoch.clients[reporter].state !== 'Healthy') throw new Reject('InvalidHealthCheck', `reporter ${event.from} is not a healthy client of this epoch`)
  if (!Array.isArray(event.accused) || event.accused.length === 0) throw new Reject('InvalidHealthCheck', 'a health check must accuse at least one client')
  for (const id of event.accused) {
    const range = batchRangeFor(s, id, judged)
    if (!range) throw new Reject('InvalidHealthCheck', `client ${id} did not train in step ${judged.step}`)
    if (range.start === range.end) throw new Reject('InvalidHealthCheck', `client ${id} had no batches in step ${judged.step}, so it had nothing to send`)
    if (isTrainerHealthy(s, judged, id)) throw new Reject('InvalidHealthCheck', `client ${id} is healthy: a witness quorum saw its results for step ${judged.step}`)
  }
  let clients: Client[] | undefined
  for (const id of new Set(event.accused)) {
    const i = clientIndex(s, id)
    if (i >= 0 && s.epoch.clients[i].state === 'Healthy') {
      clients ??= s.epoch.clients.slice()
      clients[i] = {id, state: 'Dropped'}
    }
  }
  return clients ? {...s, epoch: {...s.epoch, clients}} : s
}

/** Ejects `id` if it is a Healthy client of the epoch (it leaves at the round's end), and excludes its result from `round`. */
function ejectAndExclude(s: CoordinatorState, id: ClientId, round: Round | null): CoordinatorState {
  if (round && !round.excluded.includes(id)) s = {...s, epoch: {...s.epoch, round: {...round, excluded: [...round.excluded, id]}}}
  const i = clientIndex(s, id)
  return i >= 0 && s.epoch.clients[i].state === 'Healthy' ? setClientState(s, i, 'Ejected') : s
}

function onAccuse(s: CoordinatorState, event: Extract<CoordinatorEvent, {type: 'accuse'}>): CoordinatorState {
  if (!isRoundPhase(s.run_state)) throw new Reject('InvalidRunState', `accusations are accepted during rounds, not in ${s.run_state}`)
  const round = s.epoch.round!
  const {from, accused} = event
  // Only the current round: once the next one starts, this round's record is final and replicas apply it.
  if (event.step !== round.step) throw new Reject('WrongStep', `accusation for step ${event.step}, but the round is step ${round.step}`)
  if (event.reason !== 'invalid_result' && event.reason !== 'low_score') throw new Reject('InvalidAccusation', `unknown accusation reason ${JSON.stringify(event.reason)}`)
  checkId(accused, 'accused')
  const byScore = event.reason === 'low_score'
  if (!byScore && !isWitness(s, from, round)) throw new Reject('InvalidAccusation', `client ${from} is not a witness of step ${round.step}`)
  if (byScore && !isVerifier(s, from, round)) throw new Reject('InvalidAccusation', `client ${from} is not a verifier of step ${round.step}`)
  if (from === accused) throw new Reject('InvalidAccusation', 'a client cannot accuse itself')
  const range = batchRangeFor(s, accused, round)
  if (!range || range.start === range.end) throw new Reject('InvalidAccusation', `client ${accused} has no batches in step ${round.step}, so no result to accuse`)
  // A low score is judged by the verifiers the seed assigned to score the accused's result of the previous round
  // (isScoreAssigned, the rule the ledger takes scores by): only they accuse, and the quorum counts among them.
  const scored = s.epoch.previous_round
  if (byScore && !(scored && isScoreAssigned(s, round, scored, from, accused)))
    throw new Reject('InvalidAccusation', `client ${from} was not assigned to score ${accused}'s result of step ${round.step - 1}`)
  const same = (a: {accused: ClientId; reason: string}) => a.accused === accused && a.reason === event.reason
  if (round.accusations.some((a) => a.from === from && same(a)))
    throw new Reject('DuplicateAccusation', `client ${from} already accused ${accused} (${event.reason}) in step ${round.step}`)
  if (round.accusations.length >= MAX_ACCUSATIONS) throw new Reject('CapacityExceeded', `the round already holds MAX_ACCUSATIONS = ${MAX_ACCUSATIONS} accusations`)
  const accusations = [...round.accusations, {from, accused, reason: event.reason}]
  s = {...s, epoch: {...s.epoch, round: {...round, accusations}}}
  const backing = accusations.filter(same).length
  // witnessQuorum over the assigned verifiers: 1 of 1, 2 of 2 or 3, ⌊2m/3⌋ of m ≥ 4, so one verifier alone ejects
  // only when it is the only one assigned (as one witness of one does), never when two or more are.
  const judges = byScore ? scoreAssignedCount(s, round, scored!, accused) : witnessCount(s.config, round.roster.length)
  return backing >= witnessQuorum(judges) ? ejectAndExclude(s, accused, s.epoch.round) : s
}

function onEquivocation(s: CoordinatorState, event: Extract<CoordinatorEvent, {type: 'equivocation'}>): CoordinatorState {
  if (!EPOCH_PHASES.has(s.run_state)) throw new Reject('InvalidRunState', `equivocation proofs are accepted during an epoch, not in ${s.run_state}`)
  const checked = checkEquivocation(event.proof, s.run_id)
  if (!checked.ok) throw new Reject('InvalidProof', checked.reason)
  const reporter = clientIndex(s, event.from)
  if (reporter < 0) throw new Reject('UnknownClient', `reporter ${event.from} is not a client of this epoch`)
  const i = clientIndex(s, checked.producer)
  const round = s.epoch.round
  const inRound = round && round.step === checked.step && isRoundPhase(s.run_state) && round.roster.includes(checked.producer)
  const current = inRound ? round : null
  if (i < 0 && !current) throw new Reject('UnknownClient', `client ${checked.producer} is not in this epoch`)
  if (current?.excluded.includes(checked.producer) || (!current && s.epoch.clients[i].state === 'Ejected')) {
    throw new Reject('DuplicateAccusation', `client ${checked.producer} is already ejected`)
  }
  return ejectAndExclude(s, checked.producer, current)
}

function onPause(s: CoordinatorState, now: number): CoordinatorState {
  if (HALTED_PHASES.has(s.run_state)) throw new Reject('Halted', `the run is already ${s.run_state}`)
  if (ACTIVE_PHASES.has(s.run_state)) return {...s, pending_pause: true}
  return changeState(keepHealthyAsPending(s), now, 'Paused')
}

function onResume(s: CoordinatorState, now: number): CoordinatorState {
  if (s.run_state !== 'Paused' && s.run_state !== 'Uninitialized') throw new Reject('CannotResume', `the run is ${s.run_state}, not Paused`)
  return changeState(s, now, s.progress.step > s.config.total_steps ? 'Finished' : 'WaitingForMembers')
}

function onCheckpoint(s: CoordinatorState, event: Extract<CoordinatorEvent, {type: 'checkpoint'}>): CoordinatorState {
  const refusal = checkpointRefusal(s)
  if (refusal?.code === 'InvalidRunState') throw new Reject(refusal.code, refusal.reason)
  // Outside Cooldown (a late upload of the run's current model): a designated checkpointer needs no membership, the
  // list is the authority (its epoch may be over); without a list, a member of the epoch the state records.
  const late = s.run_state !== 'Cooldown'
  const designated = s.config.checkpointers
  const listed = designated !== undefined && designated.length > 0
  if (!(late && listed) && clientIndex(s, event.from) < 0) throw new Reject('UnknownClient', `client ${event.from} is not in this epoch`)
  if (listed && !designated.includes(event.from)) {
    throw new Reject('NotCheckpointer', `client ${event.from} is not one of the run's checkpointers (config.checkpointers)`)
  }
  if (refusal) throw new Reject(refusal.code, refusal.reason)
  if (typeof event.repo?.repo_id !== 'string' || event.repo.repo_id === '') throw new Reject('InvalidEvent', 'checkpoint repo_id must be a non-empty string')
  if (event.param_hash !== undefined && !isParamHash(event.param_hash)) throw new Reject('InvalidEvent', 'checkpoint param_hash must be 64 lowercase hex digits')
  const repo: HubRepo = event.repo.revision === undefined ? {repo_id: event.repo.repo_id} : {repo_id: event.repo.repo_id, revision: event.repo.revision}
  // The checkpoint is recorded with the hash the last round's witnesses agreed on (late: the run's current model's,
  // recorded at its epoch's end); one that declares another is refused.
  const model = s.current_model
  const agreed = late ? model!.param_hash! : agreedParamHash(s)
  const step = late ? model!.step : s.epoch.round!.step
  if (agreed === undefined)
    throw new Reject('HashNotAgreed', `no quorum of step ${s.epoch.round?.step}'s witnesses has attested a parameter hash yet: the checkpoint cannot be checked`)
  if (event.param_hash !== agreed)
    throw new Reject(
      'CheckpointHashMismatch',
      late
        ? `checkpoint ${event.repo.repo_id} declares parameter hash ${event.param_hash ?? '(none)'}, the run's current model (step ${step}) is ${agreed}`
        : `checkpoint ${event.repo.repo_id} declares parameter hash ${event.param_hash ?? '(none)'}, the epoch's witnesses agreed on ${agreed}`,
    )
  const checkpoint_hash = {repo, step, param_hash: agreed}
  const checkpoint = s.model.LLM.checkpoint
  // The model now lives in that Hub repository: it replaces a Hub, Dummy or Local starting point too, so the
  // epoch's end (checkpointToP2P) keeps it as the fallback a run whose clients are all gone starts from again.
  const fromHub = typeof checkpoint === 'object' && ('Hub' in checkpoint || 'Dummy' in checkpoint || 'Local' in checkpoint)
  const next: CheckpointConfig = isCheckpointP2P(checkpoint) ? {P2P: repo} : fromHub ? {Hub: repo} : checkpoint
  // Only Cooldown's report ends its epoch's Cooldown (a late one belongs to no Cooldown).
  const epoch = late ? s.epoch : {...s.epoch, checkpointed: true}
  return {...s, checkpoint_fallback: {Hub: repo}, checkpoint_hash, model: {LLM: {...s.model.LLM, checkpoint: next}}, epoch}
}

function onConfigUpdate(s: CoordinatorState, event: Extract<CoordinatorEvent, {type: 'config_update'}>): CoordinatorState {
  if (s.run_state !== 'Paused' && s.run_state !== 'Uninitialized')
    throw new Reject('InvalidRunState', `the configuration can change only while Paused or Uninitialized, not ${s.run_state}`)
  const result = validateRunConfig(event.config ?? s.config, event.model ?? s.model, 'config_update')
  if ('issues' in result) throw new Reject('InvalidConfig', formatIssue(result.issues[0]))
  return {...s, config: result.config as CoordinatorConfig, model: result.model as {LLM: LLMConfig}}
}

function checkId(id: unknown, field: string): void {
  if (typeof id !== 'string' || id === '') throw new Reject('InvalidEvent', `${field} must be a non-empty client id`)
}

function apply(s: CoordinatorState, event: CoordinatorEvent, now: number): CoordinatorState {
  switch (event.type) {
    case 'tick':
      if (event.entropy !== undefined && typeof event.entropy !== 'string') throw new Reject('InvalidEvent', 'tick entropy must be text')
      return onTick(s, now, event.entropy)
    case 'join':
      checkId(event.id, 'id')
      return onJoin(s, event.id)
    case 'withdraw':
      checkId(event.id, 'id')
      return onWithdraw(s, event.id)
    case 'eject':
      checkId(event.id, 'id')
      return onEject(s, event.id)
    case 'witness':
      checkId(event.from, 'from')
      if (HALTED_PHASES.has(s.run_state)) throw new Reject('Halted', `the run is ${s.run_state}`)
      if (event.entropy !== undefined && typeof event.entropy !== 'string') throw new Reject('InvalidEvent', 'witness entropy must be text')
      return onWitness(s, now, event, event.entropy)
    case 'health_check':
      checkId(event.from, 'from')
      if (HALTED_PHASES.has(s.run_state)) throw new Reject('Halted', `the run is ${s.run_state}`)
      return onHealthCheck(s, event)
    case 'accuse':
      checkId(event.from, 'from')
      return onAccuse(s, event)
    case 'equivocation':
      checkId(event.from, 'from')
      return onEquivocation(s, event)
    case 'pause':
      return onPause(s, now)
    case 'resume':
      return onResume(s, now)
    case 'checkpoint':
      checkId(event.from, 'from')
      return onCheckpoint(s, event)
    case 'config_update':
      return onConfigUpdate(s, event)
    default:
      throw new Reject('InvalidEvent', `unknown event type ${JSON.stringify((event as {type?: unknown}).type)}`)
  }
}

/**
 * Applies one event at time `now` (unix milliseconds, from the backend). Returns the new state, or the
 * same state and `error` when the event is rejected (wrong phase, not a witness, duplicate, ...).
 */
export function applyEvent(state: CoordinatorState, event: CoordinatorEvent, now: number): ApplyResult {
  if (!Number.isFinite(now) || now < 0) return {state, error: {code: 'InvalidEvent', message: `time ${now} must be a non-negative number of milliseconds`}}
  try {
    return {state: apply(state, event, now)}
  } catch (error) {
    if (error instanceof Reject) return {state, error: {code: error.code, message: error.message} satisfies Rejection}
    throw error
  }
}

/**
 * The entropy a Solana cluster's clock gives a round that starts at it: "slot:unix_timestamp" in decimal. The program
 * mixes it into each round's seed (SHA-256(previous seed ‖ step ‖ entropy)), so a round's witnesses and batches cannot
 * be computed before its slot; the reference gets the same text through the event that starts the round.
 */
export function clockEntropy(slot: number | bigint, unixSeconds: number | bigint): string {
  return `${slot}:${unixSeconds}`
}

/** Ticks the run forward at `now`: at most one phase transition. A halted run is returned unchanged. */
export function tick(state: CoordinatorState, now: number, entropy?: string): CoordinatorState {
  return applyEvent(state, entropy === undefined ? {type: 'tick'} : {type: 'tick', entropy}, now).state
}
