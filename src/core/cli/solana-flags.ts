import {homedir} from 'node:os'
import {join} from 'node:path'
import {Flags} from '@oclif/core'
import {address, isAddress, type Address} from '@solana/kit'
import {loadKeypair} from '../backend/solana/admin.js'
import {RpcChain} from '../backend/solana/chain.js'
import {PsycheError} from '../errors.js'

/** Flags shared by the Solana commands (as the Solana CLI names them where it has them). */
export const solanaFlags = {
  rpc: Flags.string({summary: 'JSON-RPC URL of the cluster; several, comma-separated, are tried in order', default: 'http://127.0.0.1:8899', env: 'PSYCHE_SOLANA_RPC'}),
  'ws-rpc': Flags.string({summary: "the cluster's websocket URL: confirmations by signatureSubscribe (default: poll --rpc)", env: 'PSYCHE_SOLANA_WS_RPC'}),
  keypair: Flags.string({summary: 'Solana keypair file (JSON array of 64 bytes) that signs and pays', default: join(homedir(), '.config', 'solana', 'id.json')}),
  'program-id': Flags.string({summary: 'address of the deployed coordinator program (programs/build/psyche_coordinator.so)', env: 'PSYCHE_COORDINATOR_PROGRAM'}),
  'priority-fee': Flags.integer({summary: 'priority fee in micro-lamports per compute unit (default 0)', default: 0, min: 0, env: 'PSYCHE_SOLANA_PRIORITY_FEE'}),
  'authorizer-id': Flags.string({summary: 'address of the deployed authorizer program (programs/build/psyche_authorizer.so)', env: 'PSYCHE_AUTHORIZER_PROGRAM'}),
  'treasurer-id': Flags.string({summary: 'address of the deployed treasurer program (programs/build/psyche_treasurer.so): token rewards', env: 'PSYCHE_TREASURER_PROGRAM'}),
}

export function parseAddress(value: string | undefined, flag: string): Address {
  if (!value) throw new PsycheError(`--${flag} is required (or its environment variable)`, {code: 'EUSAGE'})
  if (!isAddress(value)) throw new PsycheError(`--${flag} ${JSON.stringify(value)} is not a base58 Solana address`, {code: 'EUSAGE'})
  return address(value)
}

export async function solanaContext(flags: {rpc: string; 'ws-rpc'?: string; keypair: string; 'priority-fee'?: number}) {
  return {chain: new RpcChain(flags.rpc, {wsUrl: flags['ws-rpc'], priorityFee: BigInt(flags['priority-fee'] ?? 0)}), signer: await loadKeypair(flags.keypair)}
}
