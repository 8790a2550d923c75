/**
 * Authority is explicit (issue 20): a checkpoint is taken only from the run's designated checkpointers
 * (config.checkpointers), validated as config, refused on a backend that cannot enforce it.
 */
import assert from 'node:assert/strict'
import {describe, test} from 'node:test'
import {generateKeyPairSigner} from '@solana/kit'
import {updateInstruction} from '../../src/core/backend/solana/instructions.js'
import {validateRunConfig} from '../../src/core/config/index.js'
import {applyEvent, tick} from '../../src/core/coordinator/index.js'
import type {CoordinatorState} from '../../src/core/coordinator/types.js'
import {S, baseConfig, baseLLM, ok, rejected, toFirstRound, witnessAll} from '../coordinator/helpers.js'

const HONEST = 'a'.repeat(64)
const ATTACKER = 'b'.repeat(64)
const OTHER = 'c'.repeat(64)

function toCooldown(checkpointers?: string[]): {state: CoordinatorState; now: number} {
  let {state: s, now} = toFirstRound([HONEST, ATTACKER, OTHER], {epoch_time: 20, cooldown_time: 50, ...(checkpointers ? {checkpointers} : {})})
  for (let i = 0; i < 100 && s.run_state !== 'Cooldown'; i++) {
    if (s.run_state === 'RoundTrain') s = witnessAll(s, now)
    s = tick(s, (now += S))
  }
  assert.equal(s.run_state, 'Cooldown')
  return {state: s, now}
}

describe('checkpoints only from the designated checkpointers', () => {
  test('an epoch member that is not a checkpointer cannot set the run’s checkpoint or its fallback', () => {
    const {state: s, now} = toCooldown([HONEST])
    const before = JSON.stringify({checkpoint: s.model.LLM.checkpoint, fallback: s.checkpoint_fallback, checkpointed: s.epoch.checkpointed})
    const reason = rejected(s, {type: 'checkpoint', from: ATTACKER, repo: {repo_id: 'evil/model', revision: 'main'}}, now, 'NotCheckpointer')
    assert.match(reason, /config\.checkpointers/)
    assert.equal(JSON.stringify({checkpoint: s.model.LLM.checkpoint, fallback: s.checkpoint_fallback, checkpointed: s.epoch.checkpointed}), before)
    const after = ok(s, {type: 'checkpoint', from: HONEST, repo: {repo_id: 'org/ckpt', revision: 'abc'}}, now)
    assert.deepEqual(after.checkpoint_fallback, {Hub: {repo_id: 'org/ckpt', revision: 'abc'}})
    assert.equal(after.epoch.checkpointed, true)
  })

  test('without config.checkpointers any epoch member still may (Psyche’s rule; the Solana program’s too)', () => {
    const {state: s, now} = toCooldown()
    assert.equal(applyEvent(s, {type: 'checkpoint', from: ATTACKER, repo: {repo_id: 'org/ckpt'}}, now).error, undefined)
  })

  test('config.checkpointers is validated: a list of distinct client ids', () => {
    const check = (checkpointers: unknown) => validateRunConfig({...baseConfig, checkpointers}, {LLM: baseLLM})
    const good = check([HONEST, OTHER])
    assert.ok('config' in good)
    assert.deepEqual(good.config.checkpointers, [HONEST, OTHER])
    for (const [bad, message] of [
      [[], /1 to 64 client ids/],
      ['abc', /1 to 64 client ids/],
      [[HONEST, HONEST], /twice/],
      [['not an id!'], /client id/],
      [Array.from({length: 65}, (_, i) => i.toString(16).padStart(64, '0')), /1 to 64/],
    ] as const) {
      const r = check(bad)
      assert.ok('issues' in r, `accepted ${JSON.stringify(bad)}`)
      assert.match(r.issues[0].message, message)
      assert.equal(r.issues[0].path, 'config.checkpointers')
    }
  })

  test('a run on Solana with config.checkpointers is refused rather than run without the rule', async () => {
    const signer = await generateKeyPairSigner()
    assert.throws(
      () => updateInstruction(signer.address, signer.address, signer, {...baseConfig, checkpointers: [HONEST]}, undefined),
      /config\.checkpointers: the Solana program does not enforce/,
    )
    assert.doesNotThrow(() => updateInstruction(signer.address, signer.address, signer, baseConfig, undefined))
  })
})
