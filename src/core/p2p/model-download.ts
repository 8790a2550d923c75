import {sha256Hex} from '../primitives/hash.js'
import {errorMessage, PsycheError} from '../errors.js'
import {MAX_TENSORS_PER_REQUEST, parseManifest, type ModelManifest, type ModelSnapshot} from './model.js'
import type {EventLog} from '../events.js'

/**
 * How the downloader talks to one peer (the libp2p node implements it over /psyche/model/2; tests implement it in
 * process). Both return what the peer sent, unchecked: the downloader checks everything.
 */
export interface ModelPeerTransport {
  /** The peer's signed manifest as parsed JSON. */
  manifest(clientId: string, signal: AbortSignal): Promise<unknown>
  /** The bytes of these tensors of the model at `step`, exactly `size` bytes each (a transport never returns more). */
  tensors(clientId: string, step: number, tensors: {index: number; size: number}[], signal: AbortSignal): Promise<Uint8Array[]>
}

/** The peer broke the protocol in a way only a dishonest or broken peer can (wrong bytes, more bytes than asked). */
export class BadPeerError extends Error {}

/** A holder at its upload bound (model-exchange.ts ModelServeLimits): not a failure; ask again after retryMs. */
export class BusyPeerError extends Error {
  readonly retryMs: number
  constructor(reason: string, retryMs: number) {
    super(`busy: ${reason}`)
    this.retryMs = Number.isFinite(retryMs) ? Math.min(5_000, Math.max(50, retryMs)) : 500
  }
}

interface ModelDownloadOptions {
  runId: string
  /** the clients to take the model from (the caller's own id is skipped) */
  peers: string[]
  selfId?: string
  /** only manifests of the model at this step count (the epoch's start step - 1) */
  step?: number
  /**
   * only manifests of a model with this parameter hash count: the run's current model, as the coordinator recorded it
   * (the hash the epoch's witnesses agreed on). Without it (no quorum agreed on one), the root a majority signed.
   */
  paramHash?: string
  maxModelBytes: number
  /** tensor requests in flight, over all peers; default 4 */
  concurrency?: number
  /** tensor requests in flight to one peer; default 2 */
  perPeer?: number
  /** transport failures (timeouts, refusals) after which a peer is given up for this download; default 2 */
  maxPeerFailures?: number
  /** per request (a manifest, or one piece of tensors); default 60 s */
  attemptTimeoutMs?: number
  /** a piece groups consecutive small tensors up to this many bytes into one request; default 4 MiB */
  pieceBytes?: number
  /** give up when every holder answered busy and no piece arrived for this long; default 5 minutes */
  busyTimeoutMs?: number
  log?: EventLog
}

interface ModelDownload {
  snapshot: ModelSnapshot
  /** the manifest root the quorum signed */
  root: string
  /** the peers that signed it */
  attesters: string[]
  /** bytes of verified tensors taken from each peer */
  bytesFrom: Record<string, number>
  /** peers given up during the download, and why */
  dropped: {client_id: string; reason: string; bad: boolean}[]
  totalBytes: number
  /** requests a holder answered busy (at its upload bound), asked again later or of another holder */
  busy: number
}

interface Piece {
  indices: number[]
  bytes: number
  attempts: number
  triedBy: Set<string>
}

/**
 * The manifest to download. With `paramHash` (the run's current model, as the coordinator recorded it): one of a model
 * with that hash, whoever else answers (a peer serving another model cannot outvote it, nor a lone peer impose one);
 * among several roots of that hash, the one most of their peers signed. Without it: the root a strict majority of the
 * answering peers signed. Else the reason there is none.
 */
export function chooseManifest(
  answers: {clientId: string; root: string; manifest: ModelManifest}[],
  paramHash?: string,
): {ok: true; root: string; manifest: ModelManifest; attesters: string[]; dissenters: string[]} | {ok: false; reason: string} {
  if (answers.length === 0) return {ok: false, reason: 'no peer served a manifest'}
  const candidates = paramHash === undefined ? answers : answers.filter((a) => a.manifest.param_hash === paramHash)
  if (candidates.length === 0) {
    return {
      ok: false,
      reason: `none of the ${answers.length} answering peers serves the run's model (parameter hash ${paramHash!.slice(0, 12)}…, recorded by the coordinator): they serve ${[...new Set(answers.map((a) => `${a.manifest.param_hash.slice(0, 12)}…`))].join(', ')}`,
    }
  }
  const byRoot = new Map<string, string[]>()
  for (const a of candidates) byRoot.set(a.root, [...(byRoot.get(a.root) ?? []), a.clientId])
  // Most signers first; ties broken by the root so every client decides the same way (a tie is no quorum anyway).
  const ranked = [...byRoot.entries()].sort((x, y) => y[1].length - x[1].length || (x[0] < y[0] ? -1 : 1))
  const [root, attesters] = ranked[0]
  if (paramHash === undefined && attesters.length * 2 <= answers.length) {
    return {
      ok: false,
      reason: `no manifest root is signed by a majority of the ${answers.length} answering peers (${ranked.map(([r, s]) => `${r.slice(0, 12)}…: ${s.length}`).join(', ')})`,
    }
  }
  const manifest = answers.find((a) => a.root === root)!.manifest
  const dissenters = answers.filter((a) => a.root !== root).map((a) => a.clientId)
  return {ok: true, root, manifest, attesters, dissenters}
}

/** Consecutive tensors grouped into requests of at most pieceBytes (a bigger tensor is a piece of its own). */
export function planPieces(sizes: number[], pieceBytes: number): number[][] {
  const out: number[][] = []
  let current: number[] = []
  let bytes = 0
  sizes.forEach((size, i) => {
    if (current.length > 0 && (bytes + size > pieceBytes || current.length >= MAX_TENSORS_PER_REQUEST)) {
      out.push(current)
      current = []
      bytes = 0
    }
    current.push(i)
    bytes += size
  })
  if (current.length > 0) out.push(current)
  return out
}

function short(id: string): string {
  return `${id.slice(0, 16)}…`
}

/**
 * Downloads a model from several peers: every peer's signed manifest first, then the tensors of the manifest of the
 * run's current model (`paramHash`; without it, the manifest a strict majority of the answering peers signed, see
 * chooseManifest), spread over those peers with bounded concurrency. A piece that
 * fails is retried on another peer; a peer that fails maxPeerFailures times is given up, and one whose bytes do not
 * hash to the manifest is dropped at once (and reported). Resolves only when every tensor is verified; the caller
 * still checks the worker's hash of the imported parameters against the manifest's param_hash.
 */
export async function downloadModel(transport: ModelPeerTransport, options: ModelDownloadOptions): Promise<ModelDownload> {
  const log = options.log ?? (() => {})
  const concurrency = Math.max(1, options.concurrency ?? 4)
  const perPeer = Math.max(1, options.perPeer ?? 2)
  const maxFailures = Math.max(1, options.maxPeerFailures ?? 2)
  const timeoutMs = options.attemptTimeoutMs ?? 60_000
  const busyTimeoutMs = options.busyTimeoutMs ?? 300_000
  const peers = [...new Set(options.peers)].filter((p) => p !== options.selfId)
  if (peers.length === 0) throw new PsycheError('could not fetch the model: no peers given')
  const dropped: ModelDownload['dropped'] = []
  const failures: string[] = []

  // 1. Manifests, from every peer (bounded concurrency).
  const answers: {clientId: string; root: string; manifest: ModelManifest}[] = []
  const queue = [...peers]
  await Promise.all(
    Array.from({length: Math.min(concurrency, peers.length)}, async () => {
      for (let peer = queue.shift(); peer !== undefined; peer = queue.shift()) {
        try {
          const raw = await transport.manifest(peer, AbortSignal.timeout(timeoutMs))
          const {manifest, root} = parseManifest(raw, options.runId, options.maxModelBytes)
          if (manifest.signer !== peer) throw new BadPeerError(`it served a manifest signed by ${short(manifest.signer)}`)
          if (options.step !== undefined && manifest.step !== options.step) {
            failures.push(`${short(peer)}: its model is at step ${manifest.step}, not ${options.step}`)
            continue
          }
          answers.push({clientId: peer, root, manifest})
        } catch (error) {
          failures.push(`${short(peer)}: ${errorMessage(error)}`)
          log({event: 'model_fetch_failed', client_id: peer, reason: errorMessage(error)})
        }
      }
    }),
  )
  // Canonical order (arrival order must not matter).
  answers.sort((a, b) => (a.clientId < b.clientId ? -1 : 1))
  const chosen = chooseManifest(answers, options.paramHash)
  if (!chosen.ok) throw new PsycheError(`could not fetch the model: ${chosen.reason}${failures.length ? `; ${failures.join('; ')}` : ''}`)
  const {manifest, root, attesters} = chosen
  for (const d of chosen.dissenters) {
    const theirs = answers.find((a) => a.clientId === d)!
    const why = options.paramHash === undefined ? "differs from the quorum's" : `is not the run's model (parameter hash ${theirs.manifest.param_hash.slice(0, 12)}…)`
    dropped.push({client_id: d, reason: `its manifest (root ${theirs.root.slice(0, 12)}…, step ${theirs.manifest.step}) ${why}`, bad: false})
    log({event: 'model_peer_dropped', client_id: d, reason: dropped.at(-1)!.reason})
  }
  log({
    event: 'model_manifest',
    step: manifest.step,
    root,
    param_hash: manifest.param_hash,
    attesters: attesters.length,
    answered: answers.length,
    tensors: manifest.tensors.length,
  })

  // 2. Tensors, spread over the attesters.
  const sizes = manifest.tensors.map((t) => t.size)
  const totalBytes = sizes.reduce((a, b) => a + b, 0)
  const data: (Uint8Array | undefined)[] = new Array(sizes.length)
  const pieces: Piece[] = planPieces(sizes, options.pieceBytes ?? 4 * 1024 * 1024).map((indices) => ({
    indices,
    bytes: indices.reduce((s, i) => s + sizes[i], 0),
    attempts: 0,
    triedBy: new Set(),
  }))
  const maxAttempts = attesters.length * maxFailures + 1
  const active = new Set(attesters)
  const inflight = new Map<string, number>(attesters.map((p) => [p, 0]))
  const peerFailures = new Map<string, number>()
  const bytesFrom: Record<string, number> = Object.fromEntries(attesters.map((p) => [p, 0]))
  const pending = [...pieces]
  let running = 0
  let verified = 0
  /** Holders that answered busy: not asked again before this time. */
  const busyUntil = new Map<string, number>()
  let busyAnswers = 0
  let lastProgress = Date.now()
  let wake: ReturnType<typeof setTimeout> | undefined

  const drop = (peer: string, reason: string, bad: boolean) => {
    if (!active.delete(peer)) return
    dropped.push({client_id: peer, reason, bad})
    log({event: 'model_peer_dropped', client_id: peer, reason, bad})
  }
  const pickPeer = (piece: Piece): string | undefined => {
    const now = Date.now()
    const usable = [...active].filter((p) => inflight.get(p)! < perPeer && (busyUntil.get(p) ?? 0) <= now)
    // a peer that has not failed this piece yet, then the least busy, then the one we took the least from
    const rank = (p: string) => [piece.triedBy.has(p) ? 1 : 0, inflight.get(p)!, bytesFrom[p]]
    usable.sort((a, b) => {
      const [x, y] = [rank(a), rank(b)]
      return x[0] - y[0] || x[1] - y[1] || x[2] - y[2] || (a < b ? -1 : 1)
    })
    return usable[0]
  }

  await new Promise<void>((resolve, reject) => {
    let settled = false
    const fail = (reason: string) => {
      if (settled) return
      settled = true
      clearTimeout(wake)
      reject(new PsycheError(`could not fetch the model: ${reason}`))
    }
    const attempt = async (peer: string, piece: Piece): Promise<void> => {
      const triedBefore = piece.triedBy.has(peer)
      piece.attempts++
      piece.triedBy.add(peer)
      try {
        const wanted = piece.indices.map((index) => ({index, size: sizes[index]}))
        const got = await transport.tensors(peer, manifest.step, wanted, AbortSignal.timeout(timeoutMs))
        if (got.length !== wanted.length) throw new BadPeerError(`it sent ${got.length} tensors for ${wanted.length} asked`)
        got.forEach((bytes, k) => {
          const t = manifest.tensors[wanted[k].index]
          if (bytes.length !== t.size) throw new BadPeerError(`it sent ${bytes.length} bytes of ${t.name}, the manifest says ${t.size}`)
          if (sha256Hex(bytes) !== t.sha256) throw new BadPeerError(`its bytes of ${t.name} do not hash to the manifest's sha256`)
        })
        if (settled) return
        got.forEach((bytes, k) => (data[wanted[k].index] = bytes))
        bytesFrom[peer] += piece.bytes
        verified++
        lastProgress = Date.now()
      } catch (error) {
        if (settled) return
        const reason = errorMessage(error)
        if (error instanceof BusyPeerError) {
          // Not a failure: the holder is at its upload bound. The piece goes back; this holder rests a while.
          piece.attempts--
          if (!triedBefore) piece.triedBy.delete(peer)
          busyAnswers++
          busyUntil.set(peer, Date.now() + error.retryMs)
          if (Date.now() - lastProgress > busyTimeoutMs)
            return fail(`every holder stayed busy (at its upload bound) for ${Math.round(busyTimeoutMs / 1000)} s, the last: ${reason}`)
          pending.push(piece)
          return
        }
        if (error instanceof BadPeerError) drop(peer, reason, true)
        else {
          const n = (peerFailures.get(peer) ?? 0) + 1
          peerFailures.set(peer, n)
          log({event: 'model_piece_failed', client_id: peer, tensors: piece.indices.length, attempt: piece.attempts, reason})
          if (n >= maxFailures) drop(peer, `${n} failed requests, the last: ${reason}`, false)
        }
        if (piece.attempts >= maxAttempts) return fail(`a piece of ${piece.indices.length} tensors failed ${piece.attempts} times, the last: ${reason}`)
        pending.push(piece)
      }
    }
    const pump = () => {
      if (settled) return
      if (verified === pieces.length) {
        settled = true
        clearTimeout(wake)
        return resolve()
      }
      while (running < concurrency && pending.length > 0) {
        const peer = pickPeer(pending[0])
        if (peer === undefined) break
        const piece = pending.shift()!
        running++
        inflight.set(peer, inflight.get(peer)! + 1)
        void attempt(peer, piece).finally(() => {
          running--
          inflight.set(peer, inflight.get(peer)! - 1)
          pump()
        })
      }
      if (running === 0 && pending.length > 0 && active.size === 0) {
        fail(`every peer that signed the manifest was given up (${dropped.map((d) => `${short(d.client_id)}: ${d.reason}`).join('; ')})`)
      }
      // Pieces wait while the holders that could take them rest after a busy answer: ask again when the first may.
      const resting = [...active].map((p) => busyUntil.get(p) ?? 0).filter((t) => t > Date.now())
      if (!settled && pending.length > 0 && running < concurrency && resting.length > 0 && wake === undefined) {
        wake = setTimeout(
          () => {
            wake = undefined
            pump()
          },
          Math.min(...resting) - Date.now() + 1,
        )
      }
    }
    pump()
  })

  const frames = manifest.tensors.map((t, i) => ({name: t.name, dtype: t.dtype, shape: t.shape, data: data[i]!}))
  return {snapshot: {step: manifest.step, paramHash: manifest.param_hash, frames}, root, attesters, bytesFrom, dropped, totalBytes, busy: busyAnswers}
}
