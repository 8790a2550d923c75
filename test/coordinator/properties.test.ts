import assert from 'node:assert/strict'
import {describe, it} from 'node:test'
import fc from 'fast-check'
import {
  applyEvent,
  assignBatches,
  buildWitnessProof,
  createCoordinator,
  deserializeState,
  participantKey,
  selectWitnesses,
  serializeState,
  witnessBloomParams,
  witnessCount,
  type CoordinatorEvent,
  type CoordinatorState,
} from '../../src/core/coordinator/index.js'
import type {CoordinatorConfig} from '../../src/core/config/index.js'
import {BloomFilter} from '../../src/core/primitives/bloom.js'
import {S, baseLLM} from './helpers.js'

/** Abstract commands, turned into concrete events from the state they meet (so they stay meaningful). */
type Command =
  | {k: 'join' | 'withdraw' | 'eject' | 'checkpoint' | 'loaded'; i: number}
  | {k: 'tick'; dt: number; entropy: boolean}
  | {k: 'witness'; j: number; mask: number; asWitness: boolean; stale: boolean}
  | {k: 'health'; from: number; accused: number}
  | {k: 'pause' | 'resume'}

const POOL = 7
const id = (i: number) => `p${i % POOL}`

const commandArb: fc.Arbitrary<Command> = fc.oneof(
  {weight: 3, arbitrary: fc.record({k: fc.constant('join' as const), i: fc.nat(POOL - 1)})},
  {weight: 1, arbitrary: fc.record({k: fc.constantFrom('withdraw' as const, 'eject' as const, 'checkpoint' as const), i: fc.nat(POOL - 1)})},
  {weight: 1, arbitrary: fc.record({k: fc.constant('loaded' as const), i: fc.nat(POOL - 1)})},
  // dt in milliseconds: whole seconds mostly (the configs' unit), and sub-second steps.
  {
    weight: 6,
    arbitrary: fc.record({
      k: fc.constant('tick' as const),
      dt: fc.oneof(
        fc.nat(12).map((x) => x * S),
        fc.nat(1500),
      ),
      entropy: fc.boolean(),
    }),
  },
  {
    weight: 4,
    arbitrary: fc.record({
      k: fc.constant('witness' as const),
      j: fc.nat(8),
      mask: fc.oneof(fc.constant(255), fc.nat(255)),
      asWitness: fc.oneof(fc.constant(true), fc.boolean()),
      stale: fc.oneof(fc.constant(false), fc.boolean()),
    }),
  },
  {weight: 1, arbitrary: fc.record({k: fc.constant('health' as const), from: fc.nat(POOL - 1), accused: fc.nat(POOL - 1)})},
  {weight: 1, arbitrary: fc.record({k: fc.constantFrom('pause' as const, 'resume' as const)})},
)

const configArb: fc.Arbitrary<CoordinatorConfig> = fc
  .record({
    min_clients: fc.integer({min: 1, max: 3}),
    extraInit: fc.integer({min: 0, max: 2}),
    witness: fc.integer({min: 0, max: 3}),
    batchExtra: fc.integer({min: 0, max: 9}),
    ramp: fc.integer({min: 0, max: 12}),
    warmupTokens: fc.integer({min: 1, max: 600}),
    warmup_time: fc.integer({min: 0, max: 8}),
    cooldown_time: fc.integer({min: 1, max: 8}),
    max_round_train_time: fc.oneof(
      fc.integer({min: 1, max: 8}),
      fc.integer({min: 1, max: 8000}).map((x) => x / 1000),
    ),
    round_witness_time: fc.oneof(
      fc.integer({min: 1, max: 4}),
      fc.integer({min: 1, max: 4000}).map((x) => x / 1000),
    ),
    epochExtra: fc.integer({min: 0, max: 60}),
    total_steps: fc.integer({min: 1, max: 25}),
    waiting: fc.integer({min: 0, max: 4}),
  })
  .map((r) => {
    const init = r.min_clients + r.extraInit
    const start = init + r.batchExtra
    return {
      warmup_time: r.warmup_time,
      cooldown_time: r.cooldown_time,
      epoch_time: r.max_round_train_time + r.round_witness_time + r.epochExtra,
      max_round_train_time: r.max_round_train_time,
      round_witness_time: r.round_witness_time,
      min_clients: r.min_clients,
      init_min_clients: init,
      witness_nodes: Math.min(r.witness, r.min_clients),
      verification_percent: 0,
      global_batch_size_start: start,
      global_batch_size_end: start + r.ramp,
      global_batch_size_warmup_tokens: r.ramp === 0 ? 0 : r.warmupTokens,
      total_steps: r.total_steps,
      waiting_for_members_extra_time: r.waiting,
    }
  })

const seedArb = fc.uint8Array({minLength: 32, maxLength: 32}).map((b) => Buffer.from(b).toString('hex'))

function toEvent(s: CoordinatorState, c: Command): CoordinatorEvent {
  const round = s.epoch.round
  switch (c.k) {
    case 'join':
    case 'withdraw':
    case 'eject':
      return {type: c.k, id: id(c.i)}
    case 'checkpoint':
      return {type: 'checkpoint', from: id(c.i), repo: {repo_id: `org/ckpt-${c.i}`}}
    case 'loaded':
      return {type: 'witness', from: id(c.i), step: s.progress.step, proof: {participant_bloom: '', broadcast_bloom: ''}}
    case 'tick':
      return c.entropy ? {type: 'tick', entropy: `e${c.dt}`} : {type: 'tick'}
    case 'witness': {
      if (!round) return {type: 'witness', from: id(c.j), step: s.progress.step, proof: {participant_bloom: '', broadcast_bloom: ''}}
      const witnesses = selectWitnesses(s, round)
      const from = c.asWitness && witnesses.length > 0 ? witnesses[c.j % witnesses.length] : round.roster[c.j % round.roster.length]
      const seen = [...assignBatches(s, round)]
        .filter(([, r], k) => r.end > r.start && (c.mask >> k) % 2 === 1)
        .map(([cid, range]) => ({id: cid, range, commitment: Buffer.alloc(32, 3)}))
      return {type: 'witness', from, step: c.stale ? round.step - 1 : round.step, proof: buildWitnessProof(s.config, round, seen)}
    }
    case 'health':
      return {type: 'health_check', from: id(c.from), accused: [id(c.accused)]}
    default:
      return {type: c.k}
  }
}

function deepFreeze<T>(value: T): T {
  if (value && typeof value === 'object' && !Object.isFrozen(value)) {
    Object.freeze(value)
    for (const v of Object.values(value)) deepFreeze(v)
  }
  return value
}

interface Trace {
  final: CoordinatorState
  errors: (string | undefined)[]
  states: CoordinatorState[]
}

function run(
  config: CoordinatorConfig,
  seed: string,
  commands: Command[],
  onStep?: (prev: CoordinatorState, next: CoordinatorState, event: CoordinatorEvent, accepted: boolean) => void,
): Trace {
  let state = createCoordinator({run_id: 'prop', run_state: 'WaitingForMembers', config, model: {LLM: baseLLM}}, {seed, now: 0})
  let now = 0
  const errors: (string | undefined)[] = []
  const states = [state]
  for (const c of commands) {
    if (c.k === 'tick') now += c.dt
    const event = toEvent(state, c)
    deepFreeze(state) // any mutation of a state by applyEvent throws
    const r = applyEvent(state, event, now)
    onStep?.(state, r.state, event, !r.error)
    errors.push(r.error?.code)
    state = r.state
    states.push(state)
  }
  return {final: state, errors, states}
}

const runsArb = fc.tuple(configArb, seedArb, fc.array(commandArb, {minLength: 40, maxLength: 200}))

describe('coordinator invariants over random event sequences', () => {
  it("batch ranges partition each round's global batch and never repeat across rounds; witnesses are clients", () => {
    let rounds = 0
    let laterEpochRounds = 0
    fc.assert(
      fc.property(runsArb, ([config, seed, commands]) => {
        const covered: [number, number, number][] = [] // [start, end, step]
        run(config, seed, commands, (prev, next) => {
          const round = next.epoch.round
          if (!round || round === prev.epoch.round) return
          if (prev.epoch.round && round.step === prev.epoch.round.step) return // same round, new witness
          rounds++
          if (next.progress.epoch > 0) laterEpochRounds++
          // The batch ranges of the new round tile [data_index, data_index + batch_size) exactly.
          const ranges = [...assignBatches(next, round).values()].filter((r) => r.end > r.start).sort((a, b) => a.start - b.start)
          let at = round.data_index
          for (const r of ranges) {
            assert.equal(r.start, at)
            at = r.end
          }
          assert.equal(at, round.data_index + round.batch_size)
          assert.equal(assignBatches(next, round).size, round.roster.length)
          // ... and overlap no earlier round of the run.
          for (const [start, end, step] of covered) {
            assert.ok(round.data_index >= end || round.data_index + round.batch_size <= start, `step ${round.step} overlaps step ${step}`)
          }
          covered.push([round.data_index, round.data_index + round.batch_size, round.step])
          // Witnesses are trainers of the round, and so are all clients that sent proofs.
          const witnesses = selectWitnesses(next, round)
          assert.ok(witnesses.every((w) => round.roster.includes(w)))
          assert.equal(new Set(witnesses).size, witnesses.length)
          assert.ok(round.roster.every((rid) => next.epoch.clients.some((c) => c.id === rid)))
        })
      }),
      {numRuns: 300},
    )
    // Not vacuous: many rounds, some of them in later epochs (where repeats across epochs could hide).
    assert.ok(rounds > 200, `only ${rounds} rounds were exercised`)
    assert.ok(laterEpochRounds > 10, `only ${laterEpochRounds} rounds after the first epoch`)
  })

  it('the witness window closes early only when every witness attested every trainer, and never outlasts round_witness_time', () => {
    let early = 0
    let timedOut = 0
    fc.assert(
      fc.property(runsArb, ([config, seed, commands]) => {
        let now = 0
        let i = 0
        run(config, seed, commands, (prev, next, event) => {
          const c = commands[i++]
          if (c.k === 'tick') now += c.dt
          // An independent recount of complete proofs, straight from the blooms.
          const round = next.epoch.round
          if (round) {
            const params = witnessBloomParams(next.config, round)
            const keys = round.roster.map(participantKey)
            const everyoneHasBatches = round.roster.length <= round.batch_size
            const complete = everyoneHasBatches ? round.witnesses.filter((w) => keys.every((k) => BloomFilter.fromBase64(params, w.participant_bloom).contains(k))).length : 0
            assert.equal(round.complete_witnesses, complete)
          }
          if (prev.run_state !== 'RoundWitness' || event.type !== 'tick') return
          const r = prev.epoch.round!
          const windowOver = now !== prev.run_state_start && now >= prev.run_state_start + Math.round(prev.config.round_witness_time * 1000)
          const allAttested = r.complete_witnesses === witnessCount(prev.config, r.roster.length)
          // A tick leaves RoundWitness exactly when the window is over or every witness attested every trainer.
          assert.equal(next.run_state !== 'RoundWitness', windowOver || allAttested)
          if (next.run_state !== 'RoundWitness') {
            if (windowOver) timedOut++
            else early++
          }
        })
      }),
      // 400 runs: 47–74 early closes over 8 seeds (200 gave 22–41 over 12 seeds, and 19 once: a flaky non-vacuity check).
      {numRuns: 400},
    )
    // Not vacuous: both ways out of the window happened.
    assert.ok(early > 20, `only ${early} early closes`)
    assert.ok(timedOut > 20, `only ${timedOut} timed-out windows`)
  })

  it('recorded witness proofs come from selected witnesses of their round', () => {
    fc.assert(
      fc.property(runsArb, ([config, seed, commands]) => {
        const {states} = run(config, seed, commands)
        for (const s of states) {
          const round = s.epoch.round
          if (!round) continue
          const witnesses = selectWitnesses(s, round)
          assert.ok(round.witnesses.every((w) => witnesses.includes(w.from)))
          assert.equal(new Set(round.witnesses.map((w) => w.from)).size, round.witnesses.length)
        }
      }),
      {numRuns: 60},
    )
  })

  it('the same seed and events give the same state', () => {
    fc.assert(
      fc.property(runsArb, ([config, seed, commands]) => {
        const a = run(config, seed, commands)
        const b = run(config, seed, commands)
        assert.deepStrictEqual(b.final, a.final)
        assert.deepStrictEqual(b.errors, a.errors)
      }),
      {numRuns: 60},
    )
  })

  it('serialize → deserialize gives an identical state, which then evolves identically', () => {
    fc.assert(
      fc.property(runsArb, fc.nat(), ([config, seed, commands], cut) => {
        const {states} = run(config, seed, commands)
        for (const s of states) assert.deepStrictEqual(deserializeState(serializeState(s)), s)
        // Resume from a serialized midpoint: the rest of the run ends in the same state.
        const at = cut % (commands.length + 1)
        let state = deserializeState(serializeState(states[at]))
        let now = 0
        for (const c of commands.slice(0, at)) if (c.k === 'tick') now += c.dt
        for (const c of commands.slice(at)) {
          if (c.k === 'tick') now += c.dt
          state = applyEvent(state, toEvent(state, c), now).state
        }
        assert.deepStrictEqual(state, states[states.length - 1])
      }),
      {numRuns: 60},
    )
  })

  it('a paused run never trains until it is resumed', () => {
    let pauses = 0
    fc.assert(
      fc.property(runsArb, ([config, seed, commands]) => {
        let paused = false
        run(config, seed, commands, (prev, next, event, accepted) => {
          if (accepted && event.type === 'pause') {
            paused = true
            pauses++
          }
          if (accepted && event.type === 'resume') paused = false
          if (paused) {
            const startedRound = next.epoch.round !== null && next.epoch.round.step !== prev.epoch.round?.step
            assert.ok(!startedRound, `a round started at step ${next.epoch.round?.step} after a pause`)
            assert.ok(!(next.run_state === 'RoundTrain' && prev.run_state !== 'RoundTrain'))
          }
          if (next.run_state === 'Paused') assert.equal(next.epoch.round === prev.epoch.round || prev.run_state !== 'Paused', true)
        })
      }),
      {numRuns: 150},
    )
    assert.ok(pauses > 50)
  })

  it('rejected events leave the state untouched (same object)', () => {
    fc.assert(
      fc.property(runsArb, ([config, seed, commands]) => {
        run(config, seed, commands, (prev, next, _event, accepted) => {
          if (!accepted) assert.equal(next, prev)
        })
      }),
      {numRuns: 40},
    )
  })
})
