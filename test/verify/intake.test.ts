import assert from 'node:assert/strict'
import {test} from 'node:test'
import {signAnnouncement} from '../../src/core/primitives/announcement.js'
import {resultCommitment} from '../../src/core/primitives/pieces.js'
import {identityFromSeed} from '../../src/core/protocol/identity.js'
import {checkEquivocation} from '../../src/core/coordinator/equivocation.js'
import {FORMAT_INVALID, ResultIntake} from '../../src/core/verify/intake.js'
import {resultSize, type ResultFormat} from '../../src/core/verify/result.js'

// A one-tensor model: 8 elements in one chunk, top-2, sign values. A valid result is built by hand here.
const format: ResultFormat = {value_format: 'sign', tensors: [{name: 'w', shape: [8], chunk: [8], topk: 2}]}

function result(i: number, j: number, signs = 0): Buffer {
  // header, name, ndim 1, shape 8, chunk 8, topk 2, indices (3 bits each, LSB-first), 2 sign bits
  return Buffer.concat([
    Buffer.from('PSDR', 'latin1'),
    Buffer.from([1, 0, 1, 0, 0, 0]),
    Buffer.from([1, 0]),
    Buffer.from('w'),
    Buffer.from([1, 8, 0, 0, 0, 8, 0, 0, 0, 2, 0, 0, 0]),
    Buffer.from([i | (j << 3)]),
    Buffer.from([signs]),
  ])
}

const alice = identityFromSeed(Buffer.alloc(32, 1))
const bob = identityFromSeed(Buffer.alloc(32, 2))

function announce(who: typeof alice, step: number, bytes: Uint8Array) {
  return signAnnouncement(who, {run_id: 'r', step, client_id: who.id, batch_start: 0, batch_end: 1, commitment: resultCommitment(bytes), size: bytes.length})
}

test('the hand-built result is valid and the size is what resultSize says', () => {
  assert.equal(result(1, 2).length, resultSize(format))
  const intake = new ResultIntake(format)
  assert.equal(intake.bytes(announce(alice, 1, result(1, 2)), result(1, 2)), undefined)
})

test('bytes: format failures are prefixed, copies and replays are named', () => {
  const intake = new ResultIntake(format)
  const dup = result(3, 3)
  assert.equal(intake.bytes(announce(alice, 1, dup), dup), `${FORMAT_INVALID}tensor 0 (w): duplicate index in chunk 0`)
  const r1 = result(1, 2)
  assert.equal(intake.bytes(announce(alice, 1, r1), r1), undefined)
  assert.equal(intake.bytes(announce(alice, 1, r1), r1), undefined) // the same result again is no offence
  assert.match(intake.bytes(announce(bob, 1, r1), r1)!, /^copy: the same result as [0-9a-f]+'s for step 1/)
  assert.match(intake.bytes(announce(alice, 2, r1), r1)!, /^replay: the same result as its own for step 1/)
  // Our own result is recorded: a peer re-signing it is a copy.
  const mine = result(0, 5, 1)
  intake.own(announce(bob, 3, mine))
  assert.match(intake.bytes(announce(alice, 3, mine), mine)!, /^copy/)
  // Replays are remembered for keepSteps steps, then forgotten.
  intake.forget(30, 16)
  assert.equal(intake.bytes(announce(alice, 30, r1), r1), undefined)
})

test('announcements: a second different one by the same producer and step is an equivocation with a checkable proof; wrong sizes are refused', () => {
  const intake = new ResultIntake(format)
  const a = announce(alice, 4, result(1, 2))
  assert.deepEqual(intake.announcement(a), {ok: true})
  assert.deepEqual(intake.announcement(a), {ok: true})
  const b = announce(alice, 4, result(1, 3))
  const v = intake.announcement(b)
  assert.equal(v.ok, false)
  assert.ok(!v.ok && 'proof' in v)
  assert.deepEqual(checkEquivocation(v.proof, 'r'), {ok: true, producer: alice.id, step: 4})
  // Another step is no equivocation.
  assert.deepEqual(intake.announcement(announce(alice, 5, result(1, 3))), {ok: true})
  const huge = Buffer.alloc(1 << 20)
  const refused = intake.announcement(announce(bob, 4, huge))
  assert.ok(!refused.ok && refused.reason.startsWith(FORMAT_INVALID) && /announced size 1048576/.test(refused.reason))
})
