import assert from 'node:assert/strict'
import {readFileSync} from 'node:fs'
import {after, before, describe, it} from 'node:test'
import {createRun, grant, readAuthorization, readMetadata, readRun, revoke, setDelegates, setMetadata, setPaused, updateConfig} from '../../src/core/backend/solana/admin.js'
import {RpcChain} from '../../src/core/backend/solana/chain.js'
import {joinRunInstruction, coordinatorAddress} from '../../src/core/backend/solana/instructions.js'
import {AUTHORIZER_PROGRAM_PATH, COORDINATOR_PROGRAM_PATH} from '../../src/core/backend/solana/local-chain.js'
import {Localnet} from '../../src/core/backend/solana/localnet.js'
import {loadRunConfigFile} from '../../src/core/config/index.js'
import {projectRoot} from '../../src/core/worker/python.js'
import {join} from 'node:path'
import {writeFileSync} from 'node:fs'
import {tempDir, waitFor} from '../helpers.js'
import {keypair} from './harness.js'
import {pollAccount, subscribeAccount} from '../../src/core/backend/solana/watch.js'
import {clientIdOf, decodeCoordinator} from '../../src/core/backend/solana/layout.js'

/** The tiny demo's run configuration with a Hub checkpoint (a run on Solana cannot point at a local directory). */
function hubConfigFile(dir: string): string {
  const text = readFileSync(join(projectRoot, 'templates', 'tiny-demo', 'state.toml'), 'utf8').replace(
    '[model.LLM.checkpoint.Local]\npath = "model"',
    '[model.LLM.checkpoint.Hub]\nrepo_id = "psyche/tiny-demo"',
  )
  assert.match(text, /checkpoint\.Hub/)
  const path = join(dir, 'state.toml')
  writeFileSync(path, text)
  return path
}

describe('the JSON-RPC path (RpcChain with @solana/kit) against a LiteSVM localnet', () => {
  let net: Localnet
  let chain: RpcChain
  const dir = tempDir('psyche-rpc-')
  const configPath = hubConfigFile(dir.path)
  const ids = {program: '', authorizer: ''}

  before(async () => {
    ids.program = (await keypair('rpc-program')).address
    ids.authorizer = (await keypair('rpc-authorizer')).address
    net = new Localnet({
      programs: [
        {address: ids.program as never, bytes: readFileSync(COORDINATOR_PROGRAM_PATH)},
        {address: ids.authorizer as never, bytes: readFileSync(AUTHORIZER_PROGRAM_PATH)},
      ],
    })
    chain = new RpcChain(await net.start(), {pollMs: 20})
  })
  after(async () => {
    await net.close()
    dir.cleanup()
  })

  it("a run creator creates, configures and resumes a run; program errors come back by name with the program's reason", async () => {
    const creator = await keypair('rpc-creator')
    net.chain.airdrop(creator.address)
    const target = {chain, programId: ids.program as never, runId: 'rpc-run'}
    const coordinator = await createRun({...target, payer: creator, mainAuthority: creator.address, joinAuthority: null, authorizer: null})
    assert.equal(coordinator, await coordinatorAddress(ids.program as never, 'rpc-run'))
    assert.equal((await readRun(target)).state.run_state, 'Uninitialized')
    const file = await loadRunConfigFile(configPath)
    await assert.rejects(setPaused({...target, authority: creator, paused: false}), /set-paused resume rpc-run refused: InvalidConfig \(the run has no configuration yet/)
    await updateConfig({...target, authority: creator, file})
    await setPaused({...target, authority: creator, paused: false})
    const run = await readRun(target)
    assert.equal(run.state.run_state, 'WaitingForMembers')
    assert.deepEqual(run.state.config, file.config)
    assert.equal(run.state.model.LLM.max_seq_len, file.model.LLM.max_seq_len)
    const mallory = await keypair('rpc-mallory')
    net.chain.airdrop(mallory.address)
    await assert.rejects(setPaused({...target, authority: mallory, paused: true}), /refused: Unauthorized/)
    await assert.rejects(readRun({...target, runId: 'no-such-run'}), /no coordinator account/)
    // name and description (create-run --name --description)
    assert.equal(await readMetadata(target), undefined)
    await setMetadata({...target, authority: creator, metadata: {name: 'RPC run', description: 'trained over JSON-RPC'}})
    assert.deepEqual(await readMetadata(target), {name: 'RPC run', description: 'trained over JSON-RPC'})
    await assert.rejects(setMetadata({...target, authority: mallory, metadata: {name: 'x', description: ''}}), /refused: Unauthorized/)
  })

  it('permissions: grant, delegates and revoke through RPC, and a delegate joins a permissioned run', async () => {
    const grantor = await keypair('rpc-grantor')
    const alice = await keypair('rpc-alice')
    const hot = await keypair('rpc-alice-hot')
    for (const k of [grantor, alice, hot]) net.chain.airdrop(k.address, 10n)
    const target = {chain, programId: ids.program as never, runId: 'rpc-perm'}
    const coordinator = await createRun({...target, payer: grantor, mainAuthority: grantor.address, joinAuthority: grantor.address, authorizer: ids.authorizer as never})
    await updateConfig({...target, authority: grantor, file: await loadRunConfigFile(configPath)})
    await setPaused({...target, authority: grantor, paused: false})
    const auth = {chain, authorizer: ids.authorizer as never}
    const authorization = await grant({...auth, grantor, grantee: alice.address})
    await setDelegates({...auth, grantee: alice, grantor: grantor.address, delegates: [hot.address]})
    assert.deepEqual((await readAuthorization({...auth, grantor: grantor.address, grantee: alice.address}))!.delegates, [hot.address])
    const joined = await chain.send(hot, [joinRunInstruction(ids.program as never, coordinator, hot, authorization)])
    assert.ok(joined.ok, joined.error)
    assert.deepEqual((await readRun(target)).state.pending, [clientIdOf(hot.address)])
    await revoke({...auth, grantor, grantee: alice.address})
    assert.equal(await readAuthorization({...auth, grantor: grantor.address, grantee: alice.address}), undefined)
    const refused = await chain.send(alice, [joinRunInstruction(ids.program as never, coordinator, alice, authorization)])
    assert.equal(refused.error, 'NotPermitted')
    assert.ok(
      refused.logs.some((l) => l.includes('authorization')),
      refused.logs.join('\n'),
    )
  })
  it('with --ws-rpc a transaction is confirmed by a signatureSubscribe notification, not by polling', async () => {
    const creator = await keypair('rpc-ws-creator')
    net.chain.airdrop(creator.address)
    const ws = new RpcChain(net.url, {wsUrl: net.wsUrl, pollMs: 20})
    const target = {chain: ws, programId: ids.program as never, runId: 'rpc-ws-run'}
    const before = {subscribe: net.requests.get('signatureSubscribe') ?? 0, statuses: net.requests.get('getSignatureStatuses') ?? 0}
    await createRun({...target, payer: creator, mainAuthority: creator.address, joinAuthority: null, authorizer: null})
    await updateConfig({...target, authority: creator, file: await loadRunConfigFile(configPath)})
    assert.equal((await readRun(target)).state.run_state, 'Uninitialized')
    const subscribed = (net.requests.get('signatureSubscribe') ?? 0) - before.subscribe
    assert.ok(subscribed >= 2, `one signatureSubscribe per transaction (${subscribed})`)
    // each confirmation asks the status once right after subscribing (it may have come first), and never polls
    assert.equal((net.requests.get('getSignatureStatuses') ?? 0) - before.statuses, subscribed)
    // a refused transaction still comes back by name (preflight), with the websocket as without
    const mallory = await keypair('rpc-ws-mallory')
    net.chain.airdrop(mallory.address)
    await assert.rejects(setPaused({...target, authority: mallory, paused: true}), /refused: Unauthorized/)
  })

  it('follows the coordinator account: websocket accountSubscribe, and polling', async () => {
    const creator = await keypair('rpc-watcher')
    net.chain.airdrop(creator.address)
    const target = {chain, programId: ids.program as never, runId: 'rpc-watch'}
    const coordinator = await createRun({...target, payer: creator, mainAuthority: creator.address, joinAuthority: null, authorizer: null})
    await updateConfig({...target, authority: creator, file: await loadRunConfigFile(configPath)})
    const seen = {ws: [] as string[], poll: [] as string[]}
    const stop = new AbortController()
    const subscribedBefore = net.requests.get('accountSubscribe') ?? 0
    const ws = subscribeAccount(net.wsUrl, coordinator, (data) => seen.ws.push(decodeCoordinator(data).state.run_state), stop.signal)
    const poll = pollAccount(chain, coordinator, (data) => seen.poll.push(decodeCoordinator(data).state.run_state), stop.signal, 20)
    // both are listening: the localnet holds the subscription (it counts the request as it registers it), and the
    // poll has read the account once
    await waitFor(() => (net.requests.get('accountSubscribe') ?? 0) > subscribedBefore && seen.poll.length > 0, 10_000, 'the subscription and the first poll')
    await setPaused({...target, authority: creator, paused: false})
    await setPaused({...target, authority: creator, paused: true})
    await waitFor(() => seen.ws.length >= 2 && seen.poll.includes('Paused'), 10_000, `both to see the run paused (ws ${seen.ws}, poll ${seen.poll})`)
    stop.abort()
    await Promise.all([ws, poll])
    assert.deepEqual(seen.ws, ['WaitingForMembers', 'Paused'])
    assert.equal(seen.poll[0], 'Uninitialized')
    assert.equal(seen.poll.at(-1), 'Paused')
  })
})
