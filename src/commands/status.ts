import {Flags} from '@oclif/core'
import {CoordinatorConnection} from '../core/backend/index.js'
import {PsycheCommand} from '../core/cli/base-command.js'
import {coordinatorSeconds, summarizeRun, timeLeftText, type RunSummary} from '../core/obs/summary.js'
import {generateIdentity} from '../core/protocol/index.js'
import type {ClientScore} from '../core/verify/scoreboard.js'

export default class Status extends PsycheCommand {
  static summary = 'Print a one-shot summary of a run: its phase, round, epoch, progress, clients and witness quorum'
  static description = `Connects to the coordinator (psyche server run) as a watcher — it does not join — reads the run's current
state, prints it and exits. With --json, one object: {run_id, run_state, epoch, step, total_steps, progress,
phase_elapsed_seconds, phase_time_left_seconds (a round's is its timeout), epoch_time_left_seconds, clients: [{id, state}], clients_by_state: {healthy, dropped,
withdrawn, ejected, pending}, round: {step, height, batch_size, trainers, witnesses_expected, witness_proofs,
witness_quorum} | null, pause_pending, peers, scores: [{client_id, average, last, last_step, verifiers, count}]}:
scores are the moving averages of the verification scores verifiers reported for each client's results.`

  static examples = ['<%= config.bin %> status --server-addr 127.0.0.1:20000', '<%= config.bin %> status --server-addr host:20000 --json']

  static flags = {
    'server-addr': Flags.string({summary: 'the coordinator server, host:port', required: true}),
    'run-id': Flags.string({summary: 'expect this run (default: whichever run the server coordinates)'}),
    timeout: Flags.integer({summary: 'seconds to keep trying to reach the server', default: 5, min: 1}),
  }

  async run(): Promise<StatusSummary> {
    const {flags} = await this.parse(Status)
    const conn = await CoordinatorConnection.connect({
      addr: flags['server-addr'],
      runId: flags['run-id'] ?? '',
      identity: generateIdentity(),
      p2pAddrs: [],
      join: false,
      reconnect: false,
      connectTimeoutMs: flags.timeout * 1000,
    })
    const summary: StatusSummary = {
      ...summarizeRun(conn.state!, coordinatorSeconds(conn.serverTime ?? Date.now() / 1000)),
      peers: Object.values(conn.peers).filter((a) => a.length > 0).length,
      scores: conn.scores,
    }
    await conn.close()
    if (!this.jsonEnabled()) for (const line of formatSummary(summary)) this.log(line)
    return summary
  }
}

export type StatusSummary = RunSummary & {peers: number; scores?: ClientScore[]}

export function formatSummary(s: StatusSummary): string[] {
  const left = timeLeftText(s) ? `, ${timeLeftText(s)}` : ''
  const c = s.clients_by_state
  const lines = [
    `run ${s.run_id}: ${s.run_state} (${s.phase_elapsed_seconds}s in phase${left})`,
    `epoch ${s.epoch}, step ${s.step} of ${s.total_steps} (${(s.progress * 100).toFixed(1)}%)`,
    `clients: ${c.healthy} healthy, ${c.dropped} dropped, ${c.withdrawn} withdrawn, ${c.ejected} ejected, ${c.pending} waiting for the next epoch; ${s.peers} in the peer directory`,
  ]
  if (s.round)
    lines.push(
      `round ${s.round.step} (height ${s.round.height}): ${s.round.trainers} trainers, batch ${s.round.batch_size}, witness proofs ${s.round.witness_proofs}/${s.round.witnesses_expected} (quorum ${s.round.witness_quorum})`,
    )
  if (s.pause_pending) lines.push('a pause is pending (at the end of the epoch)')
  const scores = new Map((s.scores ?? []).map((x) => [x.client_id, x]))
  for (const client of s.clients) {
    const sc = scores.get(client.id)
    lines.push(`  ${client.id.slice(0, 16)}…  ${client.state}${sc ? `  score ${sc.average.toFixed(3)} (${sc.count} reports, last step ${sc.last_step})` : ''}`)
  }
  return lines
}
