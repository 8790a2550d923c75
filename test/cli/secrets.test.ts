import assert from 'node:assert/strict'
import {createServer, type Server} from 'node:http'
import type {AddressInfo} from 'node:net'
import {after, before, describe, test} from 'node:test'
import {execa} from 'execa'
import {knownSecrets, redactSecrets} from '../../src/core/cli/redact.js'
import {cliPath, tempDir} from '../helpers.js'
import {projectRoot} from '../../src/core/worker/python.js'

// Not shaped like an hf_ token on purpose for one of them: redaction must come from knowing the secret, not only its shape.
const TOKEN = 'hf_TopSecretToken0123456789abcdef'
const OTHER = 'plainsecretvalue-42'

async function cli(args: string[], env: Record<string, string> = {}) {
  const r = await execa(process.execPath, [cliPath, ...args], {
    cwd: projectRoot,
    env: {NO_COLOR: '1', CI: '1', HF_TOKEN: TOKEN, HUGGING_FACE_HUB_TOKEN: OTHER, ...env},
    reject: false,
    timeout: 120_000,
    stdin: 'ignore',
  })
  return {exitCode: r.exitCode ?? -1, stdout: String(r.stdout), stderr: String(r.stderr)}
}

function assertNoSecret(what: string, r: {stdout: string; stderr: string}) {
  for (const secret of [TOKEN, OTHER, TOKEN.slice(3)]) {
    assert.ok(!r.stdout.includes(secret), `${what}: stdout holds a secret:\n${r.stdout.slice(0, 2000)}`)
    assert.ok(!r.stderr.includes(secret), `${what}: stderr holds a secret:\n${r.stderr.slice(0, 2000)}`)
  }
}

describe('no output carries a secret', () => {
  let hostileHub: Server
  let hubUrl = ''
  const seenAuth: string[] = []
  const out = tempDir('psyche-secrets-')

  before(async () => {
    // A Hub that echoes the Authorization header it was sent back in its error message (and body).
    hostileHub = createServer((req, res) => {
      const auth = String(req.headers.authorization ?? '')
      seenAuth.push(auth)
      res.writeHead(401, {'content-type': 'application/json', 'x-error-message': `bad credentials ${auth}`})
      res.end(JSON.stringify({error: `bad credentials ${auth}`}))
    })
    await new Promise<void>((resolve) => hostileHub.listen(0, '127.0.0.1', resolve))
    hubUrl = `http://127.0.0.1:${(hostileHub.address() as AddressInfo).port}`
  })
  after(async () => {
    await new Promise<void>((resolve) => hostileHub.close(() => resolve()))
    out.cleanup()
  })

  test('a usage error under --json is one small JSON error object (no configuration, no environment) and exits 2', async () => {
    const [join, train] = await Promise.all([cli(['join', '--json', '--no-such-flag']), cli(['train', '--json', '--bogus', TOKEN])])
    assert.equal(join.exitCode, 2, join.stdout + join.stderr)
    assertNoSecret('join --json --no-such-flag', join)
    // join's --json stdout is a stream of one-line events: the error is one line.
    const lines = join.stdout.trim().split('\n')
    assert.equal(lines.length, 1, join.stdout)
    const event = JSON.parse(lines[0])
    assert.deepEqual(Object.keys(event).sort(), ['code', 'event', 'message'])
    assert.equal(event.event, 'error')
    assert.equal(event.code, 'EUSAGE')
    assert.match(event.message, /no-such-flag/)
    assert.ok(join.stdout.length < 1024, `${join.stdout.length} bytes`)

    assert.equal(train.exitCode, 2, train.stdout + train.stderr)
    assertNoSecret('train --json --bogus TOKEN', train)
    const object = JSON.parse(train.stdout)
    assert.deepEqual(Object.keys(object), ['error'])
    assert.deepEqual(Object.keys(object.error).sort(), ['code', 'message'])
    assert.equal(object.error.code, 'EUSAGE')
    assert.ok(train.stdout.length < 1024, `${train.stdout.length} bytes`)
  })

  test('failing commands with HF_TOKEN set print no token, with or without --json', async () => {
    const runs: [string, string[]][] = [
      ['join (no --json) --no-such-flag', ['join', '--no-such-flag']],
      ['join --json, an unexpected argument that is the token', ['join', '--json', '--run-id', 'x', '--server-addr', '127.0.0.1:1', TOKEN]],
      ['server run --json with a missing config', ['server', 'run', '--json', '--config', `/nonexistent/${OTHER}/state.toml`]],
      ['checkpoint upload --token TOKEN of a missing directory', ['checkpoint', 'upload', '--json', '--token', TOKEN, '--repo', 'a/b', '--dir', '/nonexistent-dir']],
      ['checkpoint download from a Hub that echoes the token', ['checkpoint', 'download', '--json', '--hub-url', hubUrl, '--repo', 'org/model', '--out', out.path]],
      ['checkpoint download (no --json) from a Hub that echoes the token', ['checkpoint', 'download', '--hub-url', hubUrl, '--repo', 'org/model', '--out', out.path]],
    ]
    // Two CLI processes at a time (a 2-core machine).
    const results: {exitCode: number; stdout: string; stderr: string}[] = []
    for (let i = 0; i < runs.length; i += 2) results.push(...(await Promise.all(runs.slice(i, i + 2).map(([, args]) => cli(args)))))
    runs.forEach(([what], i) => {
      const r = results[i]
      assert.notEqual(r.exitCode, 0, `${what} should fail`)
      assertNoSecret(what, r)
      if (runs[i][1].includes('--json') && what !== 'join --json, an unexpected argument that is the token') {
        const parsed = JSON.parse(r.stdout)
        // a command that streams events (server run) ends with one more event line; others print {error}
        if (parsed.event === 'error') assert.equal(typeof parsed.message, 'string', `${what}: ${r.stdout}`)
        else assert.deepEqual(Object.keys(parsed), ['error'], `${what}: ${r.stdout}`)
      }
    })
    // The hostile Hub did get the token (so the download really sent it, and the redaction is what kept it out).
    assert.ok(
      seenAuth.some((a) => a.includes(TOKEN)),
      `the Hub saw: ${seenAuth.join(', ')}`,
    )
    const echoed = results[4]
    assert.match(echoed.stdout, /\[redacted\]/, 'the echoed token is shown as [redacted]')
  })

  test('redactSecrets: known secrets from the environment and secret flags, and anything shaped like a token', () => {
    const secrets = knownSecrets({HF_TOKEN: 'abcdEFGH1234'}, ['node', 'psyche', '--hub-token', 'xyz-secret-1', '--token=other-secret-2'])
    assert.deepEqual(new Set(secrets), new Set(['abcdEFGH1234', 'xyz-secret-1', 'other-secret-2']))
    const text = 'a abcdEFGH1234 b xyz-secret-1 c other-secret-2 d hf_ZZZZZZZZZZZZ e Authorization: Bearer q1w2e3r4t5y6 f'
    assert.equal(redactSecrets(text, secrets), 'a [redacted] b [redacted] c [redacted] d [redacted] e Authorization: Bearer [redacted] f')
    assert.equal(redactSecrets('nothing secret here: hf_ab', []), 'nothing secret here: hf_ab')
  })
})
