import type {EventLine} from '../../src/core/events.js'
import assert from 'node:assert/strict'
import {createHash} from 'node:crypto'
import {describe, it} from 'node:test'
import {createKeyPairSignerFromPrivateKeyBytes, type KeyPairSigner} from '@solana/kit'
import {closePeerRecord, grant} from '../../src/core/backend/solana/admin.js'
import {SolanaBackend, SolanaConnector} from '../../src/core/backend/solana/client.js'
import {setPausedInstruction, updateInstruction} from '../../src/core/backend/solana/instructions.js'
import {clientIdOf, decodeLedger, ledgerRows, ledgerScores} from '../../src/core/backend/solana/layout.js'
import type {ClientComponents} from '../../src/core/client/components.js'
import {PsycheClient, type ClientOptions, type ClientSummary, type RoundEvent} from '../../src/core/client/runner.js'
import {HubServer} from '../../src/core/checkpoint/hub-server.js'
import {tempDir} from '../helpers.js'
import {join} from 'node:path'
import type {CoordinatorConfig} from '../../src/core/config/index.js'
import {identityFromSeed, type Identity} from '../../src/core/protocol/identity.js'
import {DeterministicWorker, ManualClock, MemoryNetwork, SIM_SEQ_LEN, memoryData, settle, type MemoryP2P} from '../sim/harness.js'
import {deployRun, readRun, testModel, type Deployed} from './harness.js'

/**
 * The Solana backend in-process: real PsycheClients (runner.ts unchanged) whose coordinator is the committed
 * program in LiteSVM, with the simulation's in-memory P2P layer, deterministic worker and manual clock. The chain's
 * clock follows the manual clock; the clients find each other only through their on-chain peer records.
 */

const T0 = 1_800_000_000

const config: CoordinatorConfig = {
  warmup_time: 5,
  cooldown_time: 2,
  epoch_time: 30,
  max_round_train_time: 5,
  round_witness_time: 2,
  min_clients: 2,
  init_min_clients: 3,
  witness_nodes: 2,
  verification_percent: 0,
  global_batch_size_start: 6,
  global_batch_size_end: 6,
  global_batch_size_warmup_tokens: 0,
  total_steps: 6,
  waiting_for_members_extra_time: 1,
}

interface SolClient {
  name: string
  identity: Identity
  signer: KeyPairSigner
  client: PsycheClient
  worker: DeterministicWorker
  p2p: MemoryP2P
  backends: SolanaBackend[]
  events: EventLine[]
  rounds: RoundEvent[]
  done: Promise<ClientSummary | Error>
}

/** A client's ed25519 seed: its psyche identity and its Solana key are the same key. */
async function keys(name: string): Promise<{identity: Identity; signer: KeyPairSigner}> {
  const seed = createHash('sha256').update(`psyche-sol-client/${name}`).digest()
  return {identity: identityFromSeed(seed), signer: await createKeyPairSignerFromPrivateKeyBytes(seed)}
}

class SolanaSim {
  readonly clock = new ManualClock()
  readonly net: MemoryNetwork
  readonly clients: SolClient[] = []

  constructor(readonly d: Deployed) {
    this.clock.advance(T0 * 1000 - this.clock.now())
    this.net = new MemoryNetwork(readRun(d).state.run_id)
  }

  get state() {
    return readRun(this.d).state
  }

  async addClient(name: string, hub?: ClientOptions['hub'], worker = new DeterministicWorker()): Promise<SolClient> {
    const {identity, signer} = await keys(name)
    this.d.chain.airdrop(signer.address)
    const events: EventLine[] = []
    const backends: SolanaBackend[] = []
    const connector = new SolanaConnector({
      chain: this.d.chain,
      programId: this.d.programId,
      runId: this.state.run_id,
      signer,
      clock: this.clock,
      log: (e) => events.push({...e, source: 'solana'}),
    })
    const p2p = this.net.node(identity)
    const components: ClientComponents = {
      backend: {
        description: connector.description,
        connect: async (join) => {
          const b = await connector.connect(join)
          backends.push(b)
          return b
        },
      },
      p2p,
      worker,
      data: memoryData(SIM_SEQ_LEN),
      clock: this.clock,
    }
    const client = await PsycheClient.start(
      {
        id: identity.id,
        runId: this.state.run_id,
        plan: {
          model: {kind: 'config', configPath: 'sim/config.json', config: {sim: true}},
          seqLen: SIM_SEQ_LEN,
          microBatch: 1,
          optimizer: {AdamW: {betas: [0.9, 0.95], weight_decay: 0, eps: 1e-8}},
        } as never,
        seed: 7,
        log: (e) => events.push(e),
        ...(hub ? {hub} : {}),
      },
      components,
    )
    const c: SolClient = {
      name,
      identity,
      signer,
      client,
      worker,
      p2p,
      backends,
      events,
      get rounds() {
        return events.filter((e) => e.event === 'round')
      },
      done: client.run().catch((error: Error) => error),
    }
    this.clients.push(c)
    return c
  }

  /** Lets the clients, their queued transactions and reads run to quiescence. */
  async quiesce(): Promise<void> {
    for (let i = 0; i < 4; i++) {
      await settle()
      await Promise.all(this.clients.flatMap((c) => c.backends.map((b) => b.idle())))
    }
  }

  /** Advances virtual time (and the chain's clock with it) until `until()` holds. */
  async runUntil(until: () => boolean, what: string, maxMs = 300_000, stepMs = 250): Promise<void> {
    let elapsed = 0
    await this.quiesce()
    while (!until()) {
      if (elapsed >= maxMs) throw new Error(`${what} not reached within ${maxMs / 1000} s of virtual time (run ${this.state.run_state}, step ${this.state.progress.step})`)
      this.clock.advance(stepMs)
      elapsed += stepMs
      this.d.chain.setTime(Math.floor(this.clock.now() / 1000))
      await this.quiesce()
    }
  }
}

/** A trainer whose updates raise the loss on its own batches: its results carry a mark the honest scorers see. */
class HarmfulWorker extends DeterministicWorker {
  override async finishRound(step: number, previous?: {applyStep: number; results: Uint8Array[]}) {
    const out = await super.finishRound(step, previous)
    out.result[0] = 0xee
    return out
  }
}

/** An honest verifier's worker: a marked result raises the loss on its producer's batch (a negative score), others lower it. */
class ScoringWorker extends DeterministicWorker {
  override async scoreResults(step: number, results: Uint8Array[], batches: {tokens: Uint32Array; rows: number}[]) {
    const out = await super.scoreResults(step, results, batches)
    return {...out, after: results.map((r): [number, number] => (r[0] === 0xee ? [2.1, 2] : [1.9, 2]))}
  }
}

async function configured(runId: string, joinAuthority: KeyPairSigner | null = null, c: Partial<CoordinatorConfig> = {}): Promise<Deployed> {
  const d = await deployRun(runId, T0, joinAuthority?.address ?? null)
  const model = {LLM: {...testModel.LLM, max_seq_len: SIM_SEQ_LEN, checkpoint: {Dummy: {repo_id: 'org/sim'}}}}
  const r = await d.chain.send(d.authority, [updateInstruction(d.programId, d.coordinator, d.authority, {...config, ...c}, model)])
  assert.ok(r.ok, r.error)
  assert.ok((await d.chain.send(d.authority, [setPausedInstruction(d.programId, d.coordinator, d.authority, false)])).ok)
  return d
}

describe('Solana backend: real clients over the on-chain coordinator (LiteSVM, in process)', {timeout: 120_000}, () => {
  it('three clients train a run to the end over the program: peers found on chain, results exchanged, witnessed and applied identically', async () => {
    const sim = new SolanaSim(await configured('sol-sim'))
    const [a, b, c] = [await sim.addClient('a'), await sim.addClient('b'), await sim.addClient('c')]
    // The peer directory comes from the on-chain peer records only.
    await sim.runUntil(() => sim.state.run_state !== 'WaitingForMembers', 'Warmup')
    for (const x of [a, b, c]) {
      const peers = x.backends.at(-1)!.peers
      for (const y of [a, b, c]) assert.deepEqual(peers[y.identity.id], [`/memory/${y.identity.id}`], `${x.name} knows ${y.name}'s addresses`)
    }
    let ended = 0
    for (const x of [a, b, c]) void x.done.then(() => ended++)
    await sim.runUntil(() => sim.state.run_state === 'Finished' && ended === 3, 'the run to finish and every client to end')
    const summaries = await Promise.all([a, b, c].map((x) => x.done))
    for (const s of summaries) if (s instanceof Error) throw s
    const steps = [1, 2, 3, 4, 5, 6]
    for (const step of steps) {
      const hashes = [a, b, c].map((x) => x.rounds.find((r) => r.step === step)?.param_hash)
      assert.ok(
        hashes.every((h) => h !== undefined),
        `step ${step} applied by all: ${hashes}`,
      )
      assert.equal(new Set(hashes).size, 1, `step ${step}: replicas differ`)
    }
    for (const x of [a, b, c]) {
      let previous = x.events.find((e) => e.event === 'model_loaded')?.param_hash
      assert.ok(previous, `${x.name} loaded a model`)
      for (const r of x.rounds) {
        assert.notEqual(r.param_hash, previous, `${x.name}: step ${r.step} changed the model`)
        previous = r.param_hash
        assert.equal(r.applied, r.trainers, `${x.name} step ${r.step}: applied ${r.applied} of ${r.trainers}`)
        assert.equal(r.peers_applied, r.trainers - 1, `${x.name} step ${r.step}: applied its peers' results`)
      }
      assert.ok(x.p2p.stats().bytesReceived > 0, `${x.name} downloaded peers' results`)
      assert.ok(
        x.events.some((e) => e.event === 'witness'),
        `${x.name} witnessed on chain`,
      )
      // The program refused nothing, except (at most) a warmup report that crossed the early start of RoundTrain:
      // a race every backend has, refused harmlessly.
      assert.deepEqual(
        x.events.filter((e) => e.event === 'rejected' && !(e.of === 'warmup_witness' && e.code === 'InvalidRunState')),
        [],
        `${x.name}: the program refused a message`,
      )
    }
    const final = sim.state
    assert.equal(final.progress.step, 7)
    // the last epoch's Cooldown: its last round's witnesses attested the parameters they applied, on chain
    const last = final.epoch.round!
    assert.ok(final.epoch.hash_witnesses.length >= 1, 'Cooldown hash witnesses on chain')
    for (const w of final.epoch.hash_witnesses) assert.equal(w.param_hash, a.rounds.find((r) => r.step === last.step)?.param_hash, 'the hash of the applied model')
    assert.deepEqual(final.epoch.clients.map((x) => x.id).sort(), [a, b, c].map((x) => clientIdOf(x.signer.address)).sort())
  })

  it('a run with verifiers over the program: each verifier reports its scores on chain (report_scores), every client is scored and earns points', async () => {
    // 100 % verifiers, 3 clients: each scores the 2 others' results of the round before (K = min(4, n − 1) = 2).
    const sim = new SolanaSim(await configured('sol-scores', null, {verification_percent: 100, epoch_time: 12, total_steps: 6}))
    const clients = [await sim.addClient('sa'), await sim.addClient('sb'), await sim.addClient('sc')]
    let ended = 0
    for (const x of clients) void x.done.then(() => ended++)
    await sim.runUntil(() => sim.state.run_state === 'Finished' && ended === 3, 'the run to finish and every client to end')
    for (const s of await Promise.all(clients.map((x) => x.done))) if (s instanceof Error) throw s
    const ledger = decodeLedger(sim.d.chain.accountData(sim.d.coordinator)!)
    for (const x of clients) {
      assert.ok(x.worker.scored > 0, `${x.name} scored its peers' results`)
      assert.ok(
        x.events.some((e) => e.event === 'scored'),
        `${x.name} logged its scores`,
      )
      assert.deepEqual(
        x.events.filter((e) => e.event === 'rejected' && !(e.of === 'warmup_witness' && e.code === 'InvalidRunState')),
        [],
        `${x.name}: the program refused a message`,
      )
      const e = ledger.entries.find((y) => y.client_id === x.identity.id)!
      // the deterministic worker scores every result as honest work: a full-weight score, so every accepted batch pays 1000
      assert.ok(e.score !== null && e.score >= 200_000 && e.count >= 2 && e.verifiers >= 1, `${x.name}: scored on chain ${JSON.stringify(e)}`)
      assert.ok(e.earned > 0 && e.earned === e.batches * 1000, `${x.name}: earned for its accepted batches ${JSON.stringify(e)}`)
    }
    // status --rpc and rewards --rpc read the same: scores as decimals, weight 1
    const scores = ledgerScores(ledger)
    assert.deepEqual(scores.map((r) => r.client_id).sort(), clients.map((x) => x.identity.id).sort())
    for (const r of ledgerRows(ledger, sim.state)) assert.ok(r.score !== null && r.score >= 0.2 && r.weight === 1, JSON.stringify(r))
  })

  it('max_trainers_per_round = 2 of 4 clients over the program: each round the 2 the program chose train, every replica applies those 2 results only, the ledger credits them', async () => {
    const sim = new SolanaSim(await configured('sol-cap', null, {max_trainers_per_round: 2, min_clients: 3, init_min_clients: 4, witness_nodes: 3, verification_percent: 50}))
    const clients = [await sim.addClient('ga'), await sim.addClient('gb'), await sim.addClient('gc'), await sim.addClient('gd')]
    let ended = 0
    for (const x of clients) void x.done.then(() => ended++)
    await sim.runUntil(() => sim.state.run_state === 'Finished' && ended === 4, 'the run to finish and every client to end')
    for (const s of await Promise.all(clients.map((x) => x.done))) if (s instanceof Error) throw s
    const steps = [1, 2, 3, 4, 5, 6]
    const producers = new Map<number, string[]>()
    for (const x of clients) {
      let previous = x.events.find((e) => e.event === 'model_loaded')?.param_hash
      for (const r of x.rounds) {
        assert.notEqual(r.param_hash, previous, `${x.name}: step ${r.step} changed the model`)
        previous = r.param_hash
        assert.equal(r.trainers, 2, `${x.name} step ${r.step}: ${r.trainers} trainers`)
        assert.equal(r.applied, 2, `${x.name} step ${r.step}: applied ${r.applied}`)
      }
      for (const e of x.events) if (e.event === 'trained') producers.set(e.step as number, [...(producers.get(e.step as number) ?? []), x.name])
      assert.deepEqual(
        x.events.filter((e) => e.event === 'rejected' && !(e.of === 'warmup_witness' && e.code === 'InvalidRunState')),
        [],
        `${x.name}: the program refused a message`,
      )
    }
    for (const step of steps) {
      const hashes = clients.map((x) => x.rounds.find((r) => r.step === step)?.param_hash)
      assert.ok(
        hashes.every((h) => h !== undefined),
        `step ${step} applied by all: ${hashes}`,
      )
      assert.equal(new Set(hashes).size, 1, `step ${step}: replicas differ`)
      assert.equal(producers.get(step)?.length, 2, `step ${step} trained by ${producers.get(step)}`)
    }
    // the program credited 2 accepted results a round, 6 batches between them
    const ledger = decodeLedger(sim.d.chain.accountData(sim.d.coordinator)!)
    assert.equal(
      ledger.entries.reduce((n, e) => n + e.rounds + e.epoch_rounds, 0),
      2 * steps.length,
    )
    assert.equal(
      ledger.entries.reduce((n, e) => n + e.batches + e.epoch_batches, 0),
      6 * steps.length,
    )
    assert.ok(sim.state.epoch.clients.every((c) => c.state === 'Healthy'))
  })

  it("a harmful trainer, one verifier a round: the run's agreed scores (the program's ledger) get it accused and ejected", async () => {
    // 4 clients, 25 %: one verifier a round, which scores the 3 others; a verifier rarely scored the attacker twice
    // itself, but the ledger holds every verifier's reports, so the first one assigned it after 2 reports accuses it
    // (1 of 1 assigned: ejected).
    const sim = new SolanaSim(await configured('sol-harm', null, {verification_percent: 25, init_min_clients: 4, epoch_time: 60, total_steps: 20}))
    const honest = [
      await sim.addClient('ha', undefined, new ScoringWorker()),
      await sim.addClient('hb', undefined, new ScoringWorker()),
      await sim.addClient('hc', undefined, new ScoringWorker()),
    ]
    const attacker = await sim.addClient('hx', undefined, new HarmfulWorker())
    const ejected = () => [...sim.state.epoch.clients, ...sim.state.epoch.exited].some((c) => c.id === attacker.identity.id && c.state === 'Ejected')
    await sim.runUntil(() => ejected() || sim.state.run_state === 'Finished', 'the attacker ejected')
    assert.ok(ejected(), `the attacker was not ejected (run ${sim.state.run_state}, step ${sim.state.progress.step})`)
    const accusations = honest.flatMap((x) => x.events.filter((e) => e.event === 'accused'))
    assert.ok(accusations.length > 0 && accusations.every((e) => e.client_id === attacker.identity.id), JSON.stringify(accusations))
    assert.ok(
      accusations.some((e) => String(e.reason).includes('agreed moving average')),
      `accused by the agreed average: ${JSON.stringify(accusations)}`,
    )
    const ledger = decodeLedger(sim.d.chain.accountData(sim.d.coordinator)!)
    const score = (x: SolClient) => ledger.entries.find((e) => e.client_id === x.identity.id)?.score ?? null
    assert.ok(score(attacker) !== null && score(attacker)! < 0, `the attacker's agreed score: ${score(attacker)}`)
    for (const x of honest) assert.ok((score(x) ?? 0) >= 0, `${x.name}: ${score(x)}`)
    let ended = 0
    for (const x of [...honest, attacker]) void x.done.then(() => ended++)
    for (const x of [...honest, attacker]) x.client.stop()
    await sim.runUntil(() => ended === 4, 'every client to stop')
  })

  it('a designated checkpointer on Solana: its report carries the witnesses’ agreed hash, which the program records with the checkpoint', async () => {
    const tmp = tempDir('psyche-sol-ckpt-')
    const hub = await HubServer.start({root: join(tmp.path, 'hub')})
    try {
      const checkpointer = await keys('ckpt-a')
      const sim = new SolanaSim(await configured('sol-ckpt', null, {cooldown_time: 60, total_steps: 3, checkpointers: [checkpointer.identity.id]}))
      assert.deepEqual(sim.state.config.checkpointers, [checkpointer.identity.id])
      const hubOptions = {url: hub.url, token: 'hf_sol_ckpt', repo: 'sol/run', cacheDir: join(tmp.path, 'cache'), stagingDir: join(tmp.path, 'staging')}
      const a = await sim.addClient('ckpt-a', hubOptions)
      const b = await sim.addClient('ckpt-b')
      const c = await sim.addClient('ckpt-c')
      const reported = () => a.events.find((e) => e.event === 'checkpoint')
      // the upload is real HTTP: virtual time is paced (20 ms per real millisecond) so the 60-second Cooldown outlasts it
      for (let i = 0; !(reported() !== undefined && sim.state.checkpoint_hash !== null); i++) {
        if (i > 20_000 || sim.state.run_state === 'Finished')
          assert.fail(`no checkpoint recorded (run ${sim.state.run_state}): ${a.events.map((e) => `${e.event}${'reason' in e ? `(${String(e.reason)})` : ''}`).join(' ')}`)
        await new Promise((resolve) => setTimeout(resolve, 1))
        sim.clock.advance(20)
        sim.d.chain.setTime(Math.floor(sim.clock.now() / 1000))
        await sim.quiesce()
      }
      const r = reported() as {step: number; revision: string; param_hash: string}
      const agreed = b.rounds.find((x) => x.step === r.step)?.param_hash
      assert.equal(r.param_hash, agreed, 'the report declares the hash of the model at the epoch’s last step')
      assert.deepEqual(sim.state.checkpoint_hash, {repo: {repo_id: 'sol/run', revision: r.revision}, step: r.step, param_hash: agreed})
      assert.ok(
        [a, b, c].some((x) => x.events.some((e) => e.event === 'cooldown_witness')),
        'witnesses attested on chain',
      )
      for (const x of [a, b, c]) x.client.stop()
      await Promise.all([a, b, c].map((x) => x.done))
    } finally {
      await hub.close()
      tmp.cleanup()
    }
  })

  it('a permissioned run: a client without an authorization is refused with a clear error; granted, it joins', async () => {
    const joinAuthority = (await keys('join-authority')).signer
    const d = await configured('sol-perm', joinAuthority)
    d.chain.airdrop(joinAuthority.address)
    const {signer} = await keys('granted')
    d.chain.airdrop(signer.address)
    const connector = new SolanaConnector({chain: d.chain, programId: d.programId, runId: 'sol-perm', signer, tick: false})
    await assert.rejects(connector.connect({p2pAddrs: ['/memory/x']}), /permissioned: no authorization from its join authority/)
    await grant({chain: d.chain, authorizer: d.authorizer, grantor: joinAuthority, grantee: signer.address})
    const backend = await connector.connect({p2pAddrs: ['/memory/x']})
    assert.deepEqual(backend.state!.pending, [clientIdOf(signer.address)])
    assert.deepEqual(backend.peers, {[clientIdOf(signer.address)]: ['/memory/x']})
    // its messages are the program's instructions: a witness now is refused by the program, and reported
    const rejected = new Promise<unknown[]>((resolve) => backend.once('rejected', (...args) => resolve(args)))
    assert.equal(backend.sendWitness(1, {participant_bloom: '', broadcast_bloom: ''}), true)
    const [reason, info] = await rejected
    assert.match(String(reason), /witness refused/)
    assert.equal((info as {of: string}).of, 'witness')
    // addresses change: the peer record follows
    assert.ok(backend.sendAddresses(['/memory/y']))
    await backend.poll()
    await backend.idle()
    await backend.close()
    const again = await connector.connect({p2pAddrs: []})
    assert.deepEqual(again.peers, {[clientIdOf(signer.address)]: ['/memory/y']})
    // a withdraw queued right before close() is sent before it returns (join's signal handler relies on it)
    assert.ok(again.sendWithdraw())
    await again.close()
    assert.deepEqual(readRun(d).state.pending, [])
    assert.equal(again.sendWithdraw(), false, 'nothing is sent once closed')
    // leaving for good: the peer record is closed (join does it when the run ends or on a signal)
    const target = {chain: d.chain, programId: d.programId, runId: 'sol-perm', client: signer}
    assert.equal(await closePeerRecord(target), true)
    assert.equal(await closePeerRecord(target), false)
  })
})
