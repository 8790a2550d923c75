import type {ComponentLogger, Connection, IdentifyResult, Logger, PeerId, PeerStore, Startable, Stream, Upgrader} from '@libp2p/interface'
import type {ConnectionManager, Registrar} from '@libp2p/interface-internal'
import {multiaddr, type Multiaddr} from '@multiformats/multiaddr'
import {setMaxListeners} from 'node:events'
import {errorMessage} from '../errors.js'
import {peerIdFromString} from '@libp2p/peer-id'
import {addressScope, addrPeerId, isCircuit} from './addresses.js'
import {framed, readJsonObject, writeJson} from './framing.js'
import {dialFrom, punchTcp, socketConnection} from './punch-socket.js'
import {abortStream, anySignal, deadline, ON_LIMITED, Semaphore, type Libp2pEventTarget} from './util.js'
import type {EventLog} from '../events.js'

/**
 * Hole punching between two clients behind NATs, over TCP (what `@libp2p/dcutr` cannot do here: it dials from
 * ephemeral ports, and only public addresses; and the QUIC binding cannot dial from its listening socket, see
 * the README). When WebRTC (webrtc.ts) could not connect two peers that met through a relay, the peer with the
 * smaller peer id starts /psyche/punch/1 over their relayed connection (upgrade.ts decides when):
 *
 *   1. each side learns how its NAT maps its punch port: it dials the relay from that port (a libp2p connection,
 *      closed right after) and reads the address the relay observed (identify);
 *   2. they swap those addresses (`connect`), time a round trip (`ping`/`pong`), and on `sync` both dial each other
 *      from their punch ports, the initiator half a round trip later, so the SYNs cross: a port-preserving NAT maps
 *      the punch port as it did towards the relay, and lets the other's SYN in once ours went out;
 *   3. the TCP connection both dials end in (simultaneous open) is upgraded by libp2p (noise, yamux), the initiator
 *      as the noise initiator: a direct connection to the peer, which results, model pieces and gossip then use
 *      (the dialer opens streams on direct connections first; upgrade.ts closes the relayed one).
 *
 * A symmetric NAT maps each destination to a new port, so the observed address is useless: the dials fail for
 * `windowMs` and the peers keep the relay.
 */
const PUNCH_PROTOCOL = '/psyche/punch/1'

const MAX_MESSAGE_BYTES = 1024
/** Dial window: how long both sides keep dialling each other. */
const DEFAULT_WINDOW_MS = 5_000
/** At most one SYN every this many ms during the window. */
const RETRY_MS = 5
/** The whole exchange (observing, swapping, dialling, upgrading) gives up after this. */
const PUNCH_TIMEOUT_MS = 30_000
/** An observed mapping of the punch port is reused for this long. */
const OBSERVATION_TTL_MS = 60_000
const MAX_CONCURRENT_PUNCHES = 8

interface HolePunchInit {
  log: EventLog
  /** false: neither start punches nor answer them. */
  enabled: boolean
  windowMs?: number
}

interface HolePunchComponents {
  peerId: PeerId
  connectionManager: ConnectionManager
  registrar: Registrar
  upgrader: Upgrader
  peerStore: PeerStore
  logger: ComponentLogger
  events: Libp2pEventTarget
}

interface Endpoint {
  host: string
  port: number
}

/** Where our NAT maps the punch port to, as a relay saw it. */
interface Observation extends Endpoint {
  localPort: number
  at: number
}

/**
 * A TCP endpoint a peer sent (`/ip4/…/tcp/…`), checked: a remote unicast address and a real port (loopback only
 * with `loopback`, when our own mapping is on loopback too).
 */
export function parsePunchAddr(value: unknown, options: {loopback?: boolean} = {}): Endpoint {
  if (typeof value !== 'string' || value.length > 100) throw new Error('the address is not a short string')
  let addr: Multiaddr
  try {
    addr = multiaddr(value)
  } catch (error) {
    throw new Error(`not a multiaddr: ${errorMessage(error)}`)
  }
  const parts = addr.getComponents()
  if (parts.length !== 2 || (parts[0].name !== 'ip4' && parts[0].name !== 'ip6') || parts[1].name !== 'tcp') throw new Error(`${value}: want /ip4/<address>/tcp/<port>`)
  const host = parts[0].value!
  const port = Number(parts[1].value)
  if (!Number.isInteger(port) || port < 1 || port > 65535) throw new Error(`${value}: bad port`)
  // A loopback address only between peers that both see the relay on loopback (one machine).
  const scope = addressScope(addr)
  if (scope !== 'remote' && !(scope === 'loopback' && options.loopback)) throw new Error(`${value}: not a remote address`)
  if (parts[0].name === 'ip4' && Number(host.split('.')[0]) >= 224) throw new Error(`${value}: not a unicast address`)
  if (parts[0].name === 'ip6' && host.toLowerCase().startsWith('ff')) throw new Error(`${value}: not a unicast address`)
  return {host, port}
}

function isLoopback(e: Endpoint): boolean {
  return addressScope(multiaddr(endpointAddr(e))) === 'loopback'
}

function endpointAddr(e: Endpoint): string {
  return `/${e.host.includes(':') ? 'ip6' : 'ip4'}/${e.host}/tcp/${e.port}`
}

/** The TCP endpoint of a direct multiaddr (/ip4/…/tcp/…[/p2p/…]), or undefined. */
function tcpEndpoint(addr: Multiaddr): Endpoint | undefined {
  const parts = addr.getComponents()
  const ip = parts.find((c) => c.name === 'ip4' || c.name === 'ip6')
  const tcp = parts.find((c) => c.name === 'tcp')
  if (!ip?.value || !tcp?.value || isCircuit(addr)) return undefined
  return {host: ip.value, port: Number(tcp.value)}
}

/** The relay's own address in a relayed one: /ip4/R/tcp/P/p2p/RELAY/p2p-circuit/p2p/PEER -> /ip4/R/tcp/P/p2p/RELAY. */
function relayOf(addr: Multiaddr): Multiaddr | undefined {
  const text = addr.toString()
  const at = text.indexOf('/p2p-circuit')
  if (at <= 0) return undefined
  return multiaddr(text.slice(0, at))
}

export class HolePunch implements Startable {
  private readonly log: EventLog
  private readonly debug: Logger
  private readonly windowMs: number
  private readonly slots = new Semaphore(MAX_CONCURRENT_PUNCHES)
  /** Peers being punched now. */
  private readonly active = new Set<string>()
  private observation: Observation | undefined
  private observing: Promise<Observation> | undefined
  private stopped = true
  /** Aborted on stop: a punch under way stops dialling at once. */
  private running = new AbortController()
  /** Direct connections made by punching, and the punches that failed (for stats and tests). */
  punched = 0
  failed = 0

  constructor(
    private readonly components: HolePunchComponents,
    init: HolePunchInit,
  ) {
    this.log = init.log
    this.windowMs = init.windowMs ?? DEFAULT_WINDOW_MS
    this.debug = components.logger.forComponent('psyche:punch')
    this.enabled = init.enabled
  }

  private readonly enabled: boolean

  async start(): Promise<void> {
    this.stopped = false
    this.running = new AbortController()
    if (!this.enabled) return
    await this.components.registrar.handle(PUNCH_PROTOCOL, (stream, connection) => this.respond(stream, connection), {...ON_LIMITED, maxInboundStreams: 4})
  }

  async stop(): Promise<void> {
    this.stopped = true
    this.running.abort(new Error('the node is stopping'))
    if (!this.enabled) return
    await this.components.registrar.unhandle(PUNCH_PROTOCOL)
  }

  /** One punch's deadline, cut short when the node stops. */
  private punchSignal(): AbortSignal {
    const signal = anySignal(deadline(PUNCH_TIMEOUT_MS), this.running.signal)
    setMaxListeners(Infinity, signal)
    return signal
  }

  private hasDirect(peer: PeerId): boolean {
    return this.components.connectionManager.getConnections(peer).some((c) => c.status === 'open' && !isCircuit(c.remoteAddr))
  }

  /** True when punching is on (it answers /psyche/punch/1 and may start it). */
  available(): boolean {
    return this.enabled && !this.stopped
  }

  /**
   * Our punch port's mapping: dial the relay from it and read what the relay saw. One observation serves every
   * peer for OBSERVATION_TTL_MS (a port-preserving NAT maps the port the same way for every destination).
   */
  private observe(relayedVia: Connection, signal: AbortSignal): Promise<Observation> {
    const cached = this.observation
    if (cached && Date.now() - cached.at < OBSERVATION_TTL_MS) return Promise.resolve(cached)
    this.observing ??= this.observeNow(relayedVia, signal).finally(() => (this.observing = undefined))
    return this.observing
  }

  private async observeNow(relayedVia: Connection, signal: AbortSignal): Promise<Observation> {
    const via = relayOf(relayedVia.remoteAddr)
    const relay = via && (tcpEndpoint(via) ? via : await this.relayTcpAddr(via))
    const endpoint = relay && tcpEndpoint(relay)
    if (!relay || !endpoint) throw new Error(`cannot tell the relay's TCP address from ${relayedVia.remoteAddr.toString()}`)
    // A fresh port each time: the last one's connection to the relay may still be in TIME_WAIT.
    const socket = await dialFrom(endpoint.host, endpoint.port, 0, signal)
    const localPort = socket.localPort!
    // libp2p runs identify on every new connection; the relay's answer says where it saw us come from.
    let onIdentify: ((event: CustomEvent<IdentifyResult>) => void) | undefined
    let connection: Connection | undefined
    const identified = new Promise<IdentifyResult>((resolve, reject) => {
      onIdentify = (event) => {
        if (connection !== undefined && event.detail.connection.id === connection.id) resolve(event.detail)
      }
      this.components.events.addEventListener('peer:identify', onIdentify)
      signal.addEventListener('abort', () => reject(new Error('the relay did not answer identify in time')), {once: true})
    })
    try {
      connection = await this.components.upgrader.upgradeOutbound(socketConnection(socket, relay, 'outbound', this.debug), {signal})
      const {observedAddr} = await identified
      const seen = observedAddr && tcpEndpoint(observedAddr)
      if (!seen) throw new Error(`the relay did not say which address it saw (${observedAddr?.toString() ?? 'none'})`)
      this.observation = {...seen, localPort, at: Date.now()}
      return this.observation
    } finally {
      this.components.events.removeEventListener('peer:identify', onIdentify!)
      await connection?.close().catch(() => {})
    }
  }

  /**
   * The relay's TCP address when the relayed connection runs over QUIC (/ip4/R/udp/Q/quic-v1/p2p/RELAY): punching
   * is TCP, so the relay is dialled at a TCP address it told us (identify; the peer store), on the same host first.
   */
  private async relayTcpAddr(via: Multiaddr): Promise<Multiaddr | undefined> {
    const id = addrPeerId(via)
    if (id === undefined) return undefined
    const host = via.getComponents().find((c) => c.name === 'ip4' || c.name === 'ip6')?.value
    let known: Multiaddr[]
    try {
      known = (await this.components.peerStore.get(peerIdFromString(id))).addresses.map((a) => a.multiaddr)
    } catch {
      return undefined // not in the peer store
    }
    const candidates = known.map((a) => ({a, e: tcpEndpoint(a)})).filter((c) => c.e !== undefined && addressScope(c.a) !== 'unusable')
    const pick = candidates.find((c) => c.e!.host === host) ?? candidates.find((c) => addressScope(c.a) === 'remote')
    return pick && multiaddr(`${endpointAddr(pick.e!)}/p2p/${id}`)
  }

  /**
   * The side with the smaller peer id: observe, swap addresses over the relayed connection, time it, sync, dial.
   * Resolves once the punched connection is up; rejects (hole_punch_failed logged) when it is not.
   */
  async initiate(relayed: Connection): Promise<void> {
    const peer = relayed.remotePeer
    const key = peer.toString()
    const started = Date.now()
    let attempts = 0
    if (this.active.has(key)) throw new Error('a punch to this peer is under way')
    this.active.add(key)
    await this.slots.acquire()
    const signal = this.punchSignal()
    let stream: Stream | undefined
    try {
      const ours = await this.observe(relayed, signal)
      stream = await relayed.newStream(PUNCH_PROTOCOL, {signal, ...ON_LIMITED})
      const lp = framed(stream, MAX_MESSAGE_BYTES)
      await writeJson(lp, {type: 'connect', addr: endpointAddr(ours)}, {signal})
      const reply = await readJsonObject(lp, 'punch reply', {signal})
      if (reply.type !== 'connect') throw new Error(`the peer declined: ${String(reply.reason ?? reply.type).slice(0, 200)}`)
      const theirs = parsePunchAddr(reply.addr, {loopback: isLoopback(ours)})
      const pingAt = Date.now()
      await writeJson(lp, {type: 'ping'}, {signal})
      if ((await readJsonObject(lp, 'punch pong', {signal})).type !== 'pong') throw new Error('the peer did not answer the ping')
      const rtt = Date.now() - pingAt
      await writeJson(lp, {type: 'sync'}, {signal})
      await stream.close({signal}).catch(() => {})
      // The peer dials as the sync arrives, half a round trip from now.
      await new Promise((resolve) => setTimeout(resolve, rtt / 2))
      const outcome = await punchTcp(theirs.host, theirs.port, ours.localPort, {windowMs: this.windowMs, retryMs: RETRY_MS, signal})
      attempts = outcome.attempts
      if (!outcome.socket)
        throw new Error(
          `no dial from :${ours.localPort} (seen as ${endpointAddr(ours)}) to ${endpointAddr(theirs)} got through in ${this.windowMs} ms (${attempts} tries, last: ${outcome.lastError ?? 'none'})`,
        )
      await this.upgrade(outcome.socket, theirs, peer, true, signal, started, attempts)
    } catch (error) {
      if (stream) abortStream(stream, error)
      this.fail(peer, error, started, attempts, 'initiator')
      throw error
    } finally {
      this.slots.release()
      this.active.delete(key)
    }
  }

  /** The other side: answer with our mapping, echo the ping, and dial on sync. */
  private async respond(stream: Stream, relayed: Connection): Promise<void> {
    const peer = relayed.remotePeer
    const key = peer.toString()
    const started = Date.now()
    let attempts = 0
    const signal = this.punchSignal()
    if (!isCircuit(relayed.remoteAddr) || this.active.has(key) || this.hasDirect(peer)) {
      return abortStream(stream, new Error(this.hasDirect(peer) ? 'already connected directly' : 'a punch to this peer is under way'))
    }
    this.active.add(key)
    await this.slots.acquire()
    try {
      const lp = framed(stream, MAX_MESSAGE_BYTES)
      const request = await readJsonObject(lp, 'punch request', {signal})
      if (request.type !== 'connect') throw new Error('the punch request is not a connect')
      const ours = await this.observe(relayed, signal)
      const theirs = parsePunchAddr(request.addr, {loopback: isLoopback(ours)})
      await writeJson(lp, {type: 'connect', addr: endpointAddr(ours)}, {signal})
      if ((await readJsonObject(lp, 'punch ping', {signal})).type !== 'ping') throw new Error('expected a ping')
      await writeJson(lp, {type: 'pong'}, {signal})
      if ((await readJsonObject(lp, 'punch sync', {signal})).type !== 'sync') throw new Error('expected a sync')
      const outcome = await punchTcp(theirs.host, theirs.port, ours.localPort, {windowMs: this.windowMs, retryMs: RETRY_MS, signal})
      attempts = outcome.attempts
      if (!outcome.socket)
        throw new Error(
          `no dial from :${ours.localPort} (seen as ${endpointAddr(ours)}) to ${endpointAddr(theirs)} got through in ${this.windowMs} ms (${attempts} tries, last: ${outcome.lastError ?? 'none'})`,
        )
      await this.upgrade(outcome.socket, theirs, peer, false, signal, started, attempts)
    } catch (error) {
      abortStream(stream, error)
      this.fail(peer, error, started, attempts, 'responder')
    } finally {
      this.slots.release()
      this.active.delete(key)
    }
  }

  /** The punched socket becomes a libp2p connection; the initiator of /psyche/punch/1 is the noise initiator. */
  private async upgrade(
    socket: import('node:net').Socket,
    theirs: Endpoint,
    peer: PeerId,
    initiator: boolean,
    signal: AbortSignal,
    started: number,
    attempts: number,
  ): Promise<void> {
    const remote = multiaddr(`${endpointAddr(theirs)}/p2p/${peer.toString()}`)
    const maConn = socketConnection(socket, remote, initiator ? 'outbound' : 'inbound', this.debug)
    try {
      await this.components.upgrader.upgradeOutbound(maConn, {signal, initiator})
    } catch (error) {
      maConn.abort(error instanceof Error ? error : new Error(String(error)))
      throw new Error(`the punched connection did not upgrade: ${errorMessage(error)}`)
    }
    this.punched++
    this.log({event: 'hole_punched', peer_id: peer.toString(), addr: remote.toString(), role: initiator ? 'initiator' : 'responder', attempts, ms: Date.now() - started})
  }

  private fail(peer: PeerId, error: unknown, started: number, attempts: number, role: 'initiator' | 'responder'): void {
    if (this.stopped) return
    this.failed++
    this.log({event: 'hole_punch_failed', peer_id: peer.toString(), role, attempts, ms: Date.now() - started, reason: errorMessage(error)})
  }
}

/** Hole punching as a libp2p service (`services: {punch: holePunch({log, enabled})}`), after identify. */
export function holePunch(init: HolePunchInit): (components: HolePunchComponents) => HolePunch {
  return (components) => new HolePunch(components, init)
}
