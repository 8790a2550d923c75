import {createHash, randomBytes} from 'node:crypto'
import {createReadStream, createWriteStream} from 'node:fs'
import {mkdir, readFile, readdir, rename, rm, stat} from 'node:fs/promises'
import {createServer, type IncomingMessage, type Server, type ServerResponse} from 'node:http'
import type {AddressInfo} from 'node:net'
import {join} from 'node:path'
import {pipeline} from 'node:stream/promises'
import {ObjectStore, StoreError, gitBlobOid, lfsPointer, writeFileAtomic} from './store.js'

/**
 * A small Hugging Face Hub API server for tests and development (`psyche hub serve`): model repositories with
 * branches and commits, the git-LFS batch API (basic and multipart uploads), the NDJSON commit API and file
 * resolution with ranges. It implements the routes that @huggingface/hub 2.17 and Python huggingface_hub call
 * (no Xet: the batch reply never chooses it, so clients fall back to LFS). Everything is stored on disk under
 * `root`: content-addressed objects, commits as JSON, branch refs as files, each written atomically.
 */

/** A write token: `hf_…` alone (it owns the namespaces it is first to write to), or bound to a namespace. */
export type HubToken = string | {token: string; user: string}

interface HubServerOptions {
  root: string
  host?: string
  port?: number
  /**
   * Tokens accepted for writes; when absent any token that starts with `hf_` is. A token writes only to its own
   * namespaces: the one it is bound to (`{token, user}`), else those it was first to write to. Public
   * repositories need no token to read; private ones are readable by their namespace's tokens only.
   */
  tokens?: HubToken[]
  /** Biggest file (LFS object) a client may declare, in bytes. */
  maxFileSize?: number
  /** Most parts of one multipart upload (the part size grows to keep within it, as S3's 10,000). */
  maxParts?: number
  /** Biggest JSON or NDJSON request body (commits carry small files inline), in bytes. */
  maxBodyBytes?: number
  /** An upload that sees no request for this long expires, and its parts are deleted (ms). */
  uploadTtlMs?: number
  /** Unfinished uploads the server keeps at once (across all tokens). */
  maxPendingUploads?: number
  /** Open connections at once. */
  maxConnections?: number
  /** Files at least this big (or binary, or matched by an LFS pattern) are uploaded through LFS. */
  lfsThreshold?: number
  /** LFS objects bigger than this are uploaded in parts (multipart with chunk_size). */
  multipartThreshold?: number
  chunkSize?: number
  /** Entries per page of the tree listing (paged by a Link header). */
  treePageSize?: number
  log?: (line: string) => void
}

interface FileEntry {
  size: number
  sha256: string
  /** git blob id of what git stores: the content, or the LFS pointer */
  gitOid: string
  lfs: boolean
  lastCommit: string
}

interface Commit {
  id: string
  parents: string[]
  title: string
  message: string
  date: string
  files: Record<string, FileEntry>
}

const LFS_PATTERNS = [
  /\.safetensors$/,
  /\.bin$/,
  /\.pt$/,
  /\.pth$/,
  /\.ckpt$/,
  /\.h5$/,
  /\.msgpack$/,
  /\.onnx$/,
  /\.npy$/,
  /\.npz$/,
  /\.zip$/,
  /\.tar(\.gz)?$/,
  /\.gz$/,
  /\.pkl$/,
  /\.parquet$/,
  /\.arrow$/,
]
const GITATTRIBUTES = LFS_PATTERNS.map((p) => `*${p.source.replace(/\\/g, '').replace(/\$$/, '').replace('(.gz)?', '')} filter=lfs diff=lfs merge=lfs -text`).join('\n') + '\n'
const NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$/
const DATASET_PREFIX = 'datasets/'

/** The namespace that owns a repository key (see HubServer.repoId). */
function namespaceOf(repo: string): string {
  return (repo.startsWith(DATASET_PREFIX) ? repo.slice(DATASET_PREFIX.length) : repo).split('/')[0]!
}

/** The id the Hub shows for a repository key: NS/NAME for either kind. */
function shownId(repo: string): string {
  return repo.startsWith(DATASET_PREFIX) ? repo.slice(DATASET_PREFIX.length) : repo
}
const SHA256 = /^[0-9a-f]{64}$/
const COMMIT_ID = /^[0-9a-f]{40}$/
/** Objects in one LFS batch request. */
const MAX_BATCH_OBJECTS = 1000

/** The defaults of the bounds (each has a `psyche hub serve` flag). */
export const HUB_SERVER_DEFAULTS = {
  maxFileSize: 50 * 1024 ** 3,
  maxParts: 10_000,
  maxBodyBytes: 64 * 1024 ** 2,
  uploadTtlMs: 60 * 60 * 1000,
  maxPendingUploads: 1000,
  maxConnections: 512,
}

interface Upload {
  repo: string
  oid: string
  size: number
  parts: number
  chunkSize: number
  dir: string
  multipart: boolean
  /** when it expires unless a request touches it (ms since the epoch) */
  expires: number
  /** requests in flight (an upload is never expired under one) */
  busy: number
}

function sha256Hex(text: string): string {
  return createHash('sha256').update(text).digest('hex')
}

class HttpError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly code?: string,
  ) {
    super(message)
  }
}

function validPath(path: string): boolean {
  if (path.length === 0 || path.length > 1000 || path.startsWith('/') || path.endsWith('/') || path.includes('\\') || path.includes('\0')) return false
  return path.split('/').every((part) => part !== '' && part !== '.' && part !== '..')
}

export class HubServer {
  private server: Server | undefined
  private readonly store: ObjectStore
  private readonly locks = new Map<string, Promise<unknown>>()
  private readonly uploads = new Map<string, Upload>()
  private sweeper: NodeJS.Timeout | undefined
  readonly options: Required<Omit<HubServerOptions, 'tokens' | 'log'>> & Pick<HubServerOptions, 'tokens' | 'log'>

  constructor(options: HubServerOptions) {
    this.options = {
      host: '127.0.0.1',
      port: 0,
      lfsThreshold: 10 * 1024 * 1024,
      multipartThreshold: 64 * 1024 * 1024,
      chunkSize: 16 * 1024 * 1024,
      treePageSize: 1000,
      ...HUB_SERVER_DEFAULTS,
      ...options,
    }
    this.store = new ObjectStore(options.root)
  }

  static async start(options: HubServerOptions): Promise<HubServer> {
    const hub = new HubServer(options)
    await hub.listen()
    return hub
  }

  get url(): string {
    const address = this.server?.address() as AddressInfo | null
    if (!address) throw new Error('hub server is not listening')
    return `http://${address.address.includes(':') ? `[${address.address}]` : address.address}:${address.port}`
  }

  get port(): number {
    return (this.server?.address() as AddressInfo).port
  }

  async listen(): Promise<void> {
    await mkdir(join(this.options.root, 'repos'), {recursive: true})
    // leftovers of an interrupted upload are never part of the store
    await rm(join(this.options.root, 'tmp'), {recursive: true, force: true})
    this.server = createServer((req, res) => {
      this.handle(req, res).catch((error: unknown) => this.fail(res, error))
    })
    this.server.keepAliveTimeout = 5000
    this.server.maxConnections = this.options.maxConnections
    this.sweeper = setInterval(() => void this.expireUploads(), Math.min(60_000, Math.max(100, this.options.uploadTtlMs / 4)))
    this.sweeper.unref()
    await new Promise<void>((resolve, reject) => {
      this.server!.once('error', reject)
      this.server!.listen(this.options.port, this.options.host, () => resolve())
    })
  }

  async close(): Promise<void> {
    if (!this.server) return
    const server = this.server
    this.server = undefined
    clearInterval(this.sweeper)
    server.closeAllConnections()
    await new Promise<void>((resolve) => server.close(() => resolve()))
  }

  // ----------------------------------------------------------------------------------------------- routing

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const target = req.url ?? '/'
    let url: URL
    try {
      if (!target.startsWith('/')) throw new Error('not a path')
      url = new URL(`http://hub.invalid${target}`)
    } catch {
      throw new HttpError(400, `bad request target ${target.slice(0, 100)}`)
    }
    const segments = url.pathname
      .split('/')
      .slice(1)
      .map((s) => {
        try {
          return decodeURIComponent(s)
        } catch {
          throw new HttpError(400, `bad percent-encoding in the path: ${s.slice(0, 100)}`)
        }
      })
    const method = req.method ?? 'GET'
    this.options.log?.(`${method} ${url.pathname}${url.search}`)
    const base = this.baseUrl(req)

    if (segments[0] === 'api') {
      if (method === 'POST' && segments[1] === 'repos' && segments[2] === 'create') return this.createRepo(req, res, base)
      if (method === 'GET' && segments[1] === 'whoami-v2') return this.whoami(req, res)
      if (method === 'POST' && segments[1] === 'validate-yaml' && segments.length === 2) return this.validateYaml(req, res)
      if (segments[1] !== 'models' && segments[1] !== 'datasets') {
        if (segments[1] === 'spaces') throw new HttpError(404, `only model and dataset repositories are served here`, 'RepoNotFound')
        throw new HttpError(404, `no route ${method} ${url.pathname}`)
      }
      const repo = this.repoId(segments[2], segments[3], segments[1] === 'datasets')
      const action = segments[4]
      if (method === 'GET' && action === undefined) return this.modelInfo(req, res, repo, 'main', url)
      if (method === 'GET' && action === 'revision') return this.modelInfo(req, res, repo, this.required(segments[5], 'revision'), url)
      if (method === 'GET' && action === 'tree') return this.tree(req, res, repo, this.required(segments[5], 'revision'), segments.slice(6).join('/'), url, base)
      if (method === 'POST' && action === 'paths-info') return this.pathsInfo(req, res, repo, this.required(segments[5], 'revision'))
      if (method === 'POST' && action === 'preupload') return this.preupload(req, res, repo, this.required(segments[5], 'revision'))
      if (method === 'POST' && action === 'branch') return this.createBranch(req, res, repo, segments.slice(5).join('/'))
      if (method === 'POST' && action === 'commit') return this.commit(req, res, repo, this.required(segments[5], 'revision'), url, base)
      throw new HttpError(404, `no route ${method} ${url.pathname}`)
    }
    if (segments[0] === 'lfs-upload') return this.lfsUpload(req, res, segments, url)
    // a dataset repository's files and git paths are those of a model repository under /datasets/
    const dataset = segments[0] === 'datasets'
    if (dataset) segments.shift()
    if (segments.length === 4 && segments[1]?.endsWith('.git') && segments[2] === 'lfs-objects' && (method === 'GET' || method === 'HEAD')) {
      return this.lfsObject(req, res, this.repoId(segments[0], segments[1].slice(0, -4), dataset), segments[3]!)
    }
    if (segments.length >= 3 && segments[1]?.endsWith('.git') && segments.slice(2).join('/') === 'info/lfs/objects/batch' && method === 'POST') {
      return this.lfsBatch(req, res, this.repoId(segments[0], segments[1].slice(0, -4), dataset), base)
    }
    if (segments.length >= 5 && (segments[2] === 'resolve' || segments[2] === 'raw') && (method === 'GET' || method === 'HEAD')) {
      return this.resolve(req, res, this.repoId(segments[0], segments[1], dataset), segments[3]!, segments.slice(4).join('/'), segments[2] === 'raw')
    }
    throw new HttpError(404, `no route ${method} ${url.pathname}`)
  }

  private baseUrl(req: IncomingMessage): string {
    return `http://${req.headers.host ?? `${this.options.host}:${this.port}`}`
  }

  private required(value: string | undefined, what: string): string {
    if (!value) throw new HttpError(400, `missing ${what}`)
    return value
  }

  /** A repository's key: NS/NAME for a model, datasets/NS/NAME for a dataset (also its URL path under the Hub's). */
  private repoId(ns: string | undefined, name: string | undefined, dataset = false): string {
    if (!ns || !name || !NAME.test(ns) || !NAME.test(name)) throw new HttpError(404, `repository ${ns}/${name} not found`, 'RepoNotFound')
    return `${dataset ? DATASET_PREFIX : ''}${ns}/${name}`
  }

  /** Models under repos/, datasets under datasets/: a namespace called "datasets" is a model namespace like any. */
  private repoDir(repo: string): string {
    return repo.startsWith(DATASET_PREFIX) ? join(this.options.root, 'datasets', repo.slice(DATASET_PREFIX.length)) : join(this.options.root, 'repos', repo)
  }

  // ----------------------------------------------------------------------------------------------- helpers

  private json(res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
    const text = JSON.stringify(body)
    res.writeHead(status, {'Content-Type': 'application/json; charset=utf-8', 'Content-Length': Buffer.byteLength(text), ...headers})
    res.end(text)
  }

  private fail(res: ServerResponse, error: unknown): void {
    const http =
      error instanceof HttpError
        ? error
        : error instanceof StoreError
          ? new HttpError(400, error.message)
          : new HttpError(500, `internal error: ${(error as Error)?.message ?? String(error)}`)
    if (!(error instanceof HttpError) && !(error instanceof StoreError)) this.options.log?.(`error: ${(error as Error)?.stack ?? String(error)}`)
    if (res.headersSent) {
      res.destroy()
      return
    }
    const headers: Record<string, string> = {'X-Error-Message': http.message.replace(/[^\x20-\x7e]/g, '?').slice(0, 500)}
    if (http.code) headers['X-Error-Code'] = http.code
    // the rest of an unread body is not waited for: the connection ends with this answer
    if (http.status === 413) headers.Connection = 'close'
    this.json(res, http.status, {error: http.message}, headers)
  }

  private async readBody(req: IncomingMessage, limit = this.options.maxBodyBytes): Promise<Buffer> {
    const declared = Number(req.headers['content-length'] ?? 'NaN')
    if (declared > limit) throw new HttpError(413, `request body of ${declared} bytes exceeds ${limit} bytes (--max-request-body)`)
    const chunks: Buffer[] = []
    let size = 0
    for await (const chunk of req) {
      size += (chunk as Buffer).length
      if (size > limit) throw new HttpError(413, `request body exceeds ${limit} bytes (--max-request-body)`)
      chunks.push(chunk as Buffer)
    }
    return Buffer.concat(chunks)
  }

  private async readJson(req: IncomingMessage): Promise<Record<string, unknown>> {
    const body = await this.readBody(req)
    try {
      const value = JSON.parse(body.toString('utf8')) as unknown
      if (typeof value !== 'object' || value === null || Array.isArray(value)) throw new Error('not an object')
      return value as Record<string, unknown>
    } catch (error) {
      throw new HttpError(400, `request body is not a JSON object (${(error as Error).message})`)
    }
  }

  /** The request's token when it is a valid one, undefined when there is none; 401 for an invalid one. */
  private token(req: IncomingMessage): string | undefined {
    const header = req.headers.authorization
    if (header === undefined) return undefined
    const token = /^Bearer (\S+)$/.exec(header)?.[1]
    if (!token) throw new HttpError(401, 'malformed Authorization header (expected Bearer hf_...)')
    const ok = this.options.tokens ? this.options.tokens.some((t) => (typeof t === 'string' ? t : t.token) === token) : token.startsWith('hf_')
    if (!ok) throw new HttpError(401, 'invalid token')
    return token
  }

  /** The namespaces a token is bound to (empty: it owns those it claimed first). */
  private boundNamespaces(token: string): string[] {
    return (this.options.tokens ?? []).filter((t): t is {token: string; user: string} => typeof t !== 'string' && t.token === token).map((t) => t.user)
  }

  private namespaceBound(ns: string): boolean {
    return (this.options.tokens ?? []).some((t) => typeof t !== 'string' && t.user === ns)
  }

  private ownerPath(ns: string): string {
    return join(this.options.root, 'namespaces', `${ns}.json`)
  }

  private async namespaceOwner(ns: string): Promise<string | undefined> {
    try {
      return (JSON.parse(await readFile(this.ownerPath(ns), 'utf8')) as {token_sha256?: string}).token_sha256
    } catch {
      return undefined
    }
  }

  /** Whether `token` may write to (and read the private repositories of) namespace `ns`. */
  private async owns(token: string | undefined, ns: string): Promise<boolean> {
    if (!token) return false
    const bound = this.boundNamespaces(token)
    if (bound.length > 0) return bound.includes(ns)
    if (this.namespaceBound(ns)) return false
    return (await this.namespaceOwner(ns)) === sha256Hex(token)
  }

  /**
   * A write to namespace `ns` needs a valid token (401) that owns it (403). A namespace nobody owns yet is taken by
   * the first unbound token that writes to it (recorded on disk); a namespace bound to tokens is theirs only.
   */
  private async authorizeWrite(req: IncomingMessage, ns: string): Promise<string> {
    const token = this.token(req)
    if (!token) throw new HttpError(401, 'writing needs a token (Authorization: Bearer hf_...)')
    if (await this.owns(token, ns)) return token
    const claimable = this.boundNamespaces(token).length === 0 && !this.namespaceBound(ns)
    if (claimable) {
      const claimed = await this.withLock(`namespace:${ns}`, async () => {
        const owner = await this.namespaceOwner(ns)
        if (owner !== undefined) return owner === sha256Hex(token)
        await writeFileAtomic(this.ownerPath(ns), JSON.stringify({token_sha256: sha256Hex(token), claimed: new Date().toISOString()}))
        return true
      })
      if (claimed) return token
    }
    throw new HttpError(403, `this token may not write to namespace ${ns}`, 'Forbidden')
  }

  /** A private repository exists only for its namespace's tokens: anyone else gets 404 RepoNotFound. */
  private async authorizeRead(req: IncomingMessage, repo: string): Promise<void> {
    const token = this.token(req)
    let info: {private?: boolean}
    try {
      info = JSON.parse(await readFile(join(this.repoDir(repo), 'repo.json'), 'utf8')) as {private?: boolean}
    } catch {
      return // resolveRevision answers 404
    }
    if (info.private === true && !(await this.owns(token, namespaceOf(repo)))) throw new HttpError(404, `repository ${repo} not found`, 'RepoNotFound')
  }

  /** Drops uploads idle longer than the TTL, with their parts. */
  private async expireUploads(now = Date.now()): Promise<void> {
    for (const [id, upload] of this.uploads) {
      if (upload.expires > now || upload.busy > 0) continue
      this.uploads.delete(id)
      await rm(upload.dir, {recursive: true, force: true}).catch(() => undefined)
      this.options.log?.(`upload ${id} of ${upload.repo} expired`)
    }
  }

  /** Unfinished uploads (for tests and the log). */
  get pendingUploads(): number {
    return this.uploads.size
  }

  /** Serializes writes to one repository (commits move its branch refs). */
  private async withLock<T>(repo: string, fn: () => Promise<T>): Promise<T> {
    const previous = this.locks.get(repo) ?? Promise.resolve()
    const next = previous.catch(() => undefined).then(fn)
    this.locks.set(repo, next)
    try {
      return await next
    } finally {
      if (this.locks.get(repo) === next) this.locks.delete(repo)
    }
  }

  private async repoExists(repo: string): Promise<boolean> {
    try {
      await stat(join(this.repoDir(repo), 'repo.json'))
      return true
    } catch {
      return false
    }
  }

  private async branchHead(repo: string, branch: string): Promise<string | undefined> {
    try {
      return (await readFile(join(this.repoDir(repo), 'refs', encodeURIComponent(branch)), 'utf8')).trim()
    } catch {
      return undefined
    }
  }

  private async readCommit(repo: string, id: string): Promise<Commit | undefined> {
    try {
      return JSON.parse(await readFile(join(this.repoDir(repo), 'commits', `${id}.json`), 'utf8')) as Commit
    } catch {
      return undefined
    }
  }

  /** The commit a revision names (a branch, or a full commit id); 404 RepoNotFound / RevisionNotFound otherwise. */
  private async resolveRevision(repo: string, revision: string): Promise<Commit> {
    if (!(await this.repoExists(repo))) throw new HttpError(404, `repository ${repo} not found`, 'RepoNotFound')
    const rev = revision === 'HEAD' ? 'main' : revision
    let id = await this.branchHead(repo, rev)
    if (!id && COMMIT_ID.test(rev)) id = rev
    const commit = id ? await this.readCommit(repo, id) : undefined
    if (!commit) throw new HttpError(404, `revision ${revision} not found in ${repo}`, 'RevisionNotFound')
    return commit
  }

  private async writeCommit(repo: string, branch: string, parent: Commit | undefined, title: string, message: string, files: Record<string, FileEntry>): Promise<Commit> {
    const date = new Date().toISOString()
    const id = createHash('sha1')
      .update(
        JSON.stringify({
          parent: parent?.id ?? null,
          title,
          message,
          date,
          nonce: randomBytes(8).toString('hex'),
          files: Object.keys(files)
            .sort()
            .map((p) => [p, files[p]!.gitOid]),
        }),
      )
      .digest('hex')
    for (const entry of Object.values(files)) if (entry.lastCommit === '') entry.lastCommit = id
    const commit: Commit = {id, parents: parent ? [parent.id] : [], title, message, date, files}
    await writeFileAtomic(join(this.repoDir(repo), 'commits', `${id}.json`), JSON.stringify(commit))
    await writeFileAtomic(join(this.repoDir(repo), 'refs', encodeURIComponent(branch)), id)
    return commit
  }

  private entryJson(path: string, file: FileEntry, commit: Commit | undefined, expand: boolean): Record<string, unknown> {
    const out: Record<string, unknown> = {type: 'file', oid: file.gitOid, size: file.size, path}
    if (file.lfs) out.lfs = {oid: file.sha256, size: file.size, pointerSize: Buffer.byteLength(lfsPointer(file.sha256, file.size))}
    if (expand && commit) out.lastCommit = {id: commit.id, title: commit.title, date: commit.date}
    return out
  }

  private dirJson(path: string, commit: Commit): Record<string, unknown> {
    const oid = createHash('sha1')
      .update(`tree ${path}\0`)
      .update(
        JSON.stringify(
          Object.entries(commit.files)
            .filter(([p]) => p.startsWith(`${path}/`))
            .map(([p, f]) => [p, f.gitOid]),
        ),
      )
      .digest('hex')
    return {type: 'directory', oid, size: 0, path}
  }

  // ----------------------------------------------------------------------------------------------- routes

  private async whoami(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const token = this.token(req)
    if (!token) throw new HttpError(401, 'whoami needs a token (Authorization: Bearer hf_...)')
    const [name = 'user', ...orgs] = this.boundNamespaces(token)
    this.json(res, 200, {
      type: 'user',
      name,
      fullname: 'psyche hub user',
      orgs: orgs.map((o) => ({type: 'org', name: o})),
      auth: {type: 'access_token', accessToken: {displayName: 'local', role: 'write'}},
    })
  }

  /**
   * The model card check huggingface_hub makes before uploading a README.md: its YAML front matter (between `---`
   * lines) must be closed and indented with spaces; no front matter is a warning, as on the Hub. The Hub's
   * metadata schemas are not checked.
   */
  private async validateYaml(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const body = await this.readJson(req)
    if (typeof body.content !== 'string') throw new HttpError(400, 'validate-yaml: content must be a string')
    const lines = body.content.replace(/^\uFEFF/, '').split(/\r?\n/)
    const errors: {message: string}[] = []
    const warnings: {message: string}[] = []
    if (lines[0]?.trim() !== '---') warnings.push({message: 'empty or missing yaml metadata in repo card'})
    else {
      const end = lines.findIndex((l, i) => i > 0 && (l.trim() === '---' || l.trim() === '...'))
      if (end < 0) errors.push({message: 'the YAML metadata block is not closed (no --- line after it)'})
      else {
        const tab = lines.slice(1, end).findIndex((l) => /^\s*\t/.test(l))
        if (tab >= 0) errors.push({message: `line ${tab + 2}: YAML indentation must use spaces, not tabs`})
        if (lines.slice(1, end).every((l) => l.trim() === '' || l.trim().startsWith('#'))) warnings.push({message: 'empty or missing yaml metadata in repo card'})
      }
    }
    this.json(res, errors.length ? 400 : 200, {errors, warnings}, errors.length ? {'X-Error-Message': errors[0]!.message} : {})
  }

  private async createRepo(req: IncomingMessage, res: ServerResponse, base: string): Promise<void> {
    const token = this.token(req)
    if (!token) throw new HttpError(401, 'writing needs a token (Authorization: Bearer hf_...)')
    const body = await this.readJson(req)
    const type = body.type ?? 'model'
    if (type !== 'model' && type !== 'dataset') throw new HttpError(400, `only model and dataset repositories are served here, not ${String(type)}`)
    const name = typeof body.name === 'string' ? body.name : ''
    const ns = typeof body.organization === 'string' && body.organization ? body.organization : (this.boundNamespaces(token)[0] ?? 'user')
    if (!NAME.test(name) || !NAME.test(ns)) throw new HttpError(400, `invalid repository name ${ns}/${name}`)
    await this.authorizeWrite(req, ns)
    const repo = `${type === 'dataset' ? DATASET_PREFIX : ''}${ns}/${name}`
    const url = `${base}/${repo}`
    const created = await this.withLock(repo, async () => {
      if (await this.repoExists(repo)) return false
      const attributes = Buffer.from(GITATTRIBUTES)
      const {sha256} = await this.store.put(attributes)
      const files: Record<string, FileEntry> = {'.gitattributes': {size: attributes.length, sha256, gitOid: gitBlobOid(attributes), lfs: false, lastCommit: ''}}
      for (const f of Array.isArray(body.files) ? (body.files as {path?: unknown; content?: unknown; encoding?: unknown}[]) : []) {
        if (typeof f.path !== 'string' || !validPath(f.path) || typeof f.content !== 'string') throw new HttpError(400, 'files: each needs a path and content')
        const content = Buffer.from(f.content, f.encoding === 'base64' ? 'base64' : 'utf8')
        const put = await this.store.put(content)
        files[f.path] = {size: content.length, sha256: put.sha256, gitOid: gitBlobOid(content), lfs: false, lastCommit: ''}
      }
      await this.writeCommit(repo, 'main', undefined, 'initial commit', '', files)
      // repo.json last: a repository exists once its first commit and branch are in place
      await writeFileAtomic(
        join(this.repoDir(repo), 'repo.json'),
        JSON.stringify({type, created: new Date().toISOString(), private: body.private === true || body.visibility === 'private'}),
      )
      return true
    })
    if (created) this.json(res, 200, {url, name: shownId(repo), id: shownId(repo)})
    else this.json(res, 409, {error: `You already created this ${type} repo`, url}, {'X-Error-Code': 'RepoExists', 'X-Error-Message': `You already created this ${type} repo`})
  }

  private async modelInfo(req: IncomingMessage, res: ServerResponse, repo: string, revision: string, _url: URL): Promise<void> {
    await this.authorizeRead(req, repo)
    const commit = await this.resolveRevision(repo, revision)
    const info = JSON.parse(await readFile(join(this.repoDir(repo), 'repo.json'), 'utf8')) as {created: string; private: boolean}
    this.json(res, 200, {
      _id: createHash('sha1').update(repo).digest('hex').slice(0, 24),
      id: shownId(repo),
      ...(repo.startsWith(DATASET_PREFIX) ? {} : {modelId: repo}),
      author: namespaceOf(repo),
      sha: commit.id,
      lastModified: commit.date,
      createdAt: info.created,
      private: info.private,
      disabled: false,
      gated: false,
      downloads: 0,
      likes: 0,
      tags: [],
      library_name: 'transformers',
      siblings: Object.keys(commit.files)
        .sort()
        .map((rfilename) => ({rfilename})),
      usedStorage: Object.values(commit.files).reduce((a, f) => a + f.size, 0),
    })
  }

  private async tree(req: IncomingMessage, res: ServerResponse, repo: string, revision: string, dirPath: string, url: URL, base: string): Promise<void> {
    await this.authorizeRead(req, repo)
    const commit = await this.resolveRevision(repo, revision)
    const recursive = ['1', 'true', 'True'].includes(url.searchParams.get('recursive') ?? '')
    const expand = ['1', 'true', 'True'].includes(url.searchParams.get('expand') ?? '')
    const prefix = dirPath ? `${dirPath}/` : ''
    if (dirPath && !Object.keys(commit.files).some((p) => p.startsWith(prefix))) {
      throw new HttpError(404, `${dirPath} is not a directory of ${repo} at ${revision}`, 'EntryNotFound')
    }
    const entries: Record<string, unknown>[] = []
    const dirs = new Set<string>()
    for (const path of Object.keys(commit.files).sort()) {
      if (!path.startsWith(prefix)) continue
      const rest = path.slice(prefix.length).split('/')
      for (let depth = 1; depth < rest.length && (recursive || depth === 1); depth++) {
        const dir = prefix + rest.slice(0, depth).join('/')
        if (!dirs.has(dir)) {
          dirs.add(dir)
          entries.push(this.dirJson(dir, commit))
        }
      }
      if (rest.length === 1 || recursive) {
        const file = commit.files[path]!
        entries.push(this.entryJson(path, file, expand ? await this.readCommit(repo, file.lastCommit) : undefined, expand))
      }
    }
    const cursor = Number(url.searchParams.get('cursor') ?? '0')
    if (!Number.isSafeInteger(cursor) || cursor < 0) throw new HttpError(400, 'invalid cursor')
    const page = entries.slice(cursor, cursor + this.options.treePageSize)
    const headers: Record<string, string> = {}
    if (cursor + page.length < entries.length) {
      const next = new URL(`${base}${url.pathname}`)
      for (const [k, v] of url.searchParams) if (k !== 'cursor') next.searchParams.append(k, v)
      next.searchParams.set('cursor', String(cursor + page.length))
      headers.Link = `<${next.href}>; rel="next"`
    }
    this.json(res, 200, page, headers)
  }

  private async pathsInfo(req: IncomingMessage, res: ServerResponse, repo: string, revision: string): Promise<void> {
    await this.authorizeRead(req, repo)
    const commit = await this.resolveRevision(repo, revision)
    const body = await this.readBody(req, 16 * 1024 * 1024)
    let paths: string[]
    let expand = false
    if ((req.headers['content-type'] ?? '').includes('application/json')) {
      let parsed: {paths?: unknown; expand?: unknown}
      try {
        parsed = JSON.parse(body.toString('utf8')) as {paths?: unknown; expand?: unknown}
      } catch {
        throw new HttpError(400, 'paths-info: body is not JSON')
      }
      paths = Array.isArray(parsed.paths) ? parsed.paths.filter((p): p is string => typeof p === 'string') : []
      expand = parsed.expand === true
    } else {
      const form = new URLSearchParams(body.toString('utf8'))
      paths = form.getAll('paths')
      expand = ['1', 'true', 'True'].includes(form.get('expand') ?? '')
    }
    const out: Record<string, unknown>[] = []
    for (const path of paths) {
      const file = commit.files[path]
      if (file) out.push(this.entryJson(path, file, expand ? await this.readCommit(repo, file.lastCommit) : undefined, expand))
      else if (path && Object.keys(commit.files).some((p) => p.startsWith(`${path}/`))) out.push(this.dirJson(path, commit))
    }
    this.json(res, 200, out)
  }

  private isLfsPath(path: string, size: number, sample: Buffer): boolean {
    return size >= this.options.lfsThreshold || LFS_PATTERNS.some((p) => p.test(path)) || sample.includes(0)
  }

  private async preupload(req: IncomingMessage, res: ServerResponse, repo: string, revision: string): Promise<void> {
    await this.authorizeWrite(req, namespaceOf(repo))
    const commit = await this.resolveRevision(repo, revision)
    const body = await this.readJson(req)
    if (!Array.isArray(body.files)) throw new HttpError(400, 'preupload: files must be a list')
    const files = (body.files as {path?: unknown; size?: unknown; sample?: unknown}[]).map((f, i) => {
      if (typeof f.path !== 'string' || !validPath(f.path)) throw new HttpError(400, `preupload: files[${i}].path is not a valid path`)
      if (typeof f.size !== 'number' || !Number.isSafeInteger(f.size) || f.size < 0) throw new HttpError(400, `preupload: files[${i}].size is not a size`)
      const sample = Buffer.from(typeof f.sample === 'string' ? f.sample : '', 'base64')
      const existing = commit.files[f.path]
      return {path: f.path, uploadMode: this.isLfsPath(f.path, f.size, sample) ? 'lfs' : 'regular', shouldIgnore: false, ...(existing ? {oid: existing.gitOid} : {})}
    })
    this.json(res, 200, {files, commitOid: commit.id})
  }

  /** The LFS objects (sha256) that the heads of a repository's branches refer to. */
  private async repoObjects(repo: string): Promise<Set<string>> {
    const out = new Set<string>()
    const refs = await readdir(join(this.repoDir(repo), 'refs')).catch(() => [] as string[])
    for (const ref of refs) {
      if (ref.includes('.tmp-')) continue
      const head = await this.branchHead(repo, decodeURIComponent(ref))
      const commit = head ? await this.readCommit(repo, head) : undefined
      for (const file of Object.values(commit?.files ?? {})) out.add(file.sha256)
    }
    return out
  }

  private async lfsBatch(req: IncomingMessage, res: ServerResponse, repo: string, base: string): Promise<void> {
    const body = await this.readJson(req)
    const operation = body.operation
    if (operation !== 'upload' && operation !== 'download') throw new HttpError(400, 'lfs batch: operation must be upload or download')
    if (operation === 'upload') await this.authorizeWrite(req, namespaceOf(repo))
    else await this.authorizeRead(req, repo)
    if (!(await this.repoExists(repo))) throw new HttpError(404, `repository ${repo} not found`, 'RepoNotFound')
    const transfers = Array.isArray(body.transfers) ? body.transfers : ['basic']
    if (!transfers.includes('basic') && !transfers.includes('multipart')) throw new HttpError(422, 'lfs batch: no supported transfer (basic, multipart) offered')
    if (!Array.isArray(body.objects)) throw new HttpError(400, 'lfs batch: objects must be a list')
    if (body.objects.length > MAX_BATCH_OBJECTS) throw new HttpError(413, `lfs batch: more than ${MAX_BATCH_OBJECTS} objects in one request`)
    const referenced = operation === 'download' ? await this.repoObjects(repo) : undefined
    const ttl = this.options.uploadTtlMs
    const objects = []
    for (const raw of body.objects as unknown[]) {
      const o = (typeof raw === 'object' && raw !== null ? raw : {}) as {oid?: unknown; size?: unknown}
      const oid = typeof o.oid === 'string' ? o.oid : ''
      const size = o.size
      if (SHA256.test(oid) && typeof size === 'number' && size > this.options.maxFileSize) {
        objects.push({oid, size, error: {code: 422, message: `${size} bytes is more than the ${this.options.maxFileSize} bytes a file may have here (--max-file-size)`}})
        continue
      }
      if (!SHA256.test(oid) || typeof size !== 'number' || !Number.isSafeInteger(size) || size < 0) {
        objects.push({oid: oid.slice(0, 64), size: typeof size === 'number' ? size : 0, error: {code: 422, message: 'invalid oid or size'}})
        continue
      }
      const present = await this.store.has(oid, size)
      if (operation === 'download') {
        objects.push(
          present && referenced!.has(oid)
            ? {oid, size, authenticated: true, actions: {download: {href: `${base}/${repo}.git/lfs-objects/${oid}`}}}
            : {oid, size, error: {code: 404, message: 'object not found'}},
        )
        continue
      }
      if (present) {
        objects.push({oid, size, authenticated: true})
        continue
      }
      if (this.uploads.size >= this.options.maxPendingUploads) await this.expireUploads()
      if (this.uploads.size >= this.options.maxPendingUploads) {
        objects.push({oid, size, error: {code: 429, message: `${this.uploads.size} unfinished uploads already (--max-pending-uploads); try again later`}})
        continue
      }
      const id = randomBytes(16).toString('hex')
      const dir = join(this.options.root, 'tmp', `upload-${id}`)
      const expires_in = Math.ceil(ttl / 1000)
      if (size > this.options.multipartThreshold && transfers.includes('multipart')) {
        // at most maxParts parts: the part size grows for a bigger file
        const chunkSize = Math.max(this.options.chunkSize, Math.ceil(size / this.options.maxParts))
        const parts = Math.ceil(size / chunkSize)
        this.uploads.set(id, {repo, oid, size, parts, chunkSize, dir, multipart: true, expires: Date.now() + ttl, busy: 0})
        const header: Record<string, string> = {chunk_size: String(chunkSize)}
        for (let part = 1; part <= parts; part++) header[String(part).padStart(5, '0')] = `${base}/lfs-upload/${oid}/part/${part}?upload=${id}`
        objects.push({oid, size, authenticated: true, actions: {upload: {href: `${base}/lfs-upload/${oid}/complete?upload=${id}`, header, expires_in}}})
      } else {
        this.uploads.set(id, {repo, oid, size, parts: 1, chunkSize: size, dir, multipart: false, expires: Date.now() + ttl, busy: 0})
        objects.push({oid, size, authenticated: true, actions: {upload: {href: `${base}/lfs-upload/${oid}?upload=${id}`, expires_in}}})
      }
    }
    const text = JSON.stringify({transfer: 'basic', objects, hash_algo: 'sha256'})
    res.writeHead(200, {'Content-Type': 'application/vnd.git-lfs+json', 'Content-Length': Buffer.byteLength(text)})
    res.end(text)
  }

  /**
   * The upload URLs the batch API hands out: like a storage bucket's signed URLs, each names an upload that a
   * token-checked batch request created for one object of one repository, and is void once done or expired.
   */
  private async lfsUpload(req: IncomingMessage, res: ServerResponse, segments: string[], url: URL): Promise<void> {
    const oid = segments[1] ?? ''
    if (!SHA256.test(oid)) throw new HttpError(400, 'lfs upload: invalid oid')
    const method = req.method
    const id = url.searchParams.get('upload') ?? ''
    const upload = this.uploads.get(id)
    if (!upload || upload.oid !== oid || upload.expires < Date.now()) {
      throw new HttpError(404, 'lfs upload: unknown or expired upload (ask the batch API for a new one, with a token)')
    }
    upload.busy += 1
    try {
      if (segments.length === 2 && method === 'PUT' && !upload.multipart) {
        await this.store.ingest(req, {sha256: oid, size: upload.size})
        this.uploads.delete(id)
        res.writeHead(200, {'Content-Length': 0}).end()
        return
      }
      if (segments[2] === 'part' && segments.length === 4 && method === 'PUT' && upload.multipart) {
        const part = Number(segments[3])
        if (!Number.isSafeInteger(part) || part < 1 || part > upload.parts) throw new HttpError(400, 'lfs upload: invalid part number')
        const expected = part < upload.parts ? upload.chunkSize : upload.size - upload.chunkSize * (upload.parts - 1)
        await mkdir(upload.dir, {recursive: true})
        const tmp = join(upload.dir, `part-${part}.tmp-${randomBytes(4).toString('hex')}`)
        const md5 = createHash('md5')
        let size = 0
        try {
          await pipeline(
            req,
            async function* (chunks: AsyncIterable<Buffer>) {
              for await (const chunk of chunks) {
                size += chunk.length
                if (size > expected) throw new HttpError(400, `lfs upload: part ${part} is longer than ${expected} bytes`)
                md5.update(chunk)
                yield chunk
              }
            },
            createWriteStream(tmp),
          )
          if (size !== expected) throw new HttpError(400, `lfs upload: part ${part} has ${size} bytes, expected ${expected}`)
          if (!this.uploads.has(id)) throw new HttpError(404, 'lfs upload: the upload expired')
          await rename(tmp, join(upload.dir, `part-${part}`))
        } catch (error) {
          await rm(tmp, {force: true})
          throw error
        }
        res.writeHead(200, {ETag: `"${md5.digest('hex')}"`, 'Content-Length': 0}).end()
        return
      }
      if (segments[2] === 'complete' && segments.length === 3 && method === 'POST' && upload.multipart) {
        const body = await this.readJson(req)
        const parts = Array.isArray(body.parts) ? (body.parts as unknown[]) : []
        if (parts.length !== upload.parts) throw new HttpError(400, `lfs upload: completion lists ${parts.length} parts, the upload has ${upload.parts}`)
        const present = new Set(await readdir(upload.dir).catch(() => [] as string[]))
        for (let part = 1; part <= upload.parts; part++) if (!present.has(`part-${part}`)) throw new HttpError(400, `lfs upload: part ${part} was not uploaded`)
        const dir = upload.dir
        const count = upload.parts
        async function* concatenated(): AsyncGenerator<Uint8Array> {
          for (let part = 1; part <= count; part++) yield* createReadStream(join(dir, `part-${part}`)) as AsyncIterable<Uint8Array>
        }
        try {
          await this.store.ingest(concatenated(), {sha256: oid, size: upload.size})
        } finally {
          this.uploads.delete(id)
          await rm(dir, {recursive: true, force: true})
        }
        this.json(res, 200, {success: true})
        return
      }
      throw new HttpError(404, 'lfs upload: no such route')
    } finally {
      upload.busy -= 1
      upload.expires = Date.now() + this.options.uploadTtlMs
    }
  }

  private async lfsObject(req: IncomingMessage, res: ServerResponse, repo: string, oid: string): Promise<void> {
    await this.authorizeRead(req, repo)
    if (!SHA256.test(oid) || !(await this.repoExists(repo)) || !(await this.repoObjects(repo)).has(oid) || !(await this.store.has(oid))) {
      throw new HttpError(404, 'object not found', 'EntryNotFound')
    }
    const {size} = await stat(this.store.path(oid))
    await this.sendFile(req, res, this.store.path(oid), size, {ETag: `"${oid}"`})
  }

  private async commit(req: IncomingMessage, res: ServerResponse, repo: string, revision: string, url: URL, base: string): Promise<void> {
    await this.authorizeWrite(req, namespaceOf(repo))
    if (url.searchParams.get('create_pr')) throw new HttpError(400, 'pull requests are not supported by this hub server')
    const body = (await this.readBody(req)).toString('utf8')
    const lines = body.split('\n').filter((l) => l.trim() !== '')
    const ops: {key: string; value: Record<string, unknown>}[] = lines.map((line, i) => {
      try {
        const op = JSON.parse(line) as {key?: unknown; value?: unknown}
        if (typeof op.key !== 'string' || typeof op.value !== 'object' || op.value === null) throw new Error('needs key and value')
        return op as {key: string; value: Record<string, unknown>}
      } catch (error) {
        throw new HttpError(400, `commit: line ${i + 1} is not a valid operation (${(error as Error).message})`)
      }
    })
    const header = ops.find((o) => o.key === 'header')?.value
    if (!header) throw new HttpError(400, 'commit: no header line')
    const summary = typeof header.summary === 'string' && header.summary ? header.summary : 'Upload files'
    const description = typeof header.description === 'string' ? header.description : ''
    const commit = await this.withLock(repo, async () => {
      const parent = await this.resolveRevision(repo, revision)
      if (COMMIT_ID.test(revision) && (await this.branchHead(repo, revision)) === undefined) throw new HttpError(400, 'commit: the revision must be a branch')
      if (typeof header.parentCommit === 'string' && header.parentCommit && header.parentCommit !== parent.id) {
        throw new HttpError(412, `commit: parentCommit ${header.parentCommit} is not the head of ${revision} (${parent.id}); a commit has happened since`)
      }
      const files: Record<string, FileEntry> = {...parent.files}
      for (const [i, op] of ops.entries()) {
        const v = op.value
        if (op.key === 'header') continue
        const path = typeof v.path === 'string' ? v.path : ''
        if (op.key !== 'deletedFolder' && !validPath(path)) throw new HttpError(400, `commit: operation ${i}: invalid path ${JSON.stringify(path)}`)
        if (op.key === 'file') {
          if (typeof v.content !== 'string') throw new HttpError(400, `commit: ${path}: no content`)
          const content = Buffer.from(v.content, v.encoding === 'base64' ? 'base64' : 'utf8')
          const {sha256} = await this.store.put(content)
          const gitOid = gitBlobOid(content)
          files[path] = {size: content.length, sha256, gitOid, lfs: false, lastCommit: files[path]?.gitOid === gitOid ? files[path]!.lastCommit : ''}
        } else if (op.key === 'lfsFile') {
          const oid = typeof v.oid === 'string' ? v.oid : ''
          const size = v.size
          if (!SHA256.test(oid) || typeof size !== 'number' || !(await this.store.has(oid, size)))
            throw new HttpError(400, `commit: ${path}: LFS object ${oid} (${String(size)} bytes) was not uploaded`)
          const gitOid = gitBlobOid(Buffer.from(lfsPointer(oid, size)))
          files[path] = {size, sha256: oid, gitOid, lfs: true, lastCommit: files[path]?.gitOid === gitOid ? files[path]!.lastCommit : ''}
        } else if (op.key === 'deletedFile') {
          if (!files[path]) throw new HttpError(404, `commit: cannot delete ${path}: not in ${revision}`, 'EntryNotFound')
          delete files[path]
        } else if (op.key === 'deletedFolder') {
          const prefix = path.replace(/\/+$/, '') + '/'
          for (const p of Object.keys(files)) if (p.startsWith(prefix) || prefix === '/') delete files[p]
        } else {
          throw new HttpError(400, `commit: unknown operation ${op.key}`)
        }
      }
      return this.writeCommit(repo, revision === 'HEAD' ? 'main' : revision, parent, summary, description, files)
    })
    this.json(res, 200, {success: true, commitOid: commit.id, commitUrl: `${base}/${repo}/commit/${commit.id}`, commitMessage: summary, hookOutput: ''})
  }

  private async createBranch(req: IncomingMessage, res: ServerResponse, repo: string, branch: string): Promise<void> {
    await this.authorizeWrite(req, namespaceOf(repo))
    if (!branch || branch.length > 200 || COMMIT_ID.test(branch) || !/^[A-Za-z0-9][A-Za-z0-9._/-]*$/.test(branch) || branch.includes('..'))
      throw new HttpError(400, `invalid branch name ${branch}`)
    const body = await this.readJson(req)
    await this.withLock(repo, async () => {
      const start = await this.resolveRevision(repo, typeof body.startingPoint === 'string' ? body.startingPoint : 'main')
      if ((await this.branchHead(repo, branch)) !== undefined && body.overwrite !== true) throw new HttpError(409, `branch ${branch} already exists`)
      await writeFileAtomic(join(this.repoDir(repo), 'refs', encodeURIComponent(branch)), start.id)
    })
    this.json(res, 200, {success: true})
  }

  private async resolve(req: IncomingMessage, res: ServerResponse, repo: string, revision: string, path: string, raw: boolean): Promise<void> {
    await this.authorizeRead(req, repo)
    const commit = await this.resolveRevision(repo, revision)
    const file = validPath(path) ? commit.files[path] : undefined
    if (!file) throw new HttpError(404, `${path} not found in ${repo} at ${revision}`, 'EntryNotFound')
    const headers: Record<string, string> = {'X-Repo-Commit': commit.id, 'Content-Type': 'application/octet-stream'}
    if (raw && file.lfs) {
      const pointer = Buffer.from(lfsPointer(file.sha256, file.size))
      headers.ETag = `"${file.gitOid}"`
      return this.sendBuffer(req, res, pointer, headers)
    }
    headers.ETag = `"${file.lfs ? file.sha256 : file.gitOid}"`
    if (file.lfs) {
      headers['X-Linked-Size'] = String(file.size)
      headers['X-Linked-ETag'] = `"${file.sha256}"`
    }
    await this.sendFile(req, res, this.store.path(file.sha256), file.size, headers)
  }

  /** A single byte range of `size` bytes from the Range header: undefined for the whole, null when unsatisfiable. */
  private parseRange(header: string | undefined, size: number): {start: number; end: number} | undefined | null {
    if (!header) return undefined
    const m = /^bytes=(\d*)-(\d*)$/.exec(header.trim())
    if (!m) return undefined // several ranges or another unit: answer with the whole file
    const [, a, b] = m
    if (a === '' && b === '') return null
    if (a === '') {
      const n = Number(b)
      if (n === 0) return null
      return {start: Math.max(0, size - n), end: size - 1}
    }
    const start = Number(a)
    const end = b === '' ? size - 1 : Math.min(Number(b), size - 1)
    if (start >= size || end < start) return null
    return {start, end}
  }

  private async sendFile(req: IncomingMessage, res: ServerResponse, path: string, size: number, headers: Record<string, string>): Promise<void> {
    const range = this.parseRange(req.headers.range, size)
    if (range === null) {
      res.writeHead(416, {...headers, 'Content-Range': `bytes */${size}`, 'Content-Length': 0}).end()
      return
    }
    const {start, end} = range ?? {start: 0, end: size - 1}
    const length = size === 0 ? 0 : end - start + 1
    const status = range ? 206 : 200
    res.writeHead(status, {...headers, 'Accept-Ranges': 'bytes', 'Content-Length': length, ...(range ? {'Content-Range': `bytes ${start}-${end}/${size}`} : {})})
    if (req.method === 'HEAD' || length === 0) {
      res.end()
      return
    }
    await pipeline(createReadStream(path, {start, end}), res)
  }

  private sendBuffer(req: IncomingMessage, res: ServerResponse, content: Buffer, headers: Record<string, string>): void {
    const range = this.parseRange(req.headers.range, content.length)
    if (range === null) {
      res.writeHead(416, {...headers, 'Content-Range': `bytes */${content.length}`, 'Content-Length': 0}).end()
      return
    }
    const {start, end} = range ?? {start: 0, end: content.length - 1}
    const body = content.subarray(start, end + 1)
    res.writeHead(range ? 206 : 200, {
      ...headers,
      'Accept-Ranges': 'bytes',
      'Content-Length': body.length,
      ...(range ? {'Content-Range': `bytes ${start}-${end}/${content.length}`} : {}),
    })
    res.end(req.method === 'HEAD' ? undefined : body)
  }
}
