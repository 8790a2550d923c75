import {Flags} from '@oclif/core'
import {CoordinatorConnection} from '../core/backend/index.js'
import {readRunLedger, readTreasury, withClaims} from '../core/backend/solana/admin.js'
import {RpcChain} from '../core/backend/solana/chain.js'
import {coordinatorAddress} from '../core/backend/solana/instructions.js'
import {ledgerRows} from '../core/backend/solana/layout.js'
import {PsycheCommand} from '../core/cli/base-command.js'
import {parseAddress} from '../core/cli/solana-flags.js'
import {POINTS_PER_BATCH, type RewardRow} from '../core/coordinator/rewards.js'
import {PsycheError} from '../core/errors.js'
import {generateIdentity} from '../core/protocol/index.js'

interface RewardsSummary {
  run_id: string
  epoch: number
  step: number
  /** Points per accepted batch at full weight, and (Solana) token base units a claim pays per point. */
  points_per_batch: number
  token_rate: number | null
  /** Solana: the coordinator account the ledger was read from. */
  coordinator?: string
  /** Solana with --treasurer-id: the run's treasury (null: none yet); token amounts as decimal strings. */
  treasury?: {address: string; mint: string; vault: string; balance: string; funded: string; paid: string; claimed: number} | null
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
verifiers (nothing for an unscored, harmful or empty update), 1 in a run without. Scores are kept in fixed point
(parts per million) with one integer rule on both backends. A centralized run pays nothing out, so claimed is null.

With --rpc (and --program-id, --run-id) it reads the ledger a run on Solana keeps in its coordinator account (the
same rule, applied by the program: programs/README.md, Rewards ledger): the scores its verifiers reported on chain
(report_scores), the weight they give, and, with --treasurer-id, the points each client claimed from the run's
treasury (its participant record in the treasurer program; null without --treasurer-id).

--json prints {run_id, epoch, step, points_per_batch, token_rate, coordinator (Solana), treasury (Solana with
--treasurer-id: {address, mint, vault, balance, funded, paid, claimed}, token amounts as decimal strings; null: none
yet), clients: [{client_id, score, weight, rounds, batches, pending, earned, slashed, claimed}]}.`

  static examples = [
    '<%= config.bin %> rewards --server-addr 127.0.0.1:20000',
    '<%= config.bin %> rewards --server-addr host:20000 --json',
    '<%= config.bin %> rewards --rpc http://127.0.0.1:8899 --program-id <ID> --run-id my-run',
  ]

  static flags = {
    'server-addr': Flags.string({summary: 'the coordinator server, host:port', exactlyOne: ['server-addr', 'rpc']}),
    rpc: Flags.string({summary: 'a run on Solana: JSON-RPC URL of the cluster (several, comma-separated)', exactlyOne: ['server-addr', 'rpc'], env: 'PSYCHE_SOLANA_RPC'}),
    'program-id': Flags.string({summary: 'Solana: the coordinator program', env: 'PSYCHE_COORDINATOR_PROGRAM', dependsOn: ['rpc']}),
    'treasurer-id': Flags.string({summary: 'Solana: the treasurer program (claimed points)', env: 'PSYCHE_TREASURER_PROGRAM', dependsOn: ['rpc']}),
    'run-id': Flags.string({summary: 'expect this run (default: whichever run the server coordinates); required with --rpc'}),
    timeout: Flags.integer({summary: 'seconds to keep trying to reach the server', default: 5, min: 1}),
  }

  async run(): Promise<RewardsSummary> {
    const {flags} = await this.parse(Rewards)
    if (flags.rpc) {
      const summary = await solanaRewards(flags.rpc, flags['program-id'], flags['treasurer-id'], flags['run-id'])
      if (!this.jsonEnabled()) for (const line of formatRewards(summary)) this.log(line)
      return summary
    }
    const conn = await CoordinatorConnection.connect({
      addr: flags['server-addr']!,
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
      points_per_batch: POINTS_PER_BATCH,
      token_rate: null,
      clients: conn.rewards.map((r) => ({...r, claimed: null})),
    }
    await conn.close()
    if (!this.jsonEnabled()) for (const line of formatRewards(summary)) this.log(line)
    return summary
  }
}

/** The ledger a run on Solana keeps in its coordinator account. */
async function solanaRewards(rpc: string, program: string | undefined, treasurer: string | undefined, runId: string | undefined): Promise<RewardsSummary> {
  if (!runId) throw new PsycheError('--run-id is required with --rpc', {code: 'EUSAGE'})
  const programId = parseAddress(program, 'program-id')
  const target = {chain: new RpcChain(rpc), programId, runId, treasurer: treasurer === undefined ? undefined : parseAddress(treasurer, 'treasurer-id')}
  const {run, ledger} = await readRunLedger(target)
  return {
    run_id: run.state.run_id,
    epoch: run.state.progress.epoch,
    step: run.state.progress.step,
    points_per_batch: ledger.points_per_batch,
    token_rate: ledger.token_rate,
    coordinator: await coordinatorAddress(programId, runId),
    ...(target.treasurer ? {treasury: await treasurySummary({...target, treasurer: target.treasurer})} : {}),
    clients: await withClaims(target, ledgerRows(ledger, run.state)),
  }
}

async function treasurySummary(t: Parameters<typeof readTreasury>[0]): Promise<RewardsSummary['treasury']> {
  const found = await readTreasury(t)
  if (!found) return null
  const {address, treasury, balance} = found
  return {address, mint: treasury.mint, vault: treasury.vault, balance: String(balance), funded: String(treasury.funded), paid: String(treasury.paid), claimed: treasury.claimed}
}

function formatRewards(s: RewardsSummary): string[] {
  const where = s.coordinator ? ` on Solana (coordinator ${s.coordinator})` : ''
  const rate = s.token_rate === null ? '' : s.token_rate > 0 ? `; a claim pays ${s.token_rate} token units per point` : '; no token rate set'
  const lines = [`run ${s.run_id}${where}: rewards at epoch ${s.epoch}, step ${s.step} (points: ${s.points_per_batch} per accepted batch at full weight${rate})`]
  if (s.treasury === null) lines.push('no treasury yet (its main authority creates one with psyche rewards fund --mint)')
  else if (s.treasury)
    lines.push(
      `treasury ${s.treasury.address}: holds ${s.treasury.balance} token units of ${s.treasury.mint}; ${s.treasury.paid} paid out for ${s.treasury.claimed} points claimed`,
    )
  if (s.clients.length === 0) return [...lines, 'no client has an accepted result or a score yet']
  const claimed = s.clients.some((c) => c.claimed !== null)
  const header = ['client', 'score', 'weight', 'rounds', 'batches', 'earned', 'pending', 'slashed', ...(claimed ? ['claimed'] : [])]
  const rows = s.clients.map((c) => [
    `${c.client_id.slice(0, 16)}…`,
    c.score === null ? '-' : c.score.toFixed(3),
    c.weight.toFixed(2),
    String(c.rounds),
    String(c.batches),
    String(c.earned),
    String(c.pending),
    String(c.slashed),
    ...(claimed ? [String(c.claimed ?? 0)] : []),
  ])
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i].length)))
  const line = (cells: string[]) => cells.map((c, i) => (i === 0 ? c.padEnd(widths[i]) : c.padStart(widths[i]))).join('  ')
  return [...lines, line(header), ...rows.map(line)]
}
