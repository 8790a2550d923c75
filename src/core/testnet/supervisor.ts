import {join} from 'node:path'
import {execa, type ResultPromise} from 'execa'
import {PsycheError} from '../errors.js'
import {parseJsonLine} from '../json-lines.js'
import {projectRoot} from '../worker/python.js'

const cliPath = join(projectRoot, 'bin', 'psyche.js')

/** Calls `onLine` for each non-empty line of a text stream. */
function lines(stream: NodeJS.ReadableStream, onLine: (line: string) => void): void {
  let partial = ''
  stream.setEncoding('utf8')
  stream.on('data', (chunk: string) => {
    partial += chunk
    const parts = partial.split('\n')
    partial = parts.pop()!
    for (const line of parts) if (line.trim()) onLine(line)
  })
}

/** The `psyche` child processes of a testnet: started here, all stopped together at the end, whatever happens. */
export class ProcessGroup {
  private readonly children = new Set<ResultPromise>()

  /** Starts `psyche ARGS...` (stdout and stderr piped, not buffered). */
  spawn(args: string[]): ResultPromise {
    const child = execa(process.execPath, [cliPath, ...args], {cwd: projectRoot, env: {NO_COLOR: '1', CI: '1'}, reject: false, stdin: 'ignore', buffer: false, cleanup: true})
    this.children.add(child)
    void child.then(() => this.children.delete(child))
    return child
  }

  /** SIGTERM to every child still running, SIGKILL after `graceMs`; resolves once all have exited. */
  async stopAll(graceMs = 5000): Promise<void> {
    const all = [...this.children]
    for (const c of all) c.kill('SIGTERM')
    const force = setTimeout(() => {
      for (const c of all) c.kill('SIGKILL')
    }, graceMs)
    await Promise.all(all)
    clearTimeout(force)
  }
}

/** Starts `psyche server run` and resolves with its port once it reports listening (rejects if it exits first). */
export async function startServer(group: ProcessGroup, statePath: string, saveStateDir: string): Promise<{proc: ResultPromise; port: number}> {
  const proc = group.spawn(['server', 'run', '--state', statePath, '--host', '127.0.0.1', '--save-state-dir', saveStateDir, '--json'])
  let tail: string[] = []
  const port = await new Promise<number>((resolvePort, reject) => {
    const timer = setTimeout(() => reject(new PsycheError(`the coordinator server did not report listening within 60 s: ${tail.join(' | ')}`)), 60_000)
    lines(proc.stdout!, (line) => {
      const e = parseJsonLine(line)
      if (e?.event === 'listening' && typeof e.port === 'number') {
        clearTimeout(timer)
        resolvePort(e.port)
      }
    })
    lines(proc.stderr!, (line) => {
      tail = [...tail.slice(-9), line]
    })
    void proc.then((r) => {
      clearTimeout(timer)
      reject(new PsycheError(`the coordinator server exited with code ${r.exitCode}: ${tail.join(' | ')}`))
    })
  })
  return {proc, port}
}

interface ClientEvents {
  /** Each JSON event line of the current process (generation: 1 for the first start, +1 per restart). */
  onEvent(event: Record<string, unknown>, generation: number): void
  /** The current process exited. */
  onExit(code: number | null, generation: number): void
}

/**
 * One testnet client: a `psyche join --json` process with a fixed identity, restartable (a restart is a new
 * generation; events of a replaced process are ignored once it exits).
 */
export class ClientProcess {
  generation = 0
  alive = false
  finished = false
  /** The last step it applied (from its round events). */
  lastStep: number | null = null
  readonly stderrTail: string[] = []
  private proc: ResultPromise | undefined

  constructor(
    readonly name: string,
    readonly identityPath: string,
    private readonly group: ProcessGroup,
    private readonly joinArgs: string[],
    private readonly events: ClientEvents,
  ) {}

  start(): void {
    this.generation++
    this.alive = true
    this.finished = false
    const generation = this.generation
    const proc = this.group.spawn(['join', ...this.joinArgs, '--identity', this.identityPath, '--json'])
    this.proc = proc
    lines(proc.stdout!, (line) => {
      const e = parseJsonLine(line)
      if (e) this.events.onEvent(e, generation)
    })
    lines(proc.stderr!, (line) => {
      this.stderrTail.push(line)
      if (this.stderrTail.length > 20) this.stderrTail.shift()
    })
    void proc.then((r) => {
      if (this.proc !== proc) return
      this.alive = false
      this.events.onExit(r.exitCode ?? null, generation)
    })
  }

  kill(): void {
    this.proc?.kill('SIGKILL')
  }
}
