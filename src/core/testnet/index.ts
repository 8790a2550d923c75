import {existsSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {dirname, join, resolve} from 'node:path'
import {loadRunConfigFile, programRefusal, programUnsupported} from '../config/index.js'
import {PsycheError} from '../errors.js'
import {generateIdentity, saveIdentity} from '../protocol/identity.js'
import {describeEvent, eventSeverity, type Severity} from '../obs/event-text.js'
import {KillScheduler, killCandidates} from './kills.js'
import {parseRoundLine, RoundBook, type TestnetSummary} from './summary.js'
import {ClientProcess, ProcessGroup, startServer} from './supervisor.js'
import type {SolanaTestnet} from './solana.js'

export {killCandidates, pickVictims} from './kills.js'
export {RoundBook, parseRoundLine, type TestnetSummary} from './summary.js'

/**
 * A local testnet, the launcher behind `psyche testnet`: one `psyche server run` and N `psyche join` processes
 * on this machine (supervisor.ts), their round events gathered into one summary (summary.ts), optionally K
 * random clients killed every S seconds (or once, after a given round) and restarted with the same identity (kills.ts).
 */

interface TestnetOptions {
  clients: number
  /** The coordinator: `psyche server run` (centralized, default), or the Solana program in a localnet (solana). */
  backend?: 'centralized' | 'solana'
  /** A run directory holding state.toml, or the state.toml itself. */
  config: string
  /** Stop once every live client has applied this many rounds (steps); default: until the run is Finished. */
  rounds?: number
  randomKillNum?: number
  /** Seconds between random kills (default 30). */
  randomKillInterval?: number
  /**
   * Once every live client has applied this round (step), kill randomKillNum random clients (at least 1) once, and
   * restart them: a kill at a known point of the run, in the middle of the next round.
   */
  killAfterStep?: number
  /** Seconds a killed client stays down before it is restarted (default 2). */
  restartDelay?: number
  threads?: number
  /** Per client (client-0 first), the shards it holds its model in (join --shard); missing or 1: unsharded. */
  shards?: number[]
  /** The clients' validation interval (join --eval-every); default: join's. */
  evalEvery?: number
  /** Give up after this many seconds (default 900). */
  timeout?: number
  /** Random source for picking victims (default Math.random); tests pass a seeded one. */
  random?: () => number
  onEvent?: (event: TestnetEvent) => void
  /** Aborting it (the command does on Ctrl-C or SIGTERM) ends the testnet the orderly way: every child stopped, temporary files removed. */
  signal?: AbortSignal
}

type TestnetEvent =
  | {kind: 'server'; port: number}
  | {kind: 'solana'; url: string; program_id: string}
  | {kind: 'client_started'; client: string; generation: number}
  | {kind: 'round'; client: string; step: number; epoch: number; loss: number | null; param_hash: string}
  | {kind: 'killed'; client: string; after_step: number | null}
  | {kind: 'note'; client: string; text: string; severity: Severity}
  | {kind: 'exited'; client: string; code: number | null}

/** Client events worth a line in the testnet's view. */
const NOTED_EVENTS = new Set(['model_loaded', 'waiting', 'worker_crashed', 'worker_restarted', 'out_of_sync', 'rejoining', 'health_check'])

/** The state.toml of a run directory (or the file itself). */
export function runConfigPath(config: string): string {
  const path = resolve(config)
  if (!existsSync(path)) throw new PsycheError(`--config ${config}: no such file or directory`)
  const file = statSync(path).isDirectory() ? join(path, 'state.toml') : path
  if (!existsSync(file)) throw new PsycheError(`--config ${config}: no state.toml in this directory`)
  return file
}

/**
 * The state.toml the testnet's server runs: the given one, except that every epoch waits for all N clients
 * (init_min_clients = N, which gates every epoch's start, as in Psyche). Otherwise the first client to start would
 * begin an epoch alone and the others would wait a whole epoch. Written next to the original (relative paths in it keep working) and removed at the end.
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

/** Runs a local testnet until its end condition (rounds, Finished, failure, timeout or a signal). Every process is stopped at the end. */
export async function runTestnet(options: TestnetOptions): Promise<TestnetSummary> {
  if (!Number.isInteger(options.clients) || options.clients < 1) throw new PsycheError(`--clients ${options.clients}: must be a positive integer`)
  const statePath = runConfigPath(options.config)
  const run = await loadRunConfigFile(statePath)
  if (!run.run_id) throw new PsycheError(`${statePath}: run_id: a testnet needs a state.toml with a run_id`)
  const runId = run.run_id
  if (options.backend === 'solana') {
    // refused before anything starts, naming the user's file (the program would refuse the testnet's copy of it)
    const unsupported = programUnsupported(run)
    if (unsupported.length > 0) throw new PsycheError(programRefusal(statePath, unsupported), {code: 'ECONFIG'})
  }
  const emit = options.onEvent ?? (() => {})
  const started = performance.now()
  const seconds = () => (performance.now() - started) / 1000
  const work = mkdtempSync(join(tmpdir(), 'psyche-testnet-'))

  const names = Array.from({length: options.clients}, (_, i) => `client-${i}`)
  const book = new RoundBook(names)
  const group = new ProcessGroup()
  const clients: ClientProcess[] = []
  let ended: TestnetSummary['ended'] = 'timeout'
  let serverDown = false
  let interrupted = false
  let wake: () => void = () => {}
  const onAbort = () => {
    interrupted = true
    wake()
  }
  options.signal?.addEventListener('abort', onAbort, {once: true})
  if (options.signal?.aborted) interrupted = true

  const kills = new KillScheduler<ClientProcess>({
    count: options.randomKillNum ?? 0,
    intervalMs: (options.randomKillInterval ?? 30) * 1000,
    restartDelayMs: (options.restartDelay ?? 2) * 1000,
    random: options.random ?? Math.random,
    candidates: () => killCandidates(clients, options.rounds),
    kill: (victim) => {
      book.recordKill(victim.name, seconds(), victim.lastStep)
      emit({kind: 'killed', client: victim.name, after_step: victim.lastStep})
      victim.kill()
    },
    restart: (victim) => startClient(victim),
  })

  let killedAfterStep = false

  /** Applied rounds per client generation: a restarted client's first one is its rejoin. */
  const firstRoundSeen = new Map<string, number>()
  const startClient = (client: ClientProcess) => {
    client.start()
    emit({kind: 'client_started', client: client.name, generation: client.generation})
  }
  const newClient = (name: string, identityPath: string, port: number) => {
    // One machine: libp2p on loopback only, so clients are told (and dial) loopback addresses.
    const coordinator = solana ? ['--rpc', solana.url, '--ws-rpc', solana.wsUrl, '--program-id', solana.programId] : ['--server-addr', `127.0.0.1:${port}`]
    const joinArgs = [...coordinator, '--run-id', runId, '--config', statePath, '--p2p-listen', '/ip4/127.0.0.1/tcp/0']
    if (options.threads) joinArgs.push('--threads', String(options.threads))
    const shard = options.shards?.[names.indexOf(name)] ?? 1
    if (shard > 1) joinArgs.push('--shard', String(shard))
    if (options.evalEvery !== undefined) joinArgs.push('--eval-every', String(options.evalEvery))
    const client: ClientProcess = new ClientProcess(name, identityPath, group, joinArgs, {
      onEvent: (e, generation) => {
        if (e.event === 'round') {
          const r = parseRoundLine(e)
          if (!r) return
          book.recordRound(name, r)
          client.lastStep = r.step
          const all = clients.filter((c) => c.alive)
          if (options.killAfterStep !== undefined && !killedAfterStep && all.every((c) => (c.lastStep ?? 0) >= options.killAfterStep!)) {
            killedAfterStep = true
            kills.killNow(Math.max(1, options.randomKillNum ?? 0))
          }
          if (generation > 1 && firstRoundSeen.get(name) !== generation) book.recordRejoin(name, seconds(), {step: r.step, param_hash: r.param_hash})
          firstRoundSeen.set(name, generation)
          emit({kind: 'round', client: name, step: r.step, epoch: r.epoch, loss: r.loss, param_hash: r.param_hash})
          wake()
        } else if (e.event === 'speculation') {
          book.recordSpeculation(name, e.outcome)
        } else if (e.event === 'finished') {
          client.finished = true
          wake()
        } else if (NOTED_EVENTS.has(e.event as string)) {
          emit({kind: 'note', client: name, text: describeEvent(e as Record<string, unknown> & {event: string}), severity: eventSeverity(e as {event: string})})
        }
      },
      onExit: (code, generation) => {
        book.recordExit(name)
        emit({kind: 'exited', client: name, code})
        if (generation > 1 && firstRoundSeen.get(name) !== generation) book.recordRejoin(name, seconds(), null)
        wake()
      },
    })
    return client
  }

  const serverState = serverStateFile(statePath, options.clients, run.config?.init_min_clients)
  let solana: SolanaTestnet | undefined
  try {
    let port = 0
    if (options.backend === 'solana') {
      const {startSolanaRun} = await import('./solana.js') // the Solana libraries load only for this backend
      solana = await startSolanaRun(serverState.path)
      emit({kind: 'solana', url: solana.url, program_id: solana.programId})
    } else {
      const server = await startServer(group, serverState.path, join(work, 'server'))
      port = server.port
      emit({kind: 'server', port})
      void server.proc.then(() => {
        serverDown = true
        wake()
      })
    }

    for (const name of names) {
      const identityPath = join(work, `${name}.json`)
      const identity = generateIdentity()
      await saveIdentity(identity, identityPath)
      solana?.fund(identity.id)
      const client = newClient(name, identityPath, port)
      clients.push(client)
      startClient(client)
    }
    kills.start()

    const deadline = Date.now() + (options.timeout ?? 900) * 1000
    for (;;) {
      if (interrupted) {
        ended = 'interrupted'
        break
      }
      const live = clients.filter((c) => c.alive)
      if (options.rounds !== undefined && live.length > 0 && live.every((c) => (c.lastStep ?? 0) >= options.rounds!)) {
        ended = 'rounds'
        break
      }
      if (clients.every((c) => c.finished)) {
        ended = 'finished'
        break
      }
      if (serverDown || (clients.every((c) => !c.alive) && !kills.active)) {
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
    options.signal?.removeEventListener('abort', onAbort)
    kills.stop()
    for (const c of clients) c.alive = false
    await group.stopAll()
    await solana?.close()
    rmSync(work, {recursive: true, force: true})
    serverState.remove()
  }

  return book.summary({runId, rounds: options.rounds, wallSeconds: seconds(), ended})
}
