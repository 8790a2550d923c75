import {Flags} from '@oclif/core'
import {join} from 'node:path'
import {CoordinatorServer, DEFAULT_LIMITS, DEFAULT_MAX_SAVE_FAILURES, DEFAULT_PASSIVE_STATE_MS, serverIdentity} from '../../core/backend/index.js'
import {PsycheCommand} from '../../core/cli/base-command.js'
import {relayFlags, relayOptionsFromFlags} from '../../core/cli/relay-flags.js'
import {checkDataServerForRun, formatIssue, loadRunConfigFile} from '../../core/config/index.js'
import {openDataServer, type DataServer} from '../../core/data/index.js'
import {parseHostPort} from '../../core/protocol/address.js'
import {PsycheError} from '../../core/errors.js'
import {clientTable, serveDashboard} from '../../core/obs/dashboard.js'
import {HISTORY_FILE, RunHistory} from '../../core/obs/history.js'
import {ServerMetrics, serveMetrics} from '../../core/obs/metrics.js'
import {checkpointNotSavedText, summarizeRun} from '../../core/obs/summary.js'
import {historyFigures, startTerminalView, Warnings} from '../../core/obs/terminal-view.js'
import {peerIdOfClient} from '../../core/p2p/index.js'
import {RelayNode} from '../../core/p2p/relay.js'
import {loadIdentity} from '../../core/protocol/index.js'
import type {PsycheEvent} from '../../core/events.js'
import {MAX_CLIENTS} from '../../core/layout/layout-table.js'

export default class ServerRun extends PsycheCommand {
  static summary = "Run the centralized coordinator: a TCP server that owns the run's state and ticks it"
  static description = `Loads the state.toml, listens for clients (psyche join), ticks the coordinator every --tick-ms and after every accepted message, and pushes each new state to every connected client. Every message is signed, bound to the run, the connection and the step; anything else is refused with a logged reason. With --save-state-dir (created if missing) the state is saved atomically after every transition and a restarted server resumes from it; a failed save is an error in the log, status, the dashboard and /metrics, and after --max-save-failures failures in a row the server halts and exits 1. With --data-config it also serves the run's token data (data_location.Server). Runs until SIGINT/SIGTERM.

It also runs a libp2p circuit relay v2 (unless --no-relay), signed with the server's identity: every client is
told its address in the welcome (as that client reached the server) and reserves a slot on it, so clients
behind NAT reach each other through it, then connect directly (WebRTC over UDP, or TCP hole punching) where their
NATs allow. Beside it runs a STUN server (UDP, --stun-port) that tells clients their NAT mappings. The relay's
limits per relayed connection are flags (--relay-data-limit-mb, --relay-duration-limit-s).

--json prints one JSON object per line on stdout; the first is {"event":"listening","port":...}.`
  static examples = [
    '<%= config.bin %> server run --state state.toml --server-port 20000',
    '<%= config.bin %> server run --state state.toml --host 0.0.0.0 --save-state-dir ./saved --identity server.json --json',
  ]

  static flags = {
    state: Flags.string({summary: "path to the run's state.toml", required: true}),
    'data-config': Flags.string({summary: 'also serve token data with this data.toml, on the port of model.LLM.data_location.Server'}),
    'server-port': Flags.integer({summary: 'TCP port for clients (0: any free port)', default: 0, min: 0, max: 65535}),
    host: Flags.string({summary: 'address to listen on (default every IPv4 interface; 127.0.0.1 for this machine only)', default: '0.0.0.0'}),
    'save-state-dir': Flags.string({summary: 'save the coordinator state here after every transition (the directory is created), and resume from it'}),
    'max-save-failures': Flags.integer({
      summary: 'saves of the state that may fail in a row (tried again every second) before the server stops the run and exits 1',
      default: DEFAULT_MAX_SAVE_FAILURES,
      min: 1,
    }),
    'withdraw-on-disconnect': Flags.string({summary: 'withdraw clients whose connection closes', options: ['true', 'false'], default: 'true'}),
    identity: Flags.string({summary: "the server's identity file (psyche identity new); default: kept in --save-state-dir, else random"}),
    'tick-ms': Flags.integer({summary: 'how often to tick the coordinator, in milliseconds', default: 200, min: 10}),
    'metrics-port': Flags.integer({summary: 'serve Prometheus metrics at http://HOST:PORT/metrics (0: any free port)', min: 0, max: 65535}),
    'metrics-host': Flags.string({summary: 'address the metrics endpoint listens on', default: '127.0.0.1'}),
    'dashboard-port': Flags.integer({summary: 'serve the dashboard page at http://HOST:PORT/ (0: any free port); its history is kept in --save-state-dir', min: 0, max: 65535}),
    'dashboard-host': Flags.string({summary: 'address the dashboard listens on', default: '127.0.0.1'}),
    relay: Flags.boolean({summary: 'run a circuit relay for clients behind NAT (--no-relay: none)', default: true, allowNo: true}),
    'max-connections': Flags.integer({
      summary: 'most client connections open at once (lowered to what ulimit -n leaves room for); more are refused',
      default: DEFAULT_LIMITS.maxConnections,
      min: 1,
    }),
    'max-connections-per-ip': Flags.integer({summary: 'most connections open at once from one IP address', default: DEFAULT_LIMITS.maxConnectionsPerIp, min: 1}),
    'max-handshakes': Flags.integer({summary: 'most connections that have not said hello yet (each has 10 s to)', default: DEFAULT_LIMITS.maxHandshakes, min: 1}),
    'max-watchers': Flags.integer({summary: 'most connections watching the run without joining (psyche status, dashboards)', default: DEFAULT_LIMITS.maxWatchers, min: 1}),
    'max-members': Flags.integer({
      summary: `most members of the run at once (waiting to join plus training); more joins are refused (at most ${MAX_CLIENTS}, the coordinator's capacity)`,
      default: DEFAULT_LIMITS.maxMembers,
      min: 1,
      max: MAX_CLIENTS,
    }),
    'joins-per-second': Flags.integer({summary: 'joins accepted per second, all clients together (a join storm is paced)', default: DEFAULT_LIMITS.joinsPerSecond, min: 1}),
    'max-unsent-bytes-total': Flags.integer({
      summary: 'bytes queued for all connections together; past it the slowest readers are cut off first',
      default: DEFAULT_LIMITS.maxUnsentBytesTotal,
      min: 1048576,
    }),
    'join-burst': Flags.integer({summary: 'joins accepted at once before --joins-per-second applies', default: DEFAULT_LIMITS.joinBurst, min: 1}),
    'max-unsent-bytes': Flags.integer({
      summary: 'bytes queued for one connection that it has not read; past it the connection is closed (a slow reader)',
      default: DEFAULT_LIMITS.maxUnsentBytes,
      min: 65536,
    }),
    'stall-timeout-s': Flags.integer({
      summary: 'seconds a watcher or a client waiting for the next epoch may leave what it was sent unread before it is closed',
      default: DEFAULT_LIMITS.stallTimeoutSeconds,
      min: 1,
    }),
    'max-strikes': Flags.integer({
      summary: 'refused messages a connection (a watcher too) may send, net of those taken, before it is closed and its identity and address banned',
      default: DEFAULT_LIMITS.maxStrikes,
      min: 1,
    }),
    'strike-ban-s': Flags.integer({
      summary: 'seconds the identity and the address of a connection closed for its refusals (--max-strikes) are refused',
      default: DEFAULT_LIMITS.strikeBanSeconds,
      min: 1,
    }),
    'watcher-state-ms': Flags.integer({
      summary: 'how often watchers and clients waiting for the next epoch get the newest state, in milliseconds (the epoch’s clients get every change at once; 0: everyone does)',
      default: DEFAULT_PASSIVE_STATE_MS,
      min: 0,
    }),
    ...relayFlags,
  }

  /** With --json, stdout is a stream of one-line events: an error is one more line. */
  protected get streamsEvents(): boolean {
    return true
  }

  async run(): Promise<void> {
    const {flags} = await this.parse(ServerRun)
    const run = await loadRunConfigFile(flags.state)
    const identity = flags.identity ? await loadIdentity(flags.identity) : undefined
    const json = this.jsonEnabled()
    // Observers of the event stream (metrics): they read the server's state at scrape time, never change it.
    let server: CoordinatorServer | undefined
    const metrics =
      flags['metrics-port'] === undefined
        ? undefined
        : new ServerMetrics({state: () => server!.state, connected: () => server!.connectedClients.length, saves: () => server?.saveStatus})
    // On a terminal (not --json): a live view instead of log lines; it keeps the last warnings.
    const live = !this.plain
    const warnings = new Warnings()
    const history =
      flags['dashboard-port'] === undefined && !live
        ? undefined
        : RunHistory.open(run.run_id!, {
            path: flags['save-state-dir'] ? join(flags['save-state-dir'], HISTORY_FILE) : undefined,
            onSaveError: (error) => log({event: 'error', where: 'metrics history', path: join(flags['save-state-dir']!, HISTORY_FILE), message: error.message}),
          })
    const log = (event: PsycheEvent) => {
      metrics?.observe(event)
      if (server) history?.observe(event, server.state)
      if (json) process.stdout.write(`${JSON.stringify({...event, time: new Date().toISOString()})}\n`)
      else if (live) {
        if (event.event === 'rejected' || event.event === 'error' || event.event === 'server_error') warnings.add(formatLogLine(event))
      } else process.stderr.write(`${formatLogLine(event)}\n`)
    }

    // The relay signs with the server's identity (its peer id is the server id), and starts first: every client
    // that says hello is told its address.
    const id = await serverIdentity(flags['save-state-dir'], identity)
    // The relay serves the run's members only (the coordinator's directory), by their libp2p peer ids.
    const peerIds = new Map<string, string>()
    const admit = (peerId: string): boolean => {
      if (!server) return false
      for (const clientId of Object.keys(server.peers)) {
        let p = peerIds.get(clientId)
        if (p === undefined) {
          try {
            p = peerIdOfClient(clientId).toString()
          } catch {
            p = ''
          }
          peerIds.set(clientId, p)
        }
        if (p === peerId) return true
        if (peerIds.size > 4096) peerIds.clear()
      }
      return false
    }
    const relay = flags.relay ? await RelayNode.start({identity: id, ...relayOptionsFromFlags(flags, flags.host), log, admit}) : undefined
    server = await CoordinatorServer.start({
      run,
      host: flags.host,
      port: flags['server-port'],
      saveStateDir: flags['save-state-dir'],
      maxSaveFailures: flags['max-save-failures'],
      withdrawOnDisconnect: flags['withdraw-on-disconnect'] === 'true',
      tickIntervalMs: flags['tick-ms'],
      identity: id,
      log,
      relayAddrs: (localAddress) => relay?.addressFor(localAddress) ?? [],
      limits: {
        maxConnections: flags['max-connections'],
        maxConnectionsPerIp: flags['max-connections-per-ip'],
        maxHandshakes: flags['max-handshakes'],
        maxWatchers: flags['max-watchers'],
        maxMembers: flags['max-members'],
        joinsPerSecond: flags['joins-per-second'],
        joinBurst: flags['join-burst'],
        maxUnsentBytesTotal: flags['max-unsent-bytes-total'],
        maxUnsentBytes: flags['max-unsent-bytes'],
        stallTimeoutSeconds: flags['stall-timeout-s'],
        maxStrikes: flags['max-strikes'],
        strikeBanSeconds: flags['strike-ban-s'],
      },
      passiveStateMs: flags['watcher-state-ms'],
    }).catch(async (error) => {
      await relay?.stop()
      throw error
    })
    // After 'listening', which launchers read first.
    if (relay)
      log({
        event: 'relay_listening',
        peer_id: relay.peerId,
        port: relay.port,
        quic_port: relay.quicPort,
        stun_port: relay.stunPort,
        addrs: relay.addresses(),
        max_reservations: relay.limits.maxReservations,
        data_limit_bytes: Number(relay.limits.dataLimitBytes),
        duration_limit_ms: relay.limits.durationLimitMs,
      })
    let data: {server: DataServer; close: () => Promise<void>} | undefined
    let metricsEndpoint: Awaited<ReturnType<typeof serveMetrics>> | undefined
    let dashboard: Awaited<ReturnType<typeof serveDashboard>> | undefined
    try {
      if (flags['data-config']) data = await startDataServer(run, flags['data-config'], flags.host, log)
      if (metrics) {
        metricsEndpoint = await serveMetrics(metrics.registry, {port: flags['metrics-port']!, host: flags['metrics-host']})
        log({event: 'metrics_listening', host: flags['metrics-host'], port: metricsEndpoint.port, path: '/metrics'})
      }
      if (history && flags['dashboard-port'] !== undefined) {
        const s = server
        const summary = () => summarizeRun(s.state, coordinatorNow())
        dashboard = await serveDashboard(
          {
            summary,
            history: (since) => history.history(since),
            clients: () => clientTable(summary(), s.state.pending, s.connectedClients, history.clientRows(), s.rewardRows),
            saveState: () => s.saveStatus,
          },
          {port: flags['dashboard-port']!, host: flags['dashboard-host']},
        )
        log({event: 'dashboard_listening', host: flags['dashboard-host'], port: dashboard.port, url: dashboard.url})
      }
    } catch (error) {
      await metricsEndpoint?.close()
      await data?.close()
      await relay?.stop()
      await server.stop()
      throw error
    }
    const s = server
    const view = live
      ? startTerminalView(() => {
          const summary = summarizeRun(s.state, coordinatorNow())
          return {
            title: `psyche server · run ${summary.run_id} · ${flags.host}:${s.port}${dashboard ? ` · dashboard ${dashboard.url}` : ''}${metricsEndpoint ? ` · metrics :${metricsEndpoint.port}` : ''}`,
            summary,
            clients: clientTable(summary, s.state.pending, s.connectedClients, history!.clientRows()).map((c) => ({
              name: `${c.id.slice(0, 12)}…`,
              state: c.state,
              step: c.step,
              loss: c.loss,
              note: [c.connected ? '' : 'not connected', c.checkpoint_save_failed ? checkpointNotSavedText(c.checkpoint_save_failed) : ''].filter(Boolean).join('; '),
            })),
            ...historyFigures(history!.history()),
            peers: {all: Object.values(s.peers).filter((a) => a.length > 0).length},
            warnings: warnings.list,
          }
        })
      : undefined
    // Until a signal, or until the state cannot be saved (the server has halted: it exits 1 saying why).
    const halted = await Promise.race([this.shutdown.requested().then(() => undefined), server.halted])
    view?.stop()
    await dashboard?.close()
    await metricsEndpoint?.close()
    await data?.close()
    await relay?.stop()
    await server.stop()
    try {
      history?.save()
    } catch (error) {
      log({event: 'error', where: 'metrics history', message: (error as Error).message})
    }
    if (halted) throw halted
  }
}

/** The run's TCP data server, on the port its clients are told (model.LLM.data_location.Server). */
async function startDataServer(run: Awaited<ReturnType<typeof loadRunConfigFile>>, path: string, host: string, log: (event: PsycheEvent) => void) {
  const location = run.model.LLM.data_location
  const opened = await openDataServer(path, {
    host,
    log: (line) => log({event: 'data_server', message: line}),
    check: (config) => {
      const {errors} = checkDataServerForRun(run, config)
      if (errors.length > 0) throw new PsycheError(errors.map(formatIssue).join('\n'), {code: 'ECONFIG'})
      if (typeof location !== 'object' || !('Server' in location))
        throw new PsycheError(`${path}: ${run.path} model.LLM.data_location is not Server, so no client would ask this data server`, {code: 'ECONFIG'})
    },
    port: () => parseHostPort((location as {Server: string}).Server, `${run.path}: model.LLM.data_location.Server`).port,
  })
  log({event: 'data_server_listening', host, port: opened.server.port, dir: opened.dir, samples: opened.samples})
  return {server: opened.server, close: () => opened.close()}
}

/** The coordinator's clock as the server uses it (unix seconds, see CoordinatorServerOptions.now). */
function coordinatorNow(): number {
  return Date.now() / 1000
}

/** A log event as one readable line: `event key=value ...`. */
function formatLogLine(event: PsycheEvent): string {
  const {event: name, ...rest} = event
  const fields = Object.entries(rest).map(([k, v]) => `${k}=${typeof v === 'string' ? (/\s/.test(v) ? JSON.stringify(v) : v) : JSON.stringify(v)}`)
  return [name, ...fields].join(' ')
}
