import {chmodSync, existsSync, lstatSync, mkdtempSync, readdirSync, rmSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'
import {PsycheError} from '../errors.js'

/** Names of the directories this module makes: psyche-workers-PID-XXXXXX (mkdtemp's six characters). */
const DIR_NAME = /^psyche-workers-(\d+)-[A-Za-z0-9]{6}$/
/** Sockets earlier versions left in the temp directory itself. */
const LEGACY_SOCKET = /^psyche-worker-(\d+)-[0-9a-f]{8}\.sock$/
/** ZeroMQ ipc paths are Unix socket paths: sun_path holds 107 bytes and a NUL. */
const MAX_SOCKET_PATH = 100

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0)
    return true
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'EPERM' // someone else's process: alive
  }
}

function ours(path: string): boolean {
  try {
    const s = lstatSync(path)
    return process.getuid === undefined || s.uid === process.getuid()
  } catch {
    return false
  }
}

/** $XDG_RUNTIME_DIR when it is a directory of ours that nobody else can enter, else the temp directory. */
function socketBase(): string {
  const runtime = process.env.XDG_RUNTIME_DIR
  if (runtime) {
    try {
      const s = lstatSync(runtime)
      if (s.isDirectory() && ours(runtime) && (s.mode & 0o077) === 0) return runtime
    } catch {}
  }
  return tmpdir()
}

/**
 * Removes what processes of this user that are gone left in `base`: their socket directories, and the loose
 * `psyche-worker-*.sock` files of earlier versions. Returns the names removed.
 */
export function cleanStaleSocketDirs(base: string): string[] {
  const removed: string[] = []
  let names: string[]
  try {
    names = readdirSync(base)
  } catch {
    return removed
  }
  for (const name of names) {
    const m = DIR_NAME.exec(name) ?? LEGACY_SOCKET.exec(name)
    if (!m || alive(Number(m[1]))) continue
    const path = join(base, name)
    if (!ours(path)) continue
    try {
      rmSync(path, {recursive: true, force: true})
      removed.push(name)
    } catch {}
  }
  return removed
}

/**
 * A new directory for this process's worker sockets in `base`: mode 0700 whatever the umask, owned by this
 * user (checked), so no other local user can connect to a worker, even one running as root.
 */
export function createSocketDir(base: string): string {
  const dir = mkdtempSync(join(base, `psyche-workers-${process.pid}-`))
  chmodSync(dir, 0o700)
  const s = lstatSync(dir)
  if (!s.isDirectory() || !ours(dir) || (s.mode & 0o777) !== 0o700) {
    rmSync(dir, {recursive: true, force: true})
    throw new PsycheError(`${dir}: could not make a private (0700) directory for the worker's socket`)
  }
  return dir
}

let current: string | undefined

/**
 * This process's socket directory (made on first use, after stale ones are cleaned; removed when the process
 * exits). Worker sockets are ipc:// paths in it.
 */
export function workerSocketDir(): string {
  if (current && existsSync(current)) return current
  let base = socketBase()
  if (join(base, 'psyche-workers-4194304-XXXXXX', 'w-00000000.sock').length > MAX_SOCKET_PATH) base = '/tmp'
  cleanStaleSocketDirs(base)
  const dir = createSocketDir(base)
  if (current === undefined) {
    process.on('exit', () => {
      if (current) rmSync(current, {recursive: true, force: true})
    })
  }
  current = dir
  return dir
}
