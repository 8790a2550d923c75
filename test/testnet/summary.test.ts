import assert from 'node:assert/strict'
import {describe, it} from 'node:test'
import {killCandidates, parseRoundLine, pickVictims, RoundBook} from '../../src/core/testnet/index.js'
import {KillScheduler} from '../../src/core/testnet/kills.js'

const line = (step: number, hash: string, bytesIn = 10, bytesOut = 20, result: number | null = 100, peers: [number, number] | null = [1, 1]) => ({
  step,
  epoch: 0,
  loss: 1.5,
  param_hash: hash,
  bytes_in: bytesIn,
  bytes_out: bytesOut,
  result_bytes: result,
  peers_applied: peers?.[0] ?? null,
  other_trainers: peers?.[1] ?? null,
})

describe('testnet round summary (pure)', () => {
  it("gathers each client's rounds, flags differing hashes, cuts at --rounds, averages result sizes", () => {
    const b = new RoundBook(['client-0', 'client-1'])
    b.recordRound('client-0', line(1, 'aa'))
    b.recordRound('client-1', line(1, 'aa'))
    b.recordRound('client-0', line(2, 'bb', 10, 20, 300))
    b.recordRound('client-1', line(2, 'cc'))
    b.recordRound('client-0', line(3, 'dd'))
    const s = b.summary({runId: 'r', rounds: 2, wallSeconds: 12.345, ended: 'rounds'})
    assert.deepEqual(
      s.rounds.map((r) => [r.step, r.hashes_equal]),
      [
        [1, true],
        [2, false],
      ],
    )
    assert.deepEqual(s.rounds[1].clients['client-1'], {loss: 1.5, val_loss: null, param_hash: 'cc', peers_applied: 1, other_trainers: 1})
    assert.deepEqual(s.validation, [], 'no client evaluated')
    assert.equal(s.result_bytes_per_round, 140)
    assert.equal(s.wall_seconds, 12.3)
    assert.deepEqual(s.clients, ['client-0', 'client-1'])
  })

  it("sums bytes over a restarted client's generations, and records kills and rejoins", () => {
    const b = new RoundBook(['client-0'])
    b.recordRound('client-0', line(1, 'aa', 100, 200))
    b.recordKill('client-0', 3, 1)
    b.recordExit('client-0')
    b.recordRound('client-0', line(5, 'ee', 7, 9))
    b.recordRejoin('client-0', 8, {step: 5, param_hash: 'ee'})
    const s = b.summary({runId: 'r', wallSeconds: 9, ended: 'finished'})
    assert.deepEqual(s.bytes['client-0'], {in: 107, out: 209})
    assert.deepEqual(s.kills, [{client: 'client-0', at_seconds: 3, after_step: 1}])
    assert.deepEqual(s.rejoins, [{client: 'client-0', at_seconds: 8, first_step: 5, param_hash: 'ee'}])
  })

  it("a round in which a client applied none of its peers' results (while they trained) counts as no exchange, equal hashes or not", () => {
    const b = new RoundBook(['client-0', 'client-1'])
    b.recordRound('client-0', line(1, 'aa', 10, 20, 100, [1, 1]))
    b.recordRound('client-1', line(1, 'aa', 10, 20, 100, [1, 1]))
    // Each trained alone: hashes may even agree (nothing changed), yet nothing was exchanged.
    b.recordRound('client-0', line(2, 'aa', 10, 20, 100, [0, 1]))
    b.recordRound('client-1', line(2, 'aa', 10, 20, 100, [0, 1]))
    // Alone in the round: nobody else trained, nothing to exchange.
    b.recordRound('client-0', line(3, 'bb', 10, 20, 100, [0, 0]))
    const s = b.summary({runId: 'r', wallSeconds: 1, ended: 'rounds'})
    assert.deepEqual(
      s.rounds.map((r) => [r.step, r.hashes_equal, r.exchanged]),
      [
        [1, true, true],
        [2, true, false],
        [3, true, true],
      ],
    )
    assert.equal(s.rounds_without_exchange, 1)
  })

  it('the validation loss: the mean of the clients that evaluated, at each evaluated step', () => {
    const b = new RoundBook(['client-0', 'client-1'])
    b.recordRound('client-0', {...line(1, 'aa'), val_loss: null})
    b.recordRound('client-0', {...line(2, 'bb'), val_loss: 4.5})
    b.recordRound('client-1', {...line(2, 'bb'), val_loss: 4.5002})
    b.recordRound('client-0', {...line(3, 'cc'), val_loss: 3.25})
    assert.deepEqual(b.summary({runId: 'r', wallSeconds: 1, ended: 'finished'}).validation, [
      {step: 2, loss: 4.5001},
      {step: 3, loss: 3.25},
    ])
    assert.equal(parseRoundLine({event: 'round', step: 2, epoch: 0, loss: 1, param_hash: 'ab', bytes_in: 1, bytes_out: 2, val_loss: 3.5})?.val_loss, 3.5)
  })

  it('parseRoundLine reads round events and refuses other lines', () => {
    assert.deepEqual(parseRoundLine({event: 'round', step: 2, epoch: 1, loss: null, param_hash: 'ab', bytes_in: 1, bytes_out: 2}), {
      step: 2,
      epoch: 1,
      loss: null,
      param_hash: 'ab',
      bytes_in: 1,
      bytes_out: 2,
      result_bytes: null,
      val_loss: null,
      peers_applied: null,
      other_trainers: null,
    })
    assert.equal(parseRoundLine({event: 'trained', step: 2}), undefined)
    assert.equal(parseRoundLine({event: 'round', step: '2', param_hash: 'ab'}), undefined)
  })
})

describe('testnet kill scheduler: victims', () => {
  it('never kills every client, and picks distinct ones', () => {
    let i = 0
    const seq = [0.1, 0.1, 0.9, 0.5]
    const random = () => seq[i++ % seq.length]
    assert.deepEqual(pickVictims(['a', 'b', 'c'], 2, random), ['a', 'c'])
    assert.deepEqual(pickVictims(['a', 'b'], 5, Math.random).length, 1)
    assert.deepEqual(pickVictims(['a'], 1, Math.random), [])
  })

  it('kills live, unfinished clients only, and none once one has applied --rounds (a kill then only postpones the end)', () => {
    const c = (name: string, alive: boolean, finished: boolean, lastStep: number | null) => ({name, alive, finished, lastStep})
    const clients = [c('a', true, false, 12), c('b', false, false, 11), c('c', true, true, 12), c('d', true, false, null)]
    assert.deepEqual(
      killCandidates(clients, 30).map((x) => x.name),
      ['a', 'd'],
    )
    assert.deepEqual(
      killCandidates(clients, undefined).map((x) => x.name),
      ['a', 'd'],
    )
    clients[0].lastStep = 30
    assert.deepEqual(killCandidates(clients, 30), [])
    assert.deepEqual(
      killCandidates(clients, undefined).map((x) => x.name),
      ['a', 'd'],
    )
  })

  it('killNow (testnet --kill-after-step): kills that many candidates at once, never all, and restarts each after the delay', async () => {
    const killed: string[] = []
    const restarted: string[] = []
    let i = 0
    const seq = [0, 0.5, 0.9]
    const kills = new KillScheduler<string>({
      count: 0,
      intervalMs: 60_000,
      restartDelayMs: 5,
      random: () => seq[i++ % seq.length],
      candidates: () => ['a', 'b', 'c'],
      kill: (v) => killed.push(v),
      restart: (v) => restarted.push(v),
    })
    kills.killNow(1)
    assert.deepEqual([killed, restarted], [['a'], []])
    await new Promise((r) => setTimeout(r, 50))
    assert.deepEqual(restarted, ['a'])
    assert.equal(kills.active, false, 'no interval kills: --random-kill-num 0')
    kills.killNow(5)
    assert.deepEqual(killed, ['a', 'b', 'c'], 'never every client: 2 of the 3')
    kills.stop() // the pending restarts are dropped
    await new Promise((r) => setTimeout(r, 50))
    assert.deepEqual(restarted, ['a'])
  })
})
