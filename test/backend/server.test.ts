import assert from 'node:assert/strict'
import {randomBytes} from 'node:crypto'
import {connect} from 'node:net'
import {test} from 'node:test'
import {CoordinatorConnection} from '../../src/core/backend/index.js'
import {MAX_PRE_HELLO_FRAME_BYTES} from '../../src/core/backend/centralized/server.js'
import {buildWitnessProof, serializeState} from '../../src/core/coordinator/index.js'
import {sha256Hex} from '../../src/core/primitives/hash.js'
import {applyDelta} from '../../src/core/protocol/state-delta.js'
import type {CoordinatorState} from '../../src/core/coordinator/types.js'
import {PsycheError} from '../../src/core/errors.js'
import {DEFAULT_MAX_FRAME_BYTES, encodeFrame, generateIdentity, type Identity} from '../../src/core/protocol/index.js'
import {fromHex, sha256, u64le} from '../../src/core/primitives/seed.js'
import {tempDir} from '../helpers.js'
import {RUN_ID, RawClient, aliveProof, nextRound, startTestServer, waitUntil, writeRunConfig, type TestServer, nextState} from './helpers.js'

async function withServer(config: Record<string, number>, options: Parameters<typeof startTestServer>[1], body: (t: TestServer) => Promise<void>): Promise<void> {
  const dir = tempDir()
  const t = await startTestServer(writeRunConfig(dir.path, config), options)
  try {
    await body(t)
  } finally {
    // Close clients even when the test failed, or their reconnect loops keep the process alive.
    await Promise.all(opened.splice(0).map((c) => c.close()))
    await t.server.stop()
    dir.cleanup()
  }
}

const opened: CoordinatorConnection[] = []

async function connectClient(t: TestServer, identity: Identity, extra: Partial<Parameters<typeof CoordinatorConnection.connect>[0]> = {}): Promise<CoordinatorConnection> {
  const c = await CoordinatorConnection.connect({addr: t.addr, runId: RUN_ID, identity, p2pAddrs: [`/ip4/127.0.0.1/tcp/${4000 + identity.publicKey[0]}`], join: true, ...extra})
  opened.push(c)
  return c
}

/** A connection the server refuses at once (no challenge): resolves when the server closed it. */
async function refusedOnConnect(port: number): Promise<void> {
  const socket = connect({host: '127.0.0.1', port})
  socket.on('data', () => {})
  socket.on('error', () => {})
  await new Promise((r) => socket.once('close', r))
}

test('clients join, every state change is pushed to all with the peer directory, and training starts', async () => {
  await withServer({init_min_clients: 2}, {}, async (t) => {
    const [alice, bob] = [generateIdentity(), generateIdentity()]
    const a = await connectClient(t, alice)
    assert.deepEqual(a.state?.pending, [alice.id])
    assert.equal(a.serverId, t.server.identity.id)
    const b = await connectClient(t, bob)
    // Alice hears of Bob (his join and his p2p addresses) without asking.
    const seen = await nextState(a, (s) => s.pending.length === 2)
    assert.deepEqual(seen.pending, [alice.id, bob.id])
    assert.deepEqual(a.peers[bob.id], [`/ip4/127.0.0.1/tcp/${4000 + bob.publicKey[0]}`])
    assert.deepEqual(Object.keys(b.peers).sort(), [alice.id, bob.id].sort())

    t.clock.advance(2)
    const warmup = await nextState(b, (s) => s.run_state === 'Warmup')
    assert.deepEqual(
      warmup.epoch.clients.map((c) => c.id),
      [alice.id, bob.id],
    )
    assert.ok(a.sendWarmupReady() && b.sendWarmupReady())
    const training = await nextState(a, (s) => s.run_state === 'RoundTrain')
    assert.deepEqual(training.epoch.round?.roster, [alice.id, bob.id])
    assert.equal(t.server.state.run_state, 'RoundTrain')
    await t.waitLog({event: 'transition', from: 'Warmup', to: 'RoundTrain'})
    await Promise.all([a.close(), b.close()])
  })
})

test("a wrong run id is refused with the server's reason (and logged); the server keeps serving", async () => {
  await withServer({}, {}, async (t) => {
    await assert.rejects(
      connectClient(t, generateIdentity(), {runId: 'another-run'}),
      (e: Error) => e instanceof PsycheError && /coordinates run "tiny-demo", not "another-run"/.test(e.message),
    )
    const line = await t.waitLog({event: 'rejected', code: 'wrong_run_id'})
    assert.match(String(line.peer), /^127\.0\.0\.1:\d+$/)
    assert.equal(line.closed, true)
    // A pinned server id that does not match is refused just as clearly.
    await assert.rejects(connectClient(t, generateIdentity(), {serverId: generateIdentity().id}), /is not the pinned/)
    const ok = await connectClient(t, generateIdentity())
    assert.equal(ok.state?.run_id, RUN_ID)
    await ok.close()
  })
})

test('forged, foreign, duplicate, out-of-order, other-session and pre-hello messages are refused with logged reasons; the connection still works', async () => {
  await withServer({}, {}, async (t) => {
    const [alice, mallory] = [generateIdentity(), generateIdentity()]
    const raw = await RawClient.open(t.server.port)
    const expectRefusal = async (code: string, send: () => void) => {
      const [logFrom, msgFrom] = [t.logs.length, raw.messages.length]
      send()
      const line = await t.waitLog({event: 'rejected', code}, logFrom)
      assert.ok(line.peer && String(line.reason).length > 0, JSON.stringify(line))
      await raw.rejection(code, msgFrom)
    }
    await expectRefusal('expected_hello', () => raw.send(alice, 'withdraw', {}))
    await raw.hello(alice)
    assert.deepEqual(t.server.state.pending, [alice.id])

    // Mallory's signature under Alice's key: the signature does not verify.
    await expectRefusal('bad_signature', () => {
      const frame = raw.frame(mallory, 'withdraw', {}, {seq: 100})
      Buffer.from(alice.publicKey).copy(frame, 4 + 6)
      raw.write(frame)
    })
    // Alice's message with its signature zeroed: unsigned.
    await expectRefusal('bad_signature', () => {
      const frame = raw.frame(alice, 'withdraw', {}, {seq: 100})
      frame.fill(0, 4 + 38, 4 + 102)
      raw.write(frame)
    })
    // Mallory signing her own message on Alice's connection.
    await expectRefusal('wrong_sender', () => raw.send(mallory, 'withdraw', {}, {seq: 101}))
    // A message the coordinator itself refuses (no Cooldown yet): answered with its code, not a wire error.
    await expectRefusal('InvalidRunState', () => raw.send(alice, 'checkpoint', {repo: {repo_id: 'org/m'}}, {seq: 200}))
    await expectRefusal('replayed_seq', () => raw.send(alice, 'checkpoint', {repo: {repo_id: 'org/m'}}, {seq: 200}))
    await expectRefusal('replayed_seq', () => raw.send(alice, 'checkpoint', {repo: {repo_id: 'org/m'}}, {seq: 150}))
    await expectRefusal('wrong_session', () => raw.send(alice, 'withdraw', {}, {seq: 201, session: 'ab'.repeat(16)}))
    await expectRefusal('wrong_run_id', () => raw.send(alice, 'withdraw', {}, {seq: 202, run_id: 'other'}))
    await expectRefusal('hello_twice', () => raw.send(alice, 'hello', {run_id: RUN_ID, client_id: alice.id, p2p_addrs: [], want_join: true}, {seq: 203}))
    // After all that Alice is still in, and her real withdraw is honoured.
    assert.equal(raw.closed, false)
    assert.deepEqual(t.server.state.pending, [alice.id])
    const from = raw.messages.length
    raw.send(alice, 'withdraw', {}, {seq: 204})
    await raw.next((m) => m.kind === 'state' && m.body.state.pending.length === 0, from)
    await raw.close()
  })
})

test('a witness replayed at a later step is refused: same connection (seq), another connection (session), re-signed (stale step)', async () => {
  await withServer({}, {}, async (t) => {
    const alice = generateIdentity()
    const raw = await RawClient.open(t.server.port)
    await raw.hello(alice)
    t.clock.advance(2)
    await raw.next((m) => m.kind === 'state' && m.body.state.run_state === 'Warmup')
    raw.send(alice, 'witness', {proof: {participant_bloom: '', broadcast_bloom: ''}}, {step: 1}) // warmup: model loaded
    const round1 = await raw.next((m) => m.kind === 'state' && m.body.state.run_state === 'RoundTrain')
    assert.ok(round1.kind === 'state')
    const proof1 = aliveProof(round1.body.state, [alice.id])
    const witness1 = raw.send(alice, 'witness', {proof: proof1}, {step: 1})
    // the round closes at once (its one witness saw its one trainer) or after its witness phase
    const round2 = await raw.next((m) => {
      if (m.kind === 'state' && m.body.state.run_state === 'RoundWitness') t.clock.advance(2)
      return m.kind === 'state' && m.body.state.run_state === 'RoundTrain' && m.body.state.progress.step === 2
    })
    assert.ok(round2.kind === 'state')

    let from = t.logs.length
    raw.write(witness1)
    await t.waitLog({event: 'rejected', code: 'replayed_seq', of: 'witness'}, from)
    const other = await RawClient.open(t.server.port)
    from = t.logs.length
    other.write(witness1)
    await t.waitLog({event: 'rejected', code: 'wrong_session'}, from)
    from = t.logs.length
    raw.send(alice, 'witness', {proof: proof1}, {step: 1})
    const stale = await t.waitLog({event: 'rejected', code: 'stale_step'}, from)
    assert.match(String(stale.reason), /step 1, but the run is at step 2/)
    // The current step's proof is accepted.
    raw.send(alice, 'witness', {proof: aliveProof(round2.body.state, [alice.id])}, {step: 2})
    await raw.next((m) => m.kind === 'state' && ((m.body.state.run_state === 'RoundWitness' && m.body.state.progress.step === 2) || m.body.state.progress.step === 3))
    await Promise.all([raw.close(), other.close()])
  })
})

test('an oversized frame closes only its connection; garbage is refused with reasons, and its address banned for a while; the server keeps serving', async () => {
  await withServer({}, {limits: {strikeBanSeconds: 1}}, async (t) => {
    const watcher = await connectClient(t, generateIdentity())
    const oversized = (bytes: number) => {
      const head = Buffer.alloc(4)
      head.writeUInt32LE(bytes)
      return head
    }
    // Before hello a peer may only send small frames; after it, up to the 16 MiB limit.
    const stranger = await RawClient.open(t.server.port)
    stranger.write(oversized(MAX_PRE_HELLO_FRAME_BYTES + 1))
    const early = await t.waitLog({event: 'rejected', code: 'oversized'})
    assert.equal(early.closed, true)
    assert.match(String(early.reason), /exceeds the 65536-byte limit/)
    await waitUntil(() => stranger.closed, 'the oversized connection to close')
    const big = await RawClient.open(t.server.port)
    const bigId = generateIdentity()
    await big.hello(bigId)
    const logFrom = t.logs.length
    big.write(oversized(DEFAULT_MAX_FRAME_BYTES + 1))
    const line = await t.waitLog({event: 'rejected', code: 'oversized', client: bigId.id}, logFrom)
    assert.equal(line.closed, true)
    assert.match(String(line.reason), /exceeds the 16777216-byte limit/)
    await waitUntil(() => big.closed, 'the oversized connection to close')

    const junk = await RawClient.open(t.server.port)
    const from = t.logs.length
    junk.write(encodeFrame(randomBytes(200)))
    junk.write(encodeFrame(Buffer.concat([Buffer.from('PSYC'), Buffer.from([1, 0]), randomBytes(150)])))
    await t.waitLog({event: 'rejected', code: 'bad_magic'}, from)
    await t.waitLog({event: 'rejected', code: 'bad_signature'}, from)
    // Enough garbage and the connection is cut.
    for (let i = 0; i < 20; i++) junk.write(encodeFrame(randomBytes(64)))
    await waitUntil(() => junk.closed, 'the garbage connection to close')
    await t.waitLog({event: 'rejected', code: 'too_many_rejections'}, from)
    // Its address waits out its ban (--strike-ban-s) before it may connect again.
    await refusedOnConnect(t.server.port)
    const banned = await t.waitLog({event: 'rejected', code: 'strike_banned'}, from)
    assert.match(String(banned.reason), /^127\.0\.0\.1 was closed for 16 refused messages; it may return in 1 s \(--strike-ban-s\)/)
    await new Promise((r) => setTimeout(r, 1100))

    const noise = await RawClient.open(t.server.port)
    noise.write(randomBytes(4096))
    await waitUntil(
      () => t.logs.slice(from).some((l) => l.event === 'rejected' && ['oversized', 'bad_magic', 'truncated', 'empty'].includes(String(l.code))),
      'noise to be refused',
    )

    // Still serving: a new client joins, and the watcher is told (the dropped client was withdrawn).
    await nextState(watcher, (st) => !st.pending.includes(bigId.id))
    const late = generateIdentity()
    const c = await connectClient(t, late)
    await nextState(watcher, (s) => s.pending.includes(late.id))
    await Promise.all([watcher.close(), c.close(), noise.close()])
  })
})

test('withdraw on disconnect (default): a client that leaves is withdrawn and dropped from the peer directory; off: it stays', async () => {
  await withServer({init_min_clients: 2}, {}, async (t) => {
    const [alice, bob] = [generateIdentity(), generateIdentity()]
    const a = await connectClient(t, alice)
    const b = await connectClient(t, bob)
    await nextState(a, (s) => s.pending.length === 2)
    await b.close()
    const after = await nextState(a, (s) => s.pending.length === 1)
    assert.deepEqual(after.pending, [alice.id])
    assert.equal(a.peers[bob.id], undefined)
    await t.waitLog({event: 'withdrawn', client: bob.id})
    await a.close()
  })
  await withServer({init_min_clients: 2}, {withdrawOnDisconnect: false}, async (t) => {
    const alice = generateIdentity()
    const a = await connectClient(t, alice)
    await a.close()
    await t.waitLog({event: 'disconnected', client: alice.id})
    await new Promise((r) => setTimeout(r, 100))
    assert.deepEqual(t.server.state.pending, [alice.id])
  })
})

test("the run's authority can pause and resume through the server; refusals come back with the coordinator's code", async () => {
  await withServer({}, {}, async (t) => {
    const c = await connectClient(t, generateIdentity())
    assert.equal(t.server.applyAuthorityEvent({type: 'pause'}), undefined)
    await nextState(c, (s) => s.run_state === 'Paused')
    assert.equal(t.server.applyAuthorityEvent({type: 'pause'})?.code, 'Halted')
    assert.equal(t.server.applyAuthorityEvent({type: 'resume'}), undefined)
    await nextState(c, (s) => s.run_state === 'WaitingForMembers')
    await t.waitLog({event: 'rejected', peer: 'authority', code: 'Halted'})
  })
})

test('fuzz over TCP: signed messages of every kind with random fields, steps and sequence numbers never break the server', async () => {
  await withServer({}, {}, async (t) => {
    const watcher = await connectClient(t, generateIdentity())
    let x = Number(process.env.FUZZ_SEED ?? Date.now() % 0xffffffff) || 1
    const next = () => ((x ^= x << 13), (x ^= x >>> 17), (x ^= x << 5), x >>> 0)
    const pick = <T>(xs: readonly T[]): T => xs[next() % xs.length]
    const ids = [generateIdentity(), generateIdentity(), generateIdentity()]
    const deadline = Date.now() + 1500
    let sent = 0
    while (Date.now() < deadline) {
      const raw = await RawClient.open(t.server.port)
      const me = pick(ids)
      if (next() % 4) await raw.hello(me, next() % 2 === 0)
      for (let i = 0; i < 12; i++) {
        const step = pick([0, 1, 2, 2 ** 40])
        const seq = pick([raw.seq + 1, raw.seq, 1, raw.seq + 1000])
        const bloom = pick(['', 'AAAA', Buffer.from(Array.from({length: next() % 40}, next)).toString('base64'), '!!'])
        const kind = pick(['witness', 'health_check', 'withdraw', 'checkpoint', 'hello', 'scores'] as const)
        const bodies = {
          witness: {proof: {participant_bloom: bloom, broadcast_bloom: bloom}},
          health_check: {accused: [pick(ids).id]},
          withdraw: {},
          checkpoint: {repo: {repo_id: 'org/m', revision: pick(['main', 'x'])}},
          hello: {run_id: pick([RUN_ID, 'x']), client_id: pick(ids).id, p2p_addrs: [], want_join: true},
          scores: {scores: [{client_id: pick(ids).id, score: pick([0.5, -1, 3, Number.NaN])}]},
        }
        raw.send(pick([me, me, pick(ids)]), kind, bodies[kind] as never, {step, seq, ...(next() % 8 === 0 ? {session: 'ab'.repeat(16)} : {})})
        sent++
      }
      if (next() % 2) await raw.close()
      t.clock.advance(next() % 3)
    }
    // The server never failed on its own, and still serves.
    assert.deepEqual(
      t.logs.filter((l) => l.event === 'error'),
      [],
    )
    assert.ok(sent > 100, `only ${sent} messages`)
    const after = generateIdentity()
    const c = await connectClient(t, after)
    assert.ok(c.state)
    await nextState(watcher, (s) => s.pending.includes(after.id) || s.epoch.clients.some((e) => e.id === after.id))
  })
})

test("verification scores: a verifier's signed report is kept as a moving average per client and shown to watchers (status); others are refused", async () => {
  await withServer({init_min_clients: 2, verification_percent: 100}, {}, async (t) => {
    const [alice, bob] = [generateIdentity(), generateIdentity()]
    const a = await connectClient(t, alice)
    const b = await connectClient(t, bob)
    const watcher = await connectClient(t, generateIdentity(), {join: false})
    await nextState(a, (s) => s.pending.length === 2)
    t.clock.advance(2)
    await nextState(a, (s) => s.run_state === 'Warmup')
    assert.ok(a.sendWarmupReady() && b.sendWarmupReady())
    const round1 = await nextState(a, (s) => s.run_state === 'RoundTrain')
    // Scores are for a finished round: none yet in round 1.
    let from = t.logs.length
    assert.ok(a.sendScores(1, [{client_id: bob.id, score: 0.4}]))
    await t.waitLog({event: 'rejected', code: 'stale_step', of: 'scores'}, from)
    const round2 = nextRound(a, 2, t.clock)
    for (const c of [a, b]) c.sendWitness(1, aliveProof(round1, [alice.id, bob.id]))
    await round2

    assert.ok(a.sendScores(1, [{client_id: bob.id, score: 0.4}]))
    await t.waitLog({event: 'scores', client: alice.id, step: 1})
    assert.ok(b.sendScores(1, [{client_id: alice.id, score: -0.6}]))
    await t.waitLog({event: 'scores', client: bob.id, step: 1})
    // Twice for one step, about a client outside the run, or out of range: refused, nothing changes.
    from = t.logs.length
    assert.ok(a.sendScores(1, [{client_id: bob.id, score: 0.9}]))
    await t.waitLog({event: 'rejected', code: 'DuplicateScores', of: 'scores'}, from)
    from = t.logs.length
    assert.ok(b.sendScores(1, [{client_id: generateIdentity().id, score: 0.1}]))
    await t.waitLog({event: 'rejected', code: 'InvalidScores', of: 'scores'}, from)
    const raw = await RawClient.open(t.server.port)
    const carol = generateIdentity()
    await raw.hello(carol, false)
    from = t.logs.length
    raw.send(carol, 'scores', {scores: [{client_id: bob.id, score: 2}]}, {step: 1})
    await t.waitLog({event: 'rejected', client: carol.id}, from)
    // Not a verifier (not even a trainer) of the round.
    from = t.logs.length
    raw.send(carol, 'scores', {scores: [{client_id: bob.id, score: 0.2}]}, {step: 1})
    const refused = await t.waitLog({event: 'rejected', code: 'InvalidScores'}, from)
    assert.match(String(refused.reason), /is not a verifier of step 2/)

    const byId = (list: {client_id: string}[]) => new Map(list.map((x) => [x.client_id, x]))
    const seen = await waitUntil(() => watcher.scores.length === 2 && byId(watcher.scores), 'the scores pushed to the watcher')
    assert.deepEqual(seen.get(bob.id), {client_id: bob.id, average: 0.4, last: 0.4, last_step: 1, verifiers: 1, count: 1})
    assert.deepEqual(seen.get(alice.id), {client_id: alice.id, average: -0.6, last: -0.6, last_step: 1, verifiers: 1, count: 1})
    assert.deepEqual(t.server.scores, watcher.scores)
    // Training clients do not get them.
    assert.deepEqual(a.scores, [])
    await raw.close()
  })
})

test('the server mixes its own entropy into every round’s seed, the first round’s too (started by the last warmup witness)', async () => {
  // The round's seed as the coordinator derives it from the previous one: SHA-256(seed ‖ step ‖ entropy).
  const derived = (previous: string, step: number, entropy: string) => sha256(fromHex(previous), u64le(step), Buffer.from(entropy, 'utf8')).toString('hex')
  const firstRound = async (options: Parameters<typeof startTestServer>[1]) => {
    let before: CoordinatorState | undefined
    let training: CoordinatorState | undefined
    await withServer({init_min_clients: 2}, options, async (t) => {
      const a = await connectClient(t, generateIdentity())
      const b = await connectClient(t, generateIdentity())
      t.clock.advance(2)
      before = await nextState(a, (s) => s.run_state === 'Warmup')
      assert.ok(a.sendWarmupReady() && b.sendWarmupReady())
      training = await nextState(a, (s) => s.run_state === 'RoundTrain')
    })
    return {before: before!, training: training!}
  }
  // Given the entropy, the seed is reproducible (what test vectors rely on).
  const fixed = await firstRound({entropy: () => 'fixed entropy'})
  assert.equal(fixed.training.seed, derived(fixed.before.seed, fixed.training.progress.step, 'fixed entropy'))
  // By default it is the server's own (clock, count, random bytes): not what anyone could have derived in advance.
  const [x, y] = [await firstRound({}), await firstRound({})]
  assert.equal(x.before.seed, y.before.seed, 'the same run starts from the same seed')
  assert.notEqual(x.training.seed, derived(x.before.seed, x.training.progress.step, ''), 'the first round’s seed is not the entropy-free one')
  assert.notEqual(x.training.seed, y.training.seed, 'two servers of one run draw different first-round seeds')
})

test('refusals cost the sender: a watcher flooding invalid witnesses is closed within --max-strikes, and its identity and address banned', async () => {
  await withServer({}, {limits: {maxStrikes: 5, strikeBanSeconds: 30}}, async (t) => {
    const flooder = generateIdentity()
    const raw = await RawClient.open(t.server.port)
    await raw.hello(flooder, false)
    await raw.next((m) => m.kind === 'state')
    const from = t.logs.length
    // A witness for step 2^40 from a connection that never joined: refused by the coordinator each time.
    const proof = {participant_bloom: '', broadcast_bloom: ''}
    for (let i = 0; i < 20 && !raw.closed; i++) {
      raw.send(flooder, 'witness', {proof}, {step: 2 ** 40})
      await new Promise((r) => setTimeout(r, 5))
    }
    await waitUntil(() => raw.closed, 'the flooding watcher to be closed')
    const refused = t.logs.slice(from).filter((l) => l.event === 'rejected' && l.client === flooder.id)
    const closing = refused.find((l) => l.code === 'too_many_rejections')
    assert.ok(closing, JSON.stringify(refused.slice(-3)))
    assert.equal(refused.filter((l) => l.code !== 'too_many_rejections').length, 5, 'closed at its 5th refusal')
    // The identity may not come back (from a new address neither: the test's one address is banned too).
    await refusedOnConnect(t.server.port)
    await t.waitLog({event: 'rejected', code: 'strike_banned'}, from)
    await raw.close()
  })
})

test('a connection on the passive cadence, several revisions behind at each state, gets the changes since the revision it holds as a delta that rebuilds the state', async () => {
  const dir = tempDir()
  const t = await startTestServer(writeRunConfig(dir.path, {init_min_clients: 64, global_batch_size_start: 64, global_batch_size_end: 64}), {
    passiveStateMs: 300,
    limits: {joinsPerSecond: 1000},
  })
  const opened: RawClient[] = []
  try {
    const watcher = await RawClient.open(t.server.port)
    opened.push(watcher)
    const me = generateIdentity()
    watcher.send(me, 'hello', {run_id: RUN_ID, client_id: me.id, p2p_addrs: [], want_join: false, state_deltas: true}, {step: 0})
    await watcher.next((m) => m.kind === 'state')
    // Joins a few tens of ms apart: each a revision, several between two of the watcher's states.
    for (let i = 0; i < 12; i++) {
      const c = await RawClient.open(t.server.port)
      opened.push(c)
      await c.hello(generateIdentity(), true)
      await new Promise((r) => setTimeout(r, 40))
    }
    await waitUntil(() => watcher.messages.some((m) => m.kind === 'state_delta' && m.body.base < m.body.rev - 1), 'a delta from a revision two or more behind')
    // The watcher's state, rebuilt from its one whole state and the deltas after it.
    const rebuilt = (): CoordinatorState | undefined => {
      let state: CoordinatorState | undefined
      let rev = -1
      for (const m of watcher.messages) {
        if (m.kind === 'state') {
          state = m.body.state
          rev = m.body.rev ?? -1
        } else if (m.kind === 'state_delta') {
          assert.equal(m.body.base, rev, 'each delta is from the revision the connection holds')
          state = applyDelta(state!, m.body.ops)
          assert.equal(sha256Hex(serializeState(state)), m.body.hash, `revision ${m.body.rev} rebuilt`)
          rev = m.body.rev
        }
      }
      return state
    }
    await waitUntil(() => rebuilt()?.pending.length === 12, 'the watcher to catch up with all 12 joins')
    assert.equal(watcher.messages.filter((m) => m.kind === 'state').length, 1, 'one whole state, the first')
  } finally {
    await Promise.all(opened.map((c) => c.close()))
    await t.server.stop()
    dir.cleanup()
  }
})
