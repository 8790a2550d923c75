import {describe, it} from 'node:test'
import {runSequence, summarize, type SequenceResult} from './fuzz.js'

// Differential fuzzing, the short run (test/solana/fuzz.ts): the on-chain program against the TypeScript reference.
// PSYCHE_FUZZ_SEED=N runs that one sequence (what a failure prints); PSYCHE_FUZZ_SEQUENCES and PSYCHE_FUZZ_FIRST set
// how many run and from which seed (test/solana/differential-long.test.ts, in the e2e tier, runs thousands).
const only = process.env.PSYCHE_FUZZ_SEED
const count = Number(process.env.PSYCHE_FUZZ_SEQUENCES ?? 120)
const first = Number(process.env.PSYCHE_FUZZ_FIRST ?? 1)

describe('differential fuzzing: the program equals the reference after every event', () => {
  it(only ? `seed ${only}` : `${count} random sequences (seeds ${first}..${first + count - 1})`, async () => {
    const results: SequenceResult[] = []
    for (const seed of only ? [Number(only)] : Array.from({length: count}, (_, i) => first + i)) results.push(await runSequence(seed))
    if (only) return
    summarize(results)
  })
})
