import assert from 'node:assert/strict'
import {describe, it} from 'node:test'
import type {KeyPairSigner} from '@solana/kit'
import {updateInstruction} from '../../src/core/backend/solana/instructions.js'
import type {CoordinatorState} from '../../src/core/coordinator/index.js'
import {clientIdOf} from '../../src/core/backend/solana/layout.js'
import {deployRun, keypair, readRun, toInstruction} from './harness.js'
import {generateVectors, type VectorFile} from './vectors.js'

// Generated from the reference as it is now (npm run vectors:solana writes the same to a file).
const vectors = JSON.parse(JSON.stringify(await generateVectors())) as VectorFile

/** The state transitions (from → to) and rejection codes a set of vectors exercises. */
function coverage(v: VectorFile): {transitions: Set<string>; errors: Set<string>} {
  const transitions = new Set<string>()
  const errors = new Set<string>()
  for (const s of v.scenarios) {
    let previous: CoordinatorState['run_state'] = 'Uninitialized'
    for (const step of s.steps) {
      if (step.error) errors.add(step.error)
      if (step.state.run_state !== previous) transitions.add(`${previous}→${step.state.run_state}`)
      previous = step.state.run_state
    }
  }
  return {transitions, errors}
}

describe('shared coordinator vectors: the on-chain program equals the TypeScript reference', () => {
  it('cover every phase transition, every rejection code, and an ejection by accusation', () => {
    const {transitions, errors} = coverage(vectors)
    for (const t of [
      'Uninitialized→WaitingForMembers',
      'WaitingForMembers→Warmup',
      'Warmup→RoundTrain',
      'Warmup→WaitingForMembers',
      'RoundTrain→RoundWitness',
      'RoundWitness→RoundTrain',
      'RoundWitness→Cooldown',
      'Cooldown→WaitingForMembers',
      'Cooldown→Paused',
      'WaitingForMembers→Paused',
      'Paused→WaitingForMembers',
      'Paused→Finished',
    ]) {
      assert.ok(transitions.has(t), `no vector goes ${t} (have: ${[...transitions].join(', ')})`)
    }
    for (const code of [
      'Halted',
      'InvalidRunState',
      'AlreadyJoined',
      'UnknownClient',
      'InvalidWithdraw',
      'InvalidWitness',
      'DuplicateWitness',
      'WrongStep',
      'NoActiveRound',
      'InvalidHealthCheck',
      'InvalidAccusation',
      'DuplicateAccusation',
      'InvalidProof',
      'AlreadyCheckpointed',
      'CannotResume',
      'InvalidConfig',
      'InvalidEvent',
      'Banned',
      'NotCheckpointer',
      'HashNotAgreed',
      'CheckpointHashMismatch',
    ]) {
      assert.ok(errors.has(code), `no vector is rejected with ${code}`)
    }
    const excluded = vectors.scenarios.flatMap((s) => s.steps.flatMap((step) => step.state.epoch.round?.excluded ?? []))
    assert.ok(excluded.length > 0, 'no vector ejects a trainer by accusation')
  })

  for (const scenario of vectors.scenarios) {
    it(`${scenario.name}: ${scenario.steps.length} events give identical states and rejections`, async () => {
      const d = await deployRun(scenario.run_id, scenario.created_at)
      const signers = new Map<string, KeyPairSigner>()
      for (const label of Object.keys(scenario.clients)) {
        const k = await keypair(label)
        assert.equal(clientIdOf(k.address), scenario.clients[label])
        signers.set(clientIdOf(k.address), k)
        d.chain.airdrop(k.address)
      }
      // The reference run starts with its configuration: give the program the same one.
      d.chain.setTime(scenario.created_at)
      const setup = await d.chain.send(d.authority, [updateInstruction(d.programId, d.coordinator, d.authority, scenario.config, scenario.model)])
      assert.ok(setup.ok, `update: ${setup.error}`)
      let applied = 0
      for (const [i, step] of scenario.steps.entries()) {
        d.chain.setClock(step.now, step.slot)
        const {signer, ix} = toInstruction(d, signers, step.event)
        const r = await d.chain.send(signer, Array.isArray(ix) ? ix : [ix])
        const where = `${scenario.name} step ${i} (${step.event.type} at ${step.now})`
        if (step.error) assert.equal(r.error, step.error, `${where}: the reference rejects with ${step.error}; the program: ${r.ok ? 'accepted' : r.error}\n${r.logs.join('\n')}`)
        else {
          assert.ok(r.ok, `${where}: the reference accepts; the program: ${r.error}\n${r.logs.join('\n')}`)
          applied++
        }
        assert.deepStrictEqual(readRun(d).state, step.state, `${where}: states differ`)
      }
      assert.ok(applied > 0)
    })
  }
})
