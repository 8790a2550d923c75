import assert from 'node:assert/strict'
import {test} from 'node:test'
import {Scorer} from '../../src/core/verify/score.js'
import {ScoreBoard} from '../../src/core/verify/scoreboard.js'

test("ScoreBoard: per client, a moving average over steps of each step's mean report, the same as each verifier's Scorer", () => {
  const board = new ScoreBoard(0.5, 3)
  const scorer = new Scorer()
  const steps = [0.05, 0.15, -0.02]
  for (const [i, score] of steps.entries()) {
    // Three verifiers report the same score for the step (they compute it from the same bytes and data).
    for (const v of ['v1', 'v2', 'v3']) assert.ok(board.report(v, i + 1, [{client_id: 'x', score}]))
    scorer.add('x', score)
  }
  const [x] = board.all()
  assert.equal(x.count, 9)
  assert.equal(x.verifiers, 3)
  assert.equal(x.last_step, 3)
  assert.ok(Math.abs(x.last + 0.02) < 1e-12)
  assert.ok(Math.abs(x.average - scorer.get('x')!.average) < 1e-12, `${x.average} vs ${scorer.get('x')!.average}`)
  // Disagreeing verifiers: the step's mean counts.
  board.report('v1', 4, [{client_id: 'y', score: 0.4}])
  board.report('v2', 4, [{client_id: 'y', score: 0.2}])
  assert.ok(Math.abs(board.all().find((e) => e.client_id === 'y')!.average - 0.3) < 1e-12)
  // A verifier reports a step once; an older step than one scored no longer counts; nobody scores itself.
  assert.equal(board.report('v1', 4, [{client_id: 'y', score: -1}]), false)
  board.report('v3', 3, [{client_id: 'y', score: -1}])
  board.report('y', 5, [{client_id: 'y', score: 1}])
  assert.equal(board.all().find((e) => e.client_id === 'y')!.count, 2)
})

test('ScoreBoard: bounded (least recently scored go first) and forgets clients that left', () => {
  const board = new ScoreBoard(0.5, 3)
  for (const [i, id] of ['a', 'b', 'c', 'd'].entries()) board.report('v', i + 1, [{client_id: id, score: 0.1}])
  assert.deepEqual(
    board.all().map((e) => e.client_id),
    ['b', 'c', 'd'],
  )
  board.forget((id) => id !== 'c')
  assert.deepEqual(
    board.all().map((e) => e.client_id),
    ['b', 'd'],
  )
})
