import {Flags} from '@oclif/core'
import {CoordinatorConnection} from '../core/backend/index.js'
import {PsycheCommand} from '../core/cli/base-command.js'
import type {RewardRow} from '../core/coordinator/rewards.js'
import {generateIdentity} from '../core/protocol/index.js'

interface RewardsSummary {
  run_id: string
  epoch: number
  step: number
  clients: (RewardRow & {claimed: number | null})[]
}

export default class Rewards extends PsycheCommand {
  static summary = "List each client's verification score and points: earned, slashed, pending this epoch"
  static description = `Connects to the coordinator (psyche server run) as a watcher — it does not join — and prints the run's rewards
ledger: per client, the moving average of the scores verifiers gave its results (the loss its update removes on its
own batches, τemplar's s_i, normalised: src/core/verify/score.ts), the weight that gives its points, its accepted
results (rounds and batches), and its points: earned in finished epochs, pending for the current one, slashed
(withheld because it was ejected in their epoch).

A client earns floor(accepted batches × 1000 × weight) per epoch; weight = clamp(score / 0.2, 0, 1) in a run with
verifiers (nothing for an unscored, harmful or empty update), 1 in a run without. A centralized run pays nothing out,
so claimed is null.

--json prints {run_id, epoch, step, clients: [{client_id, score, weight, rounds, batches, pending, earned, slashed,
claimed}]}.`

  static examples = ['<%= config.bin %> rewards --server-addr 127.0.0.1:20000', '<%= config.bin %> rewards --server-addr host:20000 --json']

  static flags = {
    'server-addr': Flags.string({summary: 'the coordinator server, host:port', required: true}),
    'run-id': Flags.string({summary: 'expect this run (default: whichever run the server coordinates)'}),
    timeout: Flags.integer({summary: 'seconds to keep trying to reach the server', default: 5, min: 1}),
  }

  async run(): Promise<RewardsSummary> {
    const {flags} = await this.parse(Rewards)
    const conn = await CoordinatorConnection.connect({
      addr: flags['server-addr'],
      runId: flags['run-id'] ?? '',
      identity: generateIdentity(),
      p2pAddrs: [],
      join: false,
      reconnect: false,
      connectTimeoutMs: flags.timeout * 1000,
    })
    const state = conn.state!
    const summary: RewardsSummary = {
      run_id: state.run_id,
      epoch: state.progress.epoch,
      step: state.progress.step,
      clients: conn.rewards.map((r) => ({...r, claimed: null})),
    }
    await conn.close()
    if (!this.jsonEnabled()) for (const line of formatRewards(summary)) this.log(line)
    return summary
  }
}

function formatRewards(s: RewardsSummary): string[] {
  const lines = [`run ${s.run_id}: rewards at epoch ${s.epoch}, step ${s.step} (points: 1000 per accepted batch at full weight)`]
  if (s.clients.length === 0) return [...lines, 'no client has an accepted result or a score yet']
  const header = ['client', 'score', 'weight', 'rounds', 'batches', 'earned', 'pending', 'slashed']
  const rows = s.clients.map((c) => [
    `${c.client_id.slice(0, 16)}…`,
    c.score === null ? '-' : c.score.toFixed(3),
    c.weight.toFixed(2),
    String(c.rounds),
    String(c.batches),
    String(c.earned),
    String(c.pending),
    String(c.slashed),
  ])
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i].length)))
  const line = (cells: string[]) => cells.map((c, i) => (i === 0 ? c.padEnd(widths[i]) : c.padStart(widths[i]))).join('  ')
  return [...lines, line(header), ...rows.map(line)]
}
