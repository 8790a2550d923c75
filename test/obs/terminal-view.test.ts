import assert from 'node:assert/strict'
import {describe, it} from 'node:test'
import type {HistoryPoint} from '../../src/core/obs/history.js'
import {historyFigures, sparkline, viewLines} from '../../src/core/obs/terminal-view.js'

const point = (step: number, loss: number | null, val: number | null): HistoryPoint => ({
  step,
  epoch: 0,
  time: step * 1000,
  round_seconds: 2,
  compute_seconds: 1,
  coordination_seconds: 1,
  trainers: 2,
  witnesses: 1,
  loss,
  val_loss: val,
  tokens_per_second: 1000 + step,
  bytes_in: 100,
  bytes_out: 50,
  applied: 2,
  accepted: 2,
  reports: 2,
})

describe('terminal view lines (what the ink view draws)', () => {
  it('the loss line has the sparkline and, once clients evaluated, the latest validation loss', () => {
    const points = [point(1, 8.3, null), point(2, 8.1, 8.2), point(3, 7.9, null), point(4, 7.6, 7.8), point(5, null, null)]
    const figures = historyFigures(points)
    assert.deepEqual(figures.losses, [8.3, 8.1, 7.9, 7.6])
    assert.equal(figures.valLoss, 7.8, 'the latest round that has one')
    assert.equal(figures.bytesIn, 500)
    const lines = viewLines({title: 't', clients: [], warnings: [], ...figures})
    assert.equal(lines[1], `loss 7.600 ${sparkline([8.3, 8.1, 7.9, 7.6])}   validation 7.800`)
    assert.equal(sparkline([8.3, 8.1, 7.9, 7.6]), '█▆▄▁')
    const before = viewLines({title: 't', clients: [], warnings: [], ...historyFigures(points.slice(0, 1))})
    assert.equal(before[1], `loss 8.300 ▄`, 'no validation yet: nothing shown for it')
  })
})
