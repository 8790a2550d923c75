import {createHash} from 'node:crypto'
import {createReadStream, createWriteStream, existsSync, openAsBlob} from 'node:fs'
import {copyFile, link, mkdir, open, readdir, rename, rm, stat, statfs} from 'node:fs/promises'
import {homedir} from 'node:os'
import {dirname, join, relative, resolve, sep} from 'node:path'
import {Readable} from 'node:stream'
import {pipeline} from 'node:stream/promises'
import type {CommitOperation} from '@huggingface/hub'
import {PsycheError, errorMessage} from '../errors.js'
import {shardSafetensors} from './safetensors.js'
import {writeFileAtomic} from './store.js'

export const DEFAULT_HUB_URL = 'https://huggingface.co'

/** Exit codes of the checkpoint jobs (also in their --help). */
const EXIT = {ok: 0, input: 1, hub: 3, integrity: 4} as const

interface HubTarget {
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

/** What a transfer is doing, for people (the phase names are the --json interface and the Hub library's). */
const PHASE_LABELS: Record<string, string> = {
  repository: 'preparing the repository',
  preuploading: 'checking what the Hub already has',
  uploadingLargeFiles: 'uploading',
  uploading: 'uploading',
  committing: 'committing',
  downloading: 'downloading',
  cached: 'already downloaded',
  done: 'done',
}

/** A progress line: "uploading: 12.0 / 80.0 MB", "downloading model.safetensors: 1.5 / 80.0 MB". */
export function transferLabel(p: TransferProgress): string {
  const label = PHASE_LABELS[p.phase] ?? p.phase.replace(/([a-z])([A-Z])/g, '$1 $2').toLowerCase()
  return `${label}${p.file ? ` ${p.file}` : ''}: ${(p.done / 1e6).toFixed(1)} / ${(p.total / 1e6).toFixed(1)} MB`
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

// The Hub client library (a few hundred ms to load) is loaded by the first transfer, not by every command that
// imports this module (join checks its --hub-* flags with checkRepoId/checkToken).
type HubLib = typeof import('@huggingface/hub')
let hubLib: HubLib | undefined
async function loadHub(): Promise<HubLib> {
  hubLib ??= await import('@huggingface/hub')
  return hubLib
}
const isHubApiError = (error: unknown, status?: number): error is InstanceType<HubLib['HubApiError']> =>
  hubLib !== undefined && error instanceof hubLib.HubApiError && (status === undefined || error.statusCode === status)

function hubError(error: unknown, what: string): PsycheError {
  if (error instanceof PsycheError) return error
  if (isHubApiError(error)) return new PsycheError(`${what}: the Hub answered ${error.statusCode}: ${error.message}`, {code: 'EHUB', exitCode: EXIT.hub, cause: error})
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
  const {commitIter, createBranch, createRepo, modelInfo} = await loadHub()
  const started = performance.now()
  const repo = checkRepoId(options.repo)
  const accessToken = checkToken(options.token, true)!
  const hubUrl = options.hubUrl ?? DEFAULT_HUB_URL
  const revision = checkRevision(options.revision ?? 'main')
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
      if (!isHubApiError(error, 409)) throw error
    }
    let parent: string
    try {
      parent = (await modelInfo({name: repo, hubUrl, accessToken, revision, additionalFields: ['sha']})).sha
    } catch (error) {
      if (!(isHubApiError(error, 404) && revision !== 'main')) throw error
      await createBranch({repo, hubUrl, accessToken, branch: revision})
      parent = (await modelInfo({name: repo, hubUrl, accessToken, revision, additionalFields: ['sha']})).sha
    }
    // bytes uploaded, counted as each PUT (a whole small file, or one part of a big one) completes
    let done = 0
    const hubOrigin = new URL(hubUrl).origin
    const countingFetch: typeof fetch = async (input, init) => {
      // the token goes to the Hub only, never to where it sends the bytes (a storage bucket's signed URL)
      const target = new URL(input instanceof Request ? input.url : String(input))
      if (target.origin !== hubOrigin && init?.headers) {
        const headers = new Headers(init.headers)
        headers.delete('authorization')
        init = {...init, headers}
      }
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
function defaultCacheDir(): string {
  if (process.env.HF_HUB_CACHE) return process.env.HF_HUB_CACHE
  if (process.env.HF_HOME) return join(process.env.HF_HOME, 'hub')
  return join(homedir(), '.cache', 'huggingface', 'hub')
}

/** Bounds on what a Hub may make the client hold or do (a hostile or broken Hub meets them, never the disk or the heap). */
export const HUB_LIMITS = {
  /** bytes of one JSON answer (model info, one page of the file listing) */
  jsonBytes: 32 * 1024 * 1024,
  /** pages of one file listing (Link: rel="next") */
  pages: 1000,
  /** files in one revision */
  files: 100_000,
  /** redirects followed by one request */
  redirects: 5,
  /** a request that sends nothing for this long is given up */
  idleMs: 60_000,
}

/**
 * A revision as git allows it (`git check-ref-format`: a branch, tag or `refs/pr/N`) or a commit id. It names a
 * file under the cache's refs/, so anything that could leave that directory (`..`, a leading `/`) is refused.
 */
export function checkRevision(revision: string, where = '--revision'): string {
  const bad = (why: string) => new PsycheError(`${where} ${JSON.stringify(revision)}: not a git branch, tag or commit id (${why})`, {code: 'EREVISION'})
  if (typeof revision !== 'string' || revision.length === 0) throw bad('empty')
  if (Buffer.byteLength(revision) > 255) throw bad('longer than 255 bytes')
  // eslint-disable-next-line no-control-regex
  if (/[\x00-\x20\x7f~^:?*[\\]/.test(revision)) throw bad('a space, control character or one of ~^:?*[\\')
  if (revision.includes('..') || revision.includes('@{') || revision === '@') throw bad('".." or "@{"')
  if (revision.startsWith('/') || revision.endsWith('/') || revision.includes('//')) throw bad('an empty path component')
  if (revision.endsWith('.')) throw bad('ends with "."')
  for (const part of revision.split('/')) if (part.startsWith('.') || part.endsWith('.lock')) throw bad(`component "${part}" starts with "." or ends with ".lock"`)
  return revision
}

/** Names psyche writes itself in a downloaded directory: a repository that lists one is refused. */
const RESERVED_NAMES = new Set(['.hub-revision.json'])

/**
 * Why a path listed by the Hub cannot be written as a file here, or undefined when it can: a relative path of
 * plain components, each at most 255 bytes (the limit of Linux file systems), without NUL or control characters.
 */
function unsafePathReason(path: unknown): string | undefined {
  if (typeof path !== 'string' || path.length === 0) return 'an empty or missing name'
  if (Buffer.byteLength(path) > 4096) return 'longer than 4096 bytes'
  if (path.includes('\0')) return 'a NUL character'
  // eslint-disable-next-line no-control-regex
  if (/[\x01-\x1f\x7f]/.test(path)) return 'a control character'
  if (path.startsWith('/') || path.includes('\\')) return 'an absolute path or a backslash'
  for (const part of path.split('/')) {
    if (part === '' || part === '.' || part === '..') return `a "${part}" component`
    if (Buffer.byteLength(part) > 255) return `a component longer than 255 bytes`
  }
  if (RESERVED_NAMES.has(path)) return `a name psyche reserves for itself`
  return undefined
}

function integrity(message: string): PsycheError {
  return new PsycheError(message, {code: 'EINTEGRITY', exitCode: EXIT.integrity})
}

/** Text from the Hub shown to the user: printable, one line, bounded. */
function printable(text: string, max = 300): string {
  // eslint-disable-next-line no-control-regex
  const clean = text.replace(/[\x00-\x1f\x7f]+/g, ' ').trim()
  return clean.length > max ? `${clean.slice(0, max)}…` : clean
}

/**
 * One HTTP request to the Hub, or to where it redirects: the token goes to the Hub's own origin only (a redirect
 * elsewhere, like the Hub's CDN, is followed without it), at most HUB_LIMITS.redirects redirects, and only
 * http(s). `sameOrigin` refuses any answer from another origin (API calls).
 */
async function hubFetch(
  url: string,
  options: {hubOrigin: string; token?: string; headers?: Record<string, string>; sameOrigin?: boolean; signal?: AbortSignal},
): Promise<Response> {
  let current = new URL(url)
  for (let hop = 0; ; hop++) {
    if (current.protocol !== 'http:' && current.protocol !== 'https:')
      throw new PsycheError(`the Hub pointed to ${printable(current.href)}: not http(s)`, {code: 'EHUB', exitCode: EXIT.hub})
    const own = current.origin === options.hubOrigin
    if (options.sameOrigin && !own) throw new PsycheError(`the Hub pointed to another origin (${printable(current.origin)}); refused`, {code: 'EHUB', exitCode: EXIT.hub})
    const headers = {...options.headers, ...(own && options.token ? {Authorization: `Bearer ${options.token}`} : {})}
    const res = await fetch(current, {headers, redirect: 'manual', signal: options.signal})
    if (![301, 302, 303, 307, 308].includes(res.status)) return res
    await res.body?.cancel()
    if (hop >= HUB_LIMITS.redirects) throw new PsycheError(`${current.href}: more than ${HUB_LIMITS.redirects} redirects`, {code: 'EHUB', exitCode: EXIT.hub})
    const location = res.headers.get('location')
    if (!location) throw new PsycheError(`${current.href}: a redirect without a Location`, {code: 'EHUB', exitCode: EXIT.hub})
    current = new URL(location, current)
  }
}

/** The answer's body, at most `limit` bytes (the Content-Length is not trusted: the count is). */
async function readLimited(res: Response, limit: number, what: string): Promise<Buffer> {
  const declared = Number(res.headers.get('content-length') ?? 'NaN')
  if (declared > limit) {
    await res.body?.cancel()
    throw new PsycheError(`${what}: the Hub's answer has ${declared} bytes, more than the ${limit} allowed`, {code: 'EHUB', exitCode: EXIT.hub})
  }
  const chunks: Buffer[] = []
  let size = 0
  if (res.body) {
    for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
      size += chunk.length
      if (size > limit) {
        await res.body.cancel().catch(() => undefined)
        throw new PsycheError(`${what}: the Hub's answer is longer than the ${limit} bytes allowed`, {code: 'EHUB', exitCode: EXIT.hub})
      }
      chunks.push(Buffer.from(chunk))
    }
  }
  return Buffer.concat(chunks)
}

async function hubError404(res: Response, what: string): Promise<PsycheError> {
  let message = res.headers.get('x-error-message') ?? ''
  if (!message) {
    const body = await readLimited(res, 64 * 1024, what).catch(() => Buffer.alloc(0))
    try {
      const parsed = JSON.parse(body.toString('utf8')) as {error?: unknown}
      if (typeof parsed.error === 'string') message = parsed.error
    } catch {
      message = body.toString('utf8')
    }
  } else await res.body?.cancel()
  return new PsycheError(`${what}: the Hub answered ${res.status}: ${printable(message || res.statusText)}`, {code: 'EHUB', exitCode: EXIT.hub})
}

/** GET of a JSON document from the Hub's API (same origin, bounded size and time). */
async function hubJson(url: string, options: {hubOrigin: string; token?: string}, what: string): Promise<{value: unknown; link: string | null}> {
  let res: Response
  try {
    res = await hubFetch(url, {...options, sameOrigin: true, headers: {Accept: 'application/json'}, signal: AbortSignal.timeout(HUB_LIMITS.idleMs)})
  } catch (error) {
    throw hubError(error, what)
  }
  if (!res.ok) throw await hubError404(res, what)
  const body = await readLimited(res, HUB_LIMITS.jsonBytes, what)
  try {
    return {value: JSON.parse(body.toString('utf8')) as unknown, link: res.headers.get('link')}
  } catch {
    throw new PsycheError(`${what}: the Hub's answer is not JSON`, {code: 'EHUB', exitCode: EXIT.hub})
  }
}

/** The `rel="next"` target of a Link header, or undefined. */
function nextLink(header: string | null): string | undefined {
  if (!header) return undefined
  for (const part of header.slice(0, 64 * 1024).split(',')) {
    const m = /^\s*<([^>]*)>\s*;(.*)$/.exec(part)
    if (m && /(^|;)\s*rel="?next"?\s*(;|$)/.test(m[2]!)) return m[1]
  }
  return undefined
}

interface HubEntry {
  path: string
  size: number
  oid: string
  lfs?: {oid: string; size: number}
}

/**
 * Lists the files of a commit: the tree API, paged by Link headers that must stay on the Hub's origin, never
 * revisit a page, and end within HUB_LIMITS.pages pages and HUB_LIMITS.files files. Each entry is checked: a
 * name that cannot be a file here (see unsafePathReason), a duplicate, a file that is also a directory, or a
 * size or hash of the wrong shape refuses the whole revision (exit 4).
 */
async function listCommitFiles(options: {hubUrl: string; hubOrigin: string; token?: string; repo: string; commit: string; kind: RepoKind}): Promise<HubEntry[]> {
  const {repo, commit} = options
  const what = `list ${repo}@${commit}`
  let url: string | undefined = `${options.hubUrl}/api/${REPO_KINDS[options.kind].api}/${repo}/tree/${commit}?recursive=true&expand=false`
  const seen = new Set<string>()
  const entries: HubEntry[] = []
  const files = new Set<string>()
  const dirs = new Set<string>()
  while (url) {
    if (seen.size >= HUB_LIMITS.pages) throw new PsycheError(`${what}: more than ${HUB_LIMITS.pages} pages`, {code: 'EHUB', exitCode: EXIT.hub})
    const href = new URL(url, options.hubUrl)
    if (href.origin !== options.hubOrigin)
      throw new PsycheError(`${what}: the next page is on another origin (${printable(href.origin)}); refused`, {code: 'EHUB', exitCode: EXIT.hub})
    if (seen.has(href.href)) throw new PsycheError(`${what}: the pages loop (${printable(href.href)} again)`, {code: 'EHUB', exitCode: EXIT.hub})
    seen.add(href.href)
    const {value, link} = await hubJson(href.href, options, what)
    if (!Array.isArray(value)) throw new PsycheError(`${what}: the Hub's listing is not a list`, {code: 'EHUB', exitCode: EXIT.hub})
    for (const raw of value as unknown[]) {
      if (typeof raw !== 'object' || raw === null) throw integrity(`${repo}: the Hub lists an entry that is not an object`)
      const item = raw as {type?: unknown; path?: unknown; size?: unknown; oid?: unknown; lfs?: unknown}
      if (item.type !== 'file') continue
      const reason = unsafePathReason(item.path)
      const shown = typeof item.path === 'string' ? JSON.stringify(printable(item.path, 120)) : String(item.path)
      if (reason) throw integrity(`${repo}@${commit}: the Hub lists ${shown}, refused: ${reason}`)
      const path = item.path as string
      if (typeof item.size !== 'number' || !Number.isSafeInteger(item.size) || item.size < 0) throw integrity(`${repo}@${commit}: ${shown} has an invalid size`)
      let lfs: HubEntry['lfs']
      if (item.lfs !== undefined && item.lfs !== null) {
        const l = item.lfs as {oid?: unknown; size?: unknown}
        if (typeof l.oid !== 'string' || !/^[0-9a-f]{64}$/.test(l.oid) || l.size !== item.size) throw integrity(`${repo}@${commit}: ${shown} has an invalid LFS oid or size`)
        lfs = {oid: l.oid, size: item.size}
      }
      const oid = typeof item.oid === 'string' ? item.oid : ''
      if (!lfs && !/^[0-9a-f]{40}$/.test(oid)) throw integrity(`${repo}@${commit}: ${shown} has an invalid hash`)
      if (files.has(path)) throw integrity(`${repo}@${commit}: the Hub lists ${shown} twice`)
      if (dirs.has(path)) throw integrity(`${repo}@${commit}: ${shown} is both a file and a directory`)
      const parts = path.split('/')
      for (let i = 1; i < parts.length; i++) {
        const dir = parts.slice(0, i).join('/')
        if (files.has(dir)) throw integrity(`${repo}@${commit}: ${JSON.stringify(printable(dir, 120))} is both a file and a directory`)
        dirs.add(dir)
      }
      files.add(path)
      entries.push({path, size: item.size, oid, lfs})
      if (entries.length > HUB_LIMITS.files) throw integrity(`${repo}@${commit}: more than ${HUB_LIMITS.files} files`)
    }
    url = nextLink(link)
  }
  return entries
}

/**
 * Downloads one file into the cache's blob store, resuming a `.incomplete` file left by an interrupted download
 * (with a Range request) and checking the whole file against the Hub's hash (sha256 for LFS files, the git blob
 * id otherwise) before renaming it into place. A file that fails the check is deleted and fetched once more.
 * The Hub's listing declares the size: no more bytes than that are ever written.
 */
async function fetchBlob(options: {
  url: string
  hubOrigin: string
  token?: string
  blobPath: string
  size: number
  check: {algorithm: 'sha256' | 'git-sha1'; digest: string}
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
      const abort = new AbortController()
      let idle: NodeJS.Timeout | undefined
      const touch = () => {
        clearTimeout(idle)
        idle = setTimeout(
          () => abort.abort(new PsycheError(`GET ${options.url}: nothing received for ${HUB_LIMITS.idleMs / 1000} s`, {code: 'EHUB', exitCode: EXIT.hub})),
          HUB_LIMITS.idleMs,
        )
      }
      touch()
      try {
        const res = await hubFetch(options.url, {
          hubOrigin: options.hubOrigin,
          token: options.token,
          headers: {...(have > 0 ? {Range: `bytes=${have}-`} : {}), 'Accept-Encoding': 'identity'},
          signal: abort.signal,
        })
        if (res.status === 206 && have > 0) {
          // a partial answer must continue exactly where the file stops
          const range = /^bytes (\d+)-(\d+)\/(\d+|\*)$/.exec(res.headers.get('content-range') ?? '')
          if (!range || Number(range[1]) !== have) {
            await res.body?.cancel()
            throw integrity(`GET ${options.url}: the Hub answered the range from ${have} with ${printable(res.headers.get('content-range') ?? 'no Content-Range')}`)
          }
        } else if (res.status === 200 && have > 0) {
          // the server ignored the range: start over
          await rm(incomplete, {force: true})
          options.onBytes(-have)
          have = 0
        } else if (res.status !== 200) {
          await res.body?.cancel()
          throw new PsycheError(`GET ${options.url}: HTTP ${res.status} ${printable(res.headers.get('x-error-message') ?? '')}`.trim(), {exitCode: EXIT.hub, code: 'EHUB'})
        }
        const remaining = options.size - have
        const declared = Number(res.headers.get('content-length') ?? 'NaN')
        if (declared > remaining) {
          await res.body?.cancel()
          throw integrity(`GET ${options.url}: the Hub sends ${declared} bytes, its listing declares ${remaining} more`)
        }
        if (!res.body) throw new PsycheError(`GET ${options.url}: empty response`, {exitCode: EXIT.hub})
        let written = 0
        await pipeline(
          Readable.fromWeb(res.body as import('node:stream/web').ReadableStream<Uint8Array>),
          async function* (chunks: AsyncIterable<Uint8Array>) {
            for await (const chunk of chunks) {
              touch()
              if (written + chunk.length > remaining) throw integrity(`GET ${options.url}: the Hub sent more than the ${options.size} bytes its listing declares`)
              written += chunk.length
              fetched += chunk.length
              options.onBytes(chunk.length)
              yield chunk
            }
          },
          createWriteStream(incomplete, {flags: have > 0 ? 'a' : 'w'}),
        )
      } catch (error) {
        if ((error as PsycheError).code === 'EINTEGRITY') await rm(incomplete, {force: true})
        throw abort.signal.aborted && abort.signal.reason instanceof PsycheError ? abort.signal.reason : error
      } finally {
        clearTimeout(idle)
      }
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
      throw integrity(`${options.url}: downloaded ${size} bytes hashing to ${digest}, the Hub lists ${options.size} bytes with ${options.check.algorithm} ${options.check.digest}`)
    }
  }
  return fetched
}

/** Bytes free for an unprivileged writer on the file system that holds `path` (or its nearest existing parent). */
async function freeBytes(path: string): Promise<number | undefined> {
  let dir = path
  for (;;) {
    try {
      const s = await statfs(dir)
      return s.bavail * s.bsize
    } catch {
      const up = dirname(dir)
      if (up === dir) return undefined
      dir = up
    }
  }
}

/**
 * Downloads a revision of a Hub model repository into the cache (huggingface_hub's layout:
 * models--NS--NAME/{blobs,snapshots/COMMIT,refs}) and returns the snapshot directory; with `out`, also places a
 * copy there (hard links where possible), atomically: a temporary directory renamed into place.
 *
 * Nothing the Hub says is trusted: the revision is checked before it names a file, every listed name before it
 * becomes one, every byte against the declared size and hash, and the token goes to the Hub's origin only.
 */
export async function downloadCheckpoint(
  options: HubTarget & {out?: string; cacheDir?: string; force?: boolean; onProgress?: (p: TransferProgress) => void},
): Promise<DownloadResult> {
  return downloadRepo('model', options)
}

/**
 * Downloads the Parquet files of a revision of a Hub dataset repository (Psyche's `Preprocessed` data location names
 * one) into the cache (datasets--NS--NAME/...), with every check of downloadCheckpoint, and returns the snapshot
 * directory. Nothing else of the repository is fetched: a README or a script is never needed to train.
 */
export async function downloadDataset(options: HubTarget & {cacheDir?: string; onProgress?: (p: TransferProgress) => void}): Promise<DownloadResult> {
  return downloadRepo('dataset', options, (path) => path.endsWith('.parquet'))
}

/** Where the Hub keeps each kind of repository: its API path, its file URLs' prefix, the cache's folder prefix. */
type RepoKind = 'model' | 'dataset'
const REPO_KINDS: Record<RepoKind, {api: string; files: string; cache: string}> = {
  model: {api: 'models', files: '', cache: 'models'},
  dataset: {api: 'datasets', files: '/datasets', cache: 'datasets'},
}

async function downloadRepo(
  kind: RepoKind,
  options: HubTarget & {out?: string; cacheDir?: string; force?: boolean; onProgress?: (p: TransferProgress) => void},
  include: (path: string) => boolean = () => true,
): Promise<DownloadResult> {
  const paths = REPO_KINDS[kind]
  const started = performance.now()
  const repo = checkRepoId(options.repo)
  const accessToken = checkToken(options.token, false)
  const hubUrl = (options.hubUrl ?? DEFAULT_HUB_URL).replace(/\/+$/, '')
  let hubOrigin: string
  try {
    hubOrigin = new URL(hubUrl).origin
  } catch {
    throw new PsycheError(`${hubUrl}: not a Hub URL`, {code: 'EHUB'})
  }
  const revision = checkRevision(options.revision ?? 'main')
  const cacheDir = resolve(options.cacheDir ?? defaultCacheDir())
  const out = options.out ? resolve(options.out) : undefined
  if (out && existsSync(out) && (await readdir(out)).length > 0 && !options.force) {
    throw new PsycheError(`${options.out}: exists and is not empty (use --force to replace it)`, {code: 'EEXIST'})
  }
  const storage = join(cacheDir, `${paths.cache}--${repo.replace('/', '--')}`)
  const http = {hubOrigin, token: accessToken}
  const info = await hubJson(`${hubUrl}/api/${paths.api}/${repo}/revision/${encodeURIComponent(revision)}`, http, `download from ${hubUrl} ${repo}@${revision}`)
  const commit = (info.value as {sha?: unknown} | null)?.sha
  if (typeof commit !== 'string' || !/^[0-9a-f]{40}$/.test(commit))
    throw new PsycheError(`${repo}@${revision}: the Hub gave an invalid commit id`, {code: 'EHUB', exitCode: EXIT.hub})
  const entries = (await listCommitFiles({hubUrl, ...http, repo, commit, kind})).filter((e) => include(e.path))
  const missing = entries.filter((e) => !existsSync(join(storage, 'blobs', e.lfs?.oid ?? e.oid))).reduce((a, e) => a + e.size, 0)
  const free = await freeBytes(cacheDir)
  if (free !== undefined && missing > free) {
    throw new PsycheError(`${repo}@${commit}: ${missing} bytes to download, ${free} free in ${cacheDir}`, {code: 'ENOSPC', exitCode: EXIT.hub})
  }
  if (revision !== commit) await writeFileAtomic(join(storage, 'refs', revision), commit)
  const total = entries.reduce((a, e) => a + e.size, 0)
  let done = 0
  let downloaded = 0
  const files: DownloadResult['files'] = []
  const snapshot = join(storage, 'snapshots', commit)
  for (const entry of entries) {
    const etag = entry.lfs?.oid ?? entry.oid
    const blobPath = join(storage, 'blobs', etag)
    const cached = existsSync(blobPath)
    if (!cached) {
      const url = `${hubUrl}${paths.files}/${repo}/resolve/${commit}/${entry.path.split('/').map(encodeURIComponent).join('/')}`
      try {
        downloaded += await fetchBlob({
          url,
          ...http,
          blobPath,
          size: entry.size,
          check: entry.lfs ? {algorithm: 'sha256', digest: entry.lfs.oid} : {algorithm: 'git-sha1', digest: entry.oid},
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
      // a new file renamed into place: never a write through a hard link into the cache
      await writeFileAtomic(join(tmp, '.hub-revision.json'), JSON.stringify({repo, revision, commit, hub_url: hubUrl}) + '\n')
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
