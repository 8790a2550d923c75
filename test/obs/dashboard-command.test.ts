import assert from 'node:assert/strict'
import {after, describe, it} from 'node:test'
import {CoordinatorConnection} from '../../src/core/backend/index.js'
import {generateIdentity} from '../../src/core/protocol/index.js'
import {buildWitnessProof} from '../../src/core/coordinator/index.js'
import {RUN_ID, startTestServer, waitUntil, writeRunConfig, type TestServer} from '../backend/helpers.js'
import {JsonProcess} from '../e2e/helpers.js'
import {runCli, tempDir} from '../helpers.js'

const REPORT = {
  loss: 6.5,
  val_loss: 6.75,
  tokens_per_second: 2048,
  compute_ms: 400,
  apply_ms: 30,
  result_bytes: 5000,
  bytes_in: 9000,
  bytes_out: 4000,
  applied: 1,
  accepted: 1,
  peers: 0,
  // It reached no peer for 4 rounds: the dashboard and psyche status say so.
  rounds_without_exchange: 4,
}

describe('psyche dashboard --server-addr', () => {
  const dir = tempDir('psyche-dashboard-cmd-')
  let t: TestServer | undefined
  const procs: JsonProcess[] = []
  let conn: CoordinatorConnection | undefined
  after(async () => {
    await Promise.all(procs.map((p) => p.stop()))
    await conn?.close()
    await t?.server.stop()
    dir.cleanup()
  })

  it('watches the run without joining: rounds from the state pushes, losses from the reports the coordinator forwards', async () => {
    t = await startTestServer(writeRunConfig(dir.path))
    const dash = new JsonProcess('dashboard', ['dashboard', '--server-addr', t.addr, '--json'])
    procs.push(dash)
    const {url} = (await dash.waitFor((e) => e.event === 'dashboard_listening', 'the dashboard', 60_000)) as {url: string}
    const api = async (path: string) => (await fetch(new URL(path, url))).json()
    const page = await fetch(url)
    assert.match(await page.text(), /<script src="\/uPlot\.iife\.min\.js">/)
    assert.equal((await fetch(new URL('/uPlot.iife.min.js', url))).status, 200, 'uPlot is served by the dashboard itself')

    const identity = generateIdentity()
    conn = await CoordinatorConnection.connect({addr: t.addr, runId: RUN_ID, identity, p2pAddrs: ['/ip4/127.0.0.1/tcp/4001'], join: true})
    t.clock.advance(2)
    await waitUntil(() => t!.server.state.run_state === 'Warmup', 'Warmup')
    conn.sendWarmupReady()
    await waitUntil(() => t!.server.state.run_state === 'RoundTrain', 'RoundTrain')
    const step = t.server.state.progress.step
    assert.ok(conn.sendReport(step, REPORT))
    await t.waitLog({event: 'client_report', client: identity.id})

    type Point = {step: number; loss: number | null; val_loss: number | null; tokens_per_second: number | null}
    let point: Point | undefined
    for (const deadline = Date.now() + 10_000; !point && Date.now() < deadline; await new Promise((r) => setTimeout(r, 100))) {
      point = ((await api('/api/history')) as {points: Point[]}).points.find((p) => p.step === step && p.loss !== null)
    }
    assert.ok(point, "the forwarded report reached the dashboard's history")
    assert.equal(point.loss, 6.5)
    assert.equal(point.val_loss, 6.75)
    assert.equal(point.tokens_per_second, 2048)
    const status = (await api('/api/status')) as {
      summary: {run_state: string; step: number}
      clients: {id: string; state: string; loss: number; connected: boolean; rounds_without_exchange: number | null}[]
    }
    assert.equal(status.summary.run_state, 'RoundTrain')
    assert.equal(status.summary.step, step)
    assert.deepEqual(
      status.clients.map((c) => [c.id, c.state, c.loss, c.connected, c.rounds_without_exchange]),
      [[identity.id, 'Healthy', 6.5, true, 4]],
    )
    // psyche status (a watcher that connects now) gets the recent reports with its first state.
    const st = await runCli(['status', '--server-addr', t.addr, '--json'])
    assert.equal(st.exitCode, 0, st.stderr)
    assert.deepEqual(JSON.parse(st.stdout).no_exchange, [{client_id: identity.id, rounds: 4, step}])
    const text = await runCli(['status', '--server-addr', t.addr])
    assert.match(text.stdout, /NO EXCHANGE: none of its peers' results for 4 rounds/)
    assert.deepEqual(JSON.parse(st.stdout).checkpoint_save_failed, [])
    assert.doesNotMatch(text.stdout, /CHECKPOINT NOT SAVED/)

    // A failed checkpoint save: the client sends its last report again with it; status and the dashboard show it,
    // with the step and the reason, until a report without it (a later save succeeded).
    const failed = {step, message: '/data/ckpt/step-1: No space left on device'}
    assert.ok(conn.sendReport(step, {...REPORT, checkpoint_save_failed: failed}))
    const failedRow = async () => ((await api('/api/status')) as {clients: {checkpoint_save_failed: unknown}[]}).clients[0].checkpoint_save_failed
    const until = async (ok: (v: unknown) => boolean, what: string) => {
      for (const deadline = Date.now() + 10_000; !ok(await failedRow()); await new Promise((r) => setTimeout(r, 100)))
        if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    }
    await until((v) => JSON.stringify(v) === JSON.stringify(failed), 'the dashboard to show the failed save')
    const [stFailed, textFailed] = await Promise.all([runCli(['status', '--server-addr', t.addr, '--json']), runCli(['status', '--server-addr', t.addr])])
    assert.deepEqual(JSON.parse(stFailed.stdout).checkpoint_save_failed, [{client_id: identity.id, ...failed}])
    assert.match(textFailed.stdout, new RegExp(`${identity.id.slice(0, 16)}….*CHECKPOINT NOT SAVED \\(step ${step}\\): /data/ckpt/step-1: No space left on device`))
    assert.ok(conn.sendReport(step, REPORT))
    await until((v) => v === null, 'the dashboard to clear the failed save')
    const stCleared = await runCli(['status', '--server-addr', t.addr, '--json'])
    assert.deepEqual(JSON.parse(stCleared.stdout).checkpoint_save_failed, [])
    // Once the round's result is witnessed, its points show as pending for the epoch (no verifiers: weight 1).
    const round = t.server.state.epoch.round!
    const range = {start: round.data_index, end: round.data_index + round.batch_size}
    assert.ok(conn.sendWitness(step, buildWitnessProof(t.server.state.config, round, [{id: identity.id, range, commitment: Buffer.alloc(32, 1)}])))
    await waitUntil(() => t!.server.state.progress.step === step + 1, 'the next round')
    type Row = {id: string; score: number | null; earned: number; pending_points: number; slashed: number}
    let row: Row | undefined
    for (const deadline = Date.now() + 10_000; !row?.pending_points && Date.now() < deadline; await new Promise((r) => setTimeout(r, 100))) {
      row = ((await api('/api/status')) as {clients: Row[]}).clients.find((c) => c.id === identity.id)
    }
    assert.deepEqual(row, {...row, score: null, earned: 0, pending_points: (range.end - range.start) * 1000, slashed: 0})
    // The dashboard watched: it is not a client of the run.
    assert.deepEqual(
      t.server.state.epoch.clients.map((c) => c.id),
      [identity.id],
    )
  })
})
