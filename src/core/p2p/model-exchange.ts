import {setMaxListeners} from 'node:events'
import type {Connection, Startable, Stream} from '@libp2p/interface'
import type {Registrar} from '@libp2p/interface-internal'
import {errorMessage} from '../errors.js'
import type {SigningIdentity} from '../primitives/announcement.js'
import type {PeerDialer} from './dialer.js'
import {CHUNK_BYTES, framed, OverrunError, readChunksInto, readJsonObject, writeChunks, writeJson} from './framing.js'
import {parseTensorRequest, signManifest, type ModelManifest, type ModelSnapshot} from './model.js'
import {BadPeerError, BusyPeerError, downloadModel, type ModelPeerTransport} from './model-download.js'
import {isCircuit} from './addresses.js'
import {peerIdOfClient} from './peer-id.js'
import type {Traffic} from './traffic.js'
import {abortStream, deadline, ON_LIMITED, Pacer} from './util.js'
import type {EventLog} from '../events.js'

const MODEL_PROTOCOL = '/psyche/model/2'
export const DEFAULT_MAX_MODEL_BYTES = 4 * 1024 * 1024 * 1024

const MAX_REQUEST_BYTES = 1024
const MAX_MODEL_HEADER_BYTES = 4 * 1024 * 1024
/** A whole model may take minutes to export and send; a model transfer is bounded by this instead of downloadTimeoutMs. */
const MODEL_TRANSFER_TIMEOUT_MS = 600_000
/** How long a joiner told `busy` waits before asking this peer again (it asks another holder meanwhile). */
const BUSY_RETRY_MS = 500

/**
 * What a serving peer gives joiners at once: model-piece uploads (tensor requests) in total and to one joiner. Past
 * either, a request is answered `busy` at once (a few bytes) and the joiner takes the piece from another holder or
 * asks again later: joins cannot saturate a member's link while it trains (Psyche added such a cap after joins did).
 */
export interface ModelServeLimits {
  /** piece uploads at once, to every joiner together (join --max-model-uploads) */
  maxUploads: number
  /** piece uploads at once to one joiner (join --max-model-uploads-per-peer) */
  maxUploadsPerPeer: number
  /**
   * bytes per second of model uploads, all joiners together; 0: no cap (join --max-model-upload-mbit). Below the
   * uplink, it leaves the round's own exchange room: a saturated uplink queues every packet behind the joiners'.
   */
  maxUploadBytesPerSecond: number
}

export const DEFAULT_MODEL_SERVE_LIMITS: ModelServeLimits = {maxUploads: 4, maxUploadsPerPeer: 2, maxUploadBytesPerSecond: 0}

interface ModelExchangeInit {
  identity: SigningIdentity
  runId: string
  /** largest model (all frames) accepted */
  maxModelBytes: number
  /** per attempt (one holder) */
  downloadTimeoutMs: number
  /** bounds on what this peer serves; default DEFAULT_MODEL_SERVE_LIMITS */
  serveLimits?: Partial<ModelServeLimits>
  log: EventLog
}

/** What this peer served joiners: piece uploads done, refused as busy, and the most at once. */
export interface ModelServeStats {
  uploads: number
  busy: number
  peakUploads: number
}

interface ModelExchangeComponents {
  registrar: Registrar
  dialer: PeerDialer
  traffic: Traffic
}

/**
 * Model exchange over /psyche/model/2: serves the signed manifest and tensors of our current parameters to joining
 * clients, and downloads a model from peers. A libp2p service: see `modelExchange()`.
 */
export class ModelExchange implements Startable {
  private provider?: () => Promise<ModelSnapshot>
  private readonly manifests = new WeakMap<ModelSnapshot, ModelManifest>()
  private readonly limits: ModelServeLimits
  /** Piece uploads under way, per joining peer (its peer id). */
  private readonly uploading = new Map<string, number>()
  private uploads = 0
  private readonly stats: ModelServeStats = {uploads: 0, busy: 0, peakUploads: 0}
  private readonly pacer?: Pacer

  constructor(
    private readonly components: ModelExchangeComponents,
    private readonly init: ModelExchangeInit,
  ) {
    this.limits = {...DEFAULT_MODEL_SERVE_LIMITS, ...init.serveLimits}
    if (this.limits.maxUploadBytesPerSecond > 0) this.pacer = new Pacer(this.limits.maxUploadBytesPerSecond)
  }

  serveStats(): ModelServeStats {
    return {...this.stats}
  }

  /** Takes an upload slot for `peer`, or says why not (the bound it is at). */
  private takeSlot(peer: string): string | undefined {
    const mine = this.uploading.get(peer) ?? 0
    if (this.uploads >= this.limits.maxUploads) return `serving ${this.uploads} model pieces, its bound (--max-model-uploads ${this.limits.maxUploads})`
    if (mine >= this.limits.maxUploadsPerPeer) return `serving you ${mine} model pieces, its bound per peer (--max-model-uploads-per-peer ${this.limits.maxUploadsPerPeer})`
    this.uploads++
    this.uploading.set(peer, mine + 1)
    this.stats.peakUploads = Math.max(this.stats.peakUploads, this.uploads)
    return undefined
  }

  private releaseSlot(peer: string): void {
    this.uploads--
    const left = (this.uploading.get(peer) ?? 1) - 1
    if (left > 0) this.uploading.set(peer, left)
    else this.uploading.delete(peer)
  }

  async start(): Promise<void> {
    await this.components.registrar.handle(MODEL_PROTOCOL, (stream, connection) => this.serve(stream, connection), {maxInboundStreams: 4, ...ON_LIMITED})
  }

  async stop(): Promise<void> {
    await this.components.registrar.unhandle(MODEL_PROTOCOL)
  }

  /**
   * Answers /psyche/model/2 requests from the provider's current parameters (a joining client's source): the signed
   * manifest of the model (cached per snapshot), or the bytes of some of its tensors.
   */
  serveModel(provider: () => Promise<ModelSnapshot>): void {
    this.provider = provider
  }

  private async serve(stream: Stream, connection: Connection): Promise<void> {
    const {runId, identity} = this.init
    const signal = deadline(Math.max(this.init.downloadTimeoutMs, MODEL_TRANSFER_TIMEOUT_MS))
    // Exporting a large model from the worker may leave the stream idle longer than libp2p's 2-minute default.
    stream.inactivityTimeout = MODEL_TRANSFER_TIMEOUT_MS
    try {
      const lp = framed(stream, MAX_REQUEST_BYTES)
      const request = await readJsonObject(lp, 'model request', {signal})
      if (request.run_id !== runId) {
        await writeJson(lp, {status: 'error', reason: 'wrong run'}, {signal})
      } else if (this.provider === undefined) {
        await writeJson(lp, {status: 'not_available'}, {signal})
      } else if (request.kind === 'manifest') {
        const model = await this.provider()
        let manifest = this.manifests.get(model)
        if (!manifest) this.manifests.set(model, (manifest = signManifest(identity, runId, model)))
        await writeJson(lp, {status: 'ok', manifest}, {signal})
      } else if (request.kind === 'tensors') {
        const {step, indices} = parseTensorRequest(request)
        const peer = connection.remotePeer.toString()
        const busy = this.takeSlot(peer)
        if (busy !== undefined) {
          this.stats.busy++
          await writeJson(lp, {status: 'busy', reason: busy, retry_ms: BUSY_RETRY_MS}, {signal})
        } else {
          try {
            const model = await this.provider()
            if (step !== model.step) await writeJson(lp, {status: 'stale', step: model.step}, {signal})
            else if (indices.some((i) => i >= model.frames.length)) await writeJson(lp, {status: 'error', reason: 'no such tensor'}, {signal})
            else {
              await writeJson(lp, {status: 'ok'}, {signal})
              for (const i of indices) {
                await writeChunks(lp, model.frames[i].data, {signal, pace: this.pacer && ((n) => this.pacer!.take(n, signal))})
                this.components.traffic.count(connection.remotePeer, 'out', model.frames[i].data.length, isCircuit(connection.remoteAddr))
              }
              this.stats.uploads++
            }
          } finally {
            this.releaseSlot(peer)
          }
        }
      } else {
        await writeJson(lp, {status: 'error', reason: 'unknown request kind'}, {signal})
      }
      await stream.close({signal})
    } catch (error) {
      this.init.log({event: 'serve_failed', protocol: MODEL_PROTOCOL, to: connection.remotePeer.toString(), reason: errorMessage(error)})
      abortStream(stream, error)
    }
  }

  /**
   * Downloads the model from these clients (see downloadModel): signed manifests from all, the tensors of the
   * manifest a majority of them signed spread over its signers, every tensor checked against its sha256. With
   * `step`, only peers whose model is at that step count; with `paramHash`, only manifests of that model (the run's
   * current one). The caller's worker checks paramHash after importing.
   */
  async fetchModel(fromClientIds: string[], options: {step?: number; paramHash?: string} = {}): Promise<ModelSnapshot> {
    const started = performance.now()
    const got = await downloadModel(this.transport(), {
      runId: this.init.runId,
      peers: fromClientIds,
      selfId: this.init.identity.id,
      step: options.step,
      paramHash: options.paramHash,
      maxModelBytes: this.init.maxModelBytes,
      attemptTimeoutMs: this.init.downloadTimeoutMs,
      log: (e) => this.init.log(e),
    })
    const sources = Object.entries(got.bytesFrom).filter(([, b]) => b > 0)
    const relayed = sources.some(([id]) => this.components.dialer.onlyRelayed(peerIdOfClient(id)))
    this.init.log({
      event: 'model_fetched',
      from: sources.map(([id]) => peerIdOfClient(id).toString()),
      step: got.snapshot.step,
      bytes: got.totalBytes,
      peers: sources.length,
      attesters: got.attesters.length,
      dropped: got.dropped.length,
      busy: got.busy,
      root: got.root,
      ms: Math.round(performance.now() - started),
      relayed,
    })
    return got.snapshot
  }

  private transport(): ModelPeerTransport {
    return {
      manifest: (clientId, signal) => this.request(clientId, {kind: 'manifest'}, signal, async (_lp, header) => header.manifest),
      tensors: (clientId, step, tensors, signal) =>
        this.request(clientId, {kind: 'tensors', step, indices: tensors.map((t) => t.index)}, signal, async (lp) => {
          const total = tensors.reduce((s, t) => s + t.size, 0)
          const data = new Uint8Array(total)
          const out: Uint8Array[] = []
          let offset = 0
          for (const t of tensors) {
            await readChunksInto(lp, data, offset, t.size, {signal})
            out.push(data.subarray(offset, offset + t.size))
            offset += t.size
          }
          this.components.traffic.count(clientId, 'in', total, this.components.dialer.onlyRelayed(peerIdOfClient(clientId)))
          return out
        }),
    }
  }

  private async request<T>(
    clientId: string,
    request: Record<string, unknown>,
    signal: AbortSignal,
    read: (lp: ReturnType<typeof framed>, header: Record<string, unknown>) => Promise<T>,
  ): Promise<T> {
    setMaxListeners(Infinity, signal)
    const stream = await this.components.dialer.openStream(peerIdOfClient(clientId), MODEL_PROTOCOL, signal)
    stream.inactivityTimeout = MODEL_TRANSFER_TIMEOUT_MS
    try {
      const lp = framed(stream, Math.max(MAX_MODEL_HEADER_BYTES, CHUNK_BYTES))
      await writeJson(lp, {run_id: this.init.runId, ...request}, {signal})
      const header = await readJsonObject(lp, 'model response', {signal})
      if (header.status === 'busy') throw new BusyPeerError(String(header.reason ?? 'busy').slice(0, 200), Number(header.retry_ms))
      if (header.status !== 'ok') throw new Error(`refused: ${String(header.reason ?? header.status).slice(0, 200)}`)
      const out = await read(lp, header)
      await stream.close({signal}).catch(() => {})
      return out
    } catch (error) {
      abortStream(stream, error)
      throw error instanceof OverrunError ? new BadPeerError(error.message) : error
    }
  }
}

/** The model exchange as a libp2p service, after dialer and traffic. */
export function modelExchange(init: ModelExchangeInit): (components: ModelExchangeComponents) => ModelExchange {
  return (components) => new ModelExchange(components, init)
}
