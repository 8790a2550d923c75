import type {ComponentLogger, Connection, Logger, PeerId, Startable, Stream, Upgrader} from '@libp2p/interface'
import type {ConnectionManager, Registrar} from '@libp2p/interface-internal'
import {multiaddr, type Multiaddr} from '@multiformats/multiaddr'
import {setMaxListeners} from 'node:events'
import {isIP} from 'node:net'
import type {DataChannel, IceServer, PeerConnection} from 'node-datachannel'
import {errorMessage} from '../errors.js'
import type {EventLog} from '../events.js'
import {addrPeerId, isCircuit, localNetworks} from './addresses.js'
import {framed} from './framing.js'
import {STUN_INFO_PROTOCOL, decodeStunInfo} from './stun.js'
import {abortStream, anySignal, deadline, ON_LIMITED} from './util.js'
import {dataChannelConnection} from './webrtc-channel.js'
import {decodeSignal, encodeSignal, MAX_SIGNAL_FRAME_BYTES, parseCandidate, usableCandidate, type IceCandidate, type SignalMessage} from './webrtc-signal.js'

/**
 * UDP hole punching with WebRTC (ICE), between two peers that met through a circuit relay: the way to a direct
 * connection that works behind the NATs TCP punching cannot cross (punch.ts). The peer with the smaller peer id
 * opens /psyche/webrtc/1 on the relayed connection (upgrade.ts decides when, and what comes next if this fails):
 *
 *   1. each side makes a WebRTC peer connection (node-datachannel: libdatachannel, ICE by libjuice) with one
 *      data channel, and gathers its candidates: its interface addresses, and the address its NAT maps its UDP
 *      socket to, which a STUN server tells it (the STUN server of the relay that connects the two, stun.ts, and
 *      any --stun; never a public one);
 *   2. they swap session descriptions and candidates over the relayed connection (webrtc-signal.ts checks each),
 *      keep only candidates that can lead anywhere (not another LAN's private address), and time a round trip;
 *   3. on `sync` both hand the native library the other's candidates at the same moment (the initiator half a round
 *      trip later), so that their first packets cross: a NAT that answers unsolicited packets (a Linux box with
 *      masquerade only) remembers the first one it sees from the peer and maps our reply to a new port, so the
 *      packet that opens our side must leave before the peer's arrives. A NAT that drops unsolicited packets, as
 *      home routers do, needs no such timing;
 *   4. ICE checks the candidate pairs, DTLS secures the chosen path, and the data channel opens; libp2p's
 *      upgrader then runs noise (the peer's key, as on every connection) and yamux over that one channel. The
 *      result is a direct libp2p connection (/ip4/…/udp/…/webrtc/p2p/…), which results, model pieces and (once
 *      the relayed connection is closed, upgrade.ts) gossip use.
 *
 * Bounds on what a peer can make us spend: WebRTC connections open or being made at once (maxConnections), ICE
 * candidates taken from one peer per attempt (maxCandidates), the size of a data-channel message (maxMessageBytes,
 * also announced in our session description), one data channel per connection (any other the peer opens is closed),
 * one signalling stream per relayed connection and one attempt per peer at a time, at most RESPONDER_ATTEMPTS a
 * minute from one peer, signalling messages of MAX_SIGNAL_FRAME_BYTES, and ATTEMPT_TIMEOUT_MS for the whole exchange.
 * Signalling is answered only on relayed connections.
 */
export const WEBRTC_PROTOCOL = '/psyche/webrtc/1'

export interface WebRtcLimits {
  /** WebRTC connections open or being set up at once. */
  maxConnections: number
  /** ICE candidates accepted from a peer in one attempt. */
  maxCandidates: number
  /** The largest data-channel message accepted, in bytes. */
  maxMessageBytes: number
}

export const DEFAULT_WEBRTC_LIMITS: WebRtcLimits = {maxConnections: 256, maxCandidates: 16, maxMessageBytes: 256 * 1024}

/** Candidates we send at most (server-reflexive first): a peer's --webrtc-max-candidates may not be below it. */
export const SENT_CANDIDATES = 8
/** How long candidates are gathered (the STUN answer); after it we go on with what we have. */
const GATHER_TIMEOUT_MS = 2_000
/** From `sync` to the open data channel: ICE checks, DTLS, SCTP. */
const CONNECT_TIMEOUT_MS = 6_000
/** The whole attempt, signalling included. */
const ATTEMPT_TIMEOUT_MS = 15_000
const STUN_INFO_TIMEOUT_MS = 2_000
/**
 * Attempts one peer may start with us in RESPONDER_WINDOW_MS (as the initiator, a psyche peer makes at most two per
 * round of upgrade.ts, rounds 60 s apart): more are refused, so that a peer cannot keep us making peer connections.
 */
const RESPONDER_ATTEMPTS = 4
const RESPONDER_WINDOW_MS = 60_000
/** Peers whose recent attempts are remembered (for RESPONDER_ATTEMPTS); past it the oldest is forgotten. */
const MAX_REMEMBERED_PEERS = 4_096

/** node-datachannel, loaded when the service starts (a native library: a platform without it runs without WebRTC). */
type Native = typeof import('node-datachannel')

/** Peer connections alive in this process; at zero the native library's threads are stopped, so the process can exit. */
let livePeerConnections = 0
/**
 * Every native peer connection and data channel this process made, kept referenced until the native library is
 * cleaned up: node-datachannel (0.33) tracks its wrappers in a set that a garbage-collected wrapper is not always
 * removed from, and its cleanup() then closes freed memory (a SIGSEGV). They are small once closed.
 */
const retained = new Set<object>()
/** Data channels a peer may open on one connection before the connection is closed (each is closed at once). */
const MAX_EXTRA_CHANNELS = 4

interface WebRtcInit {
  log: EventLog
  enabled: boolean
  /** Further STUN servers (--stun), host:port each, beside the relay's own. */
  stun?: readonly string[]
  limits?: Partial<WebRtcLimits>
  /** The address ICE binds and gathers on (a loopback one when the node listens on loopback only); default all. */
  bindAddress?: string
}

interface WebRtcComponents {
  peerId: PeerId
  connectionManager: ConnectionManager
  registrar: Registrar
  upgrader: Upgrader
  logger: ComponentLogger
}

/** One peer connection with its data channel, from creation to the open channel (or its failure). */
class IceSession {
  readonly pc: PeerConnection
  readonly channel: DataChannel
  private readonly local: string[] = []
  private description!: Promise<string>
  private gathered!: Promise<void>
  /** Settles when the data channel opens, or the peer connection fails or closes first. */
  opened!: Promise<void>
  /** Called when the peer connection fails or closes after the channel opened (the libp2p connection ends then). */
  onDown: (reason: string) => void = () => {}
  private closed = false

  constructor(native: Native, config: ConstructorParameters<Native['PeerConnection']>[1], role: 'offer' | 'answer', remoteOffer?: string) {
    this.pc = new native.PeerConnection(`psyche-${role}`, config)
    retained.add(this.pc)
    livePeerConnections++
    try {
      this.channel = this.setUp(role, remoteOffer)
    } catch (error) {
      this.closed = true
      safely(() => this.pc.close())
      livePeerConnections--
      throw new Error(`the native WebRTC library refused the session: ${errorMessage(error)}`)
    }
  }

  private setUp(role: 'offer' | 'answer', remoteOffer: string | undefined): DataChannel {
    let describe!: (sdp: string) => void
    this.description = new Promise((resolve) => (describe = resolve))
    let gatheredDone!: () => void
    this.gathered = new Promise((resolve) => (gatheredDone = resolve))
    let open!: () => void
    let fail!: (error: Error) => void
    this.opened = new Promise<void>((resolve, reject) => {
      open = resolve
      fail = reject
    })
    this.opened.catch(() => {})
    let isOpen = false
    // The native library calls these from the event loop; none may throw (an exception there ends the process).
    this.pc.onLocalDescription((sdp) => describe(sdp))
    this.pc.onLocalCandidate((candidate) => this.local.push(candidate))
    this.pc.onGatheringStateChange((state) => {
      if (state === 'complete') gatheredDone()
    })
    this.pc.onStateChange((state) => {
      if (state !== 'failed' && state !== 'closed') return
      if (isOpen) safely(() => this.onDown(`the WebRTC connection ${state}`))
      else fail(new Error(`the WebRTC connection ${state} before its data channel opened`))
    })
    // Data channels the peer opens: not ours (one channel per connection), closed at once; a peer that goes on
    // opening them loses the connection.
    let extras = 0
    this.pc.onDataChannel((extra) => {
      retained.add(extra)
      setImmediate(() => {
        safely(() => extra.close())
        if (++extras > MAX_EXTRA_CHANNELS) this.close()
      })
    })
    if (role === 'answer') this.pc.setRemoteDescription(remoteOffer!, 'offer')
    const channel = this.pc.createDataChannel('psyche', {negotiated: true, id: 0})
    retained.add(channel)
    channel.onOpen(() => {
      isOpen = true
      open()
    })
    this.pc.setLocalDescription(role)
    return channel
  }

  /** Our session description, without candidates (they are sent apart). */
  async localDescription(signal: AbortSignal): Promise<string> {
    const sdp = await raceAbort(this.description, signal)
    return sdp
      .split(/\r?\n/)
      .filter((l) => l !== '' && !l.startsWith('a=candidate') && !l.startsWith('a=end-of-candidates'))
      .map((l) => `${l}\r\n`)
      .join('')
  }

  /** Our candidates once gathered, or when GATHER_TIMEOUT_MS ran out: usable ones only, server-reflexive first. */
  async localCandidates(usable: (c: IceCandidate) => boolean, signal: AbortSignal): Promise<IceCandidate[]> {
    await raceAbort(Promise.race([this.gathered, new Promise((r) => setTimeout(r, GATHER_TIMEOUT_MS).unref())]), signal)
    const parsed: IceCandidate[] = []
    for (const line of this.local) {
      try {
        const c = parseCandidate(line)
        if (usable(c) && !parsed.some((p) => p.address === c.address && p.port === c.port)) parsed.push(c)
      } catch {
        // a kind we do not send (a TCP candidate, an mDNS name)
      }
    }
    parsed.sort((a, b) => Number(b.type === 'srflx') - Number(a.type === 'srflx'))
    return parsed.slice(0, SENT_CANDIDATES)
  }

  setRemoteAnswer(sdp: string): void {
    this.pc.setRemoteDescription(sdp, 'answer')
  }

  addCandidates(candidates: readonly IceCandidate[]): void {
    for (const c of candidates) this.pc.addRemoteCandidate(c.line, '0')
  }

  /** The remote end ICE chose, as a multiaddr, and both ends' candidate types. */
  selected(peer: PeerId): {addr: Multiaddr; local: string; remote: string} {
    const pair = this.pc.getSelectedCandidatePair()
    const host = pair?.remote.address ?? '0.0.0.0'
    const family = isIP(host) === 6 ? 'ip6' : 'ip4'
    return {addr: multiaddr(`/${family}/${host}/udp/${pair?.remote.port ?? 0}/webrtc/p2p/${peer.toString()}`), local: pair?.local.type ?? '?', remote: pair?.remote.type ?? '?'}
  }

  close(): void {
    if (this.closed) return
    this.closed = true
    safely(() => this.channel.close())
    safely(() => this.pc.close())
    livePeerConnections--
  }
}

function safely(fn: () => void): void {
  try {
    fn()
  } catch {
    // already closed
  }
}

function raceAbort<T>(promise: Promise<T>, signal: AbortSignal): Promise<T> {
  if (signal.aborted) return Promise.reject(signal.reason as Error)
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(signal.reason as Error)
    signal.addEventListener('abort', onAbort, {once: true})
    promise.then(
      (v) => {
        signal.removeEventListener('abort', onAbort)
        resolve(v)
      },
      (e) => {
        signal.removeEventListener('abort', onAbort)
        reject(e as Error)
      },
    )
  })
}

/**
 * Waits for the data channel to open once both sides have the candidates: at most CONNECT_TIMEOUT_MS, and an error
 * that names the candidates tried when no pair answered (a symmetric NAT, a firewall) or the attempt ran out of time.
 */
async function opened(session: IceSession, theirs: readonly IceCandidate[], signal: AbortSignal): Promise<void> {
  const connect = deadline(CONNECT_TIMEOUT_MS)
  try {
    await raceAbort(session.opened, anySignal(signal, connect))
  } catch (error) {
    const tried = theirs.map((c) => `${c.type} ${c.address}:${c.port}`).join(', ')
    // Fresh sockets may do better: the first packets may have crossed too far apart for NATs that answer what arrives unasked.
    if (connect.aborted) throw Object.assign(new Error(`no ICE candidate pair answered within ${CONNECT_TIMEOUT_MS} ms (the peer's candidates: ${tried})`), {retryable: true})
    if (signal.aborted && (signal.reason as Error | undefined)?.name === 'TimeoutError') throw new Error(`the WebRTC attempt took longer than ${ATTEMPT_TIMEOUT_MS} ms`)
    throw error
  }
}

/** `host:port` (or `stun:host:port`, `[v6]:port`) as the native library's ICE server; throws on anything else. */
export function parseStunServer(value: string): IceServer {
  const text = value.startsWith('stun:') ? value.slice(5) : value
  const m = /^(?:\[([0-9A-Fa-f:.]+)\]|([A-Za-z0-9.-]{1,253})):(\d{1,5})$/.exec(text)
  const port = Number(m?.[3])
  if (!m || port < 1 || port > 65535) throw new Error(`${value}: want host:port (a STUN server, e.g. 203.0.113.7:3478)`)
  return {hostname: m[1] ?? m[2], port}
}

export class WebRtc implements Startable {
  private readonly log: EventLog
  private readonly debug: Logger
  private readonly limits: WebRtcLimits
  private readonly extraStun: IceServer[]
  private native: Native | undefined
  private stopped = true
  private running = new AbortController()
  /** Attempts under way, and WebRTC connections open: together at most limits.maxConnections. */
  private readonly sessions = new Set<IceSession>()
  private readonly connections = new Set<Connection>()
  /** Peers with an attempt under way (one at a time per peer, either role). */
  private readonly active = new Set<string>()
  /** Peer -> when it started its recent attempts with us (see RESPONDER_ATTEMPTS). */
  private readonly answered = new Map<string, number[]>()
  /** Relay peer id -> its STUN server, as it told us (/psyche/stun/1). */
  private readonly relayStun = new Map<string, IceServer | undefined>()
  connected = 0
  failed = 0

  constructor(
    private readonly components: WebRtcComponents,
    private readonly init: WebRtcInit,
  ) {
    this.log = init.log
    this.debug = components.logger.forComponent('psyche:webrtc')
    this.limits = {...DEFAULT_WEBRTC_LIMITS, ...init.limits}
    this.extraStun = (init.stun ?? []).map(parseStunServer)
  }

  /** True when WebRTC is on and its native library loaded. */
  available(): boolean {
    return this.native !== undefined && !this.stopped
  }

  async start(): Promise<void> {
    this.stopped = false
    this.running = new AbortController()
    setMaxListeners(Infinity, this.running.signal)
    if (!this.init.enabled) return
    try {
      this.native = await import('node-datachannel')
    } catch (error) {
      // npm installs the prebuilt binary as a platform package (@node-datachannel/<platform>); without one for this
      // machine there is no WebRTC, and TCP punching and the relay remain.
      this.log({event: 'webrtc_unavailable', reason: `node-datachannel did not load: ${errorMessage(error)}`})
      return
    }
    await this.components.registrar.handle(WEBRTC_PROTOCOL, (stream, connection) => void this.respond(stream, connection), {...ON_LIMITED, maxInboundStreams: 1})
  }

  async stop(): Promise<void> {
    this.stopped = true
    this.running.abort(new Error('the node is stopping'))
    if (this.native) await this.components.registrar.unhandle(WEBRTC_PROTOCOL)
    for (const s of this.sessions) s.close()
    this.sessions.clear()
    // A connection whose data channel is gone would never finish a graceful close: a short one, then abort.
    await Promise.all([...this.connections].map((c) => c.close({signal: deadline(2_000)}).catch((error) => c.abort(error instanceof Error ? error : new Error(String(error))))))
    this.maybeCleanup()
  }

  /**
   * When the node stops with no peer connection left in this process, the native library's threads are stopped
   * (they would keep the process alive). Only then: stopping them while another part of the process is about to
   * make a peer connection is not safe.
   */
  private maybeCleanup(): void {
    setImmediate(() => {
      if (livePeerConnections !== 0 || !this.native) return
      safely(() => this.native!.cleanup())
      retained.clear()
    })
  }

  private attemptSignal(): AbortSignal {
    const signal = anySignal(deadline(ATTEMPT_TIMEOUT_MS), this.running.signal)
    setMaxListeners(Infinity, signal)
    return signal
  }

  /** Counts an attempt the peer starts now; true when it is one too many (see RESPONDER_ATTEMPTS). */
  private tooMany(peer: string, now: number): boolean {
    const recent = (this.answered.get(peer) ?? []).filter((t) => now - t < RESPONDER_WINDOW_MS)
    if (recent.length >= RESPONDER_ATTEMPTS) return true
    recent.push(now)
    this.answered.delete(peer)
    if (this.answered.size >= MAX_REMEMBERED_PEERS) this.answered.delete(this.answered.keys().next().value!)
    this.answered.set(peer, recent)
    return false
  }

  private atLimit(): boolean {
    return this.sessions.size + this.connections.size >= this.limits.maxConnections
  }

  private hasDirect(peer: PeerId): boolean {
    return this.components.connectionManager.getConnections(peer).some((c) => c.status === 'open' && !isCircuit(c.remoteAddr))
  }

  /** The ICE servers for an attempt over `relayed`: its relay's STUN server (asked once per relay) and --stun. */
  private async iceServers(relayed: Connection, signal: AbortSignal): Promise<IceServer[]> {
    const text = relayed.remoteAddr.toString()
    const at = text.indexOf('/p2p-circuit')
    const relayPeer = at > 0 ? addrPeerId(multiaddr(text.slice(0, at))) : undefined
    const servers = [...this.extraStun]
    if (relayPeer === undefined) return servers
    if (!this.relayStun.has(relayPeer)) this.relayStun.set(relayPeer, await this.askStun(relayPeer, signal))
    const own = this.relayStun.get(relayPeer)
    return own ? [own, ...servers] : servers
  }

  /** Asks a relay we hold a direct connection to where its STUN server listens (undefined: it runs none). */
  private async askStun(relayPeer: string, signal: AbortSignal): Promise<IceServer | undefined> {
    const connection = this.components.connectionManager.getConnections().find((c) => c.remotePeer.toString() === relayPeer && c.status === 'open' && !isCircuit(c.remoteAddr))
    const host = connection?.remoteAddr.getComponents().find((c) => c.name === 'ip4' || c.name === 'ip6')?.value
    if (!connection || !host) return undefined
    let stream: Stream | undefined
    try {
      const s = anySignal(signal, deadline(STUN_INFO_TIMEOUT_MS))
      stream = await connection.newStream(STUN_INFO_PROTOCOL, {signal: s})
      const lp = framed(stream, 256)
      const port = decodeStunInfo((await lp.read({signal: s})).subarray())
      await stream.close({signal: s}).catch(() => {})
      return {hostname: host, port}
    } catch (error) {
      if (stream) abortStream(stream, error)
      this.debug('relay %s gave no STUN server: %s', relayPeer, errorMessage(error))
      return undefined
    }
  }

  private rtcConfig(iceServers: IceServer[]): ConstructorParameters<Native['PeerConnection']>[1] {
    return {
      iceServers,
      disableAutoNegotiation: true,
      maxMessageSize: this.limits.maxMessageBytes,
      ...(this.init.bindAddress ? {bindAddress: this.init.bindAddress} : {}),
    }
  }

  private usable(): (c: IceCandidate) => boolean {
    const networks = localNetworks()
    const loopback = this.init.bindAddress !== undefined && /^127\.|^::1$/.test(this.init.bindAddress)
    return (c) => usableCandidate(c, {networks, loopback})
  }

  /**
   * The smaller peer id's side: a direct WebRTC connection to the peer of `relayed`, or an Error saying why not
   * (webrtc_failed is logged either way).
   */
  async initiate(relayed: Connection): Promise<Connection> {
    const peer = relayed.remotePeer
    const key = peer.toString()
    const started = Date.now()
    if (!this.available()) throw new Error('WebRTC is off')
    if (this.active.has(key)) throw new Error('a WebRTC attempt to this peer is under way')
    if (this.atLimit()) throw this.failure(peer, new Error(`at the WebRTC connection limit (${this.limits.maxConnections}: --webrtc-max-connections)`), started, 'initiator')
    this.active.add(key)
    const signal = this.attemptSignal()
    let stream: Stream | undefined
    let session: IceSession | undefined
    try {
      session = new IceSession(this.native!, this.rtcConfig(await this.iceServers(relayed, signal)), 'offer')
      this.sessions.add(session)
      const offer = await session.localDescription(signal)
      stream = await relayed.newStream(WEBRTC_PROTOCOL, {signal, ...ON_LIMITED})
      const lp = framed(stream, MAX_SIGNAL_FRAME_BYTES)
      const read = async <T extends SignalMessage['type']>(...types: T[]) =>
        decodeSignal((await lp.read({signal})).subarray(), types, {maxCandidates: this.limits.maxCandidates}) as Extract<SignalMessage, {type: T}>
      const write = (m: SignalMessage) => lp.write(encodeSignal(m), {signal})
      await write({type: 'offer', sdp: offer})
      const answer = await read('answer')
      session.setRemoteAnswer(answer.sdp)
      const usable = this.usable()
      await write({type: 'candidates', candidates: await session.localCandidates(usable, signal)})
      const theirs = (await read('candidates')).candidates.filter(usable)
      if (theirs.length === 0) {
        await write({type: 'decline', reason: 'none of your ICE candidates can be reached from here'})
        throw new Error('none of the peer\u2019s ICE candidates can be reached from here (no UDP path: STUN unanswered, or UDP blocked)')
      }
      const pingAt = Date.now()
      await write({type: 'ping'})
      const pong = await read('pong', 'decline')
      if (pong.type === 'decline') throw new Error(`the peer declined: ${pong.reason}`)
      const rtt = Date.now() - pingAt
      await write({type: 'sync'})
      // The peer adds our candidates as the sync arrives, half a round trip from now: both sides' first checks cross.
      await new Promise((r) => setTimeout(r, rtt / 2))
      session.addCandidates(theirs)
      await opened(session, theirs, signal)
      await stream.close({signal}).catch(() => {})
      return await this.upgrade(session, peer, 'initiator', signal, started)
    } catch (error) {
      if (stream) abortStream(stream, error)
      if (session) {
        session.close()
        this.sessions.delete(session)
      }
      throw this.failure(peer, error, started, 'initiator')
    } finally {
      this.active.delete(key)
    }
  }

  /** The other side: answer on a relayed connection only, one attempt per peer at a time, within the limit. */
  private async respond(stream: Stream, relayed: Connection): Promise<void> {
    const peer = relayed.remotePeer
    const key = peer.toString()
    const started = Date.now()
    const refuse = !isCircuit(relayed.remoteAddr)
      ? 'WebRTC is signalled over a relayed connection only'
      : this.hasDirect(peer)
        ? 'already connected directly'
        : this.active.has(key)
          ? 'a WebRTC attempt to this peer is under way'
          : this.atLimit()
            ? `at the WebRTC connection limit (${this.limits.maxConnections})`
            : this.tooMany(key, started)
              ? `more than ${RESPONDER_ATTEMPTS} WebRTC attempts in ${RESPONDER_WINDOW_MS / 1000} s`
              : undefined
    if (refuse) return abortStream(stream, new Error(refuse))
    this.active.add(key)
    const signal = this.attemptSignal()
    let session: IceSession | undefined
    try {
      const lp = framed(stream, MAX_SIGNAL_FRAME_BYTES)
      const read = async <T extends SignalMessage['type']>(...types: T[]) =>
        decodeSignal((await lp.read({signal})).subarray(), types, {maxCandidates: this.limits.maxCandidates}) as Extract<SignalMessage, {type: T}>
      const write = (m: SignalMessage) => lp.write(encodeSignal(m), {signal})
      const offer = await read('offer')
      session = new IceSession(this.native!, this.rtcConfig(await this.iceServers(relayed, signal)), 'answer', offer.sdp)
      this.sessions.add(session)
      await write({type: 'answer', sdp: await session.localDescription(signal)})
      const usable = this.usable()
      const theirs = (await read('candidates')).candidates.filter(usable)
      await write({type: 'candidates', candidates: await session.localCandidates(usable, signal)})
      const ping = await read('ping', 'decline')
      if (ping.type === 'decline') throw new Error(`the peer declined: ${ping.reason}`)
      if (theirs.length === 0) {
        await write({type: 'decline', reason: 'none of your ICE candidates can be reached from here'})
        throw new Error('none of the peer\u2019s ICE candidates can be reached from here (no UDP path: STUN unanswered, or UDP blocked)')
      }
      await write({type: 'pong'})
      await read('sync')
      session.addCandidates(theirs)
      await opened(session, theirs, signal)
      await stream.close({signal}).catch(() => {})
      await this.upgrade(session, peer, 'responder', signal, started)
    } catch (error) {
      abortStream(stream, error)
      if (session) {
        session.close()
        this.sessions.delete(session)
      }
      this.failure(peer, error, started, 'responder')
    } finally {
      this.active.delete(key)
    }
  }

  /** The open data channel becomes a libp2p connection: noise (the initiator of /psyche/webrtc/1 starts it) and yamux. */
  private async upgrade(session: IceSession, peer: PeerId, role: 'initiator' | 'responder', signal: AbortSignal, started: number): Promise<Connection> {
    const {addr, local, remote} = session.selected(peer)
    const closePeer = () => {
      if (!this.sessions.delete(session)) return
      session.close()
    }
    const maConn = dataChannelConnection(session.channel, closePeer, addr, role === 'initiator' ? 'outbound' : 'inbound', this.debug, this.limits.maxMessageBytes)
    session.onDown = (reason) => maConn.abort(new Error(reason))
    let connection: Connection
    try {
      connection = await this.components.upgrader.upgradeOutbound(maConn, {signal, initiator: role === 'initiator'})
    } catch (error) {
      maConn.abort(error instanceof Error ? error : new Error(String(error)))
      closePeer()
      throw new Error(`the WebRTC connection did not upgrade: ${errorMessage(error)}`)
    }
    // From here the connection counts against the limit in place of its session.
    this.sessions.delete(session)
    this.connections.add(connection)
    const onClose = () => {
      this.connections.delete(connection)
      session.close()
    }
    if (connection.status !== 'open') onClose()
    else connection.addEventListener('close', onClose, {once: true})
    this.connected++
    this.log({event: 'webrtc_connected', peer_id: peer.toString(), addr: addr.toString(), role, local, remote, ms: Date.now() - started})
    return connection
  }

  /** Logs webrtc_failed (unless we are stopping) and returns the error. */
  private failure(peer: PeerId, error: unknown, started: number, role: 'initiator' | 'responder'): Error {
    if (!this.stopped) {
      this.failed++
      const reason = (error as Error | undefined)?.name === 'TimeoutError' ? `the WebRTC attempt took longer than ${ATTEMPT_TIMEOUT_MS} ms` : errorMessage(error)
      this.log({event: 'webrtc_failed', peer_id: peer.toString(), role, ms: Date.now() - started, reason})
    }
    return error instanceof Error ? error : new Error(String(error))
  }
}

/** WebRTC as a libp2p service (`services: {webrtc: webRtc({log, enabled, stun, limits})}`). */
export function webRtc(init: WebRtcInit): (components: WebRtcComponents) => WebRtc {
  return (components) => new WebRtc(components, init)
}
