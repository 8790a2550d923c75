import type {CoordinatorConnection} from '../backend/index.js'
import type {CoordinatorState} from '../coordinator/types.js'
import type {ClientReportBody} from '../protocol/index.js'
import type {RunHistory} from './history.js'

/**
 * Feeds a history from a watcher's connection (join: false): phase changes are differences between two pushed
 * states (a watcher sees states, not the server's events), and the clients' reports arrive forwarded by the server.
 * Returns the latest state, as a getter.
 */
export function watchRun(conn: CoordinatorConnection, history: RunHistory): () => CoordinatorState {
  let last: CoordinatorState = conn.state!
  conn.on('state', (s: CoordinatorState) => {
    if (s.run_state !== last.run_state || s.progress.step !== last.progress.step)
      history.observe({event: 'transition', from: last.run_state, to: s.run_state, step: s.progress.step}, s)
    last = s
  })
  conn.on('client_report', (r: ClientReportBody) => history.observe({event: 'client_report', client: r.client, step: r.step, ...r.report}, last))
  return () => last
}
