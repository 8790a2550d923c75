import assert from 'node:assert/strict'
import {describe, it} from 'node:test'
import type {ChainFeatures} from '../../src/core/backend/solana/local-chain.js'
import type {CoordinatorEvent, CoordinatorState} from '../../src/core/coordinator/index.js'
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
  it('shrinks a divergence to the events it needs (a planted reference bug: the third pending joiner is lost, after tens of events)', async () => {
    const fault = (event: CoordinatorEvent, state: CoordinatorState) => (event.type === 'join' && state.pending.length >= 3 ? {...state, pending: []} : undefined)
    await assert.rejects(runSequence(8, {fault}), (e: Error) => {
      const shrunk = e.message.slice(e.message.indexOf('shrunk to'))
      const [, of] = /^shrunk to 3 of (\d+) events, still diverging:\n.*seed 8, event 2 \(join .*states differ/.exec(shrunk) ?? assert.fail(shrunk.slice(0, 300))
      assert.ok(Number(of) > 3, `seed 8 diverged after ${of} events`)
      const steps = shrunk.slice(shrunk.lastIndexOf('sequence:')).split('\n').slice(1)
      assert.deepEqual(
        steps.map((l) => l.replace(/^ *\d+ t=\d+ (\w+) .*$/, '$1')),
        ['join', 'join', 'join'],
      )
      return true
    })
  })

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
