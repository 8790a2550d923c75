import {randomBytes} from 'node:crypto'
import {createServer, type Server} from 'node:net'
import type {RunConfigFile} from '../../config/types.js'
import {applyEvent, createCoordinator, tick} from '../../coordinator/index.js'
import {emptyLedger, type RewardsLedger} from '../../coordinator/rewards.js'
import type {ClientId, CoordinatorEvent, CoordinatorState} from '../../coordinator/types.js'
import {PsycheError} from '../../errors.js'
import type {EventLog} from '../../events.js'
import {DEFAULT_MAX_FRAME_BYTES} from '../../protocol/frames.js'
import type {Identity} from '../../protocol/identity.js'
import type {ClientEnvelope, SaveStatus} from '../../protocol/messages.js'
import type {PeerDirectory} from '../types.js'
import {Admission, serverLimits} from './admission.js'
import {directoryMembers, PeerBook} from './directory.js'
import {dispatch, verdict} from './dispatch.js'
import {Ledger} from './ledger.js'
import type {ServerLimits} from './limits.js'
import {DEFAULT_MAX_SAVE_FAILURES, SavePolicy, serverIdentity, StateStore} from './persistence.js'
import type {CoordinatorServerOptions} from './options.js'
import {ReportFeed} from './reports.js'
import {Sessions, type Session} from './sessions.js'
import {DEFAULT_PASSIVE_STATE_MS, StatePusher} from './state-push.js'

export {SAVED_IDENTITY_FILE, SAVED_STATE_FILE, serverIdentity} from './persistence.js'
export {MAX_PRE_HELLO_FRAME_BYTES} from './sessions.js'
export {DEFAULT_PASSIVE_STATE_MS} from './state-push.js'
export type {CoordinatorServerOptions} from './options.js'

export {DEFAULT_MAX_SAVE_FAILURES}

interface ServerSettings {
  maxSaveFailures: number
  withdrawOnDisconnect: boolean
  entropy: () => string
  log: EventLog
  now: () => number
  limits: ServerLimits
  maxFrameBytes: number
  helloTimeoutMs: number
  passiveStateMs: number
  relayAddrs?: (localAddress: string | undefined) => string[]
}

/**
 * The centralized backend: a TCP server that owns the coordinator state machine, ticks it on a timer and after every
 * accepted event, and pushes every new state (with the peer directory) to the connected clients. Its parts, one job
 * each: the connections and their checks (sessions.ts), who may connect, watch and join (admission.ts), where each
 * message goes (dispatch.ts), the saved state and identity (persistence.ts), the state pushes and deltas
 * (state-push.ts), the peer directory (directory.ts), the rewards ledger (ledger.ts) and the clients' reports for
 * watchers (reports.ts). This class holds the state: every client event, a join included, takes one path (applyFrom);
 * each adopted state is saved and pushed once per turn of the event loop (commit, flush). Everything from the wire is
 * verified and bound to this run, this connection and the current step; a message that fails is dropped, answered
 * with `rejected`, and logged with the peer and the reason. Nothing a peer sends can throw out of the socket handlers.
 */
export class CoordinatorServer {
  /** What the server did, cumulative (the scale bench and test divide it per round): frames and bytes out and in, states adopted. */
  readonly work = {framesOut: 0, bytesOut: 0, bytesIn: 0, commits: 0}
  private readonly admission: Admission
  private readonly sessions: Sessions
  private readonly pusher: StatePusher<Session>
  private readonly ledger: Ledger
  private readonly reports = new ReportFeed()
  private timer?: NodeJS.Timeout
  private stopping = false
  /** A flush (save, then push to the epoch's clients) is scheduled: state changes in one turn of the event loop go out once. */
  private flushScheduled = false
  private unsaved = false
  /** How the state is saved (absent: no saveStateDir). */
  private readonly saves: SavePolicy | undefined
  /**
   * Resolves when the server halts because its state cannot be saved (maxSaveFailures saves failed in a row): it has
   * stopped ticking (no new round starts) and refuses every event; the caller stops it and exits non-zero.
   */
  readonly halted: Promise<PsycheError>

  private constructor(
    private readonly net: Server,
    readonly identity: Identity,
    private current: CoordinatorState,
    private readonly book: PeerBook,
    rewards: RewardsLedger,
    private readonly store: StateStore | undefined,
    private readonly opts: ServerSettings,
  ) {
    this.saves = store && new SavePolicy(store, opts.maxSaveFailures, opts.log)
    this.halted = this.saves?.halted ?? new Promise(() => {})
    this.admission = new Admission(opts.limits)
    this.ledger = new Ledger(rewards, opts.log)
    this.sessions = new Sessions({
      identity,
      admission: this.admission,
      log: opts.log,
      now: opts.now,
      state: () => this.current,
      maxFrameBytes: opts.maxFrameBytes,
      helloTimeoutMs: opts.helloTimeoutMs,
      passiveStateMs: opts.passiveStateMs,
      relayAddrs: opts.relayAddrs,
      work: this.work,
      onMessage: (s, m) => this.onMessage(s, m),
      onGone: (id) => this.onGone(id),
    })
    this.pusher = new StatePusher(this.sessions, {
      state: () => this.current,
      book,
      ledger: this.ledger,
      reports: this.reports,
      saves: store && {
        get version() {
          return store.version
        },
        status: () => this.saveStatus!,
      },
      now: opts.now,
      passiveStateMs: opts.passiveStateMs,
      stallTimeoutSeconds: opts.limits.stallTimeoutSeconds,
    })
    this.book.retainListed(current)
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

    const identity = await serverIdentity(options.saveStateDir, options.identity)
    const store = options.saveStateDir === undefined ? undefined : new StateStore(options.saveStateDir, log)
    const saved = store?.load(runId)
    const state = saved?.state ?? createCoordinator(options.run, {now: now()})
    const limits = serverLimits(options.run, options.limits, log)
    const net = createServer({noDelay: true})
    // The kernel-side backstop: past this Node closes new sockets at once (we refuse with a reason below it).
    net.maxConnections = limits.maxConnections + 64
    const maxSaveFailures = options.maxSaveFailures ?? DEFAULT_MAX_SAVE_FAILURES
    const server = new CoordinatorServer(net, identity, state, new PeerBook(saved?.peers ?? {}), saved?.rewards ?? emptyLedger(), store, {
      maxSaveFailures,
      withdrawOnDisconnect: options.withdrawOnDisconnect ?? true,
      maxFrameBytes: options.maxFrameBytes ?? DEFAULT_MAX_FRAME_BYTES,
      helloTimeoutMs: options.helloTimeoutMs ?? 10_000,
      passiveStateMs: options.passiveStateMs ?? DEFAULT_PASSIVE_STATE_MS,
      entropy: options.entropy ?? serverEntropy(now),
      log,
      now,
      relayAddrs: options.relayAddrs,
      limits,
    })
    net.on('connection', (socket) => server.sessions.accept(socket))
    await new Promise<void>((resolve, reject) => {
      net.once('error', (error: NodeJS.ErrnoException) =>
        reject(new PsycheError(`cannot listen on ${options.host ?? '127.0.0.1'}:${options.port ?? 0}: ${error.code ?? error.message}`, {cause: error})),
      )
      net.listen(options.port ?? 0, options.host ?? '127.0.0.1', () => resolve())
    })
    net.on('error', (error) => log({event: 'server_error', message: error.message}))
    // A server that cannot save its state does not start: it would train on state that a restart loses.
    if (store && !server.save()) {
      const health = store.health()
      server.unsaved = false
      await server.stop()
      throw new PsycheError(`cannot save the coordinator state to ${health.path}: ${health.last_error}`, {code: 'ESAVEDSTATE'})
    }
    server.timer = setInterval(() => server.onTimer(), options.tickIntervalMs ?? 50)
    // 'listening' comes first: launchers read the port from the first log line.
    log({event: 'listening', host: options.host ?? '127.0.0.1', port: server.port, run_id: runId, server_id: identity.id, run_state: state.run_state, step: state.progress.step})
    if (!state.config.checkpointers?.length)
      log({event: 'warning', message: 'config.checkpointers is not set: any client of an epoch may name the run’s Hub checkpoint (list the checkpointers’ ids)'})
    if (saved)
      log({
        event: 'resumed',
        path: store!.path,
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
    return this.sessions.clients
  }

  /** How the saves of the state are going, as watchers get it (undefined: the server saves nothing, no saveStateDir). */
  get saveStatus(): SaveStatus | undefined {
    if (!this.store) return undefined
    const {path: _path, ...health} = this.store.health()
    return {...health, max_failures: this.opts.maxSaveFailures}
  }

  /** The verification scores the server keeps (moving averages of what verifiers reported), by client id. */
  get scores() {
    return this.ledger.scores()
  }

  /** Each client's rewards: score, accepted rounds and batches, pending, earned and slashed points (coordinator/rewards.ts). */
  get rewardRows() {
    return this.ledger.rewards(this.current)
  }

  /**
   * An event of the run's authority (pause, resume, config_update, eject): applied like a client's, then
   * ticked and pushed. Returns the coordinator's refusal, if any.
   */
  applyAuthorityEvent(event: Extract<CoordinatorEvent, {type: 'pause' | 'resume' | 'config_update' | 'eject'}>): {code: string; reason: string} | undefined {
    const result = applyEvent(this.current, event, this.opts.now())
    if (result.error) {
      this.opts.log({event: 'rejected', peer: 'authority', code: result.error.code, reason: result.error.message, of: event.type})
      return {code: result.error.code, reason: result.error.message}
    }
    this.commit(result.state)
    this.advance()
    this.opts.log({event: 'authority', type: event.type})
    return undefined
  }

  /** Stops ticking and closes every connection. Clients are not withdrawn: a restarted server resumes them. */
  async stop(): Promise<void> {
    if (this.stopping) return
    this.stopping = true
    clearInterval(this.timer)
    // A state adopted in this turn of the event loop is kept (its push would go to connections that are closing).
    if (this.unsaved) this.save()
    const closed = new Promise<void>((resolve) => this.net.close(() => resolve()))
    this.sessions.closeAll()
    await closed
    this.opts.log({event: 'stopped', run_state: this.current.run_state, step: this.current.progress.step})
  }

  // ---- a client's messages ----

  private onMessage(s: Session, m: ClientEnvelope): void {
    const halted = this.saves?.haltedWith
    if (halted) return this.sessions.reject(s, 'server_halted', halted.message, m.kind, {strike: false})
    const to = dispatch(m, this.current, this.opts.entropy)
    switch (to.to) {
      case 'hello':
        return this.onHello(s, to.hello)
      case 'event':
        return void this.applyFrom(s, m.kind, to.event)
      case 'refuse':
        return this.sessions.reject(s, to.code, to.reason, m.kind)
      case 'report':
        this.opts.log({event: 'client_report', client: m.from, step: to.step, ...to.report})
        // Watchers get it with their next state (on their cadence), not as a frame each.
        this.reports.add(m.from, to.step, to.report)
        this.admission.forgive(s)
        if (this.opts.passiveStateMs <= 0) this.pusher.push(this.sessions.watching)
        return
      case 'scores': {
        const refused = this.ledger.record(this.current, m.from, to.step, to.scores)
        if (refused) return this.sessions.reject(s, refused.code, refused.reason, 'scores')
        this.admission.forgive(s)
        this.saveDue()
        return this.pusher.push()
      }
      case 'addresses':
        // A member's directory entry (and so every client) gets the new list.
        s.addrs = to.addrs
        if (!this.updateEntry(s, this.current)) return
        this.opts.log({event: 'addresses', peer: s.peer, client: m.from, p2p_addrs: to.addrs})
        return this.commit(this.current, true)
      case 'resync':
        return this.pusher.resync(s)
    }
  }

  private onHello(s: Session, m: Extract<ClientEnvelope, {kind: 'hello'}>): void {
    if (!this.sessions.hello(s, m)) return
    // A refused join leaves the connection watching the run (a client asks again through a new connection).
    if (m.body.want_join && !this.applyFrom(s, 'hello', {type: 'join', id: m.from}) && !this.sessions.keepWatching(s)) return
    // Every client gets the state right after its welcome, changed or not.
    this.pusher.push([s])
  }

  /**
   * The one path of a client's event to the coordinator, a join as any other: the server's admission (a join within
   * the member bound and the join pace), the coordinator, the answer (dispatch.ts verdict), the client's directory
   * entry while it is a member, then the new state adopted and ticked at once (a join or a quorum may start a phase).
   * False when the event was refused.
   */
  private applyFrom(s: Session, of: string, event: CoordinatorEvent): boolean {
    const refusal = this.admission.event(this.current, event)
    const result = refusal ? {state: this.current, error: refusal} : applyEvent(this.current, event, this.opts.now())
    const answer = verdict(event, result.error, {peer: s.peer, client: s.clientId!, of})
    if (answer.ok) {
      this.opts.log(answer.line)
      this.admission.forgive(s)
    }
    // The coordinator's refusals count as strikes (a watcher's invalid witnesses included); the server's own bounds do not.
    else this.sessions.reject(s, answer.code, answer.reason, of, {strike: !refusal})
    const listed = this.updateEntry(s, result.state)
    if (!answer.ok && !listed) return false
    this.commit(result.state, listed)
    this.advance()
    return answer.ok
  }

  /** A member's directory entry is the addresses its connection announced last (a join lists them); true when it changed. */
  private updateEntry(s: Session, state: CoordinatorState): boolean {
    const id = s.clientId!
    return !this.book.holds(id, s.addrs) && directoryMembers(state).has(id) && this.book.set(id, s.addrs)
  }

  /** The connection a client held closed: it is withdrawn from the run (unless withdrawOnDisconnect is off). */
  private onGone(id: ClientId): void {
    if (!this.opts.withdrawOnDisconnect) return
    this.book.remove(id)
    const result = applyEvent(this.current, {type: 'withdraw', id}, this.opts.now())
    if (!result.error) this.opts.log({event: 'withdrawn', client: id, reason: 'disconnected'})
    this.commit(result.state, true)
    this.advance()
  }

  // ---- the coordinator's state ----

  /** One tick, with fresh randomness so the next round's seed cannot be predicted by clients. */
  private advance(): void {
    if (this.stopping || this.saves?.haltedWith) return
    try {
      this.commit(tick(this.current, this.opts.now(), this.opts.entropy()))
    } catch (error) {
      this.opts.log({event: 'error', where: 'tick', message: (error as Error).message})
    }
  }

  /** The timer's tick: the coordinator's, then the states due to connections on the passive cadence. */
  private onTimer(): void {
    // A save that failed is tried again, changed or not.
    if (this.unsaved && !this.flushScheduled) this.saveDue()
    this.advance()
    if (!this.stopping) this.pusher.pushDue()
  }

  /** Adopts a new state: settles the ledger, logs a phase change; the save and the push follow in this turn's flush. */
  private commit(next: CoordinatorState, peersChanged = false): void {
    const previous = this.current
    if (next === previous && !peersChanged) return
    this.current = next
    this.work.commits++
    this.ledger.observe(previous, next)
    // The directory holds the run's members only: a client that left, was ejected or dropped leaves it.
    if (next !== previous) this.book.retainListed(next)
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
    if (this.unsaved) this.saveDue()
    this.pusher.push()
  }

  /** Saves the state now, or, while saves fail, once the retry interval has passed (the state stays unsaved until then). */
  private saveDue(): void {
    if (this.saves && !this.saves.due()) {
      this.unsaved = true
      return
    }
    this.save()
  }

  /** Saves the state (when the server keeps one); false when that failed: it stays unsaved, and is tried again. */
  private save(): boolean {
    this.unsaved = false
    if (!this.saves) return true
    const saved = this.saves.save({state: this.current, peers: this.book.snapshot(), rewards: this.ledger.value}, this.opts.now() / 1000, {
      run_state: this.current.run_state,
      step: this.current.progress.step,
    })
    if (saved) return true
    this.unsaved = true
    if (this.saves.haltedWith) clearInterval(this.timer)
    return false
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
