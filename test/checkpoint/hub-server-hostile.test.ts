import assert from 'node:assert/strict'
import {createHash} from 'node:crypto'
import {existsSync, readdirSync} from 'node:fs'
import {request} from 'node:http'
import {connect} from 'node:net'
import {join} from 'node:path'
import {after, before, describe, it} from 'node:test'
import {createRepo, uploadFiles} from '@huggingface/hub'
import {parseTokenFlag} from '../../src/commands/hub/serve.js'
import {HubServer} from '../../src/core/checkpoint/hub-server.js'
import {tempDir, waitFor} from '../helpers.js'

const ALICE = 'hf_alice_token'
const BOB = 'hf_bob_token'
const sha256 = (b: Buffer) => createHash('sha256').update(b).digest('hex')
const auth = (token: string) => ({Authorization: `Bearer ${token}`})

/** A request with the raw path as given (fetch would normalize `..` and bad escapes away). */
function raw(base: string, method: string, path: string, headers: Record<string, string> = {}, body?: Buffer | string): Promise<{status: number; body: string}> {
  const {hostname, port} = new URL(base)
  return new Promise((resolve, reject) => {
    const req = request({host: hostname, port, method, path, headers}, (res) => {
      const chunks: Buffer[] = []
      res.on('data', (c: Buffer) => chunks.push(c))
      res.on('end', () => resolve({status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString('utf8')}))
      res.on('error', reject)
    })
    req.on('error', reject)
    req.end(body)
  })
}

async function batch(hub: HubServer, repo: string, token: string | undefined, objects: unknown[], operation = 'upload') {
  const res = await fetch(`${hub.url}/${repo}.git/info/lfs/objects/batch`, {
    method: 'POST',
    headers: {...(token ? auth(token) : {}), 'Content-Type': 'application/vnd.git-lfs+json'},
    body: JSON.stringify({operation, transfers: ['basic', 'multipart'], objects}),
  })
  return {
    status: res.status,
    body: (await res.json()) as {
      objects: {
        oid: string
        size: number
        error?: {code: number; message: string}
        actions?: {upload?: {href: string; header?: Record<string, string>}; download?: {href: string}}
      }[]
    },
  }
}

function commitBody(path: string, content: string, parent?: string): string {
  return [
    {key: 'header', value: {summary: 'x', ...(parent ? {parentCommit: parent} : {})}},
    {key: 'file', value: {path, content: Buffer.from(content).toString('base64'), encoding: 'base64'}},
  ]
    .map((l) => JSON.stringify(l))
    .join('\n')
}

describe('hub serve is a multi-user server: writes authorize, namespaces are owned, private is private, uploads are bounded', () => {
  const tmp = tempDir('psyche-hub-hostile-')
  let hub: HubServer
  const root = () => join(tmp.path, 'store')

  before(async () => {
    hub = await HubServer.start({root: root(), multipartThreshold: 1000, chunkSize: 300, uploadTtlMs: 400})
    await createRepo({repo: 'alice/open', hubUrl: hub.url, accessToken: ALICE})
    await createRepo({repo: 'alice/secret', hubUrl: hub.url, accessToken: ALICE, private: true})
    await uploadFiles({
      repo: 'alice/secret',
      hubUrl: hub.url,
      accessToken: ALICE,
      useXet: false,
      files: [
        {path: 'config.json', content: new Blob(['{"secret": true}'])},
        {path: 'model.safetensors', content: new Blob([Buffer.alloc(2000, 3)])},
      ],
    })
  })
  after(async () => {
    await hub.close()
    tmp.cleanup()
  })

  it('an LFS upload URL is handed out by the token-checked batch API only: a PUT without one stores nothing', async () => {
    const content = Buffer.alloc(5000, 1)
    const oid = sha256(content)
    // the old route took any PUT: /lfs-upload/OID?size=N
    const put = await fetch(`${hub.url}/lfs-upload/${oid}?size=${content.length}`, {method: 'PUT', body: content})
    assert.equal(put.status, 404)
    const guessed = await fetch(`${hub.url}/lfs-upload/${oid}?upload=${'0'.repeat(32)}`, {method: 'PUT', body: content})
    assert.equal(guessed.status, 404)
    assert.equal(existsSync(join(root(), 'objects', oid.slice(0, 2), oid)), false)
    // the batch API needs a token of the namespace
    assert.equal((await batch(hub, 'alice/open', undefined, [{oid, size: content.length}])).status, 401)
    assert.equal((await batch(hub, 'alice/open', BOB, [{oid, size: content.length}])).status, 403)
    const small = Buffer.from('small object')
    const ok = await batch(hub, 'alice/open', ALICE, [{oid: sha256(small), size: small.length}])
    const href = ok.body.objects[0]!.actions!.upload!.href
    assert.match(href, /\?upload=[0-9a-f]{32}$/)
    assert.equal((await fetch(href, {method: 'PUT', body: small})).status, 200)
    assert.equal((await fetch(href, {method: 'PUT', body: small})).status, 404, 'an upload URL is used once')
  })

  it('a token writes only to its own namespace (create, commit, branch, preupload, LFS batch)', async () => {
    const head = ((await (await fetch(`${hub.url}/api/models/alice/open`)).json()) as {sha: string}).sha
    const attempts: [string, RequestInit][] = [
      [`${hub.url}/api/repos/create`, {method: 'POST', body: JSON.stringify({name: 'mine', organization: 'alice'})}],
      [`${hub.url}/api/models/alice/open/commit/main`, {method: 'POST', body: commitBody('evil.txt', 'pwned', head)}],
      [`${hub.url}/api/models/alice/open/branch/evil`, {method: 'POST', body: '{}'}],
      [`${hub.url}/api/models/alice/open/preupload/main`, {method: 'POST', body: JSON.stringify({files: [{path: 'a', size: 1, sample: ''}]})}],
    ]
    for (const [url, init] of attempts) {
      const res = await fetch(url, {...init, headers: auth(BOB)})
      assert.equal(res.status, 403, url)
      assert.match(((await res.json()) as {error: string}).error, /may not write to namespace alice/)
      assert.equal((await fetch(url, {...init})).status, 401, `${url} without a token`)
    }
    assert.equal((await fetch(`${hub.url}/alice/open/resolve/main/evil.txt`)).status, 404)
    assert.equal(((await (await fetch(`${hub.url}/api/models/alice/open`)).json()) as {sha: string}).sha, head, 'alice/open did not move')
    // bob has a namespace of his own, and alice cannot write there
    await createRepo({repo: 'bob/m', hubUrl: hub.url, accessToken: BOB})
    const res = await fetch(`${hub.url}/api/models/bob/m/commit/main`, {method: 'POST', headers: auth(ALICE), body: commitBody('x.txt', 'x')})
    assert.equal(res.status, 403)
  })

  it('a token bound to a namespace (--token NS:hf_…) writes there only; no other token can claim it', async () => {
    const bound = await HubServer.start({root: join(tmp.path, 'bound'), tokens: [{token: 'hf_carol', user: 'carol'}, 'hf_free']})
    try {
      await createRepo({repo: 'carol/m', hubUrl: bound.url, accessToken: 'hf_carol'})
      await assert.rejects(createRepo({repo: 'carol/x', hubUrl: bound.url, accessToken: 'hf_free'}), /may not write to namespace carol/)
      await assert.rejects(createRepo({repo: 'dave/x', hubUrl: bound.url, accessToken: 'hf_carol'}), /may not write to namespace dave/)
      await assert.rejects(createRepo({repo: 'dave/x', hubUrl: bound.url, accessToken: 'hf_other'}), /invalid token/)
      await createRepo({repo: 'dave/x', hubUrl: bound.url, accessToken: 'hf_free'})
      const who = (await (await fetch(`${bound.url}/api/whoami-v2`, {headers: auth('hf_carol')})).json()) as {name: string}
      assert.equal(who.name, 'carol')
    } finally {
      await bound.close()
    }
  })

  it('--token takes hf_… or NAMESPACE:hf_…', () => {
    assert.equal(parseTokenFlag('hf_abc'), 'hf_abc')
    assert.deepEqual(parseTokenFlag('carol:hf_abc'), {token: 'hf_abc', user: 'carol'})
    for (const bad of ['abc', 'carol:abc', 'hf_', ':hf_abc', '../x:hf_abc', 'hf_a b']) assert.throws(() => parseTokenFlag(bad), /--token/, bad)
  })

  it('a private repository is readable by its namespace only, on every read route', async () => {
    const big = Buffer.alloc(2000, 3)
    const routes = [
      `/api/models/alice/secret`,
      `/api/models/alice/secret/revision/main`,
      `/api/models/alice/secret/tree/main`,
      `/alice/secret/resolve/main/config.json`,
      `/alice/secret/raw/main/config.json`,
      `/alice/secret.git/lfs-objects/${sha256(big)}`,
    ]
    for (const path of routes) {
      for (const headers of [{}, auth(BOB)]) {
        const res = await fetch(`${hub.url}${path}`, {headers})
        assert.equal(res.status, 404, `${path} ${JSON.stringify(headers)}`)
        assert.equal(res.headers.get('x-error-code'), 'RepoNotFound', path)
        await res.arrayBuffer()
      }
      const own = await fetch(`${hub.url}${path}`, {headers: auth(ALICE)})
      assert.equal(own.status, 200, `${path} for its owner`)
      await own.arrayBuffer()
    }
    const info = await fetch(`${hub.url}/api/models/alice/secret/paths-info/main`, {
      method: 'POST',
      headers: {'Content-Type': 'application/json'},
      body: '{"paths": ["config.json"]}',
    })
    assert.equal(info.status, 404)
    const down = await batch(hub, 'alice/secret', undefined, [{oid: sha256(big), size: big.length}], 'download')
    assert.equal(down.status, 404)
    const mine = await batch(hub, 'alice/secret', ALICE, [{oid: sha256(big), size: big.length}], 'download')
    assert.deepEqual(Buffer.from(await (await fetch(mine.body.objects[0]!.actions!.download!.href, {headers: auth(ALICE)})).arrayBuffer()), big)
    // an object of a private repository is not served through a public one
    const open = await batch(hub, 'alice/open', undefined, [{oid: sha256(big), size: big.length}], 'download')
    assert.equal(open.body.objects[0]!.error?.code, 404)
    assert.equal((await fetch(`${hub.url}/alice/open.git/lfs-objects/${sha256(big)}`)).status, 404)
  })

  it('caps declared sizes and part counts; unfinished uploads expire with their parts', async () => {
    const huge = await batch(hub, 'alice/open', ALICE, [{oid: 'e'.repeat(64), size: 2 ** 53}])
    assert.equal(huge.status, 200)
    assert.match(huge.body.objects[0]!.error!.message, /more than the \d+ bytes a file may have here \(--max-file-size\)/)
    const capped = await HubServer.start({root: join(tmp.path, 'capped'), maxFileSize: 2 ** 40, maxParts: 100, multipartThreshold: 10, chunkSize: 16})
    try {
      await createRepo({repo: 'u/m', hubUrl: capped.url, accessToken: ALICE})
      const big = await batch(capped, 'u/m', ALICE, [{oid: 'd'.repeat(64), size: 2 ** 40}])
      const header = big.body.objects[0]!.actions!.upload!.header!
      assert.equal(Object.keys(header).length, 101, 'chunk_size and 100 parts')
      assert.equal(Number(header.chunk_size), Math.ceil(2 ** 40 / 100))
      const many = await fetch(`${capped.url}/u/m.git/info/lfs/objects/batch`, {
        method: 'POST',
        headers: auth(ALICE),
        body: JSON.stringify({operation: 'upload', objects: Array.from({length: 1001}, () => ({oid: 'a'.repeat(64), size: 1}))}),
      })
      assert.equal(many.status, 413)
    } finally {
      await capped.close()
    }
    // a multipart upload left unfinished: its part is deleted once the upload has been idle for the TTL
    const content = Buffer.alloc(1500, 9)
    const reply = await batch(hub, 'alice/open', ALICE, [{oid: sha256(content), size: content.length}])
    const {header, href} = reply.body.objects[0]!.actions!.upload!
    assert.equal((await fetch(header!['00001']!, {method: 'PUT', body: content.subarray(0, 300)})).status, 200)
    const before = hub.pendingUploads
    assert.ok(before >= 1)
    assert.ok(readdirSync(join(root(), 'tmp')).some((d) => d.startsWith('upload-')))
    await waitFor(() => hub.pendingUploads === 0, 5000, 'the upload to expire')
    await waitFor(() => readdirSync(join(root(), 'tmp')).filter((d) => d.startsWith('upload-')).length === 0, 5000, 'its parts to be deleted')
    assert.equal((await fetch(header!['00002']!, {method: 'PUT', body: content.subarray(300, 600)})).status, 404)
    assert.equal((await fetch(href, {method: 'POST', body: '{"parts": []}'})).status, 404)
  })

  it('a request body bigger than the cap is refused before it is read (413); bad percent-encoding is 400, not 500', async () => {
    // headers that declare 1 GiB, and no body: the answer comes at once
    const socket = connect(hub.port, '127.0.0.1')
    socket.end(`POST /api/repos/create HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${ALICE}\r\nContent-Length: ${1024 ** 3}\r\n\r\n`)
    let answer = ''
    for await (const chunk of socket) answer += String(chunk)
    assert.match(answer, /^HTTP\/1.1 413 .*--max-request-body/s)
    for (const path of ['/api/models/%E0%A4%A/x', '/alice/open/resolve/main/%ZZ', '/%/x/resolve/main/a', '/api/models/alice/open/tree/main/%C0']) {
      const r = await raw(hub.url, 'GET', path)
      assert.equal(r.status, 400, `${path}: ${r.body}`)
      assert.match(r.body, /percent-encoding/)
    }
  })

  it('answers POST /api/validate-yaml as the Hub does (errors, warnings)', async () => {
    const check = async (content: string) => {
      const res = await fetch(`${hub.url}/api/validate-yaml`, {method: 'POST', headers: {'Content-Type': 'application/json'}, body: JSON.stringify({content, repoType: 'model'})})
      return {status: res.status, ...((await res.json()) as {errors: {message: string}[]; warnings: {message: string}[]})}
    }
    assert.deepEqual(await check('---\nlibrary_name: transformers\ntags:\n- psyche\n---\n# model\n'), {status: 200, errors: [], warnings: []})
    const none = await check('# just a title\n')
    assert.equal(none.status, 200)
    assert.match(none.warnings[0]!.message, /missing yaml metadata/)
    const open = await check('---\nlibrary_name: x\n# no end\n')
    assert.equal(open.status, 400)
    assert.match(open.errors[0]!.message, /not closed/)
    assert.equal((await check('---\ntags:\n\t- x\n---\n')).status, 400)
  })

  it('fuzz: 600 random requests get no 5xx, write nothing outside --dir, and the server keeps serving', async () => {
    let seed = 424242
    const rand = () => {
      seed = (seed * 1103515245 + 12345) & 0x7fffffff
      return seed / 0x7fffffff
    }
    const pick = <T>(xs: T[]): T => xs[Math.floor(rand() * xs.length)]!
    const seg = () =>
      pick([
        'alice',
        'open',
        'secret',
        'bob',
        'm',
        'main',
        '..',
        '.',
        '%2e%2e',
        '%00',
        '%',
        '%E0%A4%A',
        'a'.repeat(300),
        'x.git',
        'refs%2Fpr%2F1',
        '',
        'HEAD',
        'f'.repeat(40),
        'e'.repeat(64),
        '-1',
        '1e309',
        '00001',
      ])
    const repo = () => (rand() < 0.6 ? pick(['alice/open', 'alice/secret', 'bob/m', 'bob/new']) : `${seg()}/${seg()}`)
    const rev = () => (rand() < 0.6 ? 'main' : seg())
    const file = () => (rand() < 0.6 ? pick(['config.json', 'model.safetensors', '.gitattributes', 'a/b']) : seg())
    const templates = [
      (): [string, string] => ['GET', `/api/models/${repo()}`],
      (): [string, string] => ['GET', `/api/models/${repo()}/revision/${rev()}`],
      (): [string, string] => [
        'GET',
        `/api/models/${repo()}/tree/${rev()}/${pick(['', file()])}?recursive=${pick(['1', 'x'])}&cursor=${pick(['0', '-5', 'abc', '99999999999999999999'])}`,
      ],
      (): [string, string] => ['POST', `/api/models/${repo()}/paths-info/${rev()}`],
      (): [string, string] => ['POST', `/api/models/${repo()}/preupload/${rev()}`],
      (): [string, string] => ['POST', `/api/models/${repo()}/commit/${rev()}`],
      (): [string, string] => ['POST', `/api/models/${repo()}/branch/${seg()}`],
      (): [string, string] => ['POST', `/api/repos/create`],
      (): [string, string] => ['POST', `/api/validate-yaml`],
      (): [string, string] => ['GET', `/api/whoami-v2`],
      (): [string, string] => ['POST', `/${repo()}.git/info/lfs/objects/batch`],
      (): [string, string] => ['GET', `/${repo()}.git/lfs-objects/${seg()}`],
      (): [string, string] => ['PUT', `/lfs-upload/${seg()}${pick(['', '/part/' + seg(), '/complete'])}?upload=${seg()}`],
      (): [string, string] => ['GET', `/${repo()}/resolve/${rev()}/${file()}`],
      (): [string, string] => ['HEAD', `/${repo()}/raw/${rev()}/${file()}`],
    ]
    const junkJson = () =>
      pick([
        '',
        '{',
        'null',
        '[]',
        '"x"',
        JSON.stringify({name: seg(), organization: seg(), private: rand() < 0.5, type: pick(['model', 'dataset', 7])}),
        JSON.stringify({
          operation: pick(['upload', 'download', 'x']),
          objects: pick([[{oid: 'e'.repeat(64), size: pick([-1, 2 ** 53, 1e308, 5, '5'])}], 'x', [null], [[]]]),
          transfers: pick([['multipart'], 'basic', [1]]),
        }),
        JSON.stringify({paths: pick([['config.json'], 'x', [1, null], ['../../etc']]), expand: true}),
        JSON.stringify({files: pick([[{path: seg(), size: pick([1, -1, 2 ** 60]), sample: '%%%'}], [null], 'x']), content: pick([7, '---\n', null])}),
        JSON.stringify({parts: [{partNumber: 1, etag: 'x'}]}),
        [
          JSON.stringify({key: 'header', value: {summary: 'f', parentCommit: pick(['x', 'f'.repeat(40)])}}),
          JSON.stringify({
            key: pick(['file', 'lfsFile', 'deletedFile', 'deletedFolder', 'x']),
            value: {path: seg(), content: 'aGk=', encoding: 'base64', oid: 'e'.repeat(64), size: 3},
          }),
        ].join('\n'),
      ])
    const tokens = [undefined, ALICE, BOB, 'hf_mallory', 'garbage', 'hf_']
    let served = 0
    for (let i = 0; i < 600; i++) {
      const [natural, path] = pick(templates)()
      const method = rand() < 0.8 ? natural : pick(['GET', 'HEAD', 'POST', 'PUT', 'DELETE', 'PATCH'])
      const token = pick(tokens)
      const headers: Record<string, string> = {...(token ? {Authorization: rand() < 0.8 ? `Bearer ${token}` : pick([token, 'Bearer', 'Basic xx'])} : {})}
      if (rand() < 0.15) headers.Range = pick(['bytes=0-1', 'bytes=-0', 'bytes=5-2', 'bytes=99999999999999999999-', 'lines=1-2', 'bytes=0-1,3-4'])
      if (rand() < 0.3) headers['Content-Type'] = pick(['application/json', 'application/x-www-form-urlencoded', 'application/x-ndjson'])
      const body = method === 'GET' || method === 'HEAD' ? undefined : junkJson()
      const res = await raw(hub.url, method, path, headers, body)
      assert.ok(res.status >= 200 && res.status < 500, `${method} ${path} ${JSON.stringify(headers)} ${body ?? ''} → ${res.status} ${res.body.slice(0, 300)}`)
      if (res.status < 300) served++
    }
    assert.ok(served > 20, `some requests were served (${served})`)
    assert.deepEqual(
      readdirSync(tmp.path).filter((f) => !['bound', 'capped', 'store'].includes(f)),
      [],
      'nothing written beside the stores',
    )
    // alice's repositories are as they were, and the server still serves and takes uploads
    assert.equal(await (await fetch(`${hub.url}/alice/secret/resolve/main/config.json`, {headers: auth(ALICE)})).text(), '{"secret": true}')
    await uploadFiles({repo: 'alice/open', hubUrl: hub.url, accessToken: ALICE, useXet: false, files: [{path: 'after.bin', content: new Blob([Buffer.alloc(1200, 5)])}]})
    assert.equal((await fetch(`${hub.url}/alice/open/resolve/main/after.bin`)).status, 200)
  })
})
