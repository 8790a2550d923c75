import assert from 'node:assert/strict'
import {readFileSync} from 'node:fs'
import {after, before, describe, it} from 'node:test'
import {
  appendTransactionMessageInstructions,
  createTransactionMessage,
  getBase64EncodedWireTransaction,
  pipe,
  setTransactionMessageFeePayerSigner,
  setTransactionMessageLifetimeUsingBlockhash,
  signTransactionMessageWithSigners,
  type Address,
  type Instruction,
  type KeyPairSigner,
  type TransactionSigner,
} from '@solana/kit'
import {RpcChain, TRANSACTION_SIZE_LIMIT} from '../../src/core/backend/solana/chain.js'
import {
  COMPUTE_BUDGET_PROGRAM,
  HEALTH_CHECK_BATCH,
  INSTRUCTION_UNITS,
  computeUnitLimitInstruction,
  computeUnitsFor,
  healthCheckInstruction,
  initCoordinatorInstructions,
  coordinatorAddress,
  peerAddress,
  setPeerInstruction,
  updateInstruction,
  withComputeBudget,
} from '../../src/core/backend/solana/instructions.js'
import {AUTHORIZER_PROGRAM_PATH, COORDINATOR_PROGRAM_PATH} from '../../src/core/backend/solana/local-chain.js'
import {Localnet} from '../../src/core/backend/solana/localnet.js'
import {PEER_ADDRS_MAX, PEER_SIZE, STATE_SIZE, fitPeerAddrs, IX} from '../../src/core/backend/solana/layout.js'
import {deployRun, keypair, testConfig, testModel} from './harness.js'

const T0 = 1_700_000_000

describe('the localnet refuses what a cluster refuses', () => {
  it('a transaction over 1,232 bytes is refused before it runs; the largest set_peer fits, with a priority fee', async () => {
    const d = await deployRun('size-run', T0)
    const alice = await keypair('alice')
    d.chain.airdrop(alice.address)
    const record = await peerAddress(d.programId, d.coordinator, alice.address)
    const rent = d.chain.rentExemption(PEER_SIZE)
    const full = setPeerInstruction(d.programId, d.coordinator, alice, record, ['/'.repeat(PEER_ADDRS_MAX)], rent)
    const r = await d.chain.send(alice, [full])
    assert.ok(r.ok, r.error)
    // the same with 400 more bytes: LiteSVM alone would run it, a cluster refuses it, and so does the localnet
    const data = Buffer.from(full.data!)
    const big = Buffer.concat([data.subarray(0, 9), Buffer.from([0x00, 0x04]), Buffer.alloc(1024, 0x2f)])
    const refused = await d.chain.send(alice, [{...full, data: big}])
    assert.equal(refused.ok, false)
    assert.match(refused.error!, /TransactionTooLarge: the transaction is \d+ bytes, more than a cluster accepts \(1232\)/)
    // the encoder leaves out addresses that do not fit one record, in order
    const addrs = Array.from({length: 40}, (_, i) => `/ip4/203.0.113.${i}/tcp/4001/p2p/12D3KooWAbCdEfGhIjKlMn`)
    const fit = fitPeerAddrs(addrs)
    assert.ok(fit.length > 0 && fit.length < addrs.length)
    assert.deepEqual(fit, addrs.slice(0, fit.length))
    assert.ok(Buffer.byteLength(fit.join('\n')) <= PEER_ADDRS_MAX)
  })

  it('the compute limit a transaction asks for is enforced, and each instruction asks for its own budget', async () => {
    const d = await deployRun('cu-limit-run', T0)
    const update = updateInstruction(d.programId, d.coordinator, d.authority, testConfig, testModel)
    const starved = await d.chain.send(d.authority, [computeUnitLimitInstruction(300), update])
    assert.equal(starved.ok, false)
    assert.ok(
      starved.logs.some((l) => l.includes('exceeded CUs meter')),
      starved.logs.join('\n'),
    )
    const ok = await d.chain.send(d.authority, [update])
    assert.ok(ok.ok, ok.error)
    assert.ok(ok.computeUnits < BigInt(INSTRUCTION_UNITS.update))
    // the request is the sum of the instructions' budgets, never the 1.4M maximum
    const budgeted = withComputeBudget([update])
    assert.equal(budgeted[0]!.programAddress, COMPUTE_BUDGET_PROGRAM)
    assert.equal(Buffer.from(budgeted[0]!.data!).readUInt32LE(1), computeUnitsFor([update]))
    assert.ok(computeUnitsFor([update]) < 40_000)
    const init = initCoordinatorInstructions({
      programId: d.programId,
      coordinator: await coordinatorAddress(d.programId, 'x'),
      payer: d.payer,
      runId: 'x',
      mainAuthority: d.payer.address,
      joinAuthority: null,
      lamports: d.chain.rentExemption(STATE_SIZE),
    })
    assert.ok(computeUnitsFor(init) < 50_000)
    // a health check of many accused: batches of HEALTH_CHECK_BATCH stay under the default 200,000
    const accused = Array.from({length: HEALTH_CHECK_BATCH}, () => d.payer.address)
    assert.ok(computeUnitsFor([healthCheckInstruction(d.programId, d.coordinator, d.payer, accused)]) <= 200_000)
    // a priority fee adds SetComputeUnitPrice
    const priced = withComputeBudget([update], 5000n)
    assert.equal(priced.length, 3)
    assert.equal(Buffer.from(priced[1]!.data!)[0], 3)
    assert.equal(Buffer.from(priced[1]!.data!).readBigUInt64LE(1), 5000n)
    assert.equal(Buffer.from(update.data!)[0], IX.update)
  })
})

describe('sending over JSON-RPC like to a cluster: size, blockhash expiry, resends, fallback endpoints, error names', () => {
  let net: Localnet
  const ids = {program: '' as Address, authorizer: '' as Address}
  let creator: KeyPairSigner

  before(async () => {
    ids.program = (await keypair('limits-program')).address
    ids.authorizer = (await keypair('limits-authorizer')).address
    // 2 ms slots: a blockhash lives 150 slots, 300 ms
    net = new Localnet({
      programs: [
        {address: ids.program, bytes: readFileSync(COORDINATOR_PROGRAM_PATH)},
        {address: ids.authorizer, bytes: readFileSync(AUTHORIZER_PROGRAM_PATH)},
      ],
      slotMs: 2,
    })
    await net.start()
    creator = await keypair('limits-creator')
    net.chain.airdrop(creator.address)
  })
  after(() => net.close())

  async function signed(payer: TransactionSigner, instructions: Instruction[], blockhash: {blockhash: string; lastValidBlockHeight: bigint}) {
    const message = pipe(
      createTransactionMessage({version: 0}),
      (m) => setTransactionMessageFeePayerSigner(payer, m),
      (m) => setTransactionMessageLifetimeUsingBlockhash(blockhash as never, m),
      (m) => appendTransactionMessageInstructions(withComputeBudget(instructions), m),
    )
    return signTransactionMessageWithSigners(message)
  }

  async function rpc(method: string, params: unknown[]): Promise<{result?: unknown; error?: {code: number; message: string; data?: {err?: unknown}}}> {
    const res = await fetch(net.url, {method: 'POST', headers: {'content-type': 'application/json'}, body: JSON.stringify({jsonrpc: '2.0', id: 1, method, params})})
    return (await res.json()) as never
  }

  it('refuses an oversized transaction and an expired blockhash with the errors a validator gives', async () => {
    const coordinator = await coordinatorAddress(ids.program, 'limits-run')
    const chain = new RpcChain(net.url, {pollMs: 10})
    const ixs = initCoordinatorInstructions({
      programId: ids.program,
      coordinator,
      payer: creator,
      runId: 'limits-run',
      mainAuthority: creator.address,
      joinAuthority: null,
      lamports: await chain.minimumBalance(STATE_SIZE),
    })
    const {result} = await rpc('getLatestBlockhash', [])
    const value = (result as {value: {blockhash: string; lastValidBlockHeight: number}}).value
    const tx = await signed(creator, ixs, {blockhash: value.blockhash, lastValidBlockHeight: BigInt(value.lastValidBlockHeight)})
    await new Promise((r) => setTimeout(r, 500)) // > 150 slots of 2 ms
    const expired = await rpc('sendTransaction', [getBase64EncodedWireTransaction(tx), {encoding: 'base64'}])
    assert.equal(expired.error?.code, -32002)
    assert.equal(expired.error?.data?.err, 'BlockhashNotFound')
    const height = (await rpc('getBlockHeight', [])).result as number
    assert.ok(height > value.lastValidBlockHeight, `block height ${height} past ${value.lastValidBlockHeight}`)
    // oversized: refused at the door
    const fresh = ((await rpc('getLatestBlockhash', [])).result as {value: {blockhash: string}}).value.blockhash
    const pad: Instruction = {programAddress: 'MemoSq4gqABAXKb96qnH8TysNcWxMyWCqXgDLGmfcHr' as Address, accounts: [], data: Buffer.alloc(TRANSACTION_SIZE_LIMIT)}
    const big = await signed(creator, [pad], {blockhash: fresh, lastValidBlockHeight: 0n})
    const tooLarge = await rpc('sendTransaction', [getBase64EncodedWireTransaction(big), {encoding: 'base64'}])
    assert.equal(tooLarge.error?.code, -32602)
    assert.match(tooLarge.error!.message, /too large: \d+ bytes \(max: 1232 bytes\)/)
    await assert.rejects(chain.send(creator, [pad]), /more than a cluster accepts \(1232\)/)
  })

  it('a transaction signed on a blockhash that expires before it is sent is built again with a fresh one', async () => {
    const chain = new RpcChain(net.url, {pollMs: 10, resendMs: 50})
    // a signer that is slow the first time (a hardware wallet, a loaded machine): its first transaction's blockhash expires
    let slow = true
    const payer: TransactionSigner = {
      address: creator.address,
      signTransactions: async (txs) => {
        if (slow) {
          slow = false
          await new Promise((r) => setTimeout(r, 500))
        }
        return creator.signTransactions(txs)
      },
    }
    const before = net.requests.get('getLatestBlockhash') ?? 0
    const coordinator = await coordinatorAddress(ids.program, 'rebuilt-run')
    const r = await chain.send(
      payer,
      initCoordinatorInstructions({
        programId: ids.program,
        coordinator,
        payer,
        runId: 'rebuilt-run',
        mainAuthority: creator.address,
        joinAuthority: null,
        lamports: await chain.minimumBalance(STATE_SIZE),
      }),
    )
    assert.ok(r.ok, r.error)
    assert.equal((net.requests.get('getLatestBlockhash') ?? 0) - before, 2, 'built twice')
    assert.ok(await chain.fetchAccount(coordinator))
  })

  it('falls back to the next --rpc endpoint when one cannot be reached', async () => {
    const chain = new RpcChain(`http://127.0.0.1:9,${net.url}`, {pollMs: 10})
    assert.deepEqual(chain.urls, ['http://127.0.0.1:9', net.url])
    assert.ok((await chain.minimumBalance(100)) > 0n)
    assert.equal(chain.url, net.url)
    const coordinator = await coordinatorAddress(ids.program, 'fallback-run')
    const r = await chain.send(
      creator,
      initCoordinatorInstructions({
        programId: ids.program,
        coordinator,
        payer: creator,
        runId: 'fallback-run',
        mainAuthority: creator.address,
        joinAuthority: null,
        lamports: await chain.minimumBalance(STATE_SIZE),
      }),
    )
    assert.ok(r.ok, r.error)
    await assert.rejects(new RpcChain('http://127.0.0.1:9').minimumBalance(1), /127\.0\.0\.1:9/)
  })

  it("an error is named by the program that raised it: a payer short of rent is the system program's, not the coordinator's", async () => {
    const chain = new RpcChain(net.url, {pollMs: 10})
    const coordinator = await coordinatorAddress(ids.program, 'limits-errors')
    const ok = await chain.send(
      creator,
      initCoordinatorInstructions({
        programId: ids.program,
        coordinator,
        payer: creator,
        runId: 'limits-errors',
        mainAuthority: creator.address,
        joinAuthority: null,
        lamports: await chain.minimumBalance(STATE_SIZE),
      }),
    )
    assert.ok(ok.ok, ok.error)
    assert.ok((await chain.send(creator, [updateInstruction(ids.program, coordinator, creator, testConfig, testModel)])).ok)
    // a client with enough for the fee but not for its peer record's rent
    const poor = await keypair('limits-poor')
    net.chain.airdrop(poor.address, 0n)
    net.chain.svm.airdrop(poor.address, 1_000_000n as never)
    const record = await peerAddress(ids.program, coordinator, poor.address)
    const r = await chain.send(poor, [setPeerInstruction(ids.program, coordinator, poor, record, ['/ip4/10.0.0.1/tcp/1'], 10_000_000n)])
    assert.equal(r.ok, false)
    assert.equal(r.code, 1)
    assert.match(r.error!, /^system program: ResultWithNegativeLamports/)
    // the coordinator's own refusals keep its names
    const again = await chain.send(
      creator,
      initCoordinatorInstructions({
        programId: ids.program,
        coordinator,
        payer: creator,
        runId: 'limits-errors',
        mainAuthority: creator.address,
        joinAuthority: null,
        lamports: await chain.minimumBalance(STATE_SIZE),
      }),
    )
    assert.equal(again.error, 'AlreadyExists')
  })
})
