import assert from 'node:assert/strict'
import {createHash} from 'node:crypto'
import {mkdirSync, readFileSync, readdirSync, writeFileSync} from 'node:fs'
import {join} from 'node:path'
import {after, before, describe, it} from 'node:test'
import {downloadCheckpoint, uploadCheckpoint} from '../../src/core/checkpoint/hub.js'
import {HubServer} from '../../src/core/checkpoint/hub-server.js'
import {runCli, tempDir} from '../helpers.js'
import {python, writeSafetensors} from './helpers.js'

const TOKEN = 'hf_jobs_token'
const sha256 = (b: Buffer) => createHash('sha256').update(b).digest('hex')

describe('checkpoint upload / download jobs, cross-checked with Python huggingface_hub', () => {
  const tmp = tempDir('psyche-ckpt-jobs-')
  let hub: HubServer
  const shapes = {'model.embed_tokens.weight': [64, 32], 'model.layers.0.mlp.up_proj.weight': [48, 32], 'model.norm.weight': [32], 'lm_head.weight': [64, 32]}
  let tensors: Record<string, Buffer>

  before(async () => {
    hub = await HubServer.start({root: join(tmp.path, 'hub'), multipartThreshold: 4096, chunkSize: 2048})
    mkdirSync(join(tmp.path, 'model'))
    tensors = writeSafetensors(join(tmp.path, 'model', 'model.safetensors'), shapes)
    writeFileSync(join(tmp.path, 'model', 'config.json'), '{"model_type": "llama"}\n')
    mkdirSync(join(tmp.path, 'model', 'extra'))
    writeFileSync(join(tmp.path, 'model', 'extra', 'notes.txt'), 'nested file\n')
  })
  after(async () => {
    await hub.close()
    tmp.cleanup()
  })

  it('psyche uploads a sharded model (CLI, --json); Python snapshot_download gets every tensor back', async () => {
    const r = await runCli([
      'checkpoint',
      'upload',
      join(tmp.path, 'model'),
      '--repo',
      'ci/sharded',
      '--message',
      'step 10',
      '--max-shard-size',
      '10000',
      '--hub-url',
      hub.url,
      '--token',
      TOKEN,
      '--json',
    ])
    assert.equal(r.exitCode, 0, r.stderr)
    const out = JSON.parse(r.stdout)
    assert.equal(out.sharded, true)
    assert.match(out.commit, /^[0-9a-f]{40}$/)
    const shards = out.files.map((f: {path: string}) => f.path).filter((p: string) => /^model-\d{5}-of-\d{5}\.safetensors$/.test(p))
    assert.ok(shards.length >= 2, `expected several shards, got ${shards.join(', ')}`)
    const got = await python(`
import json, os
from huggingface_hub import snapshot_download
from safetensors.numpy import load_file
p = snapshot_download("ci/sharded", endpoint="${hub.url}", cache_dir="${join(tmp.path, 'pycache')}")
index = json.load(open(os.path.join(p, "model.safetensors.index.json")))
tensors = {}
for shard in sorted(set(index["weight_map"].values())):
    for name, arr in load_file(os.path.join(p, shard)).items():
        assert index["weight_map"][name] == shard
        tensors[name] = arr.tobytes().hex()
commit = open(os.path.join("${join(tmp.path, 'pycache')}", "models--ci--sharded", "refs", "main")).read()
print(json.dumps({"tensors": tensors, "files": sorted(os.listdir(p)), "commit": commit, "notes": open(os.path.join(p, "extra", "notes.txt")).read()}))
`)
    assert.equal(got.commit, out.commit)
    assert.deepEqual(Object.keys(got.tensors).sort(), Object.keys(shapes).sort())
    for (const [name, bytes] of Object.entries(tensors)) assert.equal(got.tensors[name], bytes.toString('hex'), name)
    assert.equal(got.notes, 'nested file\n')
    assert.ok(!got.files.includes('model.safetensors'), 'the unsharded file is not uploaded next to its shards')
  })

  it('Python upload_folder uploads; psyche downloads it (CLI, --json), resumes a partial file and checks hashes', async () => {
    await python(`
import json
from huggingface_hub import HfApi
api = HfApi(endpoint="${hub.url}", token="${TOKEN}")
api.create_repo("py/model")
info = api.upload_folder(folder_path="${join(tmp.path, 'model')}", repo_id="py/model", commit_message="from python")
print(json.dumps({"oid": info.oid}))
`)
    const cache = join(tmp.path, 'jscache')
    const r = await runCli(['checkpoint', 'download', '--repo', 'py/model', '--out', join(tmp.path, 'out1'), '--cache-dir', cache, '--hub-url', hub.url, '--json'])
    assert.equal(r.exitCode, 0, r.stderr)
    const out = JSON.parse(r.stdout)
    assert.match(out.commit, /^[0-9a-f]{40}$/)
    for (const f of ['model.safetensors', 'config.json', 'extra/notes.txt']) {
      assert.deepEqual(readFileSync(join(tmp.path, 'out1', f)), readFileSync(join(tmp.path, 'model', f)), f)
    }
    assert.equal(out.downloaded_bytes, out.bytes)

    // a second download into a new directory takes everything from the cache
    const again = await downloadCheckpoint({repo: 'py/model', out: join(tmp.path, 'out2'), cacheDir: cache, hubUrl: hub.url})
    assert.equal(again.downloaded_bytes, 0)
    assert.ok(again.files.every((f) => f.cached))

    // an interrupted download resumes: leave the first 1000 bytes as .incomplete, then download anew
    const weights = readFileSync(join(tmp.path, 'model', 'model.safetensors'))
    const fresh = join(tmp.path, 'cache-resume')
    const blobDir = join(fresh, 'models--py--model', 'blobs')
    mkdirSync(blobDir, {recursive: true})
    writeFileSync(join(blobDir, `${sha256(weights)}.incomplete`), weights.subarray(0, 1000))
    const progress: number[] = []
    const resumed = await downloadCheckpoint({repo: 'py/model', out: join(tmp.path, 'out3'), cacheDir: fresh, hubUrl: hub.url, onProgress: (p) => progress.push(p.done)})
    const sizes = Object.fromEntries(resumed.files.map((f) => [f.path, f.size]))
    assert.equal(resumed.downloaded_bytes, resumed.bytes - 1000, 'only the missing bytes were fetched')
    assert.deepEqual(readFileSync(join(tmp.path, 'out3', 'model.safetensors')), weights)
    assert.equal(sizes['model.safetensors'], weights.length)
    assert.equal(progress.at(-1), resumed.bytes)

    // a corrupt partial file is caught by the hash check and fetched again whole
    const corrupt = join(tmp.path, 'cache-corrupt')
    mkdirSync(join(corrupt, 'models--py--model', 'blobs'), {recursive: true})
    writeFileSync(join(corrupt, 'models--py--model', 'blobs', `${sha256(weights)}.incomplete`), Buffer.alloc(1000, 7))
    const healed = await downloadCheckpoint({repo: 'py/model', out: join(tmp.path, 'out4'), cacheDir: corrupt, hubUrl: hub.url})
    assert.deepEqual(readFileSync(join(tmp.path, 'out4', 'model.safetensors')), weights)
    assert.equal(healed.downloaded_bytes, healed.bytes - 1000 + weights.length, 'the resumed tail, then the whole file again')
  })

  it('fails with exit code 4 when the Hub serves bytes that do not match their hash, and leaves --out alone', async () => {
    const weights = readFileSync(join(tmp.path, 'model', 'model.safetensors'))
    const sha = sha256(weights)
    // corrupt the object in the server's store (as a broken mirror would)
    const objectPath = join(tmp.path, 'hub', 'objects', sha.slice(0, 2), sha)
    const bad = Buffer.from(weights)
    bad[bad.length - 1]! ^= 0xff
    writeFileSync(objectPath, bad)
    try {
      const r = await runCli(['checkpoint', 'download', '--repo', 'py/model', '--out', join(tmp.path, 'out5'), '--cache-dir', join(tmp.path, 'cache-bad'), '--hub-url', hub.url])
      assert.equal(r.exitCode, 4, r.stderr)
      assert.match(r.stderr, /model\.safetensors.*sha256/)
      assert.throws(() => readdirSync(join(tmp.path, 'out5')))
      assert.deepEqual(
        readdirSync(join(tmp.path, 'cache-bad', 'models--py--model', 'blobs')).filter((f) => f.startsWith(sha)),
        [],
      )
    } finally {
      writeFileSync(objectPath, weights)
    }
  })

  it('exit codes: 3 for an unknown repository or revision, 1 for a token without hf_ or a missing directory', async () => {
    const unknown = await runCli(['checkpoint', 'download', '--repo', 'nobody/none', '--out', join(tmp.path, 'x'), '--hub-url', hub.url, '--json'])
    assert.equal(unknown.exitCode, 3)
    assert.match(JSON.parse(unknown.stdout).error.message, /404.*not found/)
    await assert.rejects(
      downloadCheckpoint({repo: 'py/model', revision: 'nope', out: join(tmp.path, 'y'), cacheDir: join(tmp.path, 'c'), hubUrl: hub.url}),
      (e: Error & {exitCode?: number}) => e.exitCode === 3 && /nope/.test(e.message),
    )
    await assert.rejects(uploadCheckpoint({dir: join(tmp.path, 'model'), repo: 'ci/x', token: 'abc', hubUrl: hub.url}), /does not start with hf_/)
    await assert.rejects(uploadCheckpoint({dir: join(tmp.path, 'missing'), repo: 'ci/x', token: TOKEN, hubUrl: hub.url}), /no such directory/)
    await assert.rejects(uploadCheckpoint({dir: join(tmp.path, 'model'), repo: 'ci/x', hubUrl: hub.url}), /HF_TOKEN/)
  })

  it('uploads to a new branch and downloads that revision; endpoint and token can come from HF_ENDPOINT and HF_TOKEN', async () => {
    process.env.HF_TOKEN = TOKEN
    process.env.HF_ENDPOINT = hub.url
    let r
    try {
      r = await runCli(['checkpoint', 'upload', join(tmp.path, 'model'), '--repo', 'ci/branches', '--revision', 'run-2', '--json'])
    } finally {
      delete process.env.HF_TOKEN
      delete process.env.HF_ENDPOINT
    }
    assert.equal(r.exitCode, 0, r.stderr)
    const up = JSON.parse(r.stdout) as {commit: string; revision: string}
    assert.equal(up.revision, 'run-2')
    const main = (await (await fetch(`${hub.url}/api/models/ci/branches/revision/main`)).json()) as {sha: string; siblings: unknown[]}
    assert.notEqual(main.sha, up.commit, 'main did not move')
    const down = await downloadCheckpoint({repo: 'ci/branches', revision: 'run-2', out: join(tmp.path, 'branch'), cacheDir: join(tmp.path, 'bc'), hubUrl: hub.url})
    assert.equal(down.commit, up.commit)
    assert.deepEqual(readFileSync(join(tmp.path, 'branch', 'config.json')), readFileSync(join(tmp.path, 'model', 'config.json')))
  })
})
