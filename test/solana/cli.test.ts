import assert from 'node:assert/strict'
import {generateKeyPairSync} from 'node:crypto'
import {readFileSync, statSync, writeFileSync} from 'node:fs'
import {join} from 'node:path'
import {after, before, describe, it} from 'node:test'
import {getAddressDecoder, type Address} from '@solana/kit'
import {loadKeypair, readAuthorization, readMetadata, readRun} from '../../src/core/backend/solana/admin.js'
import {coordinatorAddress} from '../../src/core/backend/solana/instructions.js'
import {RpcChain} from '../../src/core/backend/solana/chain.js'
import {associatedTokenAddress, tokenBalance} from '../../src/core/backend/solana/spl.js'
import {treasuryAddress} from '../../src/core/backend/solana/treasurer.js'
import {projectRoot} from '../../src/core/worker/python.js'
import {runCli, startCli, tempDir} from '../helpers.js'
import {balance, createMint, createTokenAccount, mintTo} from './spl.js'

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
  const ids = {creator: '' as Address, alice: '' as Address, program: '' as Address, authorizer: '' as Address, treasurer: '' as Address}
  let net: ReturnType<typeof startCli>
  let url = ''
  let configPath = ''

  before(async () => {
    ids.creator = writeKeypair(creator)
    ids.alice = writeKeypair(alice)
    ids.program = writeKeypair(join(dir.path, 'program.json'))
    ids.authorizer = writeKeypair(join(dir.path, 'authorizer.json'))
    ids.treasurer = writeKeypair(join(dir.path, 'treasurer.json'))
    configPath = join(dir.path, 'state.toml')
    writeFileSync(
      configPath,
      readFileSync(join(projectRoot, 'templates', 'tiny-demo', 'state.toml'), 'utf8').replace(
        '[model.LLM.checkpoint.Local]\npath = "model"',
        '[model.LLM.checkpoint.Hub]\nrepo_id = "psyche/tiny-demo"',
      ),
    )
    net = startCli([
      'solana',
      'localnet',
      '--port',
      '0',
      '--json',
      '--program-id',
      ids.program,
      '--authorizer-id',
      ids.authorizer,
      '--treasurer-id',
      ids.treasurer,
      '--fund',
      ids.creator,
      '--fund',
      ids.alice,
    ])
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

  const cli = (...args: string[]) =>
    runCli([...args, '--rpc', url, '--program-id', ids.program, '--authorizer-id', ids.authorizer, '--treasurer-id', ids.treasurer], {timeoutMs: 60_000})

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
    // set-rates: the main authority's rates wait for the next epoch; anyone else is refused
    const rates = await cli('set-rates', '--keypair', creator, '--run-id', 'cli-run', '--points-per-batch', '2000', '--token-rate', '3', '--json')
    assert.equal(rates.exitCode, 0, rates.stderr)
    assert.deepEqual(json(rates.stdout), {run_id: 'cli-run', points_per_batch: 1000, token_rate: 0, next: {points_per_batch: 2000, token_rate: 3}})
    const squat = await cli('set-rates', '--keypair', alice, '--run-id', 'cli-run', '--points-per-batch', '1')
    assert.equal(squat.exitCode, 1)
    assert.match(squat.stderr, /set-rates cli-run refused: Unauthorized/)

    // the treasury (treasurer program): an SPL mint of the creator's, and token accounts of it
    const chain = new RpcChain(url)
    const creatorKey = await loadKeypair(creator)
    const aliceKey = await loadKeypair(alice)
    const mint = await createMint(chain, creatorKey)
    const source = await createTokenAccount(chain, creatorKey, creatorKey.address, mint)
    await mintTo(chain, creatorKey, mint, source, 10_000n)
    const aliceTokens = await createTokenAccount(chain, aliceKey, aliceKey.address, mint)
    const rewards = async () => {
      const r = await runCli(['rewards', '--rpc', url, '--program-id', ids.program, '--treasurer-id', ids.treasurer, '--run-id', 'cli-run', '--json'])
      assert.equal(r.exitCode, 0, r.stderr)
      return json(r.stdout)
    }
    assert.equal((await rewards()).treasury, null)
    const noTreasury = await cli('rewards', 'claim', '--keypair', alice, '--run-id', 'cli-run', '--to', aliceTokens)
    assert.equal(noTreasury.exitCode, 1)
    assert.match(noTreasury.stderr, /run cli-run has no treasury: its main authority creates one with psyche rewards fund --mint/)
    const noMint = await cli('rewards', 'fund', '--keypair', creator, '--run-id', 'cli-run', '--from', source, '--amount', '10')
    assert.equal(noMint.exitCode, 1)
    assert.match(noMint.stderr, /run cli-run has no treasury yet: --mint names the SPL token mint/)
    const stranger = await cli('rewards', 'fund', '--keypair', alice, '--run-id', 'cli-run', '--mint', mint, '--from', aliceTokens)
    assert.equal(stranger.exitCode, 1)
    assert.match(stranger.stderr, /rewards fund cli-run refused: Unauthorized/)
    const funded = await cli('rewards', 'fund', '--keypair', creator, '--run-id', 'cli-run', '--mint', mint, '--from', source, '--amount', '1000', '--json')
    assert.equal(funded.exitCode, 0, funded.stderr)
    const treasury = await treasuryAddress(ids.treasurer, await coordinatorAddress(ids.program, 'cli-run'))
    assert.deepEqual(
      {...json(funded.stdout), vault: undefined},
      {
        run_id: 'cli-run',
        treasury,
        vault: undefined,
        mint,
        created: true,
        amount: '1000',
        funded: '1000',
        balance: '1000',
        paid: '0',
      },
    )
    const more = await cli('rewards', 'fund', '--keypair', creator, '--run-id', 'cli-run', '--from', source, '--amount', '500', '--json')
    assert.equal(more.exitCode, 0, more.stderr)
    assert.deepEqual([json(more.stdout).created, json(more.stdout).funded, json(more.stdout).balance], [false, '1500', '1500'])
    for (const bad of ['-5', '1.5', '18446744073709551616']) {
      const refused = await cli('rewards', 'fund', '--keypair', creator, '--run-id', 'cli-run', '--amount', bad)
      assert.equal(refused.exitCode, 1)
      assert.match(refused.stderr, /--amount .*: token base units, an integer from 0 to 2\^64 − 1/)
    }
    assert.equal(await balance(chain, source), 10_000n - 1500n)
    assert.deepEqual(
      {...((await rewards()).treasury as object), vault: undefined},
      {address: treasury, mint, vault: undefined, balance: '1500', funded: '1500', paid: '0', claimed: 0},
    )
    const otherMint = await cli('rewards', 'fund', '--keypair', creator, '--run-id', 'cli-run', '--mint', aliceKey.address)
    assert.equal(otherMint.exitCode, 1)
    assert.match(otherMint.stderr, /its treasury pays in .*, not .* \(a run has one treasury, of one mint\)/)
    // alice has no points in this run: nothing to claim, nothing paid
    const claimed = await cli('rewards', 'claim', '--keypair', alice, '--run-id', 'cli-run', '--to', aliceTokens)
    assert.equal(claimed.exitCode, 1)
    assert.match(claimed.stderr, /rewards claim cli-run refused: NothingToClaim \(this key has no points left to claim\)/)
    assert.equal(await balance(chain, aliceTokens), 0n)

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

describe('Solana without the Solana CLI: keys, a localnet that names its programs, create-run that finishes what it started, status', () => {
  const dir = tempDir('psyche-solana-nocli-')
  let net: ReturnType<typeof startCli>
  const env: Record<string, string> = {}
  const me = join(dir.path, 'me.json')

  before(async () => {
    const made = await runCli(['identity', 'new', '--solana', '--out', me, '--json'])
    assert.equal(made.exitCode, 0, made.stderr)
    net = startCli(['solana', 'localnet', '--port', '0', '--fund', me, '--tokens', '5000'])
    await new Promise<void>((resolve, reject) => {
      let out = ''
      net.stdout!.on('data', (chunk: Buffer) => {
        out += chunk.toString()
        for (const m of out.matchAll(/^export (PSYCHE_[A-Z_]+)=(\S+)$/gm)) env[m[1]!] = m[2]!
        if (env.PSYCHE_SOLANA_WS_RPC) resolve()
      })
      void net.then((r) => reject(new Error(`localnet exited: ${r.stderr}`)))
    })
  })

  after(async () => {
    net.kill('SIGTERM')
    await net
    dir.cleanup()
  })

  it('identity new --solana writes a Solana CLI keypair (0600); identity show prints its id and base58 address', async () => {
    const bytes = JSON.parse(readFileSync(me, 'utf8')) as number[]
    assert.equal(bytes.length, 64)
    assert.equal(statSync(me).mode & 0o777, 0o600)
    const signer = await loadKeypair(me)
    const shown = await runCli(['identity', 'show', '--identity', me])
    assert.equal(shown.exitCode, 0, shown.stderr)
    assert.deepEqual(shown.stdout.trim().split('\n'), [Buffer.from(bytes.slice(32)).toString('hex'), signer.address])
    const only = await runCli(['identity', 'show', '--identity', me, '--address'])
    assert.equal(only.stdout.trim(), signer.address)
  })

  it('solana localnet without program ids makes them and prints the export lines; the README workflow runs on them', async () => {
    assert.match(env.PSYCHE_COORDINATOR_PROGRAM!, /^[1-9A-HJ-NP-Za-km-z]{32,44}$/)
    assert.match(env.PSYCHE_AUTHORIZER_PROGRAM!, /^[1-9A-HJ-NP-Za-km-z]{32,44}$/)
    assert.notEqual(env.PSYCHE_COORDINATOR_PROGRAM, env.PSYCHE_AUTHORIZER_PROGRAM)
    assert.match(env.PSYCHE_SOLANA_RPC!, /^http:\/\/127\.0\.0\.1:\d+$/)
    assert.equal(env.PSYCHE_SOLANA_WS_RPC, env.PSYCHE_SOLANA_RPC!.replace('http:', 'ws:'))
    const cli = (...args: string[]) => runCli(args, {timeoutMs: 60_000, env})
    const local = join(dir.path, 'local.toml')
    writeFileSync(local, readFileSync(join(projectRoot, 'templates', 'tiny-demo', 'state.toml'), 'utf8'))
    const good = join(dir.path, 'hub.toml')
    writeFileSync(good, readFileSync(local, 'utf8').replace('[model.LLM.checkpoint.Local]\npath = "model"', '[model.LLM.checkpoint.Hub]\nrepo_id = "psyche/tiny-demo"'))
    const chain = new RpcChain(env.PSYCHE_SOLANA_RPC!)
    const programId = env.PSYCHE_COORDINATOR_PROGRAM as Address
    const coordinator = await coordinatorAddress(programId, 'nocli-run')
    // a configuration the program cannot take is refused before anything is sent
    const local1 = await cli('create-run', '--keypair', me, '--run-id', 'nocli-run', '--config-path', local)
    assert.equal(local1.exitCode, 1)
    assert.match(local1.stderr, /local\.toml: .*(Local|checkpoint)/)
    assert.equal(await chain.fetchAccount(coordinator), undefined, 'nothing was created')
    const long = await cli('create-run', '--keypair', me, '--run-id', 'x'.repeat(33), '--config-path', good)
    assert.equal(long.exitCode, 1)
    assert.match(long.stderr, /1 to 32 bytes/)
    // a half-made run (created, not configured): the same command again finishes it
    const half = await cli('create-run', '--keypair', me, '--run-id', 'nocli-run', '--json')
    assert.equal(half.exitCode, 0, half.stderr)
    const finished = await cli('create-run', '--keypair', me, '--run-id', 'nocli-run', '--config-path', good, '--name', 'No CLI', '--json')
    assert.equal(finished.exitCode, 0, finished.stderr)
    assert.equal(json(finished.stdout).configured, true)
    const run = await readRun({chain, programId, runId: 'nocli-run'})
    assert.equal(run.has_config, true)
    assert.deepEqual(await readMetadata({chain, programId, runId: 'nocli-run'}), {name: 'No CLI', description: ''})
    const resumed = await cli('set-paused', 'resume', '--keypair', me, '--run-id', 'nocli-run')
    assert.equal(resumed.exitCode, 0, resumed.stderr)
    // once configured (or resumed), the run exists: create-run says so and points at update-config
    const again = await cli('create-run', '--keypair', me, '--run-id', 'nocli-run', '--config-path', good)
    assert.equal(again.exitCode, 1)
    assert.match(again.stderr, /run nocli-run already exists .*WaitingForMembers.*psyche update-config/)
    // status --rpc shows the on-chain run
    const status = await cli('status', '--run-id', 'nocli-run', '--json')
    assert.equal(status.exitCode, 0, status.stderr)
    const st = json(status.stdout)
    assert.equal(st.run_state, 'WaitingForMembers')
    assert.equal(st.coordinator, coordinator)
    assert.equal(st.main_authority, (await loadKeypair(me)).address)
    assert.equal(st.name, 'No CLI')
    const text = await cli('status', '--run-id', 'nocli-run')
    assert.match(text.stdout, /run nocli-run on Solana \(No CLI\): coordinator /)
    assert.match(text.stdout, /run nocli-run: WaitingForMembers/)
    // --tokens: a mint, and 5000 of it in my associated token account; the treasury funded from there by default
    assert.match(env.PSYCHE_TOKEN_MINT!, /^[1-9A-HJ-NP-Za-km-z]{32,44}$/)
    const mine = await associatedTokenAddress((await loadKeypair(me)).address, env.PSYCHE_TOKEN_MINT as Address)
    assert.equal(tokenBalance(await chain.fetchAccount(mine)), 5000n)
    const funded = await cli('rewards', 'fund', '--keypair', me, '--run-id', 'nocli-run', '--mint', env.PSYCHE_TOKEN_MINT!, '--amount', '1200', '--json')
    assert.equal(funded.exitCode, 0, funded.stderr)
    assert.deepEqual([json(funded.stdout).created, json(funded.stdout).balance, json(funded.stdout).mint], [true, '1200', env.PSYCHE_TOKEN_MINT])
    assert.equal(tokenBalance(await chain.fetchAccount(mine)), 3800n)
    // no points yet: a claim (to my associated token account, by default) is refused whole
    const claim = await cli('rewards', 'claim', '--keypair', me, '--run-id', 'nocli-run')
    assert.equal(claim.exitCode, 1)
    assert.match(claim.stderr, /rewards claim nocli-run refused: NothingToClaim/)
  })
})
