import type {ClientId} from '../../coordinator/types.js'
import {MAX_FORWARDED_REPORTS, type ReportBody} from '../../protocol/messages.js'

/**
 * The round trainers' recent reports (display only, never an event of the coordinator), numbered, for watchers: each
 * watcher's next state carries the ones it has not had. The last MAX_FORWARDED_REPORTS are kept.
 */
export class ReportFeed {
  private readonly reports: {seq: number; json: string}[] = []
  private seq = 0

  /** The number of the latest report (0: none yet). */
  get latest(): number {
    return this.seq
  }

  add(client: ClientId, step: number, report: ReportBody): void {
    this.reports.push({seq: ++this.seq, json: JSON.stringify({client, step, report})})
    if (this.reports.length > MAX_FORWARDED_REPORTS) this.reports.splice(0, this.reports.length - MAX_FORWARDED_REPORTS)
  }

  /** The reports after number `since`, as the `reports` part of a watcher's state (empty when none). */
  since(since: number): string {
    if (since >= this.seq) return ''
    const fresh = this.reports.filter((r) => r.seq > since)
    return fresh.length === 0 ? '' : `,"reports":[${fresh.map((r) => r.json).join(',')}]`
  }
}
