import {AccountRole, getAddressDecoder, getProgramDerivedAddress, type Address, type Instruction, type TransactionSigner} from '@solana/kit'
import {addressBytes} from './layout.js'
import {MAGICS, constant, structLayout} from '../../layout/layout-table.js'
import {INSTRUCTION_UNITS, SYSTEM_PROGRAM, signerMeta, withUnits} from './instructions.js'

/**
 * The authorizer program (programs/authorizer): a grantor (a run's join authority) grants an
 * authorization to a grantee, the grantee names delegate keys, and the coordinator admits the grantee
 * and its delegates to runs whose join authority is the grantor. Revoking closes the authorization.
 */

export const AUTHORIZATION_SIZE = structLayout('Authorization').size
const MAX_DELEGATES = constant('MAX_DELEGATES')
const MAGIC = MAGICS.AUTH_MAGIC[0]
const AUTH = structLayout('Authorization').at
/** A grantee of all zeros: the grantor authorizes anyone. */
export const ANYONE = '11111111111111111111111111111111' as Address

export interface Authorization {
  grantor: Address
  grantee: Address
  active: boolean
  delegates: Address[]
}

export async function authorizationAddress(authorizer: Address, grantor: Address, grantee: Address): Promise<Address> {
  const [address] = await getProgramDerivedAddress({programAddress: authorizer, seeds: ['authorization', addressBytes(grantor), addressBytes(grantee)]})
  return address
}

export function decodeAuthorization(data: Uint8Array): Authorization {
  const b = Buffer.from(data.buffer, data.byteOffset, data.byteLength)
  if (b.length !== AUTHORIZATION_SIZE || b.readBigUInt64LE(AUTH.magic.offset) !== MAGIC) throw new RangeError('not an authorization account')
  const d = getAddressDecoder()
  const count = Number(b.readBigUInt64LE(AUTH.delegates_len.offset))
  if (count > MAX_DELEGATES) throw new RangeError('authorization: delegate count exceeds MAX_DELEGATES')
  const key = (at: number): Address => d.decode(b.subarray(at, at + 32))
  return {
    grantor: key(AUTH.grantor.offset),
    grantee: key(AUTH.grantee.offset),
    active: b.readBigUInt64LE(AUTH.active.offset) !== 0n,
    delegates: Array.from({length: count}, (_, i) => key(AUTH.delegates.offset + i * AUTH.delegates.stride)),
  }
}

export async function grantInstruction(authorizer: Address, grantor: TransactionSigner, grantee: Address, lamports: bigint): Promise<Instruction> {
  const data = Buffer.alloc(41)
  data[0] = 0
  Buffer.from(addressBytes(grantee)).copy(data, 1)
  data.writeBigUInt64LE(lamports, 33)
  return withUnits(
    {
      programAddress: authorizer,
      accounts: [
        signerMeta(grantor, true),
        {address: await authorizationAddress(authorizer, grantor.address, grantee), role: AccountRole.WRITABLE},
        {address: SYSTEM_PROGRAM, role: AccountRole.READONLY},
      ],
      data,
    },
    INSTRUCTION_UNITS.grant,
  )
}

/** Replaces the grantee's delegate list. */
export function delegatesInstruction(authorizer: Address, grantee: TransactionSigner, authorization: Address, delegates: Address[]): Instruction {
  if (delegates.length > MAX_DELEGATES) throw new RangeError(`at most ${MAX_DELEGATES} delegates`)
  return withUnits(
    {
      programAddress: authorizer,
      accounts: [signerMeta(grantee), {address: authorization, role: AccountRole.WRITABLE}],
      data: Buffer.concat([Buffer.from([1, delegates.length]), ...delegates.map(addressBytes)]),
    },
    INSTRUCTION_UNITS.delegates,
  )
}

/** Closes the authorization; its lamports go to `recipient`. */
export function revokeInstruction(authorizer: Address, grantor: TransactionSigner, authorization: Address, recipient: Address): Instruction {
  return withUnits(
    {
      programAddress: authorizer,
      accounts: [signerMeta(grantor), {address: authorization, role: AccountRole.WRITABLE}, {address: recipient, role: AccountRole.WRITABLE}],
      data: Uint8Array.from([2]),
    },
    INSTRUCTION_UNITS.revoke,
  )
}
