import assert from 'node:assert/strict'
import {createHash} from 'node:crypto'
import {existsSync, mkdirSync, readFileSync, readdirSync, statSync, writeFileSync} from 'node:fs'
import {createServer, type IncomingMessage, type Server, type ServerResponse} from 'node:http'
import type {AddressInfo} from 'node:net'
import {join} from 'node:path'
import {after, before, describe, it} from 'node:test'
import {HUB_LIMITS, checkRevision, downloadCheckpoint} from '../../src/core/checkpoint/hub.js'
import {PsycheError} from '../../src/core/errors.js'
import {resolveTrainPlan, templateStatePath} from '../../src/core/train/plan.js'
import {runCli, tempDir} from '../helpers.js'

const TOKEN = 'hf_hostile_test'
const COMMIT = 'c'.repeat(40)

const gitOid = (b: Buffer) => createHash('sha1').update(`blob ${b.length}\0`).update(b).digest('hex')
const sha256 = (b: Buffer) => createHash('sha256').update(b).digest('hex')

interface Seen {
  method: string
  url: string
  auth?: string
}

/** An HTTP server on 127.0.0.1 that answers as the test says: a Hub that lies. */
class Fake {
  server!: Server
  seen: Seen[] = []
  handler: (req: IncomingMessage, res: ServerResponse, url: URL) => void = (_q, res) => res.writeHead(404).end()
  async start(): Promise<this> {
    this.server = createServer((req, res) => {
      this.seen.push({method: req.method ?? '', url: req.url ?? '', auth: req.headers.authorization})
      const url = new URL(req.url ?? '/', 'http://x')
      try {
        this.handler(req, res, url)
      } catch {
        res.destroy()
      }
    })
    await new Promise<void>((r) => this.server.listen(0, '127.0.0.1', r))
    return this
  }
  get url(): string {
    return `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`
  }
  async close(): Promise<void> {
    this.server.closeAllConnections()
    await new Promise<void>((r) => this.server.close(() => r()))
  }
}

function json(res: ServerResponse, body: unknown, headers: Record<string, string> = {}): void {
  const text = JSON.stringify(body)
  res.writeHead(200, {'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(text), ...headers}).end(text)
}

/** A Hub that serves one commit with these files; `tree` and `resolve` can be replaced. */
function honest(files: Record<string, Buffer>, overrides: {tree?: (url: URL, res: ServerResponse) => void; resolve?: (path: string, res: ServerResponse) => void} = {}) {
  return (_req: IncomingMessage, res: ServerResponse, url: URL) => {
    if (/^\/api\/models\/[^/]+\/[^/]+\/revision\//.test(url.pathname)) return json(res, {sha: COMMIT})
    if (url.pathname.startsWith(`/api/models/`) && url.pathname.includes('/tree/')) {
      if (overrides.tree) return overrides.tree(url, res)
      return json(
        res,
        Object.entries(files).map(([path, b]) => ({type: 'file', path, size: b.length, oid: gitOid(b)})),
      )
    }
    const m = /^\/[^/]+\/[^/]+\/resolve\/[0-9a-f]{40}\/(.*)$/.exec(url.pathname)
    if (m) {
      const path = m[1]!.split('/').map(decodeURIComponent).join('/')
      if (overrides.resolve) return overrides.resolve(path, res)
      const b = files[path]
      if (!b) return res.writeHead(404).end()
      return res.writeHead(200, {'Content-Length': b.length}).end(b)
    }
    res.writeHead(404).end()
  }
}

/** Everything under `dir`, recursively, as relative paths. */
function tree(dir: string): string[] {
  if (!existsSync(dir)) return []
  return readdirSync(dir, {recursive: true, encoding: 'utf8'}).sort()
}

async function rejectsWith(promise: Promise<unknown>, exitCode: number, pattern: RegExp): Promise<PsycheError> {
  let caught: unknown
  try {
    await promise
  } catch (error) {
    caught = error
  }
  assert.ok(caught instanceof PsycheError, `expected a PsycheError, got ${String((caught as Error)?.stack ?? caught)}`)
  assert.equal(caught.exitCode, exitCode, caught.message)
  assert.match(caught.message, pattern)
  assert.ok(!caught.message.includes('\n'), `one line: ${JSON.stringify(caught.message)}`)
  return caught
}

describe('the Hub client trusts nothing from the Hub', () => {
  const tmp = tempDir('psyche-hostile-hub-')
  const hub = new Fake()
  const other = new Fake()
  let n = 0
  const sandbox = () => {
    const dir = join(tmp.path, `s${n++}`)
    mkdirSync(dir)
    return {dir, cacheDir: join(dir, 'cache'), out: join(dir, 'out')}
  }

  before(async () => {
    await hub.start()
    await other.start()
  })
  after(async () => {
    await hub.close()
    await other.close()
    tmp.cleanup()
  })

  it('accepts git branch, tag and commit names and refuses any revision that could leave the cache (before asking the Hub)', async () => {
    for (const ok of ['main', 'run-2', 'refs/pr/1', 'v1.0', 'feature/x_y', COMMIT]) assert.equal(checkRevision(ok), ok)
    for (const bad of [
      '../../escape',
      '..',
      'a/../b',
      '/abs',
      'a//b',
      'x/',
      '.hidden',
      'a/.b',
      'x.lock',
      'a b',
      'a\0b',
      'a\nb',
      'x~1',
      'a:b',
      'end.',
      '@',
      'a@{1}',
      '',
      'x'.repeat(256),
    ]) {
      assert.throws(() => checkRevision(bad), /not a git branch, tag or commit id/, JSON.stringify(bad))
    }
    // a Hub that answers every revision with a commit: the old client wrote refs/../../escape outside the cache
    hub.handler = honest({'config.json': Buffer.from('{}')})
    hub.seen = []
    const s = sandbox()
    await rejectsWith(downloadCheckpoint({repo: 'org/m', revision: '../../../escape', cacheDir: s.cacheDir, hubUrl: hub.url}), 1, /--revision "..\/..\/..\/escape": not a git/)
    assert.equal(hub.seen.length, 0, 'the Hub was never asked')
    assert.deepEqual(tree(s.dir), [])
    assert.ok(!existsSync(join(tmp.path, 'escape')))
  })

  it('a run config whose Hub checkpoint names a revision that is no git ref is refused, naming the field, before the Hub is asked', async () => {
    const state = readFileSync(templateStatePath('tiny-demo'), 'utf8').replace(
      '[model.LLM.checkpoint.Local]\npath = "model"',
      '[model.LLM.checkpoint.Hub]\nrepo_id = "org/m"\nrevision = "../../../escape"',
    )
    assert.match(state, /checkpoint\.Hub/)
    const s = sandbox()
    writeFileSync(join(s.dir, 'state.toml'), state)
    hub.seen = []
    await rejectsWith(
      resolveTrainPlan({config: join(s.dir, 'state.toml'), hub: {url: hub.url, cacheDir: s.cacheDir}}),
      1,
      /model\.LLM\.checkpoint\.Hub\.revision "\.\.\/\.\.\/\.\.\/escape": not a git branch, tag or commit id/,
    )
    assert.equal(hub.seen.length, 0)
    assert.deepEqual(tree(s.dir), ['state.toml'])
  })

  it('stops a file at the size its listing declares (a Hub that streams without end fills no disk)', async () => {
    const small = Buffer.from('0123456789abcdef')
    const huge = Buffer.alloc(1 << 20, 7)
    for (const withLength of [false, true]) {
      let sent = 0
      hub.handler = honest(
        {'model.safetensors': small},
        {
          resolve: (_p, res) => {
            res.writeHead(200, withLength ? {'Content-Length': 64 * huge.length} : {})
            const pump = () => {
              while (sent < 64 * huge.length) {
                sent += huge.length
                if (!res.write(huge)) return void res.once('drain', pump)
              }
              res.end()
            }
            res.on('error', () => undefined)
            pump()
          },
        },
      )
      const s = sandbox()
      let most = 0
      await rejectsWith(
        downloadCheckpoint({repo: 'org/m', cacheDir: s.cacheDir, out: s.out, hubUrl: hub.url, onProgress: (p) => (most = Math.max(most, p.done))}),
        4,
        withLength ? /sends 67108864 bytes, its listing declares 16/ : /sent more than the 16 bytes its listing declares/,
      )
      assert.ok(most <= small.length, `progress reached ${most} bytes of a 16-byte file`)
      const blobs = join(s.cacheDir, 'models--org--m', 'blobs')
      for (const f of tree(blobs)) assert.ok(statSync(join(blobs, f)).size <= small.length, `${f} is bigger than declared`)
      assert.ok(!existsSync(s.out))
    }
  })

  it('bounds the pages of a listing: a Link loop, an endless listing and a Link to another origin are refused; the token never leaves the Hub', async () => {
    const f = Buffer.from('x')
    const entry = {type: 'file', path: 'a.txt', size: 1, oid: gitOid(f)}
    // the same page again
    hub.handler = honest({'a.txt': f}, {tree: (url, res) => json(res, [], {Link: `<${hub.url}${url.pathname}${url.search}>; rel="next"`})})
    await rejectsWith(downloadCheckpoint({repo: 'org/m', cacheDir: sandbox().cacheDir, hubUrl: hub.url}), 3, /the pages loop/)
    // a new page every time
    const pages = HUB_LIMITS.pages
    HUB_LIMITS.pages = 30
    try {
      hub.seen = []
      hub.handler = honest(
        {'a.txt': f},
        {tree: (url, res) => json(res, [], {Link: `<${hub.url}${url.pathname}?cursor=${Number(url.searchParams.get('cursor') ?? 0) + 1}>; rel="next"`})},
      )
      await rejectsWith(downloadCheckpoint({repo: 'org/m', cacheDir: sandbox().cacheDir, hubUrl: hub.url}), 3, /more than 30 pages/)
      assert.equal(hub.seen.filter((r) => r.url.includes('/tree/')).length, 30)
    } finally {
      HUB_LIMITS.pages = pages
    }
    // the next page on another host: not fetched at all, so the token cannot go there
    other.seen = []
    other.handler = (_q, res) => json(res, [entry])
    hub.handler = honest({'a.txt': f}, {tree: (_u, res) => json(res, [], {Link: `<${other.url}/steal?page=2>; rel="next"`})})
    await rejectsWith(downloadCheckpoint({repo: 'org/m', cacheDir: sandbox().cacheDir, hubUrl: hub.url, token: TOKEN}), 3, /another origin/)
    assert.equal(other.seen.length, 0)
    // the model info redirected to another host: refused as well
    hub.handler = (_q, res) => res.writeHead(302, {Location: `${other.url}/api/models/org/m/revision/main`}).end()
    await rejectsWith(downloadCheckpoint({repo: 'org/m', cacheDir: sandbox().cacheDir, hubUrl: hub.url, token: TOKEN}), 3, /another origin/)
    assert.equal(other.seen.length, 0)
  })

  it('follows a file redirect to a CDN without the token (as the Hub does for LFS files), and sends the token to the Hub itself', async () => {
    const weights = Buffer.from('weights '.repeat(100))
    other.seen = []
    other.handler = (_q, res) => res.writeHead(200, {'Content-Length': weights.length}).end(weights)
    hub.seen = []
    hub.handler = honest(
      {'model.safetensors': weights},
      {
        tree: (_u, res) => json(res, [{type: 'file', path: 'model.safetensors', size: weights.length, oid: 'f'.repeat(40), lfs: {oid: sha256(weights), size: weights.length}}]),
        resolve: (_p, res) => res.writeHead(302, {Location: `${other.url}/cdn/${sha256(weights)}?signature=abc`}).end(),
      },
    )
    const s = sandbox()
    const got = await downloadCheckpoint({repo: 'org/m', cacheDir: s.cacheDir, out: s.out, hubUrl: hub.url, token: TOKEN})
    assert.equal(got.commit, COMMIT)
    assert.deepEqual(readFileSync(join(s.out, 'model.safetensors')), weights)
    assert.equal(other.seen.length, 1)
    assert.equal(other.seen[0]!.auth, undefined, 'the CDN got no token')
    assert.ok(hub.seen.length >= 3 && hub.seen.every((r) => r.auth === `Bearer ${TOKEN}`), 'the Hub got the token')
  })

  it('refuses reserved and odd names with one line and exit 4, and never writes through a hard link into the cache', async () => {
    const ok = Buffer.from('{"model_type": "llama"}')
    const cases: [string, Record<string, unknown>[], RegExp][] = [
      ['.hub-revision.json listed by the Hub', [{path: '.hub-revision.json'}], /\.hub-revision\.json.*reserves/],
      ['NUL in a name', [{path: 'a\0b'}], /NUL/],
      ['a control character', [{path: 'a\nb'}], /control character/],
      ['a name of 256 bytes', [{path: 'x'.repeat(256)}], /longer than 255 bytes/],
      ['a directory of 256 bytes', [{path: `${'é'.repeat(128)}/f`}], /longer than 255 bytes/],
      ['a file that is also a directory', [{path: 'a'}, {path: 'a/b'}], /"a" is both a file and a directory/],
      ['a directory that is also a file', [{path: 'a/b'}, {path: 'a'}], /"a" is both a file and a directory/],
      ['a name listed twice', [{path: 'b'}, {path: 'b'}], /twice/],
      ['a parent component', [{path: '../b'}], /"\.\." component/],
      ['an absolute path', [{path: '/etc/x'}], /absolute/],
      ['a negative size', [{path: 'b', size: -1}], /invalid size/],
      ['an LFS size that differs', [{path: 'b', lfs: {oid: 'a'.repeat(64), size: 99}}], /invalid LFS/],
      ['a hash that is not one', [{path: 'b', oid: '../../x'}], /invalid hash/],
    ]
    for (const [what, listed, pattern] of cases) {
      hub.handler = honest(
        {'config.json': ok},
        {
          tree: (_u, res) =>
            json(res, [{type: 'file', path: 'config.json', size: ok.length, oid: gitOid(ok)}, ...listed.map((e) => ({type: 'file', size: ok.length, oid: gitOid(ok), ...e}))]),
        },
      )
      const s = sandbox()
      await rejectsWith(downloadCheckpoint({repo: 'org/m', cacheDir: s.cacheDir, out: s.out, hubUrl: hub.url}), 4, pattern).catch((e: Error) => {
        throw new Error(`${what}: ${e.message}`)
      })
      assert.deepEqual(tree(s.dir), [], `${what}: nothing written`)
    }
    // the same repository without the reserved name: the cached blob keeps its bytes after the copy is placed
    hub.handler = honest({'config.json': ok})
    const s = sandbox()
    await downloadCheckpoint({repo: 'org/m', cacheDir: s.cacheDir, out: s.out, hubUrl: hub.url})
    assert.deepEqual(readFileSync(join(s.cacheDir, 'models--org--m', 'blobs', gitOid(ok))), ok)
    assert.equal(JSON.parse(readFileSync(join(s.out, '.hub-revision.json'), 'utf8')).commit, COMMIT)
    assert.equal(statSync(join(s.out, '.hub-revision.json')).nlink, 1, 'psyche wrote its own file, not into a link')
  })

  it('the CLI prints one line and exits 4 for a name it refuses', async () => {
    hub.handler = honest({}, {tree: (_u, res) => json(res, [{type: 'file', path: `${'y'.repeat(300)}`, size: 1, oid: 'a'.repeat(40)}])})
    const s = sandbox()
    const r = await runCli(['checkpoint', 'download', '--repo', 'org/m', '--out', s.out, '--cache-dir', s.cacheDir, '--hub-url', hub.url])
    assert.equal(r.exitCode, 4, r.stderr)
    const lines = r.stderr
      .trim()
      .split('\n')
      .filter((l) => /longer than 255 bytes/.test(l))
    assert.equal(lines.length, 1, r.stderr)
    assert.ok(!/at .*\.ts:\d+/.test(r.stderr), `no stack trace: ${r.stderr}`)
  })

  it('fuzz: 300 mangled answers from the Hub give a result or a one-line error with exit 3 or 4, and write nothing outside the cache and --out', async () => {
    let seed = 20_2026
    const rand = () => {
      seed = (seed * 1103515245 + 12345) & 0x7fffffff
      return seed / 0x7fffffff
    }
    const pick = <T>(xs: T[]): T => xs[Math.floor(rand() * xs.length)]!
    const files: Record<string, Buffer> = {'config.json': Buffer.from('{"a": 1}'), 'model.safetensors': Buffer.alloc(300, 1), 'sub/t.json': Buffer.from('[]')}
    const junk = (): unknown =>
      pick<() => unknown>([
        () => null,
        () => 42,
        () => 'x'.repeat(Math.floor(rand() * 50)),
        () => [],
        () => ({}),
        () => pick(['', '..', '/x', 'a\0', 'é'.repeat(200), '.hub-revision.json', 'config.json', 'sub', 'sub/t.json/z']),
        () => -1,
        () => 2 ** 60,
        () => 'f'.repeat(40),
        () => 'a'.repeat(64),
      ])()
    const mutate = (entry: Record<string, unknown>): Record<string, unknown> => {
      const out = {...entry}
      const key = pick(['type', 'path', 'size', 'oid', 'lfs', 'extra'])
      out[key] = key === 'lfs' && rand() < 0.5 ? {oid: junk(), size: junk()} : junk()
      return out
    }
    let results = 0
    let refusals = 0
    for (let i = 0; i < 300; i++) {
      const listing: Record<string, unknown>[] = Object.entries(files).map(([path, b]) => ({type: 'file', path, size: b.length, oid: gitOid(b)}))
      const plan = {
        info: rand() < 0.15 ? pick<unknown>([{sha: junk()}, junk(), {sha: COMMIT.slice(1)}]) : {sha: COMMIT},
        infoStatus: rand() < 0.05 ? pick([500, 404, 401, 302]) : 200,
        listing: rand() < 0.5 ? listing.map((e) => (rand() < 0.3 ? mutate(e) : e)) : rand() < 0.1 ? junk() : listing,
        link:
          rand() < 0.15
            ? pick([
                `<${other.url}/x>; rel="next"`,
                '<not a url>; rel="next"',
                `<${hub.url}/api/models/org/m/tree/${COMMIT}?recursive=true&expand=false>; rel="next"`,
                'garbage',
                `<javascript:1>; rel="next"`,
              ])
            : undefined,
        body: rand() < 0.2 ? pick(['truncate', 'extend', 'flip', 'status', 'range']) : 'ok',
        rawBody: rand() < 0.05,
      }
      hub.handler = (req, res, url) => {
        if (url.pathname.includes('/revision/')) {
          if (plan.infoStatus === 302) return res.writeHead(302, {Location: pick([`${other.url}/x`, 'ftp://x/y', '/api/models/org/m/revision/main'])}).end()
          if (plan.infoStatus !== 200) return res.writeHead(plan.infoStatus, {'X-Error-Message': 'no\r\n\u0000 way'}).end('{"error": "nope"}')
          if (plan.rawBody) return res.writeHead(200, {'Content-Type': 'application/json'}).end('{"sha": "' + COMMIT + '"')
          return json(res, plan.info)
        }
        if (url.pathname.includes('/tree/')) return json(res, plan.listing, plan.link ? {Link: plan.link} : {})
        const m = /\/resolve\/[0-9a-f]{40}\/(.*)$/.exec(url.pathname)
        const b = m ? files[m[1]!.split('/').map(decodeURIComponent).join('/')] : undefined
        if (!b) return res.writeHead(404).end()
        if (plan.body === 'truncate') return res.writeHead(200).end(b.subarray(0, b.length - 1))
        if (plan.body === 'extend') return res.writeHead(200).end(Buffer.concat([b, Buffer.from('more')]))
        if (plan.body === 'flip') return res.writeHead(200).end(Buffer.from(b).fill(9, 0, 1))
        if (plan.body === 'status') return res.writeHead(pick([403, 500, 416, 204])).end()
        if (plan.body === 'range' && req.headers.range === undefined) return res.writeHead(206, {'Content-Range': 'bytes 5-9/10'}).end(b)
        res.writeHead(200, {'Content-Length': b.length}).end(b)
      }
      const s = sandbox()
      try {
        const got = await downloadCheckpoint({repo: 'org/m', cacheDir: s.cacheDir, out: s.out, hubUrl: hub.url, token: TOKEN})
        results++
        for (const f of got.files) assert.deepEqual(readFileSync(join(s.out, f.path)), files[f.path], `run ${i}: ${f.path} has the listed bytes`)
      } catch (error) {
        assert.ok(error instanceof PsycheError, `run ${i}: ${(error as Error)?.stack ?? String(error)}`)
        assert.ok([3, 4].includes(error.exitCode), `run ${i}: exit ${error.exitCode}: ${error.message}`)
        assert.ok(!error.message.includes('\n') && !error.message.includes('\0'), `run ${i}: one printable line: ${JSON.stringify(error.message)}`)
        refusals++
      }
      for (const f of tree(s.dir)) assert.ok(/^(cache|out)(\/|$)/.test(f), `run ${i}: ${f} is outside the cache and --out`)
    }
    assert.deepEqual(
      readdirSync(tmp.path).filter((f) => !/^s\d+$/.test(f)),
      [],
      'nothing beside the sandboxes',
    )
    assert.ok(results > 30 && refusals > 30, `both outcomes exercised: ${results} results, ${refusals} refusals`)
  })
})
