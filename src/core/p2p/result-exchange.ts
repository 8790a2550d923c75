import {TopicValidatorResult, type GossipSub, type Message} from '@libp2p/gossipsub'
import type {Connection, PeerId, Startable, Stream} from '@libp2p/interface'
import {peerIdFromString} from '@libp2p/peer-id'
import type {Registrar} from '@libp2p/interface-internal'
import {errorMessage, PsycheError} from '../errors.js'
import {encodeAnnouncement, MAX_ANNOUNCEMENT_BYTES, parseAnnouncement, signAnnouncement, type ResultAnnouncement, type SigningIdentity} from '../primitives/announcement.js'
import type {PeerDialer} from './dialer.js'
import {BLOCK_BYTES, blockHashes, DEFAULT_PIECE_BYTES, MAX_PIECE_BYTES, resultCommitment, validPieceBytes} from '../primitives/pieces.js'
import {BadSourceError, blockListBytes, MAX_SOURCES_PER_FETCH, PIECES_IN_FLIGHT_PER_PEER, PieceDownload, servePieces, WirePieceSession, type PieceSource} from './piece-fetch.js'
import {CHUNK_BYTES, framed, OverrunError, readChunksInto, readJsonObject, writeChunks, writeJson} from './framing.js'
import {isCircuit} from './addresses.js'
import {encodeHave, HAVE_PROTOCOL, havePrefix, MAX_HAVE_MESSAGE_BYTES, MAX_HAVES_PER_MESSAGE, parseHave} from './have.js'
import {peerIdOfClient} from './peer-id.js'
import type {Traffic} from './traffic.js'
import {abortStream, deadline, dialErrorMessage, ON_LIMITED, Semaphore, sleep} from './util.js'
import type {EventLog} from '../events.js'

export const RESULT_PROTOCOL = '/psyche/result/1'
/** One signed announcement sent to one peer (re-announcing to peers that subscribed after it was gossiped). */
export const ANNOUNCE_PROTOCOL = '/psyche/announce/1'
const ANNOUNCE_TIMEOUT_MS = 10_000
export const DEFAULT_MAX_BLOB_BYTES = 64 * 1024 * 1024
export const DEFAULT_MAX_CONCURRENT_DOWNLOADS = 4
export const DEFAULT_DOWNLOAD_TIMEOUT_MS = 60_000
/**
 * Serving bounds (join --max-serves-per-result, --max-serves-per-peer, --max-concurrent-serves, --swarm-min-bytes):
 * our own result of at least swarmMinBytes goes to at most maxServesPerResult peers (the others get it from those,
 * swarmed: a producer's uplink carries each result a bounded number of times); a smaller one goes to every peer that
 * asks (swarming it would cost more in messages and retries than it saves in uplink); at most this many transfers to
 * one peer at once, and in all. A request past them is answered 'busy' and asked elsewhere or again.
 */
export const DEFAULT_SERVING_LIMITS: ServingLimits = {
  maxServesPerResult: 4,
  maxServesPerPeer: 2,
  maxConcurrentServes: 16,
  swarmMinBytes: 256 * 1024,
  maxHavesPerPeer: 4096,
  pieceBytes: DEFAULT_PIECE_BYTES,
}
/** Holders told us nothing yet, or were busy: asked again after this long (until downloadTimeoutMs has passed). */
const SWARM_RETRY_MS = 250
/**
 * A producer we hold no connection to (not one of our overlay neighbours: dialer.ts) is dialled only after this long
 * without the result from the peers we are connected to: its neighbours fetch it from it and tell theirs, so the
 * result spreads along the overlay, and a producer does not get a connection from every member of a large run.
 */
const PRODUCER_DIAL_GRACE_MS = 5_000
/** New holdings are told to peers in batches, this often. */
const HAVE_FLUSH_MS = 50
/**
 * A fetcher connected to the producer of a swarmed result that is not among the first maxServesPerResult in line for
 * it (see inLine) waits this long for holders to tell it they have it before asking the producer, which would
 * likely answer 'busy'.
 */
const HOLDER_WAIT_MS = 2_000
/** At most this many (result, holders) entries are kept from have messages; more are ignored until steps are dropped. */
const MAX_HAVE_ENTRIES = 65_536
/** At most this many holders kept per result. */
const MAX_HOLDERS_PER_RESULT = 64
const HAVE_TIMEOUT_MS = 5_000

export interface ServingLimits {
  maxServesPerResult: number
  maxServesPerPeer: number
  maxConcurrentServes: number
  /** Results smaller than this are served to every peer that asks (see DEFAULT_SERVING_LIMITS). */
  swarmMinBytes: number
  /**
   * Results one peer may tell us it holds that we keep (have messages, until their step is dropped): a stranger
   * announcing made-up results, or results of a far-future step, fills its own share, not the whole table.
   */
  maxHavesPerPeer: number
  /**
   * Results of swarmMinBytes or more are fetched in pieces of this many bytes (join --piece-bytes; whole blocks of the
   * hash list, primitives/pieces.ts) from several holders at once (piece-fetch.ts).
   */
  pieceBytes: number
}

/** Requests and response headers are small JSON; anything bigger is refused before parsing. */
const MAX_REQUEST_BYTES = 1024
const MAX_BLOB_HEADER_BYTES = 1024
/**
 * A result download that failed with every holder is tried again after these pauses (a relayed connection reset by
 * its relay, a peer whose reservation or addresses are not there yet, a holder that has not downloaded it yet).
 */
const DEFAULT_FETCH_BACKOFF_MS: readonly number[] = [500, 2_000, 5_000]

function resultsTopic(runId: string): string {
  return `psyche/${runId}/results`
}

/**
 * The result blobs a node holds and serves (its own and those it downloaded), by commitment. Whatever is put here
 * is served as is: the exchange puts only blobs whose hash it checked. A libp2p component (`resultStore`), so a
 * test can give a node one that holds bytes of its choosing (a dishonest peer).
 */
export class ResultStore {
  private readonly results = new Map<string, {step: number; bytes: Uint8Array; hashes?: Uint8Array}>()

  get(commitment: string): Uint8Array | undefined {
    return this.results.get(commitment)?.bytes
  }

  has(commitment: string): boolean {
    return this.results.has(commitment)
  }

  /** `hashes`: its hash list (primitives/pieces.ts), when known. */
  put(commitment: string, step: number, bytes: Uint8Array, hashes?: Uint8Array): void {
    this.results.set(commitment, {step, bytes, hashes})
  }

  /** A stored result's hash list (computed once, when first asked for). */
  hashList(commitment: string): Uint8Array | undefined {
    const stored = this.results.get(commitment)
    if (stored === undefined) return undefined
    stored.hashes ??= blockHashes(stored.bytes)
    return stored.hashes
  }

  /** Forgets results of steps before `step`. */
  dropBefore(step: number): void {
    for (const [commitment, stored] of this.results) if (stored.step < step) this.results.delete(commitment)
  }
}

interface ResultExchangeInit {
  identity: SigningIdentity
  runId: string
  /** largest result blob accepted or served */
  maxBlobBytes: number
  maxConcurrentDownloads: number
  /** per attempt (one holder) */
  downloadTimeoutMs: number
  /** pauses before each retry pass over the holders; default DEFAULT_FETCH_BACKOFF_MS */
  fetchBackoffMs?: readonly number[]
  serving?: Partial<ServingLimits>
  log: EventLog
}

interface ResultExchangeComponents {
  peerId: PeerId
  registrar: Registrar
  pubsub: GossipSub
  dialer: PeerDialer
  traffic: Traffic
  resultStore: ResultStore
}

/**
 * Result exchange: gossips signed result announcements on `psyche/<run_id>/results`, and serves and fetches the
 * result blobs over /psyche/result/1. A libp2p service: see `resultExchange()`.
 */
export class ResultExchange implements Startable {
  readonly topic: string
  badBlobs = 0
  readonly downloads: Semaphore
  private readonly runId: string
  private readonly log: EventLog
  private readonly fetching = new Map<string, Promise<Uint8Array>>()
  /** signature -> step: an announcement re-published under a new gossip id is delivered once */
  private readonly seenAnnouncements = new Map<string, number>()
  private readonly announcementHandlers: ((a: ResultAnnouncement) => void)[] = []
  private readonly validated = new WeakMap<Message, ResultAnnouncement>()
  /** Our own announcements (by signature): their step, and the peers they were gossiped or sent to. */
  private readonly announcedTo = new Map<string, {step: number; peers: Set<string>}>()
  private stopped = false
  private readonly serving: ServingLimits
  /** Our own results: their step, and the peers they were served to (at most maxServesPerResult). */
  private readonly own = new Map<string, {step: number; servedTo: Set<string>}>()
  /** Transfers we are serving now, per peer and in all. */
  private readonly servingTo = new Map<string, number>()
  private servingNow = 0
  /** Commitment prefix -> the peers that told us they hold it (have.ts), and its step. */
  private readonly holders = new Map<string, {step: number; peers: Set<string>}>()
  /** Results we got that our peers have not been told of yet, by step. */
  private readonly pendingHaves = new Map<number, {commitment: string; producer: string}[]>()
  private haveTimer: ReturnType<typeof setTimeout> | undefined
  private flushingHaves = false
  /** Our long-lived have stream to each peer (one per peer, reopened when it breaks). */
  private readonly haveStreams = new Map<string, {stream: Stream; lp: ReturnType<typeof framed>}>()
  /** Per peer id, a hash of it (inLine). */
  private readonly peerRank = new Map<string, number>()
  /** Steps before this one were dropped: have messages for them are ignored. */
  private firstStep = 0
  /** Per peer id, the holders entries that name it (bounded by maxHavesPerPeer). */
  private readonly havesOf = new Map<string, number>()
  /** Requests answered 'busy' (a serving bound), have messages refused as malformed, and holdings past a bound. */
  servesRefused = 0
  badHaves = 0
  havesIgnored = 0
  /** Pieces fetched (swarmed results, piece-fetch.ts), and pieces that did not match their hash (blamed on their sender). */
  piecesFetched = 0
  badPieces = 0

  constructor(
    private readonly components: ResultExchangeComponents,
    private readonly init: ResultExchangeInit,
  ) {
    this.runId = init.runId
    this.topic = resultsTopic(init.runId)
    this.log = init.log
    this.downloads = new Semaphore(Math.max(1, init.maxConcurrentDownloads))
    this.serving = {...DEFAULT_SERVING_LIMITS, ...init.serving}
    if (!validPieceBytes(this.serving.pieceBytes))
      throw new PsycheError(`piece size ${this.serving.pieceBytes} is not a multiple of ${BLOCK_BYTES} bytes up to ${MAX_PIECE_BYTES} (--piece-bytes)`)
  }

  async start(): Promise<void> {
    this.stopped = false
    const pubsub = this.components.pubsub
    pubsub.topicValidators.set(this.topic, (propagationSource, message) => this.validateGossip(propagationSource, message))
    pubsub.addEventListener('message', (event) => this.onGossip(event.detail))
    await this.components.registrar.handle(RESULT_PROTOCOL, (stream, connection) => this.serve(stream, connection), {maxInboundStreams: 64, ...ON_LIMITED})
    await this.components.registrar.handle(ANNOUNCE_PROTOCOL, (stream, connection) => this.receiveAnnouncement(stream, connection), {
      maxInboundStreams: 8,
      ...ON_LIMITED,
    })
    // One long-lived stream per peer, and one more while a broken one is replaced.
    await this.components.registrar.handle(HAVE_PROTOCOL, (stream, connection) => this.receiveHave(stream, connection), {maxInboundStreams: 2, ...ON_LIMITED})
  }

  /** Gossipsub accepts subscriptions once it has started. */
  afterStart(): void {
    this.components.pubsub.subscribe(this.topic)
  }

  beforeStop(): void {
    this.stopped = true
  }

  async stop(): Promise<void> {
    this.stopped = true
    await this.components.registrar.unhandle(RESULT_PROTOCOL)
    await this.components.registrar.unhandle(ANNOUNCE_PROTOCOL)
    await this.components.registrar.unhandle(HAVE_PROTOCOL)
    clearTimeout(this.haveTimer)
    for (const {stream} of this.haveStreams.values()) abortStream(stream, new Error('p2p node stopped'))
    this.haveStreams.clear()
  }

  private get results(): ResultStore {
    return this.components.resultStore
  }

  /** Stores the blob for serving and gossips its signed announcement. */
  async publishResult(step: number, batchStart: number, batchEnd: number, blob: Uint8Array): Promise<ResultAnnouncement> {
    if (blob.length > this.init.maxBlobBytes) throw new PsycheError(`result is ${blob.length} bytes, more than the ${this.init.maxBlobBytes}-byte maximum blob size`)
    const announcement = signAnnouncement(this.init.identity, {
      run_id: this.runId,
      step,
      client_id: this.init.identity.id,
      batch_start: batchStart,
      batch_end: batchEnd,
      commitment: resultCommitment(blob),
      size: blob.length,
    })
    this.results.put(announcement.commitment, step, blob)
    this.own.set(announcement.commitment, {step, servedTo: new Set()})
    this.seenAnnouncements.set(announcement.signature, step)
    const sent = {step, peers: new Set<string>()}
    this.announcedTo.set(announcement.signature, sent)
    // floodPublish: gossipsub sends it to every subscribed peer it has a stream to; those are its recipients.
    const {recipients} = await this.components.pubsub.publish(this.topic, encodeAnnouncement(announcement))
    for (const p of recipients) sent.peers.add(p.toString())
    // A subscribed peer gossipsub had no stream to (it was moving from a relayed connection that closed to a direct
    // one, upgrade.ts) gets the announcement over its own stream, as a late joiner does.
    if (this.topicSubscribers().some((p) => !sent.peers.has(p.toString())))
      void this.reannounce(announcement).catch((error) => this.log({event: 'reannounce_failed', message: errorMessage(error)}))
    return announcement
  }

  /**
   * Sends an announcement to the subscribed peers that have not had it from us (gossip is not replayed to late
   * joiners), each over its own /psyche/announce/1 stream: a peer joining costs each member one message to it, where
   * gossiping again would send it to every member (N² messages for N joiners). Throws when some peer could not be
   * reached (they are tried again at the next call). Receivers deliver each signed announcement once.
   */
  async reannounce(a: ResultAnnouncement): Promise<void> {
    let sent = this.announcedTo.get(a.signature)
    if (!sent) this.announcedTo.set(a.signature, (sent = {step: a.step, peers: new Set()}))
    const peers = sent.peers
    const failures: string[] = []
    await Promise.all(
      this.topicSubscribers()
        .filter((p) => !peers.has(p.toString()))
        .map(async (peer) => {
          try {
            await this.sendAnnouncement(peer, a)
            peers.add(peer.toString())
          } catch (error) {
            failures.push(`${peer.toString()}: ${dialErrorMessage(error)}`)
          }
        }),
    )
    if (failures.length) throw new PsycheError(`could not re-announce to ${failures.length} peer(s): ${failures.slice(0, 3).join('; ')}`)
  }

  private async sendAnnouncement(peer: PeerId, a: ResultAnnouncement): Promise<void> {
    const signal = deadline(ANNOUNCE_TIMEOUT_MS)
    const stream = await this.components.dialer.openStream(peer, ANNOUNCE_PROTOCOL, signal)
    try {
      await framed(stream, MAX_ANNOUNCEMENT_BYTES).write(encodeAnnouncement(a), {signal})
      await stream.close({signal})
    } catch (error) {
      abortStream(stream, error)
      throw error
    }
  }

  /** One announcement from one peer (see reannounce): checked and delivered as a gossiped one is. */
  private async receiveAnnouncement(stream: Stream, connection: Connection): Promise<void> {
    const signal = deadline(ANNOUNCE_TIMEOUT_MS)
    let bytes: Uint8Array
    try {
      bytes = (await framed(stream, MAX_ANNOUNCEMENT_BYTES).read({signal})).subarray()
      await stream.close({signal}).catch(() => {})
    } catch (error) {
      this.log({event: 'serve_failed', protocol: ANNOUNCE_PROTOCOL, to: connection.remotePeer.toString(), reason: errorMessage(error)})
      abortStream(stream, error)
      return
    }
    const parsed = parseAnnouncement(bytes, this.runId)
    if (!parsed.ok) {
      this.log({event: 'announcement_rejected', reason: parsed.reason, via: connection.remotePeer.toString()})
      return
    }
    this.deliver(parsed.announcement)
  }

  /** The peers known to subscribe to this run's results topic (announcements reach only them). */
  topicSubscribers(): PeerId[] {
    return this.components.pubsub.getSubscribers(this.topic)
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
    this.deliver(announcement)
  }

  /** Hands a checked announcement to the handlers, once per signature. */
  private deliver(announcement: ResultAnnouncement): void {
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
    return this.results.get(commitment)
  }

  /** Forgets results (and seen announcements) of earlier steps, so memory stays bounded. */
  dropResultsBefore(step: number): void {
    this.results.dropBefore(step)
    for (const [signature, seenStep] of this.seenAnnouncements) if (seenStep < step) this.seenAnnouncements.delete(signature)
    for (const [signature, sent] of this.announcedTo) if (sent.step < step) this.announcedTo.delete(signature)
    for (const [commitment, own] of this.own) if (own.step < step) this.own.delete(commitment)
    for (const [prefix, held] of this.holders) {
      if (held.step >= step) continue
      this.holders.delete(prefix)
      for (const peer of held.peers) {
        const n = (this.havesOf.get(peer) ?? 1) - 1
        if (n > 0) this.havesOf.set(peer, n)
        else this.havesOf.delete(peer)
      }
    }
    for (const pending of this.pendingHaves.keys()) if (pending < step) this.pendingHaves.delete(pending)
    this.firstStep = Math.max(this.firstStep, step)
  }

  /** The most peers one of our results still kept was served to (bounded by maxServesPerResult): for measurements. */
  maxUploadsOfOwnResult(): number {
    let most = 0
    for (const own of this.own.values()) most = Math.max(most, own.servedTo.size)
    return most
  }

  /**
   * Tells our connected peers, in a moment (batched), that we hold this result; not when every fetcher asks its
   * producer anyway: a result below swarmMinBytes (served to all) while we are connected to every member (overlay.ts).
   */
  private queueHave(step: number, commitment: string, producer: string, size: number): void {
    if (size < this.serving.swarmMinBytes && this.components.dialer.dialedMembers() === undefined) return
    let list = this.pendingHaves.get(step)
    if (!list) this.pendingHaves.set(step, (list = []))
    list.push({commitment, producer})
    this.scheduleHaves()
  }

  private scheduleHaves(): void {
    if (this.haveTimer !== undefined || this.stopped) return
    this.haveTimer = setTimeout(() => {
      this.haveTimer = undefined
      // One flush at a time (each peer's stream has one writer): the next waits for it.
      if (this.flushingHaves) return this.scheduleHaves()
      this.flushingHaves = true
      void this.flushHaves().finally(() => (this.flushingHaves = false))
    }, HAVE_FLUSH_MS)
    this.haveTimer.unref?.()
  }

  private async flushHaves(): Promise<void> {
    const pending = [...this.pendingHaves]
    this.pendingHaves.clear()
    if (pending.length === 0 || this.stopped) return
    const peers = this.topicSubscribers()
    // Streams to peers no longer subscribed (gone, or disconnected) are let go.
    const current = new Set(peers.map((p) => p.toString()))
    for (const [id, {stream}] of this.haveStreams)
      if (!current.has(id) || stream.writeStatus !== 'writable') {
        if (stream.writeStatus === 'writable') abortStream(stream, new Error('peer left the topic'))
        this.haveStreams.delete(id)
      }
    await Promise.all(
      peers.map(async (peer) => {
        // Not told: the producer, and a peer that told us it holds the result.
        const id = peer.toString()
        const messages: Uint8Array[] = []
        for (const [step, held] of pending) {
          const news = held.filter((h) => h.producer !== id && !this.holders.get(havePrefix(h.commitment))?.peers.has(id)).map((h) => h.commitment)
          for (let i = 0; i < news.length; i += MAX_HAVES_PER_MESSAGE) messages.push(encodeHave(step, news.slice(i, i + MAX_HAVES_PER_MESSAGE)))
        }
        if (messages.length > 0) await this.sendHaves(peer, messages)
      }),
    )
  }

  /** Writes have messages on our long-lived stream to this peer, opening it first if there is none. */
  private async sendHaves(peer: PeerId, messages: Uint8Array[]): Promise<void> {
    const id = peer.toString()
    const signal = deadline(HAVE_TIMEOUT_MS)
    let out = this.haveStreams.get(id)
    try {
      if (out === undefined) {
        const stream = await this.components.dialer.openStream(peer, HAVE_PROTOCOL, signal)
        out = {stream, lp: framed(stream, MAX_HAVE_MESSAGE_BYTES)}
        if (this.stopped) throw new Error('p2p node stopped')
        this.haveStreams.set(id, out)
      }
      for (const m of messages) await out.lp.write(m, {signal})
    } catch (error) {
      // A peer that left or is busy learns of the holders another way (it asks the producer, or us, again); the
      // stream is opened again at the next batch.
      if (out) {
        abortStream(out.stream, error)
        if (this.haveStreams.get(id) === out) this.haveStreams.delete(id)
      }
    }
  }

  /**
   * A peer's long-lived stream of have messages (see have.ts): where to ask for results besides their producers. It
   * lasts as long as the connection; what it can make us hold is bounded (maxHavesPerPeer: join --max-haves-per-peer; MAX_HAVE_ENTRIES, MAX_HOLDERS_PER_RESULT).
   */
  private async receiveHave(stream: Stream, connection: Connection): Promise<void> {
    const from = connection.remotePeer.toString()
    try {
      const lp = framed(stream, MAX_HAVE_MESSAGE_BYTES)
      for (;;) {
        let frame: Uint8Array
        try {
          frame = (await lp.read()).subarray()
        } catch (error) {
          if (stream.readStatus !== 'readable' || /unexpected end|end of input/i.test(errorMessage(error))) break
          throw error
        }
        const parsed = parseHave(frame)
        if (!parsed.ok) {
          this.badHaves++
          this.log({event: 'have_rejected', from, reason: parsed.reason})
          abortStream(stream, new Error(parsed.reason))
          return
        }
        const {step, prefixes} = parsed.have
        if (step < this.firstStep) continue
        for (const prefix of prefixes) {
          let held = this.holders.get(prefix)
          if (held?.peers.has(from)) continue
          const mine = this.havesOf.get(from) ?? 0
          if (mine >= this.serving.maxHavesPerPeer || (held ? held.peers.size >= MAX_HOLDERS_PER_RESULT : this.holders.size >= MAX_HAVE_ENTRIES)) {
            this.havesIgnored++
            continue
          }
          if (!held) this.holders.set(prefix, (held = {step, peers: new Set()}))
          held.peers.add(from)
          this.havesOf.set(from, mine + 1)
        }
      }
      await stream.close().catch(() => {})
    } catch (error) {
      abortStream(stream, error)
    }
  }

  /**
   * Whether we are among the first maxServesPerResult of the producer's connected peers in line for this result (an
   * order every member computes alike from the commitment and peer ids, when it sees the same peers: in a full mesh),
   * so the producer serves those first and the rest wait for them to tell they hold it. O(peers) integer work.
   */
  private inLine(commitment: string, subscribers: readonly PeerId[], producer: PeerId): boolean {
    const key = Number.parseInt(commitment.slice(0, 8), 16) >>> 0
    const rank = (id: string) => {
      let h = this.peerRank.get(id)
      if (h === undefined) {
        h = fnv1a(id)
        if (this.peerRank.size > 4096) this.peerRank.clear()
        this.peerRank.set(id, h)
      }
      return (h ^ key) >>> 0
    }
    const mine = rank(this.components.peerId.toString())
    let ahead = 0
    for (const p of subscribers) {
      if (p.equals(producer)) continue
      const r = rank(p.toString())
      if (r < mine && ++ahead >= this.serving.maxServesPerResult) return false
    }
    return true
  }

  /**
   * Downloads an announced result: from the peers that told us they hold it, or its producer, then from any other
   * connected peer (every node re-serves what it downloaded). Bytes that do not hash to the commitment are discarded
   * and their sender reported ({event: 'bad_blob'}); throws when no holder supplied the right bytes.
   */
  async fetchResult(a: ResultAnnouncement): Promise<Uint8Array> {
    const local = this.results.get(a.commitment)
    if (local) return local
    // Concurrent requests for the same result share one download.
    const key = `${a.commitment}:${a.size}`
    let pending = this.fetching.get(key)
    if (pending === undefined) {
      pending = this.fetchResultOnce(a).finally(() => this.fetching.delete(key))
      this.fetching.set(key, pending)
    }
    return pending
  }

  /**
   * Peers that told us they hold the result (have.ts) are asked first, in random order, then its producer (which
   * serves each of its results of swarmMinBytes or more to at most maxServesPerResult peers: the rest get it from
   * them, and wait for them rather than ask it: see inLine, HOLDER_WAIT_MS, PRODUCER_DIAL_GRACE_MS), then, once per
   * pass, every other subscribed peer. While holders answer 'busy' or we wait for them (the result is spreading),
   * they are asked again every SWARM_RETRY_MS for up to downloadTimeoutMs; otherwise (the producer unreachable,
   * lying, or not holding it) a pass is used up and the next one waits its backoff pause.
   */
  private async fetchResultOnce(a: ResultAnnouncement): Promise<Uint8Array> {
    if (a.run_id !== this.runId) throw new PsycheError(`announcement is for run ${a.run_id}, not ${this.runId}`)
    const maxBlobBytes = this.init.maxBlobBytes
    if (a.size > maxBlobBytes) {
      this.log({event: 'blob_refused', client_id: a.client_id, commitment: a.commitment, reason: `announced size ${a.size} exceeds max ${maxBlobBytes}`})
      throw new PsycheError(`result ${a.commitment.slice(0, 16)}… from ${a.client_id.slice(0, 16)}… is ${a.size} bytes, more than the ${maxBlobBytes}-byte maximum`)
    }
    const producer = peerIdOfClient(a.client_id)
    /** The last failure per holder. */
    const failures = new Map<string, string>()
    /** Holders that sent wrong bytes are not asked again. */
    const bad = new Set<string>()
    const backoff = this.init.fetchBackoffMs ?? DEFAULT_FETCH_BACKOFF_MS
    const prefix = havePrefix(a.commitment)
    let pass = 0
    /** This try also asks every subscribed peer (once a pass: the told holders and the producer could not serve it). */
    let everyone = false
    let first = true
    const swarmed = a.size >= this.serving.swarmMinBytes
    let softUntil = Date.now() + this.init.downloadTimeoutMs
    const started = Date.now()
    /** A swarmed result's pieces so far (kept across passes: a failed download resumes). */
    let download: PieceDownload | undefined
    for (;;) {
      // The pauses hold no download slot.
      await this.downloads.acquire()
      // The producer answered 'busy' (it served its bound and the result is spreading): ask again soon.
      let spreading = false
      try {
        const told = shuffled([...(this.holders.get(prefix)?.peers ?? [])]).flatMap((p) => {
          try {
            return [peerIdFromString(p)]
          } catch {
            return []
          }
        })
        // Every run member re-serves what it downloaded; other peers (a relay) hold nothing of ours. Asked again
        // each pass: a peer that connected or subscribed since may hold it now.
        const subscribers = this.topicSubscribers()
        const nearProducer = subscribers.some((p) => p.equals(producer))
        // Connected to every member but not to the producer (gone, or not yet reachable): any member may hold it, and
        // the have messages sent before we joined never reached us. In a bounded overlay we wait for them instead.
        if (first && !nearProducer && this.components.dialer.dialedMembers() === undefined) everyone = true
        first = false
        const others = everyone ? subscribers : []
        const waited = Date.now() - started
        // A swarmed result's producer is asked at once by the fetchers in line for it (inLine), by the others once
        // HOLDER_WAIT_MS passed without a holder serving it.
        const askProducer =
          pass > 0 || everyone || waited >= PRODUCER_DIAL_GRACE_MS || (nearProducer && (!swarmed || waited >= HOLDER_WAIT_MS || this.inLine(a.commitment, subscribers, producer)))
        // Not asked yet: the result is expected from our neighbours (see PRODUCER_DIAL_GRACE_MS, HOLDER_WAIT_MS).
        if (!askProducer) spreading = true
        const seen = new Set<string>()
        // A producer we are not connected to is dialled last.
        const holders = [...told, ...(askProducer && nearProducer ? [producer] : []), ...others, ...(askProducer ? [producer] : [])].filter((h) => {
          const id = h.toString()
          if (seen.has(id) || bad.has(id)) return false
          seen.add(id)
          return true
        })
        /** A holder that could not serve it: noted, and blamed when it was its fault. */
        const failed = (holder: string, error: unknown) => {
          const reason = dialErrorMessage(error)
          failures.set(holder, reason)
          if (error instanceof NotThereError && error.busy) spreading = true
          // Expected while the result spreads (its holders busy, or told holders not holding it yet), and asked
          // again: not logged. A producer without its own result is, and so is every peer asked once it failed.
          if (error instanceof NotThereError && (error.busy || (!everyone && holder !== producer.toString()))) return
          if (error instanceof BadSenderError || error instanceof BadSourceError) {
            this.badBlobs++
            bad.add(holder)
            this.log({event: 'bad_blob', from: holder, client_id: a.client_id, commitment: a.commitment, reason})
          } else {
            this.log({event: 'fetch_failed', from: holder, client_id: a.client_id, commitment: a.commitment, step: a.step, pass, reason})
          }
        }
        const got = (bytes: Uint8Array, from: string, hashes?: Uint8Array, pieces?: Record<string, number>) => {
          this.results.put(a.commitment, a.step, bytes, hashes)
          this.queueHave(a.step, a.commitment, producer.toString(), a.size)
          // Who uploaded each result (bench/utilization.bench.ts counts a producer's uploads per result from it):
          // `from` sent the most of it; `pieces`, when fetched in pieces, how many each holder sent (a list: peer ids are
          // values, never keys, so --json keys stay snake_case).
          const perPeer = pieces && Object.entries(pieces).map(([peer_id, n]) => ({peer_id, pieces: n}))
          this.log({event: 'result_fetched', from, client_id: a.client_id, step: a.step, bytes: bytes.length, ...(perPeer ? {pieces: perPeer} : {})})
          if (pass > 0) this.log({event: 'fetch_retried', from, client_id: a.client_id, step: a.step, pass})
          return bytes
        }
        if (swarmed && holders.length > 0 && !this.stopped) {
          // In pieces, from up to MAX_SOURCES_PER_FETCH holders at once, in this order; what arrived is kept for the
          // next pass. The peers that told us they hold it are asked first, alone: the producer and the others only
          // for what they could not give (a producer's uplink carries each result a bounded number of times).
          download ??= new PieceDownload(a.size, a.commitment, this.serving.pieceBytes)
          const toldIds = new Set(told.map((p) => p.toString()))
          const first = holders.filter((h) => toldIds.has(h.toString()))
          const rest = holders.filter((h) => !toldIds.has(h.toString()))
          for (const tier of [first, rest]) {
            if (tier.length === 0 || download.complete() || this.stopped) continue
            const badBefore = download.badPieces
            const outcomes = await download.run(
              tier.map((h) => this.pieceSource(h, a)),
              {maxSources: MAX_SOURCES_PER_FETCH, perSource: PIECES_IN_FLIGHT_PER_PEER, stopped: () => this.stopped},
            )
            this.badPieces += download.badPieces - badBefore
            for (const o of outcomes) {
              if (o.pieces > 0) this.piecesFetched += o.pieces
              if (o.bad !== undefined) this.log({event: 'bad_piece', from: o.id, client_id: a.client_id, commitment: a.commitment, reason: o.bad})
              if (o.error !== undefined) failed(o.id, o.error)
            }
          }
          if (download.complete() && download.list) {
            const pieces = Object.fromEntries(download.piecesFrom)
            const from = [...download.piecesFrom].sort((x, y) => y[1] - x[1])[0]?.[0] ?? ''
            return got(download.bytes, from, download.list.hashes, pieces)
          }
        } else {
          for (const holder of holders) {
            if (this.stopped) throw new PsycheError('p2p node stopped')
            try {
              const bytes = await this.downloadFrom(holder, a)
              const hash = resultCommitment(bytes)
              if (hash !== a.commitment) {
                this.badBlobs++
                bad.add(holder.toString())
                this.log({event: 'bad_blob', from: holder.toString(), client_id: a.client_id, commitment: a.commitment, reason: `bytes hash to ${hash}, not the commitment`})
                failures.set(holder.toString(), 'bytes do not match the commitment')
                continue
              }
              return got(bytes, holder.toString())
            } catch (error) {
              failed(holder.toString(), error)
            }
          }
        }
        // Someone else downloaded it meanwhile (concurrent fetchResult calls share one download; publishResult, tests).
        const local = this.results.get(a.commitment)
        if (local) return local
        // Every peer asked sent wrong bytes: asking again would not help.
        if (everyone && holders.length > 0 && holders.every((h) => bad.has(h.toString()))) break
      } finally {
        this.downloads.release()
      }
      const askedEveryone = everyone
      everyone = false
      if (spreading && Date.now() < softUntil && !this.stopped) {
        await sleep(SWARM_RETRY_MS)
        continue
      }
      // The producer could not serve it: every peer is asked once before the pass is used up.
      if (!askedEveryone && !this.stopped) {
        everyone = true
        continue
      }
      if (pass >= backoff.length || this.stopped) break
      await sleep(backoff[pass++])
      everyone = true
      softUntil = Date.now() + this.init.downloadTimeoutMs
    }
    const reasons = [...failures].map(([holder, reason]) => `${holder}: ${reason}`)
    throw new PsycheError(
      `could not fetch result ${a.commitment.slice(0, 16)}… of client ${a.client_id.slice(0, 16)}… (step ${a.step}): ${reasons.slice(0, 8).join('; ') || 'no peers'}${reasons.length > 8 ? ` (and ${reasons.length - 8} more)` : ''}`,
    )
  }

  private async downloadFrom(holder: PeerId, a: ResultAnnouncement): Promise<Uint8Array> {
    const signal = deadline(this.init.downloadTimeoutMs)
    const stream = await this.components.dialer.openStream(holder, RESULT_PROTOCOL, signal)
    try {
      const lp = framed(stream, Math.max(MAX_BLOB_HEADER_BYTES, CHUNK_BYTES))
      await writeJson(lp, {run_id: this.runId, commitment: a.commitment}, {signal})
      const header = await readJsonObject(lp, 'result response header', {signal})
      if (header.status === 'not_found') throw new NotThereError('does not hold it', false)
      if (header.status === 'busy') throw new NotThereError(`busy: ${String(header.reason ?? '').slice(0, 200)}`, true)
      if (header.status !== 'ok') throw new Error(`refused: ${String(header.reason ?? header.status).slice(0, 200)}`)
      if (header.size !== a.size) throw new BadSenderError(`declared ${String(header.size).slice(0, 20)} bytes, announcement says ${a.size}`)
      const bytes = new Uint8Array(a.size)
      try {
        await readChunksInto(lp, bytes, 0, a.size, {signal})
      } catch (error) {
        if (error instanceof OverrunError) throw new BadSenderError(error.message)
        throw error
      }
      this.components.traffic.count(holder, 'in', a.size, this.components.dialer.onlyRelayed(holder))
      await stream.close({signal}).catch(() => {})
      return bytes
    } catch (error) {
      abortStream(stream, error)
      throw error
    }
  }

  /**
   * A holder to fetch a result from in pieces (piece-fetch.ts): the request asks for a piece session, and for the
   * hash list while we have none checked; the answer is the `ok` header with the result's size, then the list if asked.
   */
  private pieceSource(holder: PeerId, a: ResultAnnouncement): PieceSource {
    return {
      id: holder.toString(),
      open: async (wantList) => {
        const signal = deadline(this.init.downloadTimeoutMs)
        const stream = await this.components.dialer.openStream(holder, RESULT_PROTOCOL, signal)
        try {
          const lp = framed(stream, Math.max(MAX_BLOB_HEADER_BYTES, CHUNK_BYTES, blockListBytes(a.size)))
          await writeJson(lp, {run_id: this.runId, commitment: a.commitment, pieces: true, list: wantList}, {signal})
          const header = await readJsonObject(lp, 'result response header', {signal})
          if (header.status === 'not_found') throw new NotThereError('does not hold it', false)
          if (header.status === 'busy') throw new NotThereError(`busy: ${String(header.reason ?? '').slice(0, 200)}`, true)
          if (header.status !== 'ok') throw new Error(`refused: ${String(header.reason ?? header.status).slice(0, 200)}`)
          if (header.size !== a.size) throw new BadSourceError(`declared ${String(header.size).slice(0, 20)} bytes, announcement says ${a.size}`)
          const list = wantList ? (await lp.read({signal})).subarray() : undefined
          const relayed = this.components.dialer.onlyRelayed(holder)
          return new WirePieceSession(stream, lp, list, {
            timeoutMs: this.init.downloadTimeoutMs,
            onBytes: (n) => this.components.traffic.count(holder, 'in', n, relayed),
          })
        } catch (error) {
          abortStream(stream, error)
          throw error
        }
      },
    }
  }

  /** Why a transfer of this result to this peer is refused now (the serving bounds), or undefined. */
  private busyReason(peer: string, commitment: string, size: number): string | undefined {
    const own = this.own.get(commitment)
    if (own && size >= this.serving.swarmMinBytes && !own.servedTo.has(peer) && own.servedTo.size >= this.serving.maxServesPerResult)
      return `served our result to ${own.servedTo.size} peers already (max-serves-per-result): ask them`
    if ((this.servingTo.get(peer) ?? 0) >= this.serving.maxServesPerPeer) return `serving you ${this.serving.maxServesPerPeer} transfers already (max-serves-per-peer)`
    if (this.servingNow >= this.serving.maxConcurrentServes) return `serving ${this.servingNow} transfers already (max-concurrent-serves)`
    return undefined
  }

  private async serve(stream: Stream, connection: Connection): Promise<void> {
    const signal = deadline(this.init.downloadTimeoutMs)
    const peer = connection.remotePeer.toString()
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
        const busy = this.busyReason(peer, commitment, stored.length)
        if (busy !== undefined) {
          this.servesRefused++
          await writeJson(lp, {status: 'busy', reason: busy}, {signal})
        } else {
          const own = this.own.get(commitment)
          const first = own !== undefined && !own.servedTo.has(peer)
          if (first) own.servedTo.add(peer)
          this.servingTo.set(peer, (this.servingTo.get(peer) ?? 0) + 1)
          this.servingNow++
          try {
            await writeJson(lp, {status: 'ok', size: stored.length}, {signal})
            if (request.pieces === true) {
              // A piece session (piece-fetch.ts): the hash list if asked, then each piece asked for.
              if (request.list === true) await lp.write(this.results.hashList(commitment)!, {signal})
              const remote = connection.remotePeer
              const relayed = isCircuit(connection.remoteAddr)
              let sent = 0
              await servePieces(lp, stream, stored, {
                timeoutMs: this.init.downloadTimeoutMs,
                onPiece: (n) => {
                  sent += n
                  this.components.traffic.count(remote, 'out', n, relayed)
                },
              })
              // Its pieces all came from other holders: not counted against our result's bound.
              if (first && sent === 0) own.servedTo.delete(peer)
            } else {
              await writeChunks(lp, stored, {signal})
              this.components.traffic.count(connection.remotePeer, 'out', stored.length, isCircuit(connection.remoteAddr))
            }
          } catch (error) {
            // Not carried: the peer may ask again, and it does not count against the result's bound.
            if (first) own.servedTo.delete(peer)
            throw error
          } finally {
            this.servingNow--
            const left = (this.servingTo.get(peer) ?? 1) - 1
            if (left > 0) this.servingTo.set(peer, left)
            else this.servingTo.delete(peer)
          }
        }
      }
      // A piece session outlasts the first deadline (each piece has its own): the close gets a fresh one.
      await stream.close({signal: signal.aborted ? deadline(this.init.downloadTimeoutMs) : signal})
    } catch (error) {
      this.log({event: 'serve_failed', protocol: RESULT_PROTOCOL, to: connection.remotePeer.toString(), reason: errorMessage(error)})
      abortStream(stream, error)
    }
  }
}

/** The result exchange as a libp2p service, after pubsub, dialer, traffic and resultStore. */
export function resultExchange(init: ResultExchangeInit): (components: ResultExchangeComponents) => ResultExchange {
  return (components) => new ResultExchange(components, init)
}

/** The sender broke the protocol in a way that is its fault (lied about sizes): reported like a bad blob. */
class BadSenderError extends Error {}

/** The holder does not have the result (yet), or is busy (its serving bounds): asked again later, not a failure. */
class NotThereError extends Error {
  constructor(
    message: string,
    readonly busy: boolean,
  ) {
    super(message)
  }
}

function shuffled<T>(xs: T[]): T[] {
  for (let i = xs.length - 1; i > 0; i--) {
    const j = Math.floor(Math.random() * (i + 1))
    ;[xs[i], xs[j]] = [xs[j], xs[i]]
  }
  return xs
}

/** 32-bit FNV-1a of a string's UTF-16 code units (inLine's order; not for anything an attacker could exploit). */
function fnv1a(text: string): number {
  let h = 0x811c9dc5
  for (let i = 0; i < text.length; i++) h = Math.imul(h ^ text.charCodeAt(i), 0x01000193)
  return h >>> 0
}
