import {AccountRole, getAddressDecoder, getProgramDerivedAddress, type Address, type Instruction, type TransactionSigner} from '@solana/kit'
import {addressBytes} from './layout.js'
import {MAGICS, enumValues, structLayout} from '../../layout/layout-table.js'
import {INSTRUCTION_UNITS, SYSTEM_PROGRAM, TOKEN_PROGRAM, signerMeta, withUnits} from './instructions.js'

/**
 * The treasurer program (programs/treasurer): token rewards for a run's points. The run's main authority creates the
 * run's treasury for an SPL token mint (init_treasury) and funds it (fund); a client claims its points not yet claimed
 * × the run's token rate (set_rates), which the program reads from the coordinator account, and its participant record
 * keeps what it claimed, so claiming twice pays once.
 */

export const TREASURY_SIZE = structLayout('Treasury').size
export const PARTICIPANT_SIZE = structLayout('Participant').size
/** An SPL token account's size (the treasury's vault). */
export const TOKEN_ACCOUNT_SIZE = 165
const T = structLayout('Treasury').at
const P = structLayout('Participant').at
const TIX = enumValues('TreasurerInstruction')

export interface Treasury {
  coordinator: Address
  coordinator_program: Address
  authority: Address
  mint: Address
  vault: Address
  /** Token base units the authority paid in with fund; points and token base units paid out by claims. */
  funded: bigint
  claimed: number
  paid: bigint
}

interface Participant {
  treasury: Address
  client: Address
  /** Points paid (the client's earned points at its last claim), and the token base units paid for them. */
  claimed: number
  paid: bigint
}

/** The treasury of a run: the treasurer's program address of ("treasury", coordinator). */
export async function treasuryAddress(treasurer: Address, coordinator: Address): Promise<Address> {
  const [address] = await getProgramDerivedAddress({programAddress: treasurer, seeds: ['treasury', addressBytes(coordinator)]})
  return address
}

/** The treasury's token account (of its mint, owned by the treasury): ("vault", treasury). */
export async function vaultAddress(treasurer: Address, treasury: Address): Promise<Address> {
  const [address] = await getProgramDerivedAddress({programAddress: treasurer, seeds: ['vault', addressBytes(treasury)]})
  return address
}

/** A client's participant record (what it claimed): ("participant", treasury, client). */
export async function participantAddress(treasurer: Address, treasury: Address, client: Address): Promise<Address> {
  const [address] = await getProgramDerivedAddress({programAddress: treasurer, seeds: ['participant', addressBytes(treasury), addressBytes(client)]})
  return address
}

function view(data: Uint8Array, size: number, magic: bigint, what: string): Buffer {
  const b = Buffer.from(data.buffer, data.byteOffset, data.byteLength)
  if (b.length !== size || b.readBigUInt64LE(0) !== magic) throw new RangeError(`not a ${what} account`)
  return b
}

/** Points: a u64 the JavaScript number holds exactly (a RangeError past 2^53, as for the coordinator account). */
function points(b: Buffer, at: number, field: string): number {
  const v = b.readBigUInt64LE(at)
  if (v > BigInt(Number.MAX_SAFE_INTEGER)) throw new RangeError(`treasurer account: ${field} = ${v} exceeds 2^53`)
  return Number(v)
}

export function decodeTreasury(data: Uint8Array): Treasury {
  const b = view(data, TREASURY_SIZE, MAGICS.TREASURY_MAGIC[0], 'treasury')
  const d = getAddressDecoder()
  const key = (at: number): Address => d.decode(b.subarray(at, at + 32))
  return {
    coordinator: key(T.coordinator.offset),
    coordinator_program: key(T.coordinator_program.offset),
    authority: key(T.authority.offset),
    mint: key(T.mint.offset),
    vault: key(T.vault.offset),
    funded: b.readBigUInt64LE(T.funded.offset),
    claimed: points(b, T.claimed.offset, 'claimed'),
    paid: b.readBigUInt64LE(T.paid.offset),
  }
}

export function decodeParticipant(data: Uint8Array): Participant {
  const b = view(data, PARTICIPANT_SIZE, MAGICS.PARTICIPANT_MAGIC[0], 'participant')
  const d = getAddressDecoder()
  return {
    treasury: d.decode(b.subarray(P.treasury.offset, P.treasury.offset + 32)),
    client: d.decode(b.subarray(P.client.offset, P.client.offset + 32)),
    claimed: points(b, P.claimed.offset, 'claimed'),
    paid: b.readBigUInt64LE(P.paid.offset),
  }
}

const writable = (address: Address) => ({address, role: AccountRole.WRITABLE})
const readonly = (address: Address) => ({address, role: AccountRole.READONLY})

/** init_treasury (the run's main authority, who pays): the run's treasury for `mint`, and its vault. */
export async function initTreasuryInstruction(
  treasurer: Address,
  coordinator: Address,
  authority: TransactionSigner,
  mint: Address,
  rent: {treasury: bigint; vault: bigint},
): Promise<Instruction> {
  const treasury = await treasuryAddress(treasurer, coordinator)
  const data = Buffer.alloc(17)
  data[0] = TIX.init_treasury
  data.writeBigUInt64LE(rent.treasury, 1)
  data.writeBigUInt64LE(rent.vault, 9)
  return withUnits(
    {
      programAddress: treasurer,
      accounts: [
        signerMeta(authority, true),
        readonly(coordinator),
        writable(treasury),
        writable(await vaultAddress(treasurer, treasury)),
        readonly(mint),
        readonly(SYSTEM_PROGRAM),
        readonly(TOKEN_PROGRAM),
      ],
      data,
    },
    INSTRUCTION_UNITS.init_treasury,
  )
}

/** fund (the run's main authority): `amount` token base units from its token account `source` into the vault. */
export async function fundInstruction(treasurer: Address, coordinator: Address, authority: TransactionSigner, source: Address, amount: bigint): Promise<Instruction> {
  const treasury = await treasuryAddress(treasurer, coordinator)
  const data = Buffer.alloc(9)
  data[0] = TIX.fund
  data.writeBigUInt64LE(amount, 1)
  return withUnits(
    {
      programAddress: treasurer,
      accounts: [signerMeta(authority), readonly(coordinator), writable(treasury), writable(await vaultAddress(treasurer, treasury)), writable(source), readonly(TOKEN_PROGRAM)],
      data,
    },
    INSTRUCTION_UNITS.fund,
  )
}

/**
 * claim (a client, for its own points): its points not yet claimed × the token rate, from the vault to `destination` (a
 * token account of the mint); `lamports`: the rent of its participant record, created (paid by the client) on its first claim.
 */
export async function claimInstruction(treasurer: Address, coordinator: Address, client: TransactionSigner, destination: Address, lamports: bigint): Promise<Instruction> {
  const treasury = await treasuryAddress(treasurer, coordinator)
  const data = Buffer.alloc(9)
  data[0] = TIX.claim
  data.writeBigUInt64LE(lamports, 1)
  return withUnits(
    {
      programAddress: treasurer,
      accounts: [
        signerMeta(client, true),
        readonly(coordinator),
        writable(treasury),
        writable(await vaultAddress(treasurer, treasury)),
        writable(await participantAddress(treasurer, treasury, client.address)),
        writable(destination),
        readonly(SYSTEM_PROGRAM),
        readonly(TOKEN_PROGRAM),
      ],
      data,
    },
    INSTRUCTION_UNITS.claim,
  )
}
