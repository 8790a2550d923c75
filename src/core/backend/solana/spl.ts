import {AccountRole, generateKeyPairSigner, getAddressEncoder, getProgramDerivedAddress, type Address, type Instruction, type TransactionSigner} from '@solana/kit'
import {PsycheError} from '../../errors.js'
import type {Chain} from './chain.js'
import {INSTRUCTION_UNITS, SYSTEM_PROGRAM, TOKEN_PROGRAM, signerMeta, withUnits} from './instructions.js'

/**
 * The few SPL token operations psyche sends itself (the treasurer program does the rest by CPI): associated token
 * accounts (where a key's tokens of a mint live by default), and, for a localnet, a mint and minting.
 */

const ASSOCIATED_TOKEN_PROGRAM = 'ATokenGPvbdGVxr1b2hvZbsiqW5xWH25efTNsLJA8knL' as Address
const MINT_SIZE = 82
const enc = getAddressEncoder()

/** The associated token account of `owner` for `mint` (what wallets and `spl-token` use by default). */
export async function associatedTokenAddress(owner: Address, mint: Address): Promise<Address> {
  const [address] = await getProgramDerivedAddress({programAddress: ASSOCIATED_TOKEN_PROGRAM, seeds: [enc.encode(owner), enc.encode(TOKEN_PROGRAM), enc.encode(mint)]})
  return address
}

/** CreateIdempotent: `owner`'s associated token account for `mint`, unless it exists (`payer` pays its rent). */
export async function associatedTokenAccountInstruction(payer: TransactionSigner, owner: Address, mint: Address): Promise<Instruction> {
  return withUnits(
    {
      programAddress: ASSOCIATED_TOKEN_PROGRAM,
      accounts: [
        signerMeta(payer, true),
        {address: await associatedTokenAddress(owner, mint), role: AccountRole.WRITABLE},
        {address: owner, role: AccountRole.READONLY},
        {address: mint, role: AccountRole.READONLY},
        {address: SYSTEM_PROGRAM, role: AccountRole.READONLY},
        {address: TOKEN_PROGRAM, role: AccountRole.READONLY},
      ],
      data: Uint8Array.from([1]),
    },
    INSTRUCTION_UNITS.associated_token_account,
  )
}

/** MintTo: `amount` base units of `mint` into `account` (the mint authority signs). */
function mintToInstruction(mint: Address, account: Address, authority: TransactionSigner, amount: bigint): Instruction {
  const data = Buffer.alloc(9)
  data[0] = 7
  data.writeBigUInt64LE(amount, 1)
  return withUnits(
    {
      programAddress: TOKEN_PROGRAM,
      accounts: [{address: mint, role: AccountRole.WRITABLE}, {address: account, role: AccountRole.WRITABLE}, signerMeta(authority)],
      data,
    },
    INSTRUCTION_UNITS.token,
  )
}

/** A token account's balance (0 for no account). */
export function tokenBalance(data: Uint8Array | undefined): bigint {
  return data && data.length >= 72 ? Buffer.from(data.buffer, data.byteOffset, data.byteLength).readBigUInt64LE(64) : 0n
}

/**
 * A new mint of 0 decimals whose mint authority is `authority` (who pays), and `amount` of it in the associated token
 * account of each of `holders`: what a localnet offers for trying token rewards without the spl-token CLI.
 */
export async function createTestMint(chain: Chain, authority: TransactionSigner, holders: Address[], amount: bigint): Promise<Address> {
  const mint = await generateKeyPairSigner()
  const create = Buffer.alloc(52)
  create.writeBigUInt64LE(await chain.minimumBalance(MINT_SIZE), 4)
  create.writeBigUInt64LE(BigInt(MINT_SIZE), 12)
  create.set(enc.encode(TOKEN_PROGRAM), 20)
  const ixs: Instruction[] = [
    {programAddress: SYSTEM_PROGRAM, accounts: [signerMeta(authority, true), signerMeta(mint, true)], data: create},
    withUnits(
      {programAddress: TOKEN_PROGRAM, accounts: [{address: mint.address, role: AccountRole.WRITABLE}], data: Uint8Array.from([20, 0, ...enc.encode(authority.address), 0])},
      INSTRUCTION_UNITS.token,
    ),
  ]
  const r = await chain.send(authority, ixs)
  if (!r.ok) throw new PsycheError(`creating a token mint failed: ${r.error}`)
  for (const holder of holders) {
    const account = await associatedTokenAddress(holder, mint.address)
    const sent = await chain.send(authority, [
      await associatedTokenAccountInstruction(authority, holder, mint.address),
      mintToInstruction(mint.address, account, authority, amount),
    ])
    if (!sent.ok) throw new PsycheError(`minting to ${holder} failed: ${sent.error}`)
  }
  return mint.address
}
