import assert from 'node:assert/strict'
import {randomBytes} from 'node:crypto'
import {readFileSync, writeFileSync} from 'node:fs'
import {join} from 'node:path'
import {after, before, describe, it} from 'node:test'
import {generateKeyPairSigner, type Address} from '@solana/kit'
import {loadKeypair, readMetadata, readRun} from '../../src/core/backend/solana/admin.js'
import {RpcChain} from '../../src/core/backend/solana/chain.js'
import {coordinatorAddress, peerAddress} from '../../src/core/backend/solana/instructions.js'
import {addressOfClient} from '../../src/core/backend/solana/layout.js'
import {associatedTokenAddress, tokenBalance} from '../../src/core/backend/solana/spl.js'
import {ensureDemoCorpus} from '../../src/core/corpus.js'
import {identityFromSeed} from '../../src/core/protocol/identity.js'
import {JsonProcess, hashesByStep, sparseLoCoResultSize, writeE2eRun} from '../e2e/helpers.js'
import type {TestnetSummary} from '../../src/core/testnet/summary.js'
import {runCli, tempDir} from '../helpers.js'
import {balance, createMint, createTokenAccount, mintTo} from './spl.js'

/**
 * End to end over Solana, with real processes: `psyche solana localnet` (the committed programs in LiteSVM behind the
 * JSON-RPC API), the run creator's commands, and `psyche join --rpc` clients, each with its PyTorch worker and libp2p
 * node; then `psyche testnet --backend solana`. Every test asserts that peers' results were applied, that the
 * replicas' parameters are equal and that they changed every round.
 */

/** A Solana CLI keypair file (secret seed then public key) and its client id. */
function writeKeypair(path: string): {address: Address; id: string} {
  const seed = randomBytes(32)
  const identity = identityFromSeed(seed)
  writeFileSync(path, JSON.stringify([...seed, ...identity.publicKey]), {mode: 0o600})
  return {address: addressOfClient(identity.id), id: identity.id}
}

/** The e2e run, on chain: its model is the plan's (a Dummy checkpoint naming the run's model directory). */
function writeSolanaRun(dir: string, shape: Parameters<typeof writeE2eRun>[1]): string {
  const path = writeE2eRun(dir, shape)
  const text = readFileSync(path, 'utf8')
  assert.ok(text.includes('[model.LLM.checkpoint.Local]\npath = "model"'))
  writeFileSync(path, text.replace('[model.LLM.checkpoint.Local]\npath = "model"', '[model.LLM.checkpoint.Dummy]\nrepo_id = "model"'))
  return path
}

function assertTrainedTogether(clients: JsonProcess[], steps: number[]): void {
  const byStep = hashesByStep(clients)
  for (const step of steps) {
    const hashes = byStep.get(step)
    assert.ok(hashes && hashes.size === clients.length, `step ${step}: applied by ${hashes ? [...hashes.keys()] : 'nobody'}`)
    assert.equal(new Set(hashes.values()).size, 1, `step ${step}: parameter hashes differ: ${JSON.stringify([...hashes])}`)
  }
  // the parameters changed every round, from the loaded model on
  const loaded = clients[0].events.find((e) => e.event === 'model_loaded')?.param_hash
  const chain = [loaded, ...steps.map((s) => [...byStep.get(s)!.values()][0])]
  assert.equal(new Set(chain).size, chain.length, `the model changed every round: ${chain.map((h) => String(h).slice(0, 8))}`)
  for (const c of clients) {
    for (const r of c.rounds().filter((x) => steps.includes(x.step))) {
      const round = r
      assert.equal(typeof round.loss, 'number', `${c.name} step ${r.step}: trained`)
      assert.equal(round.peers_applied, clients.length - 1, `${c.name} step ${r.step}: applied its peers' results (${JSON.stringify(r)})`)
    }
  }
}

describe('end to end on Solana: localnet, run creator commands, join --rpc clients', {timeout: 300_000}, () => {
  const dir = tempDir('psyche-sol-e2e-')
  const procs: JsonProcess[] = []
  before(async () => {
    await ensureDemoCorpus()
  })
  after(async () => {
    await Promise.all(procs.map((p) => p.stop()))
    dir.cleanup()
  })

  it('two clients join a run created on the localnet and train 4 rounds over the program', async () => {
    // every client verifies (100 %): each scores the other's result of the round before and reports it (report_scores)
    const state = writeSolanaRun(dir.path, {runId: 'sol-e2e', roundsPerEpoch: 2, totalSteps: 4, initMinClients: 2, verificationPercent: 100})
    const authority = writeKeypair(join(dir.path, 'authority.json'))
    const keys = ['a', 'b'].map((n) => ({name: n, path: join(dir.path, `${n}.json`), ...writeKeypair(join(dir.path, `${n}.json`))}))
    const programId = (await generateKeyPairSigner()).address
    const authorizerId = (await generateKeyPairSigner()).address
    const treasurerId = (await generateKeyPairSigner()).address
    const fund = [authority, ...keys].flatMap((k) => ['--fund', k.address])
    const localnet = new JsonProcess('localnet', [
      'solana',
      'localnet',
      '--program-id',
      programId,
      '--authorizer-id',
      authorizerId,
      '--treasurer-id',
      treasurerId,
      '--port',
      '0',
      ...fund,
      '--json',
    ])
    procs.push(localnet)
    const url = (await localnet.waitFor((e) => e.event === 'listening', 'the localnet to listen', 60_000)).url as string
    const solana = ['--rpc', url, '--program-id', programId]
    const treasurer = [...solana, '--treasurer-id', treasurerId]

    const created = await runCli([
      'create-run',
      ...solana,
      '--ws-rpc',
      url.replace(/^http/, 'ws'),
      '--run-id',
      'sol-e2e',
      '--name',
      'Solana e2e',
      '--description',
      'two clients, four rounds',
      '--config-path',
      state,
      '--keypair',
      join(dir.path, 'authority.json'),
      '--json',
    ])
    assert.equal(created.exitCode, 0, created.stderr)
    // the token rate applies from the first epoch: it begins after this
    const rates = await runCli(['set-rates', ...solana, '--run-id', 'sol-e2e', '--keypair', join(dir.path, 'authority.json'), '--points-per-batch', '1000', '--token-rate', '2'])
    assert.equal(rates.exitCode, 0, rates.stderr)
    const resumed = await runCli(['set-paused', ...solana, '--run-id', 'sol-e2e', '--keypair', join(dir.path, 'authority.json'), 'resume'])
    assert.equal(resumed.exitCode, 0, resumed.stderr)

    const clients = keys.map(
      (k) =>
        new JsonProcess(k.name, [
          'join',
          ...solana,
          '--ws-rpc',
          url.replace('http', 'ws'),
          '--run-id',
          'sol-e2e',
          '--keypair',
          k.path,
          '--config',
          state,
          '--threads',
          '1',
          '--p2p-listen',
          '/ip4/127.0.0.1/tcp/0',
          '--json',
        ]),
    )
    procs.push(...clients)
    for (const c of clients) await c.waitFor((e) => e.event === 'finished', 'the run to finish', 240_000)

    assertTrainedTogether(clients, [1, 2, 3, 4])
    // leaving the finished run, each client closed its peer record (its rent came back)
    for (const [i, c] of clients.entries()) {
      assert.ok(
        c.events.some((e) => e.event === 'peer_record_closed' && e.address === keys[i].address),
        `${c.name} closed its peer record`,
      )
      const coordinator = await coordinatorAddress(programId, 'sol-e2e')
      assert.equal(await new RpcChain(url).fetchAccount(await peerAddress(programId, coordinator, keys[i].address)), undefined)
    }
    for (const [i, c] of clients.entries()) assert.equal(c.events.find((e) => e.event === 'started')?.client_id, keys[i].id, `${c.name}: its client id is its key`)
    // The run on chain: finished, with both keys as its clients.
    const run = await readRun({chain: new RpcChain(url), programId, runId: 'sol-e2e'})
    assert.equal(run.state.run_state, 'Finished')
    assert.deepEqual(run.state.epoch.clients.map((c) => c.id).sort(), keys.map((k) => k.id).sort())
    assert.equal(run.main_authority, authority.address)
    assert.deepEqual(await readMetadata({chain: new RpcChain(url), programId, runId: 'sol-e2e'}), {name: 'Solana e2e', description: 'two clients, four rounds'})
    // each verifier's scores reached the program: none refused
    for (const c of clients) {
      assert.ok(
        c.events.some((e) => e.event === 'scored'),
        `${c.name} scored its peer's results`,
      )
      assert.deepEqual(
        c.events.filter((e) => e.event === 'rejected' && e.of === 'report_scores'),
        [],
        `${c.name}: report_scores refused`,
      )
    }
    // psyche rewards --rpc: the program's ledger; both epochs settled; each client scored on chain by the other and paid
    // by its score's weight (at most 1000 points per accepted batch)
    const rewardsOf = async () => {
      const rewards = await runCli(['rewards', ...treasurer, '--run-id', 'sol-e2e', '--json'])
      assert.equal(rewards.exitCode, 0, rewards.stderr)
      return JSON.parse(rewards.stdout) as {
        points_per_batch: number
        token_rate: number
        clients: {client_id: string; score: number | null; weight: number; rounds: number; batches: number; earned: number; pending: number; slashed: number; claimed: number}[]
      }
    }
    const ledger = await rewardsOf()
    assert.deepEqual([ledger.points_per_batch, ledger.token_rate], [1000, 2])
    assert.deepEqual(ledger.clients.map((c) => c.client_id).sort(), keys.map((k) => k.id).sort())
    for (const c of ledger.clients) {
      assert.equal(c.rounds, 4, `${c.client_id}: every round's result was accepted`)
      assert.ok(c.score !== null && c.score > 0 && c.weight > 0, `${c.client_id}: scored on chain ${JSON.stringify(c)}`)
      assert.ok(c.batches >= 4 && c.earned > 0 && c.earned <= c.batches * 1000 && c.pending === 0 && c.slashed === 0 && c.claimed === 0, JSON.stringify(c))
    }
    const text = await runCli(['rewards', ...solana, '--run-id', 'sol-e2e'])
    assert.match(text.stdout, /rewards at epoch 2, step 5 \(points: 1000 per accepted batch at full weight; a claim pays 2 token units per point\)/)

    // token rewards (the treasurer program): the authority creates and funds the run's treasury, client a claims its
    // points × 2 once; psyche rewards then shows them claimed
    const chain = new RpcChain(url)
    const authorityKey = await loadKeypair(join(dir.path, 'authority.json'))
    const mint = await createMint(chain, authorityKey)
    const source = await createTokenAccount(chain, authorityKey, authorityKey.address, mint)
    await mintTo(chain, authorityKey, mint, source, 1_000_000n)
    const funded = await runCli([
      'rewards',
      'fund',
      ...treasurer,
      '--run-id',
      'sol-e2e',
      '--keypair',
      join(dir.path, 'authority.json'),
      '--mint',
      mint,
      '--from',
      source,
      '--amount',
      '1000000',
      '--json',
    ])
    assert.equal(funded.exitCode, 0, funded.stderr)
    assert.equal(JSON.parse(funded.stdout).balance, '1000000')
    const aKey = await loadKeypair(keys[0].path)
    const wallet = await createTokenAccount(chain, aKey, aKey.address, mint)
    const earnedA = ledger.clients.find((c) => c.client_id === keys[0].id)!.earned
    const claim = () => runCli(['rewards', 'claim', ...treasurer, '--run-id', 'sol-e2e', '--keypair', keys[0].path, '--to', wallet, '--json'])
    const paid = await claim()
    assert.equal(paid.exitCode, 0, paid.stderr)
    assert.deepEqual(JSON.parse(paid.stdout), {
      run_id: 'sol-e2e',
      client_id: keys[0].id,
      points: earnedA,
      amount: String(earnedA * 2),
      earned: earnedA,
      claimed: earnedA,
      mint,
      to: wallet,
    })
    assert.equal(await balance(chain, wallet), BigInt(earnedA * 2))
    const twice = await runCli(['rewards', 'claim', ...treasurer, '--run-id', 'sol-e2e', '--keypair', keys[0].path, '--to', wallet])
    assert.equal(twice.exitCode, 1)
    assert.match(twice.stderr, /NothingToClaim/)
    assert.equal(await balance(chain, wallet), BigInt(earnedA * 2), 'claiming twice paid once')
    // client b claims to its associated token account (the default), which the claim's transaction creates
    const earnedB = ledger.clients.find((c) => c.client_id === keys[1].id)!.earned
    const paidB = await runCli(['rewards', 'claim', ...treasurer, '--run-id', 'sol-e2e', '--keypair', keys[1].path, '--json'])
    assert.equal(paidB.exitCode, 0, paidB.stderr)
    const bWallet = await associatedTokenAddress(keys[1].address, mint)
    assert.deepEqual([JSON.parse(paidB.stdout).amount, JSON.parse(paidB.stdout).to], [String(earnedB * 2), bWallet])
    assert.equal(tokenBalance(await chain.fetchAccount(bWallet)), BigInt(earnedB * 2))
    const after = await rewardsOf()
    assert.deepEqual(
      after.clients.map((c) => [c.client_id, c.claimed]),
      ledger.clients.map((c) => [c.client_id, c.client_id === keys[0].id ? earnedA : earnedB]),
    )
    // psyche status --rpc and psyche dashboard --rpc show the same points, from the same ledger
    const status = await runCli(['status', ...treasurer, '--run-id', 'sol-e2e', '--json'])
    assert.equal(status.exitCode, 0, status.stderr)
    const st = JSON.parse(status.stdout) as {run_state: string; scores: {client_id: string; average: number; count: number}[]; rewards: typeof ledger.clients}
    assert.equal(st.run_state, 'Finished')
    assert.deepEqual(
      st.scores.map((x) => ({id: x.client_id, score: x.average})),
      ledger.clients.map((c) => ({id: c.client_id, score: c.score})),
      'status --rpc: the scores on chain',
    )
    assert.deepEqual(st.rewards, after.clients, 'status --rpc: the ledger rewards --rpc shows')
    const statusText = await runCli(['status', ...solana, '--run-id', 'sol-e2e'])
    for (const c of ledger.clients) assert.match(statusText.stdout, new RegExp(`${c.client_id.slice(0, 16)}….*  points ${c.earned} earned`))
    const dash = new JsonProcess('dashboard', ['dashboard', ...solana, '--run-id', 'sol-e2e', '--poll-interval', '1', '--json'])
    procs.push(dash)
    const page = (await dash.waitFor((e) => e.event === 'dashboard_listening', 'the dashboard', 60_000)).url as string
    const api = (await (await fetch(new URL('/api/status', page))).json()) as {
      summary: {run_state: string}
      clients: {id: string; earned: number; pending_points: number; slashed: number; score: number | null}[]
    }
    assert.equal(api.summary.run_state, 'Finished')
    assert.deepEqual(
      api.clients.map((c) => ({id: c.id, earned: c.earned, pending: c.pending_points, slashed: c.slashed, score: c.score})).sort((a, b) => (a.id < b.id ? -1 : 1)),
      ledger.clients.map((c) => ({id: c.client_id, earned: c.earned, pending: c.pending, slashed: c.slashed, score: c.score})),
      "the dashboard's client table carries the ledger's points",
    )
    await dash.stop()
  })

  // SparseLoCo (2 inner steps a round: each round holds 2 global batches on chain), and a client killed in the middle of
  // round 2 (--kill-after-step 1), the last of epoch 0, that rejoins at the epoch boundary (init_min_clients = 3: epoch 1
  // waits for it) and trains round 3 with the others: the centralized backend's faults test, on Solana. It costs about
  // 20 s more than the same testnet's 3 DisTrO rounds without a kill (69 s against 50 s on 2 busy cores).
  it("psyche testnet --backend solana --json: 3 clients, SparseLoCo, the run on a localnet (strict: 1,232-byte transactions, compute limits, deploy-time checks), clients joined with --rpc; a client killed mid-round rejoins at an epoch boundary; every round's hashes agree and apply the peers' contributions", async () => {
    const run = tempDir('psyche-sol-testnet-')
    try {
      writeE2eRun(run.path, {
        runId: 'sol-testnet',
        roundsPerEpoch: 2,
        totalSteps: 100,
        initMinClients: 3,
        minClients: 2,
        maxRoundTrainTime: 4,
        lr: 1e-2,
        sparseloco: {innerSteps: 2},
      })
      const started = Date.now()
      // prettier-ignore
      const r = await runCli(['testnet', '--backend', 'solana', '--clients', '3', '--config', run.path, '--rounds', '3', '--kill-after-step', '1', '--threads', '1', '--timeout', '200', '--json'], {
        timeoutMs: 230_000,
      })
      console.log(`# testnet --backend solana, SparseLoCo, kill and rejoin: ${((Date.now() - started) / 1000).toFixed(1)} s`)
      assert.equal(r.exitCode, 0, r.stderr)
      const summary = JSON.parse(r.stdout) as TestnetSummary
      assert.equal(summary.ended, 'rounds')
      // one client killed once, after step 1 (in round 2), restarted, and back at the first round of a later epoch
      assert.equal(summary.kills.length, 1, JSON.stringify(summary.kills))
      const [kill] = summary.kills
      assert.ok(kill.after_step !== null && kill.after_step >= 1, JSON.stringify(kill))
      assert.equal(summary.rejoins.length, 1, JSON.stringify(summary.rejoins))
      const [rejoin] = summary.rejoins
      assert.equal(rejoin.client, kill.client)
      const at = summary.rounds.find((x) => x.step === rejoin.first_step)
      const before = summary.rounds.find((x) => x.step === rejoin.first_step! - 1)
      assert.ok(at && before && at.epoch === before.epoch + 1, `the rejoin's first round begins an epoch: ${JSON.stringify({rejoin, at, before})}`)
      assert.equal(at.clients[kill.client].param_hash, rejoin.param_hash)
      assert.ok(
        summary.rounds.some((x) => !(kill.client in x.clients)),
        'rounds went on without the killed client',
      )
      // every round: equal hashes, every client present applied its peers' contributions, and the model changed
      for (const round of summary.rounds) {
        assert.equal(round.hashes_equal, true, JSON.stringify(round))
        const names = Object.keys(round.clients)
        assert.ok(names.length >= 2, JSON.stringify(round))
        for (const c of Object.values(round.clients)) assert.ok(c.peers_applied !== null && c.peers_applied >= 1 && c.peers_applied <= 2, JSON.stringify(round))
        if (round.step >= rejoin.first_step!) assert.equal(names.length, 3, `step ${round.step}: all three again`)
        // before the kill, and after the rejoin's first round: each applied both peers' contributions
        if (round.step <= kill.after_step! || round.step > rejoin.first_step!) for (const c of Object.values(round.clients)) assert.equal(c.peers_applied, 2, JSON.stringify(round))
      }
      assert.equal(summary.rounds_without_exchange, 0, 'every round applied the peers’ contributions')
      const hashes = summary.rounds.map((x) => Object.values(x.clients)[0].param_hash)
      assert.equal(new Set(hashes).size, hashes.length, 'the model changed every round')
      // the clients ran the run's SparseLoCo: every result has PSSL's size (chunk 32, top-32, 2-bit: writeE2eRun's)
      assert.equal(summary.result_bytes_per_round, await sparseLoCoResultSize(join(run.path, 'model', 'config.json'), 32, 32, 2))
      for (const b of Object.values(summary.bytes) as {in: number; out: number}[]) assert.ok(b.in > 0 && b.out > 0)
    } finally {
      run.cleanup()
    }
  })
})
