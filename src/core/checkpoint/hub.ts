import {createHash} from 'node:crypto'
import {createReadStream, createWriteStream, existsSync, openAsBlob} from 'node:fs'
import {copyFile, link, mkdir, open, readdir, rename, rm, stat, writeFile} from 'node:fs/promises'
import {homedir} from 'node:os'
import {dirname, join, relative, resolve, sep} from 'node:path'
import {Readable} from 'node:stream'
import {pipeline} from 'node:stream/promises'
import {HubApiError, commitIter, createBranch, createRepo, listFiles, modelInfo, type CommitOperation} from '@huggingface/hub'
import {PsycheError, errorMessage} from '../errors.js'
import {shardSafetensors} from './safetensors.js'
import {writeFileAtomic} from './store.js'

export const DEFAULT_HUB_URL = 'https://huggingface.co'

/** Exit codes of the checkpoint jobs (also in their --help). */
export const EXIT = {ok: 0, input: 1, hub: 3, integrity: 4} as const

export interface HubTarget {
  repo: string
  revision?: string
  hubUrl?: string
  token?: string
}

export interface TransferProgress {
  phase: string
  file?: string
  done: number
  total: number
}

export function checkRepoId(repo: string, where = '--repo'): string {
  if (!/^[A-Za-z0-9][A-Za-z0-9._-]*\/[A-Za-z0-9][A-Za-z0-9._-]*$/.test(repo)) throw new PsycheError(`${where} ${repo}: expected NAMESPACE/NAME`, {code: 'EREPO'})
  return repo
}

export function checkToken(token: string | undefined, needed: boolean): string | undefined {
  if (!token) {
    if (needed) throw new PsycheError('no Hub token: pass --token or set HF_TOKEN (a token starts with hf_)', {code: 'ETOKEN'})
    return undefined
  }
  if (!token.startsWith('hf_')) throw new PsycheError('the Hub token does not start with hf_ (from --token or HF_TOKEN)', {code: 'ETOKEN'})
  return token
}

function hubError(error: unknown, what: string): PsycheError {
  if (error instanceof PsycheError) return error
  if (error instanceof HubApiError) return new PsycheError(`${what}: the Hub answered ${error.statusCode}: ${error.message}`, {code: 'EHUB', exitCode: EXIT.hub, cause: error})
  const cause = (error as {cause?: {code?: string; message?: string}})?.cause
  return new PsycheError(`${what}: ${errorMessage(error)}${cause?.message ? ` (${cause.message})` : ''}`, {code: 'EHUB', exitCode: EXIT.hub, cause: error})
}

async function listDir(dir: string, base = dir): Promise<string[]> {
  const out: string[] = []
  for (const entry of await readdir(dir, {withFileTypes: true})) {
    if (entry.name.startsWith('.')) continue // temporary files, .cache, .git
    const path = join(dir, entry.name)
    if (entry.isDirectory()) out.push(...(await listDir(path, base)))
    else if (entry.isFile()) out.push(relative(base, path).split(sep).join('/'))
  }
  return out.sort()
}

export interface UploadResult {
  repo: string
  revision: string
  commit: string
  commit_url: string
  files: {path: string; size: number}[]
  bytes: number
  seconds: number
  sharded: boolean
}

/**
 * Uploads a model directory to a Hub repository as one commit (creating the repository and branch when missing).
 * A model.safetensors bigger than `maxShardBytes` is uploaded as transformers-style shards plus
 * model.safetensors.index.json. The commit names the branch head it builds on (parentCommit), so a concurrent
 * writer makes it fail instead of being overwritten silently.
 */
export async function uploadCheckpoint(
  options: HubTarget & {dir: string; message?: string; maxShardBytes?: number; onProgress?: (p: TransferProgress) => void},
): Promise<UploadResult> {
  const started = performance.now()
  const repo = checkRepoId(options.repo)
  const accessToken = checkToken(options.token, true)!
  const hubUrl = options.hubUrl ?? DEFAULT_HUB_URL
  const revision = options.revision ?? 'main'
  const dir = resolve(options.dir)
  if (!existsSync(dir)) throw new PsycheError(`${options.dir}: no such directory`, {code: 'ENOENT'})
  const paths = await listDir(dir)
  if (paths.length === 0) throw new PsycheError(`${options.dir}: nothing to upload (the directory is empty)`)

  const operations: CommitOperation[] = []
  const files: {path: string; size: number}[] = []
  let sharded = false
  for (const path of paths) {
    const full = join(dir, path)
    const {size} = await stat(full)
    if (path === 'model.safetensors' && options.maxShardBytes !== undefined && size > options.maxShardBytes && !paths.includes('model.safetensors.index.json')) {
      const {shards, index} = await shardSafetensors(full, options.maxShardBytes)
      sharded = true
      for (const shard of shards) {
        operations.push({operation: 'addOrUpdate', path: shard.path, content: shard.content})
        files.push({path: shard.path, size: shard.size})
      }
      const indexBytes = Buffer.from(JSON.stringify(index, null, 2) + '\n')
      operations.push({operation: 'addOrUpdate', path: 'model.safetensors.index.json', content: new Blob([indexBytes])})
      files.push({path: 'model.safetensors.index.json', size: indexBytes.length})
      continue
    }
    operations.push({operation: 'addOrUpdate', path, content: await openAsBlob(full)})
    files.push({path, size})
  }
  const total = files.reduce((a, f) => a + f.size, 0)

  try {
    options.onProgress?.({phase: 'repository', done: 0, total})
    try {
      await createRepo({repo, accessToken, hubUrl})
    } catch (error) {
      if (!(error instanceof HubApiError && error.statusCode === 409)) throw error
    }
    let parent: string
    try {
      parent = (await modelInfo({name: repo, hubUrl, accessToken, revision, additionalFields: ['sha']})).sha
    } catch (error) {
      if (!(error instanceof HubApiError && error.statusCode === 404 && revision !== 'main')) throw error
      await createBranch({repo, hubUrl, accessToken, branch: revision})
      parent = (await modelInfo({name: repo, hubUrl, accessToken, revision, additionalFields: ['sha']})).sha
    }
    // bytes uploaded, counted as each PUT (a whole small file, or one part of a big one) completes
    let done = 0
    const countingFetch: typeof fetch = async (input, init) => {
      const res = await fetch(input, init)
      if (init?.method === 'PUT' && res.ok && init.body instanceof Blob) {
        done += init.body.size
        options.onProgress?.({phase: 'uploading', done: Math.min(done, total), total})
      }
      return res
    }
    const iterator = commitIter({
      repo,
      accessToken,
      hubUrl,
      branch: revision,
      parentCommit: parent,
      title: options.message ?? `psyche checkpoint (${files.length} files)`,
      operations,
      useXet: false,
      fetch: countingFetch,
    })
    let result = await iterator.next()
    while (!result.done) {
      const event = result.value
      if (event.event === 'phase') options.onProgress?.({phase: event.phase, done: Math.min(done, total), total})
      result = await iterator.next()
    }
    const commit = result.value
    if (!commit) throw new PsycheError(`upload to ${repo}: the Hub made no commit`, {exitCode: EXIT.hub})
    options.onProgress?.({phase: 'done', done: total, total})
    return {repo, revision, commit: commit.commit.oid, commit_url: commit.commit.url, files, bytes: total, seconds: (performance.now() - started) / 1000, sharded}
  } catch (error) {
    throw hubError(error, `upload to ${hubUrl} ${repo}@${revision}`)
  }
}

export interface DownloadResult {
  repo: string
  revision: string
  commit: string
  dir: string
  files: {path: string; size: number; cached: boolean}[]
  bytes: number
  downloaded_bytes: number
  seconds: number
}

/** Where the Hub cache lives: --cache-dir, HF_HUB_CACHE, $HF_HOME/hub, or ~/.cache/huggingface/hub (as huggingface_hub). */
export function defaultCacheDir(): string {
  if (process.env.HF_HUB_CACHE) return process.env.HF_HUB_CACHE
  if (process.env.HF_HOME) return join(process.env.HF_HOME, 'hub')
  return join(homedir(), '.cache', 'huggingface', 'hub')
}

function validRelativePath(path: string): boolean {
  return path.length > 0 && !path.startsWith('/') && !path.includes('\\') && path.split('/').every((p) => p !== '' && p !== '.' && p !== '..')
}

/**
 * Downloads one file into the cache's blob store, resuming a `.incomplete` file left by an interrupted download
 * (with a Range request) and checking the whole file against the Hub's hash (sha256 for LFS files, the git blob
 * id otherwise) before renaming it into place. A file that fails the check is deleted and fetched once more.
 */
async function fetchBlob(options: {
  url: string
  blobPath: string
  size: number
  check: {algorithm: 'sha256' | 'git-sha1'; digest: string}
  headers: Record<string, string>
  onBytes: (n: number) => void
}): Promise<number> {
  await mkdir(dirname(options.blobPath), {recursive: true})
  // Clients on one machine share the cache: one process downloads a blob, the others wait for it.
  return withBlobLock(options.blobPath, async () => {
    if ((await stat(options.blobPath).catch(() => undefined))?.size === options.size) return 0
    return fetchBlobLocked(options)
  })
}

/** A lock held this long without the download growing is taken over (its holder died). */
const STALE_LOCK_MS = 60_000

async function withBlobLock<T>(blobPath: string, fn: () => Promise<T>): Promise<T> {
  const lock = `${blobPath}.lock`
  for (;;) {
    try {
      const handle = await open(lock, 'wx')
      await handle.writeFile(String(process.pid))
      await handle.close()
      break
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== 'EEXIST') throw error
      const held = await stat(lock).catch(() => undefined)
      const growing = await stat(`${blobPath}.incomplete`).catch(() => undefined)
      if (held && Date.now() - Math.max(held.mtimeMs, growing?.mtimeMs ?? 0) > STALE_LOCK_MS) await rm(lock, {force: true})
      else await new Promise((resolve) => setTimeout(resolve, 200))
    }
  }
  try {
    return await fn()
  } finally {
    await rm(lock, {force: true})
  }
}

async function fetchBlobLocked(options: Parameters<typeof fetchBlob>[0]): Promise<number> {
  const incomplete = `${options.blobPath}.incomplete`
  let fetched = 0
  for (let attempt = 1; attempt <= 2; attempt++) {
    let have = 0
    try {
      have = (await stat(incomplete)).size
    } catch {}
    if (have > options.size) {
      await rm(incomplete, {force: true})
      have = 0
    }
    if (have > 0) options.onBytes(have)
    if (have < options.size) {
      const res = await fetch(options.url, {headers: {...options.headers, ...(have > 0 ? {Range: `bytes=${have}-`} : {}), 'Accept-Encoding': 'identity'}})
      if (res.status === 200 && have > 0) {
        // the server ignored the range: start over
        await rm(incomplete, {force: true})
        options.onBytes(-have)
        have = 0
      } else if (!(res.status === 200 || res.status === 206)) {
        throw new PsycheError(`GET ${options.url}: HTTP ${res.status} ${res.headers.get('x-error-message') ?? ''}`.trim(), {exitCode: EXIT.hub, code: 'EHUB'})
      }
      if (!res.body) throw new PsycheError(`GET ${options.url}: empty response`, {exitCode: EXIT.hub})
      await pipeline(
        Readable.fromWeb(res.body as import('node:stream/web').ReadableStream<Uint8Array>),
        async function* (chunks: AsyncIterable<Uint8Array>) {
          for await (const chunk of chunks) {
            fetched += chunk.length
            options.onBytes(chunk.length)
            yield chunk
          }
        },
        createWriteStream(incomplete, {flags: have > 0 ? 'a' : 'w'}),
      )
    }
    const hash = createHash(options.check.algorithm === 'sha256' ? 'sha256' : 'sha1')
    const {size} = await stat(incomplete)
    if (options.check.algorithm === 'git-sha1') hash.update(`blob ${size}\0`)
    for await (const chunk of createReadStream(incomplete)) hash.update(chunk as Buffer)
    const digest = hash.digest('hex')
    if (size === options.size && digest === options.check.digest) {
      await rename(incomplete, options.blobPath)
      return fetched
    }
    await rm(incomplete, {force: true})
    options.onBytes(-size)
    if (attempt === 2) {
      throw new PsycheError(
        `${options.url}: downloaded ${size} bytes hashing to ${digest}, the Hub lists ${options.size} bytes with ${options.check.algorithm} ${options.check.digest}`,
        {code: 'EINTEGRITY', exitCode: EXIT.integrity},
      )
    }
  }
  return fetched
}

/**
 * Downloads a revision of a Hub model repository into the cache (huggingface_hub's layout:
 * models--NS--NAME/{blobs,snapshots/COMMIT,refs}) and returns the snapshot directory; with `out`, also places a
 * copy there (hard links where possible), atomically: a temporary directory renamed into place.
 */
export async function downloadCheckpoint(
  options: HubTarget & {out?: string; cacheDir?: string; force?: boolean; onProgress?: (p: TransferProgress) => void},
): Promise<DownloadResult> {
  const started = performance.now()
  const repo = checkRepoId(options.repo)
  const accessToken = checkToken(options.token, false)
  const hubUrl = (options.hubUrl ?? DEFAULT_HUB_URL).replace(/\/+$/, '')
  const revision = options.revision ?? 'main'
  const cacheDir = resolve(options.cacheDir ?? defaultCacheDir())
  const out = options.out ? resolve(options.out) : undefined
  if (out && existsSync(out) && (await readdir(out)).length > 0 && !options.force) {
    throw new PsycheError(`${options.out}: exists and is not empty (use --force to replace it)`, {code: 'EEXIST'})
  }
  const storage = join(cacheDir, `models--${repo.replace('/', '--')}`)
  const headers: Record<string, string> = accessToken ? {Authorization: `Bearer ${accessToken}`} : {}
  let commit: string
  const entries: {path: string; size: number; oid: string; lfs?: {oid: string; size: number}}[] = []
  try {
    commit = (await modelInfo({name: repo, hubUrl, accessToken, revision, additionalFields: ['sha']})).sha
    if (!/^[0-9a-f]{40}$/.test(commit)) throw new PsycheError(`${repo}@${revision}: the Hub gave an invalid commit id`, {exitCode: EXIT.hub})
    for await (const entry of listFiles({repo, hubUrl, accessToken, revision: commit, recursive: true})) {
      if (entry.type !== 'file') continue
      if (!validRelativePath(entry.path)) throw new PsycheError(`${repo}: the Hub lists an unsafe path ${JSON.stringify(entry.path)}`, {exitCode: EXIT.integrity})
      entries.push({path: entry.path, size: entry.size, oid: entry.oid ?? '', lfs: entry.lfs ? {oid: entry.lfs.oid, size: entry.lfs.size} : undefined})
    }
  } catch (error) {
    throw hubError(error, `download from ${hubUrl} ${repo}@${revision}`)
  }
  if (revision !== commit) await writeFileAtomic(join(storage, 'refs', revision), commit)
  const total = entries.reduce((a, e) => a + e.size, 0)
  let done = 0
  let downloaded = 0
  const files: DownloadResult['files'] = []
  const snapshot = join(storage, 'snapshots', commit)
  for (const entry of entries) {
    const etag = entry.lfs?.oid ?? entry.oid
    if (!/^[0-9a-f]{40}([0-9a-f]{24})?$/.test(etag)) throw new PsycheError(`${repo}: ${entry.path} has an invalid hash ${etag}`, {exitCode: EXIT.integrity})
    const blobPath = join(storage, 'blobs', etag)
    const cached = existsSync(blobPath)
    if (!cached) {
      const url = `${hubUrl}/${repo}/resolve/${commit}/${entry.path.split('/').map(encodeURIComponent).join('/')}`
      try {
        downloaded += await fetchBlob({
          url,
          blobPath,
          size: entry.size,
          check: entry.lfs ? {algorithm: 'sha256', digest: entry.lfs.oid} : {algorithm: 'git-sha1', digest: entry.oid},
          headers,
          onBytes: (n) => {
            done += n
            options.onProgress?.({phase: 'downloading', file: entry.path, done, total})
          },
        })
      } catch (error) {
        throw hubError(error, `download ${entry.path} from ${repo}@${revision}`)
      }
    } else {
      done += entry.size
      options.onProgress?.({phase: 'cached', file: entry.path, done, total})
    }
    const pointer = join(snapshot, entry.path)
    if (!existsSync(pointer)) {
      await mkdir(dirname(pointer), {recursive: true})
      await linkOrCopy(blobPath, pointer)
    }
    files.push({path: entry.path, size: entry.size, cached})
  }
  let dir = snapshot
  if (out) {
    await mkdir(dirname(out), {recursive: true})
    const tmp = `${out}.tmp-${process.pid}-${Date.now()}`
    await mkdir(tmp, {recursive: true})
    try {
      for (const entry of entries) {
        await mkdir(dirname(join(tmp, entry.path)), {recursive: true})
        await linkOrCopy(join(storage, 'blobs', entry.lfs?.oid ?? entry.oid), join(tmp, entry.path))
      }
      await writeFile(join(tmp, '.hub-revision.json'), JSON.stringify({repo, revision, commit, hub_url: hubUrl}) + '\n')
      if (existsSync(out)) {
        const old = `${out}.old-${process.pid}-${Date.now()}`
        await rename(out, old)
        await rename(tmp, out)
        await rm(old, {recursive: true, force: true})
      } else await rename(tmp, out)
    } catch (error) {
      await rm(tmp, {recursive: true, force: true})
      throw error
    }
    dir = out
  }
  options.onProgress?.({phase: 'done', done: total, total})
  return {repo, revision, commit, dir, files, bytes: total, downloaded_bytes: downloaded, seconds: (performance.now() - started) / 1000}
}

async function linkOrCopy(from: string, to: string): Promise<void> {
  try {
    await link(from, to)
  } catch {
    const tmp = `${to}.tmp-${process.pid}`
    await copyFile(from, tmp)
    await rename(tmp, to)
  }
}

/** Parses a size like 500MB, 2GB, 10MiB or a plain byte count. */
export function parseSize(text: string, what: string): number {
  const m = /^\s*(\d+(?:\.\d+)?)\s*(b|kb|mb|gb|tb|kib|mib|gib|tib)?\s*$/i.exec(text)
  if (!m) throw new PsycheError(`${what}: ${text} is not a size (e.g. 5GB, 500MiB, 1048576)`)
  const units: Record<string, number> = {b: 1, kb: 1e3, mb: 1e6, gb: 1e9, tb: 1e12, kib: 1024, mib: 1024 ** 2, gib: 1024 ** 3, tib: 1024 ** 4}
  const bytes = Math.floor(Number(m[1]) * units[(m[2] ?? 'b').toLowerCase()]!)
  if (bytes < 1) throw new PsycheError(`${what}: ${text} is too small`)
  return bytes
}
