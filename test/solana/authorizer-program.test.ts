import assert from 'node:assert/strict'
import {describe, it} from 'node:test'
import {AccountRole, lamports, type Address, type KeyPairSigner} from '@solana/kit'
import {addressBytes, clientIdOf} from '../../src/core/backend/solana/layout.js'
import {
  ANYONE,
  AUTHORIZATION_SIZE,
  authorizationAddress,
  decodeAuthorization,
  delegatesInstruction,
  grantInstruction,
  revokeInstruction,
} from '../../src/core/backend/solana/authorizer.js'
import {joinRunInstruction, setPausedInstruction, updateInstruction, withdrawInstruction} from '../../src/core/backend/solana/instructions.js'
import {deployRun, keypair, readRun, testConfig as config, testModel as model, type Deployed} from './harness.js'

async function permissionedRun(): Promise<{d: Deployed; grantor: KeyPairSigner; who: (label: string) => Promise<KeyPairSigner>}> {
  const grantor = await keypair('grantor')
  const d = await deployRun('perm-run', 1_700_000_000, grantor.address)
  d.chain.airdrop(grantor.address)
  assert.ok((await d.chain.send(d.authority, [updateInstruction(d.programId, d.coordinator, d.authority, config, model)])).ok)
  assert.ok((await d.chain.send(d.authority, [setPausedInstruction(d.programId, d.coordinator, d.authority, false)])).ok)
  const who = async (label: string) => {
    const k = await keypair(label)
    d.chain.airdrop(k.address)
    return k
  }
  return {d, grantor, who}
}

async function grant(d: Deployed, grantor: KeyPairSigner, grantee: Address): Promise<Address> {
  const r = await d.chain.send(grantor, [await grantInstruction(d.authorizer, grantor, grantee, d.chain.rentExemption(AUTHORIZATION_SIZE))])
  assert.ok(r.ok, `grant: ${r.error}\n${r.logs.join('\n')}`)
  return authorizationAddress(d.authorizer, grantor.address, grantee)
}

const join = (d: Deployed, client: KeyPairSigner, authorization?: Address) => d.chain.send(client, [joinRunInstruction(d.programId, d.coordinator, client, authorization)])

describe('authorizer program and permissioned joins', () => {
  it('the run records its join authority and authorizer', async () => {
    const {d, grantor} = await permissionedRun()
    const run = readRun(d)
    assert.equal(run.join_authority, grantor.address)
    assert.equal(run.authorizer, d.authorizer)
  })

  it('grant admits the grantee; others, and joins without an authorization, are refused', async () => {
    const {d, grantor, who} = await permissionedRun()
    const alice = await who('alice')
    const bob = await who('bob')
    assert.equal((await join(d, alice)).error, 'NotPermitted')
    const auth = await grant(d, grantor, alice.address)
    assert.deepEqual(decodeAuthorization(d.chain.accountData(auth)!), {grantor: grantor.address, grantee: alice.address, active: true, delegates: []})
    assert.equal((await join(d, bob, auth)).error, 'NotPermitted')
    const r = await join(d, alice, auth)
    assert.ok(r.ok, r.error)
    assert.deepEqual(readRun(d).state.pending, [clientIdOf(alice.address)])
  })

  it("the grantee's delegates may join; only the grantee sets them", async () => {
    const {d, grantor, who} = await permissionedRun()
    const alice = await who('alice')
    const hot = await who('alice-hot-key')
    const mallory = await who('mallory')
    const auth = await grant(d, grantor, alice.address)
    assert.equal((await d.chain.send(mallory, [delegatesInstruction(d.authorizer, mallory, auth, [mallory.address])])).code, 102)
    assert.ok((await d.chain.send(alice, [delegatesInstruction(d.authorizer, alice, auth, [hot.address])])).ok)
    assert.deepEqual(decodeAuthorization(d.chain.accountData(auth)!).delegates, [hot.address])
    assert.ok((await join(d, hot, auth)).ok)
    assert.equal((await join(d, mallory, auth)).error, 'NotPermitted')
    assert.deepEqual(readRun(d).state.pending, [clientIdOf(hot.address)])
  })

  it('an authorization from another grantor, or a look-alike account of another program, does not admit', async () => {
    const {d, who} = await permissionedRun()
    const carol = await who('carol')
    const stranger = await who('other-grantor')
    const foreign = await grant(d, stranger, carol.address)
    assert.equal((await join(d, carol, foreign)).error, 'NotPermitted')
    // The same bytes in an account the authorizer does not own.
    const fake = (await keypair('fake-authorization')).address
    const bytes = Uint8Array.from(d.chain.accountData(foreign)!)
    bytes.set(addressBytes(readRun(d).join_authority!), 8) // granted by the run's join authority
    d.chain.svm.setAccount({address: fake, data: bytes, executable: false, lamports: lamports(10_000_000n), programAddress: d.programId, space: BigInt(bytes.length)})
    assert.equal((await join(d, carol, fake)).error, 'NotPermitted')
  })

  it('revoke: grantor only; afterwards the grantee cannot join again', async () => {
    const {d, grantor, who} = await permissionedRun()
    const alice = await who('alice')
    const auth = await grant(d, grantor, alice.address)
    assert.ok((await join(d, alice, auth)).ok)
    assert.ok((await d.chain.send(alice, [withdrawInstruction(d.programId, d.coordinator, alice)])).ok)
    assert.equal((await d.chain.send(alice, [revokeInstruction(d.authorizer, alice, auth, alice.address)])).code, 102)
    const before = d.chain.svm.getBalance(grantor.address)!
    assert.ok((await d.chain.send(alice, [revokeInstruction(d.authorizer, grantor, auth, grantor.address)])).ok)
    assert.ok(d.chain.svm.getBalance(grantor.address)! > before)
    assert.equal(d.chain.accountData(auth), undefined)
    assert.equal((await join(d, alice, auth)).error, 'NotPermitted')
  })

  it('a grant to anyone (all-zero grantee) admits every key', async () => {
    const {d, grantor, who} = await permissionedRun()
    const auth = await grant(d, grantor, ANYONE)
    for (const label of ['x', 'y']) assert.ok((await join(d, await who(label), auth)).ok)
    assert.equal(readRun(d).state.pending.length, 2)
  })

  it('the authorization must be the program address of (grantor, grantee)', async () => {
    const {d, grantor} = await permissionedRun()
    const ix = await grantInstruction(d.authorizer, grantor, (await keypair('g1')).address, d.chain.rentExemption(AUTHORIZATION_SIZE))
    const wrong = await authorizationAddress(d.authorizer, grantor.address, (await keypair('g2')).address)
    const r = await d.chain.send(grantor, [{...ix, accounts: [ix.accounts![0], {address: wrong, role: AccountRole.WRITABLE}, ix.accounts![2]]}])
    assert.equal(r.code, 106)
  })
})
