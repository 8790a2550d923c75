import assert from 'node:assert/strict'
import {describe, it} from 'node:test'
import {StepLedger} from '../../src/core/client/ledger.js'
import type {Round} from '../../src/core/coordinator/index.js'

const round = (step: number) => ({step}) as unknown as Round

describe('StepLedger: one record per step, pruned together', () => {
  it('derives the decide.ts view (witness sent, health checked, final rounds, results) from the records', () => {
    const l = new StepLedger()
    l.at(3).witnessSent = true
    l.at(2).healthChecked = true
    l.at(2).finalRound = round(2)
    l.at(4).results.set('bob', {client_id: 'bob', step: 4, batch_start: 0, batch_end: 2, commitment: 'aa'})
    l.at(5) // an empty record adds nothing to the views
    assert.deepEqual([...l.witnessSent()], [3])
    assert.deepEqual([...l.healthChecked()], [2])
    assert.deepEqual([...l.finalRounds().keys()], [2])
    assert.deepEqual([...l.results().keys()], [4])
    assert.equal(l.results().get(4)!.get('bob')!.commitment, 'aa')
    assert.equal(l.get(6), undefined, 'get() creates nothing')
    assert.deepEqual(l.steps(), [2, 3, 4, 5])
  })

  it('pruneBefore(step) forgets every earlier step and keeps the rest untouched', () => {
    const l = new StepLedger()
    for (let s = 1; s <= 6; s++) {
      const r = l.at(s)
      r.witnessSent = true
      r.trained = {loss: s, resultBytes: 10, computeMs: 1}
    }
    l.pruneBefore(4)
    assert.deepEqual(l.steps(), [4, 5, 6])
    assert.deepEqual([...l.witnessSent()].sort(), [4, 5, 6])
    assert.equal(l.get(5)!.trained!.loss, 5)
    assert.equal(l.at(4), l.at(4), 'the same record is returned on each access')
  })

  it('forgetWitnessesSent clears only the witness flags (after a reconnect)', () => {
    const l = new StepLedger()
    l.at(1).witnessSent = true
    l.at(1).healthChecked = true
    l.at(2).witnessSent = true
    l.forgetWitnessesSent()
    assert.equal(l.witnessSent().size, 0)
    assert.deepEqual([...l.healthChecked()], [1])
  })
})
