import {PsycheError} from '../errors.js'
import {SampleOrder} from './batches.js'
import {type HttpDataLocationSpec, openHttpLocation} from './http-location.js'
import {type HttpOptions, fetchJson} from './http.js'
import {type DataProvider, forEachLimited} from './provider.js'
import {parseShuffle, type ShuffleSpec} from './shuffle.js'

/**
 * Psyche's `WeightedHttp` data location: the URL of a JSON document
 *
 *   {"shuffle": "DontShuffle" | {"Seeded": [32 bytes]},
 *    "providers": [[HttpLocation, weight], …]   (explicitly weighted: weights normalised to their sum)
 *               | [HttpLocation, …]}            (length weighted: each source's share is its number of samples)
 *
 * where each HttpLocation is a run config's `Http` table as JSON ({location, token_size_in_bytes, shuffle}), as in
 * Psyche's WeightedHttpProvidersConfig (PsycheFoundation/psyche@0bdb13d94a05675da93d69ffa5d4c4e5a680736c,
 * shared/data-provider/src/weighted/http.rs). Like Psyche's build_weighted_index (weighted/mod.rs), the mixture
 * takes, for each position k, the source whose weight × max(k, 1) most exceeds the samples it has given so far
 * (the lowest index on a tie), and each source gives its samples in its own order.
 *
 * Where Psyche would go on past a source's last sample by repeating that source (and past the end serves source 0's
 * first sample for every batch), this mixture ends: its length is the number of positions before any source would
 * repeat, so no two batch ids of a pass draw the same sample. Past the end a batch id wraps to the start (a new pass)
 * or fails, as with every other location. With length weights no source repeats and the mixture holds every sample.
 * A Seeded top-level shuffle permutes the mixture's positions with our seeded permutation (shuffle.ts), not
 * Psyche's ChaCha8 order. Every replica reads the same JSON and computes the same mixture.
 */

/** Bounds on what a mixture's JSON can make a client hold. */
const WEIGHTED_LIMITS = {
  /** Bytes of the JSON document. */
  jsonBytes: 4 << 20,
  /** Sources in one mixture (the position → source table holds one byte a position). */
  sources: 255,
  /** Positions of one mixture (a byte each). */
  samples: 2 ** 31,
}

/** Positions per rank checkpoint: locating a position counts at most this many bytes. */
const BLOCK = 256

/**
 * The position → (source, sample) table of a mixture: one byte per position naming its source, and every BLOCK
 * positions each source's count so far, so a position's sample (its source's count before it) is found in O(BLOCK).
 */
export class Mixture {
  private constructor(
    private readonly sources: Uint8Array,
    private readonly counts: Uint32Array,
    readonly sourceCount: number,
    /** Samples each source gives to one pass of the mixture. */
    readonly used: number[],
  ) {}

  get length(): number {
    return this.sources.length
  }

  /** The mixture of sources of `lengths` samples with `weights` (normalised to their sum), ended before any source would repeat. */
  static build(lengths: readonly number[], weights: readonly number[]): Mixture {
    const n = lengths.length
    if (n === 0 || n !== weights.length) throw new RangeError(`a mixture needs one weight per source (${n} sources, ${weights.length} weights)`)
    if (n > WEIGHTED_LIMITS.sources) throw new RangeError(`a mixture has at most ${WEIGHTED_LIMITS.sources} sources, not ${n}`)
    const sum = weights.reduce((a, b) => a + b, 0)
    const w = weights.map((x) => x / sum)
    const total = lengths.reduce((a, b) => a + b, 0)
    const capacity = Math.min(total, WEIGHTED_LIMITS.samples)
    const sources = new Uint8Array(capacity)
    const drawn = new Array<number>(n).fill(0)
    const counts: number[] = []
    let k = 0
    for (; k < capacity; k++) {
      if (k % BLOCK === 0) counts.push(...drawn)
      const kf = Math.max(k, 1)
      let best = -Infinity
      let chosen = -1
      for (let i = 0; i < n; i++) {
        if (lengths[i] === 0) continue
        const error = w[i] * kf - drawn[i]
        if (error > best) {
          best = error
          chosen = i
        }
      }
      if (chosen < 0 || drawn[chosen] >= lengths[chosen]) break
      sources[k] = chosen
      drawn[chosen]++
    }
    if (k === WEIGHTED_LIMITS.samples && k < total) throw new RangeError(`a mixture has at most ${WEIGHTED_LIMITS.samples} samples`)
    return new Mixture(sources.subarray(0, k), Uint32Array.from(counts), n, drawn)
  }

  /** The source of position `k` and which of its samples it takes. */
  locate(k: number): {source: number; sample: number} {
    const source = this.sources[k]
    const block = Math.floor(k / BLOCK)
    let sample = this.counts[block * this.sourceCount + source]
    for (let j = block * BLOCK; j < k; j++) if (this.sources[j] === source) sample++
    return {source, sample}
  }
}

function isTable(value: unknown): value is Record<string, unknown> {
  return value !== null && typeof value === 'object' && !Array.isArray(value)
}

/** The mixture's sources and weights from its JSON, each error naming the URL and the entry. */
function parseWeightedConfig(url: string, config: unknown): {shuffle: ShuffleSpec; entries: {spec: HttpDataLocationSpec; weight?: number; where: string}[]} {
  const bad = (path: string, why: string) => new PsycheError(`${url}: ${path}: ${why}`, {code: 'EDATA_FORMAT'})
  if (!isTable(config)) throw bad('(document)', 'expected a JSON object {shuffle, providers}')
  if (config.shuffle === undefined) throw bad('shuffle', 'missing (expected "DontShuffle" or {"Seeded": [32 bytes]})')
  const providers = config.providers
  if (!Array.isArray(providers) || providers.length === 0) throw bad('providers', 'expected a non-empty list of [location, weight] pairs or of locations')
  if (providers.length > WEIGHTED_LIMITS.sources) throw bad('providers', `${providers.length} sources: at most ${WEIGHTED_LIMITS.sources}`)
  const explicit = Array.isArray(providers[0])
  const entries = providers.map((entry: unknown, i) => {
    if (explicit) {
      if (!Array.isArray(entry) || entry.length !== 2 || !isTable(entry[0])) throw bad(`providers[${i}]`, 'expected a [location, weight] pair, like the entries before it')
      const weight = entry[1]
      if (typeof weight !== 'number' || !Number.isFinite(weight) || weight <= 0) {
        throw bad(`providers[${i}][1]`, `weight ${JSON.stringify(weight)} must be a positive number (a source with no weight has no place in the mixture)`)
      }
      return {spec: entry[0] as unknown as HttpDataLocationSpec, weight, where: `${url}: providers[${i}][0]`}
    }
    if (!isTable(entry)) throw bad(`providers[${i}]`, 'expected a location {location, token_size_in_bytes, shuffle}, like the entries before it')
    return {spec: entry as unknown as HttpDataLocationSpec, where: `${url}: providers[${i}]`}
  })
  return {shuffle: config.shuffle as ShuffleSpec, entries}
}

/** A WeightedHttp mixture of Http locations (see the comment at the top of this file). */
export class WeightedHttpProvider implements DataProvider {
  readonly description: string
  private readonly order: SampleOrder

  private constructor(
    readonly url: string,
    private readonly sources: DataProvider[],
    readonly mixture: Mixture,
    options: {shuffleSeed?: Uint8Array; wrap?: boolean},
  ) {
    this.order = new SampleOrder(mixture.length, options)
    this.description = `${url} (mixture of ${sources.length} source${sources.length > 1 ? 's' : ''}, ${mixture.length} samples)`
  }

  /** Fetches the mixture's JSON from `url`, opens every source (their files' sizes checked) and builds the mixture. */
  static async open(url: string, options: {seqLen: number; vocabSize?: number; wrap?: boolean; http?: HttpOptions}): Promise<WeightedHttpProvider> {
    const {shuffle, entries} = parseWeightedConfig(url, await fetchJson(url, 'the weighted data locations', options.http ?? {}, WEIGHTED_LIMITS.jsonBytes))
    const shuffleSeed = parseShuffle(shuffle, `${url}: shuffle`)
    const sources: DataProvider[] = new Array(entries.length)
    try {
      await forEachLimited(entries.length, 2, async (i) => {
        sources[i] = await openHttpLocation(entries[i].spec, entries[i].where, {seqLen: options.seqLen, vocabSize: options.vocabSize})
      })
      const lengths = sources.map((s) => s.numSamples() ?? 0)
      const empty = lengths.findIndex((n) => n === 0)
      if (empty >= 0) {
        throw new PsycheError(`${entries[empty].where}: ${sources[empty].description} holds no whole sample of ${options.seqLen + 1} tokens`, {code: 'EDATA_FILE'})
      }
      const weights = entries.every((e) => e.weight !== undefined) ? entries.map((e) => e.weight!) : lengths
      return new WeightedHttpProvider(url, sources, Mixture.build(lengths, weights), {shuffleSeed, wrap: options.wrap})
    } catch (error) {
      await Promise.all(sources.filter(Boolean).map((s) => s.close()))
      throw error
    }
  }

  numSamples(): number {
    return this.mixture.length
  }

  vocabSize(): number | undefined {
    return undefined
  }

  /** Which source and sample a batch id draws (after wrap-around and the shuffle). */
  locate(batchId: number, wrap = this.order.wrap): {source: number; sample: number} {
    return this.mixture.locate(this.order.index(batchId, this.url, wrap, 'the mixture is empty'))
  }

  async getSamples(batchIds: readonly number[]): Promise<Uint32Array> {
    const places = batchIds.map((id) => this.locate(id))
    const bySource = new Map<number, number[]>()
    places.forEach((p, row) => {
      const rows = bySource.get(p.source)
      if (rows) rows.push(row)
      else bySource.set(p.source, [row])
    })
    let out: Uint32Array | undefined
    let rowLength = 0
    await Promise.all(
      [...bySource].map(async ([source, rows]) => {
        const got = await this.sources[source].getSamples(rows.map((row) => places[row].sample))
        rowLength = got.length / rows.length
        out ??= new Uint32Array(batchIds.length * rowLength)
        rows.forEach((row, j) => out!.set(got.subarray(j * rowLength, (j + 1) * rowLength), row * rowLength))
      }),
    )
    return out ?? new Uint32Array(0)
  }

  async close(): Promise<void> {
    await Promise.all(this.sources.map((s) => s.close()))
  }
}
