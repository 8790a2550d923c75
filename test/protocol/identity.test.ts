import assert from 'node:assert/strict'
import {chmodSync, statSync, writeFileSync} from 'node:fs'
import {join} from 'node:path'
import {test} from 'node:test'
import {loadKeypair} from '../../src/core/backend/solana/admin.js'
import {PsycheError} from '../../src/core/errors.js'
import {generateIdentity, identityFromSeed, identityPrivateSeed, loadIdentity, saveIdentity, signBytes, verifyBytes} from '../../src/core/protocol/index.js'
import {runCli, tempDir} from '../helpers.js'

// RFC 8032, test 1: the public key of the all-known seed, so our raw-key handling matches the standard.
const RFC8032_SEED = Buffer.from('9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60', 'hex')
const RFC8032_PUBLIC = 'd75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a'
const RFC8032_SIGNATURE_OF_EMPTY = 'e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b'

test('identityFromSeed matches RFC 8032 (public key, signature) and gives its seed back', () => {
  const identity = identityFromSeed(RFC8032_SEED)
  assert.equal(identity.id, RFC8032_PUBLIC)
  assert.equal(Buffer.from(identity.publicKey).toString('hex'), RFC8032_PUBLIC)
  assert.equal(Buffer.from(signBytes(identity, new Uint8Array(0))).toString('hex'), RFC8032_SIGNATURE_OF_EMPTY)
  assert.deepEqual(Buffer.from(identityPrivateSeed(identity)), RFC8032_SEED)
  assert.throws(() => identityFromSeed(new Uint8Array(31)), /32 bytes/)
})

test('generateIdentity gives distinct identities whose seeds rebuild them', () => {
  const a = generateIdentity()
  const b = generateIdentity()
  assert.notEqual(a.id, b.id)
  assert.match(a.id, /^[0-9a-f]{64}$/)
  assert.equal(identityFromSeed(identityPrivateSeed(a)).id, a.id)
})

test('sign/verify: valid passes; tampered bytes, signature, or another key fail (never throw)', () => {
  const a = generateIdentity()
  const b = generateIdentity()
  const bytes = Buffer.from('psyche round 7')
  const sig = signBytes(a, bytes)
  assert.equal(sig.length, 64)
  assert.ok(verifyBytes(a.id, bytes, sig))
  const tamperedBytes = Buffer.from(bytes)
  tamperedBytes[3] ^= 1
  assert.equal(verifyBytes(a.id, tamperedBytes, sig), false)
  const tamperedSig = Buffer.from(sig)
  tamperedSig[10] ^= 0x80
  assert.equal(verifyBytes(a.id, bytes, tamperedSig), false)
  assert.equal(verifyBytes(b.id, bytes, sig), false)
  // Malformed keys and signatures are simply false.
  assert.equal(verifyBytes('zz', bytes, sig), false)
  assert.equal(verifyBytes(a.id.toUpperCase(), bytes, sig), false)
  assert.equal(verifyBytes(a.id, bytes, sig.subarray(0, 63)), false)
  assert.equal(verifyBytes('00'.repeat(32), bytes, new Uint8Array(64)), false)
})

test('saveIdentity / loadIdentity round trip, mode 0600, atomic (no temporary file left)', async () => {
  const dir = tempDir()
  try {
    const path = join(dir.path, 'id.json')
    const identity = generateIdentity()
    await saveIdentity(identity, path)
    assert.equal(statSync(path).mode & 0o777, 0o600)
    const loaded = await loadIdentity(path)
    assert.equal(loaded.id, identity.id)
    const sig = signBytes(loaded, Buffer.from('x'))
    assert.ok(verifyBytes(identity.id, Buffer.from('x'), sig))
    const {readdirSync} = await import('node:fs')
    assert.deepEqual(readdirSync(dir.path), ['id.json'])
  } finally {
    dir.cleanup()
  }
})

test('loadIdentity: missing, malformed or inconsistent files are PsycheErrors naming the file', async () => {
  const dir = tempDir()
  try {
    const missing = join(dir.path, 'missing.json')
    await assert.rejects(loadIdentity(missing), (e: Error) => e instanceof PsycheError && e.message.includes(missing) && /no such file/.test(e.message))
    const cases: [string, string, RegExp][] = [
      ['garbage.json', 'not json {', /not JSON/],
      ['other.json', JSON.stringify({type: 'something-else'}), /"type" must be/],
      ['short.json', JSON.stringify({type: 'psyche-identity', version: 1, secret_seed: 'abcd'}), /secret_seed must be 64 hex/],
      ['mismatch.json', JSON.stringify({type: 'psyche-identity', version: 1, id: '00'.repeat(32), secret_seed: RFC8032_SEED.toString('hex')}), /does not match its secret_seed/],
      ['version.json', JSON.stringify({type: 'psyche-identity', version: 2, secret_seed: RFC8032_SEED.toString('hex')}), /version 2/],
    ]
    for (const [name, text, pattern] of cases) {
      const path = join(dir.path, name)
      writeFileSync(path, text, {mode: 0o600})
      await assert.rejects(loadIdentity(path), (e: Error) => e instanceof PsycheError && e.message.includes(path) && pattern.test(e.message), name)
    }
    // Without the redundant id the seed alone is enough.
    const path = join(dir.path, 'seed-only.json')
    writeFileSync(path, JSON.stringify({type: 'psyche-identity', version: 1, secret_seed: RFC8032_SEED.toString('hex')}), {mode: 0o600})
    assert.equal((await loadIdentity(path)).id, RFC8032_PUBLIC)
  } finally {
    dir.cleanup()
  }
})

test('identity and keypair files that group or others can access are refused, as ssh refuses a private key', async () => {
  const dir = tempDir()
  try {
    const identity = generateIdentity()
    const path = join(dir.path, 'me.json')
    await saveIdentity(identity, path)
    assert.equal(statSync(path).mode & 0o777, 0o600)
    for (const mode of [0o644, 0o640, 0o604, 0o660, 0o620]) {
      chmodSync(path, mode)
      await assert.rejects(
        loadIdentity(path),
        (e: Error) =>
          e instanceof PsycheError &&
          e.message === `identity ${path}: permissions 0${mode.toString(8)} are too open: it holds a secret key that group or others can access; run chmod 600 ${path}`,
        mode.toString(8),
      )
    }
    chmodSync(path, 0o400)
    assert.equal((await loadIdentity(path)).id, identity.id)
    // a Solana keypair file: the same rule
    const keypair = join(dir.path, 'id.json')
    writeFileSync(keypair, JSON.stringify([...identityPrivateSeed(identity), ...identity.publicKey]), {mode: 0o644})
    chmodSync(keypair, 0o644)
    await assert.rejects(loadKeypair(keypair), /Solana keypair .*id\.json: permissions 0644 are too open.*chmod 600/)
    chmodSync(keypair, 0o600)
    assert.equal((await loadKeypair(keypair)).address.length > 30, true)
    // the CLI: one line, exit 1
    chmodSync(path, 0o644)
    const r = await runCli(['identity', 'show', '--identity', path])
    assert.equal(r.exitCode, 1)
    assert.match(r.stderr, /permissions 0644 are too open/)
    assert.ok(!r.stdout.includes(Buffer.from(identityPrivateSeed(identity)).toString('hex')), 'the secret is never printed')
  } finally {
    dir.cleanup()
  }
})
