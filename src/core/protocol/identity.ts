import {createPrivateKey, createPublicKey, generateKeyPairSync, sign, verify, type KeyObject} from 'node:crypto'
import {PsycheError} from '../errors.js'
import {readSecretFile} from '../secret-file.js'
import {writeFileAtomicSync} from './atomic-file.js'

/**
 * A participant's ed25519 identity. `id` (hex of the 32-byte raw public key) is its ClientId in the
 * coordinator; every wire message it sends is signed with `privateKey`.
 */
export interface Identity {
  id: string
  publicKey: Uint8Array
  privateKey: KeyObject
}

/**
 * On disk an identity is one JSON object (mode 0600):
 *   {"type": "psyche-identity", "version": 1, "algorithm": "ed25519", "id": "<64 hex>", "secret_seed": "<64 hex>"}
 * `secret_seed` is the 32-byte ed25519 private seed (RFC 8032), from which the libp2p peer key is
 * derived too; `id` is repeated so that a corrupted or hand-edited file is caught on load.
 */
export const IDENTITY_FILE_TYPE = 'psyche-identity'

// DER prefixes that wrap a raw 32-byte ed25519 key as PKCS#8 (private) and SPKI (public).
const PKCS8_PREFIX = Buffer.from('302e020100300506032b657004220420', 'hex')
const SPKI_PREFIX = Buffer.from('302a300506032b6570032100', 'hex')
const HEX64 = /^[0-9a-f]{64}$/

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

export function identityToJson(identity: Identity): string {
  const seed = Buffer.from(identityPrivateSeed(identity)).toString('hex')
  return `${JSON.stringify({type: IDENTITY_FILE_TYPE, version: 1, algorithm: 'ed25519', id: identity.id, secret_seed: seed}, null, 2)}\n`
}

/** Writes the identity atomically (temporary file, fsync, rename) with mode 0600: it holds a secret key. */
export async function saveIdentity(identity: Identity, path: string): Promise<void> {
  try {
    writeFileAtomicSync(path, identityToJson(identity), 0o600)
  } catch (error) {
    throw new PsycheError(`${path}: cannot write identity: ${(error as NodeJS.ErrnoException).code ?? (error as Error).message}`, {cause: error})
  }
}

/** Reads an identity file; a missing, unreadable, malformed or group/other-accessible file is a PsycheError naming it. */
export async function loadIdentity(path: string): Promise<Identity> {
  let text: string
  try {
    text = await readSecretFile(path, 'identity')
  } catch (error) {
    if (error instanceof PsycheError) throw error
    const code = (error as NodeJS.ErrnoException).code
    const what = code === 'ENOENT' ? 'no such file (create one with `psyche identity new --out FILE`)' : `cannot read: ${code ?? (error as Error).message}`
    throw new PsycheError(`identity ${path}: ${what}`, {code: 'EIDENTITY', cause: error})
  }
  const bad = (what: string) => new PsycheError(`identity ${path}: ${what}`, {code: 'EIDENTITY'})
  let json: unknown
  try {
    json = JSON.parse(text)
  } catch {
    throw bad('not JSON (expected a psyche identity file)')
  }
  const file = json as Record<string, unknown>
  if (file === null || typeof file !== 'object' || file.type !== IDENTITY_FILE_TYPE) throw bad(`"type" must be "${IDENTITY_FILE_TYPE}"`)
  if (file.version !== 1) throw bad(`version ${JSON.stringify(file.version)}: expected 1`)
  if (file.algorithm !== undefined && file.algorithm !== 'ed25519') throw bad(`algorithm ${JSON.stringify(file.algorithm)}: expected "ed25519"`)
  if (typeof file.secret_seed !== 'string' || !HEX64.test(file.secret_seed)) throw bad('secret_seed must be 64 hex digits (a 32-byte ed25519 seed)')
  const identity = identityFromSeed(Buffer.from(file.secret_seed, 'hex'))
  if (file.id !== undefined && file.id !== identity.id) throw bad(`id ${JSON.stringify(file.id)} does not match its secret_seed (whose id is ${identity.id})`)
  return identity
}
