import {createPrivateKey, createPublicKey, generateKeyPairSync, sign, verify, type KeyObject} from 'node:crypto'

/**
 * A participant's ed25519 identity. `id` (hex of the 32-byte raw public key) is its ClientId in the
 * coordinator; every wire message it sends is signed with `privateKey`.
 */
export interface Identity {
  id: string
  publicKey: Uint8Array
  privateKey: KeyObject
}

// DER prefixes that wrap a raw 32-byte ed25519 key as PKCS#8 (private) and SPKI (public).
const PKCS8_PREFIX = Buffer.from('302e020100300506032b657004220420', 'hex')
const SPKI_PREFIX = Buffer.from('302a300506032b6570032100', 'hex')
export const HEX64 = /^[0-9a-f]{64}$/

function fromPrivateKey(privateKey: KeyObject): Identity {
  const jwk = createPublicKey(privateKey).export({format: 'jwk'})
  const publicKey = new Uint8Array(Buffer.from(jwk.x!, 'base64url'))
  return {id: Buffer.from(publicKey).toString('hex'), publicKey, privateKey}
}

/** A new random identity. */
export function generateIdentity(): Identity {
  return fromPrivateKey(generateKeyPairSync('ed25519').privateKey)
}

/** The identity whose ed25519 private seed is `seed32` (deterministic: for tests and key derivation). */
export function identityFromSeed(seed32: Uint8Array): Identity {
  if (seed32.length !== 32) throw new RangeError(`an ed25519 seed is 32 bytes, got ${seed32.length}`)
  return fromPrivateKey(createPrivateKey({key: Buffer.concat([PKCS8_PREFIX, seed32]), format: 'der', type: 'pkcs8'}))
}

/** The 32-byte ed25519 private seed (the libp2p peer key is derived from the same bytes). */
export function identityPrivateSeed(identity: Identity): Uint8Array {
  const jwk = identity.privateKey.export({format: 'jwk'})
  return new Uint8Array(Buffer.from(jwk.d!, 'base64url'))
}

export function signBytes(identity: Identity, bytes: Uint8Array): Uint8Array {
  return new Uint8Array(sign(null, bytes, identity.privateKey))
}

// Parsing a public key costs more than verifying with it; peers send many messages.
const publicKeys = new Map<string, KeyObject>()
const MAX_CACHED_KEYS = 4096

function publicKeyObject(publicKeyHex: string): KeyObject {
  let key = publicKeys.get(publicKeyHex)
  if (!key) {
    key = createPublicKey({key: Buffer.concat([SPKI_PREFIX, Buffer.from(publicKeyHex, 'hex')]), format: 'der', type: 'spki'})
    if (publicKeys.size >= MAX_CACHED_KEYS) publicKeys.delete(publicKeys.keys().next().value!)
    publicKeys.set(publicKeyHex, key)
  }
  return key
}

/** True only for a valid signature of `bytes` by the key `publicKeyHex`; malformed keys or signatures are false, never an exception. */
export function verifyBytes(publicKeyHex: string, bytes: Uint8Array, signature: Uint8Array): boolean {
  if (typeof publicKeyHex !== 'string' || !HEX64.test(publicKeyHex) || signature?.length !== 64) return false
  try {
    return verify(null, bytes, publicKeyObject(publicKeyHex), signature)
  } catch {
    return false
  }
}

/** True for a well-formed identity id (64 lowercase hex digits). */
export function isIdentityId(value: unknown): value is string {
  return typeof value === 'string' && HEX64.test(value)
}
