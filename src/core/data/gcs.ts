import {PsycheError} from '../errors.js'
import {type HttpOptions, fetchJson} from './http.js'
import {TOKEN_FILE_PATTERN} from './token-file.js'

/**
 * A public Cloud Storage bucket as Psyche's `Http.location.Gcp` names it: listed anonymously through the Cloud
 * Storage JSON API (`GET {endpoint}/storage/v1/b/{bucket}/o?prefix=…`, following nextPageToken), its token files
 * then read as HTTP files through each object's mediaLink (range requests, like any Http location). This follows
 * Psyche's FileURLs::from_gcp_bucket (PsycheFoundation/psyche@0bdb13d94a05675da93d69ffa5d4c4e5a680736c,
 * shared/data-provider/src/http.rs): filter_directory is the listing's prefix as given (empty: the whole bucket),
 * objects whose name ends in .npy, .bin or .ds are kept, ordered by their media link.
 */

const DEFAULT_GCS_ENDPOINT = 'https://storage.googleapis.com'

/** Bounds on what a bucket listing can make a client hold. */
const GCS_LIMITS = {
  /** Token files in one location. */
  files: 100_000,
  /** Bytes of one listing page (the API sends at most 1,000 objects a page, well under 1 MiB). */
  pageBytes: 16 << 20,
  /** Pages of one listing. */
  pages: 1_000,
}

interface GcsFile {
  /** The object's name in the bucket. */
  name: string
  /** Where its bytes are read (the object's mediaLink). */
  url: string
  /** Its size as the listing says; the file's server must agree (HttpByteSource.open). */
  size: number
}

/** The listing endpoint: options, else PSYCHE_GCS_ENDPOINT (a mirror, or a test server), else Google's. */
function gcsEndpoint(options: HttpOptions = {}): string {
  const endpoint = (options.gcsEndpoint ?? process.env.PSYCHE_GCS_ENDPOINT ?? DEFAULT_GCS_ENDPOINT).replace(/\/+$/, '')
  let url: URL
  try {
    url = new URL(endpoint)
  } catch {
    throw new PsycheError(`Cloud Storage endpoint ${JSON.stringify(endpoint)} (PSYCHE_GCS_ENDPOINT) is not a URL`)
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') throw new PsycheError(`Cloud Storage endpoint ${endpoint} (PSYCHE_GCS_ENDPOINT) must be http(s)`)
  return endpoint
}

function isTable(value: unknown): value is Record<string, unknown> {
  return value !== null && typeof value === 'object' && !Array.isArray(value)
}

/**
 * The token files under `prefix` in `bucket`, in Psyche's order. Every object the listing names is checked: a
 * name, a size (a decimal string, as the API writes uint64s), and a media link on the listing's own origin (a
 * listing cannot send a client to another host). `where` names the config field in errors.
 */
export async function listGcsBucket(bucket: string, prefix: string, where: string, options: HttpOptions = {}): Promise<GcsFile[]> {
  if (!/^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$/.test(bucket)) throw new PsycheError(`${where}.bucket_name: ${JSON.stringify(bucket)} is not a Cloud Storage bucket name`)
  const endpoint = gcsEndpoint(options)
  const origin = new URL(endpoint).origin
  const files: GcsFile[] = []
  let pageToken: string | undefined
  for (let page = 0; ; page++) {
    if (page >= GCS_LIMITS.pages) throw new PsycheError(`gs://${bucket}/${prefix}: the listing goes on past ${GCS_LIMITS.pages} pages`, {code: 'EDATA_TOO_LARGE'})
    const query = new URLSearchParams({fields: 'items(name,size,mediaLink),nextPageToken'})
    if (prefix !== '') query.set('prefix', prefix)
    if (pageToken !== undefined) query.set('pageToken', pageToken)
    const url = `${endpoint}/storage/v1/b/${encodeURIComponent(bucket)}/o?${query}`
    const listing = await fetchJson(url, `the listing of gs://${bucket}/${prefix}`, options, GCS_LIMITS.pageBytes)
    const bad = (why: string) => new PsycheError(`${url}: not a Cloud Storage listing: ${why}`, {code: 'EDATA_FORMAT'})
    if (!isTable(listing)) throw bad('expected a JSON object')
    const items = listing.items ?? []
    if (!Array.isArray(items)) throw bad('items is not a list')
    for (const [i, item] of items.entries()) {
      if (!isTable(item) || typeof item.name !== 'string') throw bad(`items[${i}] has no name`)
      if (!TOKEN_FILE_PATTERN.test(item.name)) continue
      const size = typeof item.size === 'string' && /^\d{1,16}$/.test(item.size) ? Number(item.size) : typeof item.size === 'number' ? item.size : NaN
      if (!Number.isSafeInteger(size) || size < 0) throw bad(`items[${i}] (${item.name}): size ${JSON.stringify(item.size)} is not a byte count`)
      if (typeof item.mediaLink !== 'string') throw bad(`items[${i}] (${item.name}) has no mediaLink`)
      let link: URL
      try {
        link = new URL(item.mediaLink)
      } catch {
        throw bad(`items[${i}] (${item.name}): mediaLink ${JSON.stringify(item.mediaLink)} is not a URL`)
      }
      if (link.origin !== origin) throw bad(`items[${i}] (${item.name}): mediaLink points to ${link.origin}, not the listing's ${origin}`)
      files.push({name: item.name, url: link.href, size})
      if (files.length > GCS_LIMITS.files) throw new PsycheError(`gs://${bucket}/${prefix}: more than ${GCS_LIMITS.files} token files`, {code: 'EDATA_TOO_LARGE'})
    }
    const next = listing.nextPageToken
    if (next === undefined || next === null || next === '') break
    if (typeof next !== 'string') throw bad('nextPageToken is not a string')
    pageToken = next
  }
  if (files.length === 0) throw new PsycheError(`${where}: gs://${bucket}/${prefix} holds no token files (*.bin, *.ds, *.npy)`, {code: 'EDATA_FILE'})
  // Psyche sorts by the media link (its URL); equal names cannot occur in one listing.
  files.sort((a, b) => (a.url < b.url ? -1 : a.url > b.url ? 1 : 0))
  return files
}
