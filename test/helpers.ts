import {mkdtempSync, readdirSync, readFileSync, rmSync} from 'node:fs'
import {createServer} from 'node:net'
import {tmpdir} from 'node:os'
import {join} from 'node:path'
import {execa, type ResultPromise} from 'execa'
import {projectRoot} from '../src/core/worker/python.js'

export const cliPath = join(projectRoot, 'bin', 'psyche.js')

interface CliResult {
  exitCode: number
  stdout: string
  stderr: string
}

/** Runs the real CLI as a separate process (as a user would). */
export async function runCli(args: string[], options: {cwd?: string; timeoutMs?: number; env?: Record<string, string>} = {}): Promise<CliResult> {
  const r = await execa(process.execPath, [cliPath, ...args], {
    cwd: options.cwd ?? projectRoot,
    env: {NO_COLOR: '1', CI: '1', ...options.env},
    reject: false,
    timeout: options.timeoutMs ?? 300_000,
    stdin: 'ignore',
  })
  return {exitCode: r.exitCode ?? -1, stdout: String(r.stdout), stderr: String(r.stderr)}
}

export function startCli(args: string[], options: {cwd?: string} = {}): ResultPromise {
  return execa(process.execPath, [cliPath, ...args], {cwd: options.cwd ?? projectRoot, env: {NO_COLOR: '1', CI: '1'}, reject: false, stdin: 'ignore', buffer: true})
}

export function tempDir(prefix = 'psyche-test-'): {path: string; cleanup: () => void} {
  const path = mkdtempSync(join(tmpdir(), prefix))
  return {path, cleanup: () => rmSync(path, {recursive: true, force: true})}
}

/** Whether a process runs: it exists and is not a zombie (an exited child its parent has not reaped yet). */
export function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0)
  } catch {
    return false
  }
  try {
    // /proc/PID/stat: "pid (comm) state ...", comm may hold spaces and parentheses
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
    return stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3) !== 'Z'
  } catch {
    return process.platform !== 'linux' // no /proc: kill(0) is all there is
  }
}

/** Every running descendant of a process (children, their children …) with its command line, from /proc (Linux). */
export function descendants(root: number): {pid: number; cmd: string}[] {
  const children = new Map<number, number[]>()
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue
    try {
      const stat = readFileSync(`/proc/${name}/stat`, 'utf8')
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1])
      children.set(ppid, [...(children.get(ppid) ?? []), Number(name)])
    } catch {
      // gone meanwhile
    }
  }
  const out: {pid: number; cmd: string}[] = []
  const queue = [...(children.get(root) ?? [])]
  for (let pid = queue.shift(); pid !== undefined; pid = queue.shift()) {
    queue.push(...(children.get(pid) ?? []))
    if (!processAlive(pid)) continue
    try {
      out.push({pid, cmd: readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').join(' ').trim()})
    } catch {
      // gone meanwhile
    }
  }
  return out
}

export async function waitFor(predicate: () => boolean | Promise<boolean>, timeoutMs: number, what: string): Promise<void> {
  const deadline = Date.now() + timeoutMs
  while (Date.now() < deadline) {
    if (await predicate()) return
    await new Promise((r) => setTimeout(r, 100))
  }
  throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`)
}

/** A tiny Llama config (a few thousand parameters) for fast tests. */
export const tinyModelConfig = {
  architectures: ['LlamaForCausalLM'],
  model_type: 'llama',
  vocab_size: 4096,
  hidden_size: 16,
  intermediate_size: 32,
  num_hidden_layers: 1,
  num_attention_heads: 2,
  num_key_value_heads: 2,
  max_position_embeddings: 64,
  tie_word_embeddings: false,
}

/** xorshift32: a seeded generator, so a failing fuzz case can be reproduced from its seed (FUZZ_SEED). */
export function seededRng(seed: number): () => number {
  let x = seed >>> 0 || 1
  return () => {
    x ^= x << 13
    x >>>= 0
    x ^= x >>> 17
    x ^= x << 5
    x >>>= 0
    return x
  }
}

/**
 * A free TCP port on 127.0.0.1 below the kernel's ephemeral range, for a server that must come back on the same port.
 * A port the kernel hands out (bind to 0) can be taken, once its server dies, by any connection or listener on the
 * machine that asks for an ephemeral port: the restarted server then meets EADDRINUSE. Below the range, only a
 * process that names the port can hold it, and the listen here checks that none does now.
 */
export async function freePort(): Promise<number> {
  let low = 32768
  try {
    low = Number(readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/)[0]) || low
  } catch {
    // not Linux: the IANA range's start is the usual default
  }
  const span = Math.min(12_000, low - 1025)
  for (let attempt = 0; ; attempt++) {
    const port = low - 1 - Math.floor(Math.random() * span)
    const free = await new Promise<boolean>((resolve) => {
      const s = createServer()
      s.once('error', () => resolve(false))
      s.listen(port, '127.0.0.1', () => s.close(() => resolve(true)))
    })
    if (free) return port
    if (attempt >= 50) throw new Error(`no free port found below ${low} in ${attempt + 1} tries`)
  }
}
