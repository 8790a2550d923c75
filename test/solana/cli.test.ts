import assert from 'node:assert/strict'
import {generateKeyPairSync} from 'node:crypto'
import {readFileSync, writeFileSync} from 'node:fs'
import {join} from 'node:path'
import {after, before, describe, it} from 'node:test'
import {getAddressDecoder, type Address} from '@solana/kit'
import {readAuthorization, readRun} from '../../src/core/backend/solana/admin.js'
import {RpcChain} from '../../src/core/backend/solana/chain.js'
import {projectRoot} from '../../src/core/worker/python.js'
import {runCli, startCli, tempDir} from '../helpers.js'

/** A Solana CLI keypair file (secret seed ‖ public key, 64 numbers); returns its address. */
function writeKeypair(path: string): Address {
  const {privateKey, publicKey} = generateKeyPairSync('ed25519')
  const seed = privateKey.export({format: 'der', type: 'pkcs8'}).subarray(-32)
  const pub = publicKey.export({format: 'der', type: 'spki'}).subarray(-32)
  writeFileSync(path, JSON.stringify([...seed, ...pub]), {mode: 0o600})
  return getAddressDecoder().decode(pub)
}

const json = (stdout: string) => JSON.parse(stdout) as Record<string, unknown>

describe('Solana commands against a localnet (psyche solana localnet)', () => {
  const dir = tempDir('psyche-solana-cli-')
  const creator = join(dir.path, 'creator.json')
  const alice = join(dir.path, 'alice.json')
  const ids = {creator: '' as Address, alice: '' as Address, program: '' as Address, authorizer: '' as Address}
  let net: ReturnType<typeof startCli>
  let url = ''
  let configPath = ''

  before(async () => {
    ids.creator = writeKeypair(creator)
    ids.alice = writeKeypair(alice)
    ids.program = writeKeypair(join(dir.path, 'program.json'))
    ids.authorizer = writeKeypair(join(dir.path, 'authorizer.json'))
    configPath = join(dir.path, 'state.toml')
    writeFileSync(
      configPath,
      readFileSync(join(projectRoot, 'templates', 'tiny-demo', 'state.toml'), 'utf8').replace(
        '[model.LLM.checkpoint.Local]\npath = "model"',
        '[model.LLM.checkpoint.Hub]\nrepo_id = "psyche/tiny-demo"',
      ),
    )
    net = startCli(['solana', 'localnet', '--port', '0', '--json', '--program-id', ids.program, '--authorizer-id', ids.authorizer, '--fund', ids.creator, '--fund', ids.alice])
    url = await new Promise<string>((resolve, reject) => {
      let out = ''
      net.stdout!.on('data', (chunk: Buffer) => {
        out += chunk.toString()
        const line = out.split('\n').find((l) => l.includes('"listening"'))
        if (line) resolve(JSON.parse(line).url as string)
      })
      void net.then((r) => reject(new Error(`localnet exited: ${r.stderr}`)))
    })
  })

  after(async () => {
    net.kill('SIGTERM')
    await net
    dir.cleanup()
  })

  const cli = (...args: string[]) => runCli([...args, '--rpc', url, '--program-id', ids.program, '--authorizer-id', ids.authorizer], {timeoutMs: 60_000})

  it("the run creator's workflow: create-run (permissioned, configured), set-paused, update-config refused while running, authorize grant / delegates / revoke", async () => {
    const created = await cli('create-run', '--keypair', creator, '--run-id', 'cli-run', '--config-path', configPath, '--join-authority', ids.creator, '--json')
    assert.equal(created.exitCode, 0, created.stderr)
    assert.deepEqual(
      {...json(created.stdout), coordinator: undefined},
      {run_id: 'cli-run', coordinator: undefined, main_authority: ids.creator, join_authority: ids.creator, configured: true, name: null, description: null},
    )
    const resumed = await cli('set-paused', 'resume', '--keypair', creator, '--run-id', 'cli-run', '--json')
    assert.equal(resumed.exitCode, 0, resumed.stderr)
    assert.equal(json(resumed.stdout).run_state, 'WaitingForMembers')
    const busy = await cli('update-config', '--keypair', creator, '--run-id', 'cli-run', '--config-path', configPath)
    assert.equal(busy.exitCode, 1)
    assert.match(busy.stderr, /update-config cli-run refused: InvalidRunState \(the configuration can change only while Paused or Uninitialized\)/)
    const run = await readRun({chain: new RpcChain(url), programId: ids.program, runId: 'cli-run'})
    assert.equal(run.state.run_state, 'WaitingForMembers')
    assert.equal(run.main_authority, ids.creator)
    assert.equal(run.join_authority, ids.creator)

    const granted = await cli('authorize', 'grant', '--keypair', creator, '--grantee', ids.alice, '--json')
    assert.equal(granted.exitCode, 0, granted.stderr)
    const hot = writeKeypair(join(dir.path, 'hot.json'))
    const delegated = await cli('authorize', 'delegates', '--keypair', alice, '--grantor', ids.creator, '--delegate', hot, '--json')
    assert.equal(delegated.exitCode, 0, delegated.stderr)
    const target = {chain: new RpcChain(url), authorizer: ids.authorizer, grantor: ids.creator, grantee: ids.alice}
    assert.deepEqual((await readAuthorization(target))!.delegates, [hot])
    const revoked = await cli('authorize', 'revoke', '--keypair', creator, '--grantee', ids.alice, '--json')
    assert.equal(revoked.exitCode, 0, revoked.stderr)
    assert.equal(await readAuthorization(target), undefined)
  })

  it('a bad keypair file is a one-line error naming it', async () => {
    const bad = join(dir.path, 'bad.json')
    writeFileSync(bad, '[1,2,3]', {mode: 0o600})
    const r = await cli('set-paused', 'resume', '--keypair', bad, '--run-id', 'cli-run')
    assert.equal(r.exitCode, 1)
    assert.match(r.stderr, /bad\.json: a Solana keypair file is a JSON array of 64 bytes/)
  })
})
