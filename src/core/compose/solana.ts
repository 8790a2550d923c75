import {homedir} from 'node:os'
import {join, resolve} from 'node:path'
import {createKeyPairSignerFromPrivateKeyBytes, type Address, type KeyPairSigner} from '@solana/kit'
import {closePeerRecord, loadKeypairWithSeed} from '../backend/solana/admin.js'
import {RpcChain} from '../backend/solana/chain.js'
import {SolanaConnector} from '../backend/solana/client.js'
import type {EventLine} from '../events.js'
import {identityFromSeed, identityPrivateSeed, loadIdentity, type Identity} from '../protocol/identity.js'

// A client's coordinator when its run is on Solana: loaded by compose/client.ts only for such a run, so that the
// Solana client libraries load only then.

/** Where the run's program is, and how this client reaches it (join's Solana flags, as given). */
export interface SolanaSetup {
  /** JSON-RPC URL(s) of the cluster, comma-separated. */
  rpc: string
  /** The cluster's websocket (accountSubscribe); else the account is polled every pollMs. */
  wsRpc?: string
  pollMs: number
  /** The coordinator program's address. */
  programId: Address
  priorityFee?: number
  /** A permissioned run's authorization admitting this key; default: the join authority's grant. */
  authorization?: Address
  /** The client's Solana keypair file; default ~/.config/solana/id.json (unless an identity file gives the key). */
  keypair?: string
}

/**
 * The client's key and its connector to the run's program. One ed25519 key is both the psyche identity (client id,
 * libp2p peer id) and the Solana signer: from the identity file when given, else from the keypair file.
 */
export async function solanaCoordinator(
  s: SolanaSetup,
  o: {runId: string; identity?: string; log: (event: EventLine) => void},
): Promise<{identity: Identity; connector: SolanaConnector; address: string; closePeerRecord: () => Promise<boolean>}> {
  let identity: Identity
  let signer: KeyPairSigner
  if (o.identity) {
    identity = await loadIdentity(resolve(o.identity))
    signer = await createKeyPairSignerFromPrivateKeyBytes(identityPrivateSeed(identity))
  } else {
    const k = await loadKeypairWithSeed(resolve(s.keypair ?? join(homedir(), '.config', 'solana', 'id.json')))
    signer = k.signer
    identity = identityFromSeed(k.seed)
  }
  const run = {chain: new RpcChain(s.rpc, {priorityFee: BigInt(s.priorityFee ?? 0)}), programId: s.programId, runId: o.runId, client: signer}
  const connector = new SolanaConnector({
    chain: run.chain,
    programId: run.programId,
    runId: o.runId,
    signer,
    wsUrl: s.wsRpc,
    pollMs: s.pollMs,
    authorization: s.authorization,
    log: (e) => o.log({...e, source: 'coordinator'}),
  })
  // A client that leaves for good closes its peer record (its rent comes back).
  return {identity, connector, address: signer.address, closePeerRecord: () => closePeerRecord(run)}
}
