import type {ClientContext} from './context.js'

/** Applied rounds in a row without any peer's result (while others trained) before the no_exchange warning. */
export const NO_EXCHANGE_WARN_ROUNDS = 3

/**
 * Exchange health. Loud, not silent: a round in which others trained but none of their results reached us is a
 * failure of the network, not a good round. After NO_EXCHANGE_WARN_ROUNDS such rounds in a row we say so, naming
 * the peers we could not dial and the addresses we tried (then again every 10 rounds while it lasts).
 */
export class ExchangeHealth {
  private noExchangeRounds = 0

  constructor(private readonly ctx: ClientContext) {}

  afterRound(step: number, peersApplied: number, otherTrainers: number): void {
    if (peersApplied > 0 || otherTrainers === 0) {
      this.noExchangeRounds = 0
      return
    }
    this.noExchangeRounds++
    const n = this.noExchangeRounds
    if (n < NO_EXCHANGE_WARN_ROUNDS || (n - NO_EXCHANGE_WARN_ROUNDS) % 10 !== 0) return
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
    })
  }
}
