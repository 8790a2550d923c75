/**
 * The one mapping from a batch id to tokens, shared by every data provider, the client and verifiers:
 * the dataset is cut into non-overlapping windows of `seqLen` tokens; the sample for batch id b is
 * window b (modulo the number of windows, so a long run wraps around the data) plus the first token
 * of the following window, i.e. `seqLen + 1` ids — inputs and next-token targets in one.
 */
export interface WindowPlan {
  /** Token index where the sample starts. */
  start: number
  /** Number of ids in the sample: seqLen + 1. */
  length: number
}

export function numWindows(numTokens: number, seqLen: number): number {
  return numTokens > seqLen ? Math.floor((numTokens - 1) / seqLen) : 0
}

export function windowForBatch(batchId: number, numTokens: number, seqLen: number): WindowPlan {
  const windows = numWindows(numTokens, seqLen)
  if (windows === 0) throw new RangeError(`dataset of ${numTokens} tokens is shorter than one sample of ${seqLen + 1}`)
  if (!Number.isSafeInteger(batchId) || batchId < 0) throw new RangeError(`batch id ${batchId} must be a non-negative integer`)
  return {start: (batchId % windows) * seqLen, length: seqLen + 1}
}
