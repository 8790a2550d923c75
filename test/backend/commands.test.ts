import type {EventLine} from '../../src/core/events.js'
import assert from 'node:assert/strict'
import {readFileSync, statSync, writeFileSync} from 'node:fs'
import {join} from 'node:path'
import {test} from 'node:test'
import type {ResultPromise} from 'execa'
import {CoordinatorConnection} from '../../src/core/backend/index.js'
import {buildWitnessProof} from '../../src/core/coordinator/index.js'
import type {CoordinatorState} from '../../src/core/coordinator/types.js'
import {generateIdentity, loadIdentity, saveIdentity} from '../../src/core/protocol/index.js'
import {runCli, startCli, tempDir} from '../helpers.js'
import {RUN_ID, aliveProof, waitUntil, writeRunConfig} from './helpers.js'

test('psyche identity new writes a 0600 identity and prints its id, refuses to overwrite without --force; show prints the id', async () => {
  const dir = tempDir()
  try {
    const path = join(dir.path, 'me.json')
    const made = await runCli(['identity', 'new', '--out', path])
    assert.equal(made.exitCode, 0, made.stderr)
    const id = made.stdout.trim()
    assert.equal((await loadIdentity(path)).id, id)
    assert.equal(statSync(path).mode & 0o777, 0o600)
    const again = await runCli(['identity', 'new', '--out', path])
    assert.equal(again.exitCode, 1)
    assert.match(again.stderr, /already exists.*--force/)
    assert.equal((await loadIdentity(path)).id, id, 'the identity was not replaced')
    const forced = await runCli(['identity', 'new', '--out', path, '--force', '--json'])
    assert.equal(forced.exitCode, 0)
    assert.notEqual(JSON.parse(forced.stdout).id, id)
    const shown = await runCli(['identity', 'show', '--identity', path])
    // the id, then the same key's base58 Solana address
    assert.deepEqual(shown.stdout.trim().split('\n'), [JSON.parse(forced.stdout).id, JSON.parse(forced.stdout).address])
    // The file is also the positional argument (as users type it), of show and of new.
    const positional = await runCli(['identity', 'show', path])
    assert.equal(positional.exitCode, 0, positional.stderr)
    assert.equal(positional.stdout.trim().split('\n')[0], JSON.parse(forced.stdout).id)
    const other = join(dir.path, 'other.json')
    const made2 = await runCli(['identity', 'new', other, '--json'])
    assert.equal(made2.exitCode, 0, made2.stderr)
    assert.equal((await loadIdentity(other)).id, JSON.parse(made2.stdout).id)
    const both = await runCli(['identity', 'show', path, '--identity', other])
    assert.equal(both.exitCode, 2, 'two different files: a usage error')
    assert.equal((await runCli(['identity', 'show'])).exitCode, 2, 'no file: a usage error')
    const missing = await runCli(['identity', 'show', '--identity', join(dir.path, 'nope.json')])
    assert.equal(missing.exitCode, 1)
    assert.match(missing.stderr, /nope\.json: no such file/)
  } finally {
    dir.cleanup()
  }
})

/** The server's --json log lines as they arrive. */
function jsonLines(child: ResultPromise): Record<string, unknown>[] {
  const lines: EventLine[] = []
  let buffered = ''
  child.stdout!.on('data', (chunk: Buffer) => {
    buffered += chunk.toString('utf8')
    const parts = buffered.split('\n')
    buffered = parts.pop()!
    for (const p of parts) if (p.trim()) lines.push(JSON.parse(p))
  })
  return lines
}

function nextState(c: CoordinatorConnection, pred: (s: CoordinatorState) => boolean, timeoutMs = 10_000): Promise<CoordinatorState> {
  return waitUntil(() => c.state && pred(c.state) && c.state, 'a coordinator state', timeoutMs)
}

// Every documented way to run a server that keeps its state (README: --save-state-dir; server run --help:
// --save-state-dir with --identity, the directory new), killed at step 2 and restarted: no step is lost.
const restartCombinations: {name: string; flags: (dir: string) => Promise<string[]>}[] = [
  {name: '--save-state-dir', flags: async (dir) => ['--save-state-dir', join(dir, 'saved')]},
  {
    name: '--identity FILE --save-state-dir NEWDIR --dashboard-port 0',
    flags: async (dir) => {
      await saveIdentity(generateIdentity(), join(dir, 'server.json'))
      return ['--identity', join(dir, 'server.json'), '--save-state-dir', join(dir, 'new', 'saved'), '--dashboard-port', '0']
    },
  },
]
for (const [i, combination] of restartCombinations.entries()) {
  test(`psyche server run ${combination.name}: killed (SIGKILL) at step 2 and restarted, it resumes at step 2 (no step lost) and the client reconnects${i === 0 ? '; SIGINT stops it cleanly' : ''}`, async () => {
    const dir = tempDir()
    const statePath = writeRunConfig(dir.path, {warmup_time: 30, max_round_train_time: 30})
    const flags = await combination.flags(dir.path)
    const saveDir = flags[flags.indexOf('--save-state-dir') + 1]
    const args = ['server', 'run', '--state', statePath, ...flags, '--tick-ms', '50', '--json']
    let client: CoordinatorConnection | undefined
    const children: ResultPromise[] = []
    try {
      const first = startCli(args)
      children.push(first)
      const firstLog = jsonLines(first)
      const listening = await waitUntil(() => firstLog[0], 'the listening line', 15_000)
      assert.equal(listening.event, 'listening', 'the first line says where the server listens')
      const port = Number(listening.port)
      assert.ok(port > 0)

      const alice = generateIdentity()
      client = await CoordinatorConnection.connect({addr: `127.0.0.1:${port}`, runId: RUN_ID, identity: alice, p2pAddrs: [], join: true, serverId: String(listening.server_id)})
      await nextState(client, (s) => s.run_state === 'Warmup')
      client.sendWarmupReady()
      const round1 = await nextState(client, (s) => s.run_state === 'RoundTrain')
      assert.ok(client.sendWitness(1, aliveProof(round1, [alice.id])))
      const round2 = await nextState(client, (s) => s.run_state === 'RoundTrain' && s.progress.step === 2)
      // Saved as it happened: the file on disk is at step 2 when the server is killed.
      await waitUntil(() => JSON.parse(JSON.parse(readFileSync(join(saveDir, 'coordinator-state.json'), 'utf8')).state).progress.step === 2, 'step 2 on disk')

      first.kill('SIGKILL')
      await first
      assert.deepEqual(
        firstLog.filter((l) => l.event === 'error'),
        [],
        'no save failed',
      )
      const reconnected = new Promise((r) => client!.once('reconnected', r))
      const second = startCli([...args, '--server-port', String(port)])
      children.push(second)
      const secondLog = jsonLines(second)
      await waitUntil(() => secondLog.find((l) => l.event === 'resumed'), 'the resumed line', 15_000)
      assert.equal(secondLog[0].event, 'listening')
      assert.equal(secondLog[0].server_id, listening.server_id, 'the same server identity, so the pinned client accepts it')
      const resumed = secondLog.find((l) => l.event === 'resumed')!
      assert.equal(resumed.run_state, 'RoundTrain')
      assert.equal(resumed.step, 2, 'no step lost')
      await reconnected
      assert.ok(client.sendWitness(2, aliveProof(round2, [alice.id])))
      await nextState(client, (s) => s.run_state === 'RoundTrain' && s.progress.step === 3)

      // The saved file follows the run.
      await waitUntil(() => JSON.parse(JSON.parse(readFileSync(join(saveDir, 'coordinator-state.json'), 'utf8')).state).progress.step === 3, 'step 3 on disk')

      await client.close()
      client = undefined
      if (i > 0) return
      second.kill('SIGINT')
      const result = await second
      assert.equal(result.exitCode, 0, String(result.stderr))
      await waitUntil(() => secondLog.find((l) => l.event === 'stopped'), 'the stopped line', 1000)
    } finally {
      await client?.close()
      for (const c of children) c.kill('SIGKILL')
      dir.cleanup()
    }
  })
}

test("psyche server run --data-config also serves the run's tokens on data_location.Server; a data.toml that does not fit the run is refused", async () => {
  const dir = tempDir()
  try {
    const {createServer} = await import('node:net')
    const probe = createServer()
    const dataPort = await new Promise<number>((r) => probe.listen(0, '127.0.0.1', () => r((probe.address() as {port: number}).port)))
    await new Promise((r) => probe.close(r))
    const statePath = writeRunConfig(dir.path)
    writeFileSync(statePath, readFileSync(statePath, 'utf8').replace(/^data_location = .*$/m, `data_location = { Server = "127.0.0.1:${dataPort}" }`))
    const ids = new Uint16Array(129 * 4).map((_, i) => (i * 7) % 1000)
    writeFileSync(join(dir.path, 'tokens.ds'), Buffer.from(ids.buffer))
    const dataToml = join(dir.path, 'data.toml')
    writeFileSync(dataToml, `dir = "."\ntoken_size = "TwoBytes"\nseq_len = 128\nshuffle_seed = [${Array(32).fill(0).join(', ')}]\n`)

    const server = startCli(['server', 'run', '--state', statePath, '--data-config', dataToml, '--json'])
    try {
      const log = jsonLines(server)
      const data = await waitUntil(() => log.find((l) => l.event === 'data_server_listening'), 'the data server', 15_000)
      assert.equal(log[0].event, 'listening')
      assert.equal(data.port, dataPort)
      assert.equal(data.samples, 4)
      // The same samples as reading the directory directly with the data.toml's shuffle.
      const {LocalTokenDataset, TcpDataProvider, parseShuffle} = await import('../../src/core/data/index.js')
      const provider = await TcpDataProvider.connect(`127.0.0.1:${dataPort}`, {seqLen: 128})
      const dataset = await LocalTokenDataset.open(dir.path)
      const local = dataset.provider({seqLen: 128, shuffleSeed: parseShuffle(Array(32).fill(0), 'seed')})
      assert.deepEqual(await provider.getSamples([0, 3]), await local.getSamples([0, 3]))
      await provider.close()
      await dataset.close()
    } finally {
      server.kill('SIGINT')
    }
    assert.equal((await server).exitCode, 0)

    writeFileSync(dataToml, `dir = "."\ntoken_size = "TwoBytes"\nseq_len = 64\nshuffle_seed = [${Array(32).fill(0).join(', ')}]\n`)
    const bad = await runCli(['server', 'run', '--state', statePath, '--data-config', dataToml])
    assert.equal(bad.exitCode, 1)
    assert.match(bad.stderr, /data\.toml: seq_len.*must equal/)
  } finally {
    dir.cleanup()
  }
})
