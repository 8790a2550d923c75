import {PsycheError} from '../errors.js'
import {HTTP_LOCATIONS, type HttpLocationKind} from '../config/support.js'
import {listGcsBucket} from './gcs.js'
import {type HttpLocation, type HttpOptions, httpLocationUrls, openHttpSources} from './http.js'
import {TokenFilesProvider} from './provider.js'
import {parseShuffle, type ShuffleSpec} from './shuffle.js'
import {TokenFile, parseTokenSize} from './token-file.js'

/** Psyche's `HttpLLMTrainingDataLocation`: one Http data location (a run's, or one entry of a WeightedHttp mixture). */
export interface HttpDataLocationSpec {
  location: HttpLocation
  token_size_in_bytes: unknown
  shuffle?: ShuffleSpec
}

/**
 * Opens an Http location (SingleUrl, NumberedFiles or a Gcp bucket's listing) as a provider over its token files.
 * `where` names the config field (or the mixture entry) in errors.
 */
export async function openHttpLocation(
  spec: HttpDataLocationSpec,
  where: string,
  options: {seqLen: number; vocabSize?: number; wrap?: boolean; http?: HttpOptions},
): Promise<TokenFilesProvider> {
  if (!spec || typeof spec !== 'object' || !spec.location || typeof spec.location !== 'object') throw new PsycheError(`${where}.location: missing`)
  const kind = Object.keys(spec.location)[0] as HttpLocationKind
  const support = HTTP_LOCATIONS[kind]
  if (support === undefined || Object.keys(spec.location).length !== 1) {
    throw new PsycheError(`${where}.location: expected one of ${Object.keys(HTTP_LOCATIONS).join(', ')}, got ${JSON.stringify(Object.keys(spec.location))}`)
  }
  if (!support.supported) throw new PsycheError(`${where}.location.${kind}: ${support.reason}`)
  const tokenSize = parseTokenSize(spec.token_size_in_bytes, `${where}.token_size_in_bytes`)
  const shuffleSeed = parseShuffle(spec.shuffle, `${where}.shuffle`)
  let urls: string[]
  let sizes: number[] | undefined
  let description: string
  if ('Gcp' in spec.location) {
    const gcp = spec.location.Gcp
    if (!gcp || typeof gcp.bucket_name !== 'string') throw new PsycheError(`${where}.location.Gcp.bucket_name: expected a bucket name`)
    const prefix = gcp.filter_directory ?? ''
    if (typeof prefix !== 'string') throw new PsycheError(`${where}.location.Gcp.filter_directory: expected a string`)
    const listed = await listGcsBucket(gcp.bucket_name, prefix, `${where}.location.Gcp`, options.http)
    urls = listed.map((f) => f.url)
    sizes = listed.map((f) => f.size)
    description = `gs://${gcp.bucket_name}/${prefix} (${urls.length} file${urls.length > 1 ? 's' : ''})`
  } else {
    urls = httpLocationUrls(spec.location, `${where}.location`)
    description = urls.length === 1 ? urls[0] : `${urls[0]} … (${urls.length} files)`
  }
  const sources = await openHttpSources(urls, options.http, sizes)
  const files = await Promise.all(sources.map((s) => TokenFile.fromSource(s, tokenSize)))
  return new TokenFilesProvider(description, files, {seqLen: options.seqLen, vocabSize: options.vocabSize, wrap: options.wrap, shuffleSeed})
}
