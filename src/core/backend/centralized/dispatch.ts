import type {ClientId, CoordinatorEvent, CoordinatorState} from '../../coordinator/types.js'
import type {PsycheEvent} from '../../events.js'
import type {ClientEnvelope, ReportBody} from '../../protocol/messages.js'

/**
 * What the server does with a client's message once its connection's checks passed (sessions.ts):
 * - `hello`: the connection is bound to its client, then a join is an event like any other;
 * - `event`: an event of the coordinator, through the server's one path (admission, the coordinator, the answer);
 * - `refuse`: answered with `rejected`, a strike of the connection (a stale witness or health check, a late report
 *   or one of someone who did not train; an honest client's taken messages earn its occasional late one back);
 * - `report`, `scores`, `addresses`, `resync`: the server's own business (display, the rewards ledger, the peer
 *   directory, a whole state), never an event of the coordinator.
 */
type Dispatch =
  | {to: 'hello'; hello: Extract<ClientEnvelope, {kind: 'hello'}>}
  | {to: 'event'; event: CoordinatorEvent}
  | {to: 'refuse'; code: string; reason: string}
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
      if (m.step < oldest) return {to: 'refuse', code: 'stale_step', reason: `${m.kind} for step ${m.step}, but the run is at step ${current}`}
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
      if (m.step > current || m.step < current - 2) return {to: 'refuse', code: 'stale_step', reason: `report for step ${m.step}, but the run is at step ${current}`}
      // Only a trainer of a recent round has anything to report: anyone else's numbers would reach dashboards and history.
      const trainers = [state.epoch.round, state.epoch.previous_round].flatMap((r) => r?.roster ?? [])
      if (!trainers.includes(from)) return {to: 'refuse', code: 'not_a_trainer', reason: `client ${from} trained in neither of the last two rounds`}
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

/**
 * How the server answers the outcome of a client's event: the line it logs when taken (a join: `joined`, or
 * `rejoined` when the client is in the run already, as after a server restart: nothing to refuse), else the refusal.
 * The coordinator's refusals are normal in a distributed run (late proofs...): answered, not counted as violations.
 */
export function verdict(
  event: CoordinatorEvent,
  error: {code: string; message: string} | undefined,
  who: {peer: string; client: ClientId; of: string},
): {ok: true; line: PsycheEvent} | {ok: false; code: string; reason: string} {
  const {peer, client} = who
  if (event.type === 'join' && error?.code === 'AlreadyJoined') return {ok: true, line: {event: 'rejoined', peer, client, detail: error.message}}
  if (error) return {ok: false, code: error.code, reason: error.message}
  if (event.type === 'join') return {ok: true, line: {event: 'joined', peer, client}}
  return {ok: true, line: {event: 'accepted', peer, client, kind: who.of}}
}
