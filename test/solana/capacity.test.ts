// At capacity (MAX_CLIENTS = 256 clients, 32 witnesses), on the strict localnet: the program reaches the reference's
// state after every event of the `capacity` vector (joins to the limit and past it, full rounds, a batched health
// check, a witness quorum's accusation, pauses that carry every healthy client), and every transaction stays within a
// cluster's limits: at most 1,232 bytes and 200,000 compute units. The account's rewards ledger holds the reference's
// points after every event (rewards.ts): a round's close credits 256 trainers, half of them one batch more.
import assert from 'node:assert/strict'
import {describe, it} from 'node:test'
import type {KeyPairSigner} from '@solana/kit'
import {clientIdOf, decodeLedger} from '../../src/core/backend/solana/layout.js'
import {emptyLedger, observeTransition} from '../../src/core/coordinator/rewards.js'
import {ledgerDifference} from './fuzz.js'
import {MAX_CLIENTS} from '../../src/core/layout/layout-table.js'
import {updateInstruction} from '../../src/core/backend/solana/instructions.js'
import {deployRun, keypair, readRun, reportAssignedScores, toInstruction} from './harness.js'
import {capacity} from './vectors.js'

describe(`capacity: ${MAX_CLIENTS} clients on the strict localnet`, () => {
  it('every event gives the reference state, every transaction fits 1,232 bytes and 200,000 CU', async () => {
    const scenario = JSON.parse(JSON.stringify(await capacity())) as Awaited<ReturnType<typeof capacity>>
    const d = await deployRun(scenario.run_id, scenario.created_at)
    const signers = new Map<string, KeyPairSigner>()
    for (const label of Object.keys(scenario.clients)) {
      const k = await keypair(label)
      signers.set(clientIdOf(k.address), k)
      d.chain.airdrop(k.address)
    }
    d.chain.setTime(scenario.created_at)
    assert.ok((await d.chain.send(d.authority, [updateInstruction(d.programId, d.coordinator, d.authority, scenario.config, scenario.model)])).ok)
    const worst = new Map<string, {bytes: number; cu: bigint}>()
    let ledger = emptyLedger()
    let prev = readRun(d).state
    const scoredRounds = new Set<number>()
    for (const [i, step] of scenario.steps.entries()) {
      d.chain.setClock(step.now, step.slot)
      const {signer, ix} = toInstruction(d, signers, step.event)
      const r = await d.chain.send(signer, Array.isArray(ix) ? ix : [ix])
      const where = `step ${i} (${step.event.type})`
      if (step.error) assert.equal(r.error, step.error, `${where}: the reference rejects with ${step.error}; the program: ${r.ok ? 'accepted' : r.error}`)
      else assert.ok(r.ok, `${where}: ${r.error}\n${r.logs.join('\n')}`)
      assert.ok(r.bytes !== undefined && r.bytes <= 1232, `${where}: ${r.bytes} bytes`)
      assert.ok(r.computeUnits <= 200_000n, `${where}: ${r.computeUnits} CU`)
      const w = worst.get(step.event.type) ?? {bytes: 0, cu: 0n}
      worst.set(step.event.type, {bytes: Math.max(w.bytes, r.bytes), cu: r.computeUnits > w.cu ? r.computeUnits : w.cu})
      assert.deepStrictEqual(readRun(d).state, step.state, `${where}: states differ`)
      ledger = observeTransition(ledger, prev, step.state)
      prev = step.state
      // A round that follows another: its verifiers (25 %: 64, whose windows of 4 cover the roster) report their scores
      // of the one before, as honest clients do (report_scores); a few trainers score below full weight.
      const round = prev.epoch.round
      if (prev.run_state === 'RoundTrain' && round && prev.epoch.previous_round?.step === round.step - 1 && !scoredRounds.has(round.step)) {
        scoredRounds.add(round.step)
        const out = await reportAssignedScores(d, signers, prev, ledger, (id) => (id.endsWith('0') ? 100_000 : 300_000))
        ledger = out.ledger
        for (const [k, r] of out.sent.entries()) {
          assert.ok(r.ok, `${where}: report_scores ${k}: ${r.error}\n${r.logs.join('\n')}`)
          assert.ok(r.bytes !== undefined && r.bytes <= 1232 && r.computeUnits <= 200_000n, `${where}: report_scores ${k}: ${r.bytes} bytes, ${r.computeUnits} CU`)
          const w = worst.get('report_scores') ?? {bytes: 0, cu: 0n}
          worst.set('report_scores', {bytes: Math.max(w.bytes, r.bytes!), cu: r.computeUnits > w.cu ? r.computeUnits : w.cu})
        }
      }
      assert.equal(ledgerDifference(ledger, decodeLedger(d.chain.accountData(d.coordinator)!)), undefined, `${where}: rewards ledgers differ`)
    }
    assert.equal(scoredRounds.size, 3, 'the verifiers of every round that followed another reported their scores')
    console.log(`# worst per event: ${JSON.stringify(Object.fromEntries([...worst].map(([k, w]) => [k, {bytes: w.bytes, cu: Number(w.cu)}])))}`)
    const entries = Object.values(ledger.clients)
    assert.ok(entries.filter((e) => e.earned > 0).length >= MAX_CLIENTS - 8, 'the epoch settled with points for (nearly) every trainer')
    assert.ok(
      entries.some((e) => e.score !== null && e.score < 200_000 && e.earned > 0 && e.earned < e.batches * 1000),
      'a trainer scored below full weight earned part of its points',
    )
    assert.ok(new Set(entries.map((e) => e.batches / e.rounds)).size > 1, 'trainers were credited different batch counts')
    assert.ok(
      entries.some((e) => e.slashed > 0),
      "the ejected trainer's points were slashed",
    )
    // the scenario did reach the limits it is about
    const states = scenario.steps.map((s) => s.state)
    assert.ok(states.some((s) => s.epoch.round?.roster.length === MAX_CLIENTS))
    assert.ok(states.some((s) => s.epoch.round?.witnesses.length === 32))
    assert.ok(states.some((s) => s.pending.length === MAX_CLIENTS - 3)) // carried healthy clients + the newcomer
    assert.ok(scenario.steps.some((s) => s.error === 'CapacityExceeded'))
    assert.ok(scenario.steps.some((s) => s.event.type === 'health_check' && s.event.accused.length === 4 && !s.error))
    for (const type of ['join', 'tick', 'witness', 'health_check', 'accuse', 'pause', 'checkpoint']) assert.ok(worst.has(type), `no ${type} transaction`)
  })
})
