// Hostile connections for bench/attack.bench.ts and test/adversarial/memory.test.ts, from their own process:
//   attack-hostile.ts coordinator HOST:PORT RUN_ID COUNT   each connection takes the challenge, says hello with the
//       largest address list (32 × 512 characters) from a free identity — half ask to join, half only watch — and
//       then never reads again
//   attack-hostile.ts refusals HOST:PORT RUN_ID COUNT     COUNT watchers, each saying hello and then sending, as fast as
//       the server reads them, 15 MB witnesses for step 2^40 (each refused by the coordinator); one that is closed
//       comes back at once with a new identity from its next address (an attacker trying to get round the ban)
//   attack-hostile.ts data HOST:PORT SEQ_LEN COUNT         each connection says hello and asks for 60 batches of 64
//       samples, and never reads
// Connections come from 50 loopback addresses (127.0.1.1–50), as an attacker with many addresses would. Prints one
// JSON line {"opened", "refused", "closed"} each second; holds everything open until its stdin closes.
import {connect, type Socket} from 'node:net'
import {encodeGet, encodeHello} from '../src/core/data/wire.js'
import {FrameReader, decodeServerMessage, encodeClientMessage, generateIdentity, MAX_ADDR_CHARS, MAX_P2P_ADDRS} from '../src/core/protocol/index.js'

const [mode, addr, arg, countText] = process.argv.slice(2)
const [host, portText] = addr.split(':')
const port = Number(portText)
const count = Number(countText)
const sockets: Socket[] = []
const stats = {opened: 0, refused: 0, closed: 0, sent: 0}

function open(i: number): Socket {
  const socket = connect({host, port, localAddress: `127.0.1.${(i % 50) + 1}`})
  socket.on('error', () => {})
  socket.on('close', () => stats.closed++)
  socket.once('connect', () => stats.opened++)
  sockets.push(socket)
  return socket
}

function coordinatorAttacker(i: number, runId: string): void {
  const socket = open(i)
  const identity = generateIdentity()
  const reader = new FrameReader()
  const addrs = Array.from({length: MAX_P2P_ADDRS}, (_, k) => `/dns4/h${i}-${k}.example/tcp/4001/p2p/`.padEnd(MAX_ADDR_CHARS, 'x'))
  const onData = (chunk: Buffer) => {
    for (const frame of reader.push(chunk)) {
      if (!frame.ok) continue
      const d = decodeServerMessage(frame.body)
      if (!d.ok) continue
      if (d.envelope.kind === 'rejected') stats.refused++
      if (d.envelope.kind !== 'challenge') continue
      const session = d.envelope.body.session
      socket.write(
        encodeClientMessage(identity, 'hello', {run_id: runId, step: 0, seq: 1, session}, {run_id: runId, client_id: identity.id, p2p_addrs: addrs, want_join: i % 2 === 0}),
      )
      // From now on it reads nothing: whatever the server sends it piles up.
      socket.off('data', onData)
      socket.pause()
      return
    }
  }
  socket.on('data', onData)
}

function dataAttacker(i: number, seqLen: number): void {
  const socket = open(i)
  socket.pause()
  socket.once('connect', () => {
    socket.write(encodeHello(seqLen))
    const ids = Array.from({length: 64}, (_, k) => k)
    for (let r = 0; r < 60; r++) socket.write(encodeGet(r + 1, ids, true))
  })
}

/** A watcher that floods refused witnesses; closed (or refused), it comes back from its next address. */
function refusalFlooder(i: number, runId: string, attempt = 0): void {
  const socket = open(i + attempt * count)
  const identity = generateIdentity()
  const reader = new FrameReader()
  const bloom = 'f'.repeat(7_500_000)
  let session: string | undefined
  let seq = 1
  const flood = () => {
    while (!socket.destroyed && session) {
      stats.sent++
      const frame = encodeClientMessage(identity, 'witness', {run_id: runId, step: 2 ** 40, seq: ++seq, session}, {proof: {participant_bloom: bloom, broadcast_bloom: bloom}})
      if (!socket.write(frame)) return void socket.once('drain', flood)
    }
  }
  socket.on('data', (chunk: Buffer) => {
    for (const frame of reader.push(chunk)) {
      if (!frame.ok) continue
      const d = decodeServerMessage(frame.body)
      if (!d.ok) continue
      if (d.envelope.kind === 'rejected') stats.refused++
      if (d.envelope.kind !== 'challenge') continue
      session = d.envelope.body.session
      socket.write(encodeClientMessage(identity, 'hello', {run_id: runId, step: 0, seq: 1, session}, {run_id: runId, client_id: identity.id, p2p_addrs: [], want_join: false}))
      flood()
    }
  })
  socket.once('close', () => setTimeout(() => refusalFlooder(i, runId, attempt + 1), 100))
}

// Opened in waves of 50, as fast as the server accepts them.
for (let i = 0; i < count; i++) {
  if (mode === 'refusals') refusalFlooder(i, arg)
  else if (mode === 'coordinator') coordinatorAttacker(i, arg)
  else dataAttacker(i, Number(arg))
  if (i % 50 === 49) await new Promise((r) => setTimeout(r, 20))
}
const timer = setInterval(() => process.stdout.write(`${JSON.stringify(stats)}\n`), 1000)
process.stdin.on('end', () => {
  clearInterval(timer)
  for (const s of sockets) s.destroy()
  process.exit(0)
})
process.stdin.resume()
