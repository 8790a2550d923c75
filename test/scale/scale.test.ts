import assert from 'node:assert/strict'
import {describe, it} from 'node:test'
import type {ClientSummary} from '../../src/core/client/runner.js'
import {serializeState} from '../../src/core/coordinator/index.js'
import {scaleRun, ScaleServer, startMemoryClients} from './harness.js'

/**
 * 64 real clients (runner, result intake and validation, witnessing) in this process, against the real coordinator
 * server over loopback TCP, with the load-test compute stand-in for PyTorch and the simulation's in-memory P2P
 * layer. Every round must apply every trainer's result on every client, and the server's work per round must stay
 * within a bound linear in the number of clients.
 */

const N = 64
const ROUNDS = 3

describe(`scale: ${N} clients against the real server`, {timeout: 120_000}, () => {
  it('every round applies every result on every client; the server works O(N) per round', async () => {
    const server = await ScaleServer.start(await scaleRun({clients: N, rounds: ROUNDS}))
    const {clients} = await startMemoryClients(server, N, {resultBytes: 256, computeMs: 20})
    try {
      const summaries = await Promise.all(clients.map((c) => c.done))
      for (const s of summaries) if (s instanceof Error) throw s
      assert.equal(server.server.state.run_state, 'Finished', server.transitions.join(' '))

      // Every client applied every round, each with every trainer's result (N of N), and the replicas agree.
      for (let step = 1; step <= ROUNDS; step++) {
        const hashes = new Set<string>()
        for (const c of clients) {
          const r = c.rounds.find((x) => x.step === step)
          assert.ok(r, `a client did not apply step ${step}: ${JSON.stringify(c.events.slice(-3))}`)
          assert.equal(r.trainers, N, `step ${step}: ${r.trainers} trainers`)
          assert.equal(r.applied, N, `step ${step}: a client applied ${r.applied} of ${N} results`)
          hashes.add(r.param_hash)
        }
        assert.equal(hashes.size, 1, `step ${step}: replicas differ`)
      }
      // The parameters changed at every apply.
      const a = clients[0]
      assert.equal(new Set(a.rounds.map((r) => r.param_hash)).size, ROUNDS)
      assert.deepEqual(
        a.worker.applies.map((x) => x.results),
        Array(ROUNDS).fill(N),
      )
      for (const s of summaries as ClientSummary[]) assert.equal(s.rounds, ROUNDS)

      // The server's work per round: O(1) state changes (phase changes, one per witness proof, a few health checks)
      // each pushed once to each client as a delta, so frames and bytes grow about linearly in N (bench/README.md).
      const W = server.witnesses(N)
      const wholeState = serializeState(server.server.state).length
      const rounds = server.perRound()
      assert.ok(rounds.length >= ROUNDS - 1, `per-round windows: ${JSON.stringify(rounds)}`)
      for (const r of rounds) {
        assert.ok(r.commits <= W + 8, `step ${r.step}: ${r.commits} state changes for ${W} witnesses`)
        assert.ok(r.framesOut <= (W + 8) * N, `step ${r.step}: ${r.framesOut} frames sent to ${N} clients`)
        // Each client gets what the round's events changed (state deltas: witness records' blooms, phases; the changes
        // of one turn of the server's event loop go out together), not the whole state: that is over 40 kB with 64
        // clients, and pushing it on every event cost O(N²) per event.
        assert.ok(r.bytesOut / N < wholeState, `step ${r.step}: ${Math.round(r.bytesOut / N)} bytes per client, a whole state is ${wholeState}`)
      }
      console.log(JSON.stringify({clients: N, witnesses: W, rounds}))
    } finally {
      for (const c of clients) c.client.stop()
      await Promise.all(clients.map((c) => c.done))
      await server.stop()
    }
  })
})
