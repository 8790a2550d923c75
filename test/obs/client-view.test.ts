import assert from 'node:assert/strict'
import {describe, it} from 'node:test'
import type {CoordinatorState} from '../../src/core/coordinator/index.js'
import type {EventLine, RoundEvent} from '../../src/core/events.js'
import {ClientEventRenderer, WaitingEvents} from '../../src/core/obs/client-view.js'
import {RoundReporter} from '../../src/core/obs/report.js'
import {MAX_SAVE_FAILURE_CHARS} from '../../src/core/protocol/messages.js'
import {joinAll, newRun, toFirstRound} from '../coordinator/helpers.js'

const round: RoundEvent = {
  event: 'round',
  step: 7,
  epoch: 1,
  loss: 2.5,
  param_hash: 'ab'.repeat(32),
  applied: 3,
  trainers: 3,
  peers_applied: 2,
  peers_accepted: 2,
  other_trainers: 2,
  result_bytes: 100,
  compute_ms: 1000,
  apply_ms: 5,
  bytes_in: 2_000_000,
  bytes_out: 1_000_000,
  peers: 2,
  conn_direct: 2,
  conn_relayed: 0,
  val_loss: null,
  eval_ms: null,
  peer_bytes: {},
  relayed_in: 0,
  relayed_out: 0,
  peer_relayed_bytes: {},
  rounds_without_exchange: 0,
}

function renderer(mode: 'json' | 'live' | 'plain', state?: CoordinatorState) {
  const out: string[] = []
  const notes: string[] = []
  const r = new ClientEventRenderer({mode, seqLen: 16, write: (l) => out.push(l), note: (l) => notes.push(l), state: () => state})
  return {r, out, notes}
}

describe("join's events as shown (obs/client-view.ts)", () => {
  it('--json: every event is one JSON line, as it is', () => {
    const {r, out, notes} = renderer('json')
    r.render(round)
    r.render({event: 'model_loaded', step: 0, source: 'checkpoint', param_hash: 'cd'.repeat(32)} as EventLine)
    assert.deepEqual(
      out.map((l) => JSON.parse(l)),
      [round, {event: 'model_loaded', step: 0, source: 'checkpoint', param_hash: 'cd'.repeat(32)}],
    )
    assert.ok(out.every((l) => l.endsWith('}\n') && !l.slice(0, -1).includes('\n')))
    assert.deepEqual(notes, [])
  })

  it('piped: a line for a round, a warning, a saved model, a lost connection; nothing for the rest', () => {
    const {r, notes, out} = renderer('plain')
    r.render(round)
    r.render({...round, step: 8, loss: null, rounds_without_exchange: 2, relayed_in: 1_000_000, relayed_out: null})
    r.render({event: 'checkpoint_saved', step: 8, epoch: 1, dir: '/tmp/m', param_hash: null})
    r.render({event: 'disconnected', addr: '127.0.0.1:5000', source: 'coordinator'} as EventLine)
    r.render({event: 'model_loaded', step: 0, source: 'peers', param_hash: 'cd'.repeat(32)} as EventLine)
    r.render({event: 'trained', step: 8} as EventLine)
    assert.deepEqual(out, [])
    assert.equal(notes[0], `round 7 (epoch 1)  loss 2.500  hash ${'ab'.repeat(6)}  peers' results applied 2/2 accepted (2 others trained)  connected 2  in 2.00 MB  out 1.00 MB`)
    assert.match(notes[1], /^round 8 \(epoch 1\) {2}loss {3}- {4}.* \(relayed in 1\.00 MB out 0\.00 MB\) {2}NO EXCHANGE: no peer's result for 2 round\(s\)$/)
    assert.equal(notes[2], 'model saved to /tmp/m (step 8, epoch 1)')
    assert.equal(notes[3], 'disconnected from the coordinator 127.0.0.1:5000; reconnecting')
    assert.match(notes[4], /^model loaded at step 0 from peers/)
    assert.equal(notes.length, 5)
  })

  it("a finished run's server closing the connection is not news", () => {
    const {state} = toFirstRound(['a', 'b', 'c'])
    const {r, notes} = renderer('plain', {...state, run_state: 'Finished'})
    r.render({event: 'disconnected', addr: '127.0.0.1:5000', source: 'coordinator'} as EventLine)
    assert.deepEqual(notes, [])
  })

  it("on a terminal: the live view's figures from the round events; news and problems listed apart", () => {
    const {state} = toFirstRound(['a', 'b', 'c'])
    const {r, notes, out} = renderer('live', state)
    r.render({event: 'trained', step: 7, batches: 4, compute_ms: 1000} as EventLine)
    r.render(round)
    r.render({event: 'model_loaded', step: 0, source: 'peers', param_hash: 'cd'.repeat(32)} as EventLine)
    r.render({event: 'out_of_sync', step: 3, detail: 'results never came'} as EventLine)
    assert.deepEqual([notes, out], [[], []], 'the view draws; nothing is printed')
    const view = r.view({title: 't', me: 'a', nowSeconds: 0})
    assert.deepEqual(view.losses, [2.5])
    assert.equal(view.tokensPerSecond, (4 * 16) / 1, 'batches × seqLen per compute second')
    assert.equal(view.applied, 3)
    assert.deepEqual(view.peers, {all: 2, direct: 2, relayed: 0})
    assert.equal(view.clients.find((c) => c.name.endsWith('(me)'))?.step, 7)
    assert.equal(view.notes!.length, 1)
    assert.match(view.warnings[0], /out of sync: results never came$/)
  })

  it('a failed checkpoint save: an error on our row of the live view, with the step and the reason, until a save succeeds', () => {
    const {state} = toFirstRound(['a', 'b', 'c'])
    const {r} = renderer('live', state)
    const me = () => r.view({title: 't', me: 'a', nowSeconds: 0}).clients.find((c) => c.name.endsWith('(me)'))!
    r.render(round)
    assert.equal(me().note, undefined)
    r.render({event: 'checkpoint_save_failed', step: 7, message: '/data/step-7: No space left on device'})
    assert.equal(me().note, 'CHECKPOINT NOT SAVED (step 7): /data/step-7: No space left on device')
    const view = r.view({title: 't', me: 'a', nowSeconds: 0})
    assert.match(view.warnings.at(-1)!, /could not save the model at step 7: \/data\/step-7: No space left on device$/)
    assert.equal(view.notes!.length, 0, 'an error, not news')
    r.render({event: 'checkpoint_saved', step: 9, epoch: 2, dir: '/data/step-9', param_hash: null})
    assert.equal(me().note, undefined, 'cleared by the next save that succeeds')
  })

  it("the reports sent to the coordinator carry a failed save: the last round's report again at once, then every report until a save succeeds", () => {
    const reporter = new RoundReporter(16)
    assert.equal(reporter.observe({event: 'checkpoint_save_failed', step: 3, message: 'full'}), undefined, 'no round reported yet: nothing to send')
    const first = reporter.observe(round)!
    assert.deepEqual(first.report.checkpoint_save_failed, {step: 3, message: 'full'}, 'a failure before the first report is carried by it')
    reporter.observe({event: 'checkpoint_saved', step: 7, epoch: 1, dir: '/d', param_hash: null})
    assert.equal(reporter.observe({event: 'checkpoint_saved', step: 7, epoch: 1, dir: '/d', param_hash: null}), undefined, 'nothing changed: nothing sent')
    const again = reporter.observe({event: 'checkpoint_save_failed', step: 7, message: 'disk\nfull\u001b[0m ' + 'x'.repeat(400)})!
    assert.equal(again.step, 7, "the last round's report, sent again")
    assert.equal(again.report.loss, 2.5)
    assert.equal(again.report.checkpoint_save_failed!.step, 7)
    assert.match(again.report.checkpoint_save_failed!.message, /^disk full \[0m x+…$/, 'one printable line')
    assert.equal(again.report.checkpoint_save_failed!.message.length, MAX_SAVE_FAILURE_CHARS)
    assert.deepEqual(reporter.observe({...round, step: 8})!.report.checkpoint_save_failed?.step, 7, 'every report until a save succeeds')
    const cleared = reporter.observe({event: 'checkpoint_saved', step: 9, epoch: 2, dir: '/d', param_hash: null})!
    assert.equal(cleared.step, 8)
    assert.equal('checkpoint_save_failed' in cleared.report, false)
    assert.equal('checkpoint_save_failed' in reporter.observe({...round, step: 9})!.report, false)
  })

  it('waiting: what the client waits for, once per change', () => {
    const logged: EventLine[] = []
    const w = new WaitingEvents((e) => logged.push(e))
    const state = joinAll(newRun(), ['a'], 0)
    w.check(state, 'a', 0)
    w.check(state, 'a', 1)
    assert.equal(logged.length, 1)
    assert.match(String((logged[0] as {detail: string}).detail), /waiting for members: 1 of 3 clients have joined/)
    w.check(joinAll(state, ['b'], 0), 'a', 2)
    assert.equal(logged.length, 2)
  })
})
