import type {EventLine} from '../../src/core/events.js'
import {readFileSync, writeFileSync} from 'node:fs'
import {connect, type Socket} from 'node:net'
import {join} from 'node:path'
import {CoordinatorConnection, CoordinatorServer, type CoordinatorServerOptions} from '../../src/core/backend/index.js'
import {loadRunConfigFile} from '../../src/core/config/index.js'
import {participantKey, witnessBloomParams} from '../../src/core/coordinator/rules.js'
import type {CoordinatorState, Round} from '../../src/core/coordinator/types.js'
import {BloomFilter} from '../../src/core/primitives/bloom.js'
import {FrameReader, decodeServerMessage, encodeClientMessage, type ClientBodies, type ClientKind, type Identity, type ServerEnvelope} from '../../src/core/protocol/index.js'
import {projectRoot} from '../../src/core/worker/python.js'

export const RUN_ID = 'tiny-demo'

/**
 * The tiny demo's state.toml in `dir`, with phase times shrunk (seconds of the test's virtual clock)
 * and any `key = value` lines of [config] replaced.
 */
export function writeRunConfig(dir: string, config: Record<string, number> = {}): string {
  let text = readFileSync(join(projectRoot, 'templates', 'tiny-demo', 'state.toml'), 'utf8')
  const values = {warmup_time: 2, cooldown_time: 2, max_round_train_time: 5, round_witness_time: 1, waiting_for_members_extra_time: 1, ...config}
  for (const [key, value] of Object.entries(values)) {
    const re = new RegExp(`^${key} = .*$`, 'm')
    if (!re.test(text)) throw new Error(`state.toml has no ${key}`)
    text = text.replace(re, `${key} = ${value}`)
  }
  const path = join(dir, 'state.toml')
  writeFileSync(path, text)
  return path
}

/** A clock the test moves by hand: the coordinator's unix milliseconds, advanced in seconds. */
export class Clock {
  t = 1_700_000_000_000
  now = () => this.t
  advance(seconds: number): void {
    this.t += seconds * 1000
  }
}

export async function waitUntil<T>(get: () => T | undefined | false, what: string, timeoutMs = 5000): Promise<T> {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    const value = get()
    if (value) return value
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`)
    await new Promise((r) => setTimeout(r, 10))
  }
}

export interface TestServer {
  server: CoordinatorServer
  logs: Record<string, unknown>[]
  clock: Clock
  addr: string
  /** The first log line (from index `from`) whose fields include all of `match`. */
  waitLog(match: Record<string, unknown>, from?: number): Promise<Record<string, unknown>>
}

export async function startTestServer(statePath: string, options: Partial<CoordinatorServerOptions> & {clock?: Clock} = {}): Promise<TestServer> {
  const logs: EventLine[] = []
  const clock = options.clock ?? new Clock()
  const server = await CoordinatorServer.start({
    run: await loadRunConfigFile(statePath),
    tickIntervalMs: 20,
    now: clock.now,
    log: (e) => logs.push(e),
    ...options,
  })
  const matches = (line: Record<string, unknown>, match: Record<string, unknown>) => Object.entries(match).every(([k, v]) => line[k] === v)
  return {
    server,
    logs,
    clock,
    addr: `127.0.0.1:${server.port}`,
    waitLog: (match, from = 0) => waitUntil(() => logs.slice(from).find((l) => matches(l, match)), `log line ${JSON.stringify(match)}; got ${JSON.stringify(logs.slice(-5))}`),
  }
}

/**
 * A hand-driven client over a plain socket: the tests use it to send exactly the bytes an attacker
 * would (forged, replayed, oversized, garbage), and to watch what the server answers.
 */
export class RawClient {
  readonly messages: ServerEnvelope[] = []
  readonly dropped: string[] = []
  private readonly reader = new FrameReader()
  closed = false
  session?: string
  seq = 0

  private constructor(readonly socket: Socket) {
    socket.on('data', (chunk) => {
      for (const frame of this.reader.push(chunk)) {
        if (!frame.ok) continue
        const d = decodeServerMessage(frame.body)
        if (!d.ok) this.dropped.push(d.reason)
        else {
          if (d.envelope.kind === 'challenge') this.session = d.envelope.body.session
          this.messages.push(d.envelope)
        }
      }
    })
    socket.on('error', () => {})
    socket.on('close', () => (this.closed = true))
  }

  static async open(port: number): Promise<RawClient> {
    const socket = connect({host: '127.0.0.1', port})
    await new Promise<void>((resolve, reject) => {
      socket.once('connect', resolve)
      socket.once('error', reject)
    })
    const c = new RawClient(socket)
    await waitUntil(() => c.session, 'the challenge')
    return c
  }

  write(bytes: Uint8Array): void {
    this.socket.write(bytes)
  }

  /** Signs and sends a message (fields default to this connection's next seq, its session, the test run, step 1); returns the frame. */
  send<K extends ClientKind>(identity: Identity, kind: K, body: ClientBodies[K], over: Partial<{run_id: string; step: number; seq: number; session: string}> = {}): Buffer {
    const frame = this.frame(identity, kind, body, over)
    this.write(frame)
    return frame
  }

  /** The frame send() would write, without writing it (to tamper with first). */
  frame<K extends ClientKind>(identity: Identity, kind: K, body: ClientBodies[K], over: Partial<{run_id: string; step: number; seq: number; session: string}> = {}): Buffer {
    const seq = over.seq ?? this.seq + 1
    this.seq = Math.max(this.seq, seq)
    return encodeClientMessage(identity, kind, {run_id: RUN_ID, step: 1, seq, session: this.session!, ...over}, body)
  }

  async hello(identity: Identity, join = true, p2pAddrs: string[] = []): Promise<void> {
    const from = this.messages.length
    this.send(identity, 'hello', {run_id: RUN_ID, client_id: identity.id, p2p_addrs: p2pAddrs, want_join: join}, {step: 0})
    await this.next((m) => m.kind === 'state', from)
  }

  /** The first message from index `from` on that satisfies `pred`. */
  next(pred: (m: ServerEnvelope) => boolean, from = 0, timeoutMs = 5000): Promise<ServerEnvelope> {
    return waitUntil(() => this.messages.slice(from).find(pred), 'a server message', timeoutMs)
  }

  /** The `rejected` answer (from index `from`) with this code. */
  rejection(code: string, from = 0): Promise<ServerEnvelope> {
    return this.next((m) => m.kind === 'rejected' && m.body.code === code, from)
  }

  /** The latest state pushed. */
  get state() {
    const last = [...this.messages].reverse().find((m) => m.kind === 'state')
    return last?.kind === 'state' ? last.body.state : undefined
  }

  async close(): Promise<void> {
    if (this.closed) return
    await new Promise<void>((resolve) => {
      this.socket.once('close', () => resolve())
      this.socket.destroy()
    })
  }
}

/** Resolves with the first state pushed to `c` (from now on) that satisfies `pred`. */
export function nextState(c: CoordinatorConnection, pred: (s: CoordinatorState) => boolean): Promise<CoordinatorState> {
  if (c.state && pred(c.state)) return Promise.resolve(c.state)
  return new Promise((resolve) => {
    const on = (s: CoordinatorState) => {
      if (pred(s)) {
        c.off('state', on)
        resolve(s)
      }
    }
    c.on('state', on)
  })
}

/**
 * A witness proof of the state's round that saw these clients alive but none of their results: the round waits out its witness phase (no
 * early close), and none of them is dropped as unseen when it closes (coordinator/rules.ts unseenTrainers).
 */
export function aliveProof(state: CoordinatorState, ids: string[]): {participant_bloom: string; broadcast_bloom: string} {
  const params = witnessBloomParams(state.config, state.epoch.round!)
  const participants = new BloomFilter(params)
  for (const id of ids) participants.add(participantKey(id))
  return {participant_bloom: participants.toBase64(), broadcast_bloom: new BloomFilter(params).toBase64()}
}

/**
 * The state of round `step` once it starts, whether the round before closes at once (every witness saw every
 * trainer) or after its witness phase: with `clock`, time is moved past that phase when it begins.
 */
export function nextRound(c: CoordinatorConnection, step: number, clock?: {advance(seconds: number): void}): Promise<CoordinatorState> {
  let advanced = false
  return nextState(c, (s) => {
    if (clock && !advanced && s.run_state === 'RoundWitness') {
      advanced = true
      clock.advance(2)
    }
    return s.run_state === 'RoundTrain' && s.progress.step === step
  })
}
