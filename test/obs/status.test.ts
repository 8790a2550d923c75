import assert from 'node:assert/strict'
import {after, describe, it} from 'node:test'
import {CoordinatorConnection} from '../../src/core/backend/index.js'
import {generateIdentity} from '../../src/core/protocol/index.js'
import {RUN_ID, startTestServer, waitUntil, writeRunConfig, type TestServer} from '../backend/helpers.js'
import {runCli, tempDir} from '../helpers.js'

describe('psyche status', () => {
  const dir = tempDir('psyche-status-')
  let t: TestServer | undefined
  const conns: CoordinatorConnection[] = []
  after(async () => {
    for (const c of conns) await c.close()
    await t?.server.stop()
    dir.cleanup()
  })

  it('--json: the run as the coordinator holds it, without joining; plain text names the phase and the clients', async () => {
    t = await startTestServer(writeRunConfig(dir.path, {init_min_clients: 2, warmup_time: 30}))
    for (let i = 0; i < 2; i++)
      conns.push(await CoordinatorConnection.connect({addr: t.addr, runId: RUN_ID, identity: generateIdentity(), p2pAddrs: [`/ip4/127.0.0.1/tcp/${4000 + i}`], join: true}))
    t.clock.advance(2) // waiting_for_members_extra_time: the epoch starts
    await waitUntil(() => t!.server.state.run_state === 'Warmup', 'Warmup')
    t.clock.advance(4)

    const r = await runCli(['status', '--server-addr', t.addr, '--json'])
    assert.equal(r.exitCode, 0, r.stderr)
    const s = JSON.parse(r.stdout)
    assert.equal(s.run_id, RUN_ID)
    assert.equal(s.run_state, 'Warmup')
    assert.equal(s.step, 1)
    assert.equal(s.epoch, 0)
    assert.equal(s.phase_elapsed_seconds, 4)
    assert.equal(s.phase_time_left_seconds, 26)
    assert.deepEqual(s.clients_by_state, {healthy: 2, dropped: 0, withdrawn: 0, ejected: 0, pending: 0})
    assert.deepEqual(s.clients.map((c: {id: string}) => c.id).sort(), t.server.state.epoch.clients.map((c) => c.id).sort())
    assert.equal(s.peers, 2)
    assert.equal(s.round, null)
    assert.deepEqual(s.scores, []) // no verifier has reported yet (scores: test/backend/server.test.ts, test/adversarial)
    // It watched, it did not join: the run still has exactly its two clients and nobody pending.
    assert.equal(t.server.state.epoch.clients.length, 2)
    assert.equal(t.server.state.pending.length, 0)

    const text = await runCli(['status', '--server-addr', t.addr])
    assert.equal(text.exitCode, 0, text.stderr)
    assert.match(text.stdout, /run tiny-demo: Warmup \(4s in phase, 26s left\)/)
    assert.match(text.stdout, /clients: 2 healthy, 0 dropped/)

    const wrong = await runCli(['status', '--server-addr', t.addr, '--run-id', 'other-run'])
    assert.notEqual(wrong.exitCode, 0)
    assert.match(wrong.stderr, /other-run/)
  })

  it('a server that is not there: a clear error, non-zero exit', async () => {
    const r = await runCli(['status', '--server-addr', '127.0.0.1:1', '--timeout', '1'])
    assert.notEqual(r.exitCode, 0)
    assert.match(r.stderr, /coordinator 127\.0\.0\.1:1/)
  })
})
