import assert from 'node:assert/strict'
import {describe, it} from 'node:test'
import {Admission, serverLimits} from '../../src/core/backend/centralized/admission.js'
import {DEFAULT_LIMITS} from '../../src/core/backend/centralized/limits.js'
import type {RunConfigFile} from '../../src/core/config/types.js'
import type {EventLine} from '../../src/core/events.js'
import {baseConfig, baseLLM, joinAll, newRun, toFirstRound} from '../coordinator/helpers.js'

const ids = (n: number, from = 0) => Array.from({length: n}, (_, i) => (from + i).toString(16).padStart(64, '0'))

describe('admission: who may connect, watch and join', () => {
  it('a connection over a bound is refused with the code and the flag of the bound it hit, first the total, then per address, then handshakes', () => {
    const admission = new Admission({...DEFAULT_LIMITS, maxConnections: 4, maxConnectionsPerIp: 2, maxHandshakes: 3})
    assert.equal(admission.connection({connections: 3, fromAddress: 1, handshaking: 2}, '10.0.0.1'), undefined)
    assert.deepEqual(admission.connection({connections: 4, fromAddress: 2, handshaking: 3}, '10.0.0.1'), {
      code: 'too_many_connections',
      message: 'the server holds 4 connections (--max-connections)',
    })
    assert.match(admission.connection({connections: 1, fromAddress: 2, handshaking: 3}, '10.0.0.1')!.message, /^10\.0\.0\.1 has 2 connections open \(--max-connections-per-ip\)$/)
    assert.equal(admission.connection({connections: 1, fromAddress: 1, handshaking: 3}, '10.0.0.1')?.code, 'too_many_handshakes')
    assert.equal(admission.watcher(1), undefined)
    assert.equal(new Admission({...DEFAULT_LIMITS, maxWatchers: 1}).watcher(1)?.code, 'too_many_watchers')
  })

  it('a join is refused at the member bound and past the join pace; a member is never refused, and no other event is', () => {
    const admission = new Admission({...DEFAULT_LIMITS, maxMembers: 3, joinsPerSecond: 1, joinBurst: 2})
    const [a, b, c, d] = ids(4)
    let state = joinAll(newRun(), [a, b], 0)
    assert.equal(admission.event(state, {type: 'join', id: a}), undefined, 'a member (pending) is not counted against the pace')
    assert.equal(admission.event(state, {type: 'join', id: c}), undefined)
    state = joinAll(state, [c], 0)
    assert.deepEqual(admission.event(state, {type: 'join', id: d}), {code: 'run_full', message: 'the run has 3 members (--max-members)'})
    assert.equal(admission.event(state, {type: 'withdraw', id: d}), undefined)
    // c took one of the burst's 2 joins (the member bound refused d before the pace was asked); b takes the other, d is paced.
    const roomy = joinAll(newRun(), [a], 0)
    assert.equal(admission.event(roomy, {type: 'join', id: b}), undefined)
    assert.equal(admission.event(roomy, {type: 'join', id: d})?.code, 'join_rate')
  })

  it("the epoch's healthy clients count as members, its dropped ones do not", () => {
    const admission = new Admission({...DEFAULT_LIMITS, maxMembers: 3})
    const trainers = ids(3, 16)
    const {state} = toFirstRound(trainers)
    assert.equal(admission.event(state, {type: 'join', id: ids(1, 99)[0]})?.code, 'run_full')
    const dropped = {...state, epoch: {...state.epoch, clients: state.epoch.clients.map((c, i) => (i === 0 ? {...c, state: 'Dropped' as const} : c))}}
    assert.equal(admission.event(dropped, {type: 'join', id: ids(1, 99)[0]}), undefined)
  })

  it('a connection is closed at its 16th refusal net of the messages taken (--max-strikes); its identity and address are then banned for --strike-ban-s', () => {
    const admission = new Admission(DEFAULT_LIMITS)
    const connection = {strikes: 0}
    for (let i = 1; i < 16; i++) assert.equal(admission.strike(connection), undefined, `strike ${i}`)
    admission.forgive(connection)
    assert.equal(admission.strike(connection), undefined, 'a message taken earned one back')
    assert.deepEqual(admission.strike(connection), {code: 'too_many_rejections', message: '16 refused messages (--max-strikes)'})
    const three = new Admission({...DEFAULT_LIMITS, maxStrikes: 3, strikeBanSeconds: 1})
    const other = {strikes: 0}
    assert.equal(three.strike(other), undefined)
    assert.equal(three.strike(other), undefined)
    assert.equal(three.strike(other)?.code, 'too_many_rejections')
    three.ban(['id1', '10.0.0.1', undefined])
    assert.match(three.banRefusal('10.0.0.1')!.message, /^10\.0\.0\.1 was closed for 3 refused messages; it may return in 1 s \(--strike-ban-s\)$/)
    assert.equal(three.banRefusal('id1')?.code, 'strike_banned')
    assert.equal(three.banRefusal('10.0.0.2'), undefined)
  })
})

describe('serverLimits: the bounds a server starts with', () => {
  const run = (config = {}): RunConfigFile => ({path: 'state.toml', run_id: 'r', run_state: 'WaitingForMembers', config: {...baseConfig, ...config}, model: {LLM: baseLLM}})

  it('defaults for what is not given; a bound that is not a positive whole number is a usage error naming its flag', () => {
    const logs: EventLine[] = []
    const limits = serverLimits(run(), {maxWatchers: 5}, (e) => logs.push(e))
    assert.equal(limits.maxWatchers, 5)
    assert.equal(limits.joinBurst, DEFAULT_LIMITS.joinBurst)
    assert.throws(() => serverLimits(run(), {joinBurst: 0}, () => {}), /--join-burst: 0 is not a positive whole number/)
    assert.throws(() => serverLimits(run(), {maxUnsentBytes: 1.5}, () => {}), /--max-unsent-bytes: 1\.5/)
  })

  it("the run's client thresholds must fit the member bound", () => {
    assert.throws(() => serverLimits(run({init_min_clients: 4, min_clients: 2}), {maxMembers: 3}, () => {}), /state\.toml: config\.init_min_clients \(4\).*--max-members 3/)
  })
})
