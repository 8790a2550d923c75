import assert from 'node:assert/strict'
import {readFileSync} from 'node:fs'
import {join} from 'node:path'
import {describe, it} from 'node:test'
import {AccountRole, type Address, type Instruction} from '@solana/kit'
import {
  bufferedUpdateTransactions,
  accuseInstruction,
  checkpointInstruction,
  closePeerInstruction,
  hashWitnessInstruction,
  ejectInstruction,
  equivocationInstructions,
  freeCoordinatorInstruction,
  healthCheckInstruction,
  initCoordinatorInstructions,
  joinRunInstruction,
  setMetadataInstruction,
  setPausedInstruction,
  setRatesInstruction,
  reportScoresInstruction,
  setPeerInstruction,
  tickInstruction,
  updateInstruction,
  warmupWitnessInstruction,
  withdrawInstruction,
  witnessInstruction,
} from '../../src/core/backend/solana/instructions.js'
import {IX, METADATA_SIZE, PEER_SIZE, PROGRAM_ERRORS, STATE_SIZE, UPDATE_BUFFER_SIZE, decodeStateLogs} from '../../src/core/backend/solana/layout.js'
import {signAnnouncement} from '../../src/core/primitives/announcement.js'
import {identityFromSeed} from '../../src/core/protocol/identity.js'
import {projectRoot} from '../../src/core/worker/python.js'
import {PARTICIPANT_SIZE, TREASURY_SIZE, claimInstruction, fundInstruction, initTreasuryInstruction} from '../../src/core/backend/solana/treasurer.js'
import {enumValues} from '../../src/core/layout/layout-table.js'
import {deployRun, keypair, readRun, testConfig, testModel} from './harness.js'

interface IdlAccount {
  name: string
  signer: boolean
  writable: boolean
  optional?: boolean
  address?: string
}
interface Idl {
  instructions: {name: string; discriminant: number; accounts: IdlAccount[]; args: {name: string; type: string}[]}[]
  accounts: {name: string; size: number}[]
  errors: {code: number; name: string}[]
}

/** Every instruction of `spec` has a builder whose discriminant and accounts (signer, writable, fixed addresses) are the IDL's. */
function checkBuilders(spec: Idl, built: Record<string, Instruction>, program: Address): void {
  for (const want of spec.instructions) {
    const ix = built[want.name]
    assert.ok(ix, `no builder checked for ${want.name}`)
    assert.equal(ix.programAddress, program)
    assert.equal(Buffer.from(ix.data!)[0], want.discriminant, want.name)
    const accounts = ix.accounts ?? []
    const required = want.accounts.filter((a) => !a.optional).length
    assert.ok(accounts.length >= required && accounts.length <= want.accounts.length, `${want.name}: ${accounts.length} accounts`)
    accounts.forEach((meta, i) => {
      const account = want.accounts[i]!
      const signs = meta.role === AccountRole.READONLY_SIGNER || meta.role === AccountRole.WRITABLE_SIGNER
      const writes = meta.role === AccountRole.WRITABLE || meta.role === AccountRole.WRITABLE_SIGNER
      assert.equal(signs, account.signer, `${want.name}.${account.name} signer`)
      assert.equal(writes, account.writable, `${want.name}.${account.name} writable`)
      if (account.address) assert.equal(meta.address, account.address, `${want.name}.${account.name} address`)
    })
  }
}

const idl = JSON.parse(readFileSync(join(projectRoot, 'programs', 'idl', 'psyche_coordinator.json'), 'utf8')) as Idl
// the program's enums are generated from the layout table into this header (coordinator.c includes it)
const source = readFileSync(join(projectRoot, 'programs', 'include', 'psyche_layout.h'), 'utf8')

describe("the coordinator program's IDL (programs/idl/psyche_coordinator.json) agrees with the program and the TypeScript client", () => {
  it('instructions and their discriminants: the IDL, layout.ts and the C enum list the same, in the same order', () => {
    assert.deepEqual(
      idl.instructions.map((i) => [i.name, i.discriminant]),
      Object.entries(IX),
    )
    const cEnum = source.slice(source.indexOf('IX_INIT_COORDINATOR = 0'), source.indexOf('};', source.indexOf('IX_INIT_COORDINATOR = 0')))
    const names = [...cEnum.matchAll(/IX_([A-Z_]+) = \d+/g)].map((m) => m[1]!.toLowerCase())
    assert.deepEqual(names, Object.keys(IX))
  })

  it('errors: the IDL names every code the program returns as the client does', () => {
    assert.deepEqual(Object.fromEntries(idl.errors.map((e) => [e.code, e.name])), PROGRAM_ERRORS)
    // every E_ code of the program is named
    const cErrors = source.slice(source.indexOf('E_HALTED = 1'), source.indexOf('};', source.indexOf('E_HALTED = 1')))
    assert.equal([...cErrors.matchAll(/E_[A-Z_]+ = \d+/g)].length, idl.errors.length)
  })

  it('account sizes', () => {
    assert.deepEqual(Object.fromEntries(idl.accounts.map((a) => [a.name, a.size])), {
      Coordinator: STATE_SIZE,
      Peer: PEER_SIZE,
      Metadata: METADATA_SIZE,
      UpdateBuffer: UPDATE_BUFFER_SIZE,
    })
  })

  it("every instruction the client builds has the IDL's discriminant and accounts (signer, writable, fixed addresses)", async () => {
    const p = (await keypair('idl-program')).address
    const c = (await keypair('idl-coordinator')).address
    const signer = await keypair('idl-signer')
    const other = (await keypair('idl-other')).address as Address
    const producer = identityFromSeed(new Uint8Array(32).fill(3))
    const announce = (commitment: number) =>
      signAnnouncement(producer, {run_id: 'r', step: 1, client_id: producer.id, batch_start: 0, batch_end: 1, commitment: Buffer.alloc(32, commitment).toString('hex'), size: 1})
    const built: Record<string, Instruction> = {
      init_coordinator: initCoordinatorInstructions({programId: p, coordinator: c, payer: signer, runId: 'r', mainAuthority: other, joinAuthority: null, lamports: 1n})[0]!,
      update: updateInstruction(p, c, signer, testConfig, testModel),
      set_paused: setPausedInstruction(p, c, signer, false),
      join_run: joinRunInstruction(p, c, signer, other),
      tick: tickInstruction(p, c),
      witness: witnessInstruction(p, c, signer, 1, new Uint8Array(8), new Uint8Array(8)),
      warmup_witness: warmupWitnessInstruction(p, c, signer),
      health_check: healthCheckInstruction(p, c, signer, [other]),
      checkpoint: checkpointInstruction(p, c, signer, {repo_id: 'a/b'}, 'ab'.repeat(32)),
      free_coordinator: freeCoordinatorInstruction(p, c, signer, other),
      withdraw: withdrawInstruction(p, c, signer),
      eject: ejectInstruction(p, c, signer, producer.id),
      grow: initCoordinatorInstructions({programId: p, coordinator: c, payer: signer, runId: 'r', mainAuthority: other, joinAuthority: null, lamports: 1n})[1]!,
      accuse: accuseInstruction(p, c, signer, 1, producer.id),
      set_peer: setPeerInstruction(p, c, signer, other, ['/ip4/1.2.3.4/tcp/1'], 1n),
      equivocation: equivocationInstructions(p, c, signer, {a: announce(1), b: announce(2)})[1]!,
      set_metadata: setMetadataInstruction(p, c, signer, other, {name: 'n', description: 'd'}, 1n),
      close_peer: closePeerInstruction(p, c, signer, other),
      ...Object.fromEntries(
        ['buffer_init', 'buffer_write', 'update_from_buffer'].map((name, i, names) => {
          const txs = bufferedUpdateTransactions(p, c, signer, other, 1n, testConfig, testModel)
          return [names[i], (i === 0 ? txs[0] : i === 1 ? txs[1] : txs[txs.length - 1])[0]!]
        }),
      ),
      hash_witness: hashWitnessInstruction(p, c, signer, 1, 'ab'.repeat(32)),
      set_rates: setRatesInstruction(p, c, signer, 1000, 5),
      report_scores: reportScoresInstruction(p, c, signer, 1, [{index: 0, score: 250000}]),
    }
    checkBuilders(idl, built, p)
  })

  it('the program logs every phase change with sol_log_data, for indexers (decodeStateLogs)', async () => {
    const d = await deployRun('log-run', 1_700_000_000)
    const {programId: p, coordinator: c, authority: a, chain} = d
    assert.ok((await chain.send(a, [updateInstruction(p, c, a, {...testConfig, init_min_clients: 1}, testModel)])).ok)
    const resumed = await chain.send(a, [setPausedInstruction(p, c, a, false)])
    assert.deepEqual(decodeStateLogs(resumed.logs), [{run_state: 'WaitingForMembers', run_state_start: 1_700_000_000_000, step: 1, epoch: 0}])
    const alice = await keypair('alice')
    chain.airdrop(alice.address)
    const joined = await chain.send(alice, [joinRunInstruction(p, c, alice)])
    assert.deepEqual(decodeStateLogs(joined.logs), [], 'no phase change, no log')
    chain.setTime(1_700_000_010)
    const ticked = await chain.send(a, [tickInstruction(p, c)])
    assert.deepEqual(decodeStateLogs(ticked.logs), [{run_state: 'Warmup', run_state_start: 1_700_000_010_000, step: 1, epoch: 0}])
    const warm = await chain.send(alice, [warmupWitnessInstruction(p, c, alice)])
    assert.deepEqual(
      decodeStateLogs(warm.logs).map((l) => l.run_state),
      ['RoundTrain'],
    )
    assert.equal(readRun(d).state.run_state, 'RoundTrain')
  })
})

const treasurerIdl = JSON.parse(readFileSync(join(projectRoot, 'programs', 'idl', 'psyche_treasurer.json'), 'utf8')) as Idl

describe("the treasurer program's IDL (programs/idl/psyche_treasurer.json) agrees with the program and the TypeScript client", () => {
  it('instructions, discriminants, accounts, account sizes and errors', async () => {
    assert.deepEqual(
      treasurerIdl.instructions.map((i) => [i.name, i.discriminant]),
      Object.entries(enumValues('TreasurerInstruction')),
    )
    const cEnum = source.slice(source.indexOf('TIX_INIT_TREASURY = 0'), source.indexOf('};', source.indexOf('TIX_INIT_TREASURY = 0')))
    assert.deepEqual(
      [...cEnum.matchAll(/TIX_([A-Z_]+) = \d+/g)].map((m) => m[1]!.toLowerCase()),
      Object.keys(enumValues('TreasurerInstruction')),
    )
    assert.deepEqual(Object.fromEntries(treasurerIdl.errors.map((e) => [e.code, e.name])), PROGRAM_ERRORS)
    assert.deepEqual(Object.fromEntries(treasurerIdl.accounts.map((a) => [a.name, a.size])), {Treasury: TREASURY_SIZE, Participant: PARTICIPANT_SIZE})
    const t = (await keypair('idl-treasurer')).address
    const c = (await keypair('idl-coordinator')).address
    const signer = await keypair('idl-signer')
    const other = (await keypair('idl-other')).address as Address
    checkBuilders(
      treasurerIdl,
      {
        init_treasury: await initTreasuryInstruction(t, c, signer, other, {treasury: 1n, vault: 1n}),
        fund: await fundInstruction(t, c, signer, other, 1n),
        claim: await claimInstruction(t, c, signer, other, 1n),
      },
      t,
    )
  })
})
