import type {Connection, MultiaddrConnection, PeerId, Startable, Stream} from '@libp2p/interface'
import type {ConnectionManager} from '@libp2p/interface-internal'
import type {PeerStore} from '@libp2p/interface'
import {peerIdFromString} from '@libp2p/peer-id'
import {multiaddr, type Multiaddr} from '@multiformats/multiaddr'
import {errorMessage} from '../errors.js'
import {addrPeerId, isCircuit, isOtherPrivateNetwork, localNetworks} from './addresses.js'
import {HAVE_PROTOCOL} from './have.js'
import {DEFAULT_MAX_PEER_CONNECTIONS, fullMeshUpTo, overlay} from './overlay.js'
import {isQuicAddr} from './transports.js'
import {deadline, dialErrorMessage, ON_LIMITED} from './util.js'
import type {EventLog} from '../events.js'

/** A peer we were told about but could not reach, with the addresses we tried (for the no-exchange warning). */
export interface DialFailure {
  peer_id: string
  addrs: string[]
  reason: string
  at: number
}

/** A direct dial gives up quickly: a private address of another network may never answer (no ICMP on the internet). */
const DIRECT_DIAL_TIMEOUT_MS = 8_000
/** A QUIC dial gives up sooner still: where UDP is blocked the handshake never answers, and TCP is tried next. */
const QUIC_DIAL_TIMEOUT_MS = 3_000
export const RELAYED_DIAL_TIMEOUT_MS = 30_000
/**
 * A private address on none of our networks (another LAN: see dialPlan) is given this long, QUIC and TCP each: on
 * the internet it never answers, while a routed private network (VPC subnets) answers within a few round trips.
 */
const OTHER_NETWORK_DIAL_TIMEOUT_MS = 2_000
/**
 * A peer whose only addresses are another LAN's private ones has just joined and not yet reserved its relay slot
 * (it publishes its interface addresses first, its relayed one a second or so later): its relayed address is
 * waited for this long before those addresses are dialled.
 */
const RELAYED_ADDRESS_GRACE_MS = 3_000
/**
 * One direct connection per pair of peers. Two peers told of each other by the same state push dial each other at
 * once (2(N−1) connections per client otherwise); both sides apply one rule: the direct connection dialled by the
 * lower peer id stays. The lower side refuses (its connection gater: before any stream is opened on it) a direct
 * inbound connection from a higher peer while it holds an open direct connection it dialled to that peer, both less
 * than this long ago (the dial started or the connection opened); the higher side, its dial refused that quickly, waits this long (and a
 * second more) for the lower one's connection, and dials once more if none came (the lower side's dial failed).
 */
const TIE_WINDOW_MS = 2_000
/**
 * A dial the far side refused for another reason than the tie rule (its limits: libp2p takes 5 inbound connections a
 * second from one host, and a NAT's clients share one) is made once more after this long, when no connection came.
 */
const REFUSED_REDIAL_MS = 1_000
/** A connection to a member outside our overlay (opened for a transfer) with no exchange stream for this long is closed. */
const DEFAULT_IDLE_CLOSE_MS = 10_000
/**
 * Overlay dials (connectMembers) in flight at once; the rest wait their turn. Every member of an epoch dials its
 * overlay when the epoch's Warmup begins: 256 clients starting 8 dials each at once on one machine (the scale bench)
 * left every noise handshake too little CPU to finish before its deadline, all of them timed out together, and the
 * retries did the same (4,121 of 4,121 client-peer pairs failed). Queued, a dial's deadline runs from its start.
 * Transfers and redials do not wait here.
 */
const MAX_CONCURRENT_OVERLAY_DIALS = 4
/** How often connections are checked for idleness. */
const IDLE_SWEEP_MS = 2_000
/** The peer store tag that keeps overlay neighbours' connections when libp2p prunes past its maxConnections. */
const OVERLAY_TAG = 'psyche-overlay'

interface PeerDialerInit {
  log: EventLog
  /** This machine's networks as CIDRs (default: its interfaces'; see dialPlan). */
  localNetworks?: () => string[]
  /** The bound on our connections (overlay.ts: past half of it the run's members are not all dialled); default 32. */
  maxConnections?: number
  /** See DEFAULT_IDLE_CLOSE_MS. */
  idleCloseMs?: number
}

interface PeerDialerComponents {
  peerId: PeerId
  connectionManager: ConnectionManager
  peerStore: PeerStore
}

/**
 * Dials the peers the coordinator tells us about (direct addresses briefly, then relayed ones), remembers who could
 * not be reached, and opens streams for the exchanges over the best open connection. A libp2p service: see
 * `peerDialer()`.
 */
export class PeerDialer implements Startable {
  private readonly peerId: string
  private readonly log: EventLog
  private readonly dialFailures = new Map<string, DialFailure>()
  /** Peers being dialled now (one dial per peer at a time; a second caller waits for the first). */
  private readonly dialing = new Map<string, Promise<void>>()
  /** Peer -> the addresses its dial under way tries, and the dial queued behind it for addresses learned since. */
  private readonly dialingAddrs = new Map<string, string>()
  private readonly followUps = new Map<string, Promise<void>>()
  /** Peer -> the addresses the coordinator last gave for it. */
  private readonly knownAddrs = new Map<string, Multiaddr[]>()
  /** Peer -> its direct addresses that did not answer (it is dialled through the relay first while they stay the same). */
  private readonly directFailed = new Map<string, string>()
  /** Peer -> its addresses on another LAN (dialPlan) that did not answer: a retry leaves them out while they stay the same. */
  private readonly otherNetworkFailed = new Map<string, string>()
  /** Peer -> when our direct dial to it started, while it runs (see TIE_WINDOW_MS). */
  private readonly directDialStarted = new Map<string, number>()
  /** Peers dialled once more after a refusal (watchRefusal), until one of our connections to them stays open. */
  private readonly redialedAfterRefusal = new Set<string>()
  private stopped = false
  private readonly localNetworks: () => string[]
  private networksCache: {at: number; cidrs: string[]} | undefined
  private readonly maxConnections: number
  private readonly idleCloseMs: number
  /** The run's members we keep connections to (overlay.ts); undefined: all of them (a full mesh). */
  private neighbours: Set<string> | undefined
  /** The members we dial (see overlay.ts). */
  private dialSet: Set<string> | undefined
  /** Connection id -> when an exchange stream was last seen on it (idle sweep). */
  private readonly lastBusy = new Map<string, number>()
  private sweepTimer: ReturnType<typeof setInterval> | undefined
  /** Connections closed for being idle (for measurements and tests). */
  idleClosed = 0
  /** Overlay dials running (at most MAX_CONCURRENT_OVERLAY_DIALS), and those waiting for a turn. */
  private overlayDials = 0
  private readonly overlayQueue: (() => void)[] = []

  constructor(
    private readonly components: PeerDialerComponents,
    init: PeerDialerInit,
  ) {
    this.peerId = components.peerId.toString()
    this.log = init.log
    this.localNetworks = init.localNetworks ?? localNetworks
    this.maxConnections = init.maxConnections ?? DEFAULT_MAX_PEER_CONNECTIONS
    this.idleCloseMs = init.idleCloseMs ?? DEFAULT_IDLE_CLOSE_MS
  }

  /** Our interfaces' networks (see dialPlan), read at most every few seconds (interfaces come and go). */
  private networks(): string[] {
    const now = Date.now()
    if (!this.networksCache || now - this.networksCache.at > 5_000) this.networksCache = {at: now, cidrs: this.localNetworks()}
    return this.networksCache.cidrs
  }

  start(): void {
    this.stopped = false
    this.sweepTimer = setInterval(() => this.closeIdle(), IDLE_SWEEP_MS)
    this.sweepTimer.unref?.()
  }

  beforeStop(): void {
    this.stopped = true
    clearInterval(this.sweepTimer)
  }

  stop(): void {
    this.stopped = true
    clearInterval(this.sweepTimer)
  }

  /**
   * Dials the run's members learned from the coordinator (all their addresses, ours skipped), as connect() does, but
   * only our overlay neighbours among them (overlay.ts): the others' addresses are kept for transfers, which dial
   * them on demand (openStream). The neighbours are tagged so libp2p's pruning keeps their connections.
   * `retry`: a call only to dial again the members whose dials failed; a member's addresses on another LAN that
   * already did not answer (and have not changed) are not dialled again (they never will answer on the internet).
   */
  async connectMembers(addrs: string[], options: {retry?: boolean} = {}): Promise<void> {
    const byPeer = this.byPeer(addrs)
    const plan = overlay(this.peerId, [...byPeer.keys()], fullMeshUpTo(this.maxConnections))
    for (const [peer, targets] of byPeer) if (targets.length > 0) this.knownAddrs.set(peer, targets)
    // What failed is remembered for the run's members only: identities that come and go must not grow these maps.
    for (const failed of [this.directFailed, this.otherNetworkFailed]) for (const peer of failed.keys()) if (!byPeer.has(peer)) failed.delete(peer)
    const before = this.neighbours
    this.neighbours = plan.fullMesh ? undefined : plan.neighbours
    this.dialSet = plan.fullMesh ? undefined : new Set(plan.dial)
    if (!plan.fullMesh) void this.tagNeighbours(before ?? new Set(), plan.neighbours)
    await Promise.all(plan.dial.map((peer) => this.dialPeer(peer, byPeer.get(peer) ?? [], true, options.retry)))
  }

  /** Runs an overlay dial in its turn (MAX_CONCURRENT_OVERLAY_DIALS at once); a finished one hands its turn to the next. */
  private async inTurn(dial: () => Promise<void>): Promise<void> {
    if (this.overlayDials < MAX_CONCURRENT_OVERLAY_DIALS) this.overlayDials++
    else await new Promise<void>((r) => this.overlayQueue.push(r))
    try {
      await dial()
    } finally {
      const next = this.overlayQueue.shift()
      if (next) next()
      else this.overlayDials--
    }
  }

  /** The members we dial (overlay.ts); undefined while we dial them all. */
  dialedMembers(): ReadonlySet<string> | undefined {
    return this.dialSet
  }

  private async tagNeighbours(before: Set<string>, now: Set<string>): Promise<void> {
    const change = async (peer: string, tag: boolean) => {
      try {
        await this.components.peerStore.merge(peerIdFromString(peer), {tags: {[OVERLAY_TAG]: tag ? {value: 100} : undefined}})
      } catch {
        // a peer id we cannot parse is not dialled either
      }
    }
    await Promise.all([...[...now].filter((p) => !before.has(p)).map((p) => change(p, true)), ...[...before].filter((p) => !now.has(p)).map((p) => change(p, false))])
  }

  /**
   * Closes connections to run members outside our overlay that carried no exchange stream (/psyche/…) for
   * idleCloseMs: they were opened for a transfer, ours or theirs. Only while the overlay is not a full mesh; relays
   * and other non-members are left alone.
   */
  private closeIdle(): void {
    const neighbours = this.neighbours
    const now = Date.now()
    const open = new Set<string>()
    for (const c of this.components.connectionManager.getConnections()) {
      open.add(c.id)
      // The long-lived have stream (have.ts) lasts as long as the connection: it is no transfer.
      if (c.streams.some((s) => s.protocol?.startsWith('/psyche/') && s.protocol !== HAVE_PROTOCOL)) this.lastBusy.set(c.id, now)
      if (neighbours === undefined || this.stopped || c.status !== 'open') continue
      const peer = c.remotePeer.toString()
      if (neighbours.has(peer) || !this.knownAddrs.has(peer)) continue
      const since = Math.max(this.lastBusy.get(c.id) ?? 0, c.timeline.open)
      if (now - since < this.idleCloseMs) continue
      this.idleClosed++
      // Aborted, not closed: a graceful close leaves the read side open while our side is closing, and a stream the
      // peer opens in that window makes yamux abort on a closed connection, which throws outside any caller.
      c.abort(new Error('idle: no transfer for a while, and not an overlay neighbour'))
    }
    for (const id of this.lastBusy.keys()) if (!open.has(id)) this.lastBusy.delete(id)
  }

  /**
   * Dials peers learned from the coordinator: every address of one peer is tried by libp2p in turn (direct before
   * relayed). Skips self and peers we are connected to; a failed dial is logged and remembered (dialFailures),
   * and may be retried by a later call.
   */
  async connect(addrs: string[]): Promise<void> {
    const byPeer = this.byPeer(addrs)
    await Promise.all([...byPeer].map(([peer, targets]) => this.dialPeer(peer, targets)))
  }

  /** Addresses by the peer they end in (ours and malformed ones left out, and logged). */
  private byPeer(addrs: string[]): Map<string, Multiaddr[]> {
    const byPeer = new Map<string, Multiaddr[]>()
    for (const addr of addrs) {
      let target: Multiaddr
      try {
        target = multiaddr(addr)
      } catch (error) {
        this.log({event: 'dial_failed', addr, reason: `not a multiaddr: ${errorMessage(error)}`})
        continue
      }
      const peer = addrPeerId(target)
      if (peer === undefined) {
        this.log({event: 'dial_failed', addr, reason: 'the address does not end in /p2p/<peer id>'})
        continue
      }
      if (peer === this.peerId) continue
      let list = byPeer.get(peer)
      if (!list) byPeer.set(peer, (list = []))
      list.push(target)
    }
    return byPeer
  }

  /**
   * One peer: its direct addresses first (briefly: a private address of someone else's network may never answer),
   * then its relayed ones. A peer whose direct addresses failed is dialled through the relay first next time.
   * One dial per peer at a time: state pushes arrive faster than dials to unreachable addresses time out.
   */
  private dialPeer(peer: string, targets: Multiaddr[], overlay = false, retry = false): Promise<void> {
    if (targets.length > 0) this.knownAddrs.set(peer, targets)
    const inFlight = this.dialing.get(peer)
    if (inFlight) {
      // Addresses the dial under way does not know (the peer's relayed address arrived while its direct ones were
      // being tried): dial them once it ends, rather than wait for the coordinator's next update.
      const key = addrKey(targets)
      if (targets.length === 0 || this.dialingAddrs.get(peer) === key) return inFlight
      let next = this.followUps.get(peer)
      if (!next) {
        next = inFlight.then(() => {
          this.followUps.delete(peer)
          return this.dialPeer(peer, this.knownAddrs.get(peer) ?? [])
        })
        this.followUps.set(peer, next)
      }
      return next
    }
    if (this.stopped) return Promise.resolve()
    if (this.hasOpenConnection(peer)) {
      this.dialFailures.delete(peer)
      return Promise.resolve()
    }
    // An overlay dial waits its turn; the peer may have dialled us meanwhile.
    const now = () => (this.stopped || this.hasOpenConnection(peer) ? Promise.resolve() : this.dialPeerNow(peer, targets, retry))
    const dial = (overlay ? this.inTurn(now) : this.dialPeerNow(peer, targets, retry)).finally(() => {
      this.dialing.delete(peer)
      this.dialingAddrs.delete(peer)
    })
    this.dialing.set(peer, dial)
    this.dialingAddrs.set(peer, addrKey(targets))
    return dial
  }

  private async dialPeerNow(peer: string, targets: Multiaddr[], retry = false): Promise<void> {
    const directKey = targets
      .filter((t) => !isCircuit(t))
      .map((t) => t.toString())
      .join(' ')
    const networks = this.networks()
    const otherKey = addrKey(targets.filter((t) => isOtherPrivateNetwork(t, networks)))
    const attempts = dialPlan(targets, {
      directFailed: this.directFailed.get(peer) === directKey,
      networks,
      otherNetworkFailed: retry && this.otherNetworkFailed.get(peer) === otherKey,
    })
    // Nothing left to try on a retry: the failure stands as it was.
    if (attempts.length === 0 && retry) return
    if (attempts.length > 0 && attempts.every((a) => a.addrs.every((t) => isOtherPrivateNetwork(t, networks)))) {
      // Only another LAN's addresses (see RELAYED_ADDRESS_GRACE_MS): new addresses from the coordinator end the wait,
      // and the dial queued behind this one (dialPeer) uses them.
      const key = addrKey(targets)
      const changed = () => addrKey(this.knownAddrs.get(peer) ?? []) !== key
      const until = Date.now() + RELAYED_ADDRESS_GRACE_MS
      while (Date.now() < until && !this.stopped && !changed()) await new Promise((r) => setTimeout(r, 100))
      if (changed() || this.stopped) return
    }
    const reasons: string[] = []
    // As libp2p.dial: user dials go first in the dial queue.
    const open = (addrs: Multiaddr[], timeoutMs: number) => this.components.connectionManager.openConnection(addrs, {priority: 75, signal: deadline(timeoutMs)})
    for (const {addrs, timeoutMs, kind, marksDirectFailed, otherNetwork} of attempts) {
      const isDirect = kind !== 'relayed'
      const started = Date.now()
      if (isDirect) this.directDialStarted.set(peer, started)
      try {
        const connection = await open(addrs, timeoutMs)
        this.dialFailures.delete(peer)
        if (isDirect) this.watchRefusal(peer, connection)
        return
      } catch (error) {
        let reason = dialErrorMessage(error)
        // Refused at once: by a lower peer as the duplicate of its own dial (TIE_WINDOW_MS: its connection comes), or,
        // reset over TCP, by a higher peer's limits after accepting (see watchRefusal). Once more.
        if (isDirect && Date.now() - started < TIE_WINDOW_MS && !this.stopped && (this.peerId > peer || /ECONNRESET/.test(reason))) {
          if (await this.connectionAfterRefusal(peer)) {
            this.dialFailures.delete(peer)
            return
          }
          try {
            await open(addrs, timeoutMs)
            this.dialFailures.delete(peer)
            return
          } catch (again) {
            reason = dialErrorMessage(again)
          }
        }
        reasons.push(`${kind === 'quic' ? 'direct QUIC' : kind}: ${reason}`)
        // Only when the last direct attempt before the relayed one failed too (QUIC failing while TCP works is a
        // network that blocks UDP).
        if (marksDirectFailed) this.directFailed.set(peer, directKey)
        if (otherNetwork) this.otherNetworkFailed.set(peer, otherKey)
      } finally {
        if (isDirect && this.directDialStarted.get(peer) === started) this.directDialStarted.delete(peer)
      }
    }
    // Dials cut short by our own stop are no failures of the peer's.
    if (this.stopped) return
    const reason = reasons.join('; ') || 'no address'
    this.dialFailures.set(peer, {peer_id: peer, addrs: targets.map((t) => t.toString()), reason, at: Date.now()})
    this.log({event: 'dial_failed', peer_id: peer, addrs: targets.map((t) => t.toString()), reason})
  }

  /**
   * A dialled connection the far side closes at once was refused, not made: its connection gater or its limits
   * refuse after the handshake (over QUIC; TCP after noise), when our dial has already resolved. Two peers dialling
   * each other at once are refused that way by the tie rule (TIE_WINDOW_MS), and when the lower peer's own dial was
   * refused by the higher one's limits, neither dialled again: the pair stayed apart until the next state push. So
   * the higher peer waits for the lower one's connection and dials once more if none came; the lower one dials once
   * more after REFUSED_REDIAL_MS. Once per peer until a connection of ours stays open: a peer that refuses us for good
   * is not dialled in a loop.
   */
  private watchRefusal(peer: string, connection: Connection): void {
    const refused = () => {
      if (this.stopped || this.redialedAfterRefusal.has(peer)) return
      this.redialedAfterRefusal.add(peer)
      void this.redialAfterRefusal(peer)
    }
    if (connection.status !== 'open') return refused()
    const onClose = () => {
      clearTimeout(timer)
      if (Date.now() - connection.timeline.open < TIE_WINDOW_MS) refused()
    }
    const timer = setTimeout(() => {
      connection.removeEventListener('close', onClose)
      if (connection.status === 'open') this.redialedAfterRefusal.delete(peer)
    }, TIE_WINDOW_MS)
    timer.unref()
    connection.addEventListener('close', onClose, {once: true})
  }

  private async redialAfterRefusal(peer: string): Promise<void> {
    if ((await this.connectionAfterRefusal(peer)) || this.stopped || this.hasOpenConnection(peer)) return
    await this.dialPeer(peer, this.knownAddrs.get(peer) ?? [])
  }

  /**
   * After our dial to `peer` was refused: the higher peer waits for the lower one's connection (the tie rule), the
   * lower one waits REFUSED_REDIAL_MS (the higher one's limits). True when a connection to the peer is open then.
   */
  private async connectionAfterRefusal(peer: string): Promise<boolean> {
    if (this.peerId > peer) return this.connectionComes(peer, TIE_WINDOW_MS + 1_000)
    await new Promise((r) => setTimeout(r, REFUSED_REDIAL_MS).unref())
    return this.hasOpenConnection(peer)
  }

  private hasOpenConnection(peer: string): boolean {
    return this.components.connectionManager.getConnections().some((c) => c.remotePeer.toString() === peer && c.status === 'open')
  }

  /** Waits up to `ms` for an open connection to `peer` (the one it dials to us); true when one is there. */
  private async connectionComes(peer: string, ms: number): Promise<boolean> {
    const until = Date.now() + ms
    for (;;) {
      if (this.hasOpenConnection(peer)) return true
      if (Date.now() >= until || this.stopped) return false
      await new Promise((r) => setTimeout(r, 100))
    }
  }

  /**
   * The connection gater's half of the one-connection-per-pair rule (TIE_WINDOW_MS): true (refuse) for a direct
   * inbound connection from a higher peer id while we hold an open direct connection we dialled to it that opened, or
   * started a direct dial to it, less than TIE_WINDOW_MS ago; an older such connection of ours is returned, for the
   * gater to refuse only if it still answers. Relayed connections are never refused here.
   */
  refuseDuplicate(peer: PeerId, maConn: MultiaddrConnection): boolean | Connection {
    const id = peer.toString()
    if (isCircuit(maConn.remoteAddr) || !(this.peerId < id)) return false
    const now = Date.now()
    const started = this.directDialStarted.get(id)
    if (started !== undefined && now - started < TIE_WINDOW_MS) return true
    const ours = this.components.connectionManager.getConnections(peer).filter((c) => c.status === 'open' && c.direction === 'outbound' && !isCircuit(c.remoteAddr))
    if (ours.some((c) => now - c.timeline.open < TIE_WINDOW_MS)) return true
    // Ours is older than the tie window, and a higher peer that had it would not dial: it restarted, or the connection
    // died unseen (QUIC learns of it at its idle timeout). The gater refuses only if ours still answers (liveness.ts).
    return ours[0] ?? false
  }

  /**
   * Dials a peer again after its dead connections were closed (liveness.ts): where it was just seen (`hint`), then
   * the addresses the coordinator gave for it.
   */
  redial(peer: string, hint: Multiaddr[]): void {
    const known = this.knownAddrs.get(peer) ?? []
    const seen = new Set(known.map((a) => a.toString()))
    const withPeer = hint.map((h) => (addrPeerId(h) === undefined ? h.encapsulate(`/p2p/${peer}`) : h)).filter((h) => !seen.has(h.toString()))
    const targets = [...withPeer, ...known]
    if (targets.length > 0 && !this.stopped) void this.dialPeer(peer, targets)
  }

  /**
   * A stream to a peer for one transfer. An open connection is used first, direct before relayed: libp2p's own
   * dial would not reuse a relayed connection (it carries the relay's limits) and would dial the peer again through
   * the relay for every transfer, a new relayed connection each time, which the relay or the peer may refuse.
   * With no open connection, the peer is dialled as connect() does (its addresses from the coordinator: direct
   * briefly, then relayed), and libp2p's own dial (its peer store) is the last resort.
   */
  async openStream(peer: PeerId, protocol: string, signal: AbortSignal): Promise<Stream> {
    const reasons: string[] = []
    const tryOpen = async (): Promise<Stream | undefined> => {
      const open = this.components.connectionManager
        .getConnections(peer)
        .filter((c) => c.status === 'open')
        .sort((a, b) => Number(isCircuit(a.remoteAddr)) - Number(isCircuit(b.remoteAddr)))
      for (const connection of open) {
        try {
          return await connection.newStream(protocol, {signal, ...ON_LIMITED})
        } catch (error) {
          signal.throwIfAborted()
          reasons.push(`${isCircuit(connection.remoteAddr) ? 'relayed' : 'direct'} connection: ${dialErrorMessage(error)}`)
        }
      }
      return undefined
    }
    const existing = await tryOpen()
    if (existing) return existing
    // A transfer with a member outside our overlay opens no connection past the bound (libp2p only prunes after).
    const atBound = this.components.connectionManager.getConnections().length >= this.maxConnections
    if (this.neighbours !== undefined && !this.neighbours.has(peer.toString()) && atBound)
      throw new Error(`${reasons.join('; ')}${reasons.length ? '; ' : ''}not dialled: ${this.maxConnections} connections open already (--p2p-max-connections)`)
    const known = this.knownAddrs.get(peer.toString())
    if (known) {
      await this.dialPeer(peer.toString(), known)
      const dialled = await tryOpen()
      if (dialled) return dialled
    }
    try {
      // As libp2p.dialProtocol.
      return await this.components.connectionManager.openStream(peer, [protocol], {signal, ...ON_LIMITED})
    } catch (error) {
      reasons.push(`dial: ${dialErrorMessage(error)}`)
      throw new Error(reasons.join('; '))
    }
  }

  /** Peers we were told about and could not reach the last time we tried (none: everyone dialled is reachable). */
  unreachablePeers(): DialFailure[] {
    const connected = new Set(this.components.connectionManager.getConnections().map((c) => c.remotePeer.toString()))
    return [...this.dialFailures.values()].filter((f) => !connected.has(f.peer_id))
  }

  /** True when every connection we hold to this peer goes through a relay (no direct one). */
  onlyRelayed(peer: PeerId): boolean {
    const connections = this.components.connectionManager.getConnections(peer)
    return connections.length > 0 && connections.every((c) => isCircuit(c.remoteAddr))
  }

  /** Connections now, by kind: direct (TCP) or relayed (through a circuit relay, limited). */
  connectionKinds(): {direct: number; relayed: number} {
    let direct = 0
    let relayed = 0
    for (const c of this.components.connectionManager.getConnections()) {
      if (isCircuit(c.remoteAddr)) relayed++
      else direct++
    }
    return {direct, relayed}
  }
}

/** One step of dialling a peer: these addresses at once, for at most timeoutMs. */
interface DialAttempt {
  addrs: Multiaddr[]
  timeoutMs: number
  kind: 'quic' | 'direct' | 'relayed'
  /** Its failure means the peer's direct addresses do not answer: next time its relayed ones go first. */
  marksDirectFailed: boolean
  /** Addresses on another LAN (see dialPlan): their failure leaves them out of a retry while they stay the same. */
  otherNetwork: boolean
}

/**
 * In which order a peer's addresses (from the coordinator) are dialled, and for how long. Pure.
 *
 * - Direct addresses before relayed ones: QUIC ones first, briefly (QUIC_DIAL_TIMEOUT_MS: where UDP is blocked the
 *   handshake never answers), then TCP ones (DIRECT_DIAL_TIMEOUT_MS), then the relayed ones.
 * - A direct address in a private range that is none of our networks (isOtherPrivateNetwork: a peer's own LAN,
 *   behind its router) leads nowhere on the internet, and was worth 3 + 8 s of silence before every first contact.
 *   Such addresses are tried only briefly (OTHER_NETWORK_DIAL_TIMEOUT_MS), after the peer's other direct addresses;
 *   and when the peer has a relayed address (it is behind NAT: its relay could not dial it back), after that one.
 *   Its private addresses on one of our networks (both behind the same router) go first as any direct address.
 * - `directFailed`: the peer's direct addresses did not answer last time (and have not changed): relayed first.
 * - `otherNetworkFailed`: its addresses on another LAN did not answer last time (and have not changed), and this is
 *   a retry (PeerDialer.connectMembers): they are left out. The set of addresses dialled is never wider than above.
 */
export function dialPlan(targets: readonly Multiaddr[], options: {directFailed: boolean; networks: readonly string[]; otherNetworkFailed?: boolean}): DialAttempt[] {
  const relayed = targets.filter(isCircuit)
  const direct = targets.filter((t) => !isCircuit(t))
  const far = direct.filter((t) => isOtherPrivateNetwork(t, options.networks))
  const near = direct.filter((t) => !far.includes(t))
  const group = (addrs: Multiaddr[], brief: boolean): DialAttempt[] => {
    const quicAddrs = addrs.filter(isQuicAddr)
    const other = addrs.filter((t) => !isQuicAddr(t))
    const common = {marksDirectFailed: false, otherNetwork: brief}
    return [
      ...(quicAddrs.length > 0 ? [{addrs: quicAddrs, timeoutMs: brief ? OTHER_NETWORK_DIAL_TIMEOUT_MS : QUIC_DIAL_TIMEOUT_MS, kind: 'quic' as const, ...common}] : []),
      ...(other.length > 0 ? [{addrs: other, timeoutMs: brief ? OTHER_NETWORK_DIAL_TIMEOUT_MS : DIRECT_DIAL_TIMEOUT_MS, kind: 'direct' as const, ...common}] : []),
    ]
  }
  const nearAttempts = group(near, false)
  const farAttempts = options.otherNetworkFailed ? [] : group(far, true)
  if (relayed.length > 0 && nearAttempts.length > 0) nearAttempts[nearAttempts.length - 1].marksDirectFailed = true
  const attempts: DialAttempt[] = []
  if (!options.directFailed) attempts.push(...nearAttempts)
  if (relayed.length > 0) attempts.push({addrs: relayed, timeoutMs: RELAYED_DIAL_TIMEOUT_MS, kind: 'relayed', marksDirectFailed: false, otherNetwork: false})
  else if (options.directFailed) attempts.push(...nearAttempts)
  attempts.push(...farAttempts)
  return attempts
}

function addrKey(addrs: Multiaddr[]): string {
  return addrs.map((a) => a.toString()).join(' ')
}

/** The dialer as a libp2p service (`services: {dialer: peerDialer({log})}`). */
export function peerDialer(init: PeerDialerInit): (components: PeerDialerComponents) => PeerDialer {
  return (components) => new PeerDialer(components, init)
}
