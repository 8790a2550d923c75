import assert from 'node:assert/strict'
import {describe, it} from 'node:test'
import {dispatch, verdict} from '../../src/core/backend/centralized/dispatch.js'
import type {ClientEnvelope} from '../../src/core/protocol/messages.js'
import {honestProof, toFirstRound} from '../coordinator/helpers.js'

const [A, B, C] = ['a1', 'b2', 'c3'].map((c) => c.repeat(32))

function envelope<K extends ClientEnvelope['kind']>(kind: K, from: string, step: number, body: Extract<ClientEnvelope, {kind: K}>['body']): ClientEnvelope {
  return {kind, from, step, body, run_id: 'test-run', seq: 1, session: '00'.repeat(16)} as ClientEnvelope
}

const report = {loss: 1, val_loss: null, tokens_per_second: null, compute_ms: null, apply_ms: 0, result_bytes: null, bytes_in: 0, bytes_out: 0, applied: 0, accepted: 0, peers: 0}

describe('dispatch: where a verified message goes', () => {
  const {state} = toFirstRound([A, B, C])
  const step = state.progress.step
  let drawn = 0
  const entropy = () => `entropy-${++drawn}`

  it("a witness of the current step is an event of the coordinator, with the server's entropy drawn for it", () => {
    const proof = honestProof(state)
    const to = dispatch(envelope('witness', A, step, {proof}), state, entropy)
    assert.deepEqual(to, {to: 'event', event: {type: 'witness', from: A, step, proof, entropy: `entropy-${drawn}`}})
    assert.equal(drawn, 1)
  })

  it('a stale witness or health check is refused (a strike, as every refusal), without drawing entropy', () => {
    const before = drawn
    const stale = dispatch(envelope('witness', A, step - 1, {proof: honestProof(state)}), state, entropy)
    assert.deepEqual(stale, {to: 'refuse', code: 'stale_step', reason: `witness for step ${step - 1}, but the run is at step ${step}`})
    const check = dispatch(envelope('health_check', A, step - 1, {accused: [B]}), state, entropy)
    assert.equal(check.to, 'refuse')
    assert.equal(drawn, before)
  })

  it("a Cooldown witness (with the parameters' hash) may attest the step before the run's", () => {
    const to = dispatch(envelope('witness', A, step - 1, {proof: {participant_bloom: '', broadcast_bloom: ''}, param_hash: 'ab'.repeat(32)}), state, entropy)
    assert.equal(to.to, 'event')
    assert.equal(to.to === 'event' && to.event.type === 'witness' && to.event.param_hash, 'ab'.repeat(32))
  })

  it("a report goes to the server's own business when its sender trained in a recent round; otherwise it is refused", () => {
    assert.deepEqual(dispatch(envelope('report', A, step, report), state, entropy), {to: 'report', step, report})
    const stranger = 'dd'.repeat(32)
    const refused = dispatch(envelope('report', stranger, step, report), state, entropy)
    assert.deepEqual(refused, {to: 'refuse', code: 'not_a_trainer', reason: `client ${stranger} trained in neither of the last two rounds`})
    const late = dispatch(envelope('report', A, step + 1, report), state, entropy)
    assert.equal(late.to === 'refuse' && late.code, 'stale_step')
  })

  it('a withdraw is an event about its sender; addresses, scores and resync never reach the coordinator', () => {
    assert.deepEqual(dispatch(envelope('withdraw', B, step, {}), state, entropy), {to: 'event', event: {type: 'withdraw', id: B}})
    assert.deepEqual(dispatch(envelope('addresses', B, step, {p2p_addrs: ['/ip4/1.2.3.4/tcp/1']}), state, entropy), {to: 'addresses', addrs: ['/ip4/1.2.3.4/tcp/1']})
    assert.equal(dispatch(envelope('scores', B, step, {scores: []}), state, entropy).to, 'scores')
    assert.equal(dispatch(envelope('resync', B, step, {}), state, entropy).to, 'resync')
  })
})

describe('verdict: how the outcome of a client event is answered', () => {
  const who = {peer: '127.0.0.1:1', client: A, of: 'witness'}

  it('a join is logged as joined; a client already in the run (a reconnect) as rejoined, not refused', () => {
    assert.deepEqual(verdict({type: 'join', id: A}, undefined, {...who, of: 'hello'}), {ok: true, line: {event: 'joined', peer: who.peer, client: A}})
    assert.deepEqual(verdict({type: 'join', id: A}, {code: 'AlreadyJoined', message: 'in the run'}, {...who, of: 'hello'}), {
      ok: true,
      line: {event: 'rejoined', peer: who.peer, client: A, detail: 'in the run'},
    })
  })

  it("any other refusal is answered with the coordinator's or the admission's code", () => {
    assert.deepEqual(verdict({type: 'join', id: A}, {code: 'run_full', message: 'full'}, who), {ok: false, code: 'run_full', reason: 'full'})
    assert.deepEqual(verdict({type: 'withdraw', id: A}, {code: 'AlreadyJoined', message: 'x'}, who), {ok: false, code: 'AlreadyJoined', reason: 'x'})
    assert.deepEqual(verdict({type: 'withdraw', id: A}, undefined, {...who, of: 'withdraw'}), {ok: true, line: {event: 'accepted', peer: who.peer, client: A, kind: 'withdraw'}})
  })
})
