import {closeSync, fsyncSync, openSync, renameSync, unlinkSync, writeSync} from 'node:fs'
import {randomBytes} from 'node:crypto'
import {dirname} from 'node:path'

/**
 * Writes `data` to `path` so that a crash at any moment leaves either the old file or the new one,
 * never a torn mix: write a temporary file beside it, fsync it, rename it over `path`, fsync the
 * directory (so the rename itself survives a power cut). Synchronous, so writes of one file are
 * ordered by construction.
 */
export function writeFileAtomicSync(path: string, data: string | Uint8Array, mode = 0o644): void {
  const tmp = `${path}.${process.pid}.${randomBytes(4).toString('hex')}.tmp`
  const bytes = typeof data === 'string' ? Buffer.from(data, 'utf8') : data
  let fd: number | undefined
  try {
    fd = openSync(tmp, 'wx', mode)
    let off = 0
    while (off < bytes.length) off += writeSync(fd, bytes, off, bytes.length - off)
    fsyncSync(fd)
    closeSync(fd)
    fd = undefined
    renameSync(tmp, path)
  } catch (error) {
    if (fd !== undefined) closeSync(fd)
    try {
      unlinkSync(tmp)
    } catch {
      // the temporary file was never created, or already renamed
    }
    throw error
  }
  try {
    const dir = openSync(dirname(path), 'r')
    try {
      fsyncSync(dir)
    } finally {
      closeSync(dir)
    }
  } catch {
    // some filesystems refuse fsync on directories; the rename is still atomic
  }
}
