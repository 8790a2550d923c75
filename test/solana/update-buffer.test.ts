// An update too large for one transaction (model JSON up to MODEL_JSON_MAX = 4,096 bytes) goes through the run's
// update buffer: buffer_init, buffer_write chunks in order, update_from_buffer. Every transaction fits a cluster's
// 1,232 bytes; an incomplete, out-of-order, foreign or stranger's buffer is refused; the buffer is closed afterwards.
import assert from 'node:assert/strict'
import {describe, it} from 'node:test'
import {AccountRole, type Address, type Instruction, type KeyPairSigner} from '@solana/kit'
import {prepareUpdate, sendUpdate, updateConfig} from '../../src/core/backend/solana/admin.js'
import {SYSTEM_PROGRAM, bufferedUpdateTransactions, coordinatorAddress, initCoordinatorInstructions, updateBufferAddress} from '../../src/core/backend/solana/instructions.js'
import {STATE_SIZE, UPDATE_BUFFER_SIZE, encodeUpdate} from '../../src/core/backend/solana/layout.js'
import type {LLMConfig, RunConfigFile} from '../../src/core/config/index.js'
import {validateRunConfig} from '../../src/core/config/run-config.js'
import {constant, structLayout} from '../../src/core/layout/layout-table.js'
import {deployRun, keypair, readRun, testConfig, testModel, type Deployed} from './harness.js'

const T0 = 1_700_000_000

/** A model whose JSON on chain is `bytes` long (a long data URL), within MODEL_JSON_MAX. */
function bigModel(bytes: number): {LLM: LLMConfig} {
  const base: LLMConfig = {
    ...testModel.LLM,
    data_location: {Http: {location: {SingleUrl: 'https://data.example.org/'}, token_size_in_bytes: 'TwoBytes', shuffle: 'DontShuffle'}},
  }
  const {max_seq_len: _a, cold_start_warmup_steps: _b, checkpoint: _c, ...rest} = base
  const pad = bytes - Buffer.byteLength(JSON.stringify(rest))
  assert.ok(pad >= 0)
  return {LLM: {...base, data_location: {Http: {location: {SingleUrl: `https://data.example.org/${'a'.repeat(pad)}`}, token_size_in_bytes: 'TwoBytes', shuffle: 'DontShuffle'}}}}
}

function file(model: {LLM: LLMConfig}): RunConfigFile {
  return {path: 'big.toml', config: testConfig, model}
}

async function plan(d: Deployed, model: {LLM: LLMConfig}, signer: KeyPairSigner = d.authority): Promise<Instruction[][]> {
  const buffer = await updateBufferAddress(d.programId, d.coordinator)
  return bufferedUpdateTransactions(d.programId, d.coordinator, signer, buffer, d.chain.rentExemption(UPDATE_BUFFER_SIZE), testConfig, model)
}

describe('update buffer: configurations too large for one transaction', () => {
  it('refuses a verification_sample the coordinator account cannot hold (rather than drop it), and takes the default', () => {
    assert.throws(() => encodeUpdate({...testConfig, verification_sample: 8}, testModel), /config\.verification_sample: the Solana coordinator program does not store it/)
    assert.deepEqual(encodeUpdate({...testConfig, verification_sample: 4}, testModel), encodeUpdate(testConfig, testModel))
  })

  it('create-run/update-config send MODEL_JSON_MAX bytes of model JSON in chunks, each transaction within 1,232 bytes', async () => {
    const d = await deployRun('buffer-run', T0)
    const model = bigModel(constant('MODEL_JSON_MAX'))
    assert.ok(encodeUpdate(testConfig, model).length > 1232)
    const target = {chain: d.chain, programId: d.programId, runId: 'buffer-run'}
    const transactions = await prepareUpdate({...target, authority: d.authority, file: file(model)})
    assert.ok(transactions.length >= 6, `${transactions.length} transactions`)
    const before = d.chain.svm.getBalance(d.authority.address)!
    for (const tx of transactions) {
      const r = await d.chain.send(d.authority, tx)
      assert.ok(r.ok, `${r.error}\n${r.logs.join('\n')}`)
      assert.ok(r.bytes! <= 1232, `${r.bytes} bytes`)
      assert.ok(r.computeUnits <= 200_000n)
    }
    const run = readRun(d)
    assert.equal(run.has_config, true)
    assert.deepEqual(run.state.model, model)
    assert.deepEqual(run.state.config, testConfig)
    // the buffer is closed and its rent returned (only fees were spent)
    assert.equal(d.chain.accountData(await updateBufferAddress(d.programId, d.coordinator)), undefined)
    assert.ok(before - d.chain.svm.getBalance(d.authority.address)! < 100_000n)
    // a small update still goes in one transaction, and updateConfig sends either kind
    assert.equal((await prepareUpdate({...target, authority: d.authority, file: file(testModel)})).length, 1)
    // SparseLoCo: its inner steps travel in the account's inner_steps field (the program sizes each round by them), not
    // in the model JSON, and come back in the decoded model
    const sparse = validateRunConfig(testConfig, {LLM: {...testModel.LLM, optimizer: {SparseLoCo: {inner_steps: 4}}}})
    assert.ok('model' in sparse, JSON.stringify(sparse))
    await updateConfig({...target, authority: d.authority, file: file(sparse.model)})
    assert.deepEqual(readRun(d).state.model, sparse.model)
    const account = Buffer.from(d.chain.accountData(d.coordinator)!)
    assert.equal(account.readBigUInt64LE(structLayout('State').at.inner_steps.offset), 4n)
    const json = account.toString(
      'utf8',
      structLayout('State').at.model_json.offset,
      structLayout('State').at.model_json.offset + Number(account.readBigUInt64LE(structLayout('State').at.model_json_len.offset)),
    )
    assert.ok(json.includes('"SparseLoCo":{"error_feedback_decay"') && !json.includes('inner_steps'), json)
    // what the program cannot store is refused before anything is sent, naming the file and the field
    await assert.rejects(
      prepareUpdate({...target, authority: d.authority, file: {...file(testModel), config: {...testConfig, verification_sample: 8}}}),
      /big\.toml: config\.verification_sample: 8, but the Solana program does not store it/,
    )
    const other = bigModel(3000)
    await updateConfig({...target, authority: d.authority, file: file(other)})
    assert.deepEqual(readRun(d).state.model, other)
  })

  it('refuses an incomplete buffer, chunks out of order, a stranger, and another run’s buffer', async () => {
    const d = await deployRun('buffer-refusals', T0)
    const model = bigModel(2000)
    const txs = await plan(d, model)
    assert.ok(txs.length >= 4)
    const [init, first, second] = txs
    const commit = txs[txs.length - 1]
    assert.ok((await d.chain.send(d.authority, commit)).error === 'WrongAccount') // no buffer yet
    assert.ok((await d.chain.send(d.authority, init)).ok)
    assert.equal((await d.chain.send(d.authority, second)).error, 'InvalidInstruction') // out of order
    assert.ok((await d.chain.send(d.authority, first)).ok)
    const partial = await d.chain.send(d.authority, commit)
    assert.equal(partial.error, 'InvalidInstruction')
    assert.ok(partial.logs.some((l) => l.includes('incomplete')))
    assert.equal(readRun(d).has_config, false)
    // a stranger can neither write the run's buffer nor apply it
    const mallory = await keypair('buffer-mallory')
    d.chain.airdrop(mallory.address)
    const strangers = await plan(d, model, mallory)
    assert.equal((await d.chain.send(mallory, strangers[2])).error, 'Unauthorized')
    // another run's buffer is not this run's
    const other = await coordinatorAddress(d.programId, 'buffer-other')
    assert.ok(
      (
        await d.chain.send(
          d.payer,
          initCoordinatorInstructions({
            programId: d.programId,
            coordinator: other,
            payer: d.payer,
            runId: 'buffer-other',
            mainAuthority: d.authority.address,
            joinAuthority: null,
            lamports: d.chain.rentExemption(STATE_SIZE),
          }),
        )
      ).ok,
    )
    const foreign = commit[0]
    const swapped = {...foreign, accounts: foreign.accounts!.map((a, i) => (i === 1 ? {address: other, role: AccountRole.WRITABLE} : a))}
    assert.equal((await d.chain.send(d.authority, [swapped])).error, 'WrongProgramAddress')
    // writing the rest completes it; buffer_init again empties it first
    for (const tx of txs.slice(2, -1)) assert.ok((await d.chain.send(d.authority, tx)).ok)
    assert.ok((await d.chain.send(d.authority, init)).ok)
    assert.equal((await d.chain.send(d.authority, commit)).error, 'InvalidInstruction')
    assert.ok((await sendUpdate(d.chain, d.authority, txs)).ok)
    assert.deepEqual(readRun(d).state.model, model)
  })

  it('a buffer address pre-funded by a stranger does not block it', async () => {
    const d = await deployRun('buffer-squat', T0)
    const buffer = await updateBufferAddress(d.programId, d.coordinator)
    const mallory = await keypair('buffer-squatter')
    d.chain.airdrop(mallory.address)
    const data = Buffer.alloc(12)
    data[0] = 2 // SystemInstruction::Transfer
    data.writeBigUInt64LE(d.chain.rentExemption(0), 4)
    const transfer = {
      programAddress: SYSTEM_PROGRAM,
      accounts: [
        {address: mallory.address, role: AccountRole.WRITABLE_SIGNER, signer: mallory},
        {address: buffer as Address, role: AccountRole.WRITABLE},
      ],
      data,
    }
    assert.ok((await d.chain.send(mallory, [transfer])).ok)
    const model = bigModel(1500)
    assert.ok((await sendUpdate(d.chain, d.authority, await plan(d, model))).ok)
    assert.deepEqual(readRun(d).state.model, model)
  })
})
