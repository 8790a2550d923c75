import {describe, it} from 'node:test'
import type {ChainFeatures} from '../../src/core/backend/solana/local-chain.js'
import {runSequence, summarize, type SequenceResult} from './fuzz.js'

// Differential fuzzing, the short run (test/solana/fuzz.ts): the on-chain program against the TypeScript reference,
// as the sBPF v3 build on a current cluster, and (the first third of the same sequences) as the v0 build on a legacy
// one: the linker's two outputs of the same C must behave alike. PSYCHE_FUZZ_SEED=N runs that one sequence (what a
// failure prints; with PSYCHE_FUZZ_FEATURES=legacy, on the v0 build); PSYCHE_FUZZ_SEQUENCES and PSYCHE_FUZZ_FIRST set
// how many run and from which seed (test/solana/differential-long.test.ts, in the e2e tier, runs thousands).
const only = process.env.PSYCHE_FUZZ_SEED
const count = Number(process.env.PSYCHE_FUZZ_SEQUENCES ?? 120)
const first = Number(process.env.PSYCHE_FUZZ_FIRST ?? 1)

describe('differential fuzzing: the program equals the reference after every event', () => {
  if (only) {
    it(`seed ${only}`, async () => {
      await runSequence(Number(only), {features: (process.env.PSYCHE_FUZZ_FEATURES ?? 'current') as ChainFeatures})
    })
    return
  }
  for (const [features, n, from] of [
    ['current', count, first],
    ['legacy', Math.ceil(count / 3), first],
  ] as const) {
    it(`${n} random sequences (seeds ${from}..${from + n - 1}) on the ${features === 'current' ? 'sBPF v3 build, current' : 'sBPF v0 build, legacy'} features`, async () => {
      const results: SequenceResult[] = []
      for (let seed = from; seed < from + n; seed++) results.push(await runSequence(seed, {features}))
      summarize(results)
    })
  }
})
