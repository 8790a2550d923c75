import assert from 'node:assert/strict'
import {existsSync, readFileSync, readdirSync, renameSync, rmSync, writeFileSync} from 'node:fs'
import {join} from 'node:path'
import {test} from 'node:test'
import {CoordinatorConnection, SAVED_IDENTITY_FILE, SAVED_STATE_FILE} from '../../src/core/backend/index.js'
import {buildWitnessProof, deserializeState} from '../../src/core/coordinator/index.js'
import type {CoordinatorState} from '../../src/core/coordinator/types.js'
import {PsycheError} from '../../src/core/errors.js'
import {saveStatusText} from '../../src/core/obs/summary.js'
import {generateIdentity} from '../../src/core/protocol/index.js'
import {tempDir} from '../helpers.js'
import {Clock, RUN_ID, aliveProof, nextRound, startTestServer, waitUntil, writeRunConfig, nextState} from './helpers.js'

test('a stopped server restarted from --save-state-dir resumes the run; the client reconnects and training goes on', async () => {
  const dir = tempDir()
  const saveDir = join(dir.path, 'saved')
  const statePath = writeRunConfig(dir.path)
  const clock = new Clock()
  const alice = generateIdentity()
  let c: CoordinatorConnection | undefined
  let second: Awaited<ReturnType<typeof startTestServer>> | undefined
  try {
    const first = await startTestServer(statePath, {saveStateDir: saveDir, clock})
    c = await CoordinatorConnection.connect({addr: first.addr, runId: RUN_ID, identity: alice, p2pAddrs: ['/ip4/127.0.0.1/tcp/4001'], join: true})
    clock.advance(2)
    await nextState(c, (s) => s.run_state === 'Warmup')
    c.sendWarmupReady()
    const round1 = await nextState(c, (s) => s.run_state === 'RoundTrain')

    // Every transition is on disk, atomically: the file is the state, and no temporary file is left.
    const saved = JSON.parse(readFileSync(join(saveDir, SAVED_STATE_FILE), 'utf8'))
    assert.deepEqual(deserializeState(saved.state), first.server.state)
    assert.deepEqual(saved.peers, {[alice.id]: ['/ip4/127.0.0.1/tcp/4001']})
    assert.deepEqual(readdirSync(saveDir).sort(), [SAVED_STATE_FILE, SAVED_IDENTITY_FILE].sort())

    const before = first.server.state
    const port = first.server.port
    const disconnected = new Promise((r) => c!.once('disconnected', r))
    await first.server.stop()
    await disconnected
    // Stopping is not leaving: the client was not withdrawn.
    assert.equal(
      first.logs.some((l) => l.event === 'withdrawn'),
      false,
    )

    const reconnected = new Promise((r) => c!.once('reconnected', r))
    second = await startTestServer(statePath, {saveStateDir: saveDir, clock, port})
    const resumed = await second.waitLog({event: 'resumed'})
    assert.equal(resumed.run_state, 'RoundTrain')
    assert.equal(resumed.step, 1)
    assert.deepEqual(second.server.state, before)
    assert.equal(second.server.identity.id, first.server.identity.id, 'the server keeps its identity across restarts')
    await reconnected
    await second.waitLog({event: 'rejoined', client: alice.id})
    assert.equal(c.state?.run_state, 'RoundTrain')
    assert.deepEqual(c.state?.epoch.clients, [{id: alice.id, state: 'Healthy'}])

    // Training resumes: the witness proof for step 1 (which saw alice's result: a trainer its quorum did not see is
    // dropped when the round closes) ends the round, at once (every witness saw every trainer) or after the witness
    // phase, and step 2 begins.
    const r1 = round1.epoch.round!
    const round2 = new Promise<CoordinatorState>((resolve) => {
      const on = (s: CoordinatorState) => {
        if (s.run_state === 'RoundWitness') clock.advance(2)
        if (s.run_state === 'RoundTrain' && s.progress.step === 2) {
          c!.off('state', on)
          resolve(s)
        }
      }
      c!.on('state', on)
    })
    assert.ok(c.sendWitness(1, buildWitnessProof({}, r1, [{id: alice.id, range: {start: r1.data_index, end: r1.data_index + r1.batch_size}, commitment: Buffer.alloc(32, 7)}])))
    assert.notEqual((await round2).epoch.round?.seed, round1.epoch.round?.seed)
  } finally {
    await c?.close()
    await second?.server.stop()
    dir.cleanup()
  }
})

test("a saved state that is not this run's, or not a state at all, is refused naming the file", async () => {
  const dir = tempDir()
  try {
    const statePath = writeRunConfig(dir.path)
    const saveDir = join(dir.path, 'saved')
    const first = await startTestServer(statePath, {saveStateDir: saveDir})
    await first.server.stop()
    const file = join(saveDir, SAVED_STATE_FILE)
    assert.ok(existsSync(file))
    const saved = JSON.parse(readFileSync(file, 'utf8'))
    writeFileSync(file, JSON.stringify({...saved, state: saved.state.replace('"run_id":"tiny-demo"', '"run_id":"other-run"')}))
    await assert.rejects(
      startTestServer(statePath, {saveStateDir: saveDir}),
      (e: Error) => e instanceof PsycheError && e.message.includes(file) && /run "other-run"/.test(e.message),
    )
    writeFileSync(file, '{"half a file')
    await assert.rejects(startTestServer(statePath, {saveStateDir: saveDir}), (e: Error) => e instanceof PsycheError && e.message.includes(file))
  } finally {
    dir.cleanup()
  }
})

test('a client that connects again replaces its old connection without being withdrawn', async () => {
  const dir = tempDir()
  const t = await startTestServer(writeRunConfig(dir.path))
  const alice = generateIdentity()
  const opts = {addr: t.addr, runId: RUN_ID, identity: alice, p2pAddrs: [], join: true}
  const a1 = await CoordinatorConnection.connect(opts)
  const a1Closed = new Promise((r) => a1.once('closed', r))
  const a2 = await CoordinatorConnection.connect(opts)
  try {
    await t.waitLog({event: 'rejected', code: 'replaced', client: alice.id})
    // The replaced client is told, and does not reconnect to take the identity back.
    await a1Closed
    await waitUntil(() => !a1.connected, 'the old connection to close')
    await new Promise((r) => setTimeout(r, 100))
    assert.deepEqual(t.server.state.pending, [alice.id])
    assert.equal(
      t.logs.some((l) => l.event === 'withdrawn'),
      false,
    )
    assert.deepEqual(t.server.connectedClients, [alice.id])
    assert.ok(a2.connected)
  } finally {
    await Promise.all([a1.close(), a2.close()])
    await t.server.stop()
    dir.cleanup()
  }
})

test('points survive a restart: the rewards ledger is saved with the state and watchers see it', async () => {
  const dir = tempDir()
  const saveDir = join(dir.path, 'saved')
  const statePath = writeRunConfig(dir.path, {epoch_time: 6})
  const clock = new Clock()
  const alice = generateIdentity()
  let c: CoordinatorConnection | undefined
  let watcher: CoordinatorConnection | undefined
  let second: Awaited<ReturnType<typeof startTestServer>> | undefined
  try {
    const first = await startTestServer(statePath, {saveStateDir: saveDir, clock})
    c = await CoordinatorConnection.connect({addr: first.addr, runId: RUN_ID, identity: alice, p2pAddrs: [], join: true})
    clock.advance(2)
    await nextState(c, (s) => s.run_state === 'Warmup')
    c.sendWarmupReady()
    const round1 = await nextState(c, (s) => s.run_state === 'RoundTrain')
    const witnessSelf = (round: CoordinatorState['epoch']['round']) => {
      const range = {start: round!.data_index, end: round!.data_index + round!.batch_size}
      assert.ok(c!.sendWitness(round!.step, buildWitnessProof({}, round!, [{id: alice.id, range, commitment: Buffer.alloc(32, 7)}])))
      return range.end - range.start
    }
    // Alice witnesses her own results (the only trainer): accepted, and the round closes at once. The epoch's time
    // is up during round 2, which ends it.
    let batches = witnessSelf(round1.epoch.round)
    const round2 = await nextState(c, (s) => s.run_state === 'RoundTrain' && s.progress.step === 2)
    clock.advance(7)
    batches += witnessSelf(round2.epoch.round)
    await nextState(c, (s) => s.run_state === 'Cooldown')
    clock.advance(3)
    await nextState(c, (s) => s.progress.epoch === 1)
    const settled = await first.waitLog({event: 'epoch_rewards'})
    assert.deepEqual(settled.clients, [{client_id: alice.id, earned: batches * 1000, slashed: 0}])
    assert.equal(settled.epoch, 0)
    const rows = first.server.rewardRows
    assert.equal(rows.length, 1)
    assert.equal(rows[0].client_id, alice.id)
    assert.equal(rows[0].rounds, 2)
    assert.equal(rows[0].batches, batches)
    assert.equal(rows[0].earned, batches * 1000, 'no verifiers: 1,000 points per accepted batch')
    const saved = JSON.parse(readFileSync(join(saveDir, SAVED_STATE_FILE), 'utf8'))
    assert.equal(saved.rewards.clients[alice.id].earned, rows[0].earned)

    const port = first.server.port
    await first.server.stop()
    second = await startTestServer(statePath, {saveStateDir: saveDir, clock, port})
    await second.waitLog({event: 'resumed'})
    assert.deepEqual(second.server.rewardRows, rows)
    watcher = await CoordinatorConnection.connect({addr: second.addr, runId: RUN_ID, identity: generateIdentity(), p2pAddrs: [], join: false, reconnect: false})
    assert.deepEqual(watcher.rewards, rows)

    // A ledger that does not check out is refused, naming the file.
    await second.server.stop()
    second = undefined
    const file = join(saveDir, SAVED_STATE_FILE)
    const now = JSON.parse(readFileSync(file, 'utf8'))
    now.rewards.clients[alice.id].earned = -5
    writeFileSync(file, JSON.stringify(now))
    await assert.rejects(startTestServer(statePath, {saveStateDir: saveDir, clock}), (e: Error) => e instanceof PsycheError && e.message.includes(file) && /earned/.test(e.message))
  } finally {
    await watcher?.close()
    await c?.close()
    await second?.server.stop()
    dir.cleanup()
  }
})

test('with an identity file, a --save-state-dir that does not exist is created and saved to; the restarted server resumes at the step it was at', async () => {
  const dir = tempDir()
  const saveDir = join(dir.path, 'new', 'saved')
  const statePath = writeRunConfig(dir.path)
  const clock = new Clock()
  const alice = generateIdentity()
  let c: CoordinatorConnection | undefined
  let second: Awaited<ReturnType<typeof startTestServer>> | undefined
  try {
    const identity = generateIdentity()
    const first = await startTestServer(statePath, {saveStateDir: saveDir, identity, clock})
    assert.ok(existsSync(join(saveDir, SAVED_STATE_FILE)), 'the directory was created and the state saved')
    c = await CoordinatorConnection.connect({addr: first.addr, runId: RUN_ID, identity: alice, p2pAddrs: [], join: true})
    clock.advance(2)
    await nextState(c, (s) => s.run_state === 'Warmup')
    c.sendWarmupReady()
    const round1 = await nextState(c, (s) => s.run_state === 'RoundTrain')
    const round2 = nextRound(c, 2, clock)
    assert.ok(c.sendWitness(1, aliveProof(round1, [alice.id])))
    await round2
    assert.equal(first.logs.filter((l) => l.event === 'error').length, 0, JSON.stringify(first.logs.filter((l) => l.event === 'error')))
    const port = first.server.port
    await first.server.stop()
    second = await startTestServer(statePath, {saveStateDir: saveDir, identity, clock, port})
    const resumed = await second.waitLog({event: 'resumed'})
    assert.equal(resumed.step, 2, 'no step lost')
    assert.equal(resumed.run_state, 'RoundTrain')
  } finally {
    await c?.close()
    await second?.server.stop()
    dir.cleanup()
  }
})

test('saves that fail are errors in the log and on watchers (status, dashboard); after --max-save-failures in a row the server halts, and restarted it resumes from the last state saved', async () => {
  const dir = tempDir()
  const saveDir = join(dir.path, 'saved')
  const statePath = writeRunConfig(dir.path)
  const clock = new Clock()
  const alice = generateIdentity()
  let c: CoordinatorConnection | undefined
  let watcher: CoordinatorConnection | undefined
  let second: Awaited<ReturnType<typeof startTestServer>> | undefined
  try {
    const first = await startTestServer(statePath, {saveStateDir: saveDir, clock, maxSaveFailures: 3, passiveStateMs: 0})
    watcher = await CoordinatorConnection.connect({addr: first.addr, runId: RUN_ID, identity: generateIdentity(), p2pAddrs: [], join: false, reconnect: false})
    await waitUntil(() => watcher!.saveState, 'the save status')
    assert.equal(watcher.saveState!.ok, true)
    assert.equal(watcher.saveState!.max_failures, 3)
    c = await CoordinatorConnection.connect({addr: first.addr, runId: RUN_ID, identity: alice, p2pAddrs: [], join: true})
    clock.advance(2)
    await nextState(c, (s) => s.run_state === 'Warmup')
    c.sendWarmupReady()
    const round1 = await nextState(c, (s) => s.run_state === 'RoundTrain')
    await waitUntil(() => watcher!.saveState?.last_saved_step === 1, 'step 1 saved')

    // The disk goes away: the directory is replaced by a file, so every save fails (ENOTDIR).
    renameSync(saveDir, `${saveDir}.away`)
    writeFileSync(saveDir, 'not a directory')
    assert.ok(c.sendWitness(1, buildWitnessProof(round1.config, round1.epoch.round!, [])))
    const error = await first.waitLog({event: 'error', where: 'save'})
    assert.equal(error.failures_in_a_row, 1)
    assert.equal(error.last_saved_step, 1)
    const failing = await waitUntil(() => watcher!.saveState?.ok === false && watcher!.saveState, 'watchers to see the failing save')
    assert.equal(failing.last_saved_step, 1)
    assert.match(String(failing.last_error), /ENOTDIR/)
    assert.match(saveStatusText(failing)!, /^STATE NOT SAVED: \d+ saves? failed in a row \(the server halts at 3\); the last state saved is step 1; last error: .*ENOTDIR/)

    // Failed saves are tried again each second, the state changed or not: the third failure in a row halts the server.
    const halted = await first.server.halted
    assert.match(halted.message, /could not be saved .* 3 times in a row \(--max-save-failures 3\).*the last state saved is step 1/)
    const haltLine = await first.waitLog({event: 'halted'})
    assert.equal(haltLine.last_saved_step, 1)
    assert.equal(first.logs.filter((l) => l.event === 'error' && l.where === 'save').length, 3)
    // Halted: no round starts, and events are refused.
    const stepAtHalt = first.server.state.progress.step
    clock.advance(30)
    await new Promise((r) => setTimeout(r, 200))
    assert.equal(first.server.state.progress.step, stepAtHalt)
    c.sendWarmupReady()
    await first.waitLog({event: 'rejected', code: 'server_halted'})
    const port = first.server.port
    await c.close()
    c = undefined
    await first.server.stop()

    // The disk is back: the restarted server resumes from the last state saved (step 1), not from the start.
    rmSync(saveDir)
    renameSync(`${saveDir}.away`, saveDir)
    second = await startTestServer(statePath, {saveStateDir: saveDir, clock, port})
    const resumed = await second.waitLog({event: 'resumed'})
    assert.equal(resumed.step, 1)
  } finally {
    await watcher?.close()
    await c?.close()
    await second?.server.stop()
    dir.cleanup()
  }
})
