/**
 * Authority is explicit (issue 20): a checkpoint is taken only from the run's designated checkpointers
 * (config.checkpointers), validated as config, refused on a backend that cannot enforce it; and it is recorded
 * with the parameter hash that a quorum of the epoch's last round's witnesses attested in Cooldown, which its
 * declared hash must match.
 */
import assert from 'node:assert/strict'
import {describe, test} from 'node:test'
import type {KeyPairSigner} from '@solana/kit'
import {
  checkpointInstruction,
  hashWitnessInstruction,
  joinRunInstruction,
  setPausedInstruction,
  tickInstruction,
  updateInstruction,
  warmupWitnessInstruction,
  witnessInstruction,
} from '../../src/core/backend/solana/instructions.js'
import {clientIdOf} from '../../src/core/backend/solana/layout.js'
import {validateRunConfig} from '../../src/core/config/index.js'
import {agreedParamHash, applyEvent, deserializeState, selectWitnesses, serializeState, tick, witnessBloomParams} from '../../src/core/coordinator/index.js'
import type {CoordinatorState} from '../../src/core/coordinator/types.js'
import {S, baseConfig, baseLLM, ok, rejected, toFirstRound, witnessAll} from '../coordinator/helpers.js'
import {deployRun, keypair, readRun} from '../solana/harness.js'

const HONEST = 'a'.repeat(64)
const ATTACKER = 'b'.repeat(64)
const OTHER = 'c'.repeat(64)

const GOOD_HASH = 'a1'.repeat(32)
const EVIL_HASH = 'e'.repeat(64)

function toCooldown(checkpointers?: string[], witness_nodes = 2): {state: CoordinatorState; now: number} {
  let {state: s, now} = toFirstRound([HONEST, ATTACKER, OTHER], {epoch_time: 20, cooldown_time: 50, witness_nodes, ...(checkpointers ? {checkpointers} : {})})
  for (let i = 0; i < 100 && s.run_state !== 'Cooldown'; i++) {
    if (s.run_state === 'RoundTrain') s = witnessAll(s, now)
    s = tick(s, (now += S))
  }
  assert.equal(s.run_state, 'Cooldown')
  return {state: s, now}
}

/** Every witness of the epoch's last round attests `hash` (Cooldown's witness). */
function attestAll(s: CoordinatorState, now: number, hash: string): CoordinatorState {
  const round = s.epoch.round!
  for (const w of selectWitnesses(s, round)) s = ok(s, cooldownWitness(w, round.step, hash), now)
  return s
}

function cooldownWitness(from: string, step: number, param_hash: string) {
  return {type: 'witness' as const, from, step, proof: {participant_bloom: '', broadcast_bloom: ''}, param_hash}
}

describe('checkpoints only from the designated checkpointers', () => {
  test('an epoch member that is not a checkpointer cannot set the run’s checkpoint or its fallback', () => {
    const {state: s, now} = toCooldown([HONEST])
    const before = JSON.stringify({checkpoint: s.model.LLM.checkpoint, fallback: s.checkpoint_fallback, checkpointed: s.epoch.checkpointed})
    const reason = rejected(s, {type: 'checkpoint', from: ATTACKER, repo: {repo_id: 'evil/model', revision: 'main'}}, now, 'NotCheckpointer')
    assert.match(reason, /config\.checkpointers/)
    assert.equal(JSON.stringify({checkpoint: s.model.LLM.checkpoint, fallback: s.checkpoint_fallback, checkpointed: s.epoch.checkpointed}), before)
    const attested = attestAll(s, now, GOOD_HASH)
    const after = ok(attested, {type: 'checkpoint', from: HONEST, repo: {repo_id: 'org/ckpt', revision: 'abc'}, param_hash: GOOD_HASH}, now)
    assert.deepEqual(after.checkpoint_fallback, {Hub: {repo_id: 'org/ckpt', revision: 'abc'}})
    assert.equal(after.epoch.checkpointed, true)
  })

  test('without config.checkpointers any epoch member still may (Psyche’s rule), but only a checkpoint of the agreed parameters', () => {
    const {state: s, now} = toCooldown()
    rejected(s, {type: 'checkpoint', from: ATTACKER, repo: {repo_id: 'org/ckpt'}, param_hash: GOOD_HASH}, now, 'HashNotAgreed')
    const attested = attestAll(s, now, GOOD_HASH)
    rejected(attested, {type: 'checkpoint', from: ATTACKER, repo: {repo_id: 'evil/model'}, param_hash: EVIL_HASH}, now, 'CheckpointHashMismatch')
    rejected(attested, {type: 'checkpoint', from: ATTACKER, repo: {repo_id: 'evil/model'}}, now, 'CheckpointHashMismatch')
    assert.equal(applyEvent(attested, {type: 'checkpoint', from: ATTACKER, repo: {repo_id: 'org/ckpt'}, param_hash: GOOD_HASH}, now).error, undefined)
  })

  test('config.checkpointers is validated: a list of distinct client ids', () => {
    const check = (checkpointers: unknown) => validateRunConfig({...baseConfig, checkpointers}, {LLM: baseLLM})
    const good = check([HONEST, OTHER])
    assert.ok('config' in good)
    assert.deepEqual(good.config.checkpointers, [HONEST, OTHER])
    for (const [bad, message] of [
      [[], /1 to 8 client ids/],
      ['abc', /1 to 8 client ids/],
      [[HONEST, HONEST], /twice/],
      [['not an id!'], /client id/],
      [Array.from({length: 9}, (_, i) => i.toString(16).padStart(64, '0')), /1 to 8/],
    ] as const) {
      const r = check(bad)
      assert.ok('issues' in r, `accepted ${JSON.stringify(bad)}`)
      assert.match(r.issues[0].message, message)
      assert.equal(r.issues[0].path, 'config.checkpointers')
    }
  })

  test('the checkpoint is recorded with the parameter hash a quorum of the last round’s witnesses attested; another declared hash is refused', () => {
    const {state: cooldown, now} = toCooldown([HONEST], 3)
    const round = cooldown.epoch.round!
    const [w1, w2, w3] = selectWitnesses(cooldown, round)
    assert.ok(w3 !== undefined, 'three witnesses (quorum 2)')
    const repo = {repo_id: 'org/ckpt', revision: 'c0ffee'}
    // nothing to check against yet: refused, named
    assert.match(rejected(cooldown, {type: 'checkpoint', from: HONEST, repo, param_hash: GOOD_HASH}, now, 'HashNotAgreed'), /witnesses/)
    // Cooldown witnesses: only the last round's, for its step, a well-formed hash, once
    rejected(cooldown, cooldownWitness(w1, round.step - 1, GOOD_HASH), now, 'WrongStep')
    rejected(cooldown, cooldownWitness(w1, round.step, 'not-a-hash'), now, 'InvalidWitness')
    rejected(cooldown, cooldownWitness(w1, round.step, GOOD_HASH.toUpperCase()), now, 'InvalidWitness')
    rejected(cooldown, cooldownWitness('f'.repeat(64), round.step, GOOD_HASH), now, 'InvalidWitness')
    let s = ok(cooldown, cooldownWitness(w1, round.step, GOOD_HASH), now)
    rejected(s, cooldownWitness(w1, round.step, GOOD_HASH), now, 'DuplicateWitness')
    // one hostile witness attests other parameters: no quorum for either yet
    s = ok(s, cooldownWitness(w2, round.step, EVIL_HASH), now)
    assert.equal(agreedParamHash(s), undefined)
    rejected(s, {type: 'checkpoint', from: HONEST, repo, param_hash: GOOD_HASH}, now, 'HashNotAgreed')
    s = ok(s, cooldownWitness(w3, round.step, GOOD_HASH), now)
    assert.equal(agreedParamHash(s), GOOD_HASH)
    // a designated checkpointer that uploaded other parameters and says so is refused, and changes nothing
    const reason = rejected(s, {type: 'checkpoint', from: HONEST, repo: {repo_id: 'org/ckpt', revision: 'bad'}, param_hash: EVIL_HASH}, now, 'CheckpointHashMismatch')
    assert.ok(reason.includes(EVIL_HASH) && reason.includes(GOOD_HASH), reason)
    rejected(s, {type: 'checkpoint', from: HONEST, repo, param_hash: 'xyz'}, now, 'InvalidEvent')
    assert.equal(s.checkpoint_hash, null)
    const taken = ok(s, {type: 'checkpoint', from: HONEST, repo, param_hash: GOOD_HASH}, now)
    assert.deepEqual(taken.checkpoint_hash, {repo, step: round.step, param_hash: GOOD_HASH})
    assert.deepEqual(deserializeState(serializeState(taken)).checkpoint_hash, taken.checkpoint_hash)
    // it outlives the epoch (the fallback a run restarts from is checked against it), and the votes do not
    let next = taken
    for (let i = 0; i < 10 && next.run_state === 'Cooldown'; i++) next = tick(next, now + (i + 1) * S)
    assert.notEqual(next.run_state, 'Cooldown')
    assert.deepEqual(next.checkpoint_hash, taken.checkpoint_hash)
    assert.deepEqual(next.checkpoint_fallback, {Hub: repo})
    // a state saved before this field resumes without a recorded hash
    const old = JSON.parse(serializeState(next)) as Record<string, unknown>
    delete old.checkpoint_hash
    assert.equal(deserializeState(JSON.stringify(old)).checkpoint_hash, null)
  })

  test('on Solana the program holds config.checkpointers and records the agreed hash with the checkpoint', async () => {
    const d = await deployRun('authority-solana', 1_700_000_000)
    const [a, b, c] = await Promise.all(['a', 'b', 'c'].map((l) => keypair(l)))
    const ids = [a, b, c].map((k) => clientIdOf(k.address))
    for (const k of [a, b, c]) d.chain.airdrop(k.address)
    d.chain.setTime(1_700_000_000)
    const config = {...baseConfig, rounds_per_epoch: 1, witness_nodes: 3, min_clients: 3, cooldown_time: 50, checkpointers: [ids[0]]}
    const send = async (signer: KeyPairSigner, ix: Parameters<typeof d.chain.send>[1][number]) => d.chain.send(signer, [ix])
    assert.ok((await send(d.authority, updateInstruction(d.programId, d.coordinator, d.authority, config, {LLM: baseLLM}))).ok)
    assert.deepEqual(readRun(d).state.config.checkpointers, [ids[0]])
    // a list naming a client twice is refused, as the reference refuses it
    assert.equal((await send(d.authority, updateInstruction(d.programId, d.coordinator, d.authority, {...config, checkpointers: [ids[0], ids[0]]}))).error, 'InvalidConfig')
    assert.ok((await send(d.authority, setPausedInstruction(d.programId, d.coordinator, d.authority, false))).ok)
    for (const k of [a, b, c]) assert.ok((await send(k, joinRunInstruction(d.programId, d.coordinator, k))).ok)
    let now = 1_700_000_000
    const tickOut = async () => {
      const from = readRun(d).state.run_state
      for (let i = 0; i < 100 && readRun(d).state.run_state === from; i++) {
        d.chain.setTime((now += 1))
        await send(d.payer, tickInstruction(d.programId, d.coordinator))
      }
    }
    await tickOut() // → Warmup
    // each reports its model loaded (a Warmup where nobody loaded it starts no round)
    for (const k of [a, b, c]) assert.ok((await send(k, warmupWitnessInstruction(d.programId, d.coordinator, k))).ok)
    if (readRun(d).state.run_state === 'Warmup') await tickOut() // → RoundTrain
    const round = readRun(d).state.epoch.round!
    const signerOf = (id: string) => [a, b, c][ids.indexOf(id)]
    for (const w of selectWitnesses(readRun(d).state)) {
      const proof = Buffer.alloc(witnessBloomParams(readRun(d).state.config, round).bits / 8, 0xff)
      await send(signerOf(w), witnessInstruction(d.programId, d.coordinator, signerOf(w), round.step, proof, proof))
    }
    while (readRun(d).state.run_state !== 'Cooldown') await tickOut()
    const repo = {repo_id: 'org/ckpt', revision: 'r1'}
    const checkpoint = (k: KeyPairSigner, hash: string) => send(k, checkpointInstruction(d.programId, d.coordinator, k, repo, hash))
    assert.equal((await checkpoint(a, GOOD_HASH)).error, 'HashNotAgreed')
    for (const w of selectWitnesses(readRun(d).state, round))
      assert.ok((await send(signerOf(w), hashWitnessInstruction(d.programId, d.coordinator, signerOf(w), round.step, GOOD_HASH))).ok)
    assert.equal((await checkpoint(b, GOOD_HASH)).error, 'NotCheckpointer')
    assert.equal((await checkpoint(a, EVIL_HASH)).error, 'CheckpointHashMismatch')
    assert.ok((await checkpoint(a, GOOD_HASH)).ok)
    assert.deepEqual(readRun(d).state.checkpoint_hash, {repo, step: round.step, param_hash: GOOD_HASH})
  })
})
