import {publicKeyFromRaw} from '@libp2p/crypto/keys'
import type {PeerId} from '@libp2p/interface'
import {peerIdFromPublicKey} from '@libp2p/peer-id'
import {PsycheError} from '../errors.js'

/** The libp2p peer id of a coordinator identity (libp2p ed25519 peer ids embed the public key). */
export function peerIdOfClient(clientIdHex: string): PeerId {
  if (!/^[0-9a-f]{64}$/.test(clientIdHex)) throw new PsycheError(`client id ${clientIdHex.slice(0, 80)} is not a 32-byte hex public key`)
  return peerIdFromPublicKey(publicKeyFromRaw(Buffer.from(clientIdHex, 'hex')))
}
