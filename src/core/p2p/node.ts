import './polyfill.js'
import {setMaxListeners} from 'node:events'
import {noise} from '@chainsafe/libp2p-noise'
import {yamux} from '@chainsafe/libp2p-yamux'
import {circuitRelayTransport} from '@libp2p/circuit-relay-v2'
import {generateKeyPairFromSeed, publicKeyFromRaw} from '@libp2p/crypto/keys'
import {gossipsub, TopicValidatorResult, type GossipSub, type Message} from '@libp2p/gossipsub'
import {dcutr} from '@libp2p/dcutr'
import {identify} from '@libp2p/identify'
import type {Connection, PeerId, Stream} from '@libp2p/interface'
import {peerIdFromPublicKey, peerIdFromString} from '@libp2p/peer-id'
import {tcp} from '@libp2p/tcp'
import {multiaddr, type Multiaddr} from '@multiformats/multiaddr'
import {createLibp2p, type Libp2p} from 'libp2p'
import {errorMessage, PsycheError} from '../errors.js'
import {identityPrivateSeed} from '../protocol/identity.js'
import {encodeAnnouncement, parseAnnouncement, sha256Hex, signAnnouncement, type ResultAnnouncement, type SigningIdentity} from './announcement.js'
import {CHUNK_BYTES, framed, OverrunError, readChunksInto, readJsonObject, writeChunks, writeJson} from './framing.js'
import {addrPeerId, isCircuit, listenAddrsForPort, publishableAddrs} from './addresses.js'
import {CONFIRMED_TTL_MS, internals} from './internals.js'
import {parseTensorRequest, signManifest, type ModelManifest, type ModelSnapshot} from './model.js'
import {BadPeerError, downloadModel, type ModelPeerTransport} from './model-download.js'
import {DIALBACK_DIAL_TIMEOUT_MS, DIALBACK_PROTOCOL, MAX_DIALBACK_ADDRS, MAX_DIALBACK_REQUEST_BYTES, parseDialbackResponse} from './dialback.js'
import type {EventLog} from '../events.js'

export const RESULT_PROTOCOL = '/psyche/result/1'
export const MODEL_PROTOCOL = '/psyche/model/2'
export const DEFAULT_MAX_BLOB_BYTES = 64 * 1024 * 1024
export const DEFAULT_MAX_MODEL_BYTES = 4 * 1024 * 1024 * 1024
export const DEFAULT_MAX_CONCURRENT_DOWNLOADS = 4
export const DEFAULT_DOWNLOAD_TIMEOUT_MS = 60_000

/** Requests and response headers are small JSON; anything bigger is refused before parsing. */
const MAX_REQUEST_BYTES = 1024
const MAX_BLOB_HEADER_BYTES = 1024
const MAX_MODEL_HEADER_BYTES = 4 * 1024 * 1024
/** A whole model may take minutes to export and send; a model transfer is bounded by this instead of downloadTimeoutMs. */
const MODEL_TRANSFER_TIMEOUT_MS = 600_000

/** A deadline for one transfer. Every chunk read/write listens on it, so Node's 10-listener warning does not apply. */
function deadline(ms: number): AbortSignal {
  const signal = AbortSignal.timeout(ms)
  setMaxListeners(Infinity, signal)
  return signal
}

export function resultsTopic(runId: string): string {
  return `psyche/${runId}/results`
}

/** The libp2p peer id of a coordinator identity (libp2p ed25519 peer ids embed the public key). */
export function peerIdOfClient(clientIdHex: string): PeerId {
  if (!/^[0-9a-f]{64}$/.test(clientIdHex)) throw new PsycheError(`client id ${clientIdHex.slice(0, 80)} is not a 32-byte hex public key`)
  return peerIdFromPublicKey(publicKeyFromRaw(Buffer.from(clientIdHex, 'hex')))
}

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
   * reserve a slot on it (useRelays) and announce our relayed address after the direct ones. DCUtR tries to upgrade
   * relayed connections to direct ones (see the README for why it cannot between two NATed TCP peers).
   */
  relay?: boolean
  /** largest result blob accepted or served; default 64 MiB */
  maxBlobBytes?: number
  /** largest model (all frames) accepted; default 4 GiB */
  maxModelBytes?: number
  /** default 4 */
  maxConcurrentDownloads?: number
  /** per attempt (one holder), for blobs and models; default 60 s */
  downloadTimeoutMs?: number
  log?: EventLog
}

export interface P2PStats {
  bytesSent: number
  bytesReceived: number
  peers: number
  badBlobs: number
  downloadsInFlight: number
  peakDownloadsInFlight: number
  /** Result and model bytes per remote peer (its client id when the peer is a run member's ed25519 key, else its peer id), cumulative. */
  peerBytes: Record<string, {in: number; out: number}>
}

/** Peers counted apart in P2PStats.peerBytes; bytes of any further peer are added up under "other". */
const MAX_COUNTED_PEERS = 256

interface StoredResult {
  step: number
  bytes: Uint8Array
}

/** Counting semaphore: at most `limit` holders at once, the rest wait in FIFO order. */
class Semaphore {
  active = 0
  peak = 0
  private readonly waiting: (() => void)[] = []
  constructor(private readonly limit: number) {}

  async acquire(): Promise<void> {
    if (this.active >= this.limit) await new Promise<void>((resolve) => this.waiting.push(resolve))
    else this.active++
    this.peak = Math.max(this.peak, this.active)
  }

  release(): void {
    const next = this.waiting.shift()
    // The slot passes straight to the next waiter, so `active` is unchanged.
    if (next) next()
    else this.active--
  }
}

type Services = {identify: ReturnType<ReturnType<typeof identify>>; pubsub: GossipSub; dcutr: unknown}

/** A peer we were told about but could not reach, with the addresses we tried (for the no-exchange warning). */
export interface DialFailure {
  peer_id: string
  addrs: string[]
  reason: string
  at: number
}

/** Our protocols also run over relayed connections, which the relay limits in time and bytes (see psyche relay). */
const ON_LIMITED = {runOnLimitedConnection: true} as const
/** A direct dial gives up quickly: a private address of another network may never answer (no ICMP on the internet). */
const DIRECT_DIAL_TIMEOUT_MS = 8_000
const RELAYED_DIAL_TIMEOUT_MS = 30_000
/**
 * A result download that failed with every holder is tried again after these pauses (a relayed connection reset by
 * its relay, a peer whose reservation or addresses are not there yet, a holder that has not downloaded it yet).
 */
const FETCH_BACKOFF_MS = [500, 2_000, 5_000]

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms).unref?.())
}

/**
 * One client's libp2p node: gossips signed result announcements on `psyche/<run_id>/results`, serves and fetches
 * result blobs over /psyche/result/1, and shares the model over /psyche/model/2.
 */
export class P2PNode {
  readonly peerId: string
  readonly runId: string
  readonly topic: string
  /** The underlying libp2p node (tests use it to publish raw gossip; callers should not need it). */
  readonly libp2p: Libp2p<Services>

  private readonly identity: SigningIdentity
  private readonly maxBlobBytes: number
  private readonly maxModelBytes: number
  private readonly downloadTimeoutMs: number
  private readonly log: EventLog
  private readonly downloads: Semaphore
  private readonly results = new Map<string, StoredResult>()
  private readonly fetching = new Map<string, Promise<Uint8Array>>()
  /** signature -> step: an announcement re-published under a new gossip id is delivered once */
  private readonly seenAnnouncements = new Map<string, number>()
  private readonly announcementHandlers: ((a: ResultAnnouncement) => void)[] = []
  private readonly validated = new WeakMap<Message, ResultAnnouncement>()
  private modelProvider?: () => Promise<ModelSnapshot>
  private readonly manifests = new WeakMap<ModelSnapshot, ModelManifest>()
  private bytesSent = 0
  private bytesReceived = 0
  private readonly peerBytes = new Map<string, {in: number; out: number}>()
  private badBlobs = 0
  private stopped = false
  private readonly dialFailures = new Map<string, DialFailure>()
  /** Peers being dialled now (one dial per peer at a time; a second caller waits for the first). */
  private readonly dialing = new Map<string, Promise<void>>()
  /** Peer -> the addresses the coordinator last gave for it. */
  private readonly knownAddrs = new Map<string, Multiaddr[]>()
  /** Peer -> its direct addresses that did not answer (it is dialled through the relay first while they stay the same). */
  private readonly directFailed = new Map<string, string>()
  private readonly addressHandlers: ((addrs: string[]) => void)[] = []
  private lastPublished = ''
  private readonly relayEnabled: boolean
  /** --p2p-announce: exactly these direct addresses are ours. */
  private readonly announced: boolean
  private reachable: 'unknown' | 'public' | 'relayed' = 'unknown'
  private deciding: Promise<void> | undefined

  private constructor(libp2p: Libp2p<Services>, options: P2PNodeOptions) {
    this.libp2p = libp2p
    this.peerId = libp2p.peerId.toString()
    this.identity = options.identity
    this.runId = options.runId
    this.topic = resultsTopic(options.runId)
    this.maxBlobBytes = options.maxBlobBytes ?? DEFAULT_MAX_BLOB_BYTES
    this.maxModelBytes = options.maxModelBytes ?? DEFAULT_MAX_MODEL_BYTES
    this.downloadTimeoutMs = options.downloadTimeoutMs ?? DEFAULT_DOWNLOAD_TIMEOUT_MS
    this.relayEnabled = options.relay ?? true
    this.announced = (options.announce?.length ?? 0) > 0
    this.downloads = new Semaphore(Math.max(1, options.maxConcurrentDownloads ?? DEFAULT_MAX_CONCURRENT_DOWNLOADS))
    const log = options.log
    this.log = (event) => {
      try {
        log?.(event)
      } catch {
        // a throwing logger must not break the network path
      }
    }
  }

  static async start(options: P2PNodeOptions): Promise<P2PNode> {
    // The peer key is the coordinator identity's key, so peer id <-> client id needs no directory.
    const seed = identityPrivateSeed(options.identity)
    const privateKey = await generateKeyPairFromSeed('Ed25519', seed)
    const relay = options.relay ?? true
    // No '/p2p-circuit' here: useRelays reserves a slot only when the relay's dial-back says we are not reachable.
    const listen = [...(options.listen ?? listenAddrsForPort(undefined))]
    const libp2p = await createLibp2p<Services>({
      privateKey,
      addresses: {listen, ...(options.announce?.length ? {announce: options.announce} : {})},
      transports: relay ? [tcp(), circuitRelayTransport({reservationCompletionTimeout: 20_000})] : [tcp()],
      connectionEncrypters: [noise()],
      streamMuxers: [yamux()],
      connectionManager: {dialTimeout: RELAYED_DIAL_TIMEOUT_MS, addressDialTimeout: RELAYED_DIAL_TIMEOUT_MS},
      services: {
        identify: identify(),
        // No AutoNAT (v1): its server closes a connection it was asked to verify when it already had one to the
        // asker (the relay, every peer), and it never checks a private address. The relay's dial-back decides.
        // Upgrades a relayed connection to a direct one by hole punching where both NATs allow it.
        dcutr: dcutr(),
        pubsub: gossipsub({
          // Announcements must also reach peers we only reach through a relay.
          runOnLimitedConnection: true,
          // A run has a handful to a few hundred clients: a small mesh, and the publisher floods its own
          // announcement to every subscribed peer so a 2-4 node network delivers without a formed mesh.
          D: 4,
          Dlo: 2,
          Dhi: 8,
          Dout: 1,
          floodPublish: true,
          allowPublishToZeroTopicPeers: true,
          emitSelf: false,
          fallbackToFloodsub: true,
          // Announcements are < 4 KiB; an RPC may batch many of them plus control ids.
          maxInboundDataLength: 1024 * 1024,
        }),
      },
    })
    const node = new P2PNode(libp2p, options)
    await node.install()
    return node
  }

  private async install(): Promise<void> {
    const pubsub = this.libp2p.services.pubsub
    pubsub.topicValidators.set(this.topic, (propagationSource, message) => this.validateGossip(propagationSource, message))
    pubsub.addEventListener('message', (event) => this.onGossip(event.detail))
    pubsub.subscribe(this.topic)
    await this.libp2p.handle(RESULT_PROTOCOL, (stream, connection) => this.serveResult(stream, connection), {maxInboundStreams: 64, ...ON_LIMITED})
    await this.libp2p.handle(MODEL_PROTOCOL, (stream, connection) => this.serveModelStream(stream, connection), {maxInboundStreams: 4, ...ON_LIMITED})
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
   * (see publishableAddrs), direct ones before relayed ones.
   */
  addresses(): string[] {
    const ours = `/p2p/${this.peerId}`
    // libp2p's announced addresses leave out a public interface address until something confirmed it (see
    // internals.ts); peers are told it anyway, as they are told a private one: they dial direct addresses briefly
    // before relayed ones. With --p2p-announce, only relayed addresses join the announced ones.
    const transport = internals(this.libp2p).transportManager.getAddrs()
    const candidates = [...this.libp2p.getMultiaddrs(), ...(this.announced ? transport.filter(isCircuit) : transport)]
    const unique = new Map<string, Multiaddr>()
    for (const a of candidates) {
      const text = a.toString()
      const key = text.endsWith(ours) ? text.slice(0, -ours.length) : text
      if (!unique.has(key)) unique.set(key, a)
    }
    return publishableAddrs([...unique.values()]).map((a) => (a.endsWith(ours) ? a : `${a}${ours}`))
  }

  /** Every address libp2p knows for us, unfiltered (loopback included): for logs and tests. */
  allAddresses(): string[] {
    return this.libp2p.getMultiaddrs().map((a) => a.toString())
  }

  /** Called with our new publishable addresses whenever they change (new observed address, relay reservation). */
  onAddressesChanged(handler: (addrs: string[]) => void): void {
    this.addressHandlers.push(handler)
  }

  /**
   * Connects to relays (multiaddrs ending in /p2p/<relay id>) and decides whether we need one (see dialback.ts):
   * the first relay we reach dials our direct addresses back. If one answers, we are reachable and reserve nothing
   * ({event: 'reachability', reachable: true}); if none does (behind NAT), or the relay cannot tell, we reserve a
   * slot on it, and our relayed address joins the published ones (onAddressesChanged). Called again after a
   * reconnect: a held reservation or a reachable verdict is kept.
   */
  async useRelays(addrs: string[]): Promise<void> {
    await this.connect(addrs)
    if (!this.relayEnabled || this.stopped) return
    this.deciding ??= this.decideReachability(addrs).finally(() => (this.deciding = undefined))
    await this.deciding
  }

  /** 'public': a relay reached us at a direct address; 'relayed': we hold (or asked for) a reservation. */
  reachability(): 'unknown' | 'public' | 'relayed' {
    return this.reachable
  }

  private async decideReachability(relayAddrs: string[]): Promise<void> {
    if (this.reachable !== 'unknown') return
    for (const addr of relayAddrs) {
      let relayAddr: Multiaddr
      try {
        relayAddr = multiaddr(addr)
      } catch {
        continue
      }
      const relayPeer = addrPeerId(relayAddr)
      if (relayPeer === undefined || isCircuit(relayAddr)) continue
      const connection = this.libp2p.getConnections(peerIdFromString(relayPeer)).find((c) => c.status === 'open' && !isCircuit(c.remoteAddr))
      if (!connection) continue
      const asked = this.addresses().filter((a) => !isCircuit(multiaddr(a)))
      let verdict: {reachable: string[]; checked: string[]} | undefined
      let reason = ''
      try {
        verdict = await this.askDialback(connection, asked)
      } catch (error) {
        reason = `the relay could not check (${errorMessage(error)})`
      }
      if (verdict && verdict.reachable.length > 0) {
        this.reachable = 'public'
        // Confirmed: libp2p now announces them too (identify, DCUtR's unilateral upgrade).
        const {addressManager} = internals(this.libp2p)
        for (const a of verdict.reachable) addressManager.confirmObservedAddr(multiaddr(a).decapsulateCode(421), {type: 'transport', ttl: CONFIRMED_TTL_MS})
        this.log({event: 'reachability', reachable: true, via: relayPeer, addrs: verdict.reachable})
        return
      }
      this.log({
        event: 'reachability',
        reachable: false,
        via: relayPeer,
        reason: reason || (verdict!.checked.length === 0 ? 'no direct address on the IP our connection comes from (behind NAT)' : 'no direct address answered'),
      })
      try {
        await this.components().transportManager.listen([relayAddr.encapsulate('/p2p-circuit')])
        this.reachable = 'relayed'
        return
      } catch (error) {
        this.log({event: 'reservation_failed', relay: addr, reason: errorMessage(error)})
      }
    }
  }

  private async askDialback(connection: Connection, addrs: string[]): Promise<{reachable: string[]; checked: string[]}> {
    const signal = deadline(4 * DIALBACK_DIAL_TIMEOUT_MS)
    const stream = await connection.newStream(DIALBACK_PROTOCOL, {signal})
    try {
      const lp = framed(stream, MAX_DIALBACK_REQUEST_BYTES)
      await writeJson(lp, {addrs: addrs.slice(0, MAX_DIALBACK_ADDRS)}, {signal})
      const response = await readJsonObject(lp, 'dial-back response', {signal})
      if (response.status !== 'ok') throw new Error(`refused: ${String(response.reason ?? response.status).slice(0, 200)}`)
      await stream.close({signal}).catch(() => {})
      return parseDialbackResponse(response, addrs)
    } catch (error) {
      stream.abort(error instanceof Error ? error : new Error(String(error)))
      throw error
    }
  }

  /** libp2p's internal components (the transport manager listens on a relay once we know we need one). */
  private components(): {transportManager: {listen(addrs: Multiaddr[]): Promise<void>}} {
    return internals(this.libp2p)
  }

  /** Our relayed addresses (held reservations), for logs and tests. */
  relayedAddresses(): string[] {
    return this.libp2p
      .getMultiaddrs()
      .filter(isCircuit)
      .map((a) => a.toString())
  }

  /**
   * Dials peers learned from the coordinator: every address of one peer is tried by libp2p in turn (direct before
   * relayed). Skips self and peers we are connected to; a failed dial is logged and remembered (dialFailures),
   * and may be retried by a later call.
   */
  async connect(addrs: string[]): Promise<void> {
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
    await Promise.all([...byPeer].map(([peer, targets]) => this.dialPeer(peer, targets)))
  }

  /**
   * One peer: its direct addresses first (briefly: a private address of someone else's network may never answer),
   * then its relayed ones. A peer whose direct addresses failed is dialled through the relay first next time.
   * One dial per peer at a time: state pushes arrive faster than dials to unreachable addresses time out.
   */
  private dialPeer(peer: string, targets: Multiaddr[]): Promise<void> {
    if (targets.length > 0) this.knownAddrs.set(peer, targets)
    const inFlight = this.dialing.get(peer)
    if (inFlight) return inFlight
    if (this.stopped) return Promise.resolve()
    if (this.libp2p.getConnections().some((c) => c.remotePeer.toString() === peer && c.status === 'open')) {
      this.dialFailures.delete(peer)
      return Promise.resolve()
    }
    const dial = this.dialPeerNow(peer, targets).finally(() => this.dialing.delete(peer))
    this.dialing.set(peer, dial)
    return dial
  }

  private async dialPeerNow(peer: string, targets: Multiaddr[]): Promise<void> {
    const direct = targets.filter((t) => !isCircuit(t))
    const relayed = targets.filter(isCircuit)
    const directKey = direct.map((t) => t.toString()).join(' ')
    const attempts: [Multiaddr[], number][] = []
    if (direct.length > 0 && this.directFailed.get(peer) !== directKey) attempts.push([direct, DIRECT_DIAL_TIMEOUT_MS])
    if (relayed.length > 0) attempts.push([relayed, RELAYED_DIAL_TIMEOUT_MS])
    if (attempts.length === 0 && direct.length > 0) attempts.push([direct, DIRECT_DIAL_TIMEOUT_MS])
    const reasons: string[] = []
    for (const [addrs, timeoutMs] of attempts) {
      try {
        await this.libp2p.dial(addrs, {signal: AbortSignal.timeout(timeoutMs)})
        this.dialFailures.delete(peer)
        return
      } catch (error) {
        reasons.push(`${isCircuit(addrs[0]) ? 'relayed' : 'direct'}: ${dialErrorMessage(error)}`)
        if (addrs === direct && relayed.length > 0) this.directFailed.set(peer, directKey)
      }
    }
    const reason = reasons.join('; ') || 'no address'
    this.dialFailures.set(peer, {peer_id: peer, addrs: targets.map((t) => t.toString()), reason, at: Date.now()})
    this.log({event: 'dial_failed', peer_id: peer, addrs: targets.map((t) => t.toString()), reason})
  }

  /**
   * A stream to a peer for one transfer. An open connection is used first, direct before relayed: libp2p's own
   * dial would not reuse a relayed connection (it carries the relay's limits) and would dial the peer again through
   * the relay for every transfer, a new relayed connection each time, which the relay or the peer may refuse.
   * With no open connection, the peer is dialled as connect() does (its addresses from the coordinator: direct
   * briefly, then relayed), and libp2p's own dial (its peer store) is the last resort.
   */
  private async openStream(peer: PeerId, protocol: string, signal: AbortSignal): Promise<Stream> {
    const reasons: string[] = []
    const tryOpen = async (): Promise<Stream | undefined> => {
      const open = this.libp2p
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
    const known = this.knownAddrs.get(peer.toString())
    if (known) {
      await this.dialPeer(peer.toString(), known)
      const dialled = await tryOpen()
      if (dialled) return dialled
    }
    try {
      return await this.libp2p.dialProtocol(peer, protocol, {signal, ...ON_LIMITED})
    } catch (error) {
      reasons.push(`dial: ${dialErrorMessage(error)}`)
      throw new Error(reasons.join('; '))
    }
  }

  /** Peers we were told about and could not reach the last time we tried (none: everyone dialled is reachable). */
  unreachablePeers(): DialFailure[] {
    const connected = new Set(this.libp2p.getConnections().map((c) => c.remotePeer.toString()))
    return [...this.dialFailures.values()].filter((f) => !connected.has(f.peer_id))
  }

  /** Of these clients, the ones we have no connection to, or that do not subscribe to our run's results yet. */
  notConnected(clientIds: string[]): string[] {
    const subscribers = new Set(this.libp2p.services.pubsub.getSubscribers(this.topic).map((p) => p.toString()))
    return clientIds.filter((id) => {
      let peer: string
      try {
        peer = peerIdOfClient(id).toString()
      } catch {
        return true
      }
      return peer !== this.peerId && (this.libp2p.getConnections(peerIdOfClient(id)).length === 0 || !subscribers.has(peer))
    })
  }

  /** True when every connection we hold to this peer goes through a relay (no direct one). */
  onlyRelayed(peer: PeerId): boolean {
    const connections = this.libp2p.getConnections(peer)
    return connections.length > 0 && connections.every((c) => isCircuit(c.remoteAddr))
  }

  /** Connections now, by kind: direct (TCP) or relayed (through a circuit relay, limited). */
  connectionKinds(): {direct: number; relayed: number} {
    let direct = 0
    let relayed = 0
    for (const c of this.libp2p.getConnections()) {
      if (isCircuit(c.remoteAddr)) relayed++
      else direct++
    }
    return {direct, relayed}
  }

  /** Stores the blob for serving and gossips its signed announcement. */
  async publishResult(step: number, batchStart: number, batchEnd: number, blob: Uint8Array): Promise<ResultAnnouncement> {
    if (blob.length > this.maxBlobBytes) throw new PsycheError(`result is ${blob.length} bytes, more than the ${this.maxBlobBytes}-byte maximum blob size`)
    const announcement = signAnnouncement(this.identity, {
      run_id: this.runId,
      step,
      client_id: this.identity.id,
      batch_start: batchStart,
      batch_end: batchEnd,
      commitment: sha256Hex(blob),
      size: blob.length,
    })
    this.results.set(announcement.commitment, {step, bytes: blob})
    this.seenAnnouncements.set(announcement.signature, step)
    await this.libp2p.services.pubsub.publish(this.topic, encodeAnnouncement(announcement))
    return announcement
  }

  /**
   * Gossips an announcement again (e.g. one of ours after new peers connected: gossip is not replayed to late
   * joiners). Receivers deliver each signed announcement once, so repeating is harmless.
   */
  async reannounce(a: ResultAnnouncement): Promise<void> {
    await this.libp2p.services.pubsub.publish(this.topic, encodeAnnouncement(a))
  }

  /** How many peers are known to subscribe to this run's results topic (announcements reach only them). */
  topicPeers(): number {
    return this.libp2p.services.pubsub.getSubscribers(this.topic).length
  }

  /** Handlers see only announcements for this run whose signature verifies against their client_id (never our own). */
  onAnnouncement(handler: (a: ResultAnnouncement) => void): void {
    this.announcementHandlers.push(handler)
  }

  /** Gossipsub validator: a rejected message is neither delivered nor forwarded, and its sender's score drops. */
  private validateGossip(propagationSource: PeerId, message: Message): TopicValidatorResult {
    const parsed = parseAnnouncement(message.data, this.runId)
    if (!parsed.ok) {
      this.log({
        event: 'announcement_rejected',
        reason: parsed.reason,
        from: message.type === 'signed' ? message.from.toString() : undefined,
        via: propagationSource.toString(),
      })
      return TopicValidatorResult.Reject
    }
    this.validated.set(message, parsed.announcement)
    return TopicValidatorResult.Accept
  }

  private onGossip(message: Message): void {
    if (message.topic !== this.topic) return
    let announcement = this.validated.get(message)
    if (announcement === undefined) {
      const parsed = parseAnnouncement(message.data, this.runId)
      if (!parsed.ok) return
      announcement = parsed.announcement
    }
    if (this.seenAnnouncements.has(announcement.signature)) return
    this.seenAnnouncements.set(announcement.signature, announcement.step)
    for (const handler of this.announcementHandlers) {
      try {
        handler(announcement)
      } catch (error) {
        this.log({event: 'announcement_handler_failed', reason: errorMessage(error)})
      }
    }
  }

  hasResult(commitment: string): boolean {
    return this.results.has(commitment)
  }

  getResult(commitment: string): Uint8Array | undefined {
    return this.results.get(commitment)?.bytes
  }

  /** Forgets results (and seen announcements) of earlier steps, so memory stays bounded. */
  dropResultsBefore(step: number): void {
    for (const [commitment, stored] of this.results) if (stored.step < step) this.results.delete(commitment)
    for (const [signature, seenStep] of this.seenAnnouncements) if (seenStep < step) this.seenAnnouncements.delete(signature)
  }

  /**
   * Test hook: serve `bytes` under `commitment` whatever they hash to (a dishonest peer). Never use outside tests.
   */
  serveUncheckedForTesting(commitment: string, step: number, bytes: Uint8Array): void {
    this.results.set(commitment, {step, bytes})
  }

  /**
   * Downloads an announced result: from the producer first, then from any other connected peer (every node re-serves
   * what it downloaded). Bytes that do not hash to the commitment are discarded and their sender reported
   * ({event: 'bad_blob'}); throws when no holder supplied the right bytes.
   */
  async fetchResult(a: ResultAnnouncement): Promise<Uint8Array> {
    const local = this.results.get(a.commitment)
    if (local) return local.bytes
    // Concurrent requests for the same result share one download.
    const key = `${a.commitment}:${a.size}`
    let pending = this.fetching.get(key)
    if (pending === undefined) {
      pending = this.fetchResultOnce(a).finally(() => this.fetching.delete(key))
      this.fetching.set(key, pending)
    }
    return pending
  }

  private async fetchResultOnce(a: ResultAnnouncement): Promise<Uint8Array> {
    if (a.run_id !== this.runId) throw new PsycheError(`announcement is for run ${a.run_id}, not ${this.runId}`)
    if (a.size > this.maxBlobBytes) {
      this.log({event: 'blob_refused', client_id: a.client_id, commitment: a.commitment, reason: `announced size ${a.size} exceeds max ${this.maxBlobBytes}`})
      throw new PsycheError(`result ${a.commitment.slice(0, 16)}… from ${a.client_id.slice(0, 16)}… is ${a.size} bytes, more than the ${this.maxBlobBytes}-byte maximum`)
    }
    const producer = peerIdOfClient(a.client_id)
    const failures: string[] = []
    /** Holders that sent wrong bytes are not asked again. */
    const bad = new Set<string>()
    for (let pass = 0; pass < FETCH_BACKOFF_MS.length + 1; pass++) {
      // The pause holds no download slot.
      if (pass > 0) await sleep(FETCH_BACKOFF_MS[pass - 1])
      await this.downloads.acquire()
      try {
        // Every run member re-serves what it downloaded; other peers (a relay) hold nothing of ours. Asked again
        // each pass: a peer that connected or subscribed since may hold it now.
        const holders = [producer, ...this.libp2p.services.pubsub.getSubscribers(this.topic).filter((p) => !p.equals(producer))].filter((h) => !bad.has(h.toString()))
        for (const holder of holders) {
          if (this.stopped) throw new PsycheError('p2p node stopped')
          try {
            const bytes = await this.downloadFrom(holder, a)
            const hash = sha256Hex(bytes)
            if (hash !== a.commitment) {
              this.badBlobs++
              bad.add(holder.toString())
              this.log({event: 'bad_blob', from: holder.toString(), client_id: a.client_id, commitment: a.commitment, reason: `bytes hash to ${hash}, not the commitment`})
              failures.push(`${holder.toString()}: bytes do not match the commitment`)
              continue
            }
            this.results.set(a.commitment, {step: a.step, bytes})
            if (pass > 0) this.log({event: 'fetch_retried', from: holder.toString(), client_id: a.client_id, step: a.step, pass})
            return bytes
          } catch (error) {
            const reason = dialErrorMessage(error)
            if (error instanceof BadSenderError) {
              this.badBlobs++
              bad.add(holder.toString())
              this.log({event: 'bad_blob', from: holder.toString(), client_id: a.client_id, commitment: a.commitment, reason})
            } else {
              this.log({event: 'fetch_failed', from: holder.toString(), client_id: a.client_id, commitment: a.commitment, step: a.step, pass, reason})
            }
            failures.push(`${holder.toString()}: ${reason}`)
          }
        }
        // Someone else downloaded it meanwhile (concurrent fetchResult calls share one download; publishResult, tests).
        const local = this.results.get(a.commitment)
        if (local) return local.bytes
        // Every holder sent wrong bytes: asking again would not help.
        if (holders.every((h) => bad.has(h.toString()))) break
      } finally {
        this.downloads.release()
      }
    }
    throw new PsycheError(`could not fetch result ${a.commitment.slice(0, 16)}… of client ${a.client_id.slice(0, 16)}… (step ${a.step}): ${failures.join('; ') || 'no peers'}`)
  }

  private async downloadFrom(holder: PeerId, a: ResultAnnouncement): Promise<Uint8Array> {
    const signal = deadline(this.downloadTimeoutMs)
    const stream = await this.openStream(holder, RESULT_PROTOCOL, signal)
    try {
      const lp = framed(stream, Math.max(MAX_BLOB_HEADER_BYTES, CHUNK_BYTES))
      await writeJson(lp, {run_id: this.runId, commitment: a.commitment}, {signal})
      const header = await readJsonObject(lp, 'result response header', {signal})
      if (header.status === 'not_found') throw new Error('does not hold it')
      if (header.status !== 'ok') throw new Error(`refused: ${String(header.reason ?? header.status).slice(0, 200)}`)
      if (header.size !== a.size) throw new BadSenderError(`declared ${String(header.size).slice(0, 20)} bytes, announcement says ${a.size}`)
      const bytes = new Uint8Array(a.size)
      try {
        await readChunksInto(lp, bytes, 0, a.size, {signal})
      } catch (error) {
        if (error instanceof OverrunError) throw new BadSenderError(error.message)
        throw error
      }
      this.bytesReceived += a.size
      this.countPeerBytes(holder, 'in', a.size)
      await stream.close({signal}).catch(() => {})
      return bytes
    } catch (error) {
      stream.abort(error instanceof Error ? error : new Error(String(error)))
      throw error
    }
  }

  private async serveResult(stream: Stream, connection: Connection): Promise<void> {
    const signal = deadline(this.downloadTimeoutMs)
    try {
      const lp = framed(stream, MAX_REQUEST_BYTES)
      const request = await readJsonObject(lp, 'result request', {signal})
      const commitment = typeof request.commitment === 'string' ? request.commitment : ''
      const stored = request.run_id === this.runId ? this.results.get(commitment) : undefined
      if (request.run_id !== this.runId) {
        await writeJson(lp, {status: 'error', reason: 'wrong run'}, {signal})
      } else if (stored === undefined) {
        await writeJson(lp, {status: 'not_found'}, {signal})
      } else {
        await writeJson(lp, {status: 'ok', size: stored.bytes.length}, {signal})
        await writeChunks(lp, stored.bytes, {signal})
        this.bytesSent += stored.bytes.length
        this.countPeerBytes(connection.remotePeer, 'out', stored.bytes.length)
      }
      await stream.close({signal})
    } catch (error) {
      this.log({event: 'serve_failed', protocol: RESULT_PROTOCOL, to: connection.remotePeer.toString(), reason: errorMessage(error)})
      stream.abort(error instanceof Error ? error : new Error(String(error)))
    }
  }

  /**
   * Answers /psyche/model/2 requests from the provider's current parameters (a joining client's source): the signed
   * manifest of the model (cached per snapshot), or the bytes of some of its tensors.
   */
  serveModel(provider: () => Promise<ModelSnapshot>): void {
    this.modelProvider = provider
  }

  private async serveModelStream(stream: Stream, connection: Connection): Promise<void> {
    const signal = deadline(Math.max(this.downloadTimeoutMs, MODEL_TRANSFER_TIMEOUT_MS))
    // Exporting a large model from the worker may leave the stream idle longer than libp2p's 2-minute default.
    stream.inactivityTimeout = MODEL_TRANSFER_TIMEOUT_MS
    try {
      const lp = framed(stream, MAX_REQUEST_BYTES)
      const request = await readJsonObject(lp, 'model request', {signal})
      if (request.run_id !== this.runId) {
        await writeJson(lp, {status: 'error', reason: 'wrong run'}, {signal})
      } else if (this.modelProvider === undefined) {
        await writeJson(lp, {status: 'not_available'}, {signal})
      } else if (request.kind === 'manifest') {
        const model = await this.modelProvider()
        let manifest = this.manifests.get(model)
        if (!manifest) this.manifests.set(model, (manifest = signManifest(this.identity, this.runId, model)))
        await writeJson(lp, {status: 'ok', manifest}, {signal})
      } else if (request.kind === 'tensors') {
        const {step, indices} = parseTensorRequest(request)
        const model = await this.modelProvider()
        if (step !== model.step) await writeJson(lp, {status: 'stale', step: model.step}, {signal})
        else if (indices.some((i) => i >= model.frames.length)) await writeJson(lp, {status: 'error', reason: 'no such tensor'}, {signal})
        else {
          await writeJson(lp, {status: 'ok'}, {signal})
          for (const i of indices) {
            await writeChunks(lp, model.frames[i].data, {signal})
            this.bytesSent += model.frames[i].data.length
            this.countPeerBytes(connection.remotePeer, 'out', model.frames[i].data.length)
          }
        }
      } else {
        await writeJson(lp, {status: 'error', reason: 'unknown request kind'}, {signal})
      }
      await stream.close({signal})
    } catch (error) {
      this.log({event: 'serve_failed', protocol: MODEL_PROTOCOL, to: connection.remotePeer.toString(), reason: errorMessage(error)})
      stream.abort(error instanceof Error ? error : new Error(String(error)))
    }
  }

  /**
   * Downloads the model from these clients (see downloadModel): signed manifests from all, the tensors of the
   * manifest a majority of them signed spread over its signers, every tensor checked against its sha256. With
   * `step`, only peers whose model is at that step count. The caller's worker checks paramHash after importing.
   */
  async fetchModel(fromClientIds: string[], options: {step?: number} = {}): Promise<ModelSnapshot> {
    const started = performance.now()
    const got = await downloadModel(this.modelTransport(), {
      runId: this.runId,
      peers: fromClientIds,
      selfId: this.identity.id,
      step: options.step,
      maxModelBytes: this.maxModelBytes,
      attemptTimeoutMs: this.downloadTimeoutMs,
      log: (e) => this.log(e),
    })
    const sources = Object.entries(got.bytesFrom).filter(([, b]) => b > 0)
    const relayed = sources.some(([id]) => this.onlyRelayed(peerIdOfClient(id)))
    this.log({
      event: 'model_fetched',
      from: sources.map(([id]) => peerIdOfClient(id).toString()),
      step: got.snapshot.step,
      bytes: got.totalBytes,
      peers: sources.length,
      attesters: got.attesters.length,
      dropped: got.dropped.length,
      root: got.root,
      ms: Math.round(performance.now() - started),
      relayed,
    })
    return got.snapshot
  }

  private modelTransport(): ModelPeerTransport {
    return {
      manifest: (clientId, signal) => this.modelRequest(clientId, {kind: 'manifest'}, signal, async (_lp, header) => header.manifest),
      tensors: (clientId, step, tensors, signal) =>
        this.modelRequest(clientId, {kind: 'tensors', step, indices: tensors.map((t) => t.index)}, signal, async (lp) => {
          const total = tensors.reduce((s, t) => s + t.size, 0)
          const data = new Uint8Array(total)
          const out: Uint8Array[] = []
          let offset = 0
          for (const t of tensors) {
            await readChunksInto(lp, data, offset, t.size, {signal})
            out.push(data.subarray(offset, offset + t.size))
            offset += t.size
          }
          this.bytesReceived += total
          this.countPeerBytes(clientId, 'in', total)
          return out
        }),
    }
  }

  private async modelRequest<T>(
    clientId: string,
    request: Record<string, unknown>,
    signal: AbortSignal,
    read: (lp: ReturnType<typeof framed>, header: Record<string, unknown>) => Promise<T>,
  ): Promise<T> {
    setMaxListeners(Infinity, signal)
    const stream = await this.openStream(peerIdOfClient(clientId), MODEL_PROTOCOL, signal)
    stream.inactivityTimeout = MODEL_TRANSFER_TIMEOUT_MS
    try {
      const lp = framed(stream, Math.max(MAX_MODEL_HEADER_BYTES, CHUNK_BYTES))
      await writeJson(lp, {run_id: this.runId, ...request}, {signal})
      const header = await readJsonObject(lp, 'model response', {signal})
      if (header.status !== 'ok') throw new Error(`refused: ${String(header.reason ?? header.status).slice(0, 200)}`)
      const out = await read(lp, header)
      await stream.close({signal}).catch(() => {})
      return out
    } catch (error) {
      stream.abort(error instanceof Error ? error : new Error(String(error)))
      throw error instanceof OverrunError ? new BadPeerError(error.message) : error
    }
  }

  /** The counter hook of P2PStats.peerBytes: `bytes` exchanged with `peer` in `direction`. */
  private countPeerBytes(peer: PeerId | string, direction: 'in' | 'out', bytes: number): void {
    const raw = typeof peer !== 'string' && peer.type === 'Ed25519' ? peer.publicKey.raw : undefined
    let key = typeof peer === 'string' ? peer : raw ? Buffer.from(raw).toString('hex') : peer.toString()
    if (!this.peerBytes.has(key) && this.peerBytes.size >= MAX_COUNTED_PEERS) key = 'other'
    let b = this.peerBytes.get(key)
    if (!b) this.peerBytes.set(key, (b = {in: 0, out: 0}))
    b[direction] += bytes
  }

  stats(): P2PStats {
    return {
      bytesSent: this.bytesSent,
      bytesReceived: this.bytesReceived,
      peers: this.libp2p.getPeers().length,
      badBlobs: this.badBlobs,
      downloadsInFlight: this.downloads.active,
      peakDownloadsInFlight: this.downloads.peak,
      peerBytes: Object.fromEntries([...this.peerBytes].map(([k, v]) => [k, {...v}])),
    }
  }

  async stop(): Promise<void> {
    if (this.stopped) return
    this.stopped = true
    await this.libp2p.stop()
  }
}

/** An error's message, with the reasons inside an AggregateError (libp2p's "All multiaddr dials failed"). */
function dialErrorMessage(error: unknown): string {
  const message = errorMessage(error)
  if (error instanceof AggregateError && error.errors.length > 0) return `${message} (${error.errors.map((e) => errorMessage(e)).join('; ')})`
  return message
}

/** The sender broke the protocol in a way that is its fault (lied about sizes): reported like a bad blob. */
class BadSenderError extends Error {}
