import {PsycheError, errorMessage} from '../errors.js'
import {forEachLimited} from './provider.js'
import type {ByteSource} from './token-file.js'

/** Psyche's `HttpTrainingDataLocation`. */
export type HttpLocation =
  | {SingleUrl: string}
  | {NumberedFiles: {url_template: string; start_index: number; n_left_pad_zeros: number; num_files: number}}
  | {Gcp: {bucket_name: string; filter_directory?: string}}

export interface HttpOptions {
  /** The Cloud Storage JSON API that lists a `Gcp` bucket (default PSYCHE_GCS_ENDPOINT, else https://storage.googleapis.com). */
  gcsEndpoint?: string
  /** Per request, headers and body together. */
  timeoutMs?: number
  /** Attempts per request when the server is unreachable or answers 5xx/429. */
  attempts?: number
  /** First retry delay; doubles each retry. */
  backoffMs?: number
}

type RetrySettings = Required<Omit<HttpOptions, 'gcsEndpoint'>>

const DEFAULTS: RetrySettings = {timeoutMs: 10_000, attempts: 4, backoffMs: 200}

function retrySettings(options: HttpOptions = {}): RetrySettings {
  return {timeoutMs: options.timeoutMs ?? DEFAULTS.timeoutMs, attempts: options.attempts ?? DEFAULTS.attempts, backoffMs: options.backoffMs ?? DEFAULTS.backoffMs}
}

/** The file URLs a SingleUrl or NumberedFiles location names, in order (a Gcp bucket is listed by gcs.ts). */
export function httpLocationUrls(location: HttpLocation, where: string): string[] {
  if ('SingleUrl' in location) {
    if (typeof location.SingleUrl !== 'string') throw new PsycheError(`${where}.SingleUrl: expected a URL string`)
    return [location.SingleUrl]
  }
  if ('NumberedFiles' in location) {
    const {url_template: template, start_index: start = 0, n_left_pad_zeros: pad = 0, num_files: count} = location.NumberedFiles ?? ({} as never)
    if (typeof template !== 'string' || template.split('{}').length !== 2) {
      throw new PsycheError(`${where}.NumberedFiles.url_template: ${JSON.stringify(template)} must contain exactly one "{}" for the file number`)
    }
    for (const [name, value] of [
      ['start_index', start],
      ['n_left_pad_zeros', pad],
      ['num_files', count],
    ] as const) {
      if (!Number.isSafeInteger(value) || value < 0) throw new PsycheError(`${where}.NumberedFiles.${name}: expected a non-negative integer, got ${JSON.stringify(value)}`)
    }
    if (count === 0) throw new PsycheError(`${where}.NumberedFiles.num_files: must be at least 1`)
    return Array.from({length: count}, (_, i) => template.replace('{}', String(start + i).padStart(pad, '0')))
  }
  if ('Gcp' in location) throw new PsycheError(`${where}.Gcp: a bucket's files come from its listing (gcs.ts listGcsBucket), not from a URL pattern`)
  throw new PsycheError(`${where}: expected SingleUrl or NumberedFiles, got ${JSON.stringify(Object.keys(location ?? {}))}`)
}

/** A failure worth another attempt (unreachable, timed out, 5xx, 429); anything else ends the request at once. */
class RetryableError extends Error {}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

/** Runs `attempt` until it succeeds or fails with a non-retryable error; after the last try, a "server down" error. */
async function withRetries<T>(url: string, what: string, options: RetrySettings, attempt: () => Promise<T>): Promise<T> {
  let last = ''
  for (let i = 0; i < options.attempts; i++) {
    if (i > 0) await sleep(options.backoffMs * 2 ** (i - 1))
    try {
      return await attempt()
    } catch (error) {
      if (!(error instanceof RetryableError)) throw error
      last = error.message
    }
  }
  throw new PsycheError(`${url}: server down or unreachable: ${what} failed ${options.attempts} times (last: ${last})`, {code: 'EDATA_HTTP_DOWN'})
}

/** fetch, turning network failures and timeouts into RetryableError and 5xx/429 answers likewise. */
async function request(url: string, init: RequestInit, timeoutMs: number): Promise<Response> {
  let response: Response
  try {
    response = await fetch(url, {...init, signal: AbortSignal.timeout(timeoutMs)})
  } catch (error) {
    const cause = (error as {cause?: {code?: string}}).cause?.code
    throw new RetryableError((error as Error).name === 'TimeoutError' ? `timed out after ${timeoutMs} ms` : (cause ?? errorMessage(error)))
  }
  if (response.status >= 500 || response.status === 429) {
    await response.body?.cancel()
    throw new RetryableError(`HTTP ${response.status}`)
  }
  return response
}

/** File sizes per URL for this process: opening the same data twice does not HEAD every file again. */
const sizeCache = new Map<string, number>()

/** One remote file read with HTTP Range requests: only the bytes a sample needs ever cross the network. */
class HttpByteSource implements ByteSource {
  private constructor(
    readonly name: string,
    readonly size: number,
    private readonly options: RetrySettings,
  ) {}

  /** `expectedSize`: what a listing said the file holds; a server that disagrees fails the open, naming both. */
  static async open(url: string, options: HttpOptions = {}, expectedSize?: number): Promise<HttpByteSource> {
    const settings = retrySettings(options)
    try {
      new URL(url)
    } catch {
      throw new PsycheError(`${url}: not a valid URL`)
    }
    let size = sizeCache.get(url)
    if (size === undefined) {
      size = await withRetries(url, 'HEAD', settings, async () => {
        const response = await request(url, {method: 'HEAD'}, settings.timeoutMs)
        if (!response.ok) throw new PsycheError(`${url}: HEAD answered HTTP ${response.status} ${response.statusText}`, {code: 'EDATA_HTTP_STATUS'})
        const length = Number(response.headers.get('content-length'))
        if (!response.headers.has('content-length') || !Number.isSafeInteger(length) || length < 0) {
          throw new PsycheError(`${url}: HEAD gave no usable Content-Length, so the file's size is unknown`, {code: 'EDATA_HTTP_STATUS'})
        }
        return length
      })
      sizeCache.set(url, size)
    }
    if (expectedSize !== undefined && expectedSize !== size) {
      throw new PsycheError(`${url}: the listing says ${expectedSize} bytes but the server holds ${size} (a listing that lies, or a file replaced since)`, {
        code: 'EDATA_SIZE',
      })
    }
    return new HttpByteSource(url, size, settings)
  }

  async read(offset: number, length: number): Promise<Uint8Array> {
    const range = `bytes=${offset}-${offset + length - 1}`
    if (offset + length > this.size) {
      throw new PsycheError(`${this.name}: file too short: bytes ${offset}-${offset + length - 1} requested but the file has ${this.size} bytes`, {code: 'EDATA_SHORT'})
    }
    return withRetries(this.name, `GET ${range}`, this.options, async () => {
      const response = await request(this.name, {headers: {Range: range}}, this.options.timeoutMs)
      if (response.status === 416) {
        await response.body?.cancel()
        throw new PsycheError(`${this.name}: file too short: the server refused ${range} (416) though it reported ${this.size} bytes (file changed?)`, {code: 'EDATA_SHORT'})
      }
      if (response.status === 200) {
        await response.body?.cancel()
        throw new PsycheError(`${this.name}: the server ignored the Range header (200 instead of 206 for ${range}); it must support HTTP range requests`, {
          code: 'EDATA_HTTP_RANGE',
        })
      }
      if (response.status !== 206) {
        await response.body?.cancel()
        throw new PsycheError(`${this.name}: GET ${range} answered HTTP ${response.status} ${response.statusText}`, {code: 'EDATA_HTTP_STATUS'})
      }
      const contentRange = response.headers.get('content-range') ?? ''
      if (contentRange !== `bytes ${offset}-${offset + length - 1}/${this.size}` && contentRange !== `bytes ${offset}-${offset + length - 1}/*`) {
        await response.body?.cancel()
        throw new PsycheError(`${this.name}: asked for ${range}, the server sent Content-Range ${JSON.stringify(contentRange)}`, {code: 'EDATA_HTTP_RANGE'})
      }
      let body: ArrayBuffer
      try {
        body = await response.arrayBuffer()
      } catch (error) {
        throw new RetryableError(`body of ${range} cut off (${errorMessage(error)})`)
      }
      if (body.byteLength !== length) {
        throw new PsycheError(`${this.name}: file too short: ${range} returned ${body.byteLength} of ${length} bytes`, {code: 'EDATA_SHORT'})
      }
      return new Uint8Array(body)
    })
  }

  async close(): Promise<void> {}
}

/** Opens every file of a location, a few HEAD requests at a time; `sizes[i]`, when given, is what a listing said of file i. */
export async function openHttpSources(urls: readonly string[], options: HttpOptions = {}, sizes?: readonly number[]): Promise<HttpByteSource[]> {
  const sources: HttpByteSource[] = new Array(urls.length)
  await forEachLimited(urls.length, 4, async (i) => {
    sources[i] = await HttpByteSource.open(urls[i], options, sizes?.[i])
  })
  return sources
}

/** GETs a JSON document of at most `maxBytes` (retrying as range reads do); errors name the URL. */
export async function fetchJson(url: string, what: string, options: HttpOptions, maxBytes: number): Promise<unknown> {
  try {
    new URL(url)
  } catch {
    throw new PsycheError(`${url}: not a valid URL`)
  }
  const text = await withRetries(url, `GET ${what}`, retrySettings(options), async () => {
    const response = await request(url, {headers: {accept: 'application/json'}}, retrySettings(options).timeoutMs)
    if (!response.ok) {
      await response.body?.cancel()
      throw new PsycheError(`${url}: GET ${what} answered HTTP ${response.status} ${response.statusText}`, {code: 'EDATA_HTTP_STATUS'})
    }
    const declared = Number(response.headers.get('content-length') ?? NaN)
    if (declared > maxBytes) {
      await response.body?.cancel()
      throw new PsycheError(`${url}: ${what} of ${declared} bytes is larger than the ${maxBytes} bytes allowed`, {code: 'EDATA_TOO_LARGE'})
    }
    const chunks: Uint8Array[] = []
    let total = 0
    try {
      for await (const chunk of response.body ?? []) {
        total += chunk.length
        if (total > maxBytes) {
          await response.body?.cancel().catch(() => undefined)
          throw new PsycheError(`${url}: ${what} is larger than the ${maxBytes} bytes allowed`, {code: 'EDATA_TOO_LARGE'})
        }
        chunks.push(chunk)
      }
    } catch (error) {
      if (error instanceof PsycheError) throw error
      throw new RetryableError(`body cut off (${errorMessage(error)})`)
    }
    return Buffer.concat(chunks).toString('utf8')
  })
  try {
    return JSON.parse(text)
  } catch (error) {
    throw new PsycheError(`${url}: ${what} is not valid JSON (${errorMessage(error)})`, {code: 'EDATA_FORMAT'})
  }
}
