import {randomBytes} from 'node:crypto'
import {rmSync} from 'node:fs'
import {join} from 'node:path'
import {execa, type ResultPromise} from 'execa'
import * as zmq from 'zeromq'
import {PsycheError} from '../errors.js'
import {parseJsonLine} from '../json-lines.js'
import type {WorkerOp} from './ops.js'
import {projectRoot, pythonEnv, workerPython} from './python.js'
import {workerSocketDir} from './socket-dir.js'

export type WireDtype = 'uint8' | 'uint16' | 'uint32' | 'int32' | 'int64' | 'float16' | 'bfloat16' | 'float32' | 'float64'

/** A binary frame of a request or reply: raw little-endian bytes plus what they are. */
export interface Frame {
  name?: string
  dtype: WireDtype
  shape: number[]
  data: ArrayBufferView
}

export interface WorkerOptions {
  threads?: number
  /** auto | cpu | cuda | cuda:N, or one device per data-parallel rank: cuda:0,cuda:1 (python/psyche_worker/parallel.py). */
  device?: string
  /** Data-parallel ranks on `device`'s kind (cpu: N processes, cuda: GPUs 0..N-1); default 1. */
  dataParallel?: number
  /** Ranks that hold the model in shards (FSDP2) on `device`'s kind, or one per listed device; default 1. */
  shard?: number
  /** auto | fp32 | bf16: forward passes under torch bf16 autocast, master weights fp32 (default auto: bf16 on CUDA). */
  precision?: 'auto' | 'fp32' | 'bf16'
  /** ms to wait for the worker to import torch and listen. */
  readyTimeoutMs?: number
  /** default per-request timeout, ms. */
  requestTimeoutMs?: number
  /** forward the worker's stderr to ours (it is always kept for crash reports). */
  echoStderr?: boolean
  label?: string
}

/** The worker process died (exit code or signal) — pending and future requests fail with this. */
export class WorkerCrashedError extends PsycheError {
  constructor(message: string) {
    super(message, {code: 'EWORKERCRASH'})
  }
}

/**
 * The worker answered with a typed error (bad request, bad data, unsupported, …). Errors cross the boundary as data:
 * besides `kind` and the message for people, a kind may carry structured fields (the error kinds and their fields are
 * listed in python/psyche_worker/ops.json), read here and never parsed out of the message.
 */
export class WorkerRequestError extends PsycheError {
  constructor(
    readonly kind: string,
    message: string,
    readonly op: string,
    /** bad_result: the position of the refused result in the list the request sent. */
    readonly index?: number,
  ) {
    super(message, {code: `EWORKER_${kind.toUpperCase()}`})
  }
}

/** The WorkerRequestError of an error reply's `error` object (whatever the worker sent: it is checked here). */
export function workerRequestError(error: unknown, op: string): WorkerRequestError {
  const e = (typeof error === 'object' && error !== null ? error : {}) as {kind?: unknown; message?: unknown; index?: unknown}
  const kind = typeof e.kind === 'string' ? e.kind : 'unknown'
  const message = typeof e.message === 'string' ? e.message : 'failed'
  const index = typeof e.index === 'number' && Number.isSafeInteger(e.index) && e.index >= 0 ? e.index : undefined
  return new WorkerRequestError(kind, `worker: ${op}: ${message}`, op, index)
}

interface Pending {
  op: string
  resolve: (value: {reply: Record<string, unknown>; frames: Buffer[]}) => void
  reject: (error: Error) => void
  timer: NodeJS.Timeout
}

const live = new Set<WorkerClient>()
let handlersInstalled = false

/**
 * Kill every live worker when this process exits: no orphans. Signals are the command's business
 * (cli/signals.ts): a command that is interrupted exits, and this hook runs then.
 */
function installExitHandlers(): void {
  if (handlersInstalled) return
  handlersInstalled = true
  process.on('exit', () => {
    for (const w of live) w.kill('SIGKILL')
  })
}

/**
 * A PyTorch worker process (python -m psyche_worker) and the ZeroMQ DEALER socket that drives it.
 * Requests carry a JSON header plus raw frames; replies are matched by request id, so a timed-out
 * request never confuses the next one.
 */
export class WorkerClient {
  readonly pid: number
  /** Settles when the process has exited, with why (was killed by SIGKILL, exited with code 1...). */
  readonly exited: Promise<WorkerCrashedError>
  private readonly pending = new Map<number, Pending>()
  private nextId = 1
  private crash: WorkerCrashedError | undefined
  private readonly stderrTail: string[] = []
  private closing = false

  private constructor(
    private readonly proc: ResultPromise,
    private readonly socket: zmq.Dealer,
    private readonly endpointPath: string,
    private readonly options: WorkerOptions,
    stderrTail: string[],
  ) {
    this.pid = proc.pid!
    this.stderrTail = stderrTail
    this.exited = proc.then(
      (r) => this.onExit(r.exitCode, r.signal),
      (error: {exitCode?: number; signal?: string}) => this.onExit(error.exitCode, error.signal),
    )
    void this.receiveLoop()
  }

  static async start(options: WorkerOptions = {}): Promise<WorkerClient> {
    installExitHandlers()
    const python = workerPython()
    // in a 0700 directory of this process's own: no other local user can reach the worker (see socket-dir.ts)
    const endpointPath = join(workerSocketDir(), `w-${randomBytes(4).toString('hex')}.sock`)
    const args = ['-m', 'psyche_worker', '--endpoint', `ipc://${endpointPath}`, '--device', options.device ?? 'auto']
    if (options.threads) args.push('--threads', String(options.threads))
    if (options.dataParallel && options.dataParallel > 1) args.push('--data-parallel', String(options.dataParallel))
    if (options.shard && options.shard > 1) args.push('--shard', String(options.shard))
    if (options.precision && options.precision !== 'auto') args.push('--precision', options.precision)
    const env = pythonEnv(options.threads ? {OMP_NUM_THREADS: String(options.threads), MKL_NUM_THREADS: String(options.threads)} : {})
    const proc = execa(python, args, {cwd: projectRoot, env, stdin: 'ignore', stdout: 'pipe', stderr: 'pipe', cleanup: true, buffer: false, reject: false})
    const stderrTail: string[] = []
    proc.stderr!.setEncoding('utf8')
    proc.stderr!.on('data', (chunk: string) => {
      if (options.echoStderr) process.stderr.write(chunk)
      for (const line of chunk.split('\n')) if (line.trim()) stderrTail.push(line)
      if (stderrTail.length > 40) stderrTail.splice(0, stderrTail.length - 40)
    })
    const ready = await waitForReady(proc, options.readyTimeoutMs ?? 120_000, stderrTail)
    const socket = new zmq.Dealer({linger: 0, receiveHighWaterMark: 0, sendHighWaterMark: 0})
    socket.connect(`ipc://${endpointPath}`)
    const client = new WorkerClient(proc, socket, endpointPath, options, stderrTail)
    live.add(client)
    void ready
    return client
  }

  /** Sends one request and waits for its reply. Throws WorkerRequestError, WorkerCrashedError or a timeout. */
  async call<T extends Record<string, unknown> = Record<string, unknown>>(
    op: WorkerOp,
    args: Record<string, unknown> = {},
    frames: Frame[] = [],
    timeoutMs = this.options.requestTimeoutMs ?? 600_000,
  ): Promise<{reply: T; frames: Buffer[]}> {
    if (this.crash) throw this.crash
    const id = this.nextId++
    const header = {op, id, ...args, frames: frames.map((f, i) => ({name: f.name ?? String(i), dtype: f.dtype, shape: f.shape}))}
    const result = new Promise<{reply: Record<string, unknown>; frames: Buffer[]}>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id)
        reject(new PsycheError(`worker (pid ${this.pid}) did not answer '${op}' within ${(timeoutMs / 1000).toFixed(0)} s`, {code: 'EWORKERTIMEOUT'}))
      }, timeoutMs)
      this.pending.set(id, {op, resolve, reject, timer})
    })
    const payload = [Buffer.from(JSON.stringify(header)), ...frames.map((f) => Buffer.from(f.data.buffer, f.data.byteOffset, f.data.byteLength))]
    await this.socket.send(payload)
    const {reply, frames: out} = await result
    return {reply: reply as T, frames: out}
  }

  /** Asks the worker to exit; kills it if it has not within `graceMs`. */
  async shutdown(graceMs = 5000): Promise<void> {
    if (this.crash || this.closing) {
      await this.exited
      return
    }
    this.closing = true
    try {
      await Promise.race([this.call('shutdown', {}, [], graceMs), this.exited])
    } catch {
      // fall through to the kill below
    }
    const timer = setTimeout(() => this.kill('SIGKILL'), graceMs)
    await this.exited
    clearTimeout(timer)
  }

  kill(signal: NodeJS.Signals = 'SIGKILL'): void {
    try {
      this.proc.kill(signal)
    } catch {
      // already gone
    }
  }

  /** The ipc:// socket path the worker listens on. */
  get endpoint(): string {
    return this.endpointPath
  }

  get lastStderr(): string[] {
    return [...this.stderrTail]
  }

  private async receiveLoop(): Promise<void> {
    try {
      for await (const [header, ...frames] of this.socket) {
        let reply: Record<string, unknown>
        try {
          reply = JSON.parse(header.toString('utf8'))
        } catch {
          continue
        }
        const pending = this.pending.get(reply.id as number)
        if (!pending) continue // a reply to a request that already timed out
        this.pending.delete(reply.id as number)
        clearTimeout(pending.timer)
        if (reply.ok) {
          pending.resolve({reply, frames})
        } else {
          pending.reject(workerRequestError(reply.error, pending.op))
        }
      }
    } catch {
      // socket closed
    }
  }

  private onExit(exitCode: number | undefined, signal: string | undefined): WorkerCrashedError {
    live.delete(this)
    const how = signal ? `was killed by ${signal}` : `exited with code ${exitCode}`
    const tail = this.stderrTail.slice(-5).join(' | ')
    this.crash = new WorkerCrashedError(`worker (pid ${this.pid}) ${how}${this.closing ? '' : ' unexpectedly'}${tail && !this.closing ? `; last stderr: ${tail}` : ''}`)
    for (const [id, p] of this.pending) {
      clearTimeout(p.timer)
      p.reject(new WorkerCrashedError(`${this.crash.message} while serving '${p.op}'`))
      this.pending.delete(id)
    }
    this.socket.close()
    rmSync(this.endpointPath, {force: true})
    return this.crash
  }
}

async function waitForReady(proc: ResultPromise, timeoutMs: number, stderrTail: string[]): Promise<Record<string, unknown>> {
  return new Promise((resolve, reject) => {
    let buffered = ''
    const timer = setTimeout(() => {
      proc.kill('SIGKILL')
      reject(new PsycheError(`worker did not start within ${timeoutMs / 1000} s; last stderr: ${stderrTail.slice(-5).join(' | ')}`))
    }, timeoutMs)
    proc.stdout!.setEncoding('utf8')
    const onData = (chunk: string) => {
      buffered += chunk
      let nl: number
      while ((nl = buffered.indexOf('\n')) >= 0) {
        const line = buffered.slice(0, nl)
        buffered = buffered.slice(nl + 1)
        const event = parseJsonLine(line)
        if (!event) continue
        if (event.event === 'ready') {
          clearTimeout(timer)
          proc.stdout!.off('data', onData)
          proc.stdout!.resume()
          resolve(event)
        } else if (event.event === 'fatal') {
          clearTimeout(timer)
          reject(new PsycheError(`worker failed to start: ${event.message}`))
        }
      }
    }
    proc.stdout!.on('data', onData)
    proc.then(
      (r) => {
        clearTimeout(timer)
        reject(new WorkerCrashedError(`worker exited during start-up (${r.signal ?? `code ${r.exitCode}`}); last stderr: ${stderrTail.slice(-5).join(' | ') || '(none)'}`))
      },
      () => undefined,
    )
  })
}
