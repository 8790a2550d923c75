// The rewards ledger in the coordinator program (programs/coordinator: credit_round, settle_epoch) at its costliest:
// MAX_CLIENTS trainers whose batch counts differ (2.5 batches each), with one and with two witnesses, on the strict
// localnet. After every event the account's ledger holds the reference's points (rewards.ts), and every transaction
// stays within the compute units its builder asks for (INSTRUCTION_UNITS) and 1,232 bytes.
import assert from 'node:assert/strict'
import {describe, it} from 'node:test'
import type {KeyPairSigner} from '@solana/kit'
import {INSTRUCTION_UNITS, reportScoresInstruction, setRatesInstruction, updateInstruction} from '../../src/core/backend/solana/instructions.js'
import {clientIdOf, decodeLedger, ledgerRows} from '../../src/core/backend/solana/layout.js'
import {MAX_CLIENTS} from '../../src/core/layout/layout-table.js'
import {emptyLedger, FULL_WEIGHT_SCORE, observeTransition, recordScores, rewardRows, SCORE_ONE, type RewardsLedger} from '../../src/core/coordinator/rewards.js'
import {assignedTrainers, selectVerifiers} from '../../src/core/coordinator/rules.js'
import type {CoordinatorState} from '../../src/core/coordinator/types.js'
import {ledgerDifference} from './fuzz.js'
import {deployRun, keypair, readRun, toInstruction} from './harness.js'
import {rewardsAtScale} from './vectors.js'

describe(`rewards ledger in the program: ${MAX_CLIENTS} trainers`, () => {
  for (const [witnesses, cap] of [
    [1, undefined],
    [2, undefined],
    [1, MAX_CLIENTS / 2 - 1],
  ] as const) {
    const capped = cap ? `, max_trainers_per_round = ${cap}` : ''
    it(`${witnesses} witness${witnesses > 1 ? 'es' : ''}${capped}: the program's points equal the reference's after every event, within each instruction's budget`, async () => {
      const scenario = await rewardsAtScale(witnesses, MAX_CLIENTS, 0, cap)
      const d = await deployRun(scenario.run_id, scenario.created_at)
      const signers = new Map<string, KeyPairSigner>()
      for (const label of Object.keys(scenario.clients)) {
        const k = await keypair(label)
        signers.set(clientIdOf(k.address), k)
        d.chain.airdrop(k.address)
      }
      d.chain.setTime(scenario.created_at)
      const update = await d.chain.send(d.authority, [updateInstruction(d.programId, d.coordinator, d.authority, scenario.config, scenario.model)])
      assert.ok(update.ok, `update: ${update.error}\n${update.logs.join('\n')}`)
      let ledger = emptyLedger()
      let prev = readRun(d).state
      const worst: Record<string, number> = {}
      for (const [i, step] of scenario.steps.entries()) {
        d.chain.setClock(step.now, step.slot)
        const {signer, ix} = toInstruction(d, signers, step.event)
        const r = await d.chain.send(signer, Array.isArray(ix) ? ix : [ix])
        const where = `step ${i} (${step.event.type})`
        assert.ok(r.ok, `${where}: ${r.error}\n${r.logs.join('\n')}`)
        assert.ok(r.bytes !== undefined && r.bytes <= 1232, `${where}: ${r.bytes} bytes`)
        worst[step.event.type] = Math.max(worst[step.event.type] ?? 0, Number(r.computeUnits))
        ledger = observeTransition(ledger, prev, step.state)
        prev = step.state
        assert.deepStrictEqual(readRun(d).state, step.state, `${where}: states differ`)
        assert.equal(ledgerDifference(ledger, decodeLedger(d.chain.accountData(d.coordinator)!)), undefined, `${where}: rewards ledgers differ`)
      }
      console.log(`# ${witnesses} witness(es), most CU per event: ${JSON.stringify(worst)}`)
      assert.ok(worst.tick <= INSTRUCTION_UNITS.tick_close_round, `tick: ${worst.tick} CU > ${INSTRUCTION_UNITS.tick_close_round}`)
      assert.ok(worst.witness <= INSTRUCTION_UNITS.witness, `witness: ${worst.witness} CU > ${INSTRUCTION_UNITS.witness}`)
      const onChain = decodeLedger(d.chain.accountData(d.coordinator)!)
      assert.equal(onChain.entries.length, MAX_CLIENTS)
      if (cap) {
        // 4 rounds of `cap` chosen trainers each, 640 batches a round between them (5 or 6 each)
        assert.equal(
          onChain.entries.reduce((n, e) => n + e.rounds, 0),
          4 * cap,
        )
        assert.equal(
          onChain.entries.reduce((n, e) => n + e.batches, 0),
          4 * 640,
        )
        assert.ok(onChain.entries.every((e) => e.earned === e.batches * 1000 && e.batches <= e.rounds * 6 && e.batches >= e.rounds * 5))
        assert.ok(new Set(onChain.entries.map((e) => e.batches - 5 * e.rounds)).size > 1, 'chosen trainers were credited different batch counts')
        return
      }
      // both epochs settled: every trainer earned for its 4 rounds, 2 or 3 batches in each (both kinds present)
      assert.ok(
        onChain.entries.every((e) => e.rounds === 4 && e.epoch_rounds === 0 && e.batches >= 8 && e.batches <= 12 && e.earned === e.batches * 1000),
        'every trainer was credited its 4 rounds and earned 1000 points a batch',
      )
      assert.ok(new Set(onChain.entries.map((e) => e.batches)).size > 1, 'trainers were credited different batch counts')
      // psyche rewards --rpc shows the reference's rows (rewardRows)
      const rows = ledgerRows(onChain, prev)
      assert.deepEqual(rows, rewardRows(ledger, prev))
      assert.equal(rows.length, MAX_CLIENTS)
    })
  }

  it(`report_scores at ${MAX_CLIENTS} trainers: the verifiers' scores (K = 4, and 64 entries) equal the reference's, weight the epoch's points, within budget and 1,232 bytes`, async () => {
    const scenario = await rewardsAtScale(1, MAX_CLIENTS, 2) // 2 %: 6 verifiers, each assigned 4 trainers
    const d = await deployRun(scenario.run_id, scenario.created_at)
    const signers = new Map<string, KeyPairSigner>()
    for (const label of Object.keys(scenario.clients)) {
      const k = await keypair(label)
      signers.set(clientIdOf(k.address), k)
      d.chain.airdrop(k.address)
    }
    d.chain.setTime(scenario.created_at)
    assert.ok((await d.chain.send(d.authority, [updateInstruction(d.programId, d.coordinator, d.authority, scenario.config, scenario.model)])).ok)
    let ledger: RewardsLedger = emptyLedger()
    let prev = readRun(d).state
    const units: Record<string, number> = {}
    let reported = 0
    const scoreOf = (id: string) => (parseInt(id.slice(0, 6), 16) % 5 === 0 ? -SCORE_ONE / 10 : FULL_WEIGHT_SCORE / 2 + (parseInt(id.slice(6, 12), 16) % (SCORE_ONE / 2)))
    /** Sends a report and takes it into the reference ledger; the program must answer as recordScores does. */
    const report = async (state: CoordinatorState, from: string, step: number, entries: {client_id: string; score: number}[], what: string, expected = 'ok') => {
      const roster = state.epoch.previous_round!.roster
      const ix = reportScoresInstruction(
        d.programId,
        d.coordinator,
        signers.get(from)!,
        step,
        entries.map((e) => ({index: roster.indexOf(e.client_id), score: e.score})),
      )
      const r = await d.chain.send(signers.get(from)!, [ix])
      const out = recordScores(ledger, state, from, step, entries)
      assert.equal('code' in out ? (out.code === 'stale_step' ? 'WrongStep' : out.code) : 'ok', expected, `${what}: the reference`)
      assert.equal(r.ok ? 'ok' : r.error, expected, `${what}: the program\n${r.logs.join('\n')}`)
      assert.ok(r.bytes !== undefined && r.bytes <= 1232, `${what}: ${r.bytes} bytes`)
      assert.ok(r.computeUnits <= INSTRUCTION_UNITS.report_scores, `${what}: ${r.computeUnits} CU > ${INSTRUCTION_UNITS.report_scores}`)
      units[what] = Math.max(units[what] ?? 0, Number(r.computeUnits))
      if (!('code' in out)) ledger = out
      assert.equal(ledgerDifference(ledger, decodeLedger(d.chain.accountData(d.coordinator)!)), undefined, `${what}: rewards ledgers differ`)
    }
    for (const [i, step] of scenario.steps.entries()) {
      d.chain.setClock(step.now, step.slot)
      const {signer, ix} = toInstruction(d, signers, step.event)
      const r = await d.chain.send(signer, Array.isArray(ix) ? ix : [ix])
      assert.ok(r.ok, `step ${i} (${step.event.type}): ${r.error}`)
      ledger = observeTransition(ledger, prev, step.state)
      prev = step.state
      const round = prev.epoch.round
      const scored = prev.epoch.previous_round
      // Each epoch's second round: its verifiers score the first round's results.
      if (prev.run_state !== 'RoundTrain' || !round || !scored || round.step !== scored.step + 1 || step.event.type !== 'tick') continue
      const [first, ...others] = selectVerifiers(prev)
      assert.equal(others.length, 5)
      const mine = (v: string) => assignedTrainers(prev, round, scored, v).map((client_id) => ({client_id, score: scoreOf(client_id)}))
      const stranger = scored.roster.find((id) => id !== first && !mine(first).some((e) => e.client_id === id))!
      await report(prev, first, scored.step, [...mine(first), {client_id: stranger, score: 1}], 'unassigned', 'InvalidScores')
      await report(
        prev,
        first,
        scored.step,
        scored.roster
          .filter((id) => id !== first)
          .slice(0, 64)
          .map((client_id) => ({client_id, score: 0})),
        'K=64 distinct (refused)',
        'InvalidScores',
      )
      await report(prev, stranger, scored.step, [], 'not a verifier', 'InvalidScores')
      await report(prev, first, scored.step - 1, mine(first), 'stale', 'WrongStep')
      // 64 entries: its 4 trainers, each listed 16 times (a trainer listed twice counts once)
      await report(
        prev,
        first,
        scored.step,
        Array.from({length: 64}, (_, k) => mine(first)[k % mine(first).length]),
        'K=64',
      )
      await report(prev, first, scored.step, mine(first), 'duplicate', 'DuplicateScores')
      for (const v of others) await report(prev, v, scored.step, mine(v), 'K=4')
      reported++
    }
    assert.equal(reported, 2, 'both epochs had their scores reported')
    console.log(`# report_scores at ${MAX_CLIENTS} trainers, CU: ${JSON.stringify(units)}`)
    const end = decodeLedger(d.chain.accountData(d.coordinator)!)
    const scoredEntries = end.entries.filter((e) => e.score !== null)
    assert.ok(scoredEntries.length >= 20, `${scoredEntries.length} trainers scored`)
    for (const e of end.entries) {
      if (e.score === null) assert.equal(e.earned, 0, 'an unscored trainer earns nothing in a run with verifiers')
      else if (e.score <= 0) assert.equal(e.earned, 0, 'a negative score earns nothing')
    }
    assert.ok(
      scoredEntries.some((e) => e.score! > 0 && e.earned > 0 && e.earned < e.batches * 1000),
      'a positive score below full weight earns part',
    )
    assert.ok(
      scoredEntries.some((e) => e.score! >= FULL_WEIGHT_SCORE && e.earned === e.batches * 1000),
      'a score at or above full weight earns it all',
    )
    const rows = ledgerRows(end, prev)
    assert.deepEqual(
      rows,
      rewardRows(ledger, prev).filter((row) => row.score !== null || row.rounds > 0),
    )
  })

  it('set_rates: only the main authority, within bounds; an epoch keeps the rates it began with, the next starts with the new ones', async () => {
    const scenario = await rewardsAtScale(0, 6)
    const d = await deployRun(scenario.run_id, scenario.created_at)
    const signers = new Map<string, KeyPairSigner>()
    for (const label of Object.keys(scenario.clients)) {
      const k = await keypair(label)
      signers.set(clientIdOf(k.address), k)
      d.chain.airdrop(k.address)
    }
    d.chain.setTime(scenario.created_at)
    assert.ok((await d.chain.send(d.authority, [updateInstruction(d.programId, d.coordinator, d.authority, scenario.config, scenario.model)])).ok)
    const ledger = () => decodeLedger(d.chain.accountData(d.coordinator)!)
    const outsider = [...signers.values()][0]
    assert.equal((await d.chain.send(outsider, [setRatesInstruction(d.programId, d.coordinator, outsider, 5000, 1)])).error, 'Unauthorized')
    const over = setRatesInstruction(d.programId, d.coordinator, d.authority, 1, 1)
    const data = Buffer.from(over.data!)
    data.writeBigUInt64LE(1_000_001n, 1) // past MAX_POINTS_PER_BATCH (the builder refuses it)
    assert.equal((await d.chain.send(d.authority, [{...over, data}])).error, 'InvalidConfig')
    data.writeBigUInt64LE(1n, 1)
    data.writeBigUInt64LE(10n ** 12n + 1n, 9) // past MAX_TOKEN_RATE
    assert.equal((await d.chain.send(d.authority, [{...over, data}])).error, 'InvalidConfig')
    assert.throws(() => setRatesInstruction(d.programId, d.coordinator, d.authority, 1_000_001, 0), RangeError)
    assert.deepEqual([ledger().points_per_batch, ledger().token_rate, ledger().next], [1000, 0, null])

    assert.ok((await d.chain.send(d.authority, [setRatesInstruction(d.programId, d.coordinator, d.authority, 2500, 7)])).ok)
    assert.deepEqual([ledger().points_per_batch, ledger().next], [1000, {points_per_batch: 2500, token_rate: 7}], 'before an epoch begins, the rates wait for it')
    let midEpoch = false
    for (const [i, step] of scenario.steps.entries()) {
      d.chain.setClock(step.now, step.slot)
      const {signer, ix} = toInstruction(d, signers, step.event)
      const r = await d.chain.send(signer, Array.isArray(ix) ? ix : [ix])
      assert.ok(r.ok, `step ${i} (${step.event.type}): ${r.error}`)
      if (step.state.run_state === 'Warmup') assert.deepEqual([ledger().points_per_batch, ledger().token_rate], [2500, 7], 'the epoch began with the new rates')
      if (!midEpoch && step.state.progress.epoch === 1 && step.state.run_state === 'RoundTrain') {
        midEpoch = true // the second epoch is under way: new rates wait for the third
        assert.ok((await d.chain.send(d.authority, [setRatesInstruction(d.programId, d.coordinator, d.authority, 500, 1)])).ok)
      }
    }
    assert.ok(midEpoch)
    const end = ledger()
    assert.deepEqual([end.points_per_batch, end.token_rate, end.next], [2500, 7, {points_per_batch: 500, token_rate: 1}])
    assert.equal(end.entries.length, 6)
    for (const e of end.entries) assert.ok(e.rounds === 4 && e.batches > 0 && e.earned === e.batches * 2500, JSON.stringify(e))
  })
})
