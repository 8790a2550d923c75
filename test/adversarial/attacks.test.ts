import assert from 'node:assert/strict'
import {join} from 'node:path'
import {after, before, describe, it} from 'node:test'
import {ensureDemoCorpus} from '../../src/core/corpus.js'
import {projectRoot} from '../../src/core/worker/python.js'
import {runCli, tempDir} from '../helpers.js'
import {DEFAULT_SCORE_SETTINGS} from '../../src/core/verify/score.js'
import {pointsFor, WEIGHT_ONE, type RewardRow} from '../../src/core/coordinator/rewards.js'
import {fieldOf, hashesByStep, JsonProcess, type Line, startClient, startServer, writeE2eRun} from '../e2e/helpers.js'

/**
 * Real processes: a coordinator, three honest clients (`psyche join`) and two hostile ones (the real client with
 * a hostile result producer, test/adversarial/adversary.ts) per run. Every attack must be detected and logged
 * by the honest clients with the attacker's id and a reason, its results never applied, and the honest replicas
 * must keep training bit-identically while applying each other's results.
 */

const adversaryEntry = ['--import', 'tsx', join(projectRoot, 'test', 'adversarial', 'adversary.ts')]

interface Expect {
  attack: string
  /** What every honest client logs about the attacker (event and reason); none for `dropped`. */
  detected?: (e: Line, attacker: string) => boolean
  /**
   * Its round's witnesses did not see its result: the coordinator drops it when that round closes (no health check is
   * needed), and `psyche status` shows it Dropped.
   */
  dropped?: boolean
  /** Steps in which this attacker's result may still be applied (a replay needs an old result first). */
  honestSteps?: number[]
  /**
   * Caught by verifiers' scores: its results may be applied until a verifier quorum ejects it (scores of a round
   * are taken while the next one runs, over a window of two), and every honest client must then log its result
   * excluded from the round; never applied after that.
   */
  byScore?: boolean
  /** Ejected early in the run's single epoch: it may not join again (Banned), so it waits for the next epoch instead of asking. */
  banned?: boolean
}

const rejected = (pattern: RegExp) => (e: Line, attacker: string) => e.event === 'result_rejected' && e.client_id === attacker && pattern.test(e.reason)

async function attackRun(name: string, cases: Expect[], shape: {rounds?: number; verificationPercent?: number} = {}): Promise<void> {
  const started = Date.now()
  const rounds = shape.rounds ?? 4
  const dir = tempDir(`psyche-adv-${name}-`)
  const procs: JsonProcess[] = []
  try {
    const state = writeE2eRun(dir.path, {
      runId: 'e2e',
      roundsPerEpoch: rounds,
      totalSteps: rounds,
      initMinClients: 3 + cases.length,
      minClients: 2,
      maxRoundTrainTime: 20,
      warmupTime: 120,
      lr: 1e-2,
      verificationPercent: shape.verificationPercent ?? 0,
    })
    const {server, port} = await startServer(state)
    procs.push(server)
    const honest = ['h1', 'h2', 'h3'].map((n) => startClient(n, port, state))
    const adversaries = cases.map((c) => new JsonProcess(`adversary-${c.attack}`, [`127.0.0.1:${port}`, 'e2e', state, c.attack], adversaryEntry))
    procs.push(...honest, ...adversaries)
    for (const c of honest) await c.waitFor((e) => e.event === 'finished', 'the run to finish', 480_000)
    const ids = await Promise.all(adversaries.map(async (a) => (await a.waitFor((e) => e.event === 'adversary', 'the adversary to start', 10_000)).client_id as string))

    // Detected, logged with the peer and the reason, by every honest client.
    for (const [i, c] of cases.entries()) {
      const detected = c.detected
      if (!detected) continue
      for (const h of honest) {
        const hit = h.events.find((e) => detected(e, ids[i]))
        assert.ok(
          hit,
          `${h.name} never logged the ${c.attack} attack by ${ids[i].slice(0, 12)}: ${JSON.stringify(h.events.filter((e) => fieldOf(e, 'client_id') === ids[i] || e.event === 'health_check').slice(0, 5))}`,
        )
      }
    }
    for (const [i, c] of cases.entries()) {
      if (!c.banned) continue
      const events = adversaries[i].events
      const at = events.findIndex((e) => e.event === 'banned')
      assert.ok(
        at >= 0,
        `${c.attack}: the ejected attacker was never refused as banned: ${JSON.stringify(events.filter((e) => /rejoin|reject/.test(String(e.event))).slice(0, 5))}`,
      )
      assert.ok(!events.slice(at + 1).some((e) => e.event === 'rejoining'), `${c.attack}: it kept asking to join while banned`)
    }
    // Honest replicas: identical after every round, the model changes every round, and they apply each other's
    // results — never more than the three honest ones.
    const byStep = hashesByStep(honest)
    assert.deepEqual(
      [...byStep.keys()].sort((x, y) => x - y),
      Array.from({length: rounds}, (_, i) => i + 1),
    )
    for (const [step, hashes] of byStep) {
      assert.equal(hashes.size, 3, `step ${step}: every honest client applied it`)
      assert.equal(new Set(hashes.values()).size, 1, `step ${step}: honest parameter hashes differ: ${JSON.stringify([...hashes])}`)
    }
    const summary = honest[0].rounds().map((r) => `step ${r.step}: applied ${r.applied} hash ${r.param_hash.slice(0, 8)}`)
    assert.equal(new Set([...byStep.values()].map((h) => [...h.values()][0])).size, rounds, `the model changed every round: ${summary.join('; ')}`)
    // Caught by score: every honest client excludes its in-flight result in the same round, and applied its results only before.
    const excludedAt = new Map<string, number>()
    for (const [i, c] of cases.entries()) {
      if (!c.byScore) continue
      const steps = honest.map((h) => h.events.filter((e) => e.event === 'results_excluded').find((e) => e.client_ids.includes(ids[i]))?.step)
      assert.ok(
        steps.every((x) => x !== undefined),
        `${c.attack}: not every honest client excluded ${ids[i].slice(0, 12)}'s result: ${JSON.stringify(steps)}`,
      )
      assert.equal(new Set(steps).size, 1, `${c.attack}: honest clients excluded it in different steps: ${JSON.stringify(steps)}`)
      excludedAt.set(ids[i], steps[0]!)
    }
    const allowed = (step: number) => 3 + cases.filter((c, i) => c.honestSteps?.includes(step) || (c.byScore && step < excludedAt.get(ids[i])!)).length
    for (const h of honest) {
      const applied = h.rounds().map((r) => r.applied)
      for (const r of h.rounds()) {
        const n = r.applied
        assert.ok(n <= allowed(r.step), `${h.name}: step ${r.step} applied ${n} results: an attacker's result was applied`)
      }
      assert.ok(applied.filter((n) => n >= 2).length >= 3, `${h.name}: applied ${applied.join(',')}: honest results were not exchanged`)
      assert.ok(
        !h.events.some((e) => e.event === 'error' || e.event === 'out_of_sync'),
        `${h.name} failed: ${JSON.stringify(h.events.filter((e) => e.event === 'error' || e.event === 'out_of_sync'))}`,
      )
    }
    if (cases.some((c) => c.dropped)) {
      const status = await runCli(['status', '--server-addr', `127.0.0.1:${port}`, '--json'])
      assert.equal(status.exitCode, 0, status.stderr)
      const states = new Map((JSON.parse(status.stdout).clients as {id: string; state: string}[]).map((x) => [x.id, x.state]))
      for (const [i, c] of cases.entries()) if (c.dropped) assert.equal(states.get(ids[i]), 'Dropped', `${c.attack}: its state in status: ${JSON.stringify([...states])}`)
    }
    if (cases.some((c) => c.byScore)) {
      // The server's state: `psyche status --json` shows every scored client's moving average from the verifiers'
      // reports — the attackers' below the threshold, the honest clients' above it.
      const status = await runCli(['status', '--server-addr', `127.0.0.1:${port}`, '--json'])
      assert.equal(status.exitCode, 0, status.stderr)
      const scores = new Map((JSON.parse(status.stdout).scores as {client_id: string; average: number; count: number}[]).map((x) => [x.client_id, x]))
      for (const [i, c] of cases.entries()) {
        if (!c.byScore) continue
        const sc = scores.get(ids[i])
        assert.ok(sc && sc.count >= 2 && sc.average < DEFAULT_SCORE_SETTINGS.threshold, `${c.attack}: status scores ${JSON.stringify(sc)}`)
      }
      const others = [...scores.values()].filter((x) => !ids.includes(x.client_id))
      assert.ok(others.length >= 3, `status scores honest clients: ${JSON.stringify([...scores.values()])}`)
      for (const x of others) assert.ok(x.average > DEFAULT_SCORE_SETTINGS.threshold, `an honest client's score in status: ${JSON.stringify(x)}`)
    }
    // Rewards (`psyche rewards --json`, the server's ledger after the run's one epoch): no attack earns anything — an
    // attacker is paid at most for the rounds it worked honestly (honestSteps) — and each honest client earns for its
    // accepted batches at its score's weight.
    const rewards = await runCli(['rewards', '--server-addr', `127.0.0.1:${port}`, '--json'])
    assert.equal(rewards.exitCode, 0, rewards.stderr)
    const rows = (JSON.parse(rewards.stdout) as {clients: RewardRow[]}).clients
    const rowOf = new Map(rows.map((r) => [r.client_id, r]))
    for (const [i, c] of cases.entries()) {
      const r = rowOf.get(ids[i])
      const paidRounds = c.honestSteps?.length ?? 0
      assert.ok((r?.rounds ?? 0) <= paidRounds || (r?.earned ?? 0) === 0, `${c.attack}: the attacker earned ${JSON.stringify(r)}`)
      if (paidRounds === 0) assert.equal(r?.earned ?? 0, 0, `${c.attack}: the attacker earned points: ${JSON.stringify(r)}`)
      // Ejected by a verifier quorum: what its results accepted before that would have earned is slashed.
      if (c.byScore && r)
        assert.ok(r.earned === 0 && r.slashed === pointsFor(r.batches, Math.round(r.weight * WEIGHT_ONE)), `${c.attack}: slashed, not earned: ${JSON.stringify(r)}`)
    }
    const honestRows = rows.filter((r) => !ids.includes(r.client_id))
    assert.equal(honestRows.length, 3, `three honest clients in the ledger: ${JSON.stringify(rows)}`)
    for (const r of honestRows) {
      assert.ok(r.rounds >= rounds - 1 && r.weight > 0 && r.slashed === 0, `an honest client's rewards: ${JSON.stringify(r)}`)
      assert.equal(r.earned, pointsFor(r.batches, Math.round(r.weight * WEIGHT_ONE)), `earned = accepted batches × 1000 × weight: ${JSON.stringify(r)}`)
    }
    // Points per accepted round differ among honest clients only by their batch shares and their scores' weights.
    const perRound = honestRows.map((r) => r.earned / r.rounds)
    const shares = honestRows.map((r) => r.batches / r.rounds)
    const weights = honestRows.map((r) => r.weight)
    const spread = (xs: number[]) => Math.max(...xs) / Math.min(...xs)
    assert.ok(spread(perRound) <= spread(shares) * spread(weights) + 1e-9, `points per round ${perRound}, batch shares ${shares}, weights ${weights}`)
    console.error(
      `adversarial ${name}: ${Math.round((Date.now() - started) / 1000)} s; rewards ${JSON.stringify(rows.map((r) => [r.client_id.slice(0, 8), r.rounds, r.earned, r.slashed]))}`,
    )
  } catch (error) {
    for (const p of procs) {
      const tail = p.events.slice(-25).map((e) => JSON.stringify(e).slice(0, 300))
      console.error(`--- ${p.name} (last events)\n${tail.join('\n')}\n${p.stderr.join('').slice(-800)}`)
    }
    throw error
  } finally {
    await Promise.all(procs.map((p) => p.stop()))
    dir.cleanup()
  }
}

describe('adversarial: hostile clients among honest ones (real processes)', {timeout: 1_800_000}, () => {
  before(async () => {
    await ensureDemoCorpus()
  })
  after(() => {})

  it('garbage bytes and equivocation: rejected, the producers accused or proven, ejected by the coordinator', async () => {
    await attackRun('garbage-equivocation', [
      {attack: 'garbage', detected: rejected(/^invalid result: bad magic/), banned: true},
      {attack: 'equivocation', detected: rejected(/^equivocation: .* signed two different results for step \d+/), banned: true},
    ])
  })

  // Three attackers: the replayer and the late one witness honestly in round 1, so the honest results still reach
  // the witness quorum of six (4) while the oversized one is ejected.
  it('a replayed old result, a result sent after the round, and an oversized payload', async () => {
    await attackRun('replay-late-oversized', [
      {attack: 'replay', detected: rejected(/^replay: the same result as its own for step \d+/), honestSteps: [1]},
      {attack: 'late', dropped: true},
      {attack: 'oversized', detected: rejected(/^invalid result: announced size \d+ bytes/)},
    ])
  })

  const lowScore = (e: Record<string, unknown>, attacker: string) =>
    e.event === 'accused' && e.client_id === attacker && /^low_score: moving average -?[\d.]+ below/.test(String(e.reason))

  it("a re-signed copy of another client's result with other bytes (index overlap) and a result trained on the wrong batches (scores)", async () => {
    await attackRun(
      'copy-wrong-batches',
      [
        {attack: 'copy', detected: rejected(/^copy: index overlap 1\.000 with [0-9a-f]{64}'s result for step \d+/)},
        {attack: 'wrong_batches', detected: lowScore, byScore: true},
      ],
      {rounds: 6, verificationPercent: 100},
    )
  })

  it('a sign-flipped and a random well-formed result: verifiers score them low, a verifier quorum ejects them, their in-flight results are excluded', async () => {
    await attackRun(
      'sign-flip-random',
      [
        {attack: 'sign_flip', detected: lowScore, byScore: true},
        {attack: 'random', detected: lowScore, byScore: true},
      ],
      {rounds: 6, verificationPercent: 100},
    )
  })
})
