import assert from 'node:assert/strict'
import {readFileSync} from 'node:fs'
import {describe, it} from 'node:test'
import {AccountRole, type Address, type KeyPairSigner} from '@solana/kit'
import {AUTHORIZATION_SIZE, authorizationAddress, decodeAuthorization, grantInstruction} from '../../src/core/backend/solana/authorizer.js'
import {
  coordinatorAddress,
  initCoordinatorInstructions,
  metadataAddress,
  peerAddress,
  setMetadataInstruction,
  setPeerInstruction,
  SYSTEM_PROGRAM,
  updateInstruction,
} from '../../src/core/backend/solana/instructions.js'
import {AUTHORIZER_PROGRAM_PATH, LocalChain} from '../../src/core/backend/solana/local-chain.js'
import {METADATA_SIZE, PEER_SIZE, STATE_SIZE, clientIdOf, decodeCoordinator, decodeMetadata, decodePeer} from '../../src/core/backend/solana/layout.js'
import {keypair, testConfig, testModel} from './harness.js'

// Anyone may send lamports to any address, a program address included. The system program's CreateAccount refuses
// an address that holds lamports, so a program that creates its accounts with it can be blocked for good by a
// stranger's transfer. These tests pre-fund every address the programs create, with less and with more than its
// rent, and require the creation to succeed anyway.

const T0 = 1_700_000_000

async function setup(): Promise<{chain: LocalChain; programId: Address; authorizer: Address; payer: KeyPairSigner; mallory: KeyPairSigner}> {
  const programId = (await keypair('program')).address
  const chain = new LocalChain(programId)
  const authorizer = (await keypair('authorizer-program')).address
  chain.addProgram(authorizer, readFileSync(AUTHORIZER_PROGRAM_PATH))
  chain.setTime(T0)
  const payer = await keypair('payer')
  const mallory = await keypair('mallory')
  chain.airdrop(payer.address)
  chain.airdrop(mallory.address)
  return {chain, programId, authorizer, payer, mallory}
}

/** mallory squats `address` with a plain system transfer. */
async function squat(chain: LocalChain, mallory: KeyPairSigner, address: Address, amount: bigint): Promise<void> {
  const data = Buffer.alloc(12)
  data[0] = 2 // SystemInstruction::Transfer
  data.writeBigUInt64LE(amount, 4)
  const transfer = {
    programAddress: SYSTEM_PROGRAM,
    accounts: [
      {address: mallory.address, role: AccountRole.WRITABLE_SIGNER, signer: mallory},
      {address, role: AccountRole.WRITABLE},
    ],
    data,
  }
  const r = await chain.send(mallory, [transfer])
  assert.ok(r.ok, r.error)
  assert.equal(chain.svm.getBalance(address), amount)
}

for (const [label, amount] of [
  // the least a transfer may leave in an empty account (the rent exemption of 0 bytes)
  ['the least an account may hold', (_rent: bigint, chain: LocalChain) => chain.rentExemption(0)],
  ['more than the rent', (rent: bigint) => rent + 12_345n],
] as [string, (rent: bigint, chain: LocalChain) => bigint][]) {
  describe(`no squatting: every address the programs create, pre-funded with ${label}`, () => {
    it('init_coordinator still creates the run (and a second init says the run exists)', async () => {
      const {chain, programId, payer, mallory} = await setup()
      const coordinator = await coordinatorAddress(programId, 'squat-run')
      const rent = chain.rentExemption(STATE_SIZE)
      await squat(chain, mallory, coordinator, amount(rent, chain))
      const init = (mainAuthority: Address) =>
        chain.send(payer, initCoordinatorInstructions({programId, coordinator, payer, runId: 'squat-run', mainAuthority, joinAuthority: null, lamports: rent}))
      const r = await init(payer.address)
      assert.ok(r.ok, `${r.error}\n${r.logs.join('\n')}`)
      const account = chain.svm.getAccount(coordinator)
      assert.ok(account.exists)
      assert.equal(account.programAddress, programId)
      assert.equal(account.data.length, STATE_SIZE)
      assert.ok(account.lamports >= rent, 'rent exempt')
      const run = decodeCoordinator(Uint8Array.from(account.data))
      assert.equal(run.state.run_id, 'squat-run')
      assert.equal(run.main_authority, payer.address)
      // the run works: its authority configures it
      assert.ok((await chain.send(payer, [updateInstruction(programId, coordinator, payer, testConfig, testModel)])).ok)
      const again = await init(mallory.address)
      assert.equal(again.error, 'AlreadyExists')
      assert.ok(
        again.logs.some((l) => l.includes('update')),
        again.logs.join('\n'),
      )
    })

    it("set_peer still creates the client's peer record, and set_metadata the run's metadata", async () => {
      const {chain, programId, payer, mallory} = await setup()
      const coordinator = await coordinatorAddress(programId, 'squat-peer')
      const r = await chain.send(
        payer,
        initCoordinatorInstructions({
          programId,
          coordinator,
          payer,
          runId: 'squat-peer',
          mainAuthority: payer.address,
          joinAuthority: null,
          lamports: chain.rentExemption(STATE_SIZE),
        }),
      )
      assert.ok(r.ok, r.error)
      const alice = await keypair('alice')
      chain.airdrop(alice.address)
      const record = await peerAddress(programId, coordinator, alice.address)
      const peerRent = chain.rentExemption(PEER_SIZE)
      await squat(chain, mallory, record, amount(peerRent, chain))
      const before = chain.svm.getBalance(alice.address)!
      const set = await chain.send(alice, [setPeerInstruction(programId, coordinator, alice, record, ['/ip4/10.0.0.1/tcp/4001'], peerRent)])
      assert.ok(set.ok, `${set.error}\n${set.logs.join('\n')}`)
      const account = chain.svm.getAccount(record)
      assert.ok(account.exists && account.programAddress === programId && account.lamports >= peerRent)
      assert.deepEqual(decodePeer(Uint8Array.from(account.data)), {coordinator, client: clientIdOf(alice.address), addrs: ['/ip4/10.0.0.1/tcp/4001']})
      // alice paid only the shortfall (and the fee)
      const paid = before - chain.svm.getBalance(alice.address)!
      assert.ok(paid < peerRent - amount(peerRent, chain) + 100_000n || amount(peerRent, chain) >= peerRent, `alice paid ${paid}`)

      const meta = await metadataAddress(programId, coordinator)
      const metaRent = chain.rentExemption(METADATA_SIZE)
      await squat(chain, mallory, meta, amount(metaRent, chain))
      const m = await chain.send(payer, [setMetadataInstruction(programId, coordinator, payer, meta, {name: 'Squat', description: 'not blocked'}, metaRent)])
      assert.ok(m.ok, `${m.error}\n${m.logs.join('\n')}`)
      assert.deepEqual(decodeMetadata(chain.accountData(meta)!), {coordinator, name: 'Squat', description: 'not blocked'})
      const metaAccount = chain.svm.getAccount(meta)
      assert.ok(metaAccount.exists && metaAccount.programAddress === programId)
    })

    it("the authorizer's grant still creates the authorization", async () => {
      const {chain, authorizer, payer, mallory} = await setup()
      const grantee = (await keypair('grantee')).address
      const auth = await authorizationAddress(authorizer, payer.address, grantee)
      const rent = chain.rentExemption(AUTHORIZATION_SIZE)
      await squat(chain, mallory, auth, amount(rent, chain))
      const r = await chain.send(payer, [await grantInstruction(authorizer, payer, grantee, rent)])
      assert.ok(r.ok, `${r.error}\n${r.logs.join('\n')}`)
      assert.deepEqual(decodeAuthorization(chain.accountData(auth)!), {grantor: payer.address, grantee, active: true, delegates: []})
      const authAccount = chain.svm.getAccount(auth)
      assert.ok(authAccount.exists && authAccount.programAddress === authorizer)
      assert.ok(chain.svm.getBalance(auth)! >= rent)
      const again = await chain.send(payer, [await grantInstruction(authorizer, payer, grantee, rent)])
      assert.equal(again.ok, false)
      assert.ok(
        again.logs.some((l) => l.includes('already granted')),
        again.logs.join('\n'),
      )
    })
  })
}
