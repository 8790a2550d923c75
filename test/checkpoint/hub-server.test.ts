import assert from 'node:assert/strict'
import {createHash} from 'node:crypto'
import {mkdirSync, readFileSync, readdirSync, writeFileSync} from 'node:fs'
import {join} from 'node:path'
import {after, before, describe, it} from 'node:test'
import {createRepo, listFiles, uploadFiles} from '@huggingface/hub'
import {HubServer} from '../../src/core/checkpoint/hub-server.js'
import {tempDir} from '../helpers.js'

const TOKEN = 'hf_test_token'

describe('hub server: the routes @huggingface/hub uses', () => {
  const tmp = tempDir('psyche-hub-')
  let hub: HubServer
  let big: Buffer
  let commit: string

  before(async () => {
    hub = await HubServer.start({root: join(tmp.path, 'store'), multipartThreshold: 1000, chunkSize: 300, treePageSize: 2})
    await createRepo({repo: 'org/model', hubUrl: hub.url, accessToken: TOKEN})
    big = Buffer.concat(Array.from({length: 40}, (_, i) => createHash('sha512').update(String(i)).digest())) // 2560 bytes: multipart
    const out = await uploadFiles({
      repo: 'org/model',
      hubUrl: hub.url,
      accessToken: TOKEN,
      useXet: false,
      files: [
        {path: 'config.json', content: new Blob(['{"model_type": "llama"}\n'])},
        {path: 'model.safetensors', content: new Blob([new Uint8Array(big)])},
        {path: 'a/b/c.txt', content: new Blob(['deep'])},
        {path: 'a/d.bin', content: new Blob([Buffer.from([0, 1, 2, 3])])},
      ],
    })
    commit = out!.commit.oid
  })
  after(async () => {
    await hub.close()
    tmp.cleanup()
  })

  it('serves a whole file, a single range (206 + Content-Range), a suffix range, and refuses an unsatisfiable one (416)', async () => {
    const whole = await fetch(`${hub.url}/org/model/resolve/main/model.safetensors`)
    assert.equal(whole.status, 200)
    assert.deepEqual(Buffer.from(await whole.arrayBuffer()), big)
    assert.equal(whole.headers.get('x-repo-commit'), commit)
    const part = await fetch(`${hub.url}/org/model/resolve/main/model.safetensors`, {headers: {Range: 'bytes=100-199'}})
    assert.equal(part.status, 206)
    assert.equal(part.headers.get('content-range'), `bytes 100-199/${big.length}`)
    assert.deepEqual(Buffer.from(await part.arrayBuffer()), big.subarray(100, 200))
    const tail = await fetch(`${hub.url}/org/model/resolve/${commit}/model.safetensors`, {headers: {Range: 'bytes=-10'}})
    assert.equal(tail.status, 206)
    assert.deepEqual(Buffer.from(await tail.arrayBuffer()), big.subarray(big.length - 10))
    const open = await fetch(`${hub.url}/org/model/resolve/main/model.safetensors`, {headers: {Range: `bytes=${big.length - 5}-`}})
    assert.equal(open.headers.get('content-range'), `bytes ${big.length - 5}-${big.length - 1}/${big.length}`)
    await open.arrayBuffer()
    const bad = await fetch(`${hub.url}/org/model/resolve/main/model.safetensors`, {headers: {Range: `bytes=${big.length}-`}})
    assert.equal(bad.status, 416)
    assert.equal(bad.headers.get('content-range'), `bytes */${big.length}`)
  })

  it('answers HEAD on resolve with ETag, X-Linked-Size and X-Repo-Commit, and raw with the LFS pointer', async () => {
    const sha = createHash('sha256').update(big).digest('hex')
    const head = await fetch(`${hub.url}/org/model/resolve/main/model.safetensors`, {method: 'HEAD'})
    assert.equal(head.status, 200)
    assert.equal(head.headers.get('etag'), `"${sha}"`)
    assert.equal(head.headers.get('x-linked-size'), String(big.length))
    assert.equal(head.headers.get('x-repo-commit'), commit)
    const raw = await fetch(`${hub.url}/org/model/raw/main/model.safetensors`, {method: 'HEAD'})
    assert.equal(raw.status, 200)
    const pointer = `version https://git-lfs.github.com/spec/v1\noid sha256:${sha}\nsize ${big.length}\n`
    assert.equal(raw.headers.get('content-length'), String(pointer.length))
    const rawGet = await fetch(`${hub.url}/org/model/raw/main/model.safetensors`)
    assert.equal(await rawGet.text(), pointer)
    const small = await fetch(`${hub.url}/org/model/resolve/main/config.json`, {method: 'HEAD'})
    const gitOid = createHash('sha1').update('blob 24\0{"model_type": "llama"}\n').digest('hex')
    assert.equal(small.headers.get('etag'), `"${gitOid}"`)
    assert.equal(small.headers.get('x-linked-size'), null)
  })

  it('names missing repositories, revisions and entries in X-Error-Code', async () => {
    const cases: [string, string][] = [
      [`${hub.url}/api/models/org/nothing/revision/main`, 'RepoNotFound'],
      [`${hub.url}/api/models/org/model/revision/no-branch`, 'RevisionNotFound'],
      [`${hub.url}/org/model/resolve/main/missing.txt`, 'EntryNotFound'],
      [`${hub.url}/org/model/resolve/${'0'.repeat(40)}/config.json`, 'RevisionNotFound'],
      [`${hub.url}/api/models/org/model/tree/main/nodir`, 'EntryNotFound'],
    ]
    for (const [url, code] of cases) {
      const res = await fetch(url)
      assert.equal(res.status, 404, url)
      assert.equal(res.headers.get('x-error-code'), code, url)
      assert.match(((await res.json()) as {error: string}).error, /not found|not a directory/)
    }
  })

  it('pages the tree with a Link header, which the client follows to the end', async () => {
    const first = await fetch(`${hub.url}/api/models/org/model/tree/main?recursive=true`)
    assert.equal(((await first.json()) as unknown[]).length, 2)
    assert.match(first.headers.get('link') ?? '', /cursor=2>; rel="next"/)
    const entries = []
    for await (const e of listFiles({repo: 'org/model', hubUrl: hub.url, recursive: true})) entries.push(`${e.type}:${e.path}`)
    assert.deepEqual(entries.sort(), ['directory:a', 'directory:a/b', 'file:.gitattributes', 'file:a/b/c.txt', 'file:a/d.bin', 'file:config.json', 'file:model.safetensors'])
    const top = await (await fetch(`${hub.url}/api/models/org/model/tree/main/a`)).json()
    assert.deepEqual(
      (top as {path: string}[]).map((e) => e.path),
      ['a/b', 'a/d.bin'],
    )
  })

  it('answers paths-info from a JSON body and from form data', async () => {
    const json = await fetch(`${hub.url}/api/models/org/model/paths-info/main`, {
      method: 'POST',
      headers: {'Content-Type': 'application/json'},
      body: JSON.stringify({paths: ['config.json', 'a', 'nope'], expand: true}),
    })
    const a = (await json.json()) as {path: string; type: string; lastCommit?: {id: string}}[]
    assert.deepEqual(
      a.map((e) => `${e.type}:${e.path}`),
      ['file:config.json', 'directory:a'],
    )
    assert.equal(a[0]!.lastCommit?.id, commit)
    const form = await fetch(`${hub.url}/api/models/org/model/paths-info/main`, {
      method: 'POST',
      body: new URLSearchParams([
        ['paths', 'model.safetensors'],
        ['expand', 'False'],
      ]),
    })
    const b = (await form.json()) as {path: string; lfs?: {oid: string; size: number}}[]
    assert.equal(b.length, 1)
    assert.equal(b[0]!.lfs?.size, big.length)
  })

  it('refuses writes without an hf_ token, and a commit whose parentCommit is not the head (412)', async () => {
    const noToken = await fetch(`${hub.url}/api/repos/create`, {method: 'POST', body: JSON.stringify({name: 'x', organization: 'org', type: 'model'})})
    assert.equal(noToken.status, 401)
    const badToken = await fetch(`${hub.url}/api/repos/create`, {
      method: 'POST',
      headers: {Authorization: 'Bearer abc'},
      body: JSON.stringify({name: 'x', organization: 'org', type: 'model'}),
    })
    assert.equal(badToken.status, 401)
    const ndjson = (parent: string) =>
      [
        {key: 'header', value: {summary: 'edit', parentCommit: parent}},
        {key: 'file', value: {path: 'note.txt', content: 'aGk=', encoding: 'base64'}},
      ]
        .map((l) => JSON.stringify(l))
        .join('\n')
    const stale = await fetch(`${hub.url}/api/models/org/model/commit/main`, {
      method: 'POST',
      headers: {Authorization: `Bearer ${TOKEN}`, 'Content-Type': 'application/x-ndjson'},
      body: ndjson('f'.repeat(40)),
    })
    assert.equal(stale.status, 412)
    const ok = await fetch(`${hub.url}/api/models/org/model/commit/main`, {
      method: 'POST',
      headers: {Authorization: `Bearer ${TOKEN}`, 'Content-Type': 'application/x-ndjson'},
      body: ndjson(commit),
    })
    assert.equal(ok.status, 200)
    const {commitOid} = (await ok.json()) as {commitOid: string}
    assert.notEqual(commitOid, commit)
    assert.equal(await (await fetch(`${hub.url}/org/model/resolve/main/note.txt`)).text(), 'hi')
    // the old revision still resolves to the old tree
    assert.equal((await fetch(`${hub.url}/org/model/resolve/${commit}/note.txt`)).status, 404)
    commit = commitOid
  })

  it('keeps no LFS object whose bytes do not hash to its oid, and refuses to commit a pointer to it', async () => {
    const content = Buffer.from('some weights')
    const wrongOid = createHash('sha256').update('other').digest('hex')
    const batch = await fetch(`${hub.url}/org/model.git/info/lfs/objects/batch`, {
      method: 'POST',
      headers: {Authorization: `Bearer ${TOKEN}`, 'Content-Type': 'application/vnd.git-lfs+json'},
      body: JSON.stringify({operation: 'upload', transfers: ['basic', 'multipart'], objects: [{oid: wrongOid, size: content.length}]}),
    })
    const reply = (await batch.json()) as {transfer: string; objects: {actions: {upload: {href: string}}}[]}
    assert.equal(reply.transfer, 'basic')
    const put = await fetch(reply.objects[0]!.actions.upload.href, {method: 'PUT', body: content})
    assert.equal(put.status, 400)
    assert.match(((await put.json()) as {error: string}).error, /hashes to/)
    const lines = [
      {key: 'header', value: {summary: 'bad'}},
      {key: 'lfsFile', value: {path: 'w.safetensors', algo: 'sha256', oid: wrongOid, size: content.length}},
    ]
    const res = await fetch(`${hub.url}/api/models/org/model/commit/main`, {
      method: 'POST',
      headers: {Authorization: `Bearer ${TOKEN}`},
      body: lines.map((l) => JSON.stringify(l)).join('\n'),
    })
    assert.equal(res.status, 400)
    assert.equal(readdirSync(join(tmp.path, 'store', 'tmp')).length, 0, 'no temporary upload left behind')
  })

  it('keeps its repositories across a restart (everything is on disk)', async () => {
    const port = hub.port
    await hub.close()
    hub = await HubServer.start({root: join(tmp.path, 'store'), port})
    const info = (await (await fetch(`${hub.url}/api/models/org/model`)).json()) as {sha: string; siblings: {rfilename: string}[]}
    assert.equal(info.sha, commit)
    assert.ok(info.siblings.some((s) => s.rfilename === 'a/b/c.txt'))
    assert.deepEqual(Buffer.from(await (await fetch(`${hub.url}/org/model/resolve/main/model.safetensors`)).arrayBuffer()), big)
  })
})
