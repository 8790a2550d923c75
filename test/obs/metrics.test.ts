import assert from 'node:assert/strict'
import {renameSync, writeFileSync} from 'node:fs'
import {join} from 'node:path'
import {after, describe, it} from 'node:test'
import {CoordinatorConnection} from '../../src/core/backend/index.js'
import {ClientMetrics, MAX_PEER_LABELS, serveMetrics} from '../../src/core/obs/metrics.js'
import {generateIdentity, type SaveStatus} from '../../src/core/protocol/index.js'
import {writeRunConfig, RUN_ID} from '../backend/helpers.js'
import {JsonProcess} from '../e2e/helpers.js'
import {tempDir} from '../helpers.js'
import {scrape} from './helpers.js'

describe('Prometheus metrics', () => {
  const dir = tempDir('psyche-metrics-')
  const procs: JsonProcess[] = []
  after(async () => {
    await Promise.all(procs.map((p) => p.stop()))
    dir.cleanup()
  })

  it('psyche server run --metrics-port: a scrape shows the phase, the clients by state, connections and rejections by reason', async () => {
    const state = writeRunConfig(dir.path, {init_min_clients: 2})
    const server = new JsonProcess('server', ['server', 'run', '--state', state, '--metrics-port', '0', '--json'])
    procs.push(server)
    const {port} = (await server.waitFor((e) => e.event === 'listening', 'listening', 60_000)) as {port: number}
    const {port: metricsPort} = (await server.waitFor((e) => e.event === 'metrics_listening', 'the metrics endpoint', 10_000)) as {port: number}

    const before = await scrape(metricsPort)
    assert.match(before.contentType ?? '', /^text\/plain; version=0\.0\.4/)
    assert.equal(before.metrics.get('psyche_coordinator_connections'), 0)
    assert.equal(before.metrics.get('psyche_coordinator_run_state{state="WaitingForMembers"}'), 1)
    assert.equal(before.metrics.get('psyche_coordinator_run_state{state="RoundTrain"}'), 0)
    assert.match(before.text, /# TYPE psyche_coordinator_phase_duration_seconds histogram/)

    const conn = await CoordinatorConnection.connect({addr: `127.0.0.1:${port}`, runId: RUN_ID, identity: generateIdentity(), p2pAddrs: [], join: true})
    try {
      // A client configured for another run is refused (and counted by reason).
      await assert.rejects(
        CoordinatorConnection.connect({addr: `127.0.0.1:${port}`, runId: 'another-run', identity: generateIdentity(), p2pAddrs: [], join: true, reconnect: false}),
        /another-run|run/,
      )
      await server.waitFor((e) => e.event === 'rejected' && e.code === 'wrong_run_id', 'the rejection', 10_000)
      const now = await scrape(metricsPort)
      assert.equal(now.metrics.get('psyche_coordinator_connections'), 1)
      assert.equal(now.metrics.get('psyche_clients{state="Pending"}'), 1, 'one client waits for the next epoch (init_min_clients 2)')
      assert.equal(now.metrics.get('psyche_clients{state="Healthy"}'), 0)
      assert.equal(now.metrics.get('psyche_coordinator_rejected_messages_total{reason="wrong_run_id"}'), 1)
      assert.equal(now.metrics.get('psyche_coordinator_step'), 1, 'a new run starts at step 1')
      assert.equal(now.metrics.get('psyche_coordinator_epoch'), 0)
      assert.ok((now.metrics.get('psyche_server_process_resident_memory_bytes') ?? 0) > 0)
    } finally {
      await conn.close()
    }
  })

  it('psyche server run whose saves fail: an error on the log, /metrics and the dashboard; at --max-save-failures it halts and exits 1 saying why', async () => {
    const state = writeRunConfig(dir.path)
    const saveDir = join(dir.path, 'failing-saves')
    const server = new JsonProcess('server', [
      'server',
      'run',
      '--state',
      state,
      '--save-state-dir',
      saveDir,
      '--max-save-failures',
      '4',
      '--metrics-port',
      '0',
      '--dashboard-port',
      '0',
      '--json',
    ])
    procs.push(server)
    const {port} = (await server.waitFor((e) => e.event === 'listening', 'listening', 60_000)) as {port: number}
    const {port: metricsPort} = (await server.waitFor((e) => e.event === 'metrics_listening', 'the metrics endpoint', 10_000)) as {port: number}
    const {url} = (await server.waitFor((e) => e.event === 'dashboard_listening', 'the dashboard', 10_000)) as {url: string}
    assert.equal((await scrape(metricsPort)).metrics.get('psyche_coordinator_save_failures_in_a_row'), 0)
    assert.equal((await scrape(metricsPort)).metrics.get('psyche_coordinator_saved_step'), 1)

    // The directory is replaced by a file: every save fails from now on.
    renameSync(saveDir, `${saveDir}.away`)
    writeFileSync(saveDir, 'not a directory')
    // A client joins: the state changes, and its save fails.
    const conn = await CoordinatorConnection.connect({addr: `127.0.0.1:${port}`, runId: RUN_ID, identity: generateIdentity(), p2pAddrs: [], join: true, reconnect: false})
    conn.on('error', () => {})
    after(() => conn.close())
    const error = (await server.waitFor((e) => e.event === 'error' && e.where === 'save', 'a failed save', 20_000)) as Record<string, unknown>
    assert.equal(error.failures_in_a_row, 1)
    const failing = await scrape(metricsPort)
    assert.ok((failing.metrics.get('psyche_coordinator_save_failures_in_a_row') ?? 0) >= 1)
    assert.ok((failing.metrics.get('psyche_coordinator_save_failures_total') ?? 0) >= 1)
    const page = (await (await fetch(`${url}api/status`)).json()) as {save_state: SaveStatus}
    assert.equal(page.save_state.ok, false)
    assert.equal(page.save_state.max_failures, 4)
    assert.match(String(page.save_state.last_error), /ENOTDIR/)

    const result = await server.proc
    assert.equal(result.exitCode, 1)
    const halted = server.events.find((e) => e.event === 'halted')
    assert.ok(halted, `the halted line: ${JSON.stringify(server.events.slice(-4))}`)
    assert.equal(halted.last_saved_step, 1)
    // Four in a row halt it (a last try as it stops may add one).
    assert.ok(server.events.filter((e) => e.event === 'error' && e.where === 'save').length >= 4)
    // --json: the error as one more event line on stdout.
    const last = (await server.waitFor((e) => e.event === 'error' && 'code' in e, 'the error line', 5000)) as {code?: string; message: string}
    assert.equal(last.code, 'ESAVEDSTATE', JSON.stringify(last))
    assert.match(last.message, /could not be saved .* 4 times in a row \(--max-save-failures 4\)/)
  })

  it('client metrics from the event stream: tokens/s, histograms of times and sizes, byte counters, rejections by reason', async () => {
    const m = new ClientMetrics({seqLen: 64})
    m.observe({event: 'started'})
    m.observe({event: 'worker_crashed', message: 'gone'})
    m.observe({event: 'worker_restarted', restarts: 1})
    m.observe({event: 'trained', step: 1, loss: 7.5, batches: 4, result_bytes: 5000, compute_ms: 500, produce_ms: 20})
    m.observe({
      event: 'round',
      step: 1,
      epoch: 0,
      loss: 7.5,
      applied: 3,
      trainers: 3,
      bytes_in: 10_000,
      bytes_out: 4000,
      peers: 2,
      apply_ms: 40,
      peer_bytes: {peerA: {in: 6000, out: 2000}, peerB: {in: 4000, out: 2000}},
      relayed_in: 4000,
      relayed_out: 2000,
      peer_relayed_bytes: {peerB: {in: 4000, out: 2000}},
      rounds_without_exchange: 0,
    })
    m.observe({event: 'trained', step: 2, loss: 7.1, batches: 4, result_bytes: 5100, compute_ms: 250})
    m.observe({
      event: 'round',
      step: 2,
      epoch: 0,
      applied: 2,
      accepted: 3,
      trainers: 3,
      bytes_in: 25_000,
      bytes_out: 9000,
      peers: 2,
      peers_direct: 1,
      peers_relayed: 1,
      peer_bytes: {peerA: {in: 9000, out: 2500}, peerB: {in: 16_000, out: 6500}},
      relayed_in: 16_000,
      relayed_out: 6500,
      peer_relayed_bytes: {peerB: {in: 16_000, out: 6500}},
      rounds_without_exchange: 2,
      val_loss: 6.9,
      eval_ms: 120,
    })
    m.observe({event: 'rejected', code: 'stale_step', reason: 'x'})
    m.observe({event: 'rejected', code: 'stale_step', reason: 'y'})
    m.observe({event: 'announcement_ignored', client_id: 'c', step: 2})
    m.observe({event: 'worker_crashed', message: 'gone'})
    m.observe({event: 'checkpoint_save_failed', step: 1, message: 'full'})
    m.observe({event: 'checkpoint_saved', step: 2, epoch: 1, dir: '/d', param_hash: null})
    m.observe({event: 'checkpoint_save_failed', step: 3, message: 'full'})
    const endpoint = await serveMetrics(m.registry, {port: 0})
    try {
      const {metrics} = await scrape(endpoint.port)
      assert.equal(metrics.get('psyche_client_step'), 2)
      assert.equal(metrics.get('psyche_client_loss'), 7.1)
      assert.equal(metrics.get('psyche_client_validation_loss'), 6.9)
      assert.equal(metrics.get('psyche_client_eval_duration_seconds_count'), 1)
      assert.equal(metrics.get('psyche_client_eval_duration_seconds_sum'), 0.12)
      assert.equal(metrics.get('psyche_client_tokens_per_second'), (4 * 64) / 0.25)
      assert.equal(metrics.get('psyche_client_compute_duration_seconds_count'), 2)
      assert.equal(metrics.get('psyche_client_compute_duration_seconds_sum'), 0.75)
      assert.equal(metrics.get('psyche_client_produce_duration_seconds_count'), 1)
      assert.equal(metrics.get('psyche_client_apply_duration_seconds_count'), 1)
      assert.equal(metrics.get('psyche_client_result_size_bytes_sum'), 10_100)
      assert.equal(metrics.get('psyche_client_result_size_bytes_bucket{le="16000"}'), 2)
      assert.equal(metrics.get('psyche_p2p_received_bytes_total'), 25_000)
      assert.equal(metrics.get('psyche_p2p_sent_bytes_total'), 9000)
      assert.equal(metrics.get('psyche_p2p_peer_received_bytes_total{peer="peerA"}'), 9000)
      assert.equal(metrics.get('psyche_p2p_peer_sent_bytes_total{peer="peerA"}'), 2500)
      assert.equal(metrics.get('psyche_p2p_peer_received_bytes_total{peer="peerB"}'), 16_000)
      assert.equal(metrics.get('psyche_p2p_peer_sent_bytes_total{peer="peerB"}'), 6500)
      assert.equal(metrics.get('psyche_p2p_relayed_received_bytes_total'), 16_000)
      assert.equal(metrics.get('psyche_p2p_relayed_sent_bytes_total'), 6500)
      assert.equal(metrics.get('psyche_p2p_peer_relayed_received_bytes_total{peer="peerB"}'), 16_000)
      assert.equal(metrics.get('psyche_p2p_peer_relayed_sent_bytes_total{peer="peerB"}'), 6500)
      assert.equal(metrics.get('psyche_p2p_peer_relayed_received_bytes_total{peer="peerA"}'), undefined)
      assert.equal(metrics.get('psyche_client_rounds_without_exchange'), 2)
      assert.equal(metrics.get('psyche_client_checkpoint_save_failed'), 1)
      assert.equal(metrics.get('psyche_client_checkpoint_save_failures_total'), 2)
      assert.equal(metrics.get('psyche_p2p_peers'), 2)
      assert.equal(metrics.get('psyche_p2p_connections{kind="direct"}'), 1)
      assert.equal(metrics.get('psyche_p2p_connections{kind="relayed"}'), 1)
      assert.equal(metrics.get('psyche_client_trained_tokens_total'), 8 * 64)
      assert.equal(metrics.get('psyche_client_results_applied'), 2)
      assert.equal(metrics.get('psyche_client_results_accepted'), 3)
      assert.equal(metrics.get('psyche_client_rounds_applied_total'), 2)
      assert.equal(metrics.get('psyche_client_rejected_messages_total{reason="stale_step"}'), 2)
      assert.equal(metrics.get('psyche_client_rejected_messages_total{reason="announcement_not_assigned"}'), 1)
      assert.equal(metrics.get('psyche_worker_restarts_total'), 1)
      assert.equal(metrics.get('psyche_worker_crashes_total'), 2)
      const notFound = await fetch(`http://127.0.0.1:${endpoint.port}/other`)
      assert.equal(notFound.status, 404)
    } finally {
      await endpoint.close()
    }
  })

  it('counts bytes per peer under at most MAX_PEER_LABELS peer labels, the rest as "other"', async () => {
    const m = new ClientMetrics({seqLen: 8})
    const peers = (n: number, bytes: number) => Object.fromEntries(Array.from({length: n}, (_, i) => [`${String(i).padStart(4, '0')}${'ab'.repeat(30)}`, {in: bytes, out: 1}]))
    m.observe({event: 'round', step: 1, epoch: 0, applied: 1, trainers: 1, peer_bytes: peers(MAX_PEER_LABELS + 10, 100)})
    m.observe({event: 'round', step: 2, epoch: 0, applied: 1, trainers: 1, peer_bytes: peers(MAX_PEER_LABELS + 10, 250)})
    const endpoint = await serveMetrics(m.registry, {port: 0})
    try {
      const {metrics} = await scrape(endpoint.port)
      const received = [...metrics].filter(([k]) => k.startsWith('psyche_p2p_peer_received_bytes_total{'))
      assert.equal(received.length, MAX_PEER_LABELS + 1, 'one series per labelled peer, plus "other"')
      assert.equal(metrics.get(`psyche_p2p_peer_received_bytes_total{peer="0000${'ab'.repeat(6)}"}`), 250, "a label is the id's first 16 characters")
      assert.equal(metrics.get('psyche_p2p_peer_received_bytes_total{peer="other"}'), 10 * 250)
      const sum = received.reduce((a, [, v]) => a + v, 0)
      assert.equal(sum, (MAX_PEER_LABELS + 10) * 250, 'nothing lost or counted twice')
    } finally {
      await endpoint.close()
    }
  })
})
