import {randomBytes} from 'node:crypto'
import {existsSync, mkdirSync, readFileSync} from 'node:fs'
import {createServer, type Server, type Socket} from 'node:net'
import {join} from 'node:path'
import type {RunConfigFile} from '../../config/types.js'
import {applyEvent, createCoordinator, deserializeState, isRoundPhase, isVerifier, serializeState, tick} from '../../coordinator/index.js'
import type {ClientId, CoordinatorEvent, CoordinatorState} from '../../coordinator/types.js'
import type {PeerDirectory} from '../types.js'
import {PsycheError} from '../../errors.js'
import {sha256Hex} from '../../primitives/hash.js'
import {diffState} from '../../protocol/state-delta.js'
import {writeFileAtomicSync} from '../../protocol/atomic-file.js'
import {DEFAULT_MAX_FRAME_BYTES, FrameReader} from '../../protocol/frames.js'
import {generateIdentity, loadIdentity, saveIdentity, type Identity} from '../../protocol/identity.js'
import {checkLedger, emptyLedger, observeTransition, recordScores, rewardRows, scoreRows, scoreToFixed, type RewardsLedger} from '../../coordinator/rewards.js'
import {PeerBook} from './directory.js'
import {DEFAULT_LIMITS, effectiveMaxConnections, LIMIT_FLAGS, RateLimiter, type RetryableRefusal, type ServerLimits} from './limits.js'
import {decodeClientMessage, encodeServerMessage, MAX_FORWARDED_REPORTS, type ClientEnvelope, type ServerBodies, type ServerKind} from '../../protocol/messages.js'
import type {EventLog} from '../../events.js'

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
  log?: EventLog
  /** The coordinator's clock: unix milliseconds (default: Date.now). */
  now?: () => number
  /** Largest frame accepted from a client once it said hello (default 16 MiB; 64 KiB before). */
  maxFrameBytes?: number
  /**
   * Bounds on what strangers can make the server hold (limits.ts: DEFAULT_LIMITS; each a flag of psyche server run).
   * The connection bound is lowered to what `ulimit -n` leaves room for.
   */
  limits?: Partial<ServerLimits>
  /** A connection must say hello within this time (default 10 s). */
  helloTimeoutMs?: number
  /**
   * The run's circuit relay (psyche server run starts one): each client is told its addresses in the welcome, as
   * that client can dial them (`localAddress`: the server address its TCP connection arrived on).
   */
  relayAddrs?: (localAddress: string | undefined) => string[]
  /**
   * How often a connection that is not training in the epoch (a watcher, a client waiting for the next epoch) gets the
   * newest state, in milliseconds (default 1000; 0: at every change, as the epoch's clients). The epoch's clients get
   * each change at once; the rest, however many, cannot make the server sign and send a frame each per change.
   */
  passiveStateMs?: number
  /**
   * The entropy mixed into the seed of each round this server starts (coordinator tick/witness entropy, as the Solana
   * program mixes its clock's slot:unix_timestamp). Default: the server's clock, a count, and 16 random bytes, fresh at
   * every tick and every witness, so no client can work out a round's witnesses or batches before the round starts.
   * Tests give a fixed one to reproduce a run.
   */
  entropy?: () => string
}

/** File names inside saveStateDir. */
export const SAVED_STATE_FILE = 'coordinator-state.json'
export const SAVED_IDENTITY_FILE = 'server-identity.json'

/** Until a peer has said hello it may only send small frames (a hello is well under this). */
export const MAX_PRE_HELLO_FRAME_BYTES = 64 * 1024
/** How often connections not training in the epoch get the newest state (CoordinatorServerOptions.passiveStateMs). */
export const DEFAULT_PASSIVE_STATE_MS = 1000
/** Protocol violations a connection may commit before it is closed (each is logged and answered). */
const MAX_STRIKES = 16

interface Session {
  socket: Socket
  peer: string
  /** The remote IP address (connections per address are bounded). */
  ip: string
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
  /** The peer directory version this connection has (undefined: none yet, so its next state carries all of it). */
  peersVersion?: number
  /** Asked for state deltas in its hello: after a whole state, each change comes as ops on the revision it holds. */
  deltas?: boolean
  /** The state revision this connection holds (undefined: none yet). */
  stateRev?: number
  /** The libp2p addresses the client announced last: its directory entry while it is a member of the run. */
  addrs: string[]
  /**
   * Not training in the epoch, it gets states on a cadence (passiveStateMs): at most one in each period of that length,
   * the periods of each connection shifted by `phase` ms so that they do not all fall due on the same tick.
   */
  phase: number
  /** When it was last sent a state (performance.now() ms). */
  pushedAt: number
  /** Since when its output has been backed up, as seen when a state fell due (undefined: it reads). */
  backedUpSince?: number
  /** A watcher: the sequence number of the last client report it was sent (its next state carries the later ones). */
  reportSeq: number
}

interface SavedState {
  type: 'psyche-coordinator-state'
  version: 1
  state: string
  peers: PeerDirectory
  /** The rewards ledger (absent in files saved before there was one: an empty ledger). */
  rewards?: RewardsLedger
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
  /** Connections that have not said hello yet, watchers, and connections per remote address (all bounded). */
  private readonly handshaking = new Set<Session>()
  private readonly watchers = new Set<Session>()
  private readonly perIp = new Map<string, number>()
  private readonly joins: RateLimiter
  private timer?: NodeJS.Timeout
  private stopping = false
  /** A flush (save, then push to the epoch's clients) is scheduled: state changes in one turn of the event loop go out once. */
  private flushScheduled = false
  private unsaved = false
  /** The epoch's training clients of a state (they get every change at once), computed once per state. */
  private activeOf?: {state: CoordinatorState; ids: Set<ClientId>}
  /** The round trainers' recent reports (JSON, numbered), for watchers: each watcher's next state carries the ones it has not had. */
  private readonly reports: {seq: number; json: string}[] = []
  private reportSeq = 0
  /** The whole peer directory as JSON at one version (every new connection's first state carries it). */
  private wholeDirectory?: {version: number; json: string}
  private statePath?: string
  /**
   * The rewards ledger (coordinator/rewards.ts): verifiers' scores as moving averages, and the points each client earned
   * for its accepted results. Follows every state the server adopts; saved with the state. Never an input of the
   * coordinator machine.
   */
  private rewards: RewardsLedger
  /** The scores and reward rows as watchers get them (serialized when a watcher needs them after a change). */
  private watcherJsonCache: string | undefined
  /** Counts the changes of what watchers get besides the state (a watcher's dedupe key holds it, not the JSON). */
  private watcherJsonVersion = 0
  /**
   * State revisions (each state the server adopts and pushes gets the next number) and the delta from the previous
   * one, computed once for every connection that holds that one (protocol/state-delta.ts).
   */
  private revision: {rev: number; state?: CoordinatorState; text: string; hash: string; previous?: CoordinatorState; delta?: string | null} = {rev: 0, text: '', hash: ''}
  /** What the server did, cumulative (the scale bench and test divide it per round): frames and bytes out and in, states adopted. */
  readonly work = {framesOut: 0, bytesOut: 0, bytesIn: 0, commits: 0}

  private constructor(
    private readonly net: Server,
    readonly identity: Identity,
    private current: CoordinatorState,
    private readonly book: PeerBook,
    rewards: RewardsLedger,
    private readonly opts: Required<Pick<CoordinatorServerOptions, 'withdrawOnDisconnect' | 'maxFrameBytes' | 'helloTimeoutMs' | 'passiveStateMs' | 'entropy'>> & {
      log: EventLog
      now: () => number
      saveStateDir?: string
      relayAddrs?: (localAddress: string | undefined) => string[]
      limits: ServerLimits
    },
  ) {
    if (opts.saveStateDir) this.statePath = join(opts.saveStateDir, SAVED_STATE_FILE)
    this.rewards = rewards
    this.joins = new RateLimiter(opts.limits.joinsPerSecond, () => Date.now(), opts.limits.joinBurst)
    const listed = directoryMembers(current)
    this.book.retain((id) => listed.has(id))
  }

  /** The bounds this server enforces (the connection bound as lowered to fit `ulimit -n`). */
  get limits(): ServerLimits {
    return {...this.opts.limits}
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
    let rewards = emptyLedger()
    let resumedFrom: string | undefined
    if (options.saveStateDir) {
      identity = await serverIdentity(options.saveStateDir, identity)
      const statePath = join(options.saveStateDir, SAVED_STATE_FILE)
      if (existsSync(statePath)) {
        ;({state, peers, rewards} = readSavedState(statePath, runId))
        resumedFrom = statePath
      }
    }
    identity ??= generateIdentity()
    state ??= createCoordinator(options.run, {now: now()})

    const limits = {...DEFAULT_LIMITS, ...options.limits}
    for (const [key, value] of Object.entries(limits) as [keyof ServerLimits, number][]) {
      if (!Number.isInteger(value) || value < 1) throw new PsycheError(`${LIMIT_FLAGS[key]}: ${value} is not a positive whole number`, {exitCode: 2, code: 'EUSAGE'})
    }
    if (options.run.config.init_min_clients > limits.maxMembers || options.run.config.min_clients > limits.maxMembers) {
      throw new PsycheError(
        `${options.run.path}: config.init_min_clients (${options.run.config.init_min_clients}) and config.min_clients (${options.run.config.min_clients}) must be at most ${LIMIT_FLAGS.maxMembers} ${limits.maxMembers}`,
        {code: 'ECONFIG'},
      )
    }
    const connections = effectiveMaxConnections(limits.maxConnections)
    if (connections.lowered) log({event: 'limit_lowered', limit: LIMIT_FLAGS.maxConnections, to: connections.max, reason: connections.lowered})
    limits.maxConnections = connections.max
    const net = createServer({noDelay: true})
    // The kernel-side backstop: past this Node closes new sockets at once (we refuse with a reason below it).
    net.maxConnections = limits.maxConnections + 64
    const server = new CoordinatorServer(net, identity, state, new PeerBook(peers), rewards, {
      withdrawOnDisconnect: options.withdrawOnDisconnect ?? true,
      maxFrameBytes: options.maxFrameBytes ?? DEFAULT_MAX_FRAME_BYTES,
      helloTimeoutMs: options.helloTimeoutMs ?? 10_000,
      passiveStateMs: options.passiveStateMs ?? DEFAULT_PASSIVE_STATE_MS,
      entropy: options.entropy ?? serverEntropy(now),
      log,
      now,
      saveStateDir: options.saveStateDir,
      relayAddrs: options.relayAddrs,
      limits,
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
    server.timer = setInterval(() => server.onTimer(), options.tickIntervalMs ?? 50)
    // 'listening' comes first: launchers read the port from the first log line.
    log({event: 'listening', host: options.host ?? '127.0.0.1', port: server.port, run_id: runId, server_id: identity.id, run_state: state.run_state, step: state.progress.step})
    if (!state.config.checkpointers?.length)
      log({event: 'warning', message: 'config.checkpointers is not set: any client of an epoch may name the run’s Hub checkpoint (list the checkpointers’ ids)'})
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

  /** Member id → the libp2p multiaddrs it announced (members of the run only: pending or healthy in the epoch). */
  get peers(): PeerDirectory {
    return this.book.snapshot()
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
    // A state adopted in this turn of the event loop is kept (its push would go to connections that are closing).
    if (this.unsaved) this.save()
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
      this.commit(tick(this.current, this.opts.now(), this.opts.entropy()))
    } catch (error) {
      this.opts.log({event: 'error', where: 'tick', message: (error as Error).message})
    }
  }

  /** The timer's tick: the coordinator's, then the states due to connections on the passive cadence. */
  private onTimer(): void {
    this.advance()
    if (this.stopping || this.opts.passiveStateMs <= 0) return
    const period = this.opts.passiveStateMs
    const at = performance.now()
    const rev = this.revise().rev
    const version = this.book.current
    const due: Session[] = []
    for (const s of this.sessions) {
      if (!s.clientId || s.replaced || this.isActive(s)) continue
      // Due once a new period of its own has begun since its last state.
      if (Math.floor((at - s.phase) / period) <= Math.floor((s.pushedAt - s.phase) / period)) continue
      // One that has not read what it was sent gets nothing new (it gets the newest state once it reads again): a
      // connection that never reads costs what the kernel's buffers took, then nothing, until it is closed.
      if (s.socket.writableLength > 0) {
        s.backedUpSince ??= at
        const limit = this.opts.limits.stallTimeoutSeconds
        if (at - s.backedUpSince > limit * 1000) this.drop(s, 'slow_consumer', `it has not read what it was sent for ${limit} s (${LIMIT_FLAGS.stallTimeoutSeconds})`)
        continue
      }
      s.backedUpSince = undefined
      if (s.lastState !== this.stateKey(s, rev) || s.peersVersion !== version) due.push(s)
    }
    if (due.length > 0) this.pushState(due)
  }

  /** A connection of one of the epoch's training clients: it gets every state change at once. */
  private isActive(s: Session): boolean {
    if (this.opts.passiveStateMs <= 0) return true
    if (s.watcher || !s.clientId) return false
    if (this.activeOf?.state !== this.current) {
      const ids = new Set<ClientId>()
      for (const c of this.current.epoch.clients) if (c.state === 'Healthy') ids.add(c.id)
      this.activeOf = {state: this.current, ids}
    }
    return this.activeOf.ids.has(s.clientId)
  }

  /** Applies a client's event; on success ticks at once (a join or a quorum may start a phase). */
  private apply(event: CoordinatorEvent): {ok: true} | {ok: false; code: string; reason: string} {
    const result = applyEvent(this.current, event, this.opts.now())
    if (result.error) return {ok: false, code: result.error.code, reason: result.error.message}
    this.commit(result.state)
    this.advance()
    return {ok: true}
  }

  /** Adopts a new state: logs a phase change; the save and the push follow in this turn's flush. */
  private commit(next: CoordinatorState, peersChanged = false): void {
    const previous = this.current
    if (next === previous && !peersChanged) return
    this.current = next
    this.work.commits++
    const before = this.rewards
    this.rewards = observeTransition(before, previous, next)
    this.watcherJsonCache = undefined
    this.watcherJsonVersion++
    if (this.rewards.epochs !== before.epochs) {
      const clients = Object.values(this.rewards.clients)
        .map((e) => ({client_id: e.client_id, earned: e.earned - (before.clients[e.client_id]?.earned ?? 0), slashed: e.slashed - (before.clients[e.client_id]?.slashed ?? 0)}))
        .filter((e) => e.earned > 0 || e.slashed > 0)
      this.opts.log({event: 'epoch_rewards', epoch: previous.progress.epoch, clients})
    }
    // The directory holds the run's members only: a client that left, was ejected or dropped leaves it.
    if (next !== previous) {
      const listed = directoryMembers(next)
      if (this.book.retain((id) => listed.has(id))) peersChanged = true
    }
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
    this.unsaved = true
    if (this.flushScheduled) return
    this.flushScheduled = true
    setImmediate(() => this.flush())
  }

  /**
   * Saves and pushes what the state changes of this turn of the event loop came to, once: a burst of hellos, joins or
   * disconnections (an attack) costs one save and one frame per connection, not one per change.
   */
  private flush(): void {
    this.flushScheduled = false
    if (this.stopping) return
    if (this.unsaved) this.save()
    this.pushState()
  }

  private save(): void {
    this.unsaved = false
    if (!this.statePath) return
    const saved: SavedState = {type: 'psyche-coordinator-state', version: 1, state: serializeState(this.current), peers: this.book.snapshot(), rewards: this.rewards}
    try {
      writeFileAtomicSync(this.statePath, JSON.stringify(saved))
    } catch (error) {
      this.opts.log({event: 'error', where: 'save', path: this.statePath, message: (error as Error).message})
    }
  }

  /**
   * Pushes the state to the given connections (default: the epoch's clients; the rest are served on the passive
   * cadence by onTimer) that have not seen it yet, with what changed in the peer directory since the version each
   * connection has (the whole directory once, on a connection's first state; deltas after).
   */
  private pushState(to?: Iterable<Session>): void {
    const rev = this.revise()
    const version = this.book.current
    const now = this.opts.now()
    const head = `{"state":${JSON.stringify(rev.text)},"rev":${rev.rev},"server_time":${now}`
    // A client that asked for deltas and holds the previous revision (all of them after their first state) gets the
    // change alone; with N clients a whole state per event was O(N²) bytes and signatures.
    const deltaHead = (base: number) => {
      const ops = base === rev.rev ? '[]' : rev.delta
      return ops == null ? undefined : `{"base":${base},"rev":${rev.rev},"ops":${ops},"hash":"${rev.hash}","server_time":${now}`
    }
    // Serialized once per directory version the connections are at (nearly all at the same one); each frame still
    // signs its own session and sequence number.
    const peerParts = new Map<number | undefined, string>()
    const peersFor = (since: number | undefined): string => {
      let part = peerParts.get(since)
      if (part === undefined && since === undefined && this.wholeDirectory?.version === version) part = this.wholeDirectory.json
      if (part === undefined) {
        const delta = this.book.deltaSince(since)
        part = `,"peers":${JSON.stringify(delta.set)}${delta.reset ? ',"peers_reset":true' : ''}${delta.removed.length > 0 ? `,"peers_removed":${JSON.stringify(delta.removed)}` : ''}`
        peerParts.set(since, part)
        if (since === undefined) this.wholeDirectory = {version, json: part}
      }
      return part
    }
    const at = performance.now()
    for (const s of to ?? this.sessions) {
      if (!s.clientId || s.replaced || (to === undefined && !this.isActive(s))) continue
      const key = this.stateKey(s, rev.rev)
      if (s.lastState === key && s.peersVersion === version) continue
      const asDelta = s.deltas && s.stateRev !== undefined && (s.stateRev === rev.rev || s.stateRev === rev.rev - 1) ? deltaHead(s.stateRev) : undefined
      const body = `${asDelta ?? head}${peersFor(s.peersVersion)}`
      s.lastState = key
      s.peersVersion = version
      s.stateRev = rev.rev
      s.pushedAt = at
      // Watchers (status, dashboards) also get the verification scores and rewards, and the reports since their last
      // state; training clients do not need them.
      const json = s.watcher ? `${body}${this.watcherJson}${this.reportsFor(s)}}` : `${body}}`
      if (asDelta) this.send(s, 'state_delta', {json})
      else this.send(s, 'state', {json})
    }
    this.boundUnsent()
  }

  /** What a connection has seen when it is up to date: the state's revision (and, for a watcher, its reports, scores and rewards). */
  private stateKey(s: Session, rev: number): string {
    return s.watcher ? `${rev}\0${this.reportSeq}\0${this.watcherJsonVersion}` : `${rev}`
  }

  /** The reports a watcher has not had yet, as the `reports` part of its state (empty when none). */
  private reportsFor(s: Session): string {
    if (s.reportSeq >= this.reportSeq) return ''
    const since = s.reportSeq
    s.reportSeq = this.reportSeq
    const fresh = this.reports.filter((r) => r.seq > since)
    return fresh.length === 0 ? '' : `,"reports":[${fresh.map((r) => r.json).join(',')}]`
  }

  /**
   * Keeps what all connections have not read under maxUnsentBytesTotal: past it, the connections with the most
   * unread bytes (the slowest readers, or ones that never read) are cut off first.
   */
  private boundUnsent(): void {
    const cap = this.opts.limits.maxUnsentBytesTotal
    let total = 0
    for (const s of this.sessions) total += s.socket.writableLength
    if (total <= cap) return
    const slowest = [...this.sessions].filter((s) => s.socket.writableLength > 0).sort((a, b) => b.socket.writableLength - a.socket.writableLength)
    for (const s of slowest) {
      if (total <= cap) break
      total -= s.socket.writableLength
      this.drop(
        s,
        'slow_consumer',
        `the server holds more than ${cap} unread bytes for all connections (${LIMIT_FLAGS.maxUnsentBytesTotal}); this one is among the slowest readers`,
      )
    }
  }

  /** The current state's revision: a new one (with its delta from the previous) when the state changed since the last push. */
  private revise(): {rev: number; text: string; hash: string; delta?: string | null} {
    const r = this.revision
    if (r.state === this.current) return r
    const text = serializeState(this.current)
    if (r.state !== undefined && text === r.text) {
      r.state = this.current
      return r
    }
    const previous = r.state
    this.revision = {rev: r.rev + 1, state: this.current, text, hash: sha256Hex(text), previous}
    const ops = previous ? diffState(previous, this.current) : undefined
    this.revision.delta = ops ? JSON.stringify(ops) : null
    return this.revision
  }

  // ---- connections ----

  private accept(socket: Socket): void {
    if (this.stopping) {
      socket.destroy()
      return
    }
    const ip = socket.remoteAddress ?? '?'
    const limits = this.opts.limits
    const refusal =
      this.sessions.size >= limits.maxConnections
        ? (['too_many_connections', `the server holds ${limits.maxConnections} connections (${LIMIT_FLAGS.maxConnections})`] as const)
        : (this.perIp.get(ip) ?? 0) >= limits.maxConnectionsPerIp
          ? (['too_many_connections_from_address', `${ip} has ${limits.maxConnectionsPerIp} connections open (${LIMIT_FLAGS.maxConnectionsPerIp})`] as const)
          : this.handshaking.size >= limits.maxHandshakes
            ? (['too_many_handshakes', `${limits.maxHandshakes} connections have not said hello yet (${LIMIT_FLAGS.maxHandshakes})`] as const)
            : undefined
    if (refusal) return this.refuse(socket, refusal[0], refusal[1])
    this.perIp.set(ip, (this.perIp.get(ip) ?? 0) + 1)
    const s: Session = {
      socket,
      peer: `${socket.remoteAddress}:${socket.remotePort}`,
      ip,
      addrs: [],
      session: randomBytes(16).toString('hex'),
      reader: new FrameReader(Math.min(MAX_PRE_HELLO_FRAME_BYTES, this.opts.maxFrameBytes)),
      lastSeq: 0,
      sentSeq: 0,
      strikes: 0,
      replaced: false,
      phase: Math.random() * this.opts.passiveStateMs,
      pushedAt: performance.now(),
      // A new watcher gets the recent reports the server keeps with its first state (psyche status reads them).
      reportSeq: 0,
    }
    this.sessions.add(s)
    this.handshaking.add(s)
    this.opts.log({event: 'connected', peer: s.peer})
    s.helloTimer = setTimeout(() => this.drop(s, 'hello_timeout', `no hello within ${this.opts.helloTimeoutMs} ms`), this.opts.helloTimeoutMs)
    s.helloTimer.unref()
    socket.on('data', (chunk) => this.onData(s, chunk))
    socket.on('error', () => {}) // reported by 'close'
    socket.on('close', () => this.onClose(s))
    // A peer that vanished without a FIN is noticed even when nothing is sent to it.
    socket.setKeepAlive(true, 30_000)
    this.send(s, 'challenge', {session: s.session})
  }

  /** Refuses a new connection over a bound: one signed `rejected` naming the bound, then closed (logged). */
  private refuse(socket: Socket, code: RetryableRefusal, reason: string): void {
    this.opts.log({event: 'rejected', peer: `${socket.remoteAddress}:${socket.remotePort}`, code, reason, closed: true})
    socket.on('error', () => {})
    socket.end(
      encodeServerMessage(this.identity, 'rejected', {run_id: this.runId, step: this.current.progress.step, seq: 1, session: randomBytes(16).toString('hex')}, {code, reason}),
    )
    setTimeout(() => socket.destroy(), 1000).unref()
  }

  private send<K extends ServerKind>(s: Session, kind: K, body: Parameters<typeof encodeServerMessage<K>>[3]): void {
    if (s.socket.destroyed || !s.socket.writable) return
    if (s.socket.writableLength > this.opts.limits.maxUnsentBytes) {
      this.drop(s, 'slow_consumer', `more than ${this.opts.limits.maxUnsentBytes} bytes unread (${LIMIT_FLAGS.maxUnsentBytes})`)
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
    s.reader = new FrameReader(0)
    // A peer that does not read has had its chance: what is queued for it is let go at once.
    if (code === 'slow_consumer') {
      s.socket.destroy()
      return
    }
    s.socket.end()
    // Do not wait for a peer that never reads: the socket goes after a grace period regardless.
    setTimeout(() => s.socket.destroy(), 1000).unref()
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
        // (A Cooldown witness attests the epoch's last round, the step before the run's.)
        const current = this.current.progress.step
        const oldest = m.kind === 'witness' && m.body.param_hash !== undefined ? current - 1 : current
        if (m.step < oldest) return this.reject(s, 'stale_step', `${m.kind} for step ${m.step}, but the run is at step ${current}`, m.kind)
        // The last warmup witness starts the first round: like a tick, it carries the server's entropy into that round's seed.
        const event: CoordinatorEvent =
          m.kind === 'witness'
            ? {type: 'witness', from, step: m.step, proof: m.body.proof, entropy: this.opts.entropy(), ...(m.body.param_hash === undefined ? {} : {param_hash: m.body.param_hash})}
            : {type: 'health_check', from, accused: m.body.accused}
        return this.applyFrom(s, m.kind, event)
      }
      case 'accuse':
        return this.applyFrom(s, m.kind, {type: 'accuse', from, step: m.step, accused: m.body.accused, reason: m.body.reason})
      case 'equivocation':
        return this.applyFrom(s, m.kind, {type: 'equivocation', from, proof: m.body.proof})
      case 'withdraw':
        return this.applyFrom(s, m.kind, {type: 'withdraw', id: from})
      case 'checkpoint':
        return this.applyFrom(s, m.kind, {type: 'checkpoint', from, repo: m.body.repo, ...(m.body.param_hash === undefined ? {} : {param_hash: m.body.param_hash})})
      case 'report': {
        // Display only: logged for the metrics and dashboard layers, never an event of the coordinator.
        const current = this.current.progress.step
        if (m.step > current || m.step < current - 2) return this.reject(s, 'stale_step', `report for step ${m.step}, but the run is at step ${current}`, m.kind, {strike: false})
        // Only a trainer of a recent round has anything to report: anyone else's numbers would reach dashboards and history.
        const trainers = [this.current.epoch.round, this.current.epoch.previous_round].flatMap((r) => r?.roster ?? [])
        if (!trainers.includes(from)) return this.reject(s, 'not_a_trainer', `client ${from} trained in neither of the last two rounds`, m.kind, {strike: false})
        this.opts.log({event: 'client_report', client: from, step: m.step, ...m.body})
        // Watchers get it with their next state (on their cadence), not as a frame each.
        this.reports.push({seq: ++this.reportSeq, json: JSON.stringify({client: from, step: m.step, report: m.body})})
        if (this.reports.length > MAX_FORWARDED_REPORTS) this.reports.splice(0, this.reports.length - MAX_FORWARDED_REPORTS)
        if (this.opts.passiveStateMs <= 0) this.pushState([...this.watchers])
        return
      }
      case 'scores':
        return this.onScores(s, m.step, m.body.scores)
      case 'addresses':
        return this.setAddresses(s, from, m.body.p2p_addrs)
      case 'resync':
        // Its next state is a whole one (a delta did not apply on its side).
        s.stateRev = undefined
        s.lastState = undefined
        return this.pushState([s])
    }
  }

  /**
   * A verifier's scores of a round's results (scored while the next round runs): accepted by the ledger's rule (from
   * a verifier of the next round, for the trainers the seed assigned it: rewards.ts recordScores); kept as moving
   * averages and shown to watchers.
   */
  private onScores(s: Session, step: number, scores: {client_id: ClientId; score: number}[]): void {
    const from = s.clientId!
    const fixed = scores.map((e) => ({client_id: e.client_id, score: scoreToFixed(e.score)}))
    const rewards = recordScores(this.rewards, this.current, from, step, fixed)
    if ('code' in rewards) return this.reject(s, rewards.code, rewards.reason, 'scores', {strike: false})
    this.rewards = rewards
    this.watcherJsonCache = undefined
    this.watcherJsonVersion++
    this.opts.log({event: 'scores', client: from, step, scores})
    this.save()
    this.pushState()
  }

  private get watcherJson(): string {
    this.watcherJsonCache ??= `,"scores":${JSON.stringify(scoreRows(this.rewards))},"rewards":${JSON.stringify(rewardRows(this.rewards, this.current))}`
    return this.watcherJsonCache
  }

  /** The verification scores the server keeps (moving averages of what verifiers reported), by client id. */
  get scores() {
    return scoreRows(this.rewards)
  }

  /** Each client's rewards: score, accepted rounds and batches, pending, earned and slashed points (coordinator/rewards.ts). */
  get rewardRows() {
    return rewardRows(this.rewards, this.current)
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
    if (!body.want_join && !this.watchers.has(s) && this.watchers.size >= this.opts.limits.maxWatchers) {
      return this.drop(s, 'too_many_watchers', `${this.opts.limits.maxWatchers} connections watch the run (${LIMIT_FLAGS.maxWatchers})`, 'hello')
    }
    clearTimeout(s.helloTimer)
    this.handshaking.delete(s)
    const old = this.byClient.get(m.from)
    if (old && old !== s) {
      // The same identity reconnected before we noticed its old connection die: the new one wins.
      old.replaced = true
      this.drop(old, 'replaced', 'the client connected again')
    }
    s.clientId = m.from
    s.watcher = !body.want_join
    s.deltas = body.state_deltas === true
    if (s.watcher) this.watchers.add(s)
    s.addrs = body.p2p_addrs
    s.reader.maxFrameBytes = this.opts.maxFrameBytes
    this.byClient.set(m.from, s)
    this.opts.log({event: 'hello', peer: s.peer, client: m.from, want_join: body.want_join, p2p_addrs: body.p2p_addrs})
    const welcome: ServerBodies['welcome'] = {run_id: this.runId, client_id: m.from, server_time: this.opts.now()}
    const relay = this.opts.relayAddrs?.(s.socket.localAddress)
    if (relay && relay.length > 0) welcome.relay_addrs = relay
    this.send(s, 'welcome', welcome)
    if (body.want_join) {
      const refusal = this.joinRefusal(m.from)
      const result = refusal ? {state: this.current, error: refusal} : applyEvent(this.current, {type: 'join', id: m.from}, this.opts.now())
      if (result.error) {
        // A client that reconnects (e.g. after a server restart) is already in the run: nothing to refuse.
        if (result.error.code === 'AlreadyJoined') this.opts.log({event: 'rejoined', peer: s.peer, client: m.from, detail: result.error.message})
        else {
          this.reject(s, result.error.code, result.error.message, 'hello', {strike: false})
          // It stays to watch the run (a client asks again through a new connection): it counts as a watcher.
          if (this.watchers.size >= this.opts.limits.maxWatchers) {
            return this.drop(s, 'too_many_watchers', `${this.opts.limits.maxWatchers} connections watch the run (${LIMIT_FLAGS.maxWatchers})`, 'hello')
          }
          this.watchers.add(s)
        }
      } else {
        this.opts.log({event: 'joined', peer: s.peer, client: m.from})
      }
      // Its addresses go in the directory once it is a member (joined now, or already).
      const peersChanged = directoryMembers(result.state).has(m.from) && this.book.set(m.from, s.addrs)
      this.commit(result.state, peersChanged)
      this.advance()
    }
    // Every client gets the state right after its welcome, changed or not.
    this.pushState([s])
  }

  /**
   * Why a join is refused before the coordinator sees it: the run is at its member bound, or joins arrive faster
   * than the server paces them (a join storm). A client already in the run is never refused here.
   */
  private joinRefusal(id: ClientId): {code: string; message: string} | undefined {
    if (isMember(this.current, id)) return undefined
    const limits = this.opts.limits
    if (memberCount(this.current) >= limits.maxMembers) return {code: 'run_full', message: `the run has ${limits.maxMembers} members (${LIMIT_FLAGS.maxMembers})`}
    if (!this.joins.take())
      return {
        code: 'join_rate',
        message: `joins are accepted at ${limits.joinsPerSecond} per second after a burst of ${limits.joinBurst} (${LIMIT_FLAGS.joinsPerSecond}, ${LIMIT_FLAGS.joinBurst}); try again shortly`,
      }
    return undefined
  }

  /** A client's libp2p addresses changed: a member's directory entry (and so every client) gets the new list. */
  private setAddresses(s: Session, from: ClientId, addrs: string[]): void {
    s.addrs = addrs
    if (!directoryMembers(this.current).has(from) || !this.book.set(from, addrs)) return
    this.opts.log({event: 'addresses', peer: s.peer, client: from, p2p_addrs: addrs})
    this.commit(this.current, true)
  }

  private onClose(s: Session): void {
    clearTimeout(s.helloTimer)
    this.sessions.delete(s)
    this.handshaking.delete(s)
    this.watchers.delete(s)
    const n = (this.perIp.get(s.ip) ?? 1) - 1
    if (n <= 0) this.perIp.delete(s.ip)
    else this.perIp.set(s.ip, n)
    const id = s.clientId
    this.opts.log({event: 'disconnected', peer: s.peer, ...(id ? {client: id} : {})})
    if (!id || s.replaced || this.byClient.get(id) !== s) return
    this.byClient.delete(id)
    if (this.stopping || !this.opts.withdrawOnDisconnect) return
    this.book.remove(id)
    const result = applyEvent(this.current, {type: 'withdraw', id}, this.opts.now())
    if (!result.error) this.opts.log({event: 'withdrawn', client: id, reason: 'disconnected'})
    this.commit(result.state, true)
    this.advance()
  }
}

/**
 * The centralized server's round entropy: "unix_ms:count:random" — its clock (as the Solana program's slot:unix_timestamp),
 * a count of the entropies it has drawn, and 16 fresh random bytes (hex), so no one can compute a round's seed ahead.
 */
function serverEntropy(now: () => number): () => string {
  let count = 0
  return () => `${now()}:${++count}:${randomBytes(16).toString('hex')}`
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

function readSavedState(path: string, runId: string): {state: CoordinatorState; peers: PeerDirectory; rewards: RewardsLedger} {
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
  let rewards = emptyLedger()
  try {
    if (saved.rewards !== undefined) rewards = checkLedger(saved.rewards)
  } catch (error) {
    throw bad((error as Error).message)
  }
  return {state, peers, rewards}
}

/** Members of the run: clients waiting to join the next epoch, and the epoch's healthy clients. */
function isMember(state: CoordinatorState, id: ClientId): boolean {
  return state.pending.includes(id) || state.epoch.clients.some((c) => c.id === id && c.state === 'Healthy')
}

/**
 * Who the peer directory lists: the members, and the epoch's clients that left it this round (a dropped trainer's
 * result may still be fetched) until the round ends; never an ejected client, a watcher or a stranger.
 */
function directoryMembers(state: CoordinatorState): Set<ClientId> {
  const ids = new Set(state.pending)
  for (const c of state.epoch.clients) if (c.state !== 'Ejected') ids.add(c.id)
  return ids
}

function memberCount(state: CoordinatorState): number {
  const ids = new Set(state.pending)
  for (const c of state.epoch.clients) if (c.state === 'Healthy') ids.add(c.id)
  return ids.size
}
