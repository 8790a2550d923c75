import assert from 'node:assert/strict'
import {after, describe, it} from 'node:test'
import {setTimeout as sleep} from 'node:timers/promises'
import {processAlive, tempDir, waitFor} from '../helpers.js'
import {startClient, startServer, writeE2eRun, type JsonProcess, type Line} from './helpers.js'

/**
 * A worker `kill -9` always ends its client with a non-zero exit and a clear error, whenever it comes: 20 clients
 * (`psyche join` with a real PyTorch worker on the tiny model), in waves of 5 sharing one server, each with its worker
 * killed at another moment — while it waits or loads the model, mid-training, right after a round's apply, later in
 * the run. The run never finishes while they live, so exiting 0 can only be a lost crash.
 */

const WAVES = 4
const PER_WAVE = 5
const CONCURRENT_WAVES = 2

/** When client k's worker is killed: after the first event `at` matches, and `delayMs` more. */
function schedule(k: number): {what: string; at: (e: Line) => boolean; delayMs: number} {
  const delayMs = (k * 137) % 1200
  const step = (e: Line) => ('step' in e && typeof e.step === 'number' ? e.step : -1)
  switch (k % PER_WAVE) {
    case 0:
      return {what: 'started (waiting, or loading the model)', at: (e) => e.event === 'started', delayMs}
    case 1:
      return {what: 'its first training', at: (e) => e.event === 'trained', delayMs: delayMs % 300}
    case 2:
      return {what: 'its first applied round', at: (e) => e.event === 'round', delayMs: delayMs % 500}
    case 3:
      return {what: 'round 2 applied', at: (e) => e.event === 'round' && step(e) >= 2, delayMs}
    default:
      return {what: 'training at step 3', at: (e) => e.event === 'trained' && step(e) >= 3, delayMs: delayMs % 300}
  }
}

describe('a worker killed with SIGKILL', () => {
  const dirs: ReturnType<typeof tempDir>[] = []
  const procs: JsonProcess[] = []
  after(async () => {
    await Promise.all(procs.map((p) => p.stop()))
    for (const d of dirs) d.cleanup()
  })

  it(`ends its client with a non-zero exit and a clear error, ${WAVES * PER_WAVE} of ${WAVES * PER_WAVE} times`, {timeout: 600_000}, async (t) => {
    const started = Date.now()
    const outcomes: string[] = []
    const runWave = async (wave: number) => {
      const dir = tempDir('psyche-worker-kill-')
      dirs.push(dir)
      // The epoch starts once the clients killed after training have joined (the one killed early may be gone by
      // then); it never ends while they live (a run that finished would exit 0 rightly).
      const state = writeE2eRun(dir.path, {initMinClients: PER_WAVE - 1, minClients: 1, totalSteps: 100_000, roundsPerEpoch: 10_000, warmupTime: 5})
      const {server, port} = await startServer(state)
      procs.push(server)
      const runs = Array.from({length: PER_WAVE}, (_, i) => wave * PER_WAVE + i).map(async (k) => {
        const client = startClient(`client-${k}`, port, state)
        procs.push(client)
        const when = schedule(k)
        const workerPid = (await client.waitFor((e) => e.event === 'started', 'started', 120_000)).worker_pid as number
        await client.waitFor(when.at, when.what, 120_000)
        await new Promise((r) => setTimeout(r, when.delayMs))
        assert.equal(client.exited, false, `client-${k} still runs when its worker is killed`)
        process.kill(workerPid, 'SIGKILL')
        const killedAt = Date.now()
        const result = await Promise.race([client.proc, sleep(60_000, undefined, {ref: false})])
        assert.ok(result, `client-${k} exited within 60 s of its worker's kill (after ${when.what} + ${when.delayMs} ms)`)
        const error = client.events.find((e) => e.event === 'error') as {code?: string; message?: string} | undefined
        const trace = `client-${k}, killed after ${when.what} + ${when.delayMs} ms, exited ${Date.now() - killedAt} ms later: exit ${result.exitCode}, error ${JSON.stringify(error)}, stderr ${client.stderr.join('').slice(-800)}`
        outcomes.push(trace)
        assert.notEqual(result.exitCode, 0, trace)
        assert.equal(error?.code, 'EWORKERCRASHED', trace)
        assert.match(error!.message!, new RegExp(`^worker \\(pid ${workerPid}\\) was killed by SIGKILL\\b.*; withdrew from run e2e$`), trace)
        assert.ok(
          client.events.some((e) => e.event === 'worker_crashed'),
          trace,
        )
        await waitFor(() => !processAlive(workerPid), 5000, `client-${k}'s worker to be gone`)
      })
      await Promise.all(runs)
      await server.stop()
      t.diagnostic(`wave ${wave + 1} done at ${((Date.now() - started) / 1000).toFixed(1)} s`)
    }
    // Two waves at a time: one's waits (start-up, Warmup, a round that times out) overlap the other's work.
    for (let wave = 0; wave < WAVES; wave += CONCURRENT_WAVES) await Promise.all(Array.from({length: Math.min(CONCURRENT_WAVES, WAVES - wave)}, (_, i) => runWave(wave + i)))
    assert.equal(outcomes.length, WAVES * PER_WAVE)
    for (const o of outcomes) t.diagnostic(o.split(', error')[0])
  })
})
