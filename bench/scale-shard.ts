// One process of the scale bench (bench/scale.bench.ts): `count` real clients, each with its own libp2p node on
// loopback TCP, its own TCP link to the coordinator server, and the load-test compute stand-in (LoadTestWorker, no
// PyTorch). Reports on stdout, one JSON object per line: each client's rounds, and the process's I/O and CPU every
// second (/proc/self/io counts every byte written to and read from its sockets).
// Usage: node --import tsx bench/scale-shard.ts '{"serverAddr":…,"runId":…,"count":…,"resultBytes":…,"computeMs":…}'
import {readFileSync} from 'node:fs'
import {P2PNode} from '../src/core/p2p/index.js'
import {generateIdentity} from '../src/core/protocol/identity.js'
import {startScaleClient, type ScaleClient} from '../test/scale/harness.js'

const o = JSON.parse(process.argv[2]) as {serverAddr: string; runId: string; count: number; resultBytes: number; computeMs: number; shard: number}
let stdoutBytes = 0
const out = (line: object) => {
  const text = JSON.stringify(line) + '\n'
  stdoutBytes += Buffer.byteLength(text)
  process.stdout.write(text)
}

function io(): {rchar: number; wchar: number} {
  const text = readFileSync('/proc/self/io', 'utf8')
  const field = (name: string) => Number(new RegExp(`^${name}: (\\d+)$`, 'm').exec(text)?.[1] ?? 0)
  return {rchar: field('rchar'), wchar: field('wchar')}
}

/** The shard's nodes' wire counters added up: bytes on connections, per protocol, and gossipsub's counters. */
function wire(): Record<string, number> {
  const sum: Record<string, number> = {}
  const add = (key: string, v: number) => (sum[key] = (sum[key] ?? 0) + v)
  for (const node of nodes) {
    const c = node.wireCounts()
    if (!c) continue
    add('conn_in', c.connections.in)
    add('conn_out', c.connections.out)
    for (const [protocol, io] of Object.entries(c.protocols)) {
      add(`in ${protocol}`, io.in)
      add(`out ${protocol}`, io.out)
    }
    for (const [k, v] of Object.entries(c.gossipsub)) add(`gossipsub ${k}`, v)
  }
  return sum
}

const sample = () => {
  const cpu = process.cpuUsage()
  out({t: 'proc', shard: o.shard, at: Date.now(), ...io(), stdout: stdoutBytes, cpu_ms: (cpu.user + cpu.system) / 1000, rss: process.memoryUsage().rss, wire: wire()})
}
const timer = setInterval(sample, 1000)

const clients: ScaleClient[] = []
const nodes: P2PNode[] = []
// A few at a time: each start dials the coordinator and listens.
for (let i = 0; i < o.count; i += 4) {
  const batch = await Promise.all(
    Array.from({length: Math.min(4, o.count - i)}, async (_, j) => {
      const identity = generateIdentity()
      const p2p = await P2PNode.start({
        identity,
        runId: o.runId,
        listen: ['/ip4/127.0.0.1/tcp/0'],
        relay: false,
        // TCP only, as the series of 2026-11-24 (before QUIC): BENCH_SCALE_QUIC=1 adds QUIC.
        quic: process.env.BENCH_SCALE_QUIC === '1',
        wireMetrics: true,
        // Every node of the bench is on 127.0.0.1: libp2p's per-host inbound rate limit (5 a second) would refuse
        // most of the dials. The connection bound is join's (--p2p-max-connections), or BENCH_SCALE_MAX_CONNECTIONS.
        connectionManager: {inboundConnectionThreshold: 100_000, maxIncomingPendingConnections: 256},
        ...(process.env.BENCH_SCALE_MAX_CONNECTIONS ? {maxPeerConnections: Number(process.env.BENCH_SCALE_MAX_CONNECTIONS)} : {}),
        log: (e) => {
          const ev = e as Record<string, unknown>
          // BENCH_SCALE_LOG (bench/scale.bench.ts): every event, for debugging a run.
          if (ev.event === 'dial_failed' || ev.event === 'fetch_failed' || ev.event === 'bad_blob' || process.env.BENCH_SCALE_LOG)
            out({t: 'p2p', shard: o.shard, client: i + j, ...ev})
        },
      })
      nodes.push(p2p)
      const c = await startScaleClient({serverAddr: o.serverAddr, runId: o.runId, identity, p2p, resultBytes: o.resultBytes, computeMs: o.computeMs})
      return {c, index: i + j}
    }),
  )
  for (const {c, index} of batch) {
    clients.push(c)
    const seen = new Set<number>()
    // Rounds as they are applied (the harness keeps them in c.rounds).
    const poll = setInterval(() => {
      for (const r of c.rounds) {
        if (seen.has(r.step)) continue
        seen.add(r.step)
        out({
          t: 'round',
          shard: o.shard,
          client: index,
          step: r.step,
          applied: r.applied,
          trainers: r.trainers,
          bytes_in: r.bytes_in,
          bytes_out: r.bytes_out,
          peers: r.peers,
          conn_direct: r.conn_direct,
          param_hash: r.param_hash.slice(0, 16),
        })
      }
      for (const e of c.events.splice(0)) out({t: 'event', shard: o.shard, client: index, ...e})
    }, 200)
    void c.done.finally(() => setTimeout(() => clearInterval(poll), 500))
  }
}
out({t: 'started', shard: o.shard, clients: clients.length})

const results = await Promise.all(clients.map((c) => c.done))
await new Promise((r) => setTimeout(r, 600))
sample()
clearInterval(timer)
out({t: 'done', shard: o.shard, errors: results.filter((r) => r instanceof Error).map((e) => (e as Error).message)})
process.exit(0)
