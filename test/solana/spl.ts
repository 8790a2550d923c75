// The SPL token program (which LiteSVM provides) for the tests: mints, token accounts, minting, balances.
import {AccountRole, generateKeyPairSigner, getAddressEncoder, type Address, type Instruction, type KeyPairSigner} from '@solana/kit'
import {SYSTEM_PROGRAM, TOKEN_PROGRAM, signerMeta} from '../../src/core/backend/solana/instructions.js'
import type {Chain} from '../../src/core/backend/solana/chain.js'

const enc = getAddressEncoder()

async function createAccount(chain: Chain, payer: KeyPairSigner, account: KeyPairSigner, space: number, owner: Address): Promise<Instruction> {
  const data = Buffer.alloc(52)
  data.writeBigUInt64LE(await chain.minimumBalance(space), 4)
  data.writeBigUInt64LE(BigInt(space), 12)
  data.set(enc.encode(owner), 20)
  return {programAddress: SYSTEM_PROGRAM, accounts: [signerMeta(payer, true), signerMeta(account, true)], data}
}

async function sendOk(chain: Chain, payer: KeyPairSigner, ixs: Instruction[], what: string): Promise<void> {
  const r = await chain.send(payer, ixs)
  if (!r.ok) throw new Error(`${what}: ${r.error}\n${r.logs.join('\n')}`)
}

/** A new mint of 0 decimals whose mint authority is `authority` (who pays). */
export async function createMint(chain: Chain, authority: KeyPairSigner): Promise<Address> {
  const mint = await generateKeyPairSigner()
  const init = {
    programAddress: TOKEN_PROGRAM,
    accounts: [{address: mint.address, role: AccountRole.WRITABLE}],
    data: Uint8Array.from([20, 0, ...enc.encode(authority.address), 0]), // InitializeMint2: decimals, authority, no freeze authority
  }
  await sendOk(chain, authority, [await createAccount(chain, authority, mint, 82, TOKEN_PROGRAM), init], 'create mint')
  return mint.address
}

/** A new token account of `mint` whose token owner is `owner` (`payer` pays). */
export async function createTokenAccount(chain: Chain, payer: KeyPairSigner, owner: Address, mint: Address): Promise<Address> {
  const account = await generateKeyPairSigner()
  const init = {
    programAddress: TOKEN_PROGRAM,
    accounts: [
      {address: account.address, role: AccountRole.WRITABLE},
      {address: mint, role: AccountRole.READONLY},
    ],
    data: Uint8Array.from([18, ...enc.encode(owner)]), // InitializeAccount3: owner
  }
  await sendOk(chain, payer, [await createAccount(chain, payer, account, 165, TOKEN_PROGRAM), init], 'create token account')
  return account.address
}

/** Mints `amount` to a token account (the mint authority signs). */
export async function mintTo(chain: Chain, authority: KeyPairSigner, mint: Address, account: Address, amount: bigint): Promise<void> {
  const data = Buffer.alloc(9)
  data[0] = 7 // MintTo
  data.writeBigUInt64LE(amount, 1)
  const ix = {
    programAddress: TOKEN_PROGRAM,
    accounts: [{address: mint, role: AccountRole.WRITABLE}, {address: account, role: AccountRole.WRITABLE}, signerMeta(authority)],
    data,
  }
  await sendOk(chain, authority, [ix], 'mint to')
}

/** A plain SPL transfer between token accounts, signed by the source's token owner. */
export function transferInstruction(owner: KeyPairSigner, source: Address, destination: Address, amount: bigint): Instruction {
  const data = Buffer.alloc(9)
  data[0] = 3 // Transfer
  data.writeBigUInt64LE(amount, 1)
  return {
    programAddress: TOKEN_PROGRAM,
    accounts: [{address: source, role: AccountRole.WRITABLE}, {address: destination, role: AccountRole.WRITABLE}, signerMeta(owner)],
    data,
  }
}

/** A token account's balance. */
export async function balance(chain: Chain, account: Address): Promise<bigint> {
  return Buffer.from((await chain.fetchAccount(account))!).readBigUInt64LE(64)
}
