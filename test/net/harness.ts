import type {EventLine, RoundEvent} from '../../src/core/events.js'
import assert from 'node:assert/strict'
import {mkdirSync, writeFileSync} from 'node:fs'
import {basename, join} from 'node:path'
import {generateIdentity, saveIdentity} from '../../src/core/protocol/identity.js'
import {JsonProcess, writeE2eRun, type RunShape} from '../e2e/helpers.js'
import type {Lab, Host} from './lab.js'

/**
 * Runs of psyche across the hosts of a Lab: `psyche server run` on one host, `psyche join` on others, each a
 * real process inside its host's network namespace, talking over the lab's links only.
 */
export class NetRun {
  readonly clients = new Map<string, {host: Host; identityPath: string; procs: JsonProcess[]}>()
  server!: JsonProcess
  port = 0
  relay: {peer_id: string; port: number} | undefined
  readonly state: string
  constructor(
    readonly lab: Lab,
    readonly dir: string,
    readonly coordinator: Host,
    shape: RunShape,
  ) {
    this.state = writeE2eRun(dir, shape)
  }

  async startServer(extra: string[] = []): Promise<void> {
    this.server = new JsonProcess('server', ['server', 'run', '--state', this.state, '--host', '0.0.0.0', '--json', ...extra], undefined, this.lab.exec(this.coordinator, []))
    const listening = await this.server.waitFor((e) => e.event === 'listening', 'the server to listen', 60_000)
    this.port = listening.port as number
    if (!extra.includes('--no-relay')) {
      const relay = await this.server.waitFor((e) => e.event === 'relay_listening', 'the relay to listen', 10_000)
      this.relay = {peer_id: relay.peer_id as string, port: relay.port as number}
    }
  }

  /** Starts (or restarts, with the same identity) the client `name` on `host`. */
  async startClient(name: string, host: Host, extra: string[] = []): Promise<JsonProcess> {
    let slot = this.clients.get(name)
    if (!slot) {
      const identityPath = join(this.dir, `${name}.json`)
      await saveIdentity(generateIdentity(), identityPath)
      this.clients.set(name, (slot = {host, identityPath, procs: []}))
    }
    const args = [
      'join',
      '--server-addr',
      `${this.coordinator.ip}:${this.port}`,
      '--run-id',
      'e2e',
      '--config',
      this.state,
      '--identity',
      slot.identityPath,
      '--threads',
      '1',
      '--json',
      ...extra,
      // PSYCHE_NET_CLIENT_ARGS adds flags to every client, for measurements (e.g. --no-webrtc: the scenario as before WebRTC).
      ...(process.env.PSYCHE_NET_CLIENT_ARGS?.split(' ').filter(Boolean) ?? []),
    ]
    const proc = new JsonProcess(slot.procs.length ? `${name}#${slot.procs.length + 1}` : name, args, undefined, this.lab.exec(host, []))
    slot.procs.push(proc)
    return proc
  }

  /** The latest process of each client. */
  latest(): JsonProcess[] {
    return [...this.clients.values()].map((c) => c.procs.at(-1)!)
  }

  all(): JsonProcess[] {
    return [this.server, ...[...this.clients.values()].flatMap((c) => c.procs)].filter(Boolean)
  }

  async stop(): Promise<void> {
    await Promise.all(this.all().map((p) => p.stop()))
    // PSYCHE_NET_LOGS=DIR keeps every process's events (one JSON line each) and stderr, for a failure's post-mortem.
    const keep = process.env.PSYCHE_NET_LOGS
    if (keep) {
      mkdirSync(keep, {recursive: true})
      for (const p of this.all()) {
        const file = join(keep, `${basename(this.dir)}-${p.name.replace(/[^\w#-]/g, '_')}`)
        writeFileSync(`${file}.jsonl`, p.events.map((e, i) => JSON.stringify({t: p.times[i], ...e})).join('\n') + '\n')
        writeFileSync(`${file}.stderr`, p.stderr.join(''))
      }
    }
  }

  /** Server and client logs, for a failing assertion's message. */
  tails(): string {
    return this.all()
      .map(
        (p) =>
          `--- ${p.name}: ${p.events
            .slice(-8)
            .map((e) => JSON.stringify(e))
            .join('\n')}\n${p.stderr.join('').slice(-800)}`,
      )
      .join('\n')
  }
}

/** A client's round line (the multi-host tests read the connection counts, which a libp2p node always reports). */
type RoundLine = RoundEvent

export function meanLoss(clients: JsonProcess[], step: number): number {
  const l = clients.map((c) => rounds(c).find((r) => r.step === step)?.loss).filter((x): x is number => typeof x === 'number')
  return l.reduce((a, b) => a + b, 0) / l.length
}

export function rounds(p: JsonProcess): RoundLine[] {
  return p.rounds()
}

/**
 * What every scenario asserts: in each of `steps`, every listed client applied the round, applied the results
 * of every other client that trained in it (and others did train), all hold the same parameters, and the mean
 * loss fell from the first step to the last. A run that exchanged nothing fails here.
 */
export function assertExchanged(clients: JsonProcess[], steps: number[], expectOthers: number, options: {loss?: boolean} = {}): void {
  const hashes = new Set<string>()
  for (const step of steps) {
    const at = clients.map((c) => ({c, r: rounds(c).find((r) => r.step === step)}))
    for (const {c, r} of at) {
      assert.ok(r, `${c.name} applied step ${step}`)
      assert.equal(r.other_trainers, expectOthers, `${c.name} step ${step}: ${expectOthers} other clients trained (${JSON.stringify(r)})`)
      assert.equal(r.peers_applied, expectOthers, `${c.name} step ${step}: applied every other client's result (${JSON.stringify(r)})`)
    }
    const stepHashes = new Set(at.map(({r}) => r!.param_hash))
    assert.equal(stepHashes.size, 1, `step ${step}: parameter hashes differ: ${JSON.stringify(at.map(({c, r}) => [c.name, r!.param_hash]))}`)
    hashes.add([...stepHashes][0])
  }
  assert.equal(hashes.size, steps.length, 'the parameters changed every round')
  if (options.loss === false) return
  const mean = (step: number) => {
    const l = clients.map((c) => rounds(c).find((r) => r.step === step)?.loss).filter((x): x is number => typeof x === 'number')
    return l.reduce((a, b) => a + b, 0) / l.length
  }
  const first = mean(steps[0])
  const last = mean(steps.at(-1)!)
  assert.ok(last < first, `loss fell: ${first} -> ${last}`)
}

/** Waits until each client has applied `step`, or throws with every process's log tail. */
export async function waitForStep(run: NetRun, clients: JsonProcess[], step: number, timeoutMs: number): Promise<void> {
  try {
    await Promise.all(clients.map((c) => c.waitFor((e) => e.event === 'round' && e.step >= step, `round ${step}`, timeoutMs)))
  } catch (error) {
    throw new Error(`${(error as Error).message}\n${run.tails()}`)
  }
}

/** Bytes through the coordinator's link and the clients' links (their routers' WAN sides) between two moments. */
export function linkTotals(lab: Lab, coordinator: Host, clients: Host[]): {coordinator: number; clientsReceived: number} {
  const c = lab.linkBytes(coordinator)
  return {coordinator: c.rx + c.tx, clientsReceived: clients.reduce((sum, h) => sum + lab.linkBytes(h).rx, 0)}
}

/**
 * Per client, how long after meeting a peer through the relay its first direct connection was up: the `ms` of its
 * first webrtc_connected or hole_punched (each attempt starts as the relayed connection opens, or as the attempt
 * before it failed), plus the `ms` of the failed WebRTC attempt to that peer before a TCP punch; null: none.
 */
export function firstDirectMs(clients: JsonProcess[]): (number | null)[] {
  return clients.map((c) => {
    const i = c.events.findIndex((x) => x.event === 'webrtc_connected' || x.event === 'hole_punched')
    const e = c.events[i]
    if (!e || (e.event !== 'webrtc_connected' && e.event !== 'hole_punched')) return null
    const before = c.events.slice(0, i).find((x) => x.event === 'webrtc_failed' && x.peer_id === e.peer_id)
    return e.ms + (e.event === 'hole_punched' && before?.event === 'webrtc_failed' ? before.ms : 0)
  })
}

/** Per round between the two moments: the coordinator's link bytes, what the clients received, what they got through the relay, seconds. */
export function perRound(label: string, from: ReturnType<typeof linkTotals>, to: ReturnType<typeof linkTotals>, clients: JsonProcess[], steps: [number, number]): void {
  const n = steps[1] - steps[0]
  const at = (c: JsonProcess, step: number) => rounds(c).find((r) => r.step === step)!
  const relayed = clients.reduce((sum, c) => sum + (at(c, steps[1]).relayed_in ?? 0) - (at(c, steps[0]).relayed_in ?? 0), 0)
  const seconds = clients.map((c) => (c.times[c.events.indexOf(at(c, steps[1]))] - c.times[c.events.indexOf(at(c, steps[0]))]) / 1000 / n)
  const bytesIn = clients.reduce((sum, c) => sum + at(c, steps[1]).bytes_in - at(c, steps[0]).bytes_in, 0)
  const line = {
    scenario: label,
    rounds: n,
    coordinator_link_bytes_per_round: Math.round((to.coordinator - from.coordinator) / n),
    clients_received_bytes_per_round: Math.round((to.clientsReceived - from.clientsReceived) / n),
    relayed_in_bytes_per_round: Math.round(relayed / n),
    relayed_share: bytesIn > 0 ? Number((relayed / bytesIn).toFixed(4)) : null,
    first_direct_ms: firstDirectMs(clients),
    seconds_per_round: Number((seconds.reduce((a, b) => a + b, 0) / seconds.length).toFixed(2)),
  }
  // PSYCHE_NET_MEASURE=1 prints the numbers bench/README.md records.
  if (process.env.PSYCHE_NET_MEASURE) console.log(`# measure ${JSON.stringify(line)}`)
}

// Results of a few hundred KB (a wider model, DisTrO values unquantized): as in a real run, the results are the bulk,
// and the coordinator's own traffic (state pushes, gossip) is small beside them on the interface counters.
export const RESULTS_SHAPE = {
  roundsPerEpoch: 4,
  totalSteps: 4,
  initMinClients: 3,
  lr: 1e-2,
  maxRoundTrainTime: 20,
  warmupTime: 40,
  compressionTopk: 32,
  quantize1bit: false,
  model: {hidden_size: 256, intermediate_size: 512},
}

type Kind = 'hole_punched' | 'hole_punch_failed' | 'webrtc_connected' | 'webrtc_failed'
export function eventsOf<K extends Kind>(c: JsonProcess, kind: K): Extract<EventLine, {event: K}>[] {
  return c.events.filter((e): e is Extract<EventLine, {event: K}> => e.event === kind)
}

/** Each client's libp2p peer id (from its started event). */
export function peerIdsOf(clients: JsonProcess[]): Map<JsonProcess, string> {
  const ids = new Map<JsonProcess, string>()
  for (const c of clients)
    ids.set(
      c,
      String(
        c.events
          .find((e) => e.event === 'started')
          ?.p2p?.[0]?.split('/p2p/')
          .at(-1),
      ),
    )
  return ids
}

/**
 * Every pair of clients connected directly over WebRTC (UDP): each client logged webrtc_connected with both others
 * (in one role or the other), at the other's router's public address, within `withinMs` of meeting it through the
 * relay, and its relayed connections were closed afterwards.
 */
export function assertWebRtcMesh(clients: JsonProcess[], hosts: Host[], withinMs: number): void {
  const ids = peerIdsOf(clients)
  for (const c of clients) {
    const connected = eventsOf(c, 'webrtc_connected')
    const others = clients.filter((o) => o !== c).map((o) => ids.get(o)!)
    assert.deepEqual(
      [...new Set(connected.map((e) => e.peer_id))].sort(),
      others.sort(),
      `${c.name} connected over WebRTC to both others: ${JSON.stringify(c.events.filter((e) => /^(webrtc|hole_punch)/.test(String(e.event))))}`,
    )
    for (const e of connected) {
      const other = hosts[clients.findIndex((o) => ids.get(o) === e.peer_id)]
      assert.ok(
        e.addr.startsWith(`/ip4/${other.publicIp}/udp/`) && e.addr.includes('/webrtc/'),
        `${c.name} reached ${e.peer_id} at its router's public address over UDP: ${e.addr}`,
      )
      assert.ok(e.ms < withinMs, `${c.name}: the WebRTC connection to ${e.peer_id} took ${e.ms} ms (under ${withinMs} ms)`)
    }
    assert.deepEqual(eventsOf(c, 'hole_punched'), [], `${c.name}: no TCP punch was needed`)
    assert.ok(
      c.events.some((e) => e.event === 'relayed_closed'),
      `${c.name} closed a relayed connection once the direct one was up: ${JSON.stringify(c.events.filter((e) => String(e.event).startsWith('relayed')))}`,
    )
  }
}
