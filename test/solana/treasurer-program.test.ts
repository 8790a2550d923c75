// The treasurer program (programs/treasurer) in LiteSVM with the real SPL token program: a run's main authority creates
// and funds its treasury, clients claim their points × the run's token rate, read from the coordinator account's
// rewards ledger, exactly once, and nothing else gets paid: no one else's points, no other accounts, no fake coordinator.
import assert from 'node:assert/strict'
import {readFileSync} from 'node:fs'
import {before, describe, it} from 'node:test'
import {AccountRole, lamports, type Address, type Instruction, type KeyPairSigner} from '@solana/kit'
import {INSTRUCTION_UNITS, SYSTEM_PROGRAM, TOKEN_PROGRAM, setRatesInstruction, signerMeta, updateInstruction} from '../../src/core/backend/solana/instructions.js'
import {TREASURER_PROGRAM_PATH, programPath, type ChainFeatures} from '../../src/core/backend/solana/local-chain.js'
import {addressBytes, clientIdOf, decodeLedger} from '../../src/core/backend/solana/layout.js'
import {
  PARTICIPANT_SIZE,
  TOKEN_ACCOUNT_SIZE,
  TREASURY_SIZE,
  claimInstruction,
  decodeParticipant,
  decodeTreasury,
  fundInstruction,
  initTreasuryInstruction,
  participantAddress,
  treasuryAddress,
  vaultAddress,
} from '../../src/core/backend/solana/treasurer.js'
import {constant, structLayout} from '../../src/core/layout/layout-table.js'
import {deployRun, keypair, toInstruction, type Deployed} from './harness.js'
import {balance, createMint, createTokenAccount, mintTo, transferInstruction} from './spl.js'
import {rewardsAtScale} from './vectors.js'

const STATE = structLayout('State').at
const POINTS = structLayout('Points')
const RATE = 3n
const LEDGER_MAX = constant('LEDGER_MAX')

interface Setup {
  d: Deployed
  treasurer: Address
  mint: Address
  /** the authority's token account, holding 10^9 */
  source: Address
  clients: KeyPairSigner[]
  mallory: KeyPairSigner
  earned: (k: KeyPairSigner) => number
}

/** A run of 6 clients with token rate 3 whose two epochs settled (every client earned points), and the treasurer deployed. */
async function setup(features: ChainFeatures): Promise<Setup> {
  const scenario = await rewardsAtScale(0, 6)
  const d = await deployRun(scenario.run_id, scenario.created_at, null, features)
  const treasurer = (await keypair('treasurer-program')).address
  await d.chain.deploy(treasurer, readFileSync(programPath(TREASURER_PROGRAM_PATH, features)))
  const signers = new Map<string, KeyPairSigner>()
  for (const label of Object.keys(scenario.clients)) {
    const k = await keypair(label)
    signers.set(clientIdOf(k.address), k)
    d.chain.airdrop(k.address)
  }
  d.chain.setTime(scenario.created_at)
  assert.ok((await d.chain.send(d.authority, [updateInstruction(d.programId, d.coordinator, d.authority, scenario.config, scenario.model)])).ok)
  assert.ok((await d.chain.send(d.authority, [setRatesInstruction(d.programId, d.coordinator, d.authority, 1000, Number(RATE))])).ok)
  for (const step of scenario.steps) {
    d.chain.setClock(step.now, step.slot)
    const {signer, ix} = toInstruction(d, signers, step.event)
    assert.ok((await d.chain.send(signer, Array.isArray(ix) ? ix : [ix])).ok)
  }
  const mallory = await keypair('mallory')
  d.chain.airdrop(mallory.address)
  const mint = await createMint(d.chain, d.authority)
  const source = await createTokenAccount(d.chain, d.authority, d.authority.address, mint)
  await mintTo(d.chain, d.authority, mint, source, 1_000_000_000n)
  const earned = (k: KeyPairSigner) => decodeLedger(d.chain.accountData(d.coordinator)!).entries.find((e) => e.client_id === clientIdOf(k.address))?.earned ?? 0
  return {d, treasurer, mint, source, clients: [...signers.values()], mallory, earned}
}

const rent = (s: Setup) => ({treasury: s.d.chain.rentExemption(TREASURY_SIZE), vault: s.d.chain.rentExemption(TOKEN_ACCOUNT_SIZE)})

/** The instruction with account `i` replaced. */
function withAccount(ix: Instruction, i: number, address: Address, role = ix.accounts![i].role): Instruction {
  const accounts = [...ix.accounts!]
  accounts[i] = {address, role}
  return {...ix, accounts}
}

/** Replaces an account's data, and its owner (what a buggy or hostile coordinator program could hold). */
function rewrite(s: Setup, address: Address, data: Uint8Array, owner?: Address): void {
  const account = s.d.chain.svm.getAccount(address)
  assert.ok(account.exists)
  s.d.chain.svm.setAccount({...account, data, programAddress: owner ?? account.programAddress})
}

/** Rewrites a u64 of an account's data in place. */
function poke(s: Setup, address: Address, offset: number, value: bigint, owner?: Address): void {
  const data = Buffer.from(s.d.chain.accountData(address)!)
  data.writeBigUInt64LE(value, offset)
  rewrite(s, address, data, owner)
}

// the sBPF v3 build on a current cluster, and the v0 build (the linker's other output) on one without SIMD-0500
for (const features of ['current', 'legacy'] as const)
  describe(`treasurer program: token rewards for points (${features === 'current' ? 'sBPF v3' : 'sBPF v0, legacy cluster'})`, () => {
    let s: Setup
    before(async () => {
      s = await setup(features)
    })

    it('init_treasury and fund: only the run main authority, once, for a real coordinator account and an SPL mint', async () => {
      const {d, treasurer, mint, mallory} = s
      const treasury = await treasuryAddress(treasurer, d.coordinator)
      const vault = await vaultAddress(treasurer, treasury)
      const init = (who: KeyPairSigner, coordinator = d.coordinator, m = mint) => initTreasuryInstruction(treasurer, coordinator, who, m, rent(s))
      assert.equal((await d.chain.send(mallory, [await init(mallory)])).error, 'Unauthorized')
      // a copy of the coordinator account naming mallory its authority, owned by another program (the authorizer)
      const fake = (await keypair('fake-coordinator')).address
      const copy = Buffer.from(d.chain.accountData(d.coordinator)!)
      copy.set(addressBytes(mallory.address), STATE.main_authority.offset)
      d.chain.svm.setAccount({address: fake, data: copy, executable: false, lamports: lamports(10_000_000_000n), programAddress: d.authorizer, space: BigInt(copy.length)})
      assert.equal((await d.chain.send(mallory, [await init(mallory, fake)])).error, 'WrongAccount')
      // not a mint; a wrong vault; a wrong token program
      assert.equal((await d.chain.send(d.authority, [await init(d.authority, d.coordinator, s.source)])).error, 'WrongAccount')
      const good = await init(d.authority)
      assert.equal((await d.chain.send(d.authority, [withAccount(good, 3, s.source)])).error, 'WrongProgramAddress')
      assert.equal((await d.chain.send(d.authority, [withAccount(good, 2, vault)])).error, 'WrongProgramAddress')
      assert.equal((await d.chain.send(d.authority, [withAccount(good, 6, SYSTEM_PROGRAM)])).error, 'WrongAccount')
      // mallory pre-funds the treasury's and vault's addresses: they are created anyway
      for (const address of [treasury, vault]) {
        const data = Buffer.alloc(12)
        data[0] = 2
        data.writeBigUInt64LE(1_000_000n, 4)
        const transfer = {
          programAddress: SYSTEM_PROGRAM,
          accounts: [
            {address: mallory.address, role: AccountRole.WRITABLE_SIGNER, signer: mallory},
            {address, role: AccountRole.WRITABLE},
          ],
          data,
        }
        assert.ok((await d.chain.send(mallory, [transfer])).ok)
      }
      const created = await d.chain.send(d.authority, [good])
      assert.ok(created.ok, `${created.error}\n${created.logs.join('\n')}`)
      assert.ok(created.computeUnits <= INSTRUCTION_UNITS.init_treasury, `init_treasury: ${created.computeUnits} CU`)
      assert.equal((await d.chain.send(d.authority, [await init(d.authority)])).error, 'AlreadyExists')
      assert.deepEqual(decodeTreasury(d.chain.accountData(treasury)!), {
        coordinator: d.coordinator,
        coordinator_program: d.programId,
        authority: d.authority.address,
        mint,
        vault,
        funded: 0n,
        claimed: 0,
        paid: 0n,
      })
      const token = Buffer.from(d.chain.accountData(vault)!)
      const vaultAccount = d.chain.svm.getAccount(vault)
      assert.ok(vaultAccount.exists && vaultAccount.programAddress === TOKEN_PROGRAM, 'the vault is a token account')
      assert.deepEqual(
        [token.subarray(0, 32), token.subarray(32, 64)],
        [mint, treasury].map((a) => Buffer.from(addressBytes(a))),
        'the vault: a token account of the mint, its token owner the treasury',
      )

      // fund: only the authority; mallory's own tokens sent with fund are refused, sent directly they are a gift
      const malloryTokens = await createTokenAccount(d.chain, mallory, mallory.address, mint)
      await mintTo(d.chain, d.authority, mint, malloryTokens, 500n)
      assert.equal((await d.chain.send(mallory, [await fundInstruction(treasurer, d.coordinator, mallory, malloryTokens, 500n)])).error, 'Unauthorized')
      assert.equal((await d.chain.send(d.authority, [await fundInstruction(treasurer, d.coordinator, d.authority, s.source, 0n)])).error, 'InvalidInstruction')
      const funded = await d.chain.send(d.authority, [await fundInstruction(treasurer, d.coordinator, d.authority, s.source, 1000n)])
      assert.ok(funded.ok, `${funded.error}\n${funded.logs.join('\n')}`)
      assert.ok(funded.computeUnits <= INSTRUCTION_UNITS.fund, `fund: ${funded.computeUnits} CU`)
      assert.ok((await d.chain.send(mallory, [transferInstruction(mallory, malloryTokens, vault, 500n)])).ok)
      assert.equal(await balance(d.chain, vault), 1500n)
      assert.equal(await balance(d.chain, s.source), 1_000_000_000n - 1000n)
      assert.equal(decodeTreasury(d.chain.accountData(treasury)!).funded, 1000n)
      console.log(`# treasurer CU: init_treasury ${created.computeUnits}, fund ${funded.computeUnits}`)
    })

    it('claim: pays (earned − claimed) × token rate once, to the points key only, from the run vault only', async () => {
      const {d, treasurer, mint, mallory} = s
      const [alice, bob] = s.clients
      const treasury = await treasuryAddress(treasurer, d.coordinator)
      const vault = await vaultAddress(treasurer, treasury)
      const wallet = await createTokenAccount(d.chain, alice, alice.address, mint)
      const bobWallet = await createTokenAccount(d.chain, bob, bob.address, mint)
      const participantRent = d.chain.rentExemption(PARTICIPANT_SIZE)
      const claim = async (who: KeyPairSigner, to = wallet) => claimInstruction(treasurer, d.coordinator, who, to, participantRent)
      const earned = s.earned(alice)
      assert.ok(earned > 0 && BigInt(earned) * RATE > 1500n, 'alice earned more than the vault holds now')

      // the vault holds 1500: alice's claim needs more
      assert.equal((await d.chain.send(alice, [await claim(alice)])).error, 'TreasuryEmpty')
      assert.ok((await d.chain.send(d.authority, [await fundInstruction(treasurer, d.coordinator, d.authority, s.source, BigInt(earned) * RATE)])).ok)
      // the wrong vault, token program, participant record (bob's, for alice), a signature missing
      const good = await claim(alice)
      assert.equal((await d.chain.send(alice, [withAccount(good, 3, wallet)])).error, 'WrongAccount')
      assert.equal((await d.chain.send(alice, [withAccount(good, 7, SYSTEM_PROGRAM)])).error, 'WrongAccount')
      assert.equal((await d.chain.send(alice, [withAccount(good, 4, await participantAddress(treasurer, treasury, bob.address))])).error, 'WrongProgramAddress')
      assert.equal((await d.chain.send(mallory, [withAccount(good, 0, alice.address, AccountRole.WRITABLE)])).error, 'MissingSignature')
      // a treasury of another program's making: an account holding a copy of the treasury, owned by mallory's key
      const forged = (await keypair('forged-treasury')).address
      const tdata = d.chain.accountData(treasury)!
      d.chain.svm.setAccount({address: forged, data: tdata, executable: false, lamports: lamports(10_000_000n), programAddress: d.authorizer, space: BigInt(tdata.length)})
      assert.equal((await d.chain.send(alice, [withAccount(good, 2, forged)])).error, 'WrongAccount')
      // the coordinator account owned by another program than the one the treasury was made for
      poke(s, d.coordinator, 0, Buffer.from(d.chain.accountData(d.coordinator)!).readBigUInt64LE(0), d.authorizer)
      assert.equal((await d.chain.send(alice, [await claim(alice)])).error, 'WrongAccount')
      poke(s, d.coordinator, 0, Buffer.from(d.chain.accountData(d.coordinator)!).readBigUInt64LE(0), d.programId)
      assert.equal(await balance(d.chain, wallet), 0n)

      // a token account of another mint: the token program refuses the transfer, and the whole claim with it
      const otherMint = await createMint(d.chain, d.authority)
      const elsewhere = await createTokenAccount(d.chain, alice, alice.address, otherMint)
      const wrongMint = await d.chain.send(alice, [await claim(alice, elsewhere)])
      assert.ok(!wrongMint.ok && wrongMint.logs.some((l) => l.includes('TokenkegQfeZyiNwAJbNbGKPFXCWuBvf9Ss623VQ5DA failed')), wrongMint.logs.join('\n'))
      assert.equal(d.chain.accountData(await participantAddress(treasurer, treasury, alice.address)), undefined, 'nothing recorded')
      // mallory pre-funds alice's participant record's address: it is created anyway
      const squat = Buffer.alloc(12)
      squat[0] = 2
      squat.writeBigUInt64LE(1_000_000n, 4)
      const squatted = await d.chain.send(mallory, [
        {
          programAddress: SYSTEM_PROGRAM,
          accounts: [signerMeta(mallory, true), {address: await participantAddress(treasurer, treasury, alice.address), role: AccountRole.WRITABLE}],
          data: squat,
        },
      ])
      assert.ok(squatted.ok, squatted.error)
      const paid = await d.chain.send(alice, [good])
      assert.ok(paid.ok, `${paid.error}\n${paid.logs.join('\n')}`)
      assert.ok(paid.computeUnits <= INSTRUCTION_UNITS.claim, `claim: ${paid.computeUnits} CU`)
      assert.equal(await balance(d.chain, wallet), BigInt(earned) * RATE)
      assert.equal(await balance(d.chain, vault), 1500n)
      const record = await participantAddress(treasurer, treasury, alice.address)
      assert.deepEqual(decodeParticipant(d.chain.accountData(record)!), {treasury, client: alice.address, claimed: earned, paid: BigInt(earned) * RATE})
      // claiming twice pays once; keys without points have nothing to claim (no record is created for them)
      const again = await d.chain.send(alice, [await claim(alice)])
      assert.equal(again.error, 'NothingToClaim')
      assert.ok(again.logs.some((l) => l.includes('no points left to claim')))
      assert.equal((await d.chain.send(mallory, [await claim(mallory)])).error, 'NothingToClaim')
      assert.equal(d.chain.accountData(await participantAddress(treasurer, treasury, mallory.address)), undefined)
      assert.equal(await balance(d.chain, wallet), BigInt(earned) * RATE)

      // bob's points, paid to bob's choice of account; the vault runs short for them until the authority funds it again
      const bobEarned = s.earned(bob)
      assert.equal((await d.chain.send(bob, [await claim(bob, bobWallet)])).error, 'TreasuryEmpty')
      assert.ok((await d.chain.send(d.authority, [await fundInstruction(treasurer, d.coordinator, d.authority, s.source, 1_000_000n)])).ok)
      assert.ok((await d.chain.send(bob, [await claim(bob, bobWallet)])).ok)
      assert.equal(await balance(d.chain, bobWallet), BigInt(bobEarned) * RATE)
      assert.equal(await balance(d.chain, wallet), BigInt(earned) * RATE, "alice's wallet did not change")

      // points earned later (the next epoch): a claim pays only the difference, at the rate of now
      const entry = decodeLedger(d.chain.accountData(d.coordinator)!).entries.findIndex((e) => e.client_id === clientIdOf(alice.address))
      const earnedAt = STATE.ledger.offset + entry * POINTS.size + POINTS.at.earned.offset
      poke(s, d.coordinator, earnedAt, BigInt(earned + 500))
      poke(s, d.coordinator, STATE.token_rate.offset, 0n)
      assert.equal((await d.chain.send(alice, [await claim(alice)])).error, 'NotPermitted', 'a token rate of 0 pays nothing')
      poke(s, d.coordinator, STATE.token_rate.offset, 1n << 62n)
      assert.equal((await d.chain.send(alice, [await claim(alice)])).error, 'NotPermitted', 'points × rate past a u64')
      poke(s, d.coordinator, STATE.token_rate.offset, 5n)
      assert.ok((await d.chain.send(alice, [await claim(alice)])).ok)
      assert.equal(await balance(d.chain, wallet), BigInt(earned) * RATE + 500n * 5n)
      assert.deepEqual(decodeParticipant(d.chain.accountData(record)!), {treasury, client: alice.address, claimed: earned + 500, paid: BigInt(earned) * RATE + 2500n})
      const t = decodeTreasury(d.chain.accountData(treasury)!)
      assert.deepEqual([t.claimed, t.paid], [earned + 500 + bobEarned, BigInt(earned + bobEarned) * RATE + 2500n])

      // a run whose main authority changed (e.g. freed and created again by someone else) pays nothing from this treasury
      const authorityAt = STATE.main_authority.offset
      const data = Buffer.from(d.chain.accountData(d.coordinator)!)
      data.set(Buffer.alloc(32, 7), authorityAt)
      rewrite(s, d.coordinator, data)
      poke(s, d.coordinator, earnedAt, BigInt(earned + 1000))
      assert.equal((await d.chain.send(alice, [await claim(alice)])).error, 'NotPermitted')

      // at capacity: alice's entry last of LEDGER_MAX, the costliest scan
      const full = Buffer.from(d.chain.accountData(d.coordinator)!)
      full.set(addressBytes(d.authority.address), authorityAt)
      full.copy(full, STATE.ledger.offset + (LEDGER_MAX - 1) * POINTS.size, STATE.ledger.offset + entry * POINTS.size, STATE.ledger.offset + (entry + 1) * POINTS.size)
      full.fill(0, STATE.ledger.offset + entry * POINTS.size, STATE.ledger.offset + (entry + 1) * POINTS.size)
      full.writeBigUInt64LE(BigInt(LEDGER_MAX), STATE.ledger_len.offset)
      rewrite(s, d.coordinator, full)
      const last = await d.chain.send(alice, [await claim(alice)])
      assert.ok(last.ok, `${last.error}\n${last.logs.join('\n')}`)
      assert.equal(await balance(d.chain, wallet), BigInt(earned) * RATE + 500n * 5n + 500n * 5n)
      assert.ok(last.computeUnits <= INSTRUCTION_UNITS.claim, `claim at capacity: ${last.computeUnits} CU`)
      console.log(
        `# treasurer CU: claim ${paid.computeUnits} (first, creating the participant record at an address a stranger pre-funded), ${last.computeUnits} (entry ${LEDGER_MAX} of ${LEDGER_MAX})`,
      )
    })
  })
