import assert from 'node:assert/strict'
import {test} from 'node:test'
import {describeEvent, eventSeverity} from '../../src/core/obs/event-text.js'
import {viewLines} from '../../src/core/obs/terminal-view.js'

test('news and problems are told apart, each as a sentence rather than raw JSON', () => {
  const loaded = {event: 'model_loaded', step: 4, source: 'peers', param_hash: 'abcdef0123456789'}
  assert.equal(eventSeverity(loaded), 'info')
  assert.equal(describeEvent(loaded), 'model loaded at step 4 from peers (hash abcdef012345)')
  assert.equal(eventSeverity({event: 'rejoining'}), 'info')
  assert.match(describeEvent({event: 'rejoining', run_state: 'RoundTrain'}), /^rejoining the run at its next epoch/)
  assert.equal(eventSeverity({event: 'health_check'}), 'warning')
  assert.equal(eventSeverity({event: 'worker_crashed'}), 'error')
  assert.equal(describeEvent({event: 'worker_crashed', message: 'exit 9', restarting: true}), 'worker crashed: exit 9 (restarting it)')
  const other = describeEvent({event: 'peer_record_closed', address: 'Abc', source: 'p2p'})
  assert.equal(other, 'peer record closed: address Abc')
  for (const e of [loaded, {event: 'rejoining', run_state: 'Warmup'}, {event: 'rejected', code: 'EBAD', reason: 'bad signature'}]) assert.doesNotMatch(describeEvent(e), /[{}"]/)
})

test('the view shows news apart from warnings, and no dashes for clients that have not reported', () => {
  const lines = viewLines({
    title: 't',
    clients: [
      {name: 'a', state: 'Healthy', step: 3, loss: 2.5},
      {name: 'b', state: 'Pending'},
    ],
    losses: [],
    warnings: ['health check at step 3: nobody accused'],
    notes: ['model loaded at step 4 from peers'],
  })
  assert.ok(lines.includes('  a                  Healthy    step 3     loss 2.500'), lines.join('\n'))
  assert.ok(lines.includes('  b                  Pending   '), lines.join('\n'))
  assert.ok(lines.includes('· model loaded at step 4 from peers'))
  assert.ok(lines.includes('! health check at step 3: nobody accused'))
})
