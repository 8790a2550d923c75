import assert from 'node:assert/strict'
import {describe, it} from 'node:test'
import type {PeerDirectory} from '../../src/core/backend/types.js'
import {CONNECT_MIN_GAP_MS, CONNECT_RETRY_MS, whenToDial, type DialedFrom} from '../../src/core/client/peer-connect.js'
import type {ClientId, CoordinatorState} from '../../src/core/coordinator/index.js'
import {generateIdentity} from '../../src/core/protocol/identity.js'
import {firstRound} from './helpers.js'

describe('when a client hands its P2P layer the run members (pure)', () => {
  const {ids, state} = firstRound(3)
  const [self, b, c] = ids
  const joiner = generateIdentity().id
  const directory: PeerDirectory = {[self]: ['/memory/a'], [b]: ['/memory/b'], [c]: ['/memory/c']}
  const t0 = 1_000_000
  const from = (s: CoordinatorState, peers: PeerDirectory): DialedFrom => ({clients: s.epoch.clients, runState: s.run_state, peers, at: t0})
  const noneConnected = (list: ClientId[]) => list
  const allConnected = () => []
  const when = (last: DialedFrom | undefined, s: CoordinatorState, peers: PeerDirectory, now: number, notConnected: (list: ClientId[]) => ClientId[] = noneConnected) =>
    whenToDial(last, s, peers, now, self, notConnected)

  it('the first state: at once', () => {
    assert.deepEqual(when(undefined, state, directory, t0), {dial: 'plan'})
  })

  it('nothing changed: nothing, then a retry every CONNECT_RETRY_MS', () => {
    const last = from(state, directory)
    assert.deepEqual(when(last, {...state}, directory, t0 + CONNECT_RETRY_MS - 1), {dial: 'no'})
    assert.deepEqual(when(last, {...state}, directory, t0 + CONNECT_RETRY_MS), {dial: 'retry'})
  })

  it('clients joining (churn): held back to CONNECT_MIN_GAP_MS after the last plan', () => {
    const last = from(state, directory)
    const joined = {...directory, [joiner]: ['/memory/j']}
    assert.deepEqual(when(last, state, joined, t0 + 500), {dial: 'later', inMs: CONNECT_MIN_GAP_MS - 500})
    assert.deepEqual(when(last, state, joined, t0 + CONNECT_MIN_GAP_MS), {dial: 'plan'})
    // One leaving is churn too.
    const {[c]: _left, ...without} = directory
    assert.deepEqual(when(last, state, without, t0 + 1), {dial: 'later', inMs: CONNECT_MIN_GAP_MS - 1})
  })

  it("at once when an epoch's clients are set or its Warmup begins, whatever the gap", () => {
    const joined = {...directory, [joiner]: ['/memory/j']}
    const waiting = {...state, run_state: 'WaitingForMembers' as const}
    const warmup = {...state, run_state: 'Warmup' as const}
    assert.deepEqual(when(from(waiting, directory), warmup, joined, t0 + 1), {dial: 'plan'})
    assert.deepEqual(when(from(state, directory), {...state, epoch: {...state.epoch, clients: [...state.epoch.clients]}}, directory, t0 + 1), {dial: 'plan'})
    // Within Warmup, a joiner for the next epoch is churn.
    assert.deepEqual(when(from(warmup, directory), warmup, joined, t0 + 1), {dial: 'later', inMs: CONNECT_MIN_GAP_MS - 1})
  })

  it('at once when a member of the epoch is new to us during an epoch', () => {
    const {[c]: _late, ...withoutC} = directory
    assert.deepEqual(when(from(state, withoutC), state, directory, t0 + 1), {dial: 'plan'})
    // Before an epoch, a new member is a joiner: churn.
    const waiting = {...state, run_state: 'WaitingForMembers' as const}
    assert.deepEqual(when(from(waiting, withoutC), waiting, directory, t0 + 1), {dial: 'later', inMs: CONNECT_MIN_GAP_MS - 1})
  })

  it("at once when a member we dial and are not connected to has new addresses (its relayed one); a connected member's wait", () => {
    const moved = {...directory, [b]: ['/memory/b', '/memory/relay/b']}
    const last = from(state, directory)
    let asked: ClientId[] = []
    assert.deepEqual(
      when(last, state, moved, t0 + 1, (list) => {
        asked = list
        return list
      }),
      {dial: 'plan'},
    )
    assert.deepEqual(asked, [b])
    assert.deepEqual(when(last, state, moved, t0 + 1, allConnected), {dial: 'later', inMs: CONNECT_MIN_GAP_MS - 1})
    // Our own entry is never dialled.
    assert.deepEqual(when(last, state, {...directory, [self]: ['/memory/a2']}, t0 + 1), {dial: 'later', inMs: CONNECT_MIN_GAP_MS - 1})
  })
})
