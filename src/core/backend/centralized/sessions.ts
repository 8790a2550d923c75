import {randomBytes} from 'node:crypto'
import type {Socket} from 'node:net'
import type {ClientId, CoordinatorState} from '../../coordinator/types.js'
import type {EventLog} from '../../events.js'
import {FrameReader} from '../../protocol/frames.js'
import type {Identity} from '../../protocol/identity.js'
import {decodeClientMessage, encodeServerMessage, type ClientEnvelope, type ServerBodies, type ServerKind} from '../../protocol/messages.js'
import type {Admission, Refusal} from './admission.js'
import {LIMIT_FLAGS, type RetryableRefusal} from './limits.js'
import {newCursor, type PushTarget} from './state-push.js'

/** Until a peer has said hello it may only send small frames (a hello is well under this). */
export const MAX_PRE_HELLO_FRAME_BYTES = 64 * 1024

/** One TCP connection of a client or a watcher. */
export interface Session extends PushTarget {
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
  /** Said hello without asking to join (psyche status, dashboards): gets the clients' reports forwarded. */
  watcher?: boolean
  /** The libp2p addresses the client announced last: its directory entry while it is a member of the run. */
  addrs: string[]
}

type Hello = Extract<ClientEnvelope, {kind: 'hello'}>

interface SessionsOptions {
  identity: Identity
  admission: Admission
  log: EventLog
  /** The coordinator's clock (a welcome carries the server's time). */
  now: () => number
  /** The state the server holds now: every frame names its run and step. */
  state: () => CoordinatorState
  /** Largest frame accepted from a client once it said hello. */
  maxFrameBytes: number
  helloTimeoutMs: number
  passiveStateMs: number
  relayAddrs?: (localAddress: string | undefined) => string[]
  /** What the server did (CoordinatorServer.work): frames and bytes out and in are counted here. */
  work: {framesOut: number; bytesOut: number; bytesIn: number}
  /** A message that passed the connection's checks: signed for this connection, in sequence, for this run, from its client. */
  onMessage: (s: Session, m: ClientEnvelope) => void
  /** The connection a client holds closed (not one a newer connection replaced). */
  onGone: (id: ClientId) => void
}

/**
 * The server's connections, from accept to close: the bounds at accept (asked of admission.ts), the challenge, the
 * hello timeout, the per-connection checks of every message (session, sequence, run, sender) before the server sees
 * it, a hello's binding of the connection to its client (a newer connection replaces an older one), and the answers:
 * signed frames, refusals (violations count as strikes) and closes. Nothing a peer sends can throw out of its handlers.
 */
export class Sessions {
  /** Every open connection. */
  readonly all = new Set<Session>()
  /** The connection that said hello last for each client. */
  private readonly byClient = new Map<ClientId, Session>()
  /** Connections that have not said hello yet, watchers, and connections per remote address (all bounded). */
  private readonly handshaking = new Set<Session>()
  private readonly watchers = new Set<Session>()
  private readonly perIp = new Map<string, number>()
  private closing = false

  constructor(private readonly opts: SessionsOptions) {}

  /** Ids of the clients connected now (that said hello). */
  get clients(): ClientId[] {
    return [...this.byClient.keys()]
  }

  /** The connections that watch the run. */
  get watching(): Session[] {
    return [...this.watchers]
  }

  accept(socket: Socket): void {
    if (this.closing) {
      socket.destroy()
      return
    }
    const ip = socket.remoteAddress ?? '?'
    const refusal = this.opts.admission.connection({connections: this.all.size, fromAddress: this.perIp.get(ip) ?? 0, handshaking: this.handshaking.size}, ip)
    if (refusal) return this.refuse(socket, refusal)
    // An address closed for its refusals waits out its ban (--strike-ban-s).
    const banned = this.opts.admission.banRefusal(ip)
    if (banned) return this.refuse(socket, banned)
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
      pushed: newCursor(this.opts.passiveStateMs),
    }
    this.all.add(s)
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

  /**
   * The connection's part of a hello: checked (once per connection, naming the client that signed it, for this run; a
   * watcher within its bound), then bound to its client (an older connection of that client is replaced), and
   * welcomed. False when it was refused (answered, or the connection dropped).
   */
  hello(s: Session, m: Hello): boolean {
    const refusal = this.helloRefusal(s, m)
    if (refusal?.close) this.drop(s, refusal.code, refusal.message, 'hello')
    else if (refusal) this.reject(s, refusal.code, refusal.message, 'hello')
    if (refusal) return false
    const body = m.body
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
    // A watcher sends nothing large (a resync, its scores): it keeps the pre-hello frame bound, so a flood of big
    // frames from one is cut at the first frame's header, not read, verified and refused 16 times over.
    s.reader.maxFrameBytes = s.watcher ? Math.min(MAX_PRE_HELLO_FRAME_BYTES, this.opts.maxFrameBytes) : this.opts.maxFrameBytes
    this.byClient.set(m.from, s)
    this.opts.log({event: 'hello', peer: s.peer, client: m.from, want_join: body.want_join, p2p_addrs: body.p2p_addrs})
    const welcome: ServerBodies['welcome'] = {run_id: this.opts.state().run_id, client_id: m.from, server_time: this.opts.now()}
    const relay = this.opts.relayAddrs?.(s.socket.localAddress)
    if (relay && relay.length > 0) welcome.relay_addrs = relay
    this.send(s, 'welcome', welcome)
    return true
  }

  /** A connection whose join was refused stays to watch the run, as a watcher within that bound (else it is dropped). False when dropped. */
  keepWatching(s: Session): boolean {
    const full = this.opts.admission.watcher(this.watchers.size)
    if (full) this.drop(s, full.code, full.message, 'hello')
    else {
      this.watchers.add(s)
      s.reader.maxFrameBytes = Math.min(MAX_PRE_HELLO_FRAME_BYTES, this.opts.maxFrameBytes)
    }
    return !full
  }

  send<K extends ServerKind>(s: Session, kind: K, body: Parameters<typeof encodeServerMessage<K>>[3]): void {
    if (s.socket.destroyed || !s.socket.writable) return
    const limits = this.opts.admission.limits
    if (s.socket.writableLength > limits.maxUnsentBytes) {
      this.drop(s, 'slow_consumer', `more than ${limits.maxUnsentBytes} bytes unread (${LIMIT_FLAGS.maxUnsentBytes})`)
      return
    }
    s.sentSeq += 1
    const state = this.opts.state()
    const frame = encodeServerMessage(this.opts.identity, kind, {run_id: state.run_id, step: state.progress.step, seq: s.sentSeq, session: s.session}, body)
    this.opts.work.framesOut++
    this.opts.work.bytesOut += frame.length
    s.socket.write(frame)
  }

  /**
   * Logs a refused message and tells the peer why; it counts toward closing the connection (strike, the default:
   * every refusal but the server's own bounds), and past --max-strikes the connection is closed and banned.
   */
  reject(s: Session, code: string, reason: string, of?: string, opts: {strike?: boolean} = {}): void {
    this.opts.log({event: 'rejected', peer: s.peer, ...(s.clientId ? {client: s.clientId} : {}), code, reason, ...(of ? {of} : {})})
    const body: ServerBodies['rejected'] = {code, reason: reason.slice(0, 4096)}
    if (of) body.of = of
    this.send(s, 'rejected', body)
    const out = opts.strike !== false ? this.opts.admission.strike(s) : undefined
    if (!out) return
    // Closed for its refusals: its identity and its address wait before they may return.
    this.opts.admission.ban([s.clientId, s.ip])
    this.drop(s, out.code, out.message)
  }

  /** Refuses and closes a connection: logged as a rejection, and the peer is told why (best effort). */
  drop(s: Session, code: string, reason: string, of?: string): void {
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

  /**
   * Keeps what all connections have not read under maxUnsentBytesTotal: past it, the connections with the most
   * unread bytes (the slowest readers, or ones that never read) are cut off first.
   */
  boundUnsent(): void {
    const cap = this.opts.admission.limits.maxUnsentBytesTotal
    let total = 0
    for (const s of this.all) total += s.socket.writableLength
    if (total <= cap) return
    const slowest = [...this.all].filter((s) => s.socket.writableLength > 0).sort((a, b) => b.socket.writableLength - a.socket.writableLength)
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

  /** Closes every connection and takes no more; the clients are not gone from the run (onGone is not called). */
  closeAll(): void {
    this.closing = true
    for (const s of this.all) {
      clearTimeout(s.helloTimer)
      s.socket.destroy()
    }
  }

  /** Why a hello is refused, and whether the connection is closed for it (undefined: it is taken). */
  private helloRefusal(s: Session, m: Hello): (Refusal & {close: boolean}) | undefined {
    const body = m.body
    const runId = this.opts.state().run_id
    if (s.clientId) return {code: 'hello_twice', message: 'this connection already said hello', close: false}
    if (body.client_id !== m.from) return {code: 'wrong_sender', message: `hello names client ${body.client_id} but is signed by ${m.from}`, close: false}
    if (body.run_id !== runId) return {code: 'wrong_run_id', message: `this server coordinates run "${runId}", not "${body.run_id.slice(0, 256)}"`, close: true}
    const banned = this.opts.admission.banRefusal(m.from)
    if (banned) return {...banned, close: true}
    const full = !body.want_join && !this.watchers.has(s) ? this.opts.admission.watcher(this.watchers.size) : undefined
    return full && {...full, close: true}
  }

  /** Refuses a new connection over a bound: one signed `rejected` naming the bound, then closed (logged). */
  private refuse(socket: Socket, refusal: Refusal<RetryableRefusal>): void {
    const {code, message: reason} = refusal
    this.opts.log({event: 'rejected', peer: `${socket.remoteAddress}:${socket.remotePort}`, code, reason, closed: true})
    socket.on('error', () => {})
    const state = this.opts.state()
    socket.end(
      encodeServerMessage(this.opts.identity, 'rejected', {run_id: state.run_id, step: state.progress.step, seq: 1, session: randomBytes(16).toString('hex')}, {code, reason}),
    )
    setTimeout(() => socket.destroy(), 1000).unref()
  }

  private onData(s: Session, chunk: Buffer): void {
    this.opts.work.bytesIn += chunk.length
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

  /** A frame's checks before the server sees its message: decodes and verifies, signed for this connection, in sequence, for this run, from its client. */
  private onFrame(s: Session, bytes: Buffer): void {
    const decoded = decodeClientMessage(bytes)
    if (!decoded.ok) return this.reject(s, decoded.reason, decoded.detail)
    const m = decoded.envelope
    if (m.session !== s.session) return this.reject(s, 'wrong_session', 'message signed for another connection (replayed?)', m.kind)
    if (m.seq <= s.lastSeq) return this.reject(s, 'replayed_seq', `sequence number ${m.seq} is not above ${s.lastSeq} (duplicate or replayed)`, m.kind)
    const runId = this.opts.state().run_id
    if (m.run_id !== runId) {
      const reason = `this server coordinates run "${runId}", not "${m.run_id.slice(0, 256)}"`
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
    this.opts.onMessage(s, m)
  }

  private onClose(s: Session): void {
    clearTimeout(s.helloTimer)
    this.all.delete(s)
    this.handshaking.delete(s)
    this.watchers.delete(s)
    const n = (this.perIp.get(s.ip) ?? 1) - 1
    if (n <= 0) this.perIp.delete(s.ip)
    else this.perIp.set(s.ip, n)
    const id = s.clientId
    this.opts.log({event: 'disconnected', peer: s.peer, ...(id ? {client: id} : {})})
    if (!id || s.replaced || this.byClient.get(id) !== s) return
    this.byClient.delete(id)
    if (!this.closing) this.opts.onGone(id)
  }
}
