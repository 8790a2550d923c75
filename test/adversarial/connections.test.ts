/**
 * Hostile connections against the coordinator server (issue 20), in process: every bound is enforced, a refusal
 * names the flag that sets it, honest clients are still served, and non-members change nothing.
 */
import assert from 'node:assert/strict'
import {connect, type Socket} from 'node:net'
import {describe, test} from 'node:test'
import {CoordinatorConnection, type CoordinatorServerOptions} from '../../src/core/backend/index.js'
import {PeerBook, MAX_DIRECTORY_ENTRY_CHARS} from '../../src/core/backend/centralized/directory.js'
import {DEFAULT_LIMITS, effectiveMaxConnections, openFileLimit, RateLimiter, type ServerLimits} from '../../src/core/backend/centralized/limits.js'
import {generateIdentity, MAX_ADDR_CHARS, MAX_P2P_ADDRS, type Identity, type ServerEnvelope} from '../../src/core/protocol/index.js'
import {DataServer, LocalTokenDataset, TcpDataProvider, type DataServerLimits} from '../../src/core/data/index.js'
import {FrameDecoder, decodeServerMessage as decodeDataServerMessage, encodeGet, encodeHello} from '../../src/core/data/wire.js'
import {tempDir} from '../helpers.js'
import {tempDir as dataTempDir, tokens, writeTokenFiles} from '../data/fixtures.js'
import {RUN_ID, RawClient, startTestServer, waitUntil, writeRunConfig, type TestServer} from '../backend/helpers.js'

const opened: CoordinatorConnection[] = []
const raws: RawClient[] = []

async function withServer(
  config: Record<string, number>,
  limits: Partial<ServerLimits>,
  body: (t: TestServer) => Promise<void>,
  options: Partial<CoordinatorServerOptions> = {},
): Promise<void> {
  const dir = tempDir()
  const t = await startTestServer(writeRunConfig(dir.path, config), {limits, ...options})
  try {
    await body(t)
  } finally {
    await Promise.all(opened.splice(0).map((c) => c.close()))
    await Promise.all(raws.splice(0).map((c) => c.close()))
    await t.server.stop()
    dir.cleanup()
  }
}

async function raw(t: TestServer): Promise<RawClient> {
  const c = await RawClient.open(t.server.port)
  raws.push(c)
  return c
}

/** The largest address list a hello may carry (32 × 512 characters). */
function maxAddrs(tag: string): string[] {
  return Array.from({length: MAX_P2P_ADDRS}, (_, i) => `/dns4/${tag}-${i}.example/tcp/4001/p2p/`.padEnd(MAX_ADDR_CHARS, 'x'))
}

/** Members of the run (raw connections) whose addresses the tests keep changing. */
async function churners(t: TestServer, n: number): Promise<{id: Identity; c: RawClient}[]> {
  return Promise.all(
    Array.from({length: n}, async () => {
      const id = generateIdentity()
      const c = await raw(t)
      await c.hello(id, true)
      return {id, c}
    }),
  )
}

/** Every member announces new (largest) addresses tagged `tag`, then a pause: state changes, coalesced per turn of the server. */
async function churn(members: {id: Identity; c: RawClient}[], tag: string, pauseMs = 1): Promise<void> {
  for (const m of members) m.c.send(m.id, 'addresses', {p2p_addrs: maxAddrs(tag)})
  await new Promise((r) => setTimeout(r, pauseMs))
}

async function honest(t: TestServer, identity = generateIdentity(), join = true): Promise<CoordinatorConnection> {
  const c = await CoordinatorConnection.connect({
    addr: t.addr,
    runId: RUN_ID,
    identity,
    p2pAddrs: [`/ip4/127.0.0.1/tcp/${4000 + identity.publicKey[0]}`],
    join,
    connectTimeoutMs: 5000,
  })
  opened.push(c)
  return c
}

/** A connection that opens and waits for the server's first message: a challenge, or a refusal naming a bound. */
async function firstMessage(t: TestServer): Promise<{kind: string; code?: string; reason?: string; closed: Promise<void>}> {
  const socket = connect({host: '127.0.0.1', port: t.server.port})
  socket.on('error', () => {})
  const closed = new Promise<void>((resolve) => socket.once('close', () => resolve()))
  const {FrameReader, decodeServerMessage} = await import('../../src/core/protocol/index.js')
  const reader = new FrameReader()
  const message = await new Promise<ServerEnvelope>((resolve, reject) => {
    socket.on('data', (chunk) => {
      for (const frame of reader.push(chunk)) {
        if (!frame.ok) continue
        const d = decodeServerMessage(frame.body)
        if (d.ok) resolve(d.envelope)
      }
    })
    setTimeout(() => reject(new Error('no message')), 5000).unref()
  })
  raws.push({close: async () => void socket.destroy()} as unknown as RawClient)
  return message.kind === 'rejected' ? {kind: 'rejected', code: message.body.code, reason: message.body.reason, closed} : {kind: message.kind, closed}
}

describe('the peer directory: members only, bounded, sent as deltas', () => {
  test('watchers and refused joiners never enter the directory; a member does, bounded in size', async () => {
    await withServer({init_min_clients: 3}, {}, async (t) => {
      // 20 hostile identities say hello with the maximum address list and never join.
      for (let i = 0; i < 20; i++) await (await raw(t)).hello(generateIdentity(), false, maxAddrs(`w${i}`))
      assert.deepEqual(t.server.peers, {}, 'no watcher is in the directory')
      const member = generateIdentity()
      await (await raw(t)).hello(member, true, maxAddrs('m'))
      const entry = t.server.peers[member.id]
      assert.ok(entry && entry.length > 0, 'the member is listed')
      assert.ok(entry.join('').length <= MAX_DIRECTORY_ENTRY_CHARS, `entry of ${entry.join('').length} characters`)
      assert.deepEqual(Object.keys(t.server.peers), [member.id])
    })
  })

  test('a connection gets the directory once, then only what changed: N joins cost O(N) bytes per watcher, not O(N²)', async () => {
    await withServer({}, {joinsPerSecond: 1000}, async (t) => {
      const watcher = await raw(t)
      await watcher.hello(generateIdentity(), false)
      const from = watcher.messages.length
      const members: Identity[] = []
      for (let i = 0; i < 30; i++) {
        const id = generateIdentity()
        members.push(id)
        await (await raw(t)).hello(id, true, maxAddrs(`j${i}`))
      }
      await waitUntil(() => watcher.state?.pending.length === 30, 'the watcher sees 30 pending')
      const states = watcher.messages.slice(from).filter((m) => m.kind === 'state') as Extract<ServerEnvelope, {kind: 'state'}>[]
      // Each push carries the one new entry, never the directory so far.
      const entriesSent = states.reduce((n, m) => n + Object.keys(m.body.peers).length, 0)
      assert.ok(entriesSent <= 30, `${entriesSent} directory entries sent for 30 joins`)
      assert.ok(
        states.every((m) => !m.body.peers_reset),
        'no reset after the first state',
      )
      // A honest connection reassembles the whole directory from the deltas.
      const c = await honest(t)
      await waitUntil(() => Object.keys(c.peers).length === 31, 'the honest client sees 31 members')
      for (const m of members) assert.ok(c.peers[m.id]?.length)
      // A member that leaves is removed from everyone's directory by a delta.
      const leaving = raws.find((r) => r.messages.some((m) => m.kind === 'welcome' && m.body.client_id === members[0].id))!
      await leaving.close()
      await waitUntil(() => !(members[0].id in c.peers), 'the leaver is gone from the honest client’s directory')
      assert.ok(!(members[0].id in t.server.peers))
    })
  })

  test('PeerBook: deltas since a version, removals as tombstones, a reset once tombstones were forgotten', () => {
    const book = new PeerBook({}, 2)
    book.set('a', ['/ip4/1.1.1.1/tcp/1'])
    const v1 = book.current
    book.set('b', ['/ip4/2.2.2.2/tcp/2'])
    assert.deepEqual(book.deltaSince(v1), {reset: false, set: {b: ['/ip4/2.2.2.2/tcp/2']}, removed: []})
    assert.equal(book.set('b', ['/ip4/2.2.2.2/tcp/2']), false, 'the same addresses change nothing')
    book.remove('a')
    assert.deepEqual(book.deltaSince(v1), {reset: false, set: {b: ['/ip4/2.2.2.2/tcp/2']}, removed: ['a']})
    assert.deepEqual(book.deltaSince(undefined).reset, true)
    for (const id of ['c', 'd', 'e']) book.set(id, [])
    for (const id of ['c', 'd', 'e']) book.remove(id)
    assert.equal(book.deltaSince(v1).reset, true, 'a tombstone it needed was forgotten: it gets the whole directory')
    assert.deepEqual(book.deltaSince(v1).set, {b: ['/ip4/2.2.2.2/tcp/2']})
    assert.deepEqual(new PeerBook({x: ['a'.repeat(3000), 'b'.repeat(3000)]}).snapshot(), {x: ['a'.repeat(3000)]}, 'an entry keeps what fits in the bound')
  })
})

describe('every resource a stranger can take is bounded, and the refusal names the flag', () => {
  test('connections per IP: one more is refused with too_many_connections_from_address (--max-connections-per-ip); closing one frees a slot', async () => {
    await withServer({}, {maxConnectionsPerIp: 3}, async (t) => {
      const held = [await raw(t), await raw(t), await raw(t)]
      const refused = await firstMessage(t)
      assert.equal(refused.code, 'too_many_connections_from_address')
      assert.match(refused.reason!, /--max-connections-per-ip/)
      await refused.closed
      await t.waitLog({event: 'rejected', code: 'too_many_connections_from_address'})
      const from = t.logs.length
      await held[0].close()
      await t.waitLog({event: 'disconnected'}, from) // the server has seen the close (not a guess at how long that takes)
      assert.equal((await firstMessage(t)).kind, 'challenge', 'a slot is free again')
    })
  })

  test('total connections: too_many_connections (--max-connections); an honest client retries and gets in when one goes', async () => {
    await withServer({}, {maxConnections: 4}, async (t) => {
      const held = [await raw(t), await raw(t), await raw(t), await raw(t)]
      const refused = await firstMessage(t)
      assert.equal(refused.code, 'too_many_connections')
      assert.match(refused.reason!, /--max-connections\b/)
      // The honest client is refused with a retryable reason and keeps trying; a slot frees up.
      const joining = honest(t)
      setTimeout(() => void held[0].close(), 300)
      const c = await joining
      assert.ok(c.connected)
      assert.ok(t.server.state.pending.includes((c as unknown as {opts: {identity: Identity}}).opts.identity.id))
    })
  })

  test('connections that never say hello: too_many_handshakes (--max-handshakes), and each is dropped after the hello timeout', async () => {
    await withServer({}, {maxHandshakes: 2}, async (t) => {
      await raw(t)
      await raw(t)
      const refused = await firstMessage(t)
      assert.equal(refused.code, 'too_many_handshakes')
      assert.match(refused.reason!, /--max-handshakes/)
      // One that said hello no longer counts.
      await raws[0].hello(generateIdentity(), false)
      assert.equal((await firstMessage(t)).kind, 'challenge')
    })
  })

  test('watchers: one more watcher is refused (--max-watchers); a joining client is still served', async () => {
    await withServer({}, {maxWatchers: 2}, async (t) => {
      await (await raw(t)).hello(generateIdentity(), false)
      await (await raw(t)).hello(generateIdentity(), false)
      const id = generateIdentity()
      const fourth = await raw(t)
      fourth.send(id, 'hello', {run_id: RUN_ID, client_id: id.id, p2p_addrs: [], want_join: false}, {step: 0})
      const refusal = await fourth.rejection('too_many_watchers')
      assert.match(refusal.kind === 'rejected' ? refusal.body.reason : '', /--max-watchers/)
      await waitUntil(() => fourth.closed, 'the refused watcher is closed')
      const member = await honest(t)
      assert.ok(member.connected)
      assert.equal(t.server.state.pending.length, 1)
    })
  })

  test('members: a join past --max-members is refused with run_full and changes nothing', async () => {
    await withServer({init_min_clients: 2, min_clients: 1}, {maxMembers: 2}, async (t) => {
      await honest(t)
      await honest(t)
      const before = JSON.stringify(t.server.state.pending)
      const stranger = await raw(t)
      const id = generateIdentity()
      stranger.send(id, 'hello', {run_id: RUN_ID, client_id: id.id, p2p_addrs: maxAddrs('s'), want_join: true}, {step: 0})
      const refusal = await stranger.rejection('run_full')
      assert.match(refusal.kind === 'rejected' ? refusal.body.reason : '', /--max-members/)
      assert.equal(JSON.stringify(t.server.state.pending), before)
      assert.ok(!(id.id in t.server.peers))
    })
  })

  test('a run whose init_min_clients exceeds --max-members does not start', async () => {
    const dir = tempDir()
    try {
      await assert.rejects(startTestServer(writeRunConfig(dir.path, {init_min_clients: 5}), {limits: {maxMembers: 4}}), /--max-members 4/)
    } finally {
      dir.cleanup()
    }
  })

  test('a join storm is paced: past --join-burst and then --joins-per-second joins are refused with join_rate, and a client that retries gets in', async () => {
    await withServer({}, {joinsPerSecond: 3, joinBurst: 3}, async (t) => {
      const answers: string[] = []
      for (let i = 0; i < 8; i++) {
        const r = await raw(t)
        const id = generateIdentity()
        const from = r.messages.length
        r.send(id, 'hello', {run_id: RUN_ID, client_id: id.id, p2p_addrs: [], want_join: true}, {step: 0})
        await r.next((m) => m.kind === 'state', from)
        answers.push(r.messages.slice(from).some((m) => m.kind === 'rejected' && m.body.code === 'join_rate') ? 'paced' : 'joined')
      }
      const joined = answers.filter((a) => a === 'joined').length
      assert.ok(joined >= 3 && joined <= 4, `joined: ${answers.join(',')}`)
      assert.equal(t.server.state.pending.length, joined)
      await new Promise((r) => setTimeout(r, 1100))
      const late = await honest(t)
      assert.ok(late.connected && t.server.state.pending.length === joined + 1, 'after a second a join is accepted again')
    })
  })

  // These two send every change to every connection (--watcher-state-ms 0), as the server does to the epoch's clients.
  test('a slow reader is cut off at --max-unsent-bytes, and the others are still served', async () => {
    await withServer(
      {},
      {maxUnsentBytes: 65536, joinsPerSecond: 100000, maxMembers: 1000, maxConnectionsPerIp: 2000},
      async (t) => {
        const slow = await raw(t)
        await slow.hello(generateIdentity(), false)
        slow.socket.pause()
        const watcher = await honest(t, generateIdentity(), false)
        // Members whose addresses keep changing: each change pushes a state with their (4 KiB) entries to every connection.
        const members = await churners(t, 16)
        const cut = () => t.logs.some((l) => l.event === 'rejected' && l.code === 'slow_consumer')
        for (let i = 0; i < 2_000 && !cut(); i++) await churn(members, `a${i}`)
        const line = await t.waitLog({event: 'rejected', code: 'slow_consumer'})
        assert.match(String(line.reason), /--max-unsent-bytes/)
        assert.ok(watcher.connected, 'a reading client is still served')
      },
      {passiveStateMs: 0},
    )
  })

  test('all connections together hold at most --max-unsent-bytes-total: the slowest readers are cut off first', async () => {
    await withServer(
      {},
      {maxUnsentBytes: 64 << 20, maxUnsentBytesTotal: 256 << 10, maxConnectionsPerIp: 2000},
      async (t) => {
        const slow = [await raw(t), await raw(t), await raw(t)]
        for (const c of slow) {
          await c.hello(generateIdentity(), false)
          c.socket.pause()
        }
        const watcher = await honest(t, generateIdentity(), false)
        const members = await churners(t, 16)
        const cut = () => t.logs.filter((l) => l.event === 'rejected' && l.code === 'slow_consumer').length
        for (let i = 0; i < 2_000 && cut() < 3; i++) await churn(members, `t${i}`)
        assert.equal(cut(), 3, 'the three that never read are cut off')
        const line = t.logs.find((l) => l.event === 'rejected' && l.code === 'slow_consumer')!
        assert.match(String(line.reason), /--max-unsent-bytes-total/)
        assert.ok(watcher.connected, 'a reading client is still served')
      },
      {passiveStateMs: 0},
    )
  })

  test('watchers get the newest state on a cadence; one that does not read is sent nothing new and is closed at --stall-timeout-s', async () => {
    const period = 100
    await withServer(
      {},
      {stallTimeoutSeconds: 1, joinsPerSecond: 100000, maxMembers: 1000, maxConnectionsPerIp: 2000},
      async (t) => {
        // Members whose addresses keep changing: each change is a state (with the member's 4 KiB entry) to push.
        const members = await churners(t, 48)
        const slow = await raw(t)
        await slow.hello(generateIdentity(), false)
        slow.socket.pause()
        const reading = await raw(t)
        await reading.hello(generateIdentity(), false)
        const statesOf = (c: RawClient) => c.messages.filter((m) => m.kind === 'state' || m.kind === 'state_delta').length
        const before = statesOf(reading)
        const started = performance.now()
        let changes = 0
        const cut = () => t.logs.find((l) => l.event === 'rejected' && l.code === 'slow_consumer')
        while (!cut() && performance.now() - started < 15_000) await churn(members, `c${changes++}`, 20)
        const elapsed = performance.now() - started
        const line = cut()
        assert.ok(line, `the watcher that never reads is closed (after ${Math.round(elapsed)} ms)`)
        assert.match(String(line.reason), /--stall-timeout-s/)
        const got = statesOf(reading) - before
        assert.ok(
          got >= 2 && got <= elapsed / period + 3,
          `a watcher gets at most one state per ${period} ms: ${got} in ${Math.round(elapsed)} ms (${changes * members.length} changes)`,
        )
        // The one that never read was skipped while backed up: it was sent fewer states than the one that reads.
        slow.socket.resume()
        await waitUntil(() => slow.closed, 'the slow watcher closed')
        assert.ok(statesOf(slow) < got, `a watcher that does not read is sent nothing new: ${statesOf(slow)} states, ${got} to one that reads`)
        // The one that reads has the newest addresses of every member, a period or so after the last change.
        const last = `c${changes - 1}`
        await waitUntil(() => {
          const seen = new Map<string, string>()
          for (const m of reading.messages) if (m.kind === 'state' || m.kind === 'state_delta') for (const [id, a] of Object.entries(m.body.peers)) seen.set(id, a[0])
          return members.every((m) => seen.get(m.id.id)?.includes(`/${last}-0.`))
        }, 'the newest addresses at the reading watcher')
      },
      {passiveStateMs: period},
    )
  })

  test('reports count only from the round’s trainers: a non-member’s report is refused and reaches no watcher', async () => {
    await withServer({}, {}, async (t) => {
      const watcher = await raw(t)
      await watcher.hello(generateIdentity(), false)
      const stranger = await raw(t)
      const id = generateIdentity()
      await stranger.hello(id, true)
      const from = stranger.messages.length
      const report = {loss: 424242, val_loss: null, tokens_per_second: 1, compute_ms: 1, apply_ms: 1, result_bytes: 1, bytes_in: 1, bytes_out: 1, applied: 1, accepted: 1, peers: 1}
      stranger.send(id, 'report', report as never, {step: t.server.state.progress.step})
      await stranger.rejection('not_a_trainer', from)
      assert.ok(!t.logs.some((l) => l.event === 'client_report'), 'not logged (so not in the history)')
      assert.ok(
        !watcher.messages.some((m) => m.kind === 'client_report' || ((m.kind === 'state' || m.kind === 'state_delta') && m.body.reports?.length)),
        'not forwarded to watchers',
      )
    })
  })
})

describe('limits: defaults and the descriptor budget', () => {
  test('defaults: 256 members (Psyche’s capacity), a few MiB unsent per connection', () => {
    assert.equal(DEFAULT_LIMITS.maxMembers, 256)
    assert.ok(DEFAULT_LIMITS.maxUnsentBytes <= 8 * 1024 * 1024)
  })

  test('the connection bound is lowered to what ulimit -n leaves room for', () => {
    const limits = 'Limit                     Soft Limit           Hard Limit           Units\nMax open files            1024                 4096                 files\n'
    assert.equal(openFileLimit(limits), 1024)
    assert.equal(openFileLimit('Max open files            unlimited            unlimited            files\n'), undefined)
    const e = effectiveMaxConnections(4096, 1024)
    assert.equal(e.max, 1024 - 128)
    assert.match(e.lowered!, /ulimit -n 1024/)
    assert.deepEqual(effectiveMaxConnections(100, 1024), {max: 100})
  })

  test('RateLimiter: a second’s worth at once, then the rate', () => {
    let now = 0
    const r = new RateLimiter(4, () => now)
    assert.deepEqual([r.take(), r.take(), r.take(), r.take(), r.take()], [true, true, true, true, false])
    now += 500
    assert.deepEqual([r.take(), r.take(), r.take()], [true, true, false])
  })
})

describe('the data server under hostile clients', () => {
  const SEQ = 1024

  async function withDataServer(limits: Partial<DataServerLimits>, body: (server: DataServer) => Promise<void>): Promise<void> {
    const dir = await dataTempDir()
    await writeTokenFiles(dir, [{name: 'a.bin', ids: tokens(200_000, 50_000), tokenSize: 2}])
    const dataset = await LocalTokenDataset.open(dir)
    const server = await DataServer.start(dataset.provider({seqLen: SEQ}), {host: '127.0.0.1', port: 0, limits})
    try {
      await body(server)
    } finally {
      await server.close()
      await dataset.close()
    }
  }

  /** Bytes the server has queued for its connections (what a client that never reads makes it hold). */
  function unsent(server: DataServer): number {
    return [...(server as unknown as {sockets: Set<Socket>}).sockets].reduce((n, s) => n + s.writableLength, 0)
  }

  test('a client that asks for many batches and never reads: the server stops answering (and reading) it at --max-unsent-bytes; an honest client is served', async () => {
    await withDataServer({maxUnsentBytes: 1 << 20}, async (server) => {
      const hostile = connect({host: '127.0.0.1', port: server.port})
      hostile.on('error', () => {})
      await new Promise((r) => hostile.once('connect', r))
      hostile.pause() // never reads
      hostile.write(encodeHello(SEQ))
      // 100 requests of 64 samples (about 260 KB each: 26 MB of answers if all were queued).
      const ids = Array.from({length: 64}, (_, i) => i)
      for (let r = 0; r < 100; r++) hostile.write(encodeGet(r + 1, ids, true))
      // The server answers until the bound (the kernel's socket buffers fill first), then stops: wait for it to get
      // there rather than for a guessed time, so the bound is really reached whatever the machine's load.
      const response = 13 + 64 * (SEQ + 1) * 4
      await waitUntil(() => unsent(server) >= (1 << 20) - response, 'the server to queue about --max-unsent-bytes for the client that never reads', 20_000)
      await new Promise((r) => setTimeout(r, 300)) // a chance to queue past the bound, were it not enforced
      const held = unsent(server)
      assert.ok(held <= (1 << 20) + response, `the server holds ${held} unsent bytes for a client that never reads`)
      const honestClient = await TcpDataProvider.connect(`127.0.0.1:${server.port}`, {seqLen: SEQ, timeoutMs: 5000})
      const batch = await honestClient.getSamples([1, 2, 3])
      assert.equal(batch.length, 3 * (SEQ + 1))
      await honestClient.close()
      hostile.destroy()
    })
  })

  test('connections past --max-connections are refused with an error naming the bound', async () => {
    await withDataServer({maxConnections: 2}, async (server) => {
      const held = [connect({host: '127.0.0.1', port: server.port}), connect({host: '127.0.0.1', port: server.port})]
      for (const s of held) {
        s.on('error', () => {})
        await new Promise((r) => s.once('connect', r))
      }
      await waitUntil(() => (server as unknown as {sockets: Set<Socket>}).sockets.size === 2, 'the server to hold both connections')
      const third = connect({host: '127.0.0.1', port: server.port})
      third.on('error', () => {})
      const decoder = new FrameDecoder(1 << 20)
      const message = await new Promise<ReturnType<typeof decodeDataServerMessage>>((resolve) =>
        third.on('data', (chunk) => decoder.push(chunk).forEach((f) => resolve(decodeDataServerMessage(f)))),
      )
      assert.equal(message.type, 'error')
      assert.match(message.type === 'error' ? message.message : '', /--max-connections/)
      third.destroy()
      for (const s of held) s.destroy()
    })
  })
})
