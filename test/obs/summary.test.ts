import assert from 'node:assert/strict'
import {join} from 'node:path'
import {test} from 'node:test'
import {loadRunConfigFile} from '../../src/core/config/index.js'
import {createCoordinator} from '../../src/core/coordinator/index.js'
import type {CoordinatorState} from '../../src/core/coordinator/types.js'
import {summarizeRun, timeLeftText, waitingFor} from '../../src/core/obs/summary.js'
import {projectRoot} from '../../src/core/worker/python.js'

// The tiny-demo run (epoch_time 60, cooldown_time 2, waiting_for_members_extra_time 1, warmup_time 5), made to wait for 2.
const T = 1_800_000_000_000 // unix milliseconds, as the coordinator keeps them
async function demo(): Promise<CoordinatorState> {
  const file = await loadRunConfigFile(join(projectRoot, 'templates', 'tiny-demo', 'state.toml'))
  const s = createCoordinator(file, {now: T})
  return {...s, config: {...s.config, init_min_clients: 2}}
}
const at = (ms: number) => (T + ms) / 1000

test('a client waiting for members says how many have joined and how many the epoch needs', async () => {
  const s = {...(await demo()), pending: ['me']}
  const w = waitingFor(s, 'me', at(3000))
  assert.equal(w?.reason, 'members')
  assert.equal(w?.seconds, null)
  assert.match(
    w!.detail,
    /1 of 2 clients have joined; the epoch starts once 2 have \(init_min_clients: every epoch waits for that many, the first and every later one, as in Psyche\)/,
  )
  const enough = waitingFor({...s, pending: ['me', 'other'], run_state_start: T + 3000}, 'me', at(3400))
  assert.match(enough!.detail, /2 clients have joined; the epoch starts in ~1 s/)
})

test('a client that joined mid-epoch joins at the next epoch, in about the time the epoch has left', async () => {
  const base = await demo()
  const s: CoordinatorState = {
    ...base,
    run_state: 'RoundTrain',
    run_state_start: T + 20_000,
    epoch: {...base.epoch, start_time: T, clients: [{id: 'a', state: 'Healthy'}]},
    pending: ['me'],
  }
  const w = waitingFor(s, 'me', at(20_100))
  assert.equal(w?.reason, 'next_epoch')
  // 60 s epoch from T: 39.9 s left, then 2 s cooldown and 1 s waiting for members.
  assert.equal(Math.round(w!.seconds!), 43)
  assert.match(w!.detail, /^joins at the next epoch, in ~43 s \(epoch 0 is under way with 1 client\)$/)
  assert.equal(waitingFor(s, 'a', at(20_100)), null, 'a client training in the epoch waits for nothing')
  assert.equal(waitingFor({...s, run_state: 'Finished'}, 'me', at(20_100)), null)
  assert.equal(waitingFor({...s, run_state: 'Paused'}, 'me', at(20_100))?.reason, 'paused')
  const cooling = waitingFor({...s, run_state: 'Cooldown', run_state_start: T + 60_500}, 'me', at(61_000))
  assert.equal(cooling?.seconds, 2.5)
})

test("during rounds the time left is the epoch's, not the round's timeout", async () => {
  const base = await demo()
  const s: CoordinatorState = {...base, run_state: 'RoundTrain', run_state_start: T + 20_000, epoch: {...base.epoch, start_time: T}}
  const summary = summarizeRun(s, at(20_200))
  assert.equal(summary.phase_time_left_seconds, 19.8, 'max_round_train_time 20 s: only a timeout')
  assert.equal(summary.epoch_time_left_seconds, 39.8)
  assert.equal(timeLeftText(summary), 'epoch ends in ~40s')
  const warmup = summarizeRun({...s, run_state: 'Warmup', run_state_start: T}, at(1000))
  assert.equal(timeLeftText(warmup), '4s left')
})
