import {mkdtemp, rm, writeFile} from 'node:fs/promises'
import {createServer, type IncomingMessage, type Server, type ServerResponse} from 'node:http'
import type {AddressInfo} from 'node:net'
import {tmpdir} from 'node:os'
import {join} from 'node:path'
import {after} from 'node:test'
import {readdirSync, readFileSync, statSync} from 'node:fs'

const tempDirs: string[] = []
// Registered at the top level so that directories made inside hooks live until the whole file is done.
after(() => Promise.all(tempDirs.map((dir) => rm(dir, {recursive: true, force: true}))))

/** A temporary directory removed after the test file. */
export async function tempDir(): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'psyche-data-'))
  tempDirs.push(dir)
  return dir
}

/** Deterministic pseudo-random ids below `vocab` (xorshift), so every test sees the same data. */
export function tokens(count: number, vocab: number, seed = 1): Uint32Array {
  const out = new Uint32Array(count)
  let x = seed >>> 0 || 1
  for (let i = 0; i < count; i++) {
    x ^= x << 13
    x >>>= 0
    x ^= x >>> 17
    x ^= x << 5
    x >>>= 0
    out[i] = x % vocab
  }
  return out
}

function encode(ids: Uint32Array, tokenSize: 2 | 4): Buffer {
  const out = Buffer.alloc(ids.length * tokenSize)
  ids.forEach((id, i) => (tokenSize === 2 ? out.writeUInt16LE(id, i * 2) : out.writeUInt32LE(id, i * 4)))
  return out
}

/** A .npy file (format 1.0) holding `ids` as <u2 or <u4. */
function npy(ids: Uint32Array, tokenSize: 2 | 4): Buffer {
  let header = `{'descr': '<u${tokenSize}', 'fortran_order': False, 'shape': (${ids.length},), }`
  const total = 10 + header.length + 1
  header = header.padEnd(header.length + ((64 - (total % 64)) % 64), ' ') + '\n'
  const head = Buffer.alloc(10)
  head.write('\x93NUMPY', 0, 'latin1')
  head[6] = 1
  head[7] = 0
  head.writeUInt16LE(header.length, 8)
  return Buffer.concat([head, Buffer.from(header, 'latin1'), encode(ids, tokenSize)])
}

/** Writes token files into `dir` and returns the ids per file. */
export async function writeTokenFiles(dir: string, files: Array<{name: string; ids: Uint32Array; tokenSize: 2 | 4}>): Promise<void> {
  for (const f of files) await writeFile(join(dir, f.name), f.name.endsWith('.npy') ? npy(f.ids, f.tokenSize) : encode(f.ids, f.tokenSize))
}

export type HttpMode = 'range' | 'ignore-range' | 'truncate' | 'fail-then-range' | 'always-500' | 'hang'

/**
 * A real HTTP server on 127.0.0.1 serving files from `dir`: HEAD with Content-Length, GET with Range → 206.
 * `mode` makes it misbehave the ways real servers do. Stops after the test file.
 */
export async function serveDirectory(dir: string, mode: () => HttpMode = () => 'range'): Promise<{base: string; server: Server; requests: string[]}> {
  const requests: string[] = []
  let failures = 0
  const server = createServer((req, res) => {
    const path = join(dir, decodeURIComponent(new URL(req.url ?? '/', 'http://x').pathname))
    requests.push(`${req.method} ${req.url} ${req.headers.range ?? ''}`.trim())
    let size: number
    try {
      size = statSync(path).size
    } catch {
      res.writeHead(404).end()
      return
    }
    const m = mode()
    if (m === 'hang' && req.method === 'GET') {
      res.on('close', () => res.destroy())
      return
    }
    if (m === 'always-500' || (m === 'fail-then-range' && req.method === 'GET' && failures++ % 2 === 0)) {
      res.writeHead(503).end()
      return
    }
    if (req.method === 'HEAD') {
      res.writeHead(200, {'content-length': size, 'accept-ranges': 'bytes'}).end()
      return
    }
    const data = readFileSync(path)
    const range = /^bytes=(\d+)-(\d+)$/.exec(req.headers.range ?? '')
    if (!range || m === 'ignore-range') {
      res.writeHead(200, {'content-length': size}).end(data)
      return
    }
    const start = Number(range[1])
    const end = Math.min(Number(range[2]), size - 1)
    if (start >= size) {
      res.writeHead(416, {'content-range': `bytes */${size}`}).end()
      return
    }
    const body = data.subarray(start, end + 1)
    const sent = m === 'truncate' ? body.subarray(0, Math.floor(body.length / 2)) : body
    res.writeHead(206, {'content-range': `bytes ${start}-${end}/${size}`, 'content-length': sent.length}).end(sent)
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  after(() => new Promise<void>((resolve) => server.close(() => resolve())))
  server.unref()
  return {base: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, server, requests}
}

/** Writes `data` as a Range-capable HTTP response (HEAD: size only); `truncate` sends half of each range. */
function sendFile(req: IncomingMessage, res: ServerResponse, data: Buffer, truncate = false): void {
  if (req.method === 'HEAD') {
    res.writeHead(200, {'content-length': data.length, 'accept-ranges': 'bytes'}).end()
    return
  }
  const range = /^bytes=(\d+)-(\d+)$/.exec(req.headers.range ?? '')
  if (!range) {
    res.writeHead(200, {'content-length': data.length}).end(data)
    return
  }
  const start = Number(range[1])
  const end = Math.min(Number(range[2]), data.length - 1)
  if (start >= data.length) {
    res.writeHead(416, {'content-range': `bytes */${data.length}`}).end()
    return
  }
  const body = data.subarray(start, end + 1)
  const sent = truncate ? body.subarray(0, Math.floor(body.length / 2)) : body
  res.writeHead(206, {'content-range': `bytes ${start}-${end}/${data.length}`, 'content-length': sent.length}).end(sent)
}

interface BucketOptions {
  /** Objects per listing page. */
  pageSize?: number
  /** The size the listing reports for an object, instead of its real one. */
  listedSize?: (name: string, size: number) => number
  /** The media link the listing gives an object, instead of this server's own. */
  mediaLink?: (name: string, own: string) => string
  /** Send half of each range of these objects. */
  truncate?: (name: string) => boolean
}

/**
 * A real HTTP server on 127.0.0.1 that speaks the part of the Cloud Storage JSON API a public bucket's reader uses:
 * the object listing (`/storage/v1/b/BUCKET/o?prefix=&pageToken=`, paged) and media downloads through each object's
 * mediaLink (HEAD, Range GET). The bucket's objects are the files under `dir` (names with '/'). Stops after the test file.
 */
export async function serveBucket(dir: string, bucket: string, options: BucketOptions = {}): Promise<{endpoint: string; requests: string[]}> {
  const requests: string[] = []
  const names = (sub = ''): string[] => readdirSync(join(dir, sub), {withFileTypes: true}).flatMap((e) => (e.isDirectory() ? names(join(sub, e.name)) : [join(sub, e.name)]))
  let endpoint = ''
  const server = createServer((req, res) => {
    const url = new URL(req.url ?? '/', 'http://x')
    requests.push(`${req.method} ${url.pathname}${url.search} ${req.headers.range ?? ''}`.trim())
    const listing = new RegExp(`^/storage/v1/b/${bucket}/o$`).exec(url.pathname)
    if (listing && req.method === 'GET') {
      const prefix = url.searchParams.get('prefix') ?? ''
      const all = names()
        .sort()
        .filter((n) => n.startsWith(prefix))
      const page = options.pageSize ?? 1000
      const start = Number(url.searchParams.get('pageToken') ?? 0)
      const items = all.slice(start, start + page).map((name) => {
        const size = statSync(join(dir, name)).size
        const own = `${endpoint}/download/storage/v1/b/${bucket}/o/${encodeURIComponent(name)}?generation=1&alt=media`
        return {kind: 'storage#object', name, bucket, size: String(options.listedSize?.(name, size) ?? size), mediaLink: options.mediaLink?.(name, own) ?? own}
      })
      const body: Record<string, unknown> = {kind: 'storage#objects', items}
      if (start + page < all.length) body.nextPageToken = String(start + page)
      res.writeHead(200, {'content-type': 'application/json'}).end(JSON.stringify(body))
      return
    }
    const media = new RegExp(`^/download/storage/v1/b/${bucket}/o/([^/]+)$`).exec(url.pathname)
    if (media && (req.method === 'GET' || req.method === 'HEAD')) {
      const name = decodeURIComponent(media[1])
      let data: Buffer
      try {
        data = readFileSync(join(dir, name))
      } catch {
        res.writeHead(404).end()
        return
      }
      sendFile(req, res, data, options.truncate?.(name))
      return
    }
    res.writeHead(404).end()
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  after(() => new Promise<void>((resolve) => server.close(() => resolve())))
  server.unref()
  endpoint = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
  return {endpoint, requests}
}
