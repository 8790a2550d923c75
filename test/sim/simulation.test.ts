import assert from 'node:assert/strict'
import {existsSync, mkdtempSync, readdirSync, readFileSync, rmSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'
import {describe, it} from 'node:test'
import type {ClientSummary} from '../../src/core/client/runner.js'
import {memoryData, SIM_SEQ_LEN, Simulation, simRun, type SimClient} from './harness.js'

/**
 * Several real PsycheClients (runner.ts and decide.ts unchanged) in one process, on in-memory components:
 * the pure coordinator, a map-backed P2P layer, a deterministic worker double and a manual clock. Every test
 * asserts that work happened — results were exchanged and applied, and the parameters changed — not only that
 * replicas agree.
 */

/** Steps every listed client applied, with the hashes equal across them at each. */
function assertReplicasAgree(sim: Simulation, who: SimClient[], steps: number[]): void {
  const byStep = sim.hashesByStep(who)
  for (const step of steps) {
    const hashes = byStep.get(step)
    assert.ok(hashes, `nobody applied step ${step}`)
    assert.deepEqual([...hashes.keys()].sort(), who.map((c) => c.name).sort(), `step ${step} applied by ${[...hashes.keys()]}`)
    assert.equal(new Set(hashes.values()).size, 1, `step ${step}: replicas differ: ${JSON.stringify(Object.fromEntries(hashes))}`)
  }
}

/** The parameters changed at every listed step (each apply folded in results). */
function assertModelChanged(c: SimClient, steps: number[]): void {
  const byStep = new Map(c.rounds.map((r) => [r.step, r.param_hash]))
  const loaded = c.events.find((e) => e.event === 'model_loaded')
  let previous = loaded?.param_hash as string
  assert.ok(previous, `${c.name} never loaded a model`)
  for (const step of steps) {
    const hash = byStep.get(step)
    assert.ok(hash, `${c.name} did not apply step ${step}`)
    assert.notEqual(hash, previous, `${c.name}: step ${step} left the parameters unchanged`)
    previous = hash
  }
}

function summaryOf(result: ClientSummary | Error): ClientSummary {
  if (result instanceof Error) throw result
  return result
}

describe('in-process simulation: real clients, in-memory coordinator, P2P and worker', {timeout: 180_000}, () => {
  it("three clients train a run to the end: every round's results are exchanged, witnessed and applied identically", async () => {
    const sim = new Simulation(simRun({total_steps: 6}))
    const [a, b, c] = [await sim.addClient('a'), await sim.addClient('b'), await sim.addClient('c')]
    await sim.runUntil(() => sim.coordinator.state.run_state === 'Finished', {what: 'the run to finish'})
    const summaries = (await Promise.all([a.done, b.done, c.done])).map(summaryOf)
    // Each round after the first was begun speculatively, on the batches its predecessor predicted, and all of it used:
    // nothing undone, and the same parameters as clients that begin each round only once it starts.
    for (const s of [a, b, c]) {
      const speculation = (outcome: string) => s.events.flatMap((e) => (e.event === 'speculation' && e.outcome === outcome ? [e.step] : []))
      assert.deepEqual(speculation('used'), [2, 3, 4, 5, 6], `${s.name} speculated every round after the first`)
      assert.deepEqual(speculation('begun'), [2, 3, 4, 5, 6])
      assert.deepEqual(speculation('discarded'), [])
      assert.equal(s.worker.speculated, 5)
    }
    const usual = new Simulation(simRun({total_steps: 6}))
    const unspeculated = [
      await usual.addClient('a', a.identity, {speculate: false}),
      await usual.addClient('b', b.identity, {speculate: false}),
      await usual.addClient('c', c.identity, {speculate: false}),
    ]
    await usual.runUntil(() => usual.coordinator.state.run_state === 'Finished', {what: 'the run without speculation to finish'})
    await Promise.all(unspeculated.map((u) => u.done))
    for (const u of unspeculated) assert.equal(u.worker.speculated, 0)
    assert.deepEqual(
      [...usual.hashesByStep(unspeculated).values()].map((h) => [...h.values()]),
      [...sim.hashesByStep([a, b, c]).values()].map((h) => [...h.values()]),
      'the same parameters at every step with and without speculation',
    )

    const steps = [1, 2, 3, 4, 5, 6]
    assertReplicasAgree(sim, [a, b, c], steps)
    for (const s of [a, b, c]) assertModelChanged(s, steps)
    for (const s of summaries) {
      assert.equal(s.rounds, 6)
      assert.equal(s.lastStep, 6)
      assert.ok(s.bytesIn > 0 && s.bytesOut > 0, 'results travelled over the P2P layer')
    }
    assert.equal(summaries[0].paramHash, a.worker.paramHash)
    // Every round applied every trainer's result (3 per round), and trained on its own batches.
    for (const s of [a, b, c]) {
      for (const r of s.rounds) assert.equal(r.applied, r.trainers, `${s.name} step ${r.step}: applied ${r.applied} of ${r.trainers}`)
      assert.ok(s.events.some((e) => e.event === 'trained'))
    }
    assert.ok((sim.coordinator.accepted.get('witness') ?? 0) >= 6, 'witness proofs reached the coordinator')
    // The coordinator refused nothing a client sent with an up-to-date view (a warmup-ready that crosses the
    // start of RoundTrain is a race every backend has, and is refused harmlessly).
    assert.deepEqual(
      sim.coordinator.refusals.filter((r) => r.client_saw === r.run_state),
      [],
    )
  })

  it('max_trainers_per_round = 2 of 5 clients: each round 2 train, every replica downloads and applies those 2 results only, hashes agree, the model changes, nobody is dropped', async () => {
    const sim = new Simulation(simRun({total_steps: 6, max_trainers_per_round: 2, init_min_clients: 5, witness_nodes: 3, verification_percent: 40}))
    const clients = [] as SimClient[]
    for (const name of ['a', 'b', 'c', 'd', 'e']) clients.push(await sim.addClient(name))
    await sim.runUntil(() => sim.coordinator.state.run_state === 'Finished', {what: 'the run to finish'})
    const summaries = (await Promise.all(clients.map((c) => c.done))).map(summaryOf)
    const steps = [1, 2, 3, 4, 5, 6]
    assertReplicasAgree(sim, clients, steps)
    for (const c of clients) assertModelChanged(c, steps)
    for (const s of summaries) assert.equal(s.rounds, 6)
    for (const c of clients) {
      for (const r of c.rounds) {
        assert.equal(r.trainers, 2, `${c.name} step ${r.step}: ${r.trainers} trainers`)
        assert.equal(r.applied, 2, `${c.name} step ${r.step}: applied ${r.applied}`)
      }
      assert.deepEqual(
        c.worker.applies.map((a) => a.results),
        steps.map(() => 2),
        `${c.name} applied 2 results a round`,
      )
      // what a client downloads per round: the other chosen trainers' results, at most G
      for (const [step, n] of c.p2p.fetchedByStep) assert.ok(n <= 2, `${c.name} downloaded ${n} results of step ${step}`)
    }
    // each step, exactly 2 clients trained; over the run the choice moved around (more than 2 distinct producers)
    const producers = new Map<number, string[]>()
    for (const c of clients) for (const e of c.events) if (e.event === 'trained') producers.set(e.step as number, [...(producers.get(e.step as number) ?? []), c.name])
    assert.deepEqual(
      steps.map((s) => producers.get(s)?.length),
      steps.map(() => 2),
      JSON.stringify(Object.fromEntries(producers)),
    )
    assert.ok(new Set([...producers.values()].flat()).size > 2, `the same trainers every round: ${JSON.stringify(Object.fromEntries(producers))}`)
    assert.ok(clients.reduce((n, c) => n + c.worker.scored, 0) > 0, 'verifiers scored the chosen trainers')
    // members not chosen were neither dropped by health checks nor accused
    assert.equal(sim.coordinator.accepted.get('health_check') ?? 0, 0)
    assert.ok(
      sim.coordinator.state.epoch.clients.every((c) => c.state === 'Healthy'),
      JSON.stringify(sim.coordinator.state.epoch.clients),
    )
  })

  it('join --checkpoint-dir: the model is saved after each epoch, each save holding its step; the last 3 saves are kept', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'psyche-sim-ckpt-'))
    try {
      const saved = join(dir, 'model')
      const sim = new Simulation(simRun({total_steps: 12, rounds_per_epoch: 2}))
      const a = await sim.addClient('a', undefined, {checkpointDir: saved})
      const others = [await sim.addClient('b'), await sim.addClient('c')]
      await sim.runUntil(() => sim.coordinator.state.run_state === 'Finished', {what: 'the run to finish'})
      await Promise.all([a.done, ...others.map((c) => c.done)])
      const saves = a.events.filter((e) => e.event === 'checkpoint_saved')
      const lastOfEpoch = new Map<number, number>()
      for (const r of a.rounds) lastOfEpoch.set(r.epoch, Math.max(lastOfEpoch.get(r.epoch) ?? 0, r.step))
      // One save per epoch, at its last round: also when the apply of that round ends after the Cooldown (in the
      // simulation its clock runs on while the client works).
      const perEpoch = saves.map((e) => [e.epoch, e.step])
      for (const [epoch, step] of perEpoch) assert.equal(lastOfEpoch.get(epoch), step, `the save of epoch ${epoch} is at its last round`)
      assert.deepEqual(
        perEpoch.map(([epoch]) => epoch),
        [...lastOfEpoch.keys()].sort((x, y) => x - y),
        'every epoch saved, once',
      )
      // The last save holds the parameters of its step (the final ones when the last epoch saved).
      const lastSaved = saves.at(-1)!.step as number
      const meta = JSON.parse(readFileSync(join(saved, `step-${lastSaved}`, 'psyche-checkpoint.json'), 'utf8'))
      const last = a.rounds.find((r) => r.step === lastSaved)!
      assert.deepEqual([meta.step, meta.param_hash], [lastSaved, last.param_hash])
      if (lastSaved === 12) assert.equal(meta.param_hash, a.worker.paramHash, 'the final parameters')
      assert.ok(existsSync(join(saved, `step-${lastSaved}`, 'params.bin')) && existsSync(join(saved, `step-${lastSaved}`, 'config.json')))
      // --keep-checkpoints' default: the last 3 epochs' saves stay, the older ones were removed
      const steps = saves.map((e) => e.step as number)
      assert.ok(steps.length > 3, `${steps.length} saves`)
      assert.deepEqual(
        readdirSync(saved).sort(),
        steps
          .slice(-3)
          .map((s) => `step-${s}`)
          .sort(),
      )
      assert.equal(a.events.filter((e) => e.event === 'checkpoint_pruned').length, steps.length - 3)
      assert.equal(others[0].events.filter((e) => e.event === 'checkpoint_saved').length, 0, 'only the client asked to saves')
    } finally {
      rmSync(dir, {recursive: true, force: true})
    }
  })

  it('a client cut off from its peers is dropped when the round it missed closes, the others go on, and it rejoins with the model from a peer', async () => {
    const sim = new Simulation(simRun({total_steps: 400, epoch_time: 20, witness_nodes: 3}))
    const [a, b, c] = [await sim.addClient('a'), await sim.addClient('b'), await sim.addClient('c')]
    await sim.untilApplied(2)
    sim.net.setOnline(c.identity.id, false)
    const dropped = () => sim.coordinator.state.epoch.exited.some((x) => x.id === c.identity.id && x.state === 'Dropped')
    await sim.runUntil(dropped, {what: 'c to be dropped'})
    const lastWhileOff = Math.max(...a.rounds.map((r) => r.step))
    sim.net.setOnline(c.identity.id, true)
    // c noticed it could not apply what the quorum accepted, dropped its model, rejoins and fetches the model from a peer.
    await sim.runUntil(() => c.events.some((e) => e.event === 'model_loaded' && e.source === 'peers'), {what: 'c to reload from peers'})
    const reloadAt = c.events.filter((e) => e.event === 'model_loaded').at(-1)!.step as number
    assert.ok(reloadAt >= lastWhileOff, `reloaded at ${reloadAt}`)
    await sim.untilApplied(reloadAt + 2, [a, b, c])
    const after = [reloadAt + 1, reloadAt + 2]
    assertReplicasAgree(sim, [a, b, c], after)
    assertModelChanged(c, after)
    // a and b had begun the round after c's last on the batches of a roster with c: its drop changed them, so that
    // work was undone and the round trained on its real batches (the replicas above agree)
    for (const s of [a, b]) {
      const discarded = s.events.flatMap((e) => (e.event === 'speculation' && e.outcome === 'discarded' ? [e] : []))
      assert.ok(discarded.length > 0, `${s.name} undid no speculative round`)
      assert.ok(
        discarded.every((e) => s.events.some((t) => t.event === 'trained' && t.step === e.step)),
        `${s.name} trained the rounds it undid`,
      )
      assert.equal(s.worker.discarded, discarded.length)
    }
    assert.ok(
      c.events.some((e) => e.event === 'out_of_sync' || e.event === 'rejoining'),
      'c knew it fell out',
    )
    await sim.stop()
  })

  it('a lost coordinator link withdraws the client; it reconnects, rejoins at the next epoch and trains again', async () => {
    const sim = new Simulation(simRun({total_steps: 400, epoch_time: 15}))
    const [a, b, c] = [await sim.addClient('a'), await sim.addClient('b'), await sim.addClient('c')]
    await sim.untilApplied(2)
    sim.coordinator.cutLink(b.identity.id, 3000)
    assert.ok(
      sim.coordinator.state.epoch.clients.some((x) => x.id === b.identity.id && x.state === 'Withdrawn'),
      'the lost link withdrew b',
    )
    const epochAtCut = sim.coordinator.state.progress.epoch
    await sim.runUntil(() => b.events.some((e) => e.event === 'reconnected'), {what: 'b to reconnect'})
    // Withdrawn from the epoch, b joins again (its hello asks to) and trains in a later epoch, with the model it
    // kept (when the epoch starts right where it left) or the one it loads from a peer at the next Warmup.
    const trainedLater = () => b.rounds.find((r) => r.epoch > epochAtCut && r.loss !== null)
    await sim.runUntil(() => trainedLater() !== undefined, {what: 'b to train in a later epoch'})
    const step = trainedLater()!.step
    await sim.untilApplied(step + 1, [a, b, c])
    assertReplicasAgree(sim, [a, b, c], [step, step + 1])
    assertModelChanged(b, [step, step + 1])
    await sim.stop()
  })

  it('a paused run stops between epochs with the model kept; resumed, it goes on from the same parameters', async () => {
    const sim = new Simulation(simRun({total_steps: 40, epoch_time: 12}))
    const clients = [await sim.addClient('a'), await sim.addClient('b'), await sim.addClient('c')]
    await sim.untilApplied(2)
    sim.coordinator.authority({type: 'pause'})
    await sim.runUntil(() => sim.coordinator.state.run_state === 'Paused', {what: 'Paused'})
    await sim.runUntil(() => false, {maxMs: 30_000}).catch(() => {}) // 30 s of paused time: nothing moves
    const pausedAt = sim.coordinator.state.progress.step
    const last = clients.map((c) => c.rounds.at(-1)!)
    assert.equal(new Set(last.map((r) => r.param_hash)).size, 1)
    assert.ok(
      last.every((r) => r.step === pausedAt - 1),
      `last applied ${last.map((r) => r.step)}, paused at step ${pausedAt}`,
    )
    sim.coordinator.authority({type: 'resume'})
    await sim.untilApplied(pausedAt + 1)
    assertReplicasAgree(sim, clients, [pausedAt, pausedAt + 1])
    for (const c of clients) assertModelChanged(c, [pausedAt, pausedAt + 1])
    await sim.stop()
  })

  it('a crashed worker withdraws its client; the two others finish the run', async () => {
    const sim = new Simulation(simRun({total_steps: 8, min_clients: 2, init_min_clients: 2}))
    const [a, b, c] = [await sim.addClient('a'), await sim.addClient('b'), await sim.addClient('c')]
    await sim.untilApplied(2)
    c.worker.crash()
    await sim.runUntil(() => sim.coordinator.state.run_state === 'Finished', {what: 'the run to finish'})
    const cResult = await c.done
    assert.ok(cResult instanceof Error && /withdrew/.test(cResult.message), `c ended with ${cResult}`)
    assert.ok(
      sim.coordinator.state.epoch.exited.some((x) => x.id === c.identity.id) || !sim.coordinator.state.epoch.clients.some((x) => x.id === c.identity.id && x.state === 'Healthy'),
    )
    const [sa, sb] = [summaryOf(await a.done), summaryOf(await b.done)]
    assert.equal(sa.paramHash, sb.paramHash)
    assert.equal(sa.lastStep, 8)
    assertReplicasAgree(sim, [a, b], [6, 7, 8])
    assertModelChanged(a, [6, 7, 8])
  })

  it('with workerRestarts, a crashed worker is replaced: the client withdraws, rejoins at the next epoch with the model from a peer, and trains identically again', async () => {
    // witness_nodes 3: the next Warmup waits for c's "model loaded" too (with 2, the others start training without it)
    const sim = new Simulation(simRun({total_steps: 400, epoch_time: 15, witness_nodes: 3}))
    const [a, b, c] = [await sim.addClient('a'), await sim.addClient('b'), await sim.addClient('c', undefined, {workerRestarts: 1})]
    await sim.untilApplied(2)
    const first = c.worker
    first.crash()
    await sim.runUntil(() => c.events.some((e) => e.event === 'worker_restarted'), {what: "c's worker to be replaced"})
    assert.notEqual(c.worker, first, 'a new worker')
    assert.ok(c.events.some((e) => e.event === 'worker_crashed' && e.restarting === true))
    assert.deepEqual(
      c.events.filter((e) => e.event === 'worker_restarted').map((e) => e.restarts),
      [1],
    )
    const epochAtCrash = sim.coordinator.state.progress.epoch
    const trainedLater = () => c.rounds.find((r) => r.epoch > epochAtCrash && r.loss !== null)
    await sim.runUntil(() => trainedLater() !== undefined, {what: 'c to train in a later epoch'})
    assert.ok(
      c.events.some((e) => e.event === 'model_loaded' && e.source === 'peers'),
      'the new worker got the model from a peer',
    )
    const step = trainedLater()!.step
    await sim.untilApplied(step + 1, [a, b, c])
    assertReplicasAgree(sim, [a, b, c], [step, step + 1])
    assertModelChanged(c, [step, step + 1])
    assert.ok(c.worker.applies.length > 0, 'the new worker applied rounds')
    await sim.stop()
  })

  it('validation: clients evaluate the held-out samples after every 2nd round and the last; replicas report the same validation loss, and it changes as the model does', async () => {
    const sim = new Simulation(simRun({total_steps: 7, min_clients: 2, init_min_clients: 3}))
    const settings = {every: 2, batches: 4}
    const [a, b, c] = [
      await sim.addClient('a', undefined, {eval: settings, evalData: memoryData(SIM_SEQ_LEN)}),
      await sim.addClient('b', undefined, {eval: settings, evalData: memoryData(SIM_SEQ_LEN)}),
      // no held-out split, and the memory data cannot say how many samples it has: no tail is known to be held out
      await sim.addClient('c', undefined, {eval: settings}),
    ]
    await sim.runUntil(() => sim.coordinator.state.run_state === 'Finished', {what: 'the run to finish'})
    for (const x of [a, b, c]) summaryOf(await x.done)
    for (const x of [a, b]) {
      assert.deepEqual(
        x.events.filter((e) => e.event === 'eval_set').map((e) => [e.source, e.samples]),
        [['split', 4]],
      )
      const due = x.rounds.filter((r) => r.val_loss !== null).map((r) => r.step)
      assert.deepEqual(due, [2, 4, 6, 7], `${x.name} evaluated after steps ${due}`)
      assert.ok(x.rounds.every((r) => (r.val_loss === null) === (r.eval_ms === null)))
    }
    const lossesA = a.rounds.filter((r) => r.val_loss !== null)
    for (const r of lossesA) assert.equal(r.val_loss, b.rounds.find((q) => q.step === r.step)!.val_loss, `step ${r.step}: the same validation loss on both replicas`)
    assert.equal(new Set(lossesA.map((r) => r.val_loss)).size, lossesA.length, 'the validation loss changed with the model')
    assert.equal(a.worker.evaluations, 4)
    assert.deepEqual(
      c.events.filter((e) => e.event === 'eval_unavailable').map((e) => e.reason),
      ['the training data does not say how many samples it has, so no tail of it is known to be held out (pass --eval-data)'],
    )
    assert.ok(c.rounds.every((r) => r.val_loss === null) && c.worker.evaluations === 0)
    assertReplicasAgree(sim, [a, b, c], [1, 2, 3, 4, 5, 6, 7])
    assertModelChanged(a, [2, 4, 6])
    await sim.stop()
  })
})
