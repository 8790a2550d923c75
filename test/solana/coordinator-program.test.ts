import assert from 'node:assert/strict'
import {createHash} from 'node:crypto'
import {describe, it} from 'node:test'
import {AccountRole, type Address} from '@solana/kit'
import {
  checkpointInstruction,
  closePeerInstruction,
  coordinatorAddress,
  ejectInstruction,
  equivocationInstructions,
  freeCoordinatorInstruction,
  healthCheckInstruction,
  initCoordinatorInstructions,
  joinRunInstruction,
  metadataAddress,
  peerAddress,
  setMetadataInstruction,
  setPausedInstruction,
  setPeerInstruction,
  tickInstruction,
  updateInstruction,
  warmupWitnessInstruction,
  withdrawInstruction,
  witnessInstruction,
} from '../../src/core/backend/solana/instructions.js'
import {assignBatches, buildWitnessProof, selectWitnesses} from '../../src/core/coordinator/index.js'
import {signAnnouncement} from '../../src/core/primitives/announcement.js'
import {identityFromSeed} from '../../src/core/protocol/identity.js'
import {
  DESCRIPTION_MAX,
  METADATA_SIZE,
  MAX_CLIENTS,
  PEER_ADDRS_MAX,
  decodeMetadata,
  PEER_SIZE,
  STATE_SIZE,
  clientIdOf,
  decodePeer,
  encodeTag,
  IX,
} from '../../src/core/backend/solana/layout.js'
import {innerSteps, SPARSELOCO_LIMITS, validateRunConfig} from '../../src/core/config/run-config.js'
import {deployRun, keypair, readRun, testConfig as config, testModel as model, type Deployed} from './harness.js'
import {sparseLoCo} from './vectors.js'

const T0 = 1_700_000_000

async function configuredRun(runId = 'prog-test', joinAuthority: Address | null = null): Promise<Deployed> {
  const d = await deployRun(runId, T0, joinAuthority)
  const r = await d.chain.send(d.authority, [updateInstruction(d.programId, d.coordinator, d.authority, config, model)])
  assert.ok(r.ok, r.error)
  return d
}

describe('coordinator program: accounts', () => {
  it("init_coordinator creates the run id's program address, full size, rent exempt, owned by the program", async () => {
    const d = await deployRun('acct-run', T0)
    const account = d.chain.svm.getAccount(d.coordinator)
    assert.ok(account.exists)
    assert.equal(account.data.length, STATE_SIZE)
    assert.equal(account.programAddress, d.programId)
    assert.ok(account.lamports >= d.chain.rentExemption(STATE_SIZE))
    const run = readRun(d)
    assert.equal(run.state.run_id, 'acct-run')
    assert.equal(run.state.run_state, 'Uninitialized')
    assert.equal(run.state.run_state_start, T0 * 1000) // the chain clock in seconds, kept in milliseconds
    assert.equal(run.main_authority, d.authority.address)
    assert.equal(run.join_authority, null)
    assert.equal(run.has_config, false)
    // createCoordinator's default seed: SHA-256("psyche/run\0" ‖ run id)
    assert.equal(run.state.seed, createHash('sha256').update('psyche/run\0acct-run').digest('hex'))
  })

  it('refuses an account that is not the program address of the run id, and a second init', async () => {
    const d = await deployRun('pda-run', T0)
    const wrong = await coordinatorAddress(d.programId, 'other-run')
    const ixs = initCoordinatorInstructions({
      programId: d.programId,
      coordinator: wrong,
      payer: d.payer,
      runId: 'pda-run',
      mainAuthority: d.authority.address,
      joinAuthority: null,
      lamports: d.chain.rentExemption(STATE_SIZE),
    })
    const r = await d.chain.send(d.payer, ixs)
    assert.equal(r.error, 'WrongProgramAddress')
    const again = await d.chain.send(
      d.payer,
      initCoordinatorInstructions({
        programId: d.programId,
        coordinator: d.coordinator,
        payer: d.payer,
        runId: 'pda-run',
        mainAuthority: d.payer.address,
        joinAuthority: null,
        lamports: d.chain.rentExemption(STATE_SIZE),
      }),
    )
    assert.equal(again.ok, false)
    assert.equal(readRun(d).main_authority, d.authority.address) // unchanged
  })

  it('grow stops at the full size', async () => {
    const d = await deployRun('grow-run', T0)
    const r = await d.chain.send(d.payer, [{programAddress: d.programId, accounts: [{address: d.coordinator, role: AccountRole.WRITABLE}], data: encodeTag(IX.grow)}])
    assert.equal(r.error, 'InvalidInstruction')
  })

  it('free_coordinator: main authority only, halted runs only; returns the lamports', async () => {
    const d = await configuredRun('free-run')
    const stranger = await keypair('stranger')
    d.chain.airdrop(stranger.address)
    const recipient = (await keypair('recipient')).address
    assert.equal((await d.chain.send(stranger, [freeCoordinatorInstruction(d.programId, d.coordinator, stranger, recipient)])).error, 'Unauthorized')
    assert.ok((await d.chain.send(d.authority, [setPausedInstruction(d.programId, d.coordinator, d.authority, false)])).ok)
    assert.equal((await d.chain.send(d.authority, [freeCoordinatorInstruction(d.programId, d.coordinator, d.authority, recipient)])).error, 'InvalidRunState')
    assert.ok((await d.chain.send(d.authority, [setPausedInstruction(d.programId, d.coordinator, d.authority, true)])).ok)
    const held = d.chain.svm.getBalance(d.coordinator)!
    const r = await d.chain.send(d.authority, [freeCoordinatorInstruction(d.programId, d.coordinator, d.authority, recipient)])
    assert.ok(r.ok, r.error)
    assert.equal(d.chain.svm.getBalance(recipient), held)
    assert.equal(d.chain.accountData(d.coordinator), undefined)
  })
})

describe('coordinator program: authority checks', () => {
  it("update, set_paused and eject need the main authority's signature", async () => {
    const d = await configuredRun('auth-run')
    const mallory = await keypair('mallory')
    d.chain.airdrop(mallory.address)
    const {programId: p, coordinator: c} = d
    assert.equal((await d.chain.send(mallory, [updateInstruction(p, c, mallory, {...config, total_steps: 1})])).error, 'Unauthorized')
    assert.equal((await d.chain.send(mallory, [setPausedInstruction(p, c, mallory, false)])).error, 'Unauthorized')
    assert.equal((await d.chain.send(mallory, [ejectInstruction(p, c, mallory, mallory.address)])).error, 'Unauthorized')
    assert.equal(readRun(d).state.config.total_steps, 100)
    assert.equal(readRun(d).state.run_state, 'Uninitialized')
    assert.ok((await d.chain.send(d.authority, [setPausedInstruction(p, c, d.authority, false)])).ok)
    assert.equal(readRun(d).state.run_state, 'WaitingForMembers')
  })

  it('an instruction whose signer account did not sign is refused', async () => {
    const d = await configuredRun('nosig-run')
    const client = await keypair('client-x')
    const ix = joinRunInstruction(d.programId, d.coordinator, client)
    const unsigned = {...ix, accounts: [{address: client.address, role: AccountRole.READONLY}, ix.accounts![1]]}
    assert.equal((await d.chain.send(d.payer, [unsigned])).error, 'MissingSignature')
  })

  it('the first update must set a configuration, and a bad one is refused with InvalidConfig', async () => {
    const d = await deployRun('cfg-run', T0)
    const {programId: p, coordinator: c, authority: a} = d
    assert.equal((await d.chain.send(a, [setPausedInstruction(p, c, a, false)])).error, 'InvalidConfig') // no config yet
    assert.equal((await d.chain.send(a, [updateInstruction(p, c, a, {...config, min_clients: 2, init_min_clients: 1}, model)])).error, 'InvalidConfig')
    assert.equal((await d.chain.send(a, [updateInstruction(p, c, a, config, {LLM: {...model.LLM, max_seq_len: 0}})])).error, 'InvalidConfig')
    assert.throws(() => updateInstruction(p, c, a, config, {LLM: {...model.LLM, checkpoint: 'Ephemeral'}}), /Hub, P2P or Dummy/)
    assert.ok((await d.chain.send(a, [updateInstruction(p, c, a, config, model)])).ok)
    const run = readRun(d)
    assert.deepEqual(run.state.config, config)
    assert.deepEqual(run.state.model, model)
    assert.equal(run.has_config, true)
  })

  it(`SparseLoCo's inner_steps: 1 to ${SPARSELOCO_LIMITS.innerSteps} taken, as the reference takes them; 0 and ${SPARSELOCO_LIMITS.innerSteps + 1} refused with InvalidConfig`, async () => {
    const d = await deployRun('inner-run', T0)
    const {programId: p, coordinator: c, authority: a} = d
    for (const h of [0, 1, 2, SPARSELOCO_LIMITS.innerSteps, SPARSELOCO_LIMITS.innerSteps + 1]) {
      const sparse = {LLM: {...model.LLM, optimizer: sparseLoCo(h)}}
      const reference = 'config' in validateRunConfig(config, sparse)
      const r = await d.chain.send(a, [updateInstruction(p, c, a, config, sparse)])
      assert.equal(r.ok, reference, `inner_steps ${h}: the program ${r.ok ? 'took' : `refused (${r.error})`} it, the reference ${reference ? 'takes' : 'refuses'} it`)
      if (!reference) assert.equal(r.error, 'InvalidConfig')
      else assert.deepEqual(readRun(d).state.model, sparse)
    }
    // the account keeps the last one taken
    assert.equal(innerSteps(readRun(d).state.model.LLM.optimizer), SPARSELOCO_LIMITS.innerSteps)
  })
})

describe('coordinator program: run metadata', () => {
  it("set_metadata: the run's name and description, written by its main authority only", async () => {
    const d = await configuredRun('meta-run')
    const {programId: p, coordinator: c, authority: a, chain} = d
    const record = await metadataAddress(p, c)
    const rent = chain.rentExemption(METADATA_SIZE)
    assert.ok((await chain.send(a, [setMetadataInstruction(p, c, a, record, {name: 'Tiny', description: 'a tiny run'}, rent)])).ok)
    assert.deepEqual(decodeMetadata(chain.accountData(record)!), {coordinator: c, name: 'Tiny', description: 'a tiny run'})
    assert.ok((await chain.send(a, [setMetadataInstruction(p, c, a, record, {name: 'Tiny 2', description: ''}, rent)])).ok)
    assert.deepEqual(decodeMetadata(chain.accountData(record)!), {coordinator: c, name: 'Tiny 2', description: ''})
    const mallory = await keypair('mallory')
    chain.airdrop(mallory.address)
    assert.equal((await chain.send(mallory, [setMetadataInstruction(p, c, mallory, record, {name: 'mine', description: ''}, rent)])).error, 'Unauthorized')
    assert.throws(() => setMetadataInstruction(p, c, a, record, {name: '', description: 'x'.repeat(DESCRIPTION_MAX + 1)}, rent), /more than 512/)
    assert.equal(decodeMetadata(chain.accountData(record)!).name, 'Tiny 2')
  })
})

describe('coordinator program: client instructions', () => {
  it('join, warmup_witness, tick (anyone), withdraw, health_check and checkpoint act for their signer only', async () => {
    const d = await configuredRun('client-run')
    const {programId: p, coordinator: c, authority: a, chain} = d
    const alice = await keypair('alice')
    const bob = await keypair('bob')
    chain.airdrop(alice.address)
    chain.airdrop(bob.address)
    assert.ok((await chain.send(a, [setPausedInstruction(p, c, a, false)])).ok)
    assert.ok((await chain.send(alice, [joinRunInstruction(p, c, alice)])).ok)
    assert.ok((await chain.send(bob, [joinRunInstruction(p, c, bob)])).ok)
    assert.ok((await chain.send(bob, [withdrawInstruction(p, c, bob)])).ok)
    assert.deepEqual(readRun(d).state.pending, [clientIdOf(alice.address)])
    chain.setTime(T0 + 5)
    const ticker = await keypair('anyone')
    chain.airdrop(ticker.address)
    assert.ok((await chain.send(ticker, [tickInstruction(p, c)])).ok)
    assert.equal(readRun(d).state.run_state, 'Warmup')
    assert.equal((await chain.send(bob, [warmupWitnessInstruction(p, c, bob)])).error, 'InvalidWitness')
    assert.ok((await chain.send(alice, [warmupWitnessInstruction(p, c, alice)])).ok)
    const run = readRun(d).state
    assert.equal(run.run_state, 'RoundTrain')
    assert.deepEqual(run.epoch.round!.roster, [clientIdOf(alice.address)])
    assert.equal((await chain.send(alice, [healthCheckInstruction(p, c, alice, [bob.address])])).error, 'NoActiveRound')
    assert.equal((await chain.send(bob, [checkpointInstruction(p, c, bob, {repo_id: 'x/y'})])).error, 'InvalidRunState')
  })

  it("set_peer: a client's own peer record (created, then updated) holds its addresses; nobody else writes it", async () => {
    const d = await configuredRun('peer-run')
    const {programId: p, coordinator: c, chain} = d
    const alice = await keypair('alice')
    const mallory = await keypair('mallory')
    chain.airdrop(alice.address)
    chain.airdrop(mallory.address)
    const rent = chain.rentExemption(PEER_SIZE)
    const record = await peerAddress(p, c, alice.address)
    const first = ['/ip4/10.0.0.1/tcp/4001', '/ip4/10.0.0.1/tcp/4001/p2p-circuit']
    assert.ok((await chain.send(alice, [setPeerInstruction(p, c, alice, record, first, rent)])).ok)
    const account = chain.svm.getAccount(record)
    assert.ok(account.exists && account.programAddress === p && account.lamports >= rent)
    assert.deepEqual(decodePeer(chain.accountData(record)!), {coordinator: c, client: clientIdOf(alice.address), addrs: first})
    // an update overwrites (shorter addresses leave no tail behind)
    assert.ok((await chain.send(alice, [setPeerInstruction(p, c, alice, record, ['/ip4/10.0.0.2/tcp/1'], rent)])).ok)
    assert.deepEqual(decodePeer(chain.accountData(record)!).addrs, ['/ip4/10.0.0.2/tcp/1'])
    // mallory cannot write alice's record: it is not the program address of (run, mallory)
    const r = await chain.send(mallory, [setPeerInstruction(p, c, mallory, record, ['/ip4/6.6.6.6/tcp/1'], rent)])
    assert.equal(r.error, 'WrongProgramAddress')
    assert.deepEqual(decodePeer(chain.accountData(record)!).addrs, ['/ip4/10.0.0.2/tcp/1'])
    // nor pass a record of another run, nor a coordinator that is not one
    const other = await configuredRun('peer-run-2')
    assert.equal((await chain.send(alice, [setPeerInstruction(p, c, alice, await peerAddress(p, other.coordinator, alice.address), ['/x'], rent)])).error, 'WrongProgramAddress')
    assert.equal((await chain.send(alice, [setPeerInstruction(p, alice.address, alice, record, ['/x'], rent)])).error, 'WrongAccount')
    // too long: refused by the encoder, and by the program when sent anyway
    assert.throws(() => setPeerInstruction(p, c, alice, record, ['/'.repeat(PEER_ADDRS_MAX + 1)], rent), /more than a peer account holds/)
    const ix = setPeerInstruction(p, c, alice, record, ['/x'], rent)
    const data = Buffer.from(ix.data!)
    const big = Buffer.concat([data.subarray(0, 9), Buffer.from([0x01, 0x04]), Buffer.alloc(PEER_ADDRS_MAX + 1, 0x2f)])
    assert.equal((await chain.send(alice, [{...ix, data: big}])).error, 'CapacityExceeded')
    assert.equal((await chain.send(alice, [{...ix, data: data.subarray(0, 5)}])).error, 'InvalidInstruction')
    // close_peer: only alice closes her record, and its rent goes back to her; set_peer creates it again
    assert.equal((await chain.send(mallory, [closePeerInstruction(p, c, mallory, record)])).error, 'WrongProgramAddress')
    const before = chain.svm.getBalance(alice.address)!
    assert.ok((await chain.send(d.payer, [closePeerInstruction(p, c, alice, record)])).ok)
    assert.equal(chain.svm.getAccount(record).exists, false)
    assert.equal(chain.svm.getBalance(alice.address)! - before, rent)
    assert.equal((await chain.send(d.payer, [closePeerInstruction(p, c, alice, record)])).error, 'WrongAccount')
    assert.ok((await chain.send(alice, [setPeerInstruction(p, c, alice, record, ['/ip4/10.0.0.3/tcp/1'], rent)])).ok)
    assert.deepEqual(decodePeer(chain.accountData(record)!).addrs, ['/ip4/10.0.0.3/tcp/1'])
  })

  it('equivocation: the runtime verifies both signatures (the Ed25519 program), and the proof must come right before', async () => {
    const d = await configuredRun('equiv-run')
    const {programId: p, coordinator: c, authority: a, chain} = d
    const alice = await keypair('alice')
    const bob = await keypair('bob')
    for (const k of [alice, bob]) chain.airdrop(k.address)
    assert.ok((await chain.send(a, [setPausedInstruction(p, c, a, false)])).ok)
    for (const k of [alice, bob]) assert.ok((await chain.send(k, [joinRunInstruction(p, c, k)])).ok)
    chain.setTime(T0 + 5)
    assert.ok((await chain.send(d.payer, [tickInstruction(p, c)])).ok)
    assert.equal(readRun(d).state.run_state, 'Warmup')
    const identity = identityFromSeed(createHash('sha256').update('psyche-test-key/alice').digest())
    const announce = (commitment: number) =>
      signAnnouncement(identity, {
        run_id: 'equiv-run',
        step: 1,
        client_id: identity.id,
        batch_start: 0,
        batch_end: 4,
        commitment: Buffer.alloc(32, commitment).toString('hex'),
        size: 10,
      })
    const proof = {a: announce(1), b: announce(2)}
    // a forged signature: the Ed25519 program fails the transaction, nothing changes
    const forged = {...proof, b: {...proof.b, signature: proof.a.signature}}
    const r = await chain.send(bob, equivocationInstructions(p, c, bob, forged))
    assert.equal(r.ok, false)
    assert.ok(!r.logs.some((l) => l.includes(`Program ${p} invoke`)), `the Ed25519 program refused it before the coordinator ran:\n${r.logs.join('\n')}`)
    assert.equal(readRun(d).state.epoch.clients.find((x) => x.id === identity.id)?.state, 'Healthy')
    // the Ed25519 instruction elsewhere than right before: InvalidProof
    const [ed, ix] = equivocationInstructions(p, c, bob, proof)
    assert.equal((await chain.send(bob, [ed, tickInstruction(p, c), ix])).error, 'InvalidProof')
    // a valid proof ejects alice
    assert.ok((await chain.send(bob, [ed, ix])).ok)
    assert.equal(readRun(d).state.epoch.clients.find((x) => x.id === identity.id)?.state, 'Ejected')
  })

  it(`capacity: at most MAX_CLIENTS = ${MAX_CLIENTS} clients and joiners, then CapacityExceeded`, async () => {
    const d = await configuredRun('full-run-cap')
    const {programId: p, coordinator: c, authority: a, chain} = d
    assert.ok((await chain.send(a, [setPausedInstruction(p, c, a, false)])).ok)
    for (let i = 0; i < MAX_CLIENTS; i++) {
      const k = await keypair(`cap-${i}`)
      const r = await chain.send(d.payer, [joinRunInstruction(p, c, k)])
      assert.ok(r.ok, `join ${i}: ${r.error}`)
    }
    const extra = await keypair('cap-extra')
    const r = await chain.send(d.payer, [joinRunInstruction(p, c, extra)])
    assert.equal(r.error, 'CapacityExceeded')
    assert.ok(
      r.logs.some((l) => l.includes('MAX_CLIENTS')),
      r.logs.join('\n'),
    )
    assert.equal(readRun(d).state.pending.length, MAX_CLIENTS)
  })

  it(`a witness proof of a full round (MAX_CLIENTS = ${MAX_CLIENTS} trainers, every one checked for early close) fits the default 200,000 compute units`, async () => {
    const d = await deployRun('cu-run', T0)
    const {programId: p, coordinator: c, authority: a, chain} = d
    assert.ok(
      (
        await chain.send(a, [
          updateInstruction(
            p,
            c,
            a,
            {...config, init_min_clients: MAX_CLIENTS, witness_nodes: 0, global_batch_size_start: 2 * MAX_CLIENTS, global_batch_size_end: 2 * MAX_CLIENTS},
            model,
          ),
        ])
      ).ok,
    )
    assert.ok((await chain.send(a, [setPausedInstruction(p, c, a, false)])).ok)
    const clients = await Promise.all(Array.from({length: MAX_CLIENTS}, (_, i) => keypair(`cu-${i}`)))
    for (const k of clients) assert.ok((await chain.send(d.payer, [joinRunInstruction(p, c, k)])).ok)
    chain.setTime(T0 + 4)
    assert.ok((await chain.send(d.payer, [tickInstruction(p, c)])).ok)
    for (const k of clients) if (readRun(d).state.run_state === 'Warmup') assert.ok((await chain.send(d.payer, [warmupWitnessInstruction(p, c, k)])).ok)
    const state = readRun(d).state
    assert.equal(state.run_state, 'RoundTrain')
    assert.equal(state.epoch.round!.roster.length, MAX_CLIENTS)
    const seen = [...assignBatches(state)].map(([id, range]) => ({id, range, commitment: Buffer.alloc(32, 1)}))
    const proof = buildWitnessProof(state.config, state.epoch.round!, seen)
    const witness = clients.find((k) => clientIdOf(k.address) === selectWitnesses(state)[0])!
    const r = await chain.send(d.payer, [
      witnessInstruction(p, c, witness, state.epoch.round!.step, Buffer.from(proof.participant_bloom, 'base64'), Buffer.from(proof.broadcast_bloom, 'base64')),
    ])
    assert.ok(r.ok, r.error)
    assert.ok(r.computeUnits < 200_000n, `a witness proof took ${r.computeUnits} CU`)
  })

  it('rejects instructions it does not know and accounts it does not own', async () => {
    const d = await configuredRun('bad-run')
    const ix = joinRunInstruction(d.programId, d.coordinator, d.payer)
    const r = await d.chain.send(d.payer, [{...ix, data: Uint8Array.from([200])}])
    assert.equal(r.error, 'InvalidInstruction')
    const notOurs = await d.chain.send(d.payer, [tickInstruction(d.programId, d.payer.address)])
    assert.equal(notOurs.error, 'WrongAccount')
  })
})
