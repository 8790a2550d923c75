import type {EventLine} from '../../src/core/events.js'
import assert from 'node:assert/strict'
import {createConnection, createServer, type Socket} from 'node:net'
import {test} from 'node:test'
import {CoordinatorConnection} from '../../src/core/backend/index.js'
import {createCoordinator, serializeState} from '../../src/core/coordinator/index.js'
import {loadRunConfigFile} from '../../src/core/config/index.js'
import {FrameReader, decodeClientMessage, encodeFrame, encodeServerMessage, generateIdentity, type ClientEnvelope} from '../../src/core/protocol/index.js'
import {tempDir} from '../helpers.js'
import {RUN_ID, startTestServer, waitUntil, writeRunConfig} from './helpers.js'

test('the client trusts nothing from the server: garbage, another signer, another session, a replayed seq or another run are dropped with a reason', async () => {
  const dir = tempDir()
  const run = await loadRunConfigFile(writeRunConfig(dir.path))
  const good = createCoordinator(run, {now: 1})
  const forged = {...good, run_state: 'Paused' as const}
  const server = generateIdentity()
  const impostor = generateIdentity()
  const session = 'cd'.repeat(16)
  const received: ClientEnvelope[] = []
  const fake = createServer((socket: Socket) => {
    const reader = new FrameReader()
    let seq = 0
    const fields = (over: Partial<{seq: number; session: string; run_id: string}> = {}) => ({run_id: RUN_ID, step: 1, seq: over.seq ?? ++seq, session, ...over})
    socket.write(encodeServerMessage(server, 'challenge', fields(), {session}))
    socket.on('data', (chunk) => {
      for (const f of reader.push(chunk)) {
        if (!f.ok) continue
        const d = decodeClientMessage(f.body)
        assert.ok(d.ok)
        received.push(d.envelope)
        if (d.envelope.kind !== 'hello') continue
        socket.write(encodeServerMessage(server, 'welcome', fields(), {run_id: RUN_ID, client_id: d.envelope.from, server_time: 1}))
        const forgedState = {state: serializeState(forged), peers: {}, server_time: 1}
        socket.write(encodeFrame(Buffer.from('not an envelope at all, just a sentence long enough to be read as one: '.repeat(3))))
        socket.write(encodeServerMessage(impostor, 'state', fields(), forgedState))
        socket.write(encodeServerMessage(server, 'state', fields({session: 'ef'.repeat(16)}), forgedState))
        socket.write(encodeServerMessage(server, 'state', fields({seq: 1}), forgedState))
        socket.write(encodeServerMessage(server, 'state', fields({run_id: 'other'}), forgedState))
        socket.write(encodeServerMessage(server, 'state', fields(), {state: serializeState(good), peers: {}, server_time: 1}))
      }
    })
    socket.on('error', () => {})
  })
  await new Promise<void>((r) => fake.listen(0, '127.0.0.1', r))
  const logs: EventLine[] = []
  const alice = generateIdentity()
  const c = await CoordinatorConnection.connect({
    addr: `127.0.0.1:${(fake.address() as {port: number}).port}`,
    runId: RUN_ID,
    identity: alice,
    p2pAddrs: [],
    join: true,
    reconnect: false,
    log: (e) => logs.push(e),
  })
  try {
    assert.equal(c.state?.run_state, 'WaitingForMembers', 'only the genuine state was taken')
    assert.equal(c.serverId, server.id)
    const reasons = logs.filter((l) => l.event === 'server_message_dropped').map((l) => l.reason)
    assert.deepEqual(reasons, ['bad_magic', 'wrong_server', 'wrong_session', 'replayed_seq', 'wrong_run_id'])
    // Our hello was bound to the server's session, signed by us.
    assert.equal(received[0].kind, 'hello')
    assert.equal(received[0].session, session)
    assert.equal(received[0].from, alice.id)
  } finally {
    await c.close()
    await new Promise((r) => fake.close(r))
    dir.cleanup()
  }
})

test('a connection that never says hello is closed after the hello timeout, with a logged reason', async () => {
  const dir = tempDir()
  const t = await startTestServer(writeRunConfig(dir.path), {helloTimeoutMs: 150})
  try {
    const {connect} = await import('node:net')
    const socket = connect({host: '127.0.0.1', port: t.server.port})
    let closed = false
    socket.on('close', () => (closed = true))
    socket.on('error', () => {})
    socket.resume()
    await t.waitLog({event: 'rejected', code: 'hello_timeout', closed: true})
    await waitUntil(() => closed, 'the silent connection to close')
  } finally {
    await t.server.stop()
    dir.cleanup()
  }
})

test('a client whose hello came too late (its process starved) connects again and joins: hello_timeout is a bound, not a refusal', async () => {
  const dir = tempDir()
  const t = await startTestServer(writeRunConfig(dir.path), {helloTimeoutMs: 100})
  // A proxy that holds back the first connection's hello past the server's hello timeout.
  let connections = 0
  const proxy = createServer((inbound: Socket) => {
    const first = ++connections === 1
    const outbound = createConnection({host: '127.0.0.1', port: t.server.port})
    outbound.on('error', () => inbound.destroy())
    inbound.on('error', () => outbound.destroy())
    outbound.pipe(inbound)
    inbound.on('data', (chunk) => (first ? setTimeout(() => outbound.writable && outbound.write(chunk), 400) : outbound.write(chunk)))
    inbound.on('close', () => outbound.destroy())
    outbound.on('close', () => inbound.destroy())
  })
  const port = await new Promise<number>((r) => proxy.listen(0, '127.0.0.1', () => r((proxy.address() as {port: number}).port)))
  const identity = generateIdentity()
  try {
    const conn = await CoordinatorConnection.connect({addr: `127.0.0.1:${port}`, runId: RUN_ID, identity, p2pAddrs: [], join: true, connectTimeoutMs: 5_000})
    await t.waitLog({event: 'rejected', code: 'hello_timeout', closed: true})
    assert.ok(connections >= 2, 'a second connection')
    await waitUntil(() => conn.state?.pending.includes(identity.id) === true, 'the client to be waiting to join')
    await conn.close()
  } finally {
    await new Promise((r) => proxy.close(r))
    await t.server.stop()
    dir.cleanup()
  }
})

test('connect keeps trying until the server is up, then gives up with a clear error after connectTimeoutMs', async () => {
  const dir = tempDir()
  const probe = createServer()
  const port = await new Promise<number>((r) => probe.listen(0, '127.0.0.1', () => r((probe.address() as {port: number}).port)))
  await new Promise((r) => probe.close(r))
  try {
    await assert.rejects(
      CoordinatorConnection.connect({addr: `127.0.0.1:${port}`, runId: RUN_ID, identity: generateIdentity(), p2pAddrs: [], join: true, connectTimeoutMs: 300}),
      new RegExp(`coordinator 127\\.0\\.0\\.1:${port}: cannot connect: ECONNREFUSED`),
    )
    const pending = CoordinatorConnection.connect({addr: `127.0.0.1:${port}`, runId: RUN_ID, identity: generateIdentity(), p2pAddrs: [], join: true, connectTimeoutMs: 5000})
    await new Promise((r) => setTimeout(r, 300))
    const t = await startTestServer(writeRunConfig(dir.path), {port})
    try {
      const c = await pending
      assert.equal(c.state?.run_id, RUN_ID)
      await c.close()
    } finally {
      await t.server.stop()
    }
    await assert.rejects(
      CoordinatorConnection.connect({addr: 'no-port', runId: RUN_ID, identity: generateIdentity(), p2pAddrs: [], join: true}),
      /coordinator address: "no-port": expected "host:port"/,
    )
  } finally {
    dir.cleanup()
  }
})
