import {observeTransition, recordScores, rewardRows, scoreRows, scoreToFixed, type RewardsLedger} from '../../coordinator/rewards.js'
import type {ClientId, CoordinatorState} from '../../coordinator/types.js'
import type {EventLog} from '../../events.js'

/**
 * The server's rewards ledger (coordinator/rewards.ts): verifiers' scores as moving averages, and the points each
 * client earned for its accepted results. It follows every state the server adopts (observe), takes verifiers' score
 * reports (record), is saved with the state, and is shown to watchers; it is never an input of the coordinator machine.
 */
export class Ledger {
  /** The scores and reward rows as watchers get them (serialized when a watcher needs them after a change). */
  private json: string | undefined
  /** Counts the changes of what watchers get from here (a watcher's dedupe key holds it, not the JSON). */
  private changes = 0

  constructor(
    private ledger: RewardsLedger,
    private readonly log: EventLog,
  ) {}

  /** The ledger as it is saved. */
  get value(): RewardsLedger {
    return this.ledger
  }

  /** A number that changes whenever what watchers get from here may have changed. */
  get version(): number {
    return this.changes
  }

  /** The server adopted `next` after `previous`: rounds that closed and epochs that ended are settled (logged per epoch). */
  observe(previous: CoordinatorState, next: CoordinatorState): void {
    const before = this.ledger
    this.ledger = observeTransition(before, previous, next)
    this.changed()
    if (this.ledger.epochs !== before.epochs) {
      const clients = Object.values(this.ledger.clients)
        .map((e) => ({client_id: e.client_id, earned: e.earned - (before.clients[e.client_id]?.earned ?? 0), slashed: e.slashed - (before.clients[e.client_id]?.slashed ?? 0)}))
        .filter((e) => e.earned > 0 || e.slashed > 0)
      this.log({event: 'epoch_rewards', epoch: previous.progress.epoch, clients})
    }
  }

  /**
   * A verifier's scores of a round's results (scored while the next round runs), taken by the ledger's rule (from a
   * verifier of the next round, for the trainers the seed assigned it: rewards.ts recordScores). Returns the refusal.
   */
  record(state: CoordinatorState, from: ClientId, step: number, scores: {client_id: ClientId; score: number}[]): {code: string; reason: string} | undefined {
    const fixed = scores.map((e) => ({client_id: e.client_id, score: scoreToFixed(e.score)}))
    const next = recordScores(this.ledger, state, from, step, fixed)
    if ('code' in next) return next
    this.ledger = next
    this.changed()
    this.log({event: 'scores', client: from, step, scores})
    return undefined
  }

  /** The verification scores (moving averages of what verifiers reported), by client id. */
  scores() {
    return scoreRows(this.ledger)
  }

  /** Each client's rewards in `state`: score, accepted rounds and batches, pending, earned and slashed points. */
  rewards(state: CoordinatorState) {
    return rewardRows(this.ledger, state)
  }

  /** The `scores` and `rewards` parts of a watcher's state, in `state`. */
  watcherJson(state: CoordinatorState): string {
    this.json ??= `,"scores":${JSON.stringify(scoreRows(this.ledger))},"rewards":${JSON.stringify(rewardRows(this.ledger, state))}`
    return this.json
  }

  private changed(): void {
    this.json = undefined
    this.changes++
  }
}
