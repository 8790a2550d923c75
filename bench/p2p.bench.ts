// libp2p on loopback (TCP + noise + yamux, both nodes in this process, so the numbers include both ends'
// encryption): result-blob fetch throughput by size (a DisTrO result of llama2-20m is ~65 KB; 64 MiB is the
// default maximum), 8 concurrent fetches at the default bound of 4, announcement latency (publish -> the
// other node's handler), and a model transfer over /psyche/model/2 (signed manifests, every tensor's sha256
// checked) from one peer and spread over three.
import {randomBytes} from 'node:crypto'
import {P2PNode, type ResultAnnouncement} from '../src/core/p2p/index.js'
import {generateIdentity} from '../src/core/protocol/identity.js'

const REPEATS = Number(process.env.BENCH_REPEATS ?? 5)
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]
const mb = (bytes: number) => bytes / 1e6

const producerIdentity = generateIdentity()
const LOOPBACK = ['/ip4/127.0.0.1/tcp/0']
const producer = await P2PNode.start({identity: producerIdentity, runId: 'bench', listen: LOOPBACK})
const fetcher = await P2PNode.start({identity: generateIdentity(), runId: 'bench', listen: LOOPBACK})
try {
  await fetcher.connect(producer.addresses())
  const deadline = Date.now() + 10_000
  while ((producer.topicPeers() < 1 || fetcher.topicPeers() < 1) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50))

  const rows: string[] = []
  let step = 0
  for (const size of [65_311, 1 << 20, 16 << 20, 64 << 20]) {
    const times: number[] = []
    for (let i = 0; i < REPEATS; i++) {
      const a = await producer.publishResult(++step, 0, 1, new Uint8Array(randomBytes(size)))
      const t = performance.now()
      await fetcher.fetchResult(a)
      times.push(performance.now() - t)
      producer.dropResultsBefore(step + 1)
      fetcher.dropResultsBefore(step + 1)
    }
    const ms = median(times)
    rows.push(`| ${size.toLocaleString('en-US')} B | ${ms.toFixed(1)} ms | ${(mb(size) / (ms / 1000)).toFixed(0)} MB/s |`)
  }
  console.log('| blob | fetch (median of %d) | throughput |\n|---|---|---|\n%s', REPEATS, rows.join('\n'))

  const parallel = await Promise.all(Array.from({length: 8}, (_, i) => producer.publishResult(++step, i, i + 1, new Uint8Array(randomBytes(1 << 20)))))
  const t = performance.now()
  await Promise.all(parallel.map((a) => fetcher.fetchResult(a)))
  const ms = performance.now() - t
  console.log(`\n8 × 1 MiB concurrently (bound 4): ${ms.toFixed(1)} ms, ${(mb(8 << 20) / (ms / 1000)).toFixed(0)} MB/s`)

  const latencies: number[] = []
  let resolveNext: ((a: ResultAnnouncement) => void) | undefined
  fetcher.onAnnouncement((a) => resolveNext?.(a))
  for (let i = 0; i < 20; i++) {
    const got = new Promise<ResultAnnouncement>((r) => (resolveNext = r))
    const t0 = performance.now()
    await producer.publishResult(++step, 0, 1, new Uint8Array(randomBytes(64)))
    await got
    latencies.push(performance.now() - t0)
  }
  console.log(`announcement latency (publish -> handler, median of 20): ${median(latencies).toFixed(2)} ms`)

  // A llama2-20m-sized model: 79.2 MB of fp32 in 39 tensors, from one peer, then spread over three.
  const frames = Array.from({length: 39}, (_, i) => ({name: `t${i}`, dtype: 'float32', shape: [507_546], data: new Uint8Array(randomBytes(507_546 * 4))}))
  const snapshot = {step, paramHash: 'bench', frames}
  producer.serveModel(async () => snapshot)
  const otherIdentities = [generateIdentity(), generateIdentity()]
  const otherIds = otherIdentities.map((i) => i.id)
  const others = await Promise.all(otherIdentities.map((identity) => P2PNode.start({identity, runId: 'bench', listen: LOOPBACK})))
  try {
    for (const o of others) {
      o.serveModel(async () => snapshot)
      await fetcher.connect(o.addresses())
    }
    for (const [what, from] of [
      ['1 peer', [producerIdentity.id]],
      ['3 peers', [producerIdentity.id, ...otherIds]],
    ] as const) {
      const times: number[] = []
      let bytes = 0
      for (let i = 0; i < 3; i++) {
        const tm = performance.now()
        const model = await fetcher.fetchModel([...from], {step})
        times.push(performance.now() - tm)
        bytes = model.frames.reduce((s, f) => s + f.data.length, 0)
      }
      const ms = median(times)
      console.log(`model transfer from ${what} (median of 3): ${mb(bytes).toFixed(1)} MB in ${ms.toFixed(0)} ms, ${(mb(bytes) / (ms / 1000)).toFixed(0)} MB/s`)
    }
  } finally {
    await Promise.all(others.map((o) => o.stop()))
  }
} finally {
  await Promise.all([producer.stop(), fetcher.stop()])
}
