import {isAbsolute, resolve} from 'node:path'
import {PsycheError} from '../errors.js'
import type {DataLocation} from '../config/index.js'
import {DATA_LOCATIONS, type DataLocationKind} from '../config/support.js'
import type {HttpOptions} from './http.js'
import {type HttpDataLocationSpec, openHttpLocation} from './http-location.js'
import {LocalTokenDataset} from './local.js'
import {PreprocessedProvider} from './preprocessed.js'
import type {DataProvider} from './provider.js'
import {type ShuffleSpec, parseShuffle} from './shuffle.js'
import {TcpDataProvider} from './tcp.js'
import type {TokenSize} from './token-file.js'
import {WeightedHttpProvider} from './weighted.js'

export {SampleLayout, windowsInFile} from './batches.js'
export {DataServer, DEFAULT_DATA_SERVER_LIMITS, TcpDataProvider, type DataServerLimits} from './tcp.js'
export {openDataServer} from './serve.js'

export {LocalTokenDataset} from './local.js'
export {type DataProvider} from './provider.js'
export {SeededPermutation, parseShuffle} from './shuffle.js'

export type {DataLocation}

interface OpenDataOptions {
  /** The model's max_seq_len: every sample is seqLen + 1 ids (a Preprocessed example: max_seq_len ids). */
  seqLen: number
  /** Directory that a relative Local or Preprocessed path is relative to (the run config's). */
  baseDir?: string
  /** Token size of Local data without a manifest (default 2). */
  tokenSize?: TokenSize
  /** Shuffle for Local and Preprocessed data (Http and WeightedHttp carry their own `shuffle`; a data server applies its data.toml's). */
  shuffleSeed?: ShuffleSpec
  /** The model's vocabulary size: ids at or above it fail the batch, naming it. */
  vocabSize?: number
  /** Batch ids past the end wrap around to the start instead of failing. */
  wrap?: boolean
  /** HTTP timeouts, retries and the Cloud Storage endpoint. */
  http?: HttpOptions
  /** data_type Finetuning: the data must carry loss masks (Preprocessed with labels). */
  requireLossMasks?: boolean
}

/**
 * Opens whichever provider the run's `[model.LLM.data_location]` names; the support table (config/support.ts)
 * decides which variants exist. Token streams (Local, Http, Server, WeightedHttp) give identical samples for
 * identical data; Preprocessed gives examples with their loss masks.
 */
export async function openDataProvider(location: DataLocation, options: OpenDataOptions): Promise<DataProvider> {
  const where = 'data_location'
  if (!Number.isSafeInteger(options.seqLen) || options.seqLen <= 0) throw new PsycheError(`max_seq_len ${options.seqLen} must be a positive integer`)
  const keys = location && typeof location === 'object' ? Object.keys(location) : [String(location)]
  const kind = keys[0] as DataLocationKind
  const support = DATA_LOCATIONS[kind]
  const known = Object.keys(DATA_LOCATIONS).filter((k) => DATA_LOCATIONS[k as DataLocationKind].supported)
  if (keys.length !== 1 || support === undefined) throw new PsycheError(`${where}: expected exactly one of ${known.join(', ')}, got ${JSON.stringify(location)}`)
  if (!support.supported) throw new PsycheError(`${where}: ${JSON.stringify(kind)} is not supported here: ${support.reason} (supported: ${known.join(', ')})`)
  if (options.requireLossMasks && kind !== 'Preprocessed') throw new PsycheError(`${where}: ${kind} is a token stream without loss masks, which data_type Finetuning needs`)
  const provider = {seqLen: options.seqLen, vocabSize: options.vocabSize, wrap: options.wrap}
  const path = (value: unknown, field: string) => {
    if (typeof value !== 'string') throw new PsycheError(`${where}.${field}: expected a directory path`)
    return isAbsolute(value) ? value : resolve(options.baseDir ?? '.', value)
  }
  if (typeof location === 'object' && 'Local' in location) {
    const dataset = await LocalTokenDataset.open(path(location.Local, 'Local'), {tokenSize: options.tokenSize})
    try {
      return dataset.provider({...provider, shuffleSeed: parseShuffle(options.shuffleSeed, 'shuffle seed')})
    } catch (error) {
      await dataset.close()
      throw error
    }
  }
  if (typeof location === 'object' && 'Server' in location) {
    if (typeof location.Server !== 'string') throw new PsycheError(`${where}.Server: expected "host:port"`)
    return TcpDataProvider.connect(location.Server, {...provider, timeoutMs: options.http?.timeoutMs})
  }
  if (typeof location === 'object' && 'Http' in location) {
    return openHttpLocation(location.Http as unknown as HttpDataLocationSpec, `${where}.Http`, {...provider, http: options.http})
  }
  if (typeof location === 'object' && 'WeightedHttp' in location) {
    if (typeof location.WeightedHttp !== 'string') throw new PsycheError(`${where}.WeightedHttp: expected the URL of a JSON list of weighted Http locations`)
    return WeightedHttpProvider.open(location.WeightedHttp, {...provider, http: options.http})
  }
  if (typeof location === 'object' && 'Preprocessed' in location) {
    return PreprocessedProvider.open(path(location.Preprocessed, 'Preprocessed'), `${where}.Preprocessed`, {
      ...provider,
      shuffleSeed: parseShuffle(options.shuffleSeed, 'shuffle seed'),
      requireLossMasks: options.requireLossMasks,
    })
  }
  throw new PsycheError(`${where}: ${JSON.stringify(kind)} is marked supported but no provider serves it`)
}
