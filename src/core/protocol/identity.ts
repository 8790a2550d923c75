import {PsycheError} from '../errors.js'
import {identityFromSeed, identityPrivateSeed, HEX64, type Identity} from '../primitives/identity.js'
import {readSecretFile} from '../secret-file.js'
import {writeFileAtomicSync} from './atomic-file.js'

// The keys themselves (generate, derive, sign, verify) are primitives; this module reads and writes identity files.
export {generateIdentity, identityFromSeed, identityPrivateSeed, isIdentityId, signBytes, verifyBytes, type Identity} from '../primitives/identity.js'

/**
 * On disk an identity is one JSON object (mode 0600):
 *   {"type": "psyche-identity", "version": 1, "algorithm": "ed25519", "id": "<64 hex>", "secret_seed": "<64 hex>"}
 * `secret_seed` is the 32-byte ed25519 private seed (RFC 8032), from which the libp2p peer key is
 * derived too; `id` is repeated so that a corrupted or hand-edited file is caught on load.
 */
const IDENTITY_FILE_TYPE = 'psyche-identity'

function identityToJson(identity: Identity): string {
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
