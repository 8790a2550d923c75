import assert from 'node:assert/strict'
import {createHash} from 'node:crypto'
import {describe, it} from 'node:test'
import {assignedTrainers, batchRangeFor, selectVerifiers, type Round} from '../../src/core/coordinator/index.js'
import {DEFAULT_VERIFICATION_SAMPLE, isScoreAssigned, verifierCount} from '../../src/core/coordinator/rules.js'
import type {CoordinatorState} from '../../src/core/coordinator/index.js'
import {newRun} from './helpers.js'

/** Every verifier of `verifying` with the trainers it scores (assignedTrainers), in verifier order. */
function scoreAssignment(state: CoordinatorState, verifying: Round, scored: Round): Map<string, string[]> {
  return new Map(selectVerifiers(state, verifying).map((v) => [v, assignedTrainers(state, verifying, scored, v)]))
}

const hex = (label: string) => createHash('sha256').update(label).digest('hex')
const ids = (n: number) => Array.from({length: n}, (_, i) => hex(`client ${i}`).slice(0, 40))

/** A pair of consecutive rounds over `roster` (the scored one, and the one whose verifiers score it). */
function rounds(roster: string[], seed: string, batchSize = roster.length * 2): {scored: Round; verifying: Round} {
  const base = {height: 0, data_index: 0, batch_size: batchSize, started_at: 0, roster, witnesses: [], accusations: [], excluded: [], complete_witnesses: 0}
  return {scored: {...base, step: 7, seed: hex(`${seed}/scored`)}, verifying: {...base, step: 8, height: 1, seed: hex(seed)}}
}

describe('assignedTrainers and isScoreAssigned (coordinator/rules.ts): who scores whom', () => {
  it('is a function of the rounds alone: every replica computes the same, fresh objects or not', () => {
    const state = newRun({verification_percent: 50, verification_sample: 3})
    const roster = ids(12)
    const a = rounds(roster, 'seed-1')
    const b = rounds([...roster], 'seed-1')
    const one = [...scoreAssignment(state, a.verifying, a.scored)]
    assert.deepEqual([...scoreAssignment(state, b.verifying, b.scored)], one)
    assert.equal(one.length, verifierCount(state.config, 12))
    assert.deepEqual(
      one.map(([v]) => v),
      selectVerifiers(state, a.verifying),
    )
    assert.deepEqual(assignedTrainers(state, a.verifying, a.scored, 'not-a-verifier'), [])
    // The O(1) check (the ledger's) and the list (the client's) are one rule: they agree on every pair.
    for (const v of roster) {
      const mine = new Set(assignedTrainers(state, a.verifying, a.scored, v))
      for (const t of [...roster, 'stranger']) assert.equal(isScoreAssigned(state, a.verifying, a.scored, v, t), mine.has(t), `${v} → ${t}`)
    }
  })

  it('bounds each verifier to K results (K − 1 here where its window holds the trainer without batches), never itself', () => {
    for (const [n, pct, k] of [
      [4, 100, 4],
      [8, 100, 4],
      [8, 25, 2],
      [33, 100, 5],
      [100, 10, 64],
      [100, 10, 99],
      [5, 100, 1],
    ]) {
      const state = newRun({verification_percent: pct, verification_sample: k})
      const roster = ids(n)
      // Fewer batches than trainers: the last shuffled positions have no result, and nobody scores them.
      const {scored, verifying} = rounds(roster, `bound ${n}`, n - 1)
      const withBatches = new Set(roster.filter((id) => batchRangeFor(state, id, scored)!.end > batchRangeFor(state, id, scored)!.start))
      assert.equal(withBatches.size, n - 1)
      const assignment = scoreAssignment(state, verifying, scored)
      for (const [v, mine] of assignment) {
        assert.ok(mine.length <= k, `${n}/${pct}/${k}: ${mine.length} > K`)
        const full = Math.min(k, n - 1)
        assert.ok(mine.length === full || mine.length === full - 1, `${n}/${pct}/${k}: ${v} scores ${mine.length}`)
        for (const t of roster) assert.equal(isScoreAssigned(state, verifying, scored, v, t), mine.includes(t))
        assert.ok(!mine.includes(v), 'a verifier never scores itself')
        assert.equal(new Set(mine).size, mine.length, 'no trainer twice')
        for (const t of mine) assert.ok(withBatches.has(t))
      }
    }
  })

  it('scores each trainer by about the same number of verifiers (⌊VK/T⌋ or ⌈VK/T⌉), over many seeds', () => {
    for (const [n, pct, k] of [
      [8, 100, 4],
      [16, 50, 3],
      [32, 25, 4],
      [64, 100, 2],
    ]) {
      const state = newRun({verification_percent: pct, verification_sample: k})
      const roster = ids(n)
      const v = verifierCount(state.config, n)
      for (let s = 0; s < 20; s++) {
        const {scored, verifying} = rounds(roster, `balance ${n} ${s}`)
        const by = new Map(roster.map((id) => [id, 0]))
        for (const mine of scoreAssignment(state, verifying, scored).values()) for (const t of mine) by.set(t, by.get(t)! + 1)
        const counts = [...by.values()]
        const ideal = (v * Math.min(k, n - 1)) / n
        assert.ok(Math.min(...counts) >= Math.floor(ideal) && Math.max(...counts) <= Math.ceil(ideal), `${n}/${pct}/${k}: counts ${counts}`)
        assert.ok(Math.max(...counts) - Math.min(...counts) <= 1, `${n}/${pct}/${k}: spread ${counts}`)
      }
    }
  })

  it("cannot be predicted without the verifying round's seed: other seeds give other assignments", () => {
    const state = newRun({verification_percent: 100, verification_sample: 3})
    const roster = ids(20)
    const {scored} = rounds(roster, 'fixed')
    const seen = new Set<string>()
    const firstVerifierPicks = new Map<string, number>()
    for (let s = 0; s < 40; s++) {
      const {verifying} = rounds(roster, `unpredictable ${s}`)
      const mine = assignedTrainers(state, {...verifying}, scored, roster[0])
      seen.add(mine.join(','))
      for (const t of mine) firstVerifierPicks.set(t, (firstVerifierPicks.get(t) ?? 0) + 1)
    }
    // 40 seeds, C(19, 3) = 969 possible sets for one verifier: collisions are rare, and every trainer comes up.
    assert.ok(seen.size >= 35, `only ${seen.size} distinct assignments in 40 seeds`)
    assert.ok(firstVerifierPicks.size >= 15, `client 0 scored only ${firstVerifierPicks.size} of 19 others over 40 seeds`)
  })

  it('only the round right after the scored one assigns anything; the default K is DEFAULT_VERIFICATION_SAMPLE', () => {
    const state = newRun({verification_percent: 100})
    const roster = ids(10)
    const {scored, verifying} = rounds(roster, 'next')
    for (const other of [{...verifying, step: scored.step + 2}, scored]) {
      assert.ok([...scoreAssignment(state, other, scored).values()].every((mine) => mine.length === 0))
      assert.ok(!roster.some((t) => isScoreAssigned(state, other, scored, roster[0], t)))
    }
    for (const mine of scoreAssignment(state, verifying, scored).values()) assert.equal(mine.length, DEFAULT_VERIFICATION_SAMPLE)
  })
})
