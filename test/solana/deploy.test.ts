import assert from 'node:assert/strict'
import {readFileSync} from 'node:fs'
import {describe, it} from 'node:test'
import {AUTHORIZER_PROGRAM_PATH, COORDINATOR_PROGRAM_PATH, LocalChain, TREASURER_PROGRAM_PATH, programPath} from '../../src/core/backend/solana/local-chain.js'
import {Localnet} from '../../src/core/backend/solana/localnet.js'
import {joinRunInstruction, setPausedInstruction, updateInstruction} from '../../src/core/backend/solana/instructions.js'
import {inspectSharedObject} from '../../programs/tools/sbpf-link.js'
import {clientIdOf} from '../../src/core/backend/solana/layout.js'
import {deployRun, keypair, readRun, testConfig, testModel} from './harness.js'

// Deployable today: a current cluster (every feature, SIMD-0500 included) deploys only sBPF v3; the committed builds
// are v3 (NAME.so) and v0 (NAME.v0.so, for clusters without SIMD-0500). Deployed through the upgradeable loader, as
// `solana program deploy` does, so the deploy-time checks (strict ELF parser, verifier, allowed versions) apply.

const V3 = {coordinator: readFileSync(COORDINATOR_PROGRAM_PATH), authorizer: readFileSync(AUTHORIZER_PROGRAM_PATH), treasurer: readFileSync(TREASURER_PROGRAM_PATH)}
const V0 = {
  coordinator: readFileSync(programPath(COORDINATOR_PROGRAM_PATH, 'legacy')),
  authorizer: readFileSync(programPath(AUTHORIZER_PROGRAM_PATH, 'legacy')),
  treasurer: readFileSync(programPath(TREASURER_PROGRAM_PATH, 'legacy')),
}

/** Runs a run's first steps on a chain deployed with `features`: update, resume, a join; the state shows each. */
async function firstSteps(features: 'current' | 'legacy'): Promise<void> {
  const d = await deployRun(`deploy-${features}`, 1_700_000_000, null, features)
  const client = await keypair('deploy-client')
  d.chain.airdrop(client.address)
  for (const [signer, ix] of [
    [d.authority, updateInstruction(d.programId, d.coordinator, d.authority, testConfig, testModel)],
    [d.authority, setPausedInstruction(d.programId, d.coordinator, d.authority, false)],
    [client, joinRunInstruction(d.programId, d.coordinator, client)],
  ] as const) {
    const r = await d.chain.send(signer, [ix])
    assert.ok(r.ok, `${features}: ${r.error}\n${r.logs.join('\n')}`)
  }
  const {state} = readRun(d)
  assert.equal(state.run_state, 'WaitingForMembers')
  assert.deepEqual(state.pending, [clientIdOf(client.address)])
}

describe('deployable today: sBPF v3 under SIMD-0500', () => {
  it('the committed builds are v3 and v0', () => {
    for (const so of Object.values(V3)) assert.equal(inspectSharedObject(so).flags, 3)
    for (const so of Object.values(V0)) assert.equal(inspectSharedObject(so).flags, 0)
  })

  it('a current cluster deploys the v3 programs, which run a run', async () => {
    await firstSteps('current')
  })

  it('a current cluster refuses to deploy v0 (SIMD-0500); a legacy one deploys it, and it runs the same', async () => {
    const programId = (await keypair('deploy-v0')).address
    const chain = new LocalChain(programId, null)
    await assert.rejects(chain.deploy(programId, V0.coordinator), /sbpf_version required by the executable which are not enabled/)
    await assert.rejects(chain.deploy(programId, V0.authorizer), /sbpf_version/)
    await assert.rejects(chain.deploy(programId, V0.treasurer), /sbpf_version/)
    await chain.deploy((await keypair('deploy-treasurer')).address, V3.treasurer)
    const legacy = new LocalChain(programId, null, 'legacy')
    await legacy.deploy((await keypair('deploy-treasurer')).address, V0.treasurer)
    await firstSteps('legacy')
  })

  it('the localnet deploys with the same checks: v0 refused at start, unless --features legacy', async () => {
    const [a, b] = [(await keypair('deploy-localnet-a')).address, (await keypair('deploy-localnet-b')).address]
    const refused = new Localnet({port: 0, programs: [{address: a, bytes: V0.coordinator}]})
    await assert.rejects(refused.start(), /deploying .* failed: .*sbpf_version/)
    await refused.close()
    for (const [features, builds] of [
      ['current', V3],
      ['legacy', V0],
    ] as const) {
      const net = new Localnet({
        port: 0,
        features,
        programs: [
          {address: a, bytes: builds.coordinator},
          {address: b, bytes: builds.authorizer},
        ],
      })
      try {
        const url = await net.start()
        const res = await fetch(url, {
          method: 'POST',
          headers: {'content-type': 'application/json'},
          body: JSON.stringify({jsonrpc: '2.0', id: 1, method: 'getAccountInfo', params: [a, {encoding: 'base64'}]}),
        })
        const info = (await res.json()) as {result: {value: {executable: boolean; owner: string} | null}}
        assert.equal(info.result.value?.owner, 'BPFLoaderUpgradeab1e11111111111111111111111', `${features}: the program account belongs to the upgradeable loader`)
        assert.equal(info.result.value?.executable, true)
      } finally {
        await net.close()
      }
    }
  })
})
