import assert from 'node:assert/strict'
import {readFileSync, readdirSync} from 'node:fs'
import {join} from 'node:path'
import {after, describe, it} from 'node:test'
import {runCli, startCli, tempDir, waitFor} from '../helpers.js'
import {python} from './helpers.js'

// Three processes (psyche model init with its PyTorch worker, psyche hub serve, Python huggingface_hub): the e2e
// tier (test/tiers.mjs). hub serve's own rules are checked in process in hub-server-hostile.test.ts (npm test).

const ALICE = 'hf_alice_token'
const auth = (token: string) => ({Authorization: `Bearer ${token}`})

describe('hub serve against Python huggingface_hub (issue 24): upload_folder and snapshot_download of a psyche model directory', () => {
  const tmp = tempDir('psyche-hub-py-')
  after(() => tmp.cleanup())

  it('psyche model init → upload_folder (model card included) → snapshot_download gives every file back; a 2^53-byte upload is refused without harm', async () => {
    const model = join(tmp.path, 'model')
    const init = await runCli(['model', 'init', '--out', model, '--json'])
    assert.equal(init.exitCode, 0, init.stderr)
    const files = readdirSync(model).sort()
    assert.ok(files.includes('README.md') && files.includes('model.safetensors') && files.includes('tokenizer.json'), files.join(', '))
    const server = startCli(['hub', 'serve', '--dir', join(tmp.path, 'hub'), '--port', '0', '--json', '--multipart-threshold', '1MiB', '--chunk-size', '1MiB'])
    let out = ''
    server.stdout!.on('data', (d: Buffer) => (out += d.toString()))
    try {
      await waitFor(() => out.includes('listening'), 60_000, 'hub serve to listen')
      const url = (JSON.parse(out.trim().split('\n')[0]!) as {listening: {url: string}}).listening.url
      const got = await python(`
import json, os, warnings
from huggingface_hub import HfApi, snapshot_download
warnings.simplefilter("error", UserWarning)  # a model-card warning from validate-yaml fails the test
api = HfApi(endpoint="${url}", token="${ALICE}")
api.create_repo("alice/tiny", private=True)
info = api.upload_folder(folder_path="${model}", repo_id="alice/tiny", commit_message="psyche model")
p = snapshot_download("alice/tiny", endpoint="${url}", token="${ALICE}", cache_dir="${join(tmp.path, 'pycache')}")
files = {}
for root, _, names in os.walk(p):
    for n in names:
        full = os.path.join(root, n)
        files[os.path.relpath(full, p)] = open(full, "rb").read().hex()
denied = None
try:
    snapshot_download("alice/tiny", endpoint="${url}", token=False, cache_dir="${join(tmp.path, 'anon')}")
except Exception as e:
    denied = type(e).__name__
print(json.dumps({"oid": info.oid, "files": files, "denied": denied}))
`)
      assert.match(got.oid, /^[0-9a-f]{40}$/)
      assert.deepEqual(Object.keys(got.files).sort(), ['.gitattributes', ...files].sort())
      for (const f of files) assert.equal(got.files[f], readFileSync(join(model, f)).toString('hex'), f)
      assert.equal(got.denied, 'RepositoryNotFoundError', 'the private repository is not readable anonymously')
      // the multipart upload that declares 2^53 bytes: refused, and the server lives on
      const huge = await fetch(`${url}/alice/tiny.git/info/lfs/objects/batch`, {
        method: 'POST',
        headers: auth(ALICE),
        body: JSON.stringify({operation: 'upload', transfers: ['basic', 'multipart'], objects: [{oid: 'e'.repeat(64), size: 2 ** 53}]}),
      })
      assert.equal(huge.status, 200)
      assert.match(((await huge.json()) as {objects: {error: {message: string}}[]}).objects[0]!.error.message, /--max-file-size/)
      assert.equal((await fetch(`${url}/api/models/alice/tiny`, {headers: auth(ALICE)})).status, 200)
      assert.equal(server.exitCode, null, 'hub serve is still running')
    } finally {
      server.kill('SIGTERM')
      await server
    }
  })
})
