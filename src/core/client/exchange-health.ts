import {PsycheError} from '../errors.js'
import type {ClientContext} from './context.js'

/** Applied rounds in a row without any peer's result (while others trained) before the no_exchange warning. */
const NO_EXCHANGE_WARN_ROUNDS = 3
/** join --max-rounds-without-exchange's default: a client that reaches no peer for this many rounds leaves. */
export const DEFAULT_MAX_ROUNDS_WITHOUT_EXCHANGE = 20

/**
 * Exchange health. Loud, not silent: a round in which others trained but none of their results reached us is a
 * failure of the network, not a good round. After NO_EXCHANGE_WARN_ROUNDS such rounds in a row we say so, naming
 * the peers we could not dial and the addresses we tried (then again every 10 rounds while it lasts).
 */
export class ExchangeHealth {
  private noExchangeRounds = 0

  constructor(private readonly ctx: ClientContext) {}

  /** Counts this round: the rounds in a row, this one included, in which others trained and none of their results arrived. */
  count(peersApplied: number, otherTrainers: number): number {
    this.noExchangeRounds = peersApplied > 0 || otherTrainers === 0 ? 0 : this.noExchangeRounds + 1
    return this.noExchangeRounds
  }

  /**
   * Warns (no_exchange) after the counted round; with opts.maxRoundsWithoutExchange, at that many such rounds in a
   * row it throws a PsycheError (code ENOEXCHANGE): the client withdraws rather than train alone.
   */
  afterRound(step: number, otherTrainers: number): void {
    const n = this.noExchangeRounds
    if (n === 0) return
    const max = this.ctx.opts.maxRoundsWithoutExchange ?? 0
    const leaving = max > 0 && n >= max
    if (!leaving && (n < NO_EXCHANGE_WARN_ROUNDS || (n - NO_EXCHANGE_WARN_ROUNDS) % 10 !== 0)) return
    const p2p = this.ctx.p2p
    const unreachable = (p2p.unreachablePeers?.() ?? []).map((f) => ({peer_id: f.peer_id, addrs: f.addrs, reason: f.reason.slice(0, 300)}))
    this.ctx.log({
      event: 'no_exchange',
      step,
      rounds: n,
      other_trainers: otherTrainers,
      peers: p2p.stats().peers,
      unreachable,
      detail: `applied no peer's results for ${n} rounds while ${otherTrainers} other client(s) trained: this client trains alone`,
      ...(leaving ? {leaving: true} : {}),
    })
    if (leaving) {
      const names = unreachable.map((u) => `${u.peer_id} (${u.reason})`).join('; ')
      throw new PsycheError(
        `applied no other client's results for ${n} rounds in a row while ${otherTrainers} other client(s) trained (--max-rounds-without-exchange ${max}): this client cannot reach its peers${names ? `; could not dial: ${names}` : ''}. See the README, "Training across machines".`,
        {code: 'ENOEXCHANGE'},
      )
    }
  }
}
