import {
  assignBatches,
  batchRangeFor,
  EPOCH_PHASES,
  isCheckpointP2P,
  isResultWitnessed,
  isRoundPhase,
  isTrainerHealthy,
  isVerifier,
  isWitness,
  predictNextRound,
  type BatchRange,
  type ClientId,
  type CoordinatorState,
  type Round,
} from '../coordinator/index.js'
import {FORMAT_INVALID} from '../verify/intake.js'

export {FORMAT_INVALID}

/**
 * The client's decisions, as pure functions of (coordinator state, what this client holds). The I/O loop
 * (runner.ts) only executes what these return, so every rule here is unit-tested without processes.
 *
 * Two lanes:
 * - work (nextWork): load the model, score a finished round's results (as a verifier), apply them, train this round.
 *   Serial: each needs the worker, a round is scored before it is applied, and applies happen in strict step order.
 * - messages (messagesToSend): warmup-ready, witness proofs, health checks. Instant sends, re-evaluated on
 *   every state push and every downloaded result, even while the worker is busy.
 *
 * Determinism. A round's witness records are final once the coordinator has moved past the round (it is
 * `previous_round` in the next RoundTrain, or `round` in Cooldown and later). Every client applies, for step
 * s, exactly the results a witness quorum of that final record confirmed (isResultWitnessed), and nothing
 * else; the worker sorts them by hash. Applies go strictly in step order (modelStep + 1), so a client that
 * missed a round can never apply a later one: it stays behind and reloads the model at the next Warmup.
 */

/** One trainer's result for one step, as announced (and, once downloaded and verified, its bytes). */
export interface HeldResult {
  client_id: ClientId
  step: number
  batch_start: number
  batch_end: number
  /** sha256 hex of the blob. */
  commitment: string
  bytes?: Uint8Array
  /**
   * Why this result is not counted (set once its bytes arrived and failed validation: it does not decode
   * against the run's model, it copies or replays another result, its producer equivocated). Never witnessed,
   * never applied; its producer is accused.
   */
  invalid?: string
}

export interface ClientView {
  id: ClientId
  /** Step through which accepted results are applied to the worker's model; null: no model loaded. */
  modelStep: number | null
  /** The last step this client produced a result for (0: none). */
  trainedStep: number
  /** Epoch (progress.epoch) whose Warmup this client reported its model loaded in. */
  warmupReported: number | null
  /** Steps whose witness proof was sent. */
  witnessSent: ReadonlySet<number>
  /** Steps (of judged rounds) this client already sent, or decided against, a health check for. */
  healthChecked: ReadonlySet<number>
  /** Steps whose results this client scored as a verifier (the `score` job done). */
  scored?: ReadonlySet<number>
  /** Rounds whose witness records are final, by step (finalRounds below collects them from each state). */
  finalRounds: ReadonlyMap<number, Round>
  /** Results announced for each step, by producer (first valid announcement per producer wins). */
  results: ReadonlyMap<number, ReadonlyMap<ClientId, HeldResult>>
  /** `${step}:${producer}` of the invalid results this client already accused. */
  accused?: ReadonlySet<string>
  /**
   * Steps whose witness window this client still waits in for results it is downloading (see messagesToSend):
   * the runner adds a step when it first sees the step's RoundWitness and removes it after a grace period.
   */
  witnessGrace?: ReadonlySet<number>
  /** The hash of the parameters at modelStep (null: none yet). */
  paramHash?: string | null
  /** The step whose Cooldown witness (our parameter hash after applying it) was sent. */
  cooldownWitnessSent?: number | null
  /** Whether the worker can undo a speculative round (only then does nextWork return `speculate`). */
  canSpeculate?: boolean
  /** The speculative round under way (`speculate`), until the real round confirms its batches. */
  speculation?: {step: number; range: BatchRange}
}

export type Work =
  /** Load the model as of `step` (the epoch's start_step - 1): from the run's checkpoint, or from these peers. */
  | {kind: 'load_model'; step: number; from: 'checkpoint' | ClientId[]}
  /**
   * As a verifier of `current` (the round under way), score the results of the final `round` before they are applied
   * (the worker's parameters are then those their producers trained from). `train`: `round` is to be applied with our
   * training of `current`, whose forward/backward begins first (it overlaps the downloads, as in `train`).
   */
  | {kind: 'score'; round: Round; current: Round; train?: {round: Round; range: BatchRange}}
  /** Apply `round`'s accepted results on their own (no training of ours to fold them into). */
  | {kind: 'apply'; round: Round}
  /** Train `round` on `range`; first apply `previous` (round.step - 1) if given (the worker's train_round). */
  | {kind: 'train'; round: Round; range: BatchRange; previous?: Round}
  /**
   * Our result of the current round is out: begin the next round's compute now on `range`, our batches in `round` as
   * this state predicts it (rules.ts predictNextRound), while this round's results move and are witnessed.
   */
  | {kind: 'speculate'; round: Round; range: BatchRange}
  /** Undo the speculative round `step`: the state shows it will not be trained on the predicted batches (`reason`). */
  | {kind: 'discard'; step: number; reason: string}
  /** Neither in the epoch nor waiting to join: ask to join again (e.g. after being dropped). */
  | {kind: 'join'}
  /** The run is over and every round we can apply is applied. */
  | {kind: 'finished'}

export type Message =
  | {kind: 'warmup_ready'; epoch: number}
  | {kind: 'witness'; step: number; seen: HeldResult[]}
  | {kind: 'health_check'; step: number; judged: number; accused: ClientId[]}
  /** In Cooldown, as a witness of the epoch's last round `step`: our parameters' hash after applying it. */
  | {kind: 'cooldown_witness'; step: number; param_hash: string}
  /** As a witness of `step`: `accused`'s result failed validation (`detail` says how). */
  | {kind: 'accuse'; step: number; accused: ClientId; detail: string}

/** Rounds of `state` whose witness records can no longer change (see the module comment). */
export function finalRounds(state: CoordinatorState): Round[] {
  const {round, previous_round: previous} = state.epoch
  const out: Round[] = []
  if (previous) out.push(previous)
  // Past RoundWitness (Cooldown, WaitingForMembers, Paused, Finished) the epoch's last round is final too.
  if (round && !isRoundPhase(state.run_state) && state.run_state !== 'Warmup') out.push(round)
  return out
}

/** Healthy in the current epoch, during one of its phases. */
function isEpochMember(state: CoordinatorState, id: ClientId): boolean {
  return EPOCH_PHASES.has(state.run_state) && state.epoch.clients.some((c) => c.id === id && c.state === 'Healthy')
}

/** The round's trainers that had batches (an empty range has nothing to send), with their ranges. */
export function trainersWithBatches(state: CoordinatorState, round: Round): {id: ClientId; range: BatchRange}[] {
  // Every trainer at once (assignBatches shares hashes and is memoized per round): called on every result that
  // arrives, so one shuffle per trainer here made a round cost O(N²) shuffles per client (bench/README.md, "Scale").
  const out: {id: ClientId; range: BatchRange}[] = []
  for (const [id, range] of assignBatches(state, round)) if (range.end > range.start) out.push({id, range})
  return out
}

/** True when an announced result belongs to `round`: its producer trained in it, on exactly these batches. */
export function belongsToRound(state: CoordinatorState, round: Round, r: Pick<HeldResult, 'client_id' | 'step' | 'batch_start' | 'batch_end'>): boolean {
  if (r.step !== round.step) return false
  const range = batchRangeFor(state, r.client_id, round)
  return range !== undefined && range.end > range.start && range.start === r.batch_start && range.end === r.batch_end
}

function commitmentBytes(hex: string): Uint8Array {
  return Buffer.from(hex, 'hex')
}

/**
 * The results to apply for a final `round`: the held ones a witness quorum confirmed, and the trainers a
 * quorum saw (participant bloom) whose confirmed result we hold no announcement of — the caller waits for
 * those, since applying without them would fork this replica.
 */
export function acceptedResults(
  state: CoordinatorState,
  round: Round,
  held: ReadonlyMap<ClientId, HeldResult> | undefined,
): {accepted: HeldResult[]; missing: ClientId[]; dropped: HeldResult[]} {
  const accepted: HeldResult[] = []
  const missing: ClientId[] = []
  const dropped: HeldResult[] = []
  const excluded = new Set(round.excluded ?? [])
  for (const {id, range} of trainersWithBatches(state, round)) {
    // The round's record excludes it (a witness quorum found it invalid, or its producer equivocated).
    if (excluded.has(id)) continue
    const r = held?.get(id)
    if (r && belongsToRound(state, round, r) && isResultWitnessed(state, round, id, range, commitmentBytes(r.commitment))) {
      // Witnessed, yet it fails validation: every replica holds the same bytes (they hash to the witnessed
      // commitment) and validates them the same way, so every replica drops it.
      if (r.bytes && r.invalid !== undefined && isFormatInvalid(r)) dropped.push(r)
      else accepted.push(r)
    } else if (isTrainerHealthy(state, round, id)) missing.push(id)
  }
  return {accepted, missing, dropped}
}

/**
 * True when the result's own bytes are invalid. Only that drops a witnessed result at apply time: it is the
 * same on every replica. Reasons that depend on what this client saw (copies, replays, equivocation) keep a
 * client from witnessing, never from applying what a quorum witnessed.
 */
function isFormatInvalid(r: HeldResult): boolean {
  return r.invalid?.startsWith(FORMAT_INVALID) ?? false
}

/**
 * Why the speculative round `spec` will not be trained on its predicted batches, or undefined while it may: the round
 * before it is still under way, or it has begun with this client's range equal to the predicted one (and is not
 * trained yet).
 */
function speculationFails(state: CoordinatorState, view: ClientView, spec: {step: number; range: BatchRange}): string | undefined {
  const round = state.epoch.round
  if (!round || !isRoundPhase(state.run_state)) return `the run is ${state.run_state}`
  if (!isEpochMember(state, view.id)) return 'not a member of the epoch any more'
  if (round.step === spec.step - 1) return undefined
  if (round.step !== spec.step || view.trainedStep >= spec.step) return `the round under way is step ${round.step}`
  const range = batchRangeFor(state, view.id, round)
  if (!range || range.end === range.start) return 'the round gave this client no batches'
  if (range.start !== spec.range.start || range.end !== spec.range.end)
    return `the round gave batches [${range.start}, ${range.end}), not the predicted [${spec.range.start}, ${spec.range.end})`
  return undefined
}

/**
 * The next round's predicted batches, when this client may begin them now: it is done with the current round (its
 * result is out, or it has no batches in it), its model is where the next round's training starts from (the round
 * before the current one applied), the worker can undo a wrong guess, and the round is not the epoch's or run's last.
 */
function speculateWork(state: CoordinatorState, view: ClientView): Work | undefined {
  const round = state.epoch.round
  if (!view.canSpeculate || view.speculation || !round || !isRoundPhase(state.run_state) || view.modelStep !== round.step - 1) return undefined
  if (!isEpochMember(state, view.id) || state.pending_pause || round.step + 1 > state.config.total_steps) return undefined
  const perEpoch = state.config.rounds_per_epoch
  if (perEpoch !== undefined && round.height + 1 >= perEpoch) return undefined
  if (view.trainedStep < round.step) {
    const mine = batchRangeFor(state, view.id, round)
    if (mine && mine.end > mine.start) return undefined
  }
  const next = predictNextRound(state)
  const range = next && batchRangeFor(state, view.id, next)
  return next && range && range.end > range.start ? {kind: 'speculate', round: next, range} : undefined
}

/** The next piece of work for the worker, or undefined when there is nothing to do until something changes. */
export function nextWork(state: CoordinatorState, view: ClientView): Work | undefined {
  const {id, modelStep} = view
  const round = state.epoch.round
  // A speculative round the state no longer confirms is undone before anything else uses the worker.
  const failed = view.speculation && speculationFails(state, view, view.speculation)
  if (failed) return {kind: 'discard', step: view.speculation!.step, reason: failed}
  const member = isEpochMember(state, id)
  const trainNow = member && state.run_state === 'RoundTrain' && round !== null && view.trainedStep < round.step
  const myRange = trainNow ? batchRangeFor(state, id, round!) : undefined
  const willTrain = myRange !== undefined && myRange.end > myRange.start

  // Catch up: apply the next final round in step order (scored first when we verify), unless it is about to be folded
  // into our training.
  if (modelStep !== null) {
    const next = view.finalRounds.get(modelStep + 1)
    if (next) {
      const folded = willTrain && next.step === round!.step - 1
      const score = scoreWork(state, view, next, folded ? {round: round!, range: myRange!} : undefined)
      if (score) return score
      if (!folded) return {kind: 'apply', round: next}
    }
  }

  if (state.run_state === 'Finished') return {kind: 'finished'}
  const pending = state.pending.includes(id)
  if (!member && !pending && state.run_state !== 'Uninitialized') return {kind: 'join'}

  if (member && state.run_state === 'Warmup') {
    const target = state.epoch.start_step - 1
    if (modelStep === target) return undefined
    if (!isCheckpointP2P(state.model.LLM.checkpoint)) return {kind: 'load_model', step: target, from: 'checkpoint'}
    const peers = state.epoch.clients.filter((c) => c.id !== id && c.state === 'Healthy').map((c) => c.id)
    return {kind: 'load_model', step: target, from: peers}
  }

  if (willTrain && modelStep !== null) {
    const r = round!
    if (modelStep === r.step - 1) return {kind: 'train', round: r, range: myRange!}
    const previous = view.finalRounds.get(r.step - 1)
    if (previous && modelStep === r.step - 2) return {kind: 'train', round: r, range: myRange!, previous}
  }
  return speculateWork(state, view)
}

/** The `score` job for the final round `next` (applied next), when we verify the current round and have not scored it. */
function scoreWork(state: CoordinatorState, view: ClientView, next: Round, train?: {round: Round; range: BatchRange}): Work | undefined {
  const current = state.epoch.round
  if (!current || !isRoundPhase(state.run_state) || view.scored?.has(next.step) || !isVerifier(state, view.id, current)) return undefined
  return train ? {kind: 'score', round: next, current, train} : {kind: 'score', round: next, current}
}

/** Messages to send now for this state (the caller records what it sent in the view, so each goes once). */
export function messagesToSend(state: CoordinatorState, view: ClientView): Message[] {
  const {id} = view
  if (!isEpochMember(state, id)) return []
  const out: Message[] = []
  const epoch = state.progress.epoch
  if (state.run_state === 'Warmup') {
    const recorded = state.epoch.warmup_witnesses.includes(id)
    if (view.modelStep === state.epoch.start_step - 1 && view.warmupReported !== epoch && !recorded) out.push({kind: 'warmup_ready', epoch})
    return out
  }
  const round = state.epoch.round
  if (state.run_state === 'Cooldown') {
    // The epoch's last round is applied: its witnesses attest the parameters it gave, which the coordinator records
    // with the epoch's checkpoint (a quorum of equal hashes; rules.ts agreedParamHash).
    const attested = round?.step === view.modelStep && view.cooldownWitnessSent !== round.step
    if (attested && view.paramHash && isWitness(state, id, round) && !state.epoch.hash_witnesses.some((w) => w.from === id))
      out.push({kind: 'cooldown_witness', step: round.step, param_hash: view.paramHash})
    return out
  }
  if (!round || !isRoundPhase(state.run_state) || !isWitness(state, id, round)) return out

  // The round's record is checked too: after a reconnect the runner forgets what it sent (a restarted server
  // may have lost it), and a proof the coordinator already holds must not be sent twice.
  if (!view.witnessSent.has(round.step) && !round.witnesses.some((w) => w.from === id)) {
    const held = view.results.get(round.step)
    const arrived = trainersWithBatches(state, round)
      .map(({id: t}) => held?.get(t))
      .filter((r): r is HeldResult => r !== undefined && r.bytes !== undefined && belongsToRound(state, round, r))
    // A witness never attests a result that failed validation.
    const seen = arrived.filter((r) => r.invalid === undefined)
    // Opportunistic: as soon as every trainer's result is here; otherwise with what we have once training time is up
    // — except that early in the witness window a result still downloading is worth waiting for: a complete proof
    // from every witness closes the window at once (the coordinator's early close), a partial one holds it open.
    const complete = arrived.length === trainersWithBatches(state, round).length
    const downloading = [...(held?.values() ?? [])].some((r) => r.bytes === undefined && r.invalid === undefined && belongsToRound(state, round, r))
    const waiting = downloading && view.witnessGrace?.has(round.step) === true
    if (complete || (state.run_state === 'RoundWitness' && !waiting)) out.push({kind: 'witness', step: round.step, seen})
  }

  // Accuse the producers of this round's invalid results (the coordinator ejects on a witness quorum).
  for (const r of view.results.get(round.step)?.values() ?? []) {
    if (
      r.invalid !== undefined &&
      r.client_id !== id &&
      !view.accused?.has(`${round.step}:${r.client_id}`) &&
      belongsToRound(state, round, r) &&
      !round.excluded?.includes(r.client_id)
    ) {
      out.push({kind: 'accuse', step: round.step, accused: r.client_id, detail: r.invalid})
    }
  }

  // Health checks judge the previous round, whose witness records are final: its trainers with batches that no
  // witness quorum saw, and who are still Healthy. Sent by this round's witnesses.
  const judged = state.epoch.previous_round
  if (judged && !view.healthChecked.has(judged.step)) {
    const healthy = new Set(state.epoch.clients.filter((c) => c.state === 'Healthy').map((c) => c.id))
    const accused = trainersWithBatches(state, judged)
      .map((t) => t.id)
      .filter((t) => t !== id && healthy.has(t) && !isTrainerHealthy(state, judged, t))
    out.push({kind: 'health_check', step: round.step, judged: judged.step, accused})
  }
  return out
}
