import {existsSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {dirname, join, resolve} from 'node:path'
import {execa, type ResultPromise} from 'execa'
import {loadRunConfigFile} from '../config/index.js'
import {PsycheError} from '../errors.js'
import {parseJsonLine} from '../json-lines.js'
import {generateIdentity, saveIdentity} from '../protocol/identity.js'
import {projectRoot} from '../worker/python.js'

const cliPath = join(projectRoot, 'bin', 'psyche.js')

export interface TestnetOptions {
  clients: number
  /** A run directory holding state.toml, or the state.toml itself. */
  config: string
  /** Stop once every live client has applied this many rounds (steps); default: until the run is Finished. */
  rounds?: number
  randomKillNum?: number
  /** Seconds between random kills (default 30). */
  randomKillInterval?: number
  /** Seconds a killed client stays down before it is restarted (default 2). */
  restartDelay?: number
  threads?: number
  /** Give up after this many seconds (default 900). */
  timeout?: number
  /** Random source for picking victims (default Math.random); tests pass a seeded one. */
  random?: () => number
  onEvent?: (event: TestnetEvent) => void
}

export type TestnetEvent =
  | {kind: 'server'; port: number}
  | {kind: 'client_started'; client: string; generation: number}
  | {kind: 'round'; client: string; step: number; epoch: number; loss: number | null; param_hash: string}
  | {kind: 'killed'; client: string; after_step: number | null}
  | {kind: 'note'; client: string; text: string}
  | {kind: 'exited'; client: string; code: number | null}

export interface ClientRound {
  loss: number | null
  param_hash: string
}

export interface TestnetSummary {
  run_id: string
  clients: string[]
  /** Per applied round: each client's loss (null: did not train in it) and parameter hash, and whether all hashes agree. */
  rounds: {step: number; epoch: number; clients: Record<string, ClientRound>; hashes_equal: boolean}[]
  kills: {client: string; at_seconds: number; after_step: number | null}[]
  /** A killed client's first applied round after its restart (null: it did not get to apply one). */
  rejoins: {client: string; at_seconds: number; first_step: number | null; param_hash: string | null}[]
  /** Bytes of result/model transfers per client, summed over its restarts. */
  bytes: Record<string, {in: number; out: number}>
  /** Mean compressed result size per client per round, and the dense fp32 size it replaces (when known). */
  result_bytes_per_round: number | null
  wall_seconds: number
  ended: 'rounds' | 'finished' | 'timeout' | 'failed' | 'interrupted'
}

interface ClientSlot {
  name: string
  identityPath: string
  proc?: ResultPromise
  generation: number
  alive: boolean
  lastStep: number | null
  /** bytes of earlier generations (a restarted process counts from zero). */
  bytesBefore: {in: number; out: number}
  bytesNow: {in: number; out: number}
  finished: boolean
  stderrTail: string[]
}

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

/** The state.toml of a run directory (or the file itself). */
export function runConfigPath(config: string): string {
  const path = resolve(config)
  if (!existsSync(path)) throw new PsycheError(`--config ${config}: no such file or directory`)
  const file = statSync(path).isDirectory() ? join(path, 'state.toml') : path
  if (!existsSync(file)) throw new PsycheError(`--config ${config}: no state.toml in this directory`)
  return file
}

/**
 * The state.toml the testnet's server runs: the given one, except that the first epoch waits for all N clients
 * (init_min_clients = N). Otherwise the first client to start would begin an epoch alone and the others would
 * wait a whole epoch. Written next to the original (relative paths in it keep working) and removed at the end.
 */
function serverStateFile(statePath: string, clients: number, initMinClients: number | undefined): {path: string; remove: () => void} {
  if (initMinClients !== undefined && initMinClients >= clients) return {path: statePath, remove: () => {}}
  const text = readFileSync(statePath, 'utf8')
  const line = /^init_min_clients\s*=.*$/m
  if (!line.test(text)) return {path: statePath, remove: () => {}}
  const path = join(dirname(statePath), `.testnet-${process.pid}-state.toml`)
  writeFileSync(path, text.replace(line, `init_min_clients = ${clients}`))
  return {path, remove: () => rmSync(path, {force: true})}
}

/**
 * A local testnet: one `psyche server run` and N `psyche join` processes on this machine, their JSON lines
 * gathered into one picture; optionally K random clients killed (SIGKILL) every S seconds and restarted with
 * the same identity. Every process is stopped at the end, whatever happens.
 */
export async function runTestnet(options: TestnetOptions): Promise<TestnetSummary> {
  if (!Number.isInteger(options.clients) || options.clients < 1) throw new PsycheError(`--clients ${options.clients}: must be a positive integer`)
  const statePath = runConfigPath(options.config)
  const run = await loadRunConfigFile(statePath)
  if (!run.run_id) throw new PsycheError(`${statePath}: run_id: a testnet needs a state.toml with a run_id`)
  const runId = run.run_id
  const emit = options.onEvent ?? (() => {})
  const random = options.random ?? Math.random
  const started = performance.now()
  const seconds = () => (performance.now() - started) / 1000
  const work = mkdtempSync(join(tmpdir(), 'psyche-testnet-'))

  const rounds = new Map<number, {epoch: number; clients: Record<string, ClientRound>}>()
  const kills: TestnetSummary['kills'] = []
  const rejoins: TestnetSummary['rejoins'] = []
  const resultBytes: number[] = []
  const slots: ClientSlot[] = []
  const children = new Set<ResultPromise>()
  let server: ResultPromise | undefined
  let serverTail: string[] = []
  let ended: TestnetSummary['ended'] = 'timeout'
  let serverDown = false
  let interrupted = false
  // Ctrl-C (or SIGTERM) ends the testnet the orderly way: every child stopped, temporary files removed. `on`, not
  // `once`: execa's signal-exit re-raises a signal that has no other listener left when it runs.
  const onSignal = () => {
    interrupted = true
    wake()
  }
  process.on('SIGINT', onSignal)
  process.on('SIGTERM', onSignal)
  let wake: () => void = () => {}

  const spawn = (args: string[]) => {
    const child = execa(process.execPath, [cliPath, ...args], {cwd: projectRoot, env: {NO_COLOR: '1', CI: '1'}, reject: false, stdin: 'ignore', buffer: false, cleanup: true})
    children.add(child)
    void child.then(() => children.delete(child))
    return child
  }

  const startClient = (slot: ClientSlot, port: number) => {
    slot.generation++
    slot.alive = true
    slot.finished = false
    const generation = slot.generation
    const restarted = generation > 1
    let firstRound = true
    const args = ['join', '--server-addr', `127.0.0.1:${port}`, '--run-id', runId, '--config', statePath, '--identity', slot.identityPath, '--json']
    if (options.threads) args.push('--threads', String(options.threads))
    const proc = spawn(args)
    slot.proc = proc
    emit({kind: 'client_started', client: slot.name, generation})
    lines(proc.stdout!, (line) => {
      const e = parseJsonLine(line)
      if (!e) return
      if (e.event === 'round') {
        const step = e.step as number
        let r = rounds.get(step)
        if (!r) rounds.set(step, (r = {epoch: e.epoch as number, clients: {}}))
        r.clients[slot.name] = {loss: (e.loss as number | null) ?? null, param_hash: e.param_hash as string}
        slot.lastStep = step
        slot.bytesNow = {in: e.bytes_in as number, out: e.bytes_out as number}
        if (typeof e.result_bytes === 'number') resultBytes.push(e.result_bytes)
        if (restarted && firstRound) rejoins.push({client: slot.name, at_seconds: seconds(), first_step: step, param_hash: e.param_hash as string})
        firstRound = false
        emit({kind: 'round', client: slot.name, step, epoch: e.epoch as number, loss: (e.loss as number | null) ?? null, param_hash: e.param_hash as string})
        wake()
      } else if (e.event === 'finished') {
        slot.finished = true
        wake()
      } else if (e.event === 'model_loaded' || e.event === 'worker_crashed' || e.event === 'out_of_sync' || e.event === 'rejoining' || e.event === 'health_check') {
        emit({kind: 'note', client: slot.name, text: `${e.event} ${JSON.stringify({...e, event: undefined, source: undefined})}`})
      }
    })
    lines(proc.stderr!, (line) => {
      slot.stderrTail.push(line)
      if (slot.stderrTail.length > 20) slot.stderrTail.shift()
    })
    void proc.then((r) => {
      if (slot.proc !== proc) return
      slot.alive = false
      slot.bytesBefore = {in: slot.bytesBefore.in + slot.bytesNow.in, out: slot.bytesBefore.out + slot.bytesNow.out}
      slot.bytesNow = {in: 0, out: 0}
      emit({kind: 'exited', client: slot.name, code: r.exitCode ?? null})
      if (restarted && firstRound) rejoins.push({client: slot.name, at_seconds: seconds(), first_step: null, param_hash: null})
      wake()
    })
  }

  const timers: NodeJS.Timeout[] = []
  const serverState = serverStateFile(statePath, options.clients, run.config?.init_min_clients)
  try {
    server = spawn(['server', 'run', '--state', serverState.path, '--save-state-dir', join(work, 'server'), '--json'])
    const port = await new Promise<number>((resolvePort, reject) => {
      const timer = setTimeout(() => reject(new PsycheError(`the coordinator server did not report listening within 60 s: ${serverTail.join(' | ')}`)), 60_000)
      lines(server!.stdout!, (line) => {
        const e = parseJsonLine(line)
        if (e?.event === 'listening' && typeof e.port === 'number') {
          clearTimeout(timer)
          resolvePort(e.port)
        }
      })
      lines(server!.stderr!, (line) => {
        serverTail = [...serverTail.slice(-9), line]
      })
      void server!.then((r) => {
        clearTimeout(timer)
        reject(new PsycheError(`the coordinator server exited with code ${r.exitCode}: ${serverTail.join(' | ')}`))
      })
    })
    emit({kind: 'server', port})
    void server.then(() => {
      serverDown = true
      wake()
    })

    for (let i = 0; i < options.clients; i++) {
      const identityPath = join(work, `client-${i}.json`)
      await saveIdentity(generateIdentity(), identityPath)
      const slot: ClientSlot = {name: `client-${i}`, identityPath, generation: 0, alive: false, lastStep: null, bytesBefore: {in: 0, out: 0}, bytesNow: {in: 0, out: 0}, finished: false, stderrTail: []}
      slots.push(slot)
      startClient(slot, port)
    }

    const killNum = options.randomKillNum ?? 0
    if (killNum > 0) {
      const interval = (options.randomKillInterval ?? 30) * 1000
      const killer = setInterval(() => {
        // Never kill every client: the run (and the model) lives in the survivors.
        const alive = slots.filter((s) => s.alive && !s.finished)
        const victims: ClientSlot[] = []
        while (victims.length < Math.min(killNum, alive.length - 1)) {
          const pick = alive[Math.floor(random() * alive.length)]
          if (!victims.includes(pick)) victims.push(pick)
        }
        for (const v of victims) {
          kills.push({client: v.name, at_seconds: seconds(), after_step: v.lastStep})
          emit({kind: 'killed', client: v.name, after_step: v.lastStep})
          v.proc?.kill('SIGKILL')
          timers.push(setTimeout(() => startClient(v, port), (options.restartDelay ?? 2) * 1000))
        }
      }, interval)
      timers.push(killer)
    }

    const deadline = Date.now() + (options.timeout ?? 900) * 1000
    for (;;) {
      if (interrupted) {
        ended = 'interrupted'
        break
      }
      const live = slots.filter((s) => s.alive)
      if (options.rounds !== undefined && live.length > 0 && live.every((s) => (s.lastStep ?? 0) >= options.rounds!)) {
        ended = 'rounds'
        break
      }
      if (slots.every((s) => s.finished)) {
        ended = 'finished'
        break
      }
      if (serverDown || (slots.every((s) => !s.alive) && timers.length === 0)) {
        ended = 'failed'
        break
      }
      if (Date.now() > deadline) break
      await new Promise<void>((r) => {
        wake = r
        setTimeout(r, 500)
      })
    }
  } finally {
    process.removeListener('SIGINT', onSignal)
    process.removeListener('SIGTERM', onSignal)
    for (const t of timers) clearTimeout(t)
    for (const t of timers) clearInterval(t)
    timers.length = 0
    for (const s of slots) s.alive = false
    const all = [...children]
    for (const c of all) c.kill('SIGTERM')
    const force = setTimeout(() => {
      for (const c of all) c.kill('SIGKILL')
    }, 5000)
    await Promise.all(all)
    clearTimeout(force)
    rmSync(work, {recursive: true, force: true})
    serverState.remove()
  }

  const steps = [...rounds.keys()].sort((a, b) => a - b).filter((s) => options.rounds === undefined || s <= options.rounds)
  return {
    run_id: runId,
    clients: slots.map((s) => s.name),
    rounds: steps.map((step) => {
      const r = rounds.get(step)!
      const hashes = new Set(Object.values(r.clients).map((c) => c.param_hash))
      return {step, epoch: r.epoch, clients: r.clients, hashes_equal: hashes.size === 1}
    }),
    kills,
    rejoins,
    bytes: Object.fromEntries(slots.map((s) => [s.name, {in: s.bytesBefore.in + s.bytesNow.in, out: s.bytesBefore.out + s.bytesNow.out}])),
    result_bytes_per_round: resultBytes.length ? Math.round(resultBytes.reduce((a, b) => a + b, 0) / resultBytes.length) : null,
    wall_seconds: Math.round(seconds() * 10) / 10,
    ended,
  }
}
