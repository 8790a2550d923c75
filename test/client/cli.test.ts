import assert from 'node:assert/strict'
import {after, before, describe, it} from 'node:test'
import {descendants, processAlive, runCli, startCli, tempDir, waitFor} from '../helpers.js'
import {startServer, writeE2eRun, type JsonProcess} from '../e2e/helpers.js'

describe('psyche join / testnet: bad input is one clear line and a non-zero exit', {timeout: 120_000}, () => {
  const dir = tempDir('psyche-client-cli-')
  let server: JsonProcess | undefined
  let port = 0
  let state = ''
  before(async () => {
    state = writeE2eRun(dir.path)
    ;({server, port} = await startServer(state))
  })
  after(async () => {
    await server?.stop()
    dir.cleanup()
  })

  it('join with another run id is refused by the server, naming the server and both runs', async () => {
    const r = await runCli(['join', '--server-addr', `127.0.0.1:${port}`, '--run-id', 'other-run', '--config', state, '--threads', '1'])
    assert.equal(r.exitCode, 1)
    assert.match(r.stderr, new RegExp(`Error: coordinator 127\\.0\\.0\\.1:${port}: refused: this server coordinates run "e2e", not "other-run"`))
    assert.doesNotMatch(r.stderr, /at .*\.ts:\d+/) // no stack trace
  })

  it('join --json reports the refusal as one JSON line, like its other events', async () => {
    const r = await runCli(['join', '--server-addr', `127.0.0.1:${port}`, '--run-id', 'other-run', '--config', state, '--threads', '1', '--json'])
    assert.equal(r.exitCode, 1)
    const lines = r.stdout
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l))
    assert.deepEqual(lines.at(-1), {event: 'error', code: 'EWRONGRUN', message: `coordinator 127.0.0.1:${port}: refused: this server coordinates run "e2e", not "other-run"`})
  })

  it('join with a malformed server address names it', async () => {
    const r = await runCli(['join', '--server-addr', 'no-port-here', '--run-id', 'e2e', '--config', state, '--threads', '1'])
    assert.equal(r.exitCode, 1)
    assert.match(r.stderr, /Error: coordinator address: "no-port-here": expected "host:port"/)
  })

  it('testnet with a missing run directory names it before starting anything', async () => {
    const r = await runCli(['testnet', '--clients', '2', '--config', `${dir.path}/nope`])
    assert.equal(r.exitCode, 1)
    assert.equal(r.stderr.trim(), `Error: --config ${dir.path}/nope: no such file or directory`)
  })

  it('testnet stops every process and still prints its summary when interrupted (SIGTERM)', async () => {
    const child = startCli(['testnet', '--clients', '2', '--config', dir.path, '--json'])
    // Interrupted once everything runs: the coordinator, both clients and their PyTorch workers.
    let tree: {pid: number; cmd: string}[] = []
    const workers = () => tree.filter((p) => p.cmd.includes('psyche_worker'))
    await waitFor(
      () => {
        tree = descendants(child.pid!)
        return workers().length === 2 && tree.some((p) => / server run /.test(p.cmd)) && tree.filter((p) => / join /.test(p.cmd)).length === 2
      },
      60_000,
      'the testnet to start its server, two clients and their workers',
    )
    child.kill('SIGTERM')
    const r = await child
    assert.equal(r.exitCode, 143, `the exit status reports SIGTERM (128 + 15); stderr: ${r.stderr}`)
    const summary = JSON.parse(String(r.stdout))
    assert.equal(summary.ended, 'interrupted')
    assert.deepEqual(summary.clients, ['client-0', 'client-1'])
    // every process it started is gone by the time it exits
    const left = tree.filter((p) => processAlive(p.pid))
    assert.deepEqual(left, [], 'processes left behind')
  })
})
