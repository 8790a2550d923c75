import {resolve} from 'node:path'
import {Flags} from '@oclif/core'
import {PsycheCommand} from '../core/cli/base-command.js'
import {Progress} from '../core/cli/progress.js'
import {homedir} from 'node:os'
import {join as joinPath} from 'node:path'
import type {KeyPairSigner} from '@solana/kit'
import {CoordinatorConnection, type BackendConnector, type CoordinatorBackend} from '../core/backend/index.js'
import type {closePeerRecord} from '../core/backend/solana/admin.js'
import type {SolanaConnector} from '../core/backend/solana/client.js'
import {DEFAULT_MAX_ROUNDS_WITHOUT_EXCHANGE, PsycheClient, seedForRun, type ClientSummary} from '../core/client/runner.js'
import {startComponents} from '../core/compose/client.js'
import {listenAddrsForPort, parseMultiaddrs} from '../core/p2p/addresses.js'
import {demoCorpusDir, ensureDemoCorpus} from '../core/corpus.js'
import {acceptedOf, ClientMetrics, serveMetrics} from '../core/obs/metrics.js'
import {RoundReporter} from '../core/obs/report.js'
import {coordinatorSeconds, summarizeRun, waitingFor} from '../core/obs/summary.js'
import {describeEvent, eventSeverity} from '../core/obs/event-text.js'
import {startTerminalView, Warnings} from '../core/obs/terminal-view.js'
import {generateIdentity, identityFromSeed, identityPrivateSeed, loadIdentity, type Identity} from '../core/protocol/identity.js'
import {resolveTrainPlan, type Precision} from '../core/train/plan.js'
import {checkRepoId, checkToken, transferLabel} from '../core/checkpoint/hub.js'
import {snakeKeys} from '../core/cli/json.js'
import type {EventLine} from '../core/events.js'

function mb(bytes: number): string {
  return `${(bytes / 1e6).toFixed(2)} MB`
}

/** Client events the live view lists (news and problems apart: obs/event-text.ts). */
const SHOWN_EVENTS = new Set([
  'waiting',
  'model_loaded',
  'reconnected',
  'rejoining',
  'worker_crashed',
  'worker_restarted',
  'rejected',
  'out_of_sync',
  'health_check',
  'result_fetch_failed',
  'model_fetch_failed',
  'model_peer_dropped',
  'checkpoint_late',
  'checkpoint_rejected',
])

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

  static flags = {
    'server-addr': Flags.string({summary: 'the coordinator server, host:port', exactlyOne: ['server-addr', 'rpc']}),
    rpc: Flags.string({summary: 'join a run on Solana: JSON-RPC URL of the cluster (several, comma-separated: tried in order)', exactlyOne: ['server-addr', 'rpc']}),
    'priority-fee': Flags.integer({summary: 'Solana: priority fee in micro-lamports per compute unit (default 0)', min: 0, dependsOn: ['rpc']}),
    'ws-rpc': Flags.string({summary: "Solana: the cluster's websocket URL (accountSubscribe); default: poll --rpc", dependsOn: ['rpc']}),
    'program-id': Flags.string({summary: 'Solana: address of the coordinator program', env: 'PSYCHE_COORDINATOR_PROGRAM'}),
    keypair: Flags.string({summary: 'Solana: keypair file (JSON array of 64 bytes) of the client (default ~/.config/solana/id.json)', exclusive: ['identity']}),
    authorization: Flags.string({summary: "Solana, permissioned runs: the authorization that admits this key (default: the join authority's grant to it)"}),
    'poll-ms': Flags.integer({summary: 'Solana: how often the coordinator account is read without --ws-rpc (ms)', default: 500, min: 50}),
    'run-id': Flags.string({summary: "the run to join (must match the server's)", required: true}),
    identity: Flags.string({summary: 'identity file (psyche-identity JSON); default: a new random identity for this process (with --rpc: --keypair)'}),
    config: Flags.string({char: 'c', summary: 'the run config (state.toml) whose model directory and data this client uses'}),
    template: Flags.string({summary: 'use templates/NAME/state.toml for model and data (default tiny-demo when no --config)'}),
    model: Flags.string({summary: "model directory (config.json [+ model.safetensors]); overrides the config's checkpoint"}),
    data: Flags.string({summary: "directory of token files; overrides the config's data_location"}),
    'micro-batch': Flags.integer({summary: 'sequences per forward/backward', min: 1}),
    threads: Flags.integer({summary: 'torch threads of the worker', min: 1}),
    device: Flags.string({summary: 'auto | cpu | cuda | cuda:N', default: 'auto'}),
    devices: Flags.string({summary: 'several devices in this client, one data-parallel rank each (torch.distributed): cuda:0,cuda:1'}),
    'data-parallel': Flags.integer({summary: 'N data-parallel ranks on --device (cpu: N processes with gloo; cuda: GPUs 0..N-1 with NCCL)', min: 1}),
    precision: Flags.string({
      summary: 'forward-pass precision: bf16 = torch autocast to bfloat16 with fp32 master weights; auto = bf16 on CUDA, fp32 on CPU',
      options: ['auto', 'fp32', 'bf16'],
      default: 'auto',
    }),
    'metrics-port': Flags.integer({summary: 'serve Prometheus metrics at http://HOST:PORT/metrics (0: any free port)', min: 0, max: 65535}),
    'metrics-host': Flags.string({summary: 'address the metrics endpoint listens on', default: '127.0.0.1'}),
    'p2p-listen': Flags.string({summary: 'libp2p listen multiaddr(s) (default /ip4/0.0.0.0/tcp/0: every interface)', multiple: true, exclusive: ['p2p-port']}),
    'p2p-port': Flags.integer({summary: 'libp2p TCP port on every interface (default: any free port)', min: 0, max: 65535}),
    quic: Flags.boolean({
      summary: 'QUIC (UDP) beside TCP: listen and announce both, dial QUIC first; --no-quic for TCP only where UDP is blocked',
      default: true,
      allowNo: true,
    }),
    'p2p-announce': Flags.string({summary: 'tell peers exactly these multiaddr(s): a public address or a forwarded port', multiple: true}),
    relay: Flags.string({summary: 'also use this circuit relay (multiaddr ending in /p2p/<id>, from psyche relay): reserve a slot there when not reachable', multiple: true}),
    'checkpoint-dir': Flags.string({
      summary: 'save the model in this directory after each epoch (Hugging Face layout with psyche-checkpoint.json; replaced atomically)',
    }),
    'eval-every': Flags.integer({
      summary: 'validation loss on held-out samples after every N-th round and the last (0: never); the same on every replica',
      default: 10,
      min: 0,
    }),
    'eval-batches': Flags.integer({summary: 'held-out samples (sequences) per validation', default: 8, min: 1}),
    'eval-data': Flags.string({
      summary:
        "a held-out split (directory of token files) for the validation loss; default: the demo corpus's validation split, else the tail of the training data when the run never reaches it",
    }),
    'max-rounds-without-exchange': Flags.integer({
      summary:
        'leave the run (exit 1) after this many rounds in a row in which other clients trained and none of their results reached this client (it cannot reach its peers and would train alone); 0: never leave, only warn',
      default: DEFAULT_MAX_ROUNDS_WITHOUT_EXCHANGE,
      min: 0,
    }),
    'worker-restarts': Flags.integer({
      summary: 'start a new worker this many times when the worker dies (it rejoins at the next epoch with the model from a peer); 0: a dead worker ends the client',
      default: 0,
      min: 0,
    }),
    'hub-repo': Flags.string({summary: 'be a checkpointer: upload the model to this Hub repository (NS/NAME) after each epoch'}),
    'hub-revision': Flags.string({summary: 'branch the checkpoints are committed to', default: 'main'}),
    'hub-url': Flags.string({summary: 'Hub endpoint for checkpoints', env: 'HF_ENDPOINT'}),
    'hub-token': Flags.string({summary: 'Hub token (starts with hf_) for uploads and private repositories', env: 'HF_TOKEN'}),
  }

  /** With --json, stdout is a stream of one-line events: an error is one more line, not a pretty-printed object. */
  protected writeJsonError(code: string, message: string): void {
    process.stdout.write(`${JSON.stringify({event: 'error', code, message})}\n`)
  }

  async run(): Promise<ClientSummary | undefined> {
    const {flags} = await this.parse(Join)
    const json = this.jsonEnabled()
    // On a terminal: a live view (ink) replaces the progress lines; piped: plain lines; --json: JSON only.
    const live = !this.plain
    const progress = Progress.for({json: json || live})
    const watch = {
      losses: [] as number[],
      valLoss: null as number | null,
      last: undefined as Record<string, unknown> | undefined,
      tokensPerSecond: null as number | null,
      warnings: new Warnings(),
      notes: new Warnings(),
    }
    const plan = await resolveTrainPlan({
      config: flags.config,
      template: flags.template,
      model: flags.model,
      data: flags.data,
      microBatch: flags['micro-batch'],
      optimizer: 'distro',
      threads: flags.threads,
      device: flags.device,
      devices: flags.devices,
      dataParallel: flags['data-parallel'],
      precision: flags.precision as Precision,
      valData: flags['eval-data'],
      evalEvery: flags['eval-every'],
      evalBatches: flags['eval-batches'],
      hub: {
        url: flags['hub-url'],
        token: flags['hub-token'],
        onProgress: (p) => progress.update(`model from the Hub: ${transferLabel(p)}`, p.phase === 'done'),
      },
    })
    const d = plan.data
    if (typeof d === 'object' && 'Local' in d && resolve(plan.dataBaseDir, d.Local).startsWith(demoCorpusDir)) await ensureDemoCorpus((m) => progress.status(m))
    const p2p = {
      listen: flags['p2p-listen'] ? parseMultiaddrs(flags['p2p-listen'], '--p2p-listen') : listenAddrsForPort(flags['p2p-port']),
      announce: flags['p2p-announce'] ? parseMultiaddrs(flags['p2p-announce'], '--p2p-announce') : undefined,
      quic: flags.quic,
    }
    const relays = flags.relay ? parseMultiaddrs(flags.relay, '--relay', {needPeer: true}) : undefined
    const runId = flags['run-id']
    let identity: Identity
    let solana: SolanaConnector | undefined
    let solanaRun: Parameters<typeof closePeerRecord>[0] | undefined
    let closeSolanaPeerRecord: typeof closePeerRecord | undefined
    if (flags.rpc) {
      // The Solana client libraries load only for a Solana run.
      const [{createKeyPairSignerFromPrivateKeyBytes}, admin, {RpcChain}, {SolanaConnector}, {parseAddress}] = await Promise.all([
        import('@solana/kit'),
        import('../core/backend/solana/admin.js'),
        import('../core/backend/solana/chain.js'),
        import('../core/backend/solana/client.js'),
        import('../core/cli/solana-flags.js'),
      ])
      closeSolanaPeerRecord = admin.closePeerRecord
      // One ed25519 key: the psyche identity (client id, libp2p peer id) and the Solana signer.
      let signer: KeyPairSigner
      if (flags.identity) {
        identity = await loadIdentity(resolve(flags.identity))
        signer = await createKeyPairSignerFromPrivateKeyBytes(identityPrivateSeed(identity))
      } else {
        const k = await admin.loadKeypairWithSeed(resolve(flags.keypair ?? joinPath(homedir(), '.config', 'solana', 'id.json')))
        signer = k.signer
        identity = identityFromSeed(k.seed)
      }
      solanaRun = {
        chain: new RpcChain(flags.rpc, {priorityFee: BigInt(flags['priority-fee'] ?? 0)}),
        programId: parseAddress(flags['program-id'], 'program-id'),
        runId,
        client: signer,
      }
      solana = new SolanaConnector({
        chain: solanaRun.chain,
        programId: solanaRun.programId,
        runId,
        signer,
        wsUrl: flags['ws-rpc'],
        pollMs: flags['poll-ms'],
        authorization: flags.authorization ? parseAddress(flags.authorization, 'authorization') : undefined,
        log: (e) => log({...e, source: 'coordinator'}),
      })
    } else identity = flags.identity ? await loadIdentity(resolve(flags.identity)) : generateIdentity()
    const seed = seedForRun(runId)
    // Metrics are derived from the same event stream the terminal and --json show.
    const metrics = flags['metrics-port'] === undefined ? undefined : new ClientMetrics({seqLen: plan.seqLen})
    // --json: every event is one line on stdout, flushed as it happens, for the testnet and scripts to follow.
    const reporter = new RoundReporter(plan.seqLen)
    let connection: CoordinatorConnection | undefined
    let current: CoordinatorBackend | undefined
    const log = (event: EventLine) => {
      metrics?.observe(event)
      const r = reporter.observe(event)
      // Display-only reports go over the centralized server's connection (the latest one: a rejoin opens a new one).
      if (r) connection?.sendReport(r.step, r.report)
      if (live) {
        if (event.event === 'round') {
          watch.last = event
          if (typeof event.loss === 'number') watch.losses.push(event.loss)
          if (typeof event.val_loss === 'number') watch.valLoss = event.val_loss
          if (watch.losses.length > 200) watch.losses.shift()
          watch.tokensPerSecond = r?.report.tokens_per_second ?? watch.tokensPerSecond
        } else if (SHOWN_EVENTS.has(event.event)) {
          // News (a model loaded, a rejoin) apart from what went wrong: the view shows them differently.
          ;(eventSeverity(event) === 'info' ? watch.notes : watch.warnings).add(describeEvent(event))
        }
      }
      if (json) {
        process.stdout.write(JSON.stringify(event) + '\n')
        return
      }
      switch (event.event) {
        case 'round': {
          const loss = typeof event.loss === 'number' ? event.loss.toFixed(3) : '  -  '
          const alone = (event.rounds_without_exchange as number) > 0 ? `  NO EXCHANGE: no peer's result for ${event.rounds_without_exchange} round(s)` : ''
          const relayed =
            typeof event.relayed_in === 'number' && event.relayed_in + ((event.relayed_out as number) ?? 0) > 0
              ? ` (relayed in ${mb(event.relayed_in)} out ${mb(event.relayed_out as number)})`
              : ''
          progress.note(
            `round ${event.step} (epoch ${event.epoch})  loss ${loss}  hash ${String(event.param_hash).slice(0, 12)}  peers' results applied ${event.peers_applied}/${event.peers_accepted} accepted (${event.other_trainers} others trained)  connected ${event.peers}  in ${mb(event.bytes_in as number)}  out ${mb(event.bytes_out as number)}${relayed}${alone}`,
          )
          break
        }
        case 'no_exchange': {
          const unreachable = (event.unreachable as {peer_id: string; addrs: string[]; reason: string}[]).map(
            (u) => `${u.peer_id.slice(0, 16)}… at ${u.addrs.join(', ')} (${u.reason})`,
          )
          progress.note(
            `WARNING: ${event.detail}. ${unreachable.length ? `Could not dial: ${unreachable.join('; ')}` : `Connected to ${event.peers} peer(s), yet no result arrived`}. See the README, "Training across machines".`,
          )
          break
        }
        case 'checkpoint_saved':
          progress.note(`model saved to ${event.dir} (step ${event.step}, epoch ${event.epoch})`)
          break
        case 'checkpoint_save_failed':
          progress.note(`error: could not save the model: ${event.message}`)
          break
        case 'waiting':
        case 'model_loaded':
        case 'worker_crashed':
        case 'worker_restarted':
        case 'rejected':
        case 'out_of_sync':
        case 'health_check':
        case 'rejoining':
        case 'reconnected': {
          const severity = eventSeverity(event)
          progress.note(`${severity === 'info' ? '' : `${severity}: `}${describeEvent(event)}`)
          break
        }
        case 'disconnected':
          // A finished run's server closes every connection: nothing to reconnect to, nothing to report.
          if (event.source === 'coordinator' && current?.state?.run_state !== 'Finished') progress.note(`disconnected from the coordinator ${event.addr}; reconnecting`)
          break
        default:
          break
      }
    }
    const metricsEndpoint = metrics ? await serveMetrics(metrics.registry, {port: flags['metrics-port']!, host: flags['metrics-host']}) : undefined
    if (metricsEndpoint) log({event: 'metrics_listening', host: flags['metrics-host'], port: metricsEndpoint.port, path: '/metrics'})
    const target = flags.rpc ? `${flags.rpc} (Solana)` : flags['server-addr']!
    progress.status(`connecting to ${target} (run ${runId}) as ${identity.id.slice(0, 16)}…`)
    // Ctrl-C / SIGTERM: withdraw from the run, then exit with the signal's code (the worker is killed on exit, see
    // worker/client.ts).
    let client: PsycheClient | undefined
    // On Solana, a client that leaves for good closes its peer record (its rent comes back).
    const leavePeerDirectory = async () => {
      if (!solanaRun || !closeSolanaPeerRecord) return
      await closeSolanaPeerRecord(solanaRun).then(
        (closed) => closed && log({event: 'peer_record_closed', address: solanaRun!.client.address}),
        (error: unknown) => log({event: 'peer_record_not_closed', message: (error as Error).message}),
      )
    }
    this.shutdown.onSignal(async () => {
      client?.withdrawNow()
      // On Solana the withdraw is a transaction: close() returns once it is sent (within the grace period).
      if (solana) await current?.close()
      await leavePeerDirectory()
    })
    // Outside the epoch (waiting for members, or joined mid-epoch), say what we wait for and about how long: once
    // per change, as an event (also piped and in --json), checked on every state and every half second.
    let waitingKey = ''
    let waitingOf: string | undefined
    const checkWaiting = () => {
      const state = current?.state
      if (!state || waitingOf === undefined) return
      const w = waitingFor(state, waitingOf, coordinatorSeconds(connection?.serverTime ?? Date.now() / 1000))
      const key = w ? `${w.reason} ${state.progress.epoch} ${state.pending.length} ${state.run_state === 'WaitingForMembers' ? '' : state.epoch.clients.length}` : ''
      if (key === waitingKey) return
      waitingKey = key
      if (w) log({event: 'waiting', reason: w.reason, detail: w.detail, seconds: w.seconds === null ? null : Math.round(w.seconds)})
    }
    const backend: BackendConnector | undefined = solana && {
      description: solana.description,
      connect: async (j) => {
        const b = await solana.connect(j)
        current = b
        b.on('state', checkWaiting)
        return b
      },
    }
    const components = await startComponents({
      serverAddr: flags['server-addr'] ?? '',
      backend,
      runId,
      identity,
      plan,
      seed,
      log,
      p2p,
      onConnected: (c) => {
        connection = current = c
        c.on('state', checkWaiting)
      },
    })
    const hub = {url: flags['hub-url'], token: flags['hub-token'], repo: flags['hub-repo'], revision: flags['hub-revision']}
    if (hub.repo) {
      checkRepoId(hub.repo, '--hub-repo')
      checkToken(hub.token, true)
    }
    client = await PsycheClient.start(
      {
        id: identity.id,
        runId,
        plan,
        seed,
        log,
        relays,
        hub,
        checkpointDir: flags['checkpoint-dir'],
        workerRestarts: flags['worker-restarts'],
        maxRoundsWithoutExchange: flags['max-rounds-without-exchange'],
        eval: {every: plan.evalEvery, batches: plan.evalBatches},
      },
      components,
    )
    progress.status(`joined as ${client.id.slice(0, 16)}…; following the run`)
    const me = client.id
    waitingOf = me
    checkWaiting()
    const waitTimer = setInterval(checkWaiting, 500)
    waitTimer.unref()
    const view = live
      ? startTerminalView(() => {
          const state = current?.state
          const summary = state ? summarizeRun(state, coordinatorSeconds(connection?.serverTime ?? Date.now() / 1000)) : undefined
          const last = watch.last
          const n = (v: unknown) => (typeof v === 'number' ? v : null)
          return {
            title: `psyche join · run ${runId} · ${me.slice(0, 12)}… · ${target}${metricsEndpoint ? ` · metrics :${metricsEndpoint.port}` : ''}`,
            summary,
            // Our own row from our own round reports; the others' figures are the server's to show (server run, dashboard).
            clients: (summary?.clients ?? []).map((c) =>
              c.id === me ? {name: `${c.id.slice(0, 12)}… (me)`, state: c.state, step: n(last?.step), loss: n(last?.loss)} : {name: `${c.id.slice(0, 12)}…`, state: c.state},
            ),
            losses: watch.losses,
            valLoss: watch.valLoss,
            tokensPerSecond: watch.tokensPerSecond,
            bytesIn: n(last?.bytes_in),
            bytesOut: n(last?.bytes_out),
            applied: n(last?.applied),
            accepted: last ? (acceptedOf(last) ?? null) : null,
            peers: last ? {all: n(last.peers) ?? 0, direct: n(last.conn_direct) ?? n(last.peers_direct), relayed: n(last.conn_relayed) ?? n(last.peers_relayed)} : null,
            warnings: watch.warnings.list,
            notes: watch.notes.list,
          }
        })
      : undefined
    const summary = await client.run().finally(() => {
      clearInterval(waitTimer)
      view?.stop()
      return metricsEndpoint?.close()
    })
    await leavePeerDirectory()
    log({event: 'finished', ...snakeKeys(summary)})
    const done = `run finished: ${summary.rounds} rounds applied, last step ${summary.lastStep}, hash ${summary.paramHash?.slice(0, 12)}`
    if (live) process.stderr.write(`${done}\n`)
    else progress.done(done)
    // --json: the finished event above is the last line; nothing else is printed.
    return json ? undefined : summary
  }
}
