import {Flags} from '@oclif/core'
import {CoordinatorConnection} from '../core/backend/index.js'
import {readRunLedger} from '../core/backend/solana/admin.js'
import {RpcChain} from '../core/backend/solana/chain.js'
import {ledgerRows} from '../core/backend/solana/layout.js'
import {PsycheCommand} from '../core/cli/base-command.js'
import {parseAddress} from '../core/cli/solana-flags.js'
import {PsycheError} from '../core/errors.js'
import {clientTable, serveDashboard} from '../core/obs/dashboard.js'
import {RunHistory} from '../core/obs/history.js'
import {coordinatorSeconds, summarizeRun} from '../core/obs/summary.js'
import {watchRun} from '../core/obs/watch.js'
import {generateIdentity} from '../core/protocol/index.js'

export default class Dashboard extends PsycheCommand {
  static summary = 'Serve a dashboard page for a run: its state, live plots and the client table, from a coordinator you can reach'
  static description = `Connects to the coordinator (psyche server run) as a watcher — it does not join — and serves a web page
with the run's phase, round, epoch and witness quorum, plots of loss, throughput, round time (compute vs
coordination), participation and P2P bytes, and a table of the clients. The clients' reports reach it through
the coordinator from the moment it connects; with --history-file the history is saved there (atomically) and
reloaded on the next start. A coordinator started with --dashboard-port serves the same page with the whole
run's history. Runs until SIGINT/SIGTERM; --json prints {"event":"dashboard_listening","url":...} first.

With --rpc (and --program-id, --run-id) it shows a run on Solana instead, read from its coordinator account every
--poll-interval seconds: the run's state and the client table with each client's points from the ledger the program
keeps there (as psyche rewards --rpc; no scores, and no plots: clients report their figures to a server only).`

  static examples = [
    '<%= config.bin %> dashboard --server-addr 127.0.0.1:20000 --dashboard-port 8080',
    '<%= config.bin %> dashboard --server-addr host:20000 --history-file run-history.json',
    '<%= config.bin %> dashboard --rpc http://127.0.0.1:8899 --program-id <ID> --run-id my-run',
  ]

  static flags = {
    'server-addr': Flags.string({summary: 'the coordinator server, host:port', exactlyOne: ['server-addr', 'rpc']}),
    rpc: Flags.string({summary: 'a run on Solana: JSON-RPC URL of the cluster (several, comma-separated)', exactlyOne: ['server-addr', 'rpc'], env: 'PSYCHE_SOLANA_RPC'}),
    'program-id': Flags.string({summary: 'Solana: the coordinator program', env: 'PSYCHE_COORDINATOR_PROGRAM', dependsOn: ['rpc']}),
    'poll-interval': Flags.integer({summary: 'Solana: seconds between reads of the coordinator account', default: 2, min: 1}),
    'run-id': Flags.string({summary: 'expect this run (default: whichever run the server coordinates); required with --rpc'}),
    'dashboard-port': Flags.integer({summary: 'port of the page (0: any free port)', default: 0, min: 0, max: 65535}),
    host: Flags.string({summary: 'address the page listens on', default: '127.0.0.1'}),
    'history-file': Flags.string({summary: 'keep the metrics history in this file (JSON, written atomically) across restarts'}),
  }

  async run(): Promise<void> {
    const {flags} = await this.parse(Dashboard)
    const json = this.jsonEnabled()
    const say = (event: Record<string, unknown>, text: string) => {
      if (json) process.stdout.write(`${JSON.stringify(event)}\n`)
      else process.stderr.write(`${text}\n`)
    }
    if (flags.rpc) return this.solana(flags.rpc, flags['program-id'], flags['run-id'], flags['poll-interval'], {port: flags['dashboard-port'], host: flags.host}, say)
    const conn = await CoordinatorConnection.connect({addr: flags['server-addr']!, runId: flags['run-id'] ?? '', identity: generateIdentity(), p2pAddrs: [], join: false})
    const history = RunHistory.open(conn.runId, {path: flags['history-file']})
    const state = watchRun(conn, history)
    conn.on('disconnected', () => say({event: 'disconnected'}, `lost the coordinator ${flags['server-addr']}; reconnecting`))
    conn.on('reconnected', () => say({event: 'reconnected'}, `reconnected to ${flags['server-addr']}`))
    const summary = () => summarizeRun(state(), coordinatorSeconds(conn.serverTime ?? Date.now() / 1000))
    const page = await serveDashboard(
      {
        summary,
        history: (since) => history.history(since),
        clients: () =>
          clientTable(
            summary(),
            state().pending,
            Object.entries(conn.peers)
              .filter(([, a]) => a.length > 0)
              .map(([id]) => id),
            history.clientRows(),
            conn.rewards,
          ),
        saveState: () => conn.saveState,
      },
      {port: flags['dashboard-port'], host: flags.host},
    )
    say({event: 'dashboard_listening', url: page.url, port: page.port, run_id: conn.runId}, `dashboard of run ${conn.runId}: ${page.url}`)
    await this.shutdown.requested()
    await page.close()
    await conn.close()
    history.save()
  }

  /** A run on Solana: its coordinator account (state and rewards ledger), read every `pollSeconds`. */
  private async solana(
    rpc: string,
    program: string | undefined,
    runId: string | undefined,
    pollSeconds: number,
    listen: {port: number; host: string},
    say: (event: Record<string, unknown>, text: string) => void,
  ): Promise<void> {
    if (!runId) throw new PsycheError('--run-id is required with --rpc', {code: 'EUSAGE'})
    const target = {chain: new RpcChain(rpc), programId: parseAddress(program, 'program-id'), runId}
    let latest = await readRunLedger(target)
    let failing = false
    let timer: NodeJS.Timeout | undefined
    let stopped = false
    const poll = () => {
      if (stopped) return
      timer = setTimeout(() => {
        readRunLedger(target)
          .then(
            (read) => {
              latest = read
              if (failing) say({event: 'reconnected'}, `reading run ${runId} again`)
              failing = false
            },
            (error: Error) => {
              if (!failing) say({event: 'disconnected', message: error.message}, `cannot read run ${runId}: ${error.message}; retrying`)
              failing = true
            },
          )
          .finally(poll)
      }, pollSeconds * 1000)
    }
    poll()
    const summary = () => summarizeRun(latest.run.state, Date.now() / 1000)
    const page = await serveDashboard(
      {
        summary,
        history: () => [],
        clients: () => clientTable(summary(), latest.run.state.pending, [], [], ledgerRows(latest.ledger, latest.run.state)),
      },
      listen,
    )
    say({event: 'dashboard_listening', url: page.url, port: page.port, run_id: runId}, `dashboard of run ${runId} on Solana: ${page.url}`)
    await this.shutdown.requested()
    stopped = true
    clearTimeout(timer)
    await page.close()
  }
}
