/**
 * A peer's result, checked before it is counted anywhere (witnessed, applied, scored): one reader per optimizer's
 * result format, behind one interface. The format is the worker's (its configure reply, `result_format`, parsed here):
 * DisTrO's (distro-result.ts, python/psyche_worker/distro_codec.py) or SparseLoCo's (sparseloco-result.ts,
 * python/psyche_worker/sparseloco_codec.py). Each reader accepts exactly what the worker's decoder accepts (their
 * differential tests), never trusts a length from the wire, and never throws on any input.
 */
import {distroResultIndices, maxResultSize, parseDistroResultFormat, resultSize, validateDistroResult, type DistroResultFormat, type Validation} from './distro-result.js'
import {
  parseSparseLoCoResultFormat,
  sparseLoCoResultIndices,
  sparseLoCoResultSize,
  sparseLoCoSelectionChunks,
  validateSparseLoCoResult,
  type SparseLoCoResultFormat,
} from './sparseloco-result.js'

export type {DistroResultFormat} from './distro-result.js'
export {maxResultSize, resultSize, RESULT_FORMAT_VERSION, RESULT_MAGIC} from './distro-result.js'

/** What a result must look like for this run. */
export type ResultFormat = DistroResultFormat | SparseLoCoResultFormat

/** One optimizer's result format. */
interface ResultReader<F> {
  /** Format, sizes, ranges, padding: whether the worker's decoder would accept `data`. */
  validate(data: Uint8Array, format: F): Validation
  /** Every size a valid result can have (an announced size outside them is refused before the download). */
  sizes(format: F): number[]
  /** The (tensor, chunk, index) positions a valid result selects, every `stride`-th selecting chunk. */
  indices(bytes: Uint8Array, format: F, stride: number): Set<number>
  /** How many chunks carry a selection (copy detection samples them). */
  chunks(format: F): number
}

const distro: ResultReader<DistroResultFormat> = {
  validate: validateDistroResult,
  sizes: (f) => (f.value_format === 'sign' ? [resultSize(f)] : [resultSize(f, 'bf16'), maxResultSize(f)]),
  indices: distroResultIndices,
  chunks: (f) => f.tensors.reduce((a, t) => a + t.shape.reduce((acc, s, i) => acc * Math.floor(s / t.chunk[i]), 1), 0),
}

const sparseloco: ResultReader<SparseLoCoResultFormat> = {
  validate: validateSparseLoCoResult,
  sizes: (f) => [sparseLoCoResultSize(f)],
  indices: sparseLoCoResultIndices,
  chunks: sparseLoCoSelectionChunks,
}

function readerOf(format: ResultFormat): ResultReader<ResultFormat> {
  return (format.format === 'sparseloco' ? sparseloco : distro) as ResultReader<ResultFormat>
}

/** Validates `data` as a result for this run; `{ok: false, reason}` names what is wrong. */
export function validateResult(data: Uint8Array, format: ResultFormat): Validation {
  return readerOf(format).validate(data, format)
}

/** The sizes a valid result of this run can have. */
export function validSizes(format: ResultFormat): number[] {
  return readerOf(format).sizes(format)
}

/** The positions a valid result selects (copy.ts), reading every `stride`-th selecting chunk. */
export function resultIndices(bytes: Uint8Array, format: ResultFormat, stride = 1): Set<number> {
  return readerOf(format).indices(bytes, format, stride)
}

/** How many chunks of a result carry a selection. */
export function selectionChunks(format: ResultFormat): number {
  return readerOf(format).chunks(format)
}

/** Checks a worker's `result_format` reply (it is ours, but a wrong one would make us reject every peer). */
export function parseResultFormat(raw: unknown): ResultFormat {
  const kind = (raw as {format?: unknown} | null)?.format
  if (kind === 'sparseloco') return parseSparseLoCoResultFormat(raw)
  if (kind !== undefined && kind !== 'distro') throw new TypeError(`worker result_format: unknown format ${JSON.stringify(kind)}`)
  return parseDistroResultFormat(raw)
}
