import {BloomFilter} from '../primitives/bloom.js'
import {constant} from '../layout/layout-table.js'
import {isRoundPhase} from './phases.js'
import {batchRangeFor, isVerifier, participantKey, isScoreAssigned, verifierCount, witnessBloomParams, witnessCount, witnessQuorum} from './rules.js'
import type {ClientId, CoordinatorState, Round} from './types.js'

/**
 * Incentives: the rewards ledger. A pure function of the coordinator's transitions and of the verifiers' signed score
 * reports, kept beside the coordinator state (the centralized server saves it with its state), so it is one rule
 * whatever the backend that feeds it.
 *
 * Scores. A verifier of round s + 1 scores the results of round s that the seed assigned it (at most
 * verification_sample: rules.ts assignedTrainers; a report naming any other is refused, recordScores) by τemplar's
 * loss improvement s_i = L(θ; D_i) − L(θ + δ_i; D_i) on the producer's assigned batches (verify/score.ts scoreOf: s_i beyond the gain on data nobody trained on, over the
 * round's median step size, so a score is comparable across rounds as the loss and the learning rate fall; in [-1, 1]).
 * The ledger keeps, per client, a moving average over steps (weight 1/2) of each step's mean over its verifiers'
 * reports (however few scored it); a client nobody scored in a step keeps its average. A verifier reports a step once;
 * reports of a step older than one already scored are too late.
 *
 * Integers only, so the Solana program (programs/coordinator/coordinator.c, report_scores) keeps the very same numbers:
 * a score is fixed point, SCORE_ONE = 1 (parts per million, in [-SCORE_ONE, SCORE_ONE]), rounded once when a
 * verifier's report is taken (scoreToFixed). A step's mean is trunc(sum / verifiers) and the average
 * trunc((before + mean) / 2): division truncating toward zero, as C's signed division does (Math.trunc here). The
 * weight is parts per million (WEIGHT_ONE = 1) and points an exact integer product (BigInt here, u64 in C).
 *
 * Points. A round's result is *accepted* when a witness quorum saw it (the trainer is healthy by the round's
 * participant blooms), the coordinator did not exclude it (an invalid-result or low-score quorum, or an equivocation),
 * and its batch range is not empty: exactly the results every replica applies. Each accepted batch counts. At the end
 * of an epoch a client earns
 *
 *     points = floor(accepted batches × POINTS_PER_BATCH × weight(s̄) / WEIGHT_ONE)
 *     weight(s̄) = clamp(floor(s̄ × WEIGHT_ONE / FULL_WEIGHT_SCORE), 0, WEIGHT_ONE)      (a run without verifiers: WEIGHT_ONE)
 *
 * so a harmful or empty update (s̄ ≤ 0) earns nothing, a client no verifier has scored yet earns nothing in a run with
 * verifiers, and every honest client (whose scores stayed above FULL_WEIGHT_SCORE in bench/README.md, Verification)
 * earns in proportion to the batches it trained. A client ejected in the epoch (a witness or verifier quorum, an
 * equivocation proof, the authority) earns none of the epoch's points: they are added to its `slashed` instead.
 *
 * Fake identities gain nothing: points are paid per accepted batch, and the weight is a function of the client's own
 * score only (no softmax across clients, whose shares grow with the number of identities). A machine that splits into
 * k identities gets k batch ranges of a round — k times the work, each range scored on its own — and exactly the
 * points of those batches, as one identity with the same work would; and each identity's weight is capped at 1, so
 * colluding verifiers cannot raise a partner above honest pay, only (as one report of several averaged) soften its
 * verdict.
 *
 * Bounded: entries exist for clients that trained or were scored; at each epoch's end, entries with no accepted result
 * and no points, of clients that are neither members of the run nor of the epoch that ended, are dropped (a score
 * alone is forgotten one epoch after its client left), and never more than MAX_LEDGER_CLIENTS are kept.
 */

/** A score of 1 in the ledger's fixed point (parts per million); the ledger's scores are in [-SCORE_ONE, SCORE_ONE]. */
export const SCORE_ONE = constant('SCORE_ONE')
/** A points weight of 1 (parts per million). */
export const WEIGHT_ONE = constant('WEIGHT_ONE')
/**
 * The score (fixed point) at which a result earns full weight: the lowest honest score measured, 0.2 (bench/README.md,
 * Verification: honest scores stayed above 0.2, results trained on other batches near 0.05 and below).
 */
export const FULL_WEIGHT_SCORE = constant('FULL_WEIGHT_SCORE')
/** Points for one accepted batch at full weight (integers, so a Solana account can hold them). */
export const POINTS_PER_BATCH = constant('POINTS_PER_BATCH')
/** The most clients the ledger holds (the bound of the server's score messages too). */
const MAX_LEDGER_CLIENTS = 4096
/** Score reports are remembered (for duplicates) this many steps back; older ones are refused anyway. */
const REPORT_MEMORY_STEPS = 4

export interface ClientRewards {
  client_id: ClientId
  /** Moving average of the scores, fixed point (SCORE_ONE = 1; null: never scored). */
  score: number | null
  /** The mean score of the last step scored (fixed point), that step, how many verifiers reported it, and reports received. */
  last: number | null
  last_step: number
  verifiers: number
  count: number
  /** The average before last_step (null: last_step is the first step scored), and the sum of last_step's reports (fixed point). */
  before: number | null
  sum: number
  /** Accepted results (rounds) and batches, in all epochs settled so far and in the current one. */
  rounds: number
  batches: number
  epoch_rounds: number
  epoch_batches: number
  /** Points earned in settled epochs, and points withheld because the client was ejected in its epoch. */
  earned: number
  slashed: number
}

export interface RewardsLedger {
  /** 2: fixed-point scores (1, before: scores as floats, converted by checkLedger). */
  version: 2
  /** Per client, in no particular order (rewardRows sorts). */
  clients: Record<ClientId, ClientRewards>
  /** `${step}:${verifier}` of the score reports taken in the last REPORT_MEMORY_STEPS steps. */
  reported: string[]
  /** Epochs settled. */
  epochs: number
}

export function emptyLedger(): RewardsLedger {
  return {version: 2, clients: {}, reported: [], epochs: 0}
}

function entry(ledger: RewardsLedger, id: ClientId): ClientRewards {
  return (
    ledger.clients[id] ?? {
      client_id: id,
      score: null,
      last: null,
      last_step: 0,
      verifiers: 0,
      count: 0,
      before: null,
      sum: 0,
      rounds: 0,
      batches: 0,
      epoch_rounds: 0,
      epoch_batches: 0,
      earned: 0,
      slashed: 0,
    }
  )
}

/**
 * A verifier's score (verify/score.ts scoreOf, in [-1, 1]) in the ledger's fixed point: clamped to [-1, 1] and
 * rounded to the nearest part per million, once, where a report is taken (the server; the Solana client before it
 * sends report_scores). NaN stays NaN, which recordScores refuses.
 */
export function scoreToFixed(score: number): number {
  if (Number.isNaN(score)) return NaN
  return Math.round(Math.max(-1, Math.min(1, score)) * SCORE_ONE) || 0
}

/** A fixed-point score as the decimal users read (rows of `psyche rewards`, status, dashboards). */
export function scoreFromFixed(fixed: number): number {
  return fixed / SCORE_ONE
}

/** C's signed integer division (truncates toward zero): the one rounding of the ledger's averages. */
function divTrunc(a: number, b: number): number {
  return Math.trunc(a / b) || 0
}

/**
 * The weight of a client's points, parts per million: clamp(floor(score × WEIGHT_ONE / FULL_WEIGHT_SCORE), 0,
 * WEIGHT_ONE); WEIGHT_ONE in a run without verifiers; 0 unscored. (|score| ≤ SCORE_ONE: the product stays below 2^53.)
 */
export function rewardWeight(score: number | null, runHasVerifiers: boolean): number {
  if (!runHasVerifiers) return WEIGHT_ONE
  if (score === null || !(score > 0)) return 0
  return Math.min(WEIGHT_ONE, Math.floor((score * WEIGHT_ONE) / FULL_WEIGHT_SCORE))
}

function runHasVerifiers(state: CoordinatorState): boolean {
  return verifierCount(state.config, 1) > 0
}

/**
 * The points `batches` accepted batches earn at `weight` (parts per million): floor(batches × perBatch × weight /
 * WEIGHT_ONE), exact (the product passes 2^53 long before a u64 does; the program computes it in u64).
 */
export function pointsFor(batches: number, weight: number, perBatch: number = POINTS_PER_BATCH): number {
  return Number((BigInt(batches) * BigInt(perBatch) * BigInt(weight)) / BigInt(WEIGHT_ONE))
}

/** Why a verifier's score report is refused (nothing changes; the server answers it with the code). */
interface ScoreRefusal {
  code: 'InvalidRunState' | 'stale_step' | 'InvalidScores' | 'DuplicateScores'
  reason: string
}

/**
 * A verifier's scores (fixed point, scoreToFixed) of one step's results, as `state` (the coordinator's current state) judges them: step s is
 * scored by verifiers of round s + 1, while that round runs, each for the trainers isScoreAssigned gives it (rules.ts:
 * the one rule the clients follow too). A report is refused whole, by the same rule on every replica, when the state
 * no longer holds both rounds (stale), when `from` scores a trainer it was not assigned (or is no verifier), or when
 * it already reported that step, or when a score is not an integer in [-SCORE_ONE, SCORE_ONE]. A trainer listed twice
 * counts once (its first score). A trainer no assigned verifier scored keeps its average; one scored by fewer
 * verifiers than assigned averages the reports it got. Steps older than a client's last scored step are ignored.
 */
export function recordScores(
  ledger: RewardsLedger,
  state: CoordinatorState,
  from: ClientId,
  step: number,
  scores: readonly {client_id: ClientId; score: number}[],
): RewardsLedger | ScoreRefusal {
  if (!isRoundPhase(state.run_state)) return {code: 'InvalidRunState', reason: `scores are accepted during rounds, not in ${state.run_state}`}
  const held = [state.epoch.round, state.epoch.previous_round]
  const verifying = held.find((r) => r?.step === step + 1)
  const scored = held.find((r) => r?.step === step)
  if (!verifying || !scored) return {code: 'stale_step', reason: `scores for step ${step}, but the round is step ${state.epoch.round?.step}`}
  if (!isVerifier(state, from, verifying)) return {code: 'InvalidScores', reason: `client ${from} is not a verifier of step ${verifying.step}`}
  const malformed = scores.find((e) => !Number.isSafeInteger(e.score) || Math.abs(e.score) > SCORE_ONE)
  if (malformed) return {code: 'InvalidScores', reason: `client ${from}'s score of ${malformed.client_id} is not an integer in [-${SCORE_ONE}, ${SCORE_ONE}]`}
  const unassigned = scores.find((e) => !isScoreAssigned(state, verifying, scored, from, e.client_id))
  if (unassigned) return {code: 'InvalidScores', reason: `client ${from} was not assigned to score ${unassigned.client_id}'s result of step ${step}`}
  const key = `${step}:${from}`
  if (ledger.reported.includes(key)) return {code: 'DuplicateScores', reason: `client ${from} already reported scores for step ${step}`}
  const clients = {...ledger.clients}
  const seen = new Set<ClientId>()
  for (const {client_id, score} of scores) {
    if (seen.has(client_id)) continue
    seen.add(client_id)
    const prev = entry({...ledger, clients}, client_id)
    let next: ClientRewards
    if (prev.count === 0 || step > prev.last_step) {
      // A new step: the previous one's mean is final in the average.
      next = {...prev, before: prev.score, sum: score, verifiers: 1, last: score, last_step: step, count: prev.count + 1}
    } else if (step === prev.last_step) {
      const sum = prev.sum + score
      next = {...prev, sum, verifiers: prev.verifiers + 1, count: prev.count + 1, last: divTrunc(sum, prev.verifiers + 1)}
    } else {
      continue
    }
    next.score = next.before === null ? next.last : divTrunc(next.before + next.last!, 2)
    clients[client_id] = next
  }
  const reported = [...ledger.reported.filter((k) => Number(k.slice(0, k.indexOf(':'))) >= step - REPORT_MEMORY_STEPS), key]
  return bound({...ledger, clients, reported}, new Set())
}

/** Trainers whose results of `round` are accepted (see the module comment), with their batch counts. */
export function acceptedResults(state: CoordinatorState, round: Round): Map<ClientId, number> {
  const params = witnessBloomParams(state.config, round)
  const blooms = round.witnesses.map((w) => BloomFilter.fromBase64(params, w.participant_bloom))
  const quorum = witnessQuorum(witnessCount(state.config, round.roster.length))
  const out = new Map<ClientId, number>()
  for (const id of round.roster) {
    if (round.excluded.includes(id)) continue
    const range = batchRangeFor(state, id, round)
    if (!range || range.end <= range.start) continue
    const key = participantKey(id)
    let seen = 0
    for (const b of blooms) if (b.contains(key)) seen++
    if (seen >= quorum) out.set(id, range.end - range.start)
  }
  return out
}

/** The round that `next` made final, if the transition prev → next closed one (its final record, as `next` holds it). */
function closedRound(prev: CoordinatorState, next: CoordinatorState): Round | undefined {
  const open = prev.epoch.round
  if (!open || !isRoundPhase(prev.run_state)) return undefined
  if (isRoundPhase(next.run_state) && next.epoch.round?.step === open.step) return undefined
  return [next.epoch.round, next.epoch.previous_round].find((r) => r?.step === open.step) ?? open
}

/** Clients ejected in the epoch `state` holds (its clients and those that left it). */
function ejectedIn(state: CoordinatorState): Set<ClientId> {
  return new Set([...state.epoch.clients, ...state.epoch.exited].filter((c) => c.state === 'Ejected').map((c) => c.id))
}

/**
 * Follows one coordinator transition (each state the backend adopts, in order): credits the accepted results of a
 * round that closed, and settles the epoch when one ended. Returns the same ledger when nothing changed.
 */
export function observeTransition(ledger: RewardsLedger, prev: CoordinatorState, next: CoordinatorState): RewardsLedger {
  if (prev === next) return ledger
  const round = closedRound(prev, next)
  if (round) {
    const accepted = acceptedResults(next, round)
    if (accepted.size > 0) {
      const clients = {...ledger.clients}
      for (const [id, batches] of accepted) {
        const e = entry({...ledger, clients}, id)
        clients[id] = {...e, epoch_rounds: e.epoch_rounds + 1, epoch_batches: e.epoch_batches + batches}
      }
      ledger = {...ledger, clients}
    }
  }
  if (next.progress.epoch !== prev.progress.epoch) ledger = settleEpoch(ledger, next)
  return ledger
}

/** The end of an epoch: each client's accepted batches become earned points (or slashed ones, if it was ejected). */
function settleEpoch(ledger: RewardsLedger, state: CoordinatorState): RewardsLedger {
  const ejected = ejectedIn(state)
  const verified = runHasVerifiers(state)
  const clients: Record<ClientId, ClientRewards> = {}
  for (const [id, e] of Object.entries(ledger.clients)) {
    if (e.epoch_batches === 0 && e.epoch_rounds === 0) {
      clients[id] = e
      continue
    }
    const points = pointsFor(e.epoch_batches, rewardWeight(e.score, verified))
    clients[id] = {
      ...e,
      rounds: e.rounds + e.epoch_rounds,
      batches: e.batches + e.epoch_batches,
      epoch_rounds: 0,
      epoch_batches: 0,
      earned: e.earned + (ejected.has(id) ? 0 : points),
      slashed: e.slashed + (ejected.has(id) ? points : 0),
    }
  }
  // The epoch's clients (those that left it too) stay listed until the next epoch's end.
  const members = new Set([...state.pending, ...state.epoch.clients.map((c) => c.id), ...state.epoch.exited.map((c) => c.id)])
  return bound({...ledger, clients, epochs: ledger.epochs + 1}, members, true)
}

/** Drops entries beyond MAX_LEDGER_CLIENTS (and, with `prune`, those holding nothing of clients not in `members`). */
function bound(ledger: RewardsLedger, members: ReadonlySet<ClientId>, prune = false): RewardsLedger {
  const ids = Object.keys(ledger.clients)
  const empty = (e: ClientRewards) => e.earned === 0 && e.slashed === 0 && e.rounds === 0 && e.epoch_rounds === 0
  if (!prune && ids.length <= MAX_LEDGER_CLIENTS) return ledger
  const clients = {...ledger.clients}
  if (prune) for (const id of ids) if (empty(clients[id]) && !members.has(id)) delete clients[id]
  // Past the bound, those holding nothing go first (least recently scored first), then the lowest earners.
  const rest = Object.values(clients)
  if (rest.length > MAX_LEDGER_CLIENTS) {
    rest.sort((a, b) => Number(empty(b)) - Number(empty(a)) || a.earned - b.earned || a.last_step - b.last_step)
    for (const e of rest.slice(0, rest.length - MAX_LEDGER_CLIENTS)) delete clients[e.client_id]
  }
  return {...ledger, clients}
}

/** The verification scores as watchers get them (protocol ClientScore): the clients scored so far, in id order. */
export function scoreRows(ledger: RewardsLedger) {
  return scoreRowsOf(Object.values(ledger.clients))
}

/** scoreRows of ledger entries (the server's, or the Solana program's decoded ones: layout.ts ledgerScores). */
export function scoreRowsOf(
  entries: readonly Pick<ClientRewards, 'client_id' | 'score' | 'last' | 'last_step' | 'verifiers' | 'count'>[],
): {client_id: ClientId; average: number; last: number; last_step: number; verifiers: number; count: number}[] {
  return entries
    .filter((e) => e.score !== null && e.last !== null)
    .map((e) => ({
      client_id: e.client_id,
      average: scoreFromFixed(e.score!),
      last: scoreFromFixed(e.last!),
      last_step: e.last_step,
      verifiers: e.verifiers,
      count: e.count,
    }))
    .sort((a, b) => (a.client_id < b.client_id ? -1 : a.client_id > b.client_id ? 1 : 0))
}

/** One client's rewards as `psyche rewards`, `status` and dashboards show them (snake_case, stable). */
export interface RewardRow {
  client_id: ClientId
  /** Moving average of its verification scores, a decimal in [-1, 1] (null: never scored). */
  score: number | null
  /** Its points' weight now (rewardWeight), a decimal in [0, 1]. */
  weight: number
  /** Accepted results and batches, settled epochs and the current one together. */
  rounds: number
  batches: number
  /** What the current epoch's accepted batches would earn at the current weight (settled at the epoch's end). */
  pending: number
  earned: number
  slashed: number
}

/** The ledger as rows, in client id order (a stable rendering). */
export function rewardRows(ledger: RewardsLedger, state: CoordinatorState): RewardRow[] {
  const verified = runHasVerifiers(state)
  const ejected = ejectedIn(state)
  return Object.values(ledger.clients)
    .map((e) => {
      const weight = rewardWeight(e.score, verified)
      return {
        client_id: e.client_id,
        score: e.score === null ? null : scoreFromFixed(e.score),
        weight: weight / WEIGHT_ONE,
        rounds: e.rounds + e.epoch_rounds,
        batches: e.batches + e.epoch_batches,
        pending: ejected.has(e.client_id) ? 0 : pointsFor(e.epoch_batches, weight),
        earned: e.earned,
        slashed: e.slashed,
      }
    })
    .sort((a, b) => (a.client_id < b.client_id ? -1 : a.client_id > b.client_id ? 1 : 0))
}

/**
 * Checks a ledger read back from a file (the server's saved state): throws a RangeError naming what is wrong. A
 * version-1 ledger (scores as floats) is converted: each score, mean, earlier average and sum rounded to fixed point.
 */
export function checkLedger(value: unknown): RewardsLedger {
  let v = value as RewardsLedger
  if (v && typeof v === 'object' && (v as {version: unknown}).version === 1) v = fromVersion1(v)
  if (!v || typeof v !== 'object' || v.version !== 2) throw new RangeError('rewards: version must be 2 (or 1, converted)')
  if (!v.clients || typeof v.clients !== 'object' || Array.isArray(v.clients)) throw new RangeError('rewards.clients must be an object')
  if (!Array.isArray(v.reported) || !v.reported.every((k) => typeof k === 'string')) throw new RangeError('rewards.reported must be a list of text')
  if (!Number.isSafeInteger(v.epochs) || v.epochs < 0) throw new RangeError('rewards.epochs must be a whole number')
  const counts = ['last_step', 'verifiers', 'count', 'rounds', 'batches', 'epoch_rounds', 'epoch_batches', 'earned', 'slashed'] as const
  for (const [id, e] of Object.entries(v.clients)) {
    if (!e || typeof e !== 'object' || e.client_id !== id) throw new RangeError(`rewards.clients.${id}: client_id must match its key`)
    for (const k of counts) if (!Number.isSafeInteger(e[k]) || e[k] < 0) throw new RangeError(`rewards.clients.${id}.${k} must be a whole number ≥ 0`)
    const fixed = (x: unknown) => Number.isSafeInteger(x) && Math.abs(x as number) <= SCORE_ONE
    for (const k of ['score', 'last', 'before'] as const)
      if (e[k] !== null && !fixed(e[k])) throw new RangeError(`rewards.clients.${id}.${k} must be an integer in [-${SCORE_ONE}, ${SCORE_ONE}] or null`)
    if (!Number.isSafeInteger(e.sum)) throw new RangeError(`rewards.clients.${id}.sum must be an integer`)
  }
  return v
}

/** A version-1 ledger (float scores) in fixed point; what is not a finite number is left for checkLedger to name. */
function fromVersion1(v: RewardsLedger): RewardsLedger {
  const clients = v.clients && typeof v.clients === 'object' && !Array.isArray(v.clients) ? v.clients : {}
  const convert = (x: unknown) => (typeof x === 'number' && Number.isFinite(x) ? Math.round(x * SCORE_ONE) || 0 : x)
  const out: Record<ClientId, ClientRewards> = {}
  for (const [id, e] of Object.entries(clients)) {
    if (!e || typeof e !== 'object') out[id] = e
    else
      out[id] = {...e, score: convert(e.score) as number | null, last: convert(e.last) as number | null, before: convert(e.before) as number | null, sum: convert(e.sum) as number}
  }
  return {...v, version: 2, clients: v.clients === clients ? out : v.clients}
}
