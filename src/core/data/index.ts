import {isAbsolute, resolve} from 'node:path'
import {PsycheError} from '../errors.js'
import type {DataLocation} from '../config/index.js'
import {type HttpLocation, type HttpOptions, httpLocationUrls, openHttpSources} from './http.js'
import {LocalTokenDataset} from './local.js'
import {type DataProvider, TokenFilesProvider} from './provider.js'
import {type ShuffleSpec, parseShuffle} from './shuffle.js'
import {TcpDataProvider} from './tcp.js'
import {TokenFile, type TokenSize, parseTokenSize} from './token-file.js'

export {SampleLayout, windowsInFile} from './batches.js'
export {DataServer, DEFAULT_DATA_SERVER_LIMITS, TcpDataProvider, type DataServerLimits} from './tcp.js'
export {openDataServer} from './serve.js'

export {LocalTokenDataset} from './local.js'
export {type DataProvider} from './provider.js'
export {SeededPermutation, parseShuffle} from './shuffle.js'

export type {DataLocation}

interface OpenDataOptions {
  /** The model's max_seq_len: every sample is seqLen + 1 ids. */
  seqLen: number
  /** Directory that a relative Local path is relative to (the run config's). */
  baseDir?: string
  /** Token size of Local data without a manifest (default 2). */
  tokenSize?: TokenSize
  /** Shuffle for Local data (Http carries its own `shuffle`; a data server applies its data.toml's). */
  shuffleSeed?: ShuffleSpec
  /** The model's vocabulary size: ids at or above it fail the batch, naming it. */
  vocabSize?: number
  /** Batch ids past the end wrap around to the start instead of failing. */
  wrap?: boolean
  /** HTTP timeouts and retries. */
  http?: HttpOptions
}

/**
 * Opens whichever provider the run's `[model.LLM.data_location]` names (Local, Http or Server); all of
 * them give identical samples for identical data. Other variants fail with a clear error.
 */
export async function openDataProvider(location: DataLocation, options: OpenDataOptions): Promise<DataProvider> {
  const where = 'data_location'
  if (!Number.isSafeInteger(options.seqLen) || options.seqLen <= 0) throw new PsycheError(`max_seq_len ${options.seqLen} must be a positive integer`)
  const keys = location && typeof location === 'object' ? Object.keys(location) : [String(location)]
  if (keys.length !== 1) throw new PsycheError(`${where}: expected exactly one of Local, Http, Server, got ${JSON.stringify(location)}`)
  if (typeof location !== 'object') throw new PsycheError(`${where}: ${JSON.stringify(location)} is not supported here (supported: Local, Http, Server)`)
  if ('Local' in location) {
    if (typeof location.Local !== 'string') throw new PsycheError(`${where}.Local: expected a directory path`)
    const dir = isAbsolute(location.Local) ? location.Local : resolve(options.baseDir ?? '.', location.Local)
    const dataset = await LocalTokenDataset.open(dir, {tokenSize: options.tokenSize})
    try {
      return dataset.provider({seqLen: options.seqLen, vocabSize: options.vocabSize, wrap: options.wrap, shuffleSeed: parseShuffle(options.shuffleSeed, 'shuffle seed')})
    } catch (error) {
      await dataset.close()
      throw error
    }
  }
  if ('Server' in location) {
    if (typeof location.Server !== 'string') throw new PsycheError(`${where}.Server: expected "host:port"`)
    return TcpDataProvider.connect(location.Server, {seqLen: options.seqLen, vocabSize: options.vocabSize, wrap: options.wrap, timeoutMs: options.http?.timeoutMs})
  }
  if ('Http' in location) {
    const http = location.Http
    if (!http || typeof http !== 'object' || !http.location) throw new PsycheError(`${where}.Http.location: missing`)
    const tokenSize = parseTokenSize(http.token_size_in_bytes, `${where}.Http.token_size_in_bytes`)
    const shuffleSeed = parseShuffle(http.shuffle, `${where}.Http.shuffle`)
    const urls = httpLocationUrls(http.location as HttpLocation, `${where}.Http.location`)
    const sources = await openHttpSources(urls, options.http)
    const files = await Promise.all(sources.map((s) => TokenFile.fromSource(s, tokenSize)))
    const description = urls.length === 1 ? urls[0] : `${urls[0]} … (${urls.length} files)`
    return new TokenFilesProvider(description, files, {seqLen: options.seqLen, vocabSize: options.vocabSize, wrap: options.wrap, shuffleSeed})
  }
  throw new PsycheError(`${where}: ${JSON.stringify(keys[0])} is not supported here (supported: Local, Http, Server)`)
}
