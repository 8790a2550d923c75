/**
 * Client events as people read them (join's plain lines and live view, the testnet's view): a severity, so that
 * news (a model loaded, a rejoin) is not shown as a warning, and a sentence instead of the event's raw JSON.
 * `--json` keeps the events themselves.
 */
export type Severity = 'info' | 'warning' | 'error'

const short = (v: unknown, n = 12) => String(v ?? '').slice(0, n)
const list = (v: unknown) => (Array.isArray(v) ? v.map((x) => `${short(x)}…`).join(', ') : '')

/** Events that report something going wrong (warning) or a failure (error); every other event is news (info). */
const SEVERITY: Record<string, Severity> = {
  worker_crashed: 'error',
  checkpoint_rejected: 'error',
  checkpoint_save_failed: 'error',
  rejected: 'warning',
  out_of_sync: 'warning',
  health_check: 'warning',
  result_fetch_failed: 'warning',
  model_fetch_failed: 'warning',
  model_peer_dropped: 'warning',
  checkpoint_late: 'warning',
  no_exchange: 'warning',
  banned: 'warning',
}

export function eventSeverity(e: {event: string}): Severity {
  return SEVERITY[e.event] ?? 'info'
}

/** A sentence for the event; for a kind without one, its name and fields as `key value`, never raw JSON. */
export function describeEvent(e: Record<string, unknown> & {event: string}): string {
  switch (e.event) {
    case 'model_loaded':
      return `model loaded at step ${e.step} from ${e.source} (hash ${short(e.param_hash)})`
    case 'rejoining':
      return `rejoining the run at its next epoch (the coordinator is in ${e.run_state})`
    case 'reconnected':
      return `reconnected to the coordinator${e.addr ? ` ${e.addr}` : e.rpc ? ` ${e.rpc}` : ''}`
    case 'worker_restarted':
      return `worker restarted (restart ${e.restarts}); rejoining at the next epoch with the model from a peer`
    case 'worker_crashed':
      return `worker crashed: ${e.message}${e.restarting ? ' (restarting it)' : ''}`
    case 'waiting':
      return `waiting: ${e.detail}`
    case 'out_of_sync':
    case 'no_exchange':
    case 'banned':
      return `${e.event.replace(/_/g, ' ')}: ${e.detail}`
    case 'health_check':
      return `health check at step ${e.step}: ${list(e.accused) || 'nobody'} accused of not training (${e.judged} judged)`
    case 'rejected':
      return `rejected${e.peer ? ` from ${short(e.peer, 16)}…` : ''}: ${e.reason} (${e.code})`
    case 'result_fetch_failed':
      return `could not fetch ${short(e.client_id, 16)}…'s result for step ${e.step}: ${e.message}`
    case 'model_fetch_failed':
      return `could not fetch the model${e.client_id ? ` from ${short(e.client_id, 16)}…` : ''}: ${e.reason ?? e.message ?? 'unknown reason'}`
    case 'model_peer_dropped':
      return `stopped fetching the model from ${short(e.client_id, 16)}…: ${e.reason}`
    case 'checkpoint_late':
      return `checkpoint of step ${e.step} not on the Hub yet (${e.repo_id}@${e.revision}): ${e.reason}`
    case 'checkpoint_rejected':
      return `checkpoint of step ${e.step} rejected: ${e.message}`
    case 'checkpoint_save_failed':
      return `could not save the model at step ${e.step}: ${e.message}`
    default: {
      const fields = Object.entries(e)
        .filter(([k, v]) => k !== 'event' && k !== 'source' && v !== undefined && v !== null)
        .map(([k, v]) => `${k} ${typeof v === 'object' ? JSON.stringify(v) : String(v)}`)
      return `${e.event.replace(/_/g, ' ')}${fields.length ? `: ${fields.join(', ')}` : ''}`
    }
  }
}
