import {Progress} from '../core/cli/progress.js'
import {PsycheCommand} from '../core/cli/base-command.js'
import {joinFlags, joinPlan, joinSetup} from '../core/cli/join-flags.js'
import {snakeKeys} from '../core/cli/json.js'
import type {ClientSummary} from '../core/client/runner.js'
import {ComposedClient} from '../core/compose/client.js'
import type {EventLine} from '../core/events.js'
import {ClientEventRenderer} from '../core/obs/client-view.js'
import {ClientMetrics, serveMetrics} from '../core/obs/metrics.js'
import {startTerminalView} from '../core/obs/terminal-view.js'

export default class Join extends PsycheCommand {
  static summary = 'Join a training run as a client: train assigned batches, exchange results with peers, witness'
  static description = `Connects to a centralized coordinator (psyche server run), or with --rpc to a run on Solana, follows the run through Warmup, RoundTrain,
RoundWitness and Cooldown, drives a PyTorch worker (DisTrO on the network path), gossips results to its peers
over libp2p, applies the results a witness quorum confirmed, witnesses when selected and sends health checks.
The model and data come from --config (the run's state.toml, for its model directory and data) or the
tiny-demo template; the LR schedule and DisTrO settings come from the coordinator's state.

On Solana (--rpc, --program-id): the client's key is --keypair (a Solana keypair file, default
~/.config/solana/id.json) or --identity (the same ed25519 key either way: its hex public key is the client id, its
base58 the address that signs and pays for the client's transactions). The client publishes its libp2p addresses
in its on-chain peer record, finds its peers' there, joins (with the run's authorization when permissioned),
follows the coordinator account (--ws-rpc: accountSubscribe; else polling) and ticks the run when a tick is due.
With --json, one JSON object per line on stdout: {"event":"round","step","epoch","loss","param_hash",
"applied","peers_applied","peers_accepted","other_trainers","bytes_in","bytes_out","peers","peer_bytes",
"val_loss","eval_ms",...} after each
applied round, and other events (model_loaded, trained, witness, health_check, rejected, worker_crashed,
no_exchange, finished).

Networking: the libp2p node listens on every interface (any free port; --p2p-port or --p2p-listen to choose)
and tells its peers, through the coordinator, only addresses they can use: interface addresses (public ones
included) and the addresses the relay's dial-back confirmed, never a loopback address (unless it listens on loopback only), or
exactly --p2p-announce. It asks the coordinator's circuit relay (or the first --relay) to dial it back; when
that fails (behind NAT) it reserves a slot there and publishes its relayed address after its direct ones, so
peers behind NAT reach each other through the relay, then punch a direct TCP connection where both NATs allow it. A client that applies no peer's results for
several rounds while others train prints a no_exchange warning naming the addresses it failed to dial.`

  static examples = [
    '<%= config.bin %> join --server-addr 127.0.0.1:5000 --run-id tiny-demo',
    '<%= config.bin %> join --server-addr host:5000 --run-id my-run --config run/state.toml --identity me.json --threads 2 --json',
    '<%= config.bin %> join --rpc http://127.0.0.1:8899 --ws-rpc ws://127.0.0.1:8900 --program-id <ID> --run-id my-run --config run/state.toml --keypair me.json',
  ]

  static flags = joinFlags

  /** With --json, stdout is a stream of one-line events: an error is one more line, not a pretty-printed object. */
  protected get streamsEvents(): boolean {
    return true
  }

  async run(): Promise<ClientSummary | undefined> {
    const {flags} = await this.parse(Join)
    const json = this.jsonEnabled()
    // On a terminal: a live view (ink) replaces the progress lines; piped: plain lines; --json: JSON only.
    const live = !this.plain
    const progress = Progress.for({json: json || live})
    const plan = await joinPlan(flags, progress)
    let composed: ComposedClient | undefined
    const renderer = new ClientEventRenderer({
      mode: json ? 'json' : live ? 'live' : 'plain',
      seqLen: plan.seqLen,
      write: (line) => process.stdout.write(line),
      note: (line) => progress.note(line),
      state: () => composed?.state(),
    })
    // Metrics are derived from the same event stream the terminal and --json show.
    const metrics = flags['metrics-port'] === undefined ? undefined : new ClientMetrics({seqLen: plan.seqLen})
    const log = (event: EventLine) => {
      metrics?.observe(event)
      renderer.render(event)
    }
    composed = await ComposedClient.compose(joinSetup(flags, plan, log))
    const metricsEndpoint = metrics ? await serveMetrics(metrics.registry, {port: flags['metrics-port']!, host: flags['metrics-host']}) : undefined
    if (metricsEndpoint) log({event: 'metrics_listening', host: flags['metrics-host'], port: metricsEndpoint.port, path: '/metrics'})
    const {identity, target} = composed
    progress.status(`connecting to ${target} (run ${flags['run-id']}) as ${identity.id.slice(0, 16)}…`)
    // Ctrl-C / SIGTERM: withdraw from the run, then exit with the signal's code (the worker is killed on exit, see
    // worker/client.ts).
    this.shutdown.onSignal(() => composed.interrupt())
    const client = await composed.start()
    progress.status(`joined as ${client.id.slice(0, 16)}…; following the run`)
    const title = `psyche join · run ${flags['run-id']} · ${client.id.slice(0, 12)}… · ${target}${metricsEndpoint ? ` · metrics :${metricsEndpoint.port}` : ''}`
    const view = live ? startTerminalView(() => renderer.view({title, me: client.id, nowSeconds: composed.nowSeconds()})) : undefined
    const summary = await composed.run().finally(() => {
      view?.stop()
      return metricsEndpoint?.close()
    })
    await composed.leave()
    log({event: 'finished', ...snakeKeys(summary)})
    const done = `run finished: ${summary.rounds} rounds applied, last step ${summary.lastStep}, hash ${summary.paramHash?.slice(0, 12)}`
    if (live) process.stderr.write(`${done}\n`)
    else progress.done(done)
    // --json: the finished event above is the last line; nothing else is printed.
    return json ? undefined : summary
  }
}
