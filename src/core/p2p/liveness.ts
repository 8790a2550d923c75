import type {Connection, PeerId, Startable, Stream} from '@libp2p/interface'
import type {ConnectionManager, Registrar} from '@libp2p/interface-internal'
import type {Multiaddr} from '@multiformats/multiaddr'
import {errorMessage} from '../errors.js'
import {isCircuit} from './addresses.js'
import {framed} from './framing.js'
import {abortStream, deadline, ON_LIMITED, type Libp2pEventTarget} from './util.js'
import type {EventLog} from '../events.js'

/** A one-byte echo over a new stream: the peer at the other end of that connection answers. */
const ALIVE_PROTOCOL = '/psyche/alive/1'
/** How long an older connection may take to answer before it counts as dead (a live one answers in a round trip). */
export const ALIVE_TIMEOUT_MS = 2_000
/** Probes under way at once (each is one stream on one of our connections). */
const MAX_CONCURRENT_PROBES = 16

interface LivenessInit {
  log: EventLog
  /** After a peer's dead connections were cut: dial it again (its addresses from the coordinator, and `hint`). */
  reconnect: (peer: string, hint: Multiaddr[]) => void
}

interface LivenessComponents {
  connectionManager: ConnectionManager
  registrar: Registrar
  events: Libp2pEventTarget
}

/**
 * Dead connections to a peer that came back. A peer killed and restarted with the same key (a client's restart,
 * a machine that lost its network) dials us again while we still hold its old connection: over QUIC (UDP, no FIN or
 * RST) that one looks open until its idle timeout (10 s), and so does TCP to a machine that vanished. libp2p and
 * gossipsub keep using the old one: gossipsub keeps one outbound stream per peer and opens none on the new
 * connection, so the restarted peer got no announcement and its results reached no one (a restarted client applied
 * no round, CI). When a connection opens to a peer we already had a connection to, each older one is probed (a
 * one-byte echo, ALIVE_TIMEOUT_MS, counting only the time we could run: util.ts deadline; one that does not answer
 * but sent something meanwhile is alive); if one is dead, every connection to the peer is aborted (libp2p then says
 * the peer disconnected, and gossipsub forgets it) and the peer is dialled again, which starts it afresh. A live
 * duplicate (the relay's dial-back, a punched connection beside a relayed one, two peers dialling each other at
 * once) answers and is left alone; a relayed one is not probed when a direct one opens (upgrade.ts closes it). A
 * libp2p service: see `liveness()`.
 */
export class Liveness implements Startable {
  private readonly log: EventLog
  private readonly reconnect: LivenessInit['reconnect']
  /** Peers whose older connections are being probed now (one probe round per peer at a time). */
  private readonly probing = new Set<string>()
  /** Connections a probe found dead (not probed twice while they are being closed). */
  private readonly dead = new WeakSet<Connection>()
  private stopped = true
  private readonly onOpen = (event: CustomEvent<Connection>): void => this.check(event.detail)

  constructor(
    private readonly components: LivenessComponents,
    init: LivenessInit,
  ) {
    this.log = init.log
    this.reconnect = init.reconnect
  }

  async start(): Promise<void> {
    this.stopped = false
    await this.components.registrar.handle(ALIVE_PROTOCOL, (stream) => this.answer(stream), {...ON_LIMITED, maxInboundStreams: 4})
    this.components.events.addEventListener('connection:open', this.onOpen)
  }

  async stop(): Promise<void> {
    this.stopped = true
    this.components.events.removeEventListener('connection:open', this.onOpen)
    await this.components.registrar.unhandle(ALIVE_PROTOCOL)
  }

  /** The echo: one byte back for the byte read. */
  private async answer(stream: Stream): Promise<void> {
    const signal = deadline(ALIVE_TIMEOUT_MS)
    try {
      const lp = framed(stream, 1)
      const frame = await lp.read({signal})
      await lp.write(frame.subarray(), {signal})
      await stream.close({signal})
    } catch (error) {
      abortStream(stream, error)
    }
  }

  /**
   * True when the connection carries a stream that answers within ALIVE_TIMEOUT_MS (also asked by the connection
   * gater, before it refuses a peer's new connection as the duplicate of an older one of ours: see node.ts).
   */
  async alive(connection: Connection): Promise<boolean> {
    if (this.dead.has(connection)) return false
    const answered = await this.probeOnce(connection)
    if (!answered) this.dead.add(connection)
    return answered
  }

  private async probeOnce(connection: Connection): Promise<boolean> {
    const signal = deadline(ALIVE_TIMEOUT_MS)
    let stream: Stream | undefined
    // Anything the peer sends on the connection's streams meanwhile (gossipsub's heartbeats, a transfer), or a stream
    // it opens, shows it alive: a peer too busy to answer the probe in time (a starved machine) is not cut for it.
    const started = Date.now()
    let heard = false
    const onMessage = () => (heard = true)
    // Only streams already read by their owner: a listener added to one that is not would take its buffered data.
    const watched = connection.streams.filter((s) => s.listenerCount('message') > 0)
    for (const s of watched) s.addEventListener('message', onMessage)
    const heardFrom = () => heard || connection.streams.some((s) => s.direction === 'inbound' && s.protocol !== ALIVE_PROTOCOL && s.timeline.open >= started)
    try {
      stream = await connection.newStream(ALIVE_PROTOCOL, {signal, ...ON_LIMITED})
      const lp = framed(stream, 1)
      await lp.write(Uint8Array.of(1), {signal})
      const back = await lp.read({signal})
      await stream.close({signal}).catch(() => {})
      return back.byteLength === 1
    } catch (error) {
      stream?.abort(new Error('the probe failed'))
      // A peer that does not speak the protocol (the relay, an older client) said so over the connection: it is there.
      return (error as Error).name === 'UnsupportedProtocolError' || heardFrom()
    } finally {
      for (const s of watched) s.removeEventListener('message', onMessage)
    }
  }

  private check(opened: Connection): void {
    if (this.stopped) return
    const peer = opened.remotePeer
    const key = peer.toString()
    if (this.probing.has(key) || this.probing.size >= MAX_CONCURRENT_PROBES) return
    // A relayed connection is not probed when a direct one opens: upgrade.ts closes it (the peer may be closing it
    // from its side at this very moment, and a probe caught in that would cut the new direct connection too).
    const superseded = (c: Connection) => isCircuit(c.remoteAddr) && !isCircuit(opened.remoteAddr)
    const older = this.components.connectionManager
      .getConnections(peer)
      .filter((c) => c !== opened && c.status === 'open' && c.timeline.open <= opened.timeline.open && !superseded(c))
    if (older.length === 0) return
    this.probing.add(key)
    void this.probe(peer, opened, older).finally(() => this.probing.delete(key))
  }

  private async probe(peer: PeerId, opened: Connection, older: Connection[]): Promise<void> {
    try {
      const answers = await Promise.all(older.map((c) => this.alive(c)))
      const dead = older.filter((_, i) => !answers[i]).filter((c) => c.status === 'open')
      if (dead.length === 0 || this.stopped) return
      const key = peer.toString()
      this.log({event: 'stale_connection', peer_id: key, addrs: dead.map((c) => c.remoteAddr.toString()), replaced_by: opened.remoteAddr.toString()})
      // A fresh start with the peer: all of its connections closed (libp2p's peer:disconnect, which resets gossipsub's
      // state for it), then one dial. The new connection's address is where the peer listens only when we dialled it:
      // an inbound one comes from the port it dials from (TCP's ephemeral port; libp2p-quic's dialing socket).
      const hint = !isCircuit(opened.remoteAddr) && opened.direction === 'outbound' ? [opened.remoteAddr] : []
      // Aborted, not closed: a graceful close leaves our side closing while the peer still sends, and yamux answering
      // it on the closed connection throws outside any caller (it crashed a starved process); these are dead anyway.
      for (const c of this.components.connectionManager.getConnections(peer)) c.abort(new Error('stale: a connection to this peer did not answer its probe'))
      if (!this.stopped) this.reconnect(key, hint)
    } catch (error) {
      this.log({event: 'stale_connection_failed', peer_id: peer.toString(), reason: errorMessage(error)})
    }
  }
}

/** The stale-connection check as a libp2p service (`services: {liveness: liveness({log, reconnect})}`). */
export function liveness(init: LivenessInit): (components: LivenessComponents) => Liveness {
  return (components) => new Liveness(components, init)
}
