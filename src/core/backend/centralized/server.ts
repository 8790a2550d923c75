import {randomBytes} from 'node:crypto'
import {existsSync, mkdirSync, readFileSync} from 'node:fs'
import {createServer, type Server, type Socket} from 'node:net'
import {join} from 'node:path'
import type {RunConfigFile} from '../../config/types.js'
import {applyEvent, createCoordinator, deserializeState, isRoundPhase, isVerifier, serializeState, tick} from '../../coordinator/index.js'
import type {ClientId, CoordinatorEvent, CoordinatorState} from '../../coordinator/types.js'
import type {PeerDirectory} from '../types.js'
import {PsycheError} from '../../errors.js'
import {writeFileAtomicSync} from '../../protocol/atomic-file.js'
import {DEFAULT_MAX_FRAME_BYTES, FrameReader} from '../../protocol/frames.js'
import {generateIdentity, loadIdentity, saveIdentity, type Identity} from '../../protocol/identity.js'
import {ScoreBoard} from '../../verify/scoreboard.js'
import {decodeClientMessage, encodeServerMessage, type ClientEnvelope, type ServerBodies, type ServerKind} from '../../protocol/messages.js'

export interface CoordinatorServerOptions {
  run: RunConfigFile
  /** Default 127.0.0.1; 0.0.0.0 to serve other machines. */
  host?: string
  /** 0 (default): any free port. */
  port?: number
  /** Save the state after every transition here, and resume from it on start. */
  saveStateDir?: string
  /** Withdraw a client from the run when its connection closes (default true, as Psyche). */
  withdrawOnDisconnect?: boolean
  /** How often the coordinator is ticked, besides after every accepted event (default 50 ms: how late a timeout may fire). */
  tickIntervalMs?: number
  /** The server's signing identity. Default: the one saved in saveStateDir, else a new random one. */
  identity?: Identity
  /** Structured log lines ({event: ..., ...}); rejections among them with the peer and the reason. */
  log?: (event: object) => void
  /** The coordinator's clock: unix milliseconds (default: Date.now). */
  now?: () => number
  /** Largest frame accepted from a client once it said hello (default 16 MiB; 64 KiB before). */
  maxFrameBytes?: number
  /** Open TCP connections accepted at once (default 16384); more are refused by the kernel's backlog. */
  maxConnections?: number
  /** A connection must say hello within this time (default 10 s). */
  helloTimeoutMs?: number
  /**
   * The run's circuit relay (psyche server run starts one): each client is told its addresses in the welcome, as
   * that client can dial them (`localAddress`: the server address its TCP connection arrived on).
   */
  relayAddrs?: (localAddress: string | undefined) => string[]
}

/** File names inside saveStateDir. */
export const SAVED_STATE_FILE = 'coordinator-state.json'
export const SAVED_IDENTITY_FILE = 'server-identity.json'

/** Until a peer has said hello it may only send small frames (a hello is well under this). */
export const MAX_PRE_HELLO_FRAME_BYTES = 64 * 1024
/** Protocol violations a connection may commit before it is closed (each is logged and answered). */
const MAX_STRIKES = 16
/** A client that does not read its state pushes is cut off rather than buffered without bound. */
const MAX_UNSENT_BYTES = 256 * 1024 * 1024

interface Session {
  socket: Socket
  peer: string
  /** Random per connection: every message of the connection is signed with it, so none can be replayed on another. */
  session: string
  reader: FrameReader
  clientId?: ClientId
  lastSeq: number
  sentSeq: number
  strikes: number
  helloTimer?: NodeJS.Timeout
  /** Set when a newer connection of the same client replaced this one (its close then changes nothing). */
  replaced: boolean
  /** The state pushed to this connection last (its dedupe key), so each client gets each state once. */
  lastState?: string
  /** Said hello without asking to join (psyche status, dashboards): gets the clients' reports forwarded. */
  watcher?: boolean
}

interface SavedState {
  type: 'psyche-coordinator-state'
  version: 1
  state: string
  peers: PeerDirectory
}

/**
 * The centralized backend: a TCP server that owns the coordinator state machine, ticks it on a timer
 * and after every accepted event, and pushes every new state (with the peer directory) to all
 * connected clients. Everything from the wire is verified (messages.ts) and bound to this run, this
 * connection and the current step; a message that fails is dropped, answered with `rejected`, and
 * logged with the peer and the reason. Nothing a peer sends can throw out of the socket handlers.
 */
export class CoordinatorServer {
  private readonly sessions = new Set<Session>()
  private readonly byClient = new Map<ClientId, Session>()
  private timer?: NodeJS.Timeout
  private stopping = false
  private statePath?: string
  /** Verification scores reported by verifiers (display only: never an input of the coordinator). */
  private readonly scoreBoard = new ScoreBoard()
  private scoresJson = '[]'
  /** What the server did, cumulative (the scale bench and test divide it per round): frames and bytes out and in, states adopted. */
  readonly work = {framesOut: 0, bytesOut: 0, bytesIn: 0, commits: 0}

  private constructor(
    private readonly net: Server,
    readonly identity: Identity,
    private current: CoordinatorState,
    private directory: PeerDirectory,
    private readonly opts: Required<Pick<CoordinatorServerOptions, 'withdrawOnDisconnect' | 'maxFrameBytes' | 'helloTimeoutMs'>> & {
      log: (event: object) => void
      now: () => number
      saveStateDir?: string
      relayAddrs?: (localAddress: string | undefined) => string[]
    },
  ) {
    if (opts.saveStateDir) this.statePath = join(opts.saveStateDir, SAVED_STATE_FILE)
  }

  static async start(options: CoordinatorServerOptions): Promise<CoordinatorServer> {
    const log = options.log ?? (() => {})
    const now = options.now ?? (() => Date.now())
    const runId = options.run.run_id
    if (runId === undefined || runId === '') throw new PsycheError(`${options.run.path}: run_id: a server needs a state.toml with a run_id`)
    if (!options.run.config) throw new PsycheError(`${options.run.path}: config: a server needs a state.toml with [config]`)

    let identity = options.identity
    let state: CoordinatorState | undefined
    let peers: PeerDirectory = {}
    let resumedFrom: string | undefined
    if (options.saveStateDir) {
      identity = await serverIdentity(options.saveStateDir, identity)
      const statePath = join(options.saveStateDir, SAVED_STATE_FILE)
      if (existsSync(statePath)) {
        ;({state, peers} = readSavedState(statePath, runId))
        resumedFrom = statePath
      }
    }
    identity ??= generateIdentity()
    state ??= createCoordinator(options.run, {now: now()})

    const net = createServer({noDelay: true})
    net.maxConnections = options.maxConnections ?? 16384
    const server = new CoordinatorServer(net, identity, state, peers, {
      withdrawOnDisconnect: options.withdrawOnDisconnect ?? true,
      maxFrameBytes: options.maxFrameBytes ?? DEFAULT_MAX_FRAME_BYTES,
      helloTimeoutMs: options.helloTimeoutMs ?? 10_000,
      log,
      now,
      saveStateDir: options.saveStateDir,
      relayAddrs: options.relayAddrs,
    })
    net.on('connection', (socket) => server.accept(socket))
    await new Promise<void>((resolve, reject) => {
      net.once('error', (error: NodeJS.ErrnoException) =>
        reject(new PsycheError(`cannot listen on ${options.host ?? '127.0.0.1'}:${options.port ?? 0}: ${error.code ?? error.message}`, {cause: error})),
      )
      net.listen(options.port ?? 0, options.host ?? '127.0.0.1', () => resolve())
    })
    net.on('error', (error) => log({event: 'server_error', message: error.message}))
    server.save()
    server.timer = setInterval(() => server.advance(), options.tickIntervalMs ?? 50)
    // 'listening' comes first: launchers read the port from the first log line.
    log({event: 'listening', host: options.host ?? '127.0.0.1', port: server.port, run_id: runId, server_id: identity.id, run_state: state.run_state, step: state.progress.step})
    if (resumedFrom)
      log({
        event: 'resumed',
        path: resumedFrom,
        run_id: runId,
        run_state: state.run_state,
        step: state.progress.step,
        epoch: state.progress.epoch,
        clients: state.epoch.clients.length,
        pending: state.pending.length,
      })
    return server
  }

  get port(): number {
    const address = this.net.address()
    return typeof address === 'object' && address ? address.port : 0
  }

  get state(): CoordinatorState {
    return this.current
  }

  /** Client id → the libp2p multiaddrs it announced in its hello. */
  get peers(): PeerDirectory {
    return this.directory
  }

  /** Ids of the clients connected now (that said hello). */
  get connectedClients(): ClientId[] {
    return [...this.byClient.keys()]
  }

  /**
   * An event of the run's authority (pause, resume, config_update, eject): applied like a client's, then
   * ticked and pushed. Returns the coordinator's refusal, if any.
   */
  applyAuthorityEvent(event: Extract<CoordinatorEvent, {type: 'pause' | 'resume' | 'config_update' | 'eject'}>): {code: string; reason: string} | undefined {
    const result = this.apply(event)
    if (result.ok) {
      this.opts.log({event: 'authority', type: event.type})
      return undefined
    }
    this.opts.log({event: 'rejected', peer: 'authority', code: result.code, reason: result.reason, of: event.type})
    return {code: result.code, reason: result.reason}
  }

  /** Stops ticking and closes every connection. Clients are not withdrawn: a restarted server resumes them. */
  async stop(): Promise<void> {
    if (this.stopping) return
    this.stopping = true
    clearInterval(this.timer)
    const closed = new Promise<void>((resolve) => this.net.close(() => resolve()))
    for (const s of this.sessions) {
      clearTimeout(s.helloTimer)
      s.socket.destroy()
    }
    await closed
    this.opts.log({event: 'stopped', run_state: this.current.run_state, step: this.current.progress.step})
  }

  // ---- the coordinator ----

  private get runId(): string {
    return this.current.run_id
  }

  /** One tick, with fresh randomness so the next round's seed cannot be predicted by clients. */
  private advance(): void {
    if (this.stopping) return
    try {
      this.commit(tick(this.current, this.opts.now(), randomBytes(32).toString('hex')))
    } catch (error) {
      this.opts.log({event: 'error', where: 'tick', message: (error as Error).message})
    }
  }

  /** Applies a client's event; on success ticks at once (a join or a quorum may start a phase). */
  private apply(event: CoordinatorEvent): {ok: true} | {ok: false; code: string; reason: string} {
    const result = applyEvent(this.current, event, this.opts.now())
    if (result.error) return {ok: false, code: result.error.code, reason: result.error.message}
    this.commit(result.state)
    this.advance()
    return {ok: true}
  }

  /** Adopts a new state: log a phase change, save, push to every client. */
  private commit(next: CoordinatorState, peersChanged = false): void {
    const previous = this.current
    if (next === previous && !peersChanged) return
    this.current = next
    this.work.commits++
    if (next.run_state !== previous.run_state || next.progress.step !== previous.progress.step) {
      this.opts.log({
        event: 'transition',
        from: previous.run_state,
        to: next.run_state,
        step: next.progress.step,
        epoch: next.progress.epoch,
        clients: next.epoch.clients.length,
        pending: next.pending.length,
      })
    }
    this.save()
    this.pushState()
  }

  private save(): void {
    if (!this.statePath) return
    const saved: SavedState = {type: 'psyche-coordinator-state', version: 1, state: serializeState(this.current), peers: this.directory}
    try {
      writeFileAtomicSync(this.statePath, JSON.stringify(saved))
    } catch (error) {
      this.opts.log({event: 'error', where: 'save', path: this.statePath, message: (error as Error).message})
    }
  }

  /** Pushes the state and peer directory to every client (or one) that has not seen exactly this pair yet. */
  private pushState(only?: Session): void {
    const stateText = serializeState(this.current)
    const peersJson = JSON.stringify(this.directory)
    const key = `${stateText}\0${peersJson}`
    // Serialized once for all connections; each frame still signs its own session and sequence number.
    const json = `{"state":${JSON.stringify(stateText)},"peers":${peersJson},"server_time":${this.opts.now()}}`
    // Watchers (status, dashboards) also get the verification scores; training clients do not need them.
    const watcherKey = `${key}\0${this.scoresJson}`
    let watcherJson: string | undefined
    for (const s of only ? [only] : this.sessions) {
      if (!s.clientId || s.replaced) continue
      if (s.watcher) {
        if (s.lastState === watcherKey) continue
        s.lastState = watcherKey
        watcherJson ??= `${json.slice(0, -1)},"scores":${this.scoresJson}}`
        this.send(s, 'state', {json: watcherJson})
        continue
      }
      if (s.lastState === key) continue
      s.lastState = key
      this.send(s, 'state', {json})
    }
  }

  // ---- connections ----

  private accept(socket: Socket): void {
    if (this.stopping) {
      socket.destroy()
      return
    }
    const s: Session = {
      socket,
      peer: `${socket.remoteAddress}:${socket.remotePort}`,
      session: randomBytes(16).toString('hex'),
      reader: new FrameReader(Math.min(MAX_PRE_HELLO_FRAME_BYTES, this.opts.maxFrameBytes)),
      lastSeq: 0,
      sentSeq: 0,
      strikes: 0,
      replaced: false,
    }
    this.sessions.add(s)
    this.opts.log({event: 'connected', peer: s.peer})
    s.helloTimer = setTimeout(() => this.drop(s, 'hello_timeout', `no hello within ${this.opts.helloTimeoutMs} ms`), this.opts.helloTimeoutMs)
    s.helloTimer.unref()
    socket.on('data', (chunk) => this.onData(s, chunk))
    socket.on('error', () => {}) // reported by 'close'
    socket.on('close', () => this.onClose(s))
    this.send(s, 'challenge', {session: s.session})
  }

  private send<K extends ServerKind>(s: Session, kind: K, body: Parameters<typeof encodeServerMessage<K>>[3]): void {
    if (s.socket.destroyed || !s.socket.writable) return
    if (s.socket.writableLength > MAX_UNSENT_BYTES) {
      this.drop(s, 'slow_consumer', `more than ${MAX_UNSENT_BYTES} bytes unread`)
      return
    }
    s.sentSeq += 1
    const frame = encodeServerMessage(this.identity, kind, {run_id: this.runId, step: this.current.progress.step, seq: s.sentSeq, session: s.session}, body)
    this.work.framesOut++
    this.work.bytesOut += frame.length
    s.socket.write(frame)
  }

  /** Logs a refused message and tells the peer why; too many and the connection is closed. */
  private reject(s: Session, code: string, reason: string, of?: string, opts: {strike?: boolean} = {}): void {
    this.opts.log({event: 'rejected', peer: s.peer, ...(s.clientId ? {client: s.clientId} : {}), code, reason, ...(of ? {of} : {})})
    const body: ServerBodies['rejected'] = {code, reason: reason.slice(0, 4096)}
    if (of) body.of = of
    this.send(s, 'rejected', body)
    if (opts.strike !== false && ++s.strikes >= MAX_STRIKES) this.drop(s, 'too_many_rejections', `${MAX_STRIKES} invalid messages`)
  }

  /** Refuses and closes a connection: logged as a rejection, and the peer is told why (best effort). */
  private drop(s: Session, code: string, reason: string, of?: string): void {
    if (s.socket.destroyed || s.socket.writableEnded) return
    this.opts.log({event: 'rejected', peer: s.peer, ...(s.clientId ? {client: s.clientId} : {}), code, reason, ...(of ? {of} : {}), closed: true})
    if (code !== 'slow_consumer') {
      const body: ServerBodies['rejected'] = {code, reason}
      if (of) body.of = of
      this.send(s, 'rejected', body)
    }
    s.socket.end()
    // Do not wait for a peer that never reads: the socket goes after a grace period regardless.
    setTimeout(() => s.socket.destroy(), 1000).unref()
    s.reader = new FrameReader(0)
  }

  private onData(s: Session, chunk: Buffer): void {
    this.work.bytesIn += chunk.length
    try {
      for (const frame of s.reader.push(chunk)) {
        if (s.socket.destroyed || s.socket.writableEnded) return
        if (!frame.ok) {
          if (frame.fatal) this.drop(s, frame.reason, frame.detail)
          else this.reject(s, frame.reason, frame.detail)
          continue
        }
        this.onFrame(s, frame.body)
      }
    } catch (error) {
      // A bug, not the peer's fault; still never let it take the server down.
      this.opts.log({event: 'error', where: 'connection', peer: s.peer, message: (error as Error).message})
      this.drop(s, 'internal_error', 'the server failed to handle a message')
    }
  }

  private onFrame(s: Session, bytes: Buffer): void {
    const decoded = decodeClientMessage(bytes)
    if (!decoded.ok) return this.reject(s, decoded.reason, decoded.detail)
    const m = decoded.envelope
    if (m.session !== s.session) return this.reject(s, 'wrong_session', 'message signed for another connection (replayed?)', m.kind)
    if (m.seq <= s.lastSeq) return this.reject(s, 'replayed_seq', `sequence number ${m.seq} is not above ${s.lastSeq} (duplicate or replayed)`, m.kind)
    if (m.run_id !== this.runId) {
      const reason = `this server coordinates run "${this.runId}", not "${m.run_id.slice(0, 256)}"`
      // Before hello this is a client configured for another run: tell it and hang up.
      if (!s.clientId) return this.drop(s, 'wrong_run_id', reason, m.kind)
      return this.reject(s, 'wrong_run_id', reason, m.kind)
    }
    if (!s.clientId) {
      if (m.kind !== 'hello') return this.reject(s, 'expected_hello', `the first message must be hello, not ${m.kind}`, m.kind)
    } else if (m.from !== s.clientId) {
      return this.reject(s, 'wrong_sender', `this connection belongs to ${s.clientId}, not ${m.from}`, m.kind)
    }
    s.lastSeq = m.seq
    this.onMessage(s, m)
  }

  private onMessage(s: Session, m: ClientEnvelope): void {
    const from = m.from
    switch (m.kind) {
      case 'hello':
        return this.onHello(s, m)
      case 'witness':
      case 'health_check': {
        // Witness proofs and health checks are about a step; anything older than the current one is stale or replayed.
        const current = this.current.progress.step
        if (m.step < current) return this.reject(s, 'stale_step', `${m.kind} for step ${m.step}, but the run is at step ${current}`, m.kind)
        const event: CoordinatorEvent = m.kind === 'witness' ? {type: 'witness', from, step: m.step, proof: m.body.proof} : {type: 'health_check', from, accused: m.body.accused}
        return this.applyFrom(s, m.kind, event)
      }
      case 'accuse':
        return this.applyFrom(s, m.kind, {type: 'accuse', from, step: m.step, accused: m.body.accused, reason: m.body.reason})
      case 'equivocation':
        return this.applyFrom(s, m.kind, {type: 'equivocation', from, proof: m.body.proof})
      case 'withdraw':
        return this.applyFrom(s, m.kind, {type: 'withdraw', id: from})
      case 'checkpoint':
        return this.applyFrom(s, m.kind, {type: 'checkpoint', from, repo: m.body.repo})
      case 'report': {
        // Display only: logged for the metrics and dashboard layers, never an event of the coordinator.
        const current = this.current.progress.step
        if (m.step > current || m.step < current - 2) return this.reject(s, 'stale_step', `report for step ${m.step}, but the run is at step ${current}`, m.kind, {strike: false})
        this.opts.log({event: 'client_report', client: from, step: m.step, ...m.body})
        for (const w of this.sessions) if (w.watcher && !w.replaced) this.send(w, 'client_report', {client: from, step: m.step, report: m.body})
        return
      }
      case 'scores':
        return this.onScores(s, m.step, m.body.scores)
      case 'addresses':
        return this.setAddresses(s, from, m.body.p2p_addrs)
    }
  }

  /**
   * A verifier's scores of a round's results (scored while the next round runs): accepted from a verifier of the
   * current round, for a recent step, about clients of the run; kept as moving averages and shown to watchers.
   */
  private onScores(s: Session, step: number, scores: {client_id: ClientId; score: number}[]): void {
    const st = this.current
    const round = st.epoch.round
    const from = s.clientId!
    if (!round || !isRoundPhase(st.run_state)) return this.reject(s, 'InvalidRunState', `scores are accepted during rounds, not in ${st.run_state}`, 'scores', {strike: false})
    if (step >= round.step || step < round.step - 2) return this.reject(s, 'stale_step', `scores for step ${step}, but the round is step ${round.step}`, 'scores', {strike: false})
    if (!isVerifier(st, from, round)) return this.reject(s, 'InvalidScores', `client ${from} is not a verifier of step ${round.step}`, 'scores', {strike: false})
    const known = new Set([...st.epoch.clients.map((c) => c.id), ...st.epoch.exited.map((c) => c.id)])
    const unknown = scores.find((e) => !known.has(e.client_id))
    if (unknown) return this.reject(s, 'InvalidScores', `client ${unknown.client_id} is not in this epoch`, 'scores', {strike: false})
    if (!this.scoreBoard.report(from, step, scores)) return this.reject(s, 'DuplicateScores', `client ${from} already reported scores for step ${step}`, 'scores', {strike: false})
    const inRun = new Set([...known, ...st.pending])
    this.scoreBoard.forget((id) => inRun.has(id))
    this.scoresJson = JSON.stringify(this.scoreBoard.all())
    this.opts.log({event: 'scores', client: from, step, scores})
    this.pushState()
  }

  /** The verification scores the server keeps (moving averages of what verifiers reported), by client id. */
  get scores() {
    return this.scoreBoard.all()
  }

  private applyFrom(s: Session, kind: string, event: CoordinatorEvent): void {
    const result = this.apply(event)
    if (result.ok) this.opts.log({event: 'accepted', peer: s.peer, client: s.clientId, kind})
    // The coordinator's own refusals are normal in a distributed run (late proofs...): answered, not counted as violations.
    else this.reject(s, result.code, result.reason, kind, {strike: false})
  }

  private onHello(s: Session, m: Extract<ClientEnvelope, {kind: 'hello'}>): void {
    if (s.clientId) return this.reject(s, 'hello_twice', 'this connection already said hello', 'hello')
    const body = m.body
    if (body.client_id !== m.from) return this.reject(s, 'wrong_sender', `hello names client ${body.client_id} but is signed by ${m.from}`, 'hello')
    if (body.run_id !== this.runId) return this.drop(s, 'wrong_run_id', `this server coordinates run "${this.runId}", not "${body.run_id.slice(0, 256)}"`, 'hello')
    clearTimeout(s.helloTimer)
    const old = this.byClient.get(m.from)
    if (old && old !== s) {
      // The same identity reconnected before we noticed its old connection die: the new one wins.
      old.replaced = true
      this.drop(old, 'replaced', 'the client connected again')
    }
    s.clientId = m.from
    s.watcher = !body.want_join
    s.reader.maxFrameBytes = this.opts.maxFrameBytes
    this.byClient.set(m.from, s)
    this.opts.log({event: 'hello', peer: s.peer, client: m.from, want_join: body.want_join, p2p_addrs: body.p2p_addrs})
    const welcome: ServerBodies['welcome'] = {run_id: this.runId, client_id: m.from, server_time: this.opts.now()}
    const relay = this.opts.relayAddrs?.(s.socket.localAddress)
    if (relay && relay.length > 0) welcome.relay_addrs = relay
    this.send(s, 'welcome', welcome)
    const known = this.directory[m.from]
    const peersChanged = !known || known.length !== body.p2p_addrs.length || known.some((a, i) => a !== body.p2p_addrs[i])
    if (peersChanged) this.directory = {...this.directory, [m.from]: body.p2p_addrs}
    if (body.want_join) {
      const result = applyEvent(this.current, {type: 'join', id: m.from}, this.opts.now())
      if (result.error) {
        // A client that reconnects (e.g. after a server restart) is already in the run: nothing to refuse.
        if (result.error.code === 'AlreadyJoined') this.opts.log({event: 'rejoined', peer: s.peer, client: m.from, detail: result.error.message})
        else this.reject(s, result.error.code, result.error.message, 'hello', {strike: false})
      } else {
        this.opts.log({event: 'joined', peer: s.peer, client: m.from})
      }
      this.commit(result.state, peersChanged)
      this.advance()
    } else {
      this.commit(this.current, peersChanged)
    }
    // Every client gets the state right after its welcome, changed or not.
    this.pushState(s)
  }

  /** A client's libp2p addresses changed: the directory (and so every client) gets the new list. */
  private setAddresses(s: Session, from: ClientId, addrs: string[]): void {
    const known = this.directory[from]
    if (known && known.length === addrs.length && known.every((a, i) => a === addrs[i])) return
    this.directory = {...this.directory, [from]: addrs}
    this.opts.log({event: 'addresses', peer: s.peer, client: from, p2p_addrs: addrs})
    this.commit(this.current, true)
  }

  private onClose(s: Session): void {
    clearTimeout(s.helloTimer)
    this.sessions.delete(s)
    const id = s.clientId
    this.opts.log({event: 'disconnected', peer: s.peer, ...(id ? {client: id} : {})})
    if (!id || s.replaced || this.byClient.get(id) !== s) return
    this.byClient.delete(id)
    if (this.stopping || !this.opts.withdrawOnDisconnect) return
    const {[id]: _gone, ...rest} = this.directory
    this.directory = rest
    const result = applyEvent(this.current, {type: 'withdraw', id}, this.opts.now())
    if (!result.error) this.opts.log({event: 'withdrawn', client: id, reason: 'disconnected'})
    this.commit(result.state, true)
    this.advance()
  }
}

/**
 * The server's identity: the given one, else the one kept in saveStateDir (created there on first use, so clients
 * that pin it reconnect after a restart), else a new random one.
 */
export async function serverIdentity(saveStateDir: string | undefined, identity?: Identity): Promise<Identity> {
  if (identity) return identity
  if (!saveStateDir) return generateIdentity()
  mkdirSync(saveStateDir, {recursive: true})
  const identityPath = join(saveStateDir, SAVED_IDENTITY_FILE)
  if (existsSync(identityPath)) return loadIdentity(identityPath)
  const created = generateIdentity()
  await saveIdentity(created, identityPath)
  return created
}

function readSavedState(path: string, runId: string): {state: CoordinatorState; peers: PeerDirectory} {
  const bad = (what: string) => new PsycheError(`saved state ${path}: ${what} (move the file away to start the run afresh)`, {code: 'ESAVEDSTATE'})
  let saved: SavedState
  try {
    saved = JSON.parse(readFileSync(path, 'utf8'))
  } catch (error) {
    throw bad(`cannot read: ${(error as NodeJS.ErrnoException).code ?? (error as Error).message}`)
  }
  if (saved?.type !== 'psyche-coordinator-state' || saved.version !== 1 || typeof saved.state !== 'string') throw bad('not a psyche coordinator state file (version 1)')
  let state: CoordinatorState
  try {
    state = deserializeState(saved.state)
  } catch (error) {
    throw bad((error as Error).message)
  }
  if (state.run_id !== runId) throw bad(`it is run "${state.run_id}", but the state.toml is run "${runId}"`)
  const peers: PeerDirectory = {}
  if (saved.peers && typeof saved.peers === 'object') {
    for (const [k, v] of Object.entries(saved.peers)) if (Array.isArray(v) && v.every((a) => typeof a === 'string')) peers[k] = v
  }
  return {state, peers}
}
