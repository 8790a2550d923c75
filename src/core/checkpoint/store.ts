import {createHash, randomBytes} from 'node:crypto'
import {createWriteStream} from 'node:fs'
import {mkdir, open, readFile, rename, rm, stat} from 'node:fs/promises'
import {dirname, join} from 'node:path'
import {pipeline} from 'node:stream/promises'
import type {Readable} from 'node:stream'

/**
 * Writes `data` to `path` atomically: a temporary sibling is written and fsynced, then renamed over `path`,
 * so a reader (or a crash) sees the old content or the new, never a torn file.
 */
export async function writeFileAtomic(path: string, data: string | Uint8Array): Promise<void> {
  await mkdir(dirname(path), {recursive: true})
  const tmp = `${path}.tmp-${process.pid}-${randomBytes(4).toString('hex')}`
  const handle = await open(tmp, 'w')
  try {
    await handle.writeFile(data)
    await handle.sync()
  } catch (error) {
    await handle.close()
    await rm(tmp, {force: true})
    throw error
  }
  await handle.close()
  try {
    await rename(tmp, path)
  } catch (error) {
    await rm(tmp, {force: true})
    throw error
  }
}

/** The git blob id of a file's content (what the Hub reports as `oid` of a regular file). */
export function gitBlobOid(content: Uint8Array): string {
  return createHash('sha1').update(`blob ${content.length}\0`).update(content).digest('hex')
}

/** The text of a git-LFS pointer file for an object. */
export function lfsPointer(sha256: string, size: number): string {
  return `version https://git-lfs.github.com/spec/v1\noid sha256:${sha256}\nsize ${size}\n`
}

/**
 * A content-addressed object store (sha256 → bytes) on disk. Objects arrive through `ingest`, which streams
 * into a temporary file, checks the digest and size, and only then renames into place.
 */
export class ObjectStore {
  constructor(readonly root: string) {}

  path(sha256: string): string {
    return join(this.root, 'objects', sha256.slice(0, 2), sha256)
  }

  async has(sha256: string, size?: number): Promise<boolean> {
    try {
      const s = await stat(this.path(sha256))
      return size === undefined || s.size === size
    } catch {
      return false
    }
  }

  tempPath(): string {
    return join(this.root, 'tmp', `${Date.now()}-${randomBytes(8).toString('hex')}`)
  }

  /** Streams `source` into the store; rejects (and keeps nothing) unless it hashes to `expected` (when given) and has `size` bytes. */
  async ingest(source: Readable | AsyncIterable<Uint8Array>, expected?: {sha256?: string; size?: number}): Promise<{sha256: string; size: number}> {
    const tmp = this.tempPath()
    await mkdir(dirname(tmp), {recursive: true})
    const hash = createHash('sha256')
    let size = 0
    try {
      await pipeline(
        source,
        async function* (chunks: AsyncIterable<Uint8Array>) {
          for await (const chunk of chunks) {
            hash.update(chunk)
            size += chunk.length
            if (expected?.size !== undefined && size > expected.size) throw new StoreError(`object is larger than the declared ${expected.size} bytes`)
            yield chunk
          }
        },
        createWriteStream(tmp),
      )
      const sha256 = hash.digest('hex')
      if (expected?.size !== undefined && size !== expected.size) throw new StoreError(`object has ${size} bytes, ${expected.size} were declared`)
      if (expected?.sha256 !== undefined && sha256 !== expected.sha256) throw new StoreError(`object hashes to ${sha256}, not the declared ${expected.sha256}`)
      const final = this.path(sha256)
      await mkdir(dirname(final), {recursive: true})
      await rename(tmp, final)
      return {sha256, size}
    } catch (error) {
      await rm(tmp, {force: true})
      throw error
    }
  }

  async put(content: Uint8Array): Promise<{sha256: string; size: number}> {
    const sha256 = createHash('sha256').update(content).digest('hex')
    if (!(await this.has(sha256, content.length))) await writeFileAtomic(this.path(sha256), content)
    return {sha256, size: content.length}
  }

  async read(sha256: string): Promise<Buffer> {
    return readFile(this.path(sha256))
  }
}

export class StoreError extends Error {}
