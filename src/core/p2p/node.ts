import './polyfill.js'
import {noise} from '@chainsafe/libp2p-noise'
import {circuitRelayTransport} from '@libp2p/circuit-relay-v2'
import {generateKeyPairFromSeed} from '@libp2p/crypto/keys'
import {gossipsub, type GossipSub} from '@libp2p/gossipsub'
import {identify} from '@libp2p/identify'
import type {PeerId} from '@libp2p/interface'
import {createLibp2p, type Libp2p} from 'libp2p'
import {errorMessage} from '../errors.js'
import {identityPrivateSeed} from '../primitives/identity.js'
import type {ResultAnnouncement, SigningIdentity} from '../primitives/announcement.js'
import {listenAddrsForPort} from './addresses.js'
import {peerDialer, RELAYED_DIAL_TIMEOUT_MS, type DialFailure, type PeerDialer} from './dialer.js'
import {liveness, type Liveness} from './liveness.js'
import {safeYamux} from './muxer.js'
import {DEFAULT_MAX_MODEL_BYTES, modelExchange, type ModelExchange, type ModelServeLimits, type ModelServeStats} from './model-exchange.js'
import type {ModelSnapshot} from './model.js'
import {DEFAULT_MAX_PEER_CONNECTIONS} from './overlay.js'
import {peerIdOfClient} from './peer-id.js'
import {holePunch, type HolePunch} from './punch.js'
import {reachability, type Reachability, type ReachabilityState} from './reachability.js'
import {
  DEFAULT_DOWNLOAD_TIMEOUT_MS,
  DEFAULT_MAX_BLOB_BYTES,
  DEFAULT_MAX_CONCURRENT_DOWNLOADS,
  resultExchange,
  ResultStore,
  type ResultExchange,
  type ServingLimits,
} from './result-exchange.js'
import {traffic, type Traffic} from './traffic.js'
import {defaultTransports, withQuicListen, type TransportFactory} from './transports.js'
import {directUpgrade, type DirectUpgrade} from './upgrade.js'
import {webRtc, type WebRtc, type WebRtcLimits} from './webrtc.js'
import {safeLog} from './util.js'
import {WireMetrics, type WireCounts} from './wire-metrics.js'
import type {EventLog} from '../events.js'

export {RESULT_PROTOCOL, ResultStore} from './result-exchange.js'

/** The IP a node listening on loopback only listens on (WebRTC then binds there too); undefined otherwise. */
function loopbackBind(listen: readonly string[]): string | undefined {
  const hosts = listen.map((a) => /^\/ip[46]\/([^/]+)\//.exec(a)?.[1])
  if (hosts.length === 0 || hosts.some((h) => h === undefined || !(h.startsWith('127.') || h === '::1'))) return undefined
  return hosts[0]
}

export {peerIdOfClient} from './peer-id.js'

export interface P2PNodeOptions {
  identity: SigningIdentity
  runId: string
  /** multiaddrs to listen on; default ['/ip4/0.0.0.0/tcp/0'] (every IPv4 interface, any free port) */
  listen?: string[]
  /**
   * Tell peers exactly these addresses (a public address, a forwarded port) instead of the interface and observed
   * addresses (a relayed address is still added when we hold a reservation).
   */
  announce?: string[]
  /**
   * Circuit relay v2 (default true): dial relayed addresses; when the relay's dial-back finds us unreachable,
   * reserve a slot on it (useRelays) and announce our relayed address after the direct ones.
   */
  relay?: boolean
  /**
   * TCP hole punching (punch.ts, default true with `relay`): a relayed connection between two peers with no direct
   * one is upgraded to a direct TCP connection where both NATs allow it.
   */
  holePunch?: boolean
  /** How long both sides of a punch keep dialling each other; default 5 s (tests shorten it). */
  punchWindowMs?: number
  /**
   * WebRTC (webrtc.ts, default true with `relay`): two peers that meet through a relay connect directly over UDP
   * (ICE hole punching, a STUN server telling each its NAT mapping), tried before TCP punching (upgrade.ts).
   */
  webrtc?: boolean
  /** STUN servers (host:port) beside the relays' own, for WebRTC (join --stun); no public one is ever used. */
  stun?: string[]
  /** Bounds on WebRTC connections, the ICE candidates and data-channel messages a peer sends (see WebRtcLimits). */
  webrtcLimits?: Partial<WebRtcLimits>
  /** largest result blob accepted or served; default 64 MiB */
  maxBlobBytes?: number
  /** largest model (all frames) accepted; default 4 GiB */
  maxModelBytes?: number
  /** what this node serves joiners at once (model-exchange.ts ModelServeLimits; join --max-model-uploads*) */
  modelServeLimits?: Partial<ModelServeLimits>
  /** default 4 */
  maxConcurrentDownloads?: number
  /** per attempt (one holder), for blobs and models; default 60 s */
  downloadTimeoutMs?: number
  /**
   * Pauses before each retry pass when every holder of a result failed; default [500, 2000, 5000] ms (tests shorten
   * them). One pass more than pauses is made.
   */
  fetchBackoffMs?: readonly number[]
  /**
   * libp2p's connection limits, its defaults when absent: open connections (300; a client connects to every member
   * of its run), inbound connections per second from one host (5) and inbound handshakes at once (10). The scale
   * bench raises the last two: all its nodes are on 127.0.0.1.
   */
  connectionManager?: {maxConnections?: number; inboundConnectionThreshold?: number; maxIncomingPendingConnections?: number}
  /**
   * The bound on this client's connections (join --p2p-max-connections; default 32): libp2p's maxConnections unless
   * connectionManager gives one, and past half of it the run's members are not all dialled (overlay.ts: about
   * 2·log2 N neighbours; transfers with the others open connections on demand, closed after idleCloseMs).
   */
  maxPeerConnections?: number
  /** A connection to a member outside the overlay with no transfer for this long is closed; default 10 s. */
  idleCloseMs?: number
  /** Serving bounds: each own result to at most this many peers, transfers per peer and in all (see DEFAULT_SERVING_LIMITS). */
  serving?: Partial<ServingLimits>
  log?: EventLog
  /**
   * The transports to dial and listen with; default defaultTransports() (TCP). The circuit relay transport is added
   * when `relay` is on. Tests give a memory transport.
   */
  transports?: TransportFactory[]
  /**
   * QUIC beside TCP (default true, with the default transports): listen on a UDP QUIC address beside each TCP one,
   * announce both, and dial a peer's QUIC addresses first (briefly), then its TCP ones. False: TCP only, for
   * networks that block UDP (where QUIC dials fail fast and TCP is used anyway).
   */
  quic?: boolean
  /** Where results are kept and served from; default an empty ResultStore (tests give one holding bytes of their choosing). */
  resultStore?: ResultStore
  /**
   * Count bytes per connection and per protocol, and gossipsub's message and control counters (wireCounts()):
   * for measurements (bench/scale.bench.ts); default off.
   */
  wireMetrics?: boolean
}

interface P2PStats {
  bytesSent: number
  bytesReceived: number
  peers: number
  badBlobs: number
  /** Requests we answered 'busy' (serving bounds), the most peers one of our results was served to, connections closed idle. */
  servesRefused: number
  /** Holdings peers told us of that we did not keep (join --max-haves-per-peer and the table's bounds). */
  havesIgnored: number
  /** Pieces of swarmed results fetched, and pieces that did not match their hash (each blamed on its sender). */
  piecesFetched: number
  badPieces: number
  maxUploadsOfOwnResult: number
  idleClosed: number
  downloadsInFlight: number
  peakDownloadsInFlight: number
  /** Result and model bytes per remote peer (its client id when the peer is a run member's ed25519 key, else its peer id), cumulative. */
  peerBytes: Record<string, {in: number; out: number}>
  /** Of bytesSent/bytesReceived and peerBytes, what went over relayed connections. */
  relayedSent: number
  relayedReceived: number
  peerRelayedBytes: Record<string, {in: number; out: number}>
}

/** The services of a client node, in the order they are created (each may use those before it). */
type Services = {
  identify: ReturnType<ReturnType<typeof identify>>
  pubsub: GossipSub
  punch: HolePunch
  webrtc: WebRtc
  upgrade: DirectUpgrade
  traffic: Traffic
  resultStore: ResultStore
  dialer: PeerDialer
  liveness: Liveness
  reachability: Reachability
  results: ResultExchange
  models: ModelExchange
}

/**
 * One client's libp2p node: gossips signed result announcements on `psyche/<run_id>/results`, serves and fetches
 * result blobs over /psyche/result/1, and shares the model over /psyche/model/2. The work is done by libp2p services
 * (dialer.ts, reachability.ts, result-exchange.ts, model-exchange.ts); this class puts them together and is the
 * P2P port the client uses.
 */
export class P2PNode {
  readonly peerId: string
  readonly runId: string
  readonly topic: string
  /** The underlying libp2p node (tests use it to publish raw gossip; callers should not need it). */
  readonly libp2p: Libp2p<Services>

  private readonly log: EventLog
  private stopped = false
  private readonly addressHandlers: ((addrs: string[]) => void)[] = []
  private lastPublished = ''
  private readonly wire: WireMetrics | undefined

  private constructor(libp2p: Libp2p<Services>, runId: string, log: EventLog, wire: WireMetrics | undefined) {
    this.libp2p = libp2p
    this.wire = wire
    this.peerId = libp2p.peerId.toString()
    this.runId = runId
    this.topic = libp2p.services.results.topic
    this.log = log
  }

  static async start(options: P2PNodeOptions): Promise<P2PNode> {
    // The peer key is the coordinator identity's key, so peer id <-> client id needs no directory.
    const seed = identityPrivateSeed(options.identity)
    const privateKey = await generateKeyPairFromSeed('Ed25519', seed)
    const relay = options.relay ?? true
    const log = safeLog(options.log)
    const downloadTimeoutMs = options.downloadTimeoutMs ?? DEFAULT_DOWNLOAD_TIMEOUT_MS
    const {identity, runId} = options
    // No '/p2p-circuit' here: the reachability service reserves a slot only when the relay's dial-back says we are not reachable.
    const quicOn = options.transports === undefined && options.quic !== false
    const baseListen = options.listen ?? listenAddrsForPort(undefined)
    const listen = quicOn ? withQuicListen(baseListen) : [...baseListen]
    const transports = [...(options.transports ?? defaultTransports({quic: quicOn})), ...(relay ? [circuitRelayTransport({reservationCompletionTimeout: 20_000})] : [])]
    const resultStore = options.resultStore ?? new ResultStore()
    const wire = options.wireMetrics ? new WireMetrics() : undefined
    const maxPeerConnections = options.maxPeerConnections ?? DEFAULT_MAX_PEER_CONNECTIONS
    // The dialer and the liveness check are services, made after the gater: the gater asks them once they exist (see
    // PeerDialer.refuseDuplicate).
    let dialer: PeerDialer | undefined
    let alive: Liveness | undefined
    const libp2p = await createLibp2p<Services>({
      privateKey,
      addresses: {listen, ...(options.announce?.length ? {announce: options.announce} : {})},
      transports,
      connectionEncrypters: [noise()],
      streamMuxers: [safeYamux((error) => log({event: 'muxer_abort_failed', reason: errorMessage(error)}))],
      ...(wire ? {metrics: wire.component} : {}),
      connectionGater: {
        denyInboundEncryptedConnection: async (peer, maConn) => {
          const duplicate = dialer?.refuseDuplicate(peer, maConn) ?? false
          return typeof duplicate === 'boolean' ? duplicate : ((await alive?.alive(duplicate)) ?? false)
        },
      },
      connectionManager: {dialTimeout: RELAYED_DIAL_TIMEOUT_MS, addressDialTimeout: RELAYED_DIAL_TIMEOUT_MS, maxConnections: maxPeerConnections, ...options.connectionManager},
      services: {
        identify: identify(),
        // No AutoNAT (v1): its server closes a connection it was asked to verify when it already had one to the
        // asker (the relay, every peer), and it never checks a private address. The relay's dial-back decides.
        // A relayed connection between two NATed peers becomes a direct one: WebRTC (UDP, ICE) first, then TCP hole
        // punching (punch.ts; @libp2p/dcutr cannot), as upgrade.ts orders them.
        punch: holePunch({log, enabled: relay && (options.holePunch ?? true), windowMs: options.punchWindowMs}),
        webrtc: webRtc({log, enabled: relay && (options.webrtc ?? true), stun: options.stun, limits: options.webrtcLimits, bindAddress: loopbackBind(baseListen)}),
        upgrade: directUpgrade({log, order: ['webrtc', 'punch']}),
        pubsub: gossipsub({
          // Announcements must also reach peers we only reach through a relay.
          runOnLimitedConnection: true,
          // A run has a handful to a few hundred clients: a small mesh, and the publisher floods its own
          // announcement to every subscribed peer so a 2-4 node network delivers without a formed mesh.
          D: 4,
          Dlo: 2,
          Dhi: 8,
          Dout: 1,
          // Gossip (IHAVE: the ids of the last 3 heartbeats' messages) goes to Dlazy peers outside the mesh per
          // heartbeat, never to a share of them: with gossipsub's default (a quarter of the non-mesh peers) every
          // client sent every announcement's id to ~N/4 peers, so IHAVE ids per client per round grew as N²
          // (bench/README.md, "Scale"). Every member is connected to every other and gets each announcement from
          // its publisher (floodPublish) and its mesh, so a few gossip targets are enough to repair a loss.
          Dlazy: 3,
          gossipFactor: 0,
          floodPublish: true,
          allowPublishToZeroTopicPeers: true,
          emitSelf: false,
          fallbackToFloodsub: true,
          // Announcements are < 4 KiB; an RPC may batch many of them plus control ids.
          maxInboundDataLength: 1024 * 1024,
          // No IP-colocation penalty: past 10 peers on one address (clients behind one NAT, on one host, or reached
          // through the same relay) gossipsub's scoring graylisted them and dropped their subscriptions, so with 16
          // clients on one machine no announcement spread (bench/README.md, "Scale"). Who may take part is the
          // coordinator's member list; every announcement is signed and checked.
          scoreParams: {IPColocationFactorWeight: 0},
          ...(wire ? {metricsRegister: wire.gossipsubRegister, metricsTopicStrToLabel: new Map()} : {}),
        }),
        traffic: traffic(),
        resultStore: () => resultStore,
        dialer: peerDialer({log, maxConnections: maxPeerConnections, idleCloseMs: options.idleCloseMs}),
        // A peer that restarted (same key) while we still held its old connection: the dead one is found and cut.
        liveness: liveness({log, reconnect: (peer, hint) => dialer?.redial(peer, hint)}),
        reachability: reachability({relay, announced: (options.announce?.length ?? 0) > 0, log}),
        results: resultExchange({
          identity,
          runId,
          maxBlobBytes: options.maxBlobBytes ?? DEFAULT_MAX_BLOB_BYTES,
          maxConcurrentDownloads: options.maxConcurrentDownloads ?? DEFAULT_MAX_CONCURRENT_DOWNLOADS,
          downloadTimeoutMs,
          ...(options.fetchBackoffMs ? {fetchBackoffMs: options.fetchBackoffMs} : {}),
          serving: options.serving,
          log,
        }),
        models: modelExchange({identity, runId, maxModelBytes: options.maxModelBytes ?? DEFAULT_MAX_MODEL_BYTES, downloadTimeoutMs, serveLimits: options.modelServeLimits, log}),
      },
    })
    dialer = libp2p.services.dialer
    alive = libp2p.services.liveness
    const node = new P2PNode(libp2p, runId, log, wire)
    node.watchAddresses()
    return node
  }

  private watchAddresses(): void {
    // Our addresses change as identify learns observed ones and as relay reservations come and go.
    this.libp2p.addEventListener('self:peer:update', () => {
      const addrs = this.addresses()
      const key = addrs.join(' ')
      if (key === this.lastPublished) return
      this.lastPublished = key
      this.log({event: 'addresses_changed', addrs})
      for (const handler of this.addressHandlers) {
        try {
          handler(addrs)
        } catch (error) {
          this.log({event: 'address_handler_failed', reason: errorMessage(error)})
        }
      }
    })
    this.lastPublished = this.addresses().join(' ')
  }

  /**
   * Multiaddrs to publish to the coordinator, each ending in /p2p/<peerId>: only addresses a remote peer can use
   * (see publishableAddrs), direct ones before relayed ones (see Reachability.addresses).
   */
  addresses(): string[] {
    return this.libp2p.services.reachability.addresses()
  }

  /** Every address libp2p knows for us, unfiltered (loopback included): for logs and tests. */
  allAddresses(): string[] {
    return this.libp2p.getMultiaddrs().map((a) => a.toString())
  }

  /** Called with our new publishable addresses whenever they change (new observed address, relay reservation). */
  onAddressesChanged(handler: (addrs: string[]) => void): void {
    this.addressHandlers.push(handler)
  }

  /** See Reachability.useRelays: connect to relays, and reserve a slot on one if it cannot dial us back. */
  useRelays(addrs: string[]): Promise<void> {
    return this.libp2p.services.reachability.useRelays(addrs)
  }

  /** 'public': a relay reached us at a direct address; 'relayed': we hold (or asked for) a reservation. */
  reachability(): ReachabilityState {
    return this.libp2p.services.reachability.reachability()
  }

  /** Our relayed addresses (held reservations), for logs and tests. */
  relayedAddresses(): string[] {
    return this.libp2p.services.reachability.relayedAddresses()
  }

  /**
   * Dial the run's members learned from the coordinator (every member's addresses): all of them in a small run, our
   * overlay neighbours in a large one (see PeerDialer.connectMembers).
   */
  connect(addrs: string[], options: {retry?: boolean} = {}): Promise<void> {
    return this.libp2p.services.dialer.connectMembers(addrs, options)
  }

  /** Peers we were told about and could not reach the last time we tried (none: everyone dialled is reachable). */
  unreachablePeers(): DialFailure[] {
    return this.libp2p.services.dialer.unreachablePeers()
  }

  /**
   * Of these clients, the ones we dial (all, or our overlay neighbours: see connect) that we have no connection to,
   * or that do not subscribe to our run's results yet.
   */
  notConnected(clientIds: string[]): string[] {
    const subscribers = new Set(this.libp2p.services.results.topicSubscribers().map((p) => p.toString()))
    const dialed = this.libp2p.services.dialer.dialedMembers()
    return clientIds.filter((id) => {
      let peer: string
      try {
        peer = peerIdOfClient(id).toString()
      } catch {
        return true
      }
      if (dialed !== undefined && !dialed.has(peer)) return false
      return peer !== this.peerId && (this.libp2p.getConnections(peerIdOfClient(id)).length === 0 || !subscribers.has(peer))
    })
  }

  /** True when every connection we hold to this peer goes through a relay (no direct one). */
  onlyRelayed(peer: PeerId): boolean {
    return this.libp2p.services.dialer.onlyRelayed(peer)
  }

  /** Connections now, by kind: direct (TCP) or relayed (through a circuit relay, limited). */
  connectionKinds(): {direct: number; relayed: number} {
    return this.libp2p.services.dialer.connectionKinds()
  }

  /** Stores the blob for serving and gossips its signed announcement. */
  publishResult(step: number, batchStart: number, batchEnd: number, blob: Uint8Array): Promise<ResultAnnouncement> {
    return this.libp2p.services.results.publishResult(step, batchStart, batchEnd, blob)
  }

  /** Gossips an announcement again (see ResultExchange.reannounce). */
  reannounce(a: ResultAnnouncement): Promise<void> {
    return this.libp2p.services.results.reannounce(a)
  }

  /** How many peers are known to subscribe to this run's results topic (announcements reach only them). */
  topicPeers(): number {
    return this.libp2p.services.results.topicSubscribers().length
  }

  /** Handlers see only announcements for this run whose signature verifies against their client_id (never our own). */
  onAnnouncement(handler: (a: ResultAnnouncement) => void): void {
    this.libp2p.services.results.onAnnouncement(handler)
  }

  hasResult(commitment: string): boolean {
    return this.libp2p.services.results.hasResult(commitment)
  }

  getResult(commitment: string): Uint8Array | undefined {
    return this.libp2p.services.results.getResult(commitment)
  }

  /** Forgets results (and seen announcements) of earlier steps, so memory stays bounded. */
  dropResultsBefore(step: number): void {
    this.libp2p.services.results.dropResultsBefore(step)
  }

  /** See ResultExchange.fetchResult: download an announced result, checked against its commitment. */
  fetchResult(a: ResultAnnouncement): Promise<Uint8Array> {
    return this.libp2p.services.results.fetchResult(a)
  }

  /** See ModelExchange.serveModel: answer model requests from the provider's current parameters. */
  serveModel(provider: () => Promise<ModelSnapshot>): void {
    this.libp2p.services.models.serveModel(provider)
  }

  /** See ModelExchange.serveStats: model pieces served to joiners, refused as busy, and the most at once. */
  modelServeStats(): ModelServeStats {
    return this.libp2p.services.models.serveStats()
  }

  /** See ModelExchange.fetchModel: download the model from these clients, checked tensor by tensor. */
  fetchModel(fromClientIds: string[], options: {step?: number; paramHash?: string} = {}): Promise<ModelSnapshot> {
    return this.libp2p.services.models.fetchModel(fromClientIds, options)
  }

  stats(): P2PStats {
    const {traffic, results} = this.libp2p.services
    return {
      bytesSent: traffic.bytesSent,
      bytesReceived: traffic.bytesReceived,
      peers: this.libp2p.getPeers().length,
      badBlobs: results.badBlobs,
      servesRefused: results.servesRefused,
      havesIgnored: results.havesIgnored,
      piecesFetched: results.piecesFetched,
      badPieces: results.badPieces,
      maxUploadsOfOwnResult: results.maxUploadsOfOwnResult(),
      idleClosed: this.libp2p.services.dialer.idleClosed,
      downloadsInFlight: results.downloads.active,
      peakDownloadsInFlight: results.downloads.peak,
      peerBytes: traffic.peerBytes(),
      relayedSent: traffic.relayedSent,
      relayedReceived: traffic.relayedReceived,
      peerRelayedBytes: traffic.peerRelayedBytes(),
    }
  }

  /** Bytes per connection and protocol, and gossipsub's counters, when started with `wireMetrics`. */
  wireCounts(): WireCounts | undefined {
    return this.wire?.counts()
  }

  async stop(): Promise<void> {
    if (this.stopped) return
    this.stopped = true
    await this.libp2p.stop()
  }
}
