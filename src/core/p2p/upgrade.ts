import type {Connection, IdentifyResult, PeerId, Startable} from '@libp2p/interface'
import type {ConnectionManager} from '@libp2p/interface-internal'
import {errorMessage} from '../errors.js'
import type {EventLog} from '../events.js'
import {isCircuit} from './addresses.js'
import {deadline, sleep, type Libp2pEventTarget} from './util.js'

/**
 * From a relayed connection to a direct one: the dial order after two peers meet through a circuit relay, and the
 * end of the relayed connection once a direct one is up. A libp2p service (`directUpgrade()`); which peers to be
 * connected to at all is the dialer's business (and that of a connection manager above it), how to get a direct
 * connection to one of them is this module's.
 *
 * When a relayed connection opens to a peer we hold no direct connection to, the side with the smaller peer id
 * tries, one after the other, until one gives a direct connection:
 *
 *   1. WebRTC (webrtc.ts): UDP hole punching with ICE. Crosses NATs that drop unsolicited packets and, with its
 *      synchronized start, NATs that answer them (a RST, an ICMP error); fails within ~2 s when there is no UDP
 *      path (STUN unanswered, UDP blocked), within ~8 s when ICE finds no pair (symmetric NATs), and is then
 *      tried once more with fresh sockets (the timing of the first packets may have been off);
 *   2. TCP hole punching (punch.ts): simultaneous open from a punch port, a 5 s window. For networks that block UDP;
 *   3. the relay, which stays: everything keeps flowing through it, bounded by the relay's limits.
 *
 * A pair is tried again when a new relayed connection between them opens, at most MAX_ROUNDS times, RETRY_AFTER_MS
 * apart. Each step is an UpgradeStrategy: a new way to a direct connection is one more strategy in the list.
 *
 * Once a direct connection to a peer is open and identified, its relayed connections are closed: at once when no
 * transfer (a result, a model piece) runs on them, else when the transfers are done, at most RELAYED_DRAIN_MS later.
 * New transfers already go to the direct connection (the dialer opens streams on direct connections first); gossip
 * follows when the relayed connection closes: gossipsub keeps one stream per peer, so the direct connection is
 * identified again, and gossipsub opens its stream there. The relay then carries nothing more for the pair (its
 * operator's bandwidth, and its per-connection limits, are spent only where no direct path exists).
 */

/** One way from a relayed connection to a direct one. */
interface UpgradeStrategy {
  readonly name: string
  /** Whether it can be tried now (switched on, its native parts loaded). */
  available(): boolean
  /** Resolves once a direct connection to the relayed connection's peer is open; rejects (and logs why) otherwise. */
  initiate(relayed: Connection): Promise<unknown>
}

const MAX_ROUNDS = 3
/** Tries of one strategy in a round when its failure says another try may work (WebRTC's ICE timing). */
const STRATEGY_ATTEMPTS = 2
const RETRY_AFTER_MS = 60_000
/** A relayed connection still carrying a transfer is closed once it is done, or after this long. */
const RELAYED_DRAIN_MS = 60_000
const IDENTIFY_TIMEOUT_MS = 10_000
/** A relayed connection's graceful close; then it is aborted. */
const CLOSE_TIMEOUT_MS = 5_000

interface DirectUpgradeInit {
  log: EventLog
  /** The strategies' names in the order they are tried (see the comment at the top). */
  order: readonly string[]
}

interface DirectUpgradeComponents {
  peerId: PeerId
  connectionManager: ConnectionManager
  events: Libp2pEventTarget
  identify: {identify(connection: Connection, options?: {signal?: AbortSignal}): Promise<IdentifyResult>}
  /** gossipsub: its outbound stream per peer (GossipSub.streamsOutbound, public on the class) is what has to move. */
  pubsub: object
  [service: string]: unknown
}

/** How long a peer's gossip stream is waited for on the direct connection once the relayed one closed. */
const REGOSSIP_MS = 5_000

export class DirectUpgrade implements Startable {
  private readonly log: EventLog
  private stopped = true
  private readonly active = new Set<string>()
  private readonly tried = new Map<string, {rounds: number; at: number}>()
  /** Peers whose relayed connections are being closed now. */
  private readonly dropping = new Set<string>()
  private readonly onOpen = (event: CustomEvent<Connection>): void => {
    const connection = event.detail
    if (isCircuit(connection.remoteAddr)) {
      this.maybeUpgrade(connection)
      this.dropRelayed(connection.remotePeer)
    }
  }
  private readonly onIdentify = (event: CustomEvent<IdentifyResult>): void => {
    if (!isCircuit(event.detail.connection.remoteAddr)) this.dropRelayed(event.detail.peerId)
  }
  /** Peers whose gossip stream is being moved to the direct connection now. */
  private readonly regossiping = new Set<string>()
  private readonly onClose = (event: CustomEvent<Connection>): void => {
    if (isCircuit(event.detail.remoteAddr)) this.regossip(event.detail.remotePeer)
  }

  constructor(
    private readonly components: DirectUpgradeComponents,
    private readonly init: DirectUpgradeInit,
  ) {
    this.log = init.log
  }

  start(): void {
    this.stopped = false
    this.components.events.addEventListener('connection:open', this.onOpen)
    this.components.events.addEventListener('peer:identify', this.onIdentify)
    this.components.events.addEventListener('connection:close', this.onClose)
  }

  stop(): void {
    this.stopped = true
    this.components.events.removeEventListener('connection:open', this.onOpen)
    this.components.events.removeEventListener('peer:identify', this.onIdentify)
    this.components.events.removeEventListener('connection:close', this.onClose)
  }

  private strategies(): UpgradeStrategy[] {
    return this.init.order.map((name) => this.components[name] as UpgradeStrategy).filter((s) => s?.available())
  }

  private open(peer: PeerId): Connection[] {
    return this.components.connectionManager.getConnections(peer).filter((c) => c.status === 'open')
  }

  private direct(peer: PeerId): Connection | undefined {
    return this.open(peer).find((c) => !isCircuit(c.remoteAddr))
  }

  /** A relayed connection opened: try the strategies in order if we are the side that starts (smaller peer id). */
  private maybeUpgrade(relayed: Connection): void {
    const peer = relayed.remotePeer
    const key = peer.toString()
    if (this.stopped || this.components.peerId.toString() >= key || this.active.has(key) || this.direct(peer)) return
    const tried = this.tried.get(key)
    if (tried && (tried.rounds >= MAX_ROUNDS || Date.now() - tried.at < RETRY_AFTER_MS)) return
    const strategies = this.strategies()
    if (strategies.length === 0) return
    this.tried.set(key, {rounds: (tried?.rounds ?? 0) + 1, at: Date.now()})
    this.active.add(key)
    void this.upgrade(relayed, strategies).finally(() => this.active.delete(key))
  }

  private async upgrade(relayed: Connection, strategies: UpgradeStrategy[]): Promise<void> {
    for (const strategy of strategies) {
      for (let attempt = 1; attempt <= STRATEGY_ATTEMPTS; attempt++) {
        if (this.stopped || relayed.status !== 'open' || this.direct(relayed.remotePeer)) return
        try {
          await strategy.initiate(relayed)
          return
        } catch (error) {
          // Logged by the strategy (webrtc_failed, hole_punch_failed). Once more when it says a new try may do
          // better (a timing that did not work out), else the next strategy.
          if (!(error as {retryable?: boolean}).retryable) break
        }
      }
    }
  }

  /**
   * A direct connection to `peer` is open and identified: close its relayed connections once they carry no transfer
   * (see the comment at the top), then identify the direct one again so that gossipsub opens its stream there.
   */
  private dropRelayed(peer: PeerId): void {
    const key = peer.toString()
    if (this.stopped || this.dropping.has(key)) return
    const direct = this.direct(peer)
    if (!direct || !this.open(peer).some((c) => isCircuit(c.remoteAddr))) return
    this.dropping.add(key)
    void this.drain(peer, direct)
      .catch((error) => this.log({event: 'relayed_close_failed', peer_id: key, reason: errorMessage(error)}))
      .finally(() => this.dropping.delete(key))
  }

  private async drain(peer: PeerId, direct: Connection): Promise<void> {
    const started = Date.now()
    const busy = (c: Connection) => c.streams.some((s) => s.protocol?.startsWith('/psyche/') && !s.protocol.startsWith('/psyche/alive/'))
    for (;;) {
      const relayed = this.open(peer).filter((c) => isCircuit(c.remoteAddr))
      if (relayed.length === 0 || this.stopped || direct.status !== 'open') return
      const idle = relayed.filter((c) => !busy(c) || Date.now() - started >= RELAYED_DRAIN_MS)
      if (idle.length > 0) {
        await Promise.all(idle.map((c) => c.close({signal: deadline(CLOSE_TIMEOUT_MS)}).catch((error) => c.abort(error instanceof Error ? error : new Error(String(error))))))
        this.log({event: 'relayed_closed', peer_id: peer.toString(), direct: direct.remoteAddr.toString(), waited_ms: Date.now() - started})
        if (idle.length === relayed.length) return
      }
      await sleep(250)
    }
  }

  /**
   * A relayed connection to `peer` closed (by us or by the peer) while a direct one is open: gossipsub's one stream to
   * the peer went with it, and gossipsub opens another only when told of a connection (identify). Once the old
   * stream is gone, the direct connection is identified again, until our stream to the peer runs on it.
   */
  private regossip(peer: PeerId): void {
    const key = peer.toString()
    if (this.stopped || this.regossiping.has(key) || !this.direct(peer)) return
    this.regossiping.add(key)
    void (async () => {
      const until = Date.now() + REGOSSIP_MS
      let identified = false
      while (Date.now() < until && !this.stopped) {
        const direct = this.direct(peer)
        if (!direct) return
        if (direct.streams.some((s) => s.direction === 'outbound' && /\/(meshsub|floodsub)\//.test(s.protocol ?? ''))) return
        // Without that map (another gossipsub), identify at once: the old stream may then still be there, and be kept.
        const outbound = (this.components.pubsub as {streamsOutbound?: ReadonlyMap<string, unknown>}).streamsOutbound
        if (!identified && !outbound?.has(key)) {
          identified = true
          await this.components.identify.identify(direct, {signal: deadline(IDENTIFY_TIMEOUT_MS)}).catch((error) => {
            identified = false
            this.log({event: 'relayed_close_failed', peer_id: key, reason: `gossip did not move to the direct connection: ${errorMessage(error)}`})
          })
        }
        await sleep(50)
      }
    })().finally(() => this.regossiping.delete(key))
  }
}

/** The upgrade service (`services: {upgrade: directUpgrade({log, order: ['webrtc', 'punch']})}`), after the strategies and identify. */
export function directUpgrade(init: DirectUpgradeInit): (components: DirectUpgradeComponents) => DirectUpgrade {
  return (components) => new DirectUpgrade(components, init)
}
