import assert from 'node:assert/strict'
import {describe, it} from 'node:test'
import fc from 'fast-check'
import {serializeState, type CoordinatorState} from '../../src/core/coordinator/index.js'
import {applyDelta, diffState, diffValues, parseDeltaOps, type DeltaOp} from '../../src/core/protocol/state-delta.js'
import {Simulation, simRun} from '../sim/harness.js'

/** A random immutable edit of a JSON value (what the coordinator machine does: copy on the path, share the rest). */
function edit(v: unknown, r: () => number, depth = 0): unknown {
  const choice = r()
  if (v !== null && typeof v === 'object' && depth < 6 && choice < 0.7) {
    if (Array.isArray(v)) {
      if (v.length === 0 || choice < 0.15) return [...v, depth, {x: depth}]
      if (choice < 0.2) return v.slice(1)
      if (choice < 0.25) return [v[v.length - 1], ...v]
      const i = Math.floor(r() * v.length)
      const out = [...v]
      out[i] = edit(v[i], r, depth + 1)
      return out
    }
    const keys = Object.keys(v)
    if (keys.length === 0 || choice < 0.1) return {...v, [`k${Math.floor(r() * 5)}`]: depth}
    if (choice < 0.15) return {['first']: 1, ...v}
    const k = keys[Math.floor(r() * keys.length)]
    if (choice < 0.2) {
      const {[k]: _gone, ...rest} = v as Record<string, unknown>
      return rest
    }
    // Move a value to another key (a copy in the delta).
    if (choice < 0.3) return {...v, moved: (v as Record<string, unknown>)[k]}
    return {...v, [k]: edit((v as Record<string, unknown>)[k], r, depth + 1)}
  }
  return choice < 0.85 ? {replaced: depth} : r() < 0.5 ? null : 'str'
}

function roundTrips(prev: unknown, next: unknown): DeltaOp[] {
  const before = JSON.stringify(prev)
  const ops = diffValues(prev, next)
  // Ops survive the wire and its checks.
  const wire = parseDeltaOps(JSON.parse(JSON.stringify(ops)))
  const rebuilt = applyDelta(prev, wire)
  assert.equal(JSON.stringify(rebuilt), JSON.stringify(next))
  assert.equal(JSON.stringify(prev), before, 'the previous value is left unchanged')
  return ops
}

describe('state deltas (protocol/state-delta.ts)', () => {
  it('rebuild the new value exactly, for any JSON value and any immutable edit of it', () => {
    fc.assert(
      fc.property(fc.jsonValue({maxDepth: 4}), fc.integer(), fc.integer({min: 1, max: 5}), (prev, seed, edits) => {
        let x = seed >>> 0
        const r = () => ((x = (Math.imul(x, 1664525) + 1013904223) >>> 0), x / 2 ** 32)
        let next: unknown = prev
        for (let i = 0; i < edits; i++) next = edit(next, r)
        roundTrips(prev, next)
      }),
      {numRuns: 2000},
    )
    fc.assert(
      fc.property(fc.jsonValue({maxDepth: 3}), fc.jsonValue({maxDepth: 3}), (a, b) => void roundTrips(a, b)),
      {numRuns: 1000},
    )
  })

  it("rebuild every coordinator state of a simulated run from the previous one, each delta a fraction of the state's size", async () => {
    const sim = new Simulation(simRun({total_steps: 4, init_min_clients: 6, witness_nodes: 6}))
    for (let i = 0; i < 6; i++) await sim.addClient(`c${i}`)
    // Every state the coordinator adopts.
    const states: CoordinatorState[] = [sim.coordinator.state]
    let current = sim.coordinator.state
    Object.defineProperty(sim.coordinator, 'state', {
      get: () => current,
      set: (next: CoordinatorState) => {
        if (next !== current) states.push(next)
        current = next
      },
    })
    await sim.runUntil(() => current.run_state === 'Finished', {stepMs: 20})
    assert.ok(states.length > 20, `${states.length} states`)
    let deltaBytes = 0
    let fullBytes = 0
    for (let i = 1; i < states.length; i++) {
      const ops = diffState(states[i - 1], states[i])!
      const rebuilt = applyDelta(states[i - 1], parseDeltaOps(JSON.parse(JSON.stringify(ops))))
      assert.equal(serializeState(rebuilt), serializeState(states[i]), `state ${i}`)
      deltaBytes += JSON.stringify(ops).length
      fullBytes += serializeState(states[i]).length
    }
    assert.ok(deltaBytes * 5 < fullBytes, `deltas ${deltaBytes} bytes against ${fullBytes} for the whole states`)
    // A connection on the passive cadence holds an older revision: the delta from it rebuilds the state too.
    for (const behind of [2, 5, 17])
      for (let i = behind; i < states.length; i++) {
        const ops = diffState(states[i - behind], states[i])!
        const rebuilt = applyDelta(states[i - behind], parseDeltaOps(JSON.parse(JSON.stringify(ops))))
        assert.equal(serializeState(rebuilt), serializeState(states[i]), `state ${i} from ${i - behind}`)
      }
    await sim.stop()
  })

  it('send a round that became the previous round while it took one more record as a copy of the old round and the record, not its roster', () => {
    const roster = Array.from({length: 256}, (_, i) => i.toString(16).padStart(64, '0'))
    const record = (i: number) => ({from: roster[i], participant_bloom: 'p'.repeat(400), broadcast_bloom: 'b'.repeat(400)})
    const round = {step: 7, roster, witnesses: [record(0), record(1)], excluded: []}
    const prev = {epoch: {round, previous_round: null as unknown}, step: 7}
    const last = {...round, witnesses: [...round.witnesses, record(2)]}
    const next = {epoch: {round: {step: 8, roster: [...roster], witnesses: [], excluded: []}, previous_round: last}, step: 8}
    const ops = diffValues(prev, next)
    assert.deepEqual(applyDelta(prev, parseDeltaOps(JSON.parse(JSON.stringify(ops)))), next)
    assert.ok(
      ops.some((op) => 'c' in op && op.p.join('.') === 'epoch.previous_round' && op.c.join('.') === 'epoch.round'),
      JSON.stringify(ops).slice(0, 300),
    )
    // The old round copied, one record appended: no roster in the previous round's part of the delta.
    const forPrevious = ops.filter((op) => op.p[1] === 'previous_round')
    assert.ok(JSON.stringify(forPrevious).length < 1200, `${JSON.stringify(forPrevious).length} bytes`)
  })

  it('refuses malformed ops from the wire, and ops that do not fit the state', () => {
    for (const bad of [
      {},
      [{p: ['__proto__'], v: 1}],
      [{p: ['a', 'constructor'], v: 1}],
      [{p: 'a', v: 1}],
      [{p: ['a'], d: 2}],
      [{p: ['a'], a: 3}],
      [{p: ['a'], v: 1, d: 1}],
      [{p: Array(17).fill('a'), v: 1}],
      [{p: [-1], v: 1}],
      Array(5000).fill({p: [], v: 1}),
    ])
      assert.throws(() => parseDeltaOps(bad), RangeError, JSON.stringify(bad).slice(0, 80))
    const prev = {a: [1, 2], b: {c: 1}}
    for (const ops of [
      [{p: ['x', 'y'], v: 1}],
      [{p: ['a', 5], v: 1}],
      [{p: ['b'], a: [1]}],
      [{p: ['a', 'k'], v: 1}],
      [{p: ['z'], d: 1}],
      [{p: ['a'], c: ['q']}],
      [{p: [], d: 1}],
    ] as DeltaOp[][])
      assert.throws(() => applyDelta(prev, ops), RangeError, JSON.stringify(ops))
    assert.deepEqual(prev, {a: [1, 2], b: {c: 1}})
  })

  it('never throws anything but a RangeError on random ops against a state', () => {
    const prev = {a: [1, {b: 2}], c: {d: [3]}, e: 'f'}
    fc.assert(
      fc.property(fc.jsonValue({maxDepth: 3}), (raw) => {
        try {
          applyDelta(prev, parseDeltaOps(raw))
        } catch (error) {
          assert.ok(error instanceof RangeError, String(error))
        }
        try {
          applyDelta(prev, parseDeltaOps([{p: fc.sample(fc.array(fc.oneof(fc.constantFrom('a', 'c', 'd', 'e', 'b'), fc.nat(3)), {maxLength: 4}), 1)[0], v: raw}]))
        } catch (error) {
          assert.ok(error instanceof RangeError, String(error))
        }
      }),
      {numRuns: 1000},
    )
  })
})
