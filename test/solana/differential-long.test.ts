import {describe, it} from 'node:test'
import {runSequence, summarize, type SequenceResult} from './fuzz.js'

// Differential fuzzing, the long run (e2e tier): 600 sequences (52,000 events), seeds apart from the short run's
// (test/solana/differential.test.ts, which also reproduces one seed: PSYCHE_FUZZ_SEED=N).
const FIRST = 100_001
const COUNT = 600

describe('differential fuzzing, long: the program equals the reference after every event', () => {
  it(`${COUNT} random sequences (seeds ${FIRST}..${FIRST + COUNT - 1})`, async () => {
    const results: SequenceResult[] = []
    for (let seed = FIRST; seed < FIRST + COUNT; seed++) results.push(await runSequence(seed))
    summarize(results, {fullRun: true})
  })
})
