import type {ClientId, CoordinatorEvent, CoordinatorState} from '../../coordinator/types.js'
import type {ClientEnvelope, ReportBody} from '../../protocol/messages.js'

/**
 * What the server does with a client's message once its connection's checks passed (sessions.ts):
 * - `hello`: the connection is bound to its client, and joins the run if it asks to;
 * - `event`: an event of the coordinator;
 * - `refuse`: answered with `rejected`: a stale witness or health check counts as a violation (strike), a late
 *   report or one of someone who did not train does not;
 * - `report`, `scores`, `addresses`, `resync`: the server's own business (display, the rewards ledger, the peer
 *   directory, a whole state), never an event of the coordinator.
 */
type Dispatch =
  | {to: 'hello'; hello: Extract<ClientEnvelope, {kind: 'hello'}>}
  | {to: 'event'; event: CoordinatorEvent}
  | {to: 'refuse'; code: string; reason: string; strike: boolean}
  | {to: 'report'; step: number; report: ReportBody}
  | {to: 'scores'; step: number; scores: {client_id: ClientId; score: number}[]}
  | {to: 'addresses'; addrs: string[]}
  | {to: 'resync'}

/**
 * Where a message goes, given the state the server holds (pure but for `entropy`: the server's, drawn for each witness,
 * as a tick's, since the last warmup witness starts the first round and so seeds it).
 */
export function dispatch(m: ClientEnvelope, state: CoordinatorState, entropy: () => string): Dispatch {
  const from = m.from
  const current = state.progress.step
  switch (m.kind) {
    case 'hello':
      return {to: 'hello', hello: m}
    case 'witness':
    case 'health_check': {
      // Witness proofs and health checks are about a step; anything older than the current one is stale or replayed.
      // (A Cooldown witness attests the epoch's last round, the step before the run's.)
      const oldest = m.kind === 'witness' && m.body.param_hash !== undefined ? current - 1 : current
      if (m.step < oldest) return {to: 'refuse', code: 'stale_step', reason: `${m.kind} for step ${m.step}, but the run is at step ${current}`, strike: true}
      if (m.kind === 'health_check') return {to: 'event', event: {type: 'health_check', from, accused: m.body.accused}}
      const {proof, param_hash} = m.body
      return {to: 'event', event: {type: 'witness', from, step: m.step, proof, entropy: entropy(), ...(param_hash === undefined ? {} : {param_hash})}}
    }
    case 'accuse':
      return {to: 'event', event: {type: 'accuse', from, step: m.step, accused: m.body.accused, reason: m.body.reason}}
    case 'equivocation':
      return {to: 'event', event: {type: 'equivocation', from, proof: m.body.proof}}
    case 'withdraw':
      return {to: 'event', event: {type: 'withdraw', id: from}}
    case 'checkpoint':
      return {to: 'event', event: {type: 'checkpoint', from, repo: m.body.repo, ...(m.body.param_hash === undefined ? {} : {param_hash: m.body.param_hash})}}
    case 'report': {
      // Display only: logged for the metrics and dashboard layers, and forwarded to watchers.
      if (m.step > current || m.step < current - 2) return {to: 'refuse', code: 'stale_step', reason: `report for step ${m.step}, but the run is at step ${current}`, strike: false}
      // Only a trainer of a recent round has anything to report: anyone else's numbers would reach dashboards and history.
      const trainers = [state.epoch.round, state.epoch.previous_round].flatMap((r) => r?.roster ?? [])
      if (!trainers.includes(from)) return {to: 'refuse', code: 'not_a_trainer', reason: `client ${from} trained in neither of the last two rounds`, strike: false}
      return {to: 'report', step: m.step, report: m.body}
    }
    case 'scores':
      return {to: 'scores', step: m.step, scores: m.body.scores}
    case 'addresses':
      return {to: 'addresses', addrs: m.body.p2p_addrs}
    case 'resync':
      return {to: 'resync'}
  }
}
