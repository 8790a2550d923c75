import assert from 'node:assert/strict'
import {createHash} from 'node:crypto'
import {test} from 'node:test'
import {createCoordinator, serializeState} from '../../src/core/coordinator/index.js'
import {
  DEFAULT_MAX_FRAME_BYTES,
  FrameReader,
  decodeClientMessage,
  decodeServerMessage,
  encodeClientMessage,
  encodeFrame,
  encodeServerMessage,
  generateIdentity,
  identityFromSeed,
  signBytes,
  type DecodeReason,
  type Identity,
} from '../../src/core/protocol/index.js'
import {seededRng} from '../helpers.js'

const alice = identityFromSeed(Buffer.alloc(32, 1))
const server = identityFromSeed(Buffer.alloc(32, 2))
const SESSION = '0123456789abcdef0123456789abcdef'
const fields = (seq = 1, step = 3) => ({run_id: 'run-a', step, seq, session: SESSION})
const REASONS: DecodeReason[] = ['truncated', 'bad_magic', 'bad_version', 'wrong_direction', 'bad_signature', 'malformed', 'invalid_message']

/** The frame body inside a length-prefixed frame. */
function body(frame: Buffer): Buffer {
  assert.equal(frame.readUInt32LE(0), frame.length - 4)
  return frame.subarray(4)
}

/**
 * Builds an envelope straight from the layout documented in messages.ts (not through its encoder), with
 * any payload bytes: a check of the documentation, and a way to sign payloads the encoder never makes.
 */
function signedEnvelope(identity: Identity, direction: 0 | 1, payload: Uint8Array): Buffer {
  const header = Buffer.concat([Buffer.from('PSYC'), Buffer.from([1, direction]), identity.publicKey])
  const digest = createHash('sha256').update(payload).digest()
  const signature = signBytes(identity, Buffer.concat([Buffer.from('psyche/envelope/v1\0'), header, digest]))
  return Buffer.concat([header, signature, payload])
}

const REPORT = {
  loss: 5,
  val_loss: null,
  tokens_per_second: null,
  compute_ms: null,
  apply_ms: null,
  result_bytes: null,
  bytes_in: 0,
  bytes_out: 0,
  applied: 0,
  accepted: 0,
  peers: 0,
}

test('every client message round-trips with its sender, run, step, seq and session', () => {
  const bob = generateIdentity().id
  const messages = [
    ['hello', {run_id: 'run-a', client_id: alice.id, p2p_addrs: ['/ip4/127.0.0.1/tcp/4001'], want_join: true}],
    ['witness', {proof: {participant_bloom: 'AAAA', broadcast_bloom: 'AAAA'}}],
    ['witness', {proof: {participant_bloom: '', broadcast_bloom: ''}, param_hash: 'ab'.repeat(32)}],
    ['health_check', {accused: [bob]}],
    ['accuse', {accused: bob, reason: 'invalid_result'}],
    ['equivocation', {proof: {a: {step: 1}, b: {step: 1}}}],
    ['withdraw', {}],
    ['checkpoint', {repo: {repo_id: 'org/model', revision: 'abc'}}],
    ['checkpoint', {repo: {repo_id: 'org/model', revision: 'abc'}, param_hash: 'cd'.repeat(32)}],
    [
      'report',
      {
        loss: 5.25,
        val_loss: null,
        tokens_per_second: 1234.5,
        compute_ms: 812,
        apply_ms: null,
        result_bytes: 6000,
        bytes_in: 120000,
        bytes_out: 40000,
        applied: 3,
        accepted: 3,
        peers: 2,
      },
    ],
    ['report', {...REPORT, checkpoint_save_failed: {step: 12, message: '/data/step-12: No space left on device'}}],
    ['scores', {scores: [{client_id: bob, score: -0.25}]}],
    ['addresses', {p2p_addrs: ['/ip4/10.0.0.2/tcp/4001/p2p/12D3KooWA', '/ip4/203.0.113.7/tcp/4001/p2p/12D3KooWR/p2p-circuit/p2p/12D3KooWA']}],
  ] as const
  for (const [kind, b] of messages) {
    const d = decodeClientMessage(body(encodeClientMessage(alice, kind, fields(5, 9), b as never)))
    assert.ok(d.ok, `${kind}: ${!d.ok && d.detail}`)
    assert.deepEqual(d.envelope, {kind, run_id: 'run-a', step: 9, seq: 5, session: SESSION, from: alice.id, body: b})
  }
})

test('every server message round-trips; the state arrives as a CoordinatorState', () => {
  const state = createCoordinator({
    run_id: 'run-a',
    run_state: 'WaitingForMembers',
    config: {
      warmup_time: 1,
      cooldown_time: 1,
      epoch_time: 10,
      max_round_train_time: 1,
      round_witness_time: 1,
      min_clients: 1,
      init_min_clients: 1,
      witness_nodes: 0,
      verification_percent: 0,
      global_batch_size_start: 1,
      global_batch_size_end: 1,
      global_batch_size_warmup_tokens: 0,
      total_steps: 5,
      waiting_for_members_extra_time: 0,
    },
    model: {LLM: {} as never},
  })
  const peers = {[alice.id]: ['/ip4/1.2.3.4/tcp/1']}
  const state1 = decodeServerMessage(body(encodeServerMessage(server, 'state', fields(), {state: serializeState(state), peers, server_time: 12})))
  assert.ok(state1.ok, !state1.ok ? state1.detail : '')
  assert.equal(state1.envelope.kind, 'state')
  assert.deepEqual(state1.envelope.body, {state, peers, server_time: 12})
  // The pre-serialized form the server uses for broadcasts decodes the same.
  const json = JSON.stringify({state: serializeState(state), peers, server_time: 12})
  const state2 = decodeServerMessage(body(encodeServerMessage(server, 'state', fields(), {json})))
  assert.ok(state2.ok)
  assert.deepEqual(state2.envelope.body, state1.envelope.body)
  // A watcher's state carries the trainers' reports since its previous one; a malformed one refuses the frame.
  const report = {loss: 6.5, val_loss: null, tokens_per_second: 1, compute_ms: 1, apply_ms: 1, result_bytes: 1, bytes_in: 1, bytes_out: 1, applied: 1, accepted: 1, peers: 1}
  const reports = [{client: alice.id, step: 3, report}]
  const state3 = decodeServerMessage(body(encodeServerMessage(server, 'state', fields(), {json: JSON.stringify({state: serializeState(state), peers, server_time: 12, reports})})))
  assert.ok(state3.ok && state3.envelope.kind === 'state', !state3.ok ? state3.detail : '')
  assert.deepEqual(state3.envelope.body.reports, reports)
  const bad = decodeServerMessage(
    body(encodeServerMessage(server, 'state', fields(), {json: JSON.stringify({state: serializeState(state), peers, server_time: 12, reports: [{client: 'x', step: 3, report}]})})),
  )
  assert.ok(!bad.ok && /state.reports|client_report.client/.test(bad.detail), !bad.ok ? bad.detail : 'accepted')
  for (const [kind, b] of [
    ['challenge', {session: SESSION}],
    ['welcome', {run_id: 'run-a', client_id: alice.id, server_time: 5}],
    ['welcome', {run_id: 'run-a', client_id: alice.id, server_time: 5, relay_addrs: ['/ip4/203.0.113.7/tcp/4001/p2p/12D3KooWR']}],
    ['rejected', {code: 'wrong_run_id', reason: 'no', of: 'hello'}],
  ] as const) {
    const d = decodeServerMessage(body(encodeServerMessage(server, kind, fields(), b as never)))
    assert.ok(d.ok, kind)
    assert.equal(d.envelope.from, server.id)
    assert.deepEqual(d.envelope.body, b)
  }
})

test('the layout is as documented: a hand-built envelope decodes', () => {
  const payload = Buffer.from(JSON.stringify({kind: 'withdraw', run_id: 'run-a', step: 1, seq: 2, session: SESSION, body: {}}))
  const d = decodeClientMessage(signedEnvelope(alice, 0, payload))
  assert.ok(d.ok)
  assert.equal(d.envelope.from, alice.id)
})

test('tampering anywhere, unsigned bytes, the wrong direction, or bad fields are rejected with a reason', () => {
  const good = body(encodeClientMessage(alice, 'witness', fields(), {proof: {participant_bloom: 'AA', broadcast_bloom: 'AA'}}))
  for (let i = 0; i < good.length; i++) {
    const bad = Buffer.from(good)
    bad[i] ^= 0x01
    const d = decodeClientMessage(bad)
    assert.equal(d.ok, false, `flipping byte ${i} was accepted`)
  }
  const zeroSig = Buffer.from(good)
  zeroSig.fill(0, 38, 102)
  assert.equal((decodeClientMessage(zeroSig) as {reason: string}).reason, 'bad_signature')
  // Someone else's key in `from` with our signature: a forgery.
  const forged = Buffer.from(good)
  Buffer.from(generateIdentity().publicKey).copy(forged, 6)
  assert.equal((decodeClientMessage(forged) as {reason: string}).reason, 'bad_signature')
  assert.equal((decodeServerMessage(good) as {reason: string}).reason, 'wrong_direction')
  assert.equal((decodeClientMessage(good.subarray(0, 50)) as {reason: string}).reason, 'truncated')

  const cases: [object | string, DecodeReason, RegExp][] = [
    ['{not json', 'malformed', /JSON/],
    ['[1,2]', 'malformed', /object/],
    [{kind: 'launch', run_id: 'r', step: 0, seq: 1, session: SESSION, body: {}}, 'invalid_message', /unknown message kind/],
    [{kind: 'withdraw', run_id: 'r', step: -1, seq: 1, session: SESSION, body: {}}, 'invalid_message', /step/],
    [{kind: 'withdraw', run_id: 'r', step: 0, seq: 0, session: SESSION, body: {}}, 'invalid_message', /seq/],
    [{kind: 'withdraw', run_id: 'r', step: 0, seq: 1.5, session: SESSION, body: {}}, 'invalid_message', /seq/],
    [{kind: 'withdraw', run_id: 'r', step: 0, seq: 1, session: 'short', body: {}}, 'invalid_message', /session/],
    [{kind: 'withdraw', run_id: 'r', step: 0, seq: 1, session: SESSION, body: {}, extra: 1}, 'invalid_message', /unexpected field "extra"/],
    [{kind: 'hello', run_id: 'r', step: 0, seq: 1, session: SESSION, body: {run_id: 'r', client_id: 'me', p2p_addrs: [], want_join: true}}, 'invalid_message', /client_id/],
    [
      {kind: 'hello', run_id: 'r', step: 0, seq: 1, session: SESSION, body: {run_id: 'r', client_id: alice.id, p2p_addrs: Array(33).fill('a'), want_join: true}},
      'invalid_message',
      /more than 32/,
    ],
    [{kind: 'hello', run_id: 'r', step: 0, seq: 1, session: SESSION, body: {run_id: 'r', client_id: alice.id, p2p_addrs: [], want_join: 'yes'}}, 'invalid_message', /want_join/],
    [{kind: 'health_check', run_id: 'r', step: 0, seq: 1, session: SESSION, body: {accused: []}}, 'invalid_message', /non-empty/],
    [{kind: 'accuse', run_id: 'r', step: 0, seq: 1, session: SESSION, body: {accused: alice.id, reason: 'rude'}}, 'invalid_message', /accuse.reason/],
    [{kind: 'accuse', run_id: 'r', step: 0, seq: 1, session: SESSION, body: {accused: 'x', reason: 'invalid_result'}}, 'invalid_message', /accuse.accused/],
    [{kind: 'equivocation', run_id: 'r', step: 0, seq: 1, session: SESSION, body: {proof: {a: {}}}}, 'invalid_message', /missing "b"/],
    [{kind: 'witness', run_id: 'r', step: 0, seq: 1, session: SESSION, body: {proof: {participant_bloom: 1, broadcast_bloom: ''}}}, 'invalid_message', /participant_bloom/],
    [{kind: 'checkpoint', run_id: 'r', step: 0, seq: 1, session: SESSION, body: {repo: {repo_id: ''}}}, 'invalid_message', /repo_id/],
    [{kind: 'checkpoint', run_id: 'r', step: 0, seq: 1, session: SESSION, body: {repo: {repo_id: 'a/b'}, param_hash: 'AB'.repeat(32)}}, 'invalid_message', /checkpoint.param_hash/],
    [
      {kind: 'witness', run_id: 'r', step: 0, seq: 1, session: SESSION, body: {proof: {participant_bloom: '', broadcast_bloom: ''}, param_hash: 'ab'}},
      'invalid_message',
      /witness.param_hash/,
    ],
    [{kind: 'report', run_id: 'r', step: 0, seq: 1, session: SESSION, body: {...REPORT, loss: -1}}, 'invalid_message', /report.loss/],
    [{kind: 'report', run_id: 'r', step: 0, seq: 1, session: SESSION, body: {...REPORT, loss: 'NaN'}}, 'invalid_message', /report.loss/],
    [{kind: 'report', run_id: 'r', step: 0, seq: 1, session: SESSION, body: {...REPORT, applied: 1.5}}, 'invalid_message', /report.applied/],
    [{kind: 'report', run_id: 'r', step: 0, seq: 1, session: SESSION, body: {...REPORT, peers: undefined}}, 'invalid_message', /missing "peers"/],
    ...[
      [{step: 1, message: ''}, /checkpoint_save_failed.message must not be empty/],
      [{step: 1, message: 'x'.repeat(301)}, /checkpoint_save_failed.message is longer than 300/],
      [{step: 1, message: 'no\u001b[2Jspace'}, /checkpoint_save_failed.message must be one line without control characters/],
      [{step: 1, message: 'a\nb'}, /one line/],
      [{step: -1, message: 'x'}, /checkpoint_save_failed.step/],
      [{message: 'x'}, /checkpoint_save_failed: missing "step"/],
      [{step: 1, message: 'x', extra: 1}, /unexpected field "extra"/],
      ['full', /checkpoint_save_failed must be an object/],
    ].map(([failed, why]): [object, DecodeReason, RegExp] => [
      {kind: 'report', run_id: 'r', step: 0, seq: 1, session: SESSION, body: {...REPORT, checkpoint_save_failed: failed}},
      'invalid_message',
      why as RegExp,
    ]),
    [{kind: 'addresses', run_id: 'r', step: 0, seq: 1, session: SESSION, body: {p2p_addrs: Array(33).fill('a')}}, 'invalid_message', /addresses.p2p_addrs has more than 32/],
    [{kind: 'addresses', run_id: 'r', step: 0, seq: 1, session: SESSION, body: {p2p_addrs: ['x'.repeat(513)]}}, 'invalid_message', /longer than 512/],
    [{kind: 'addresses', run_id: 'r', step: 0, seq: 1, session: SESSION, body: {p2p_addrs: [1]}}, 'invalid_message', /must be text/],
    [{kind: 'addresses', run_id: 'r', step: 0, seq: 1, session: SESSION, body: {}}, 'invalid_message', /missing "p2p_addrs"/],
    [
      {kind: 'scores', run_id: 'r', step: 0, seq: 1, session: SESSION, body: {scores: [{client_id: alice.id, score: 1.5}]}},
      'invalid_message',
      /scores.scores\[0\].score must be a number in \[-1, 1\]/,
    ],
    [{kind: 'scores', run_id: 'r', step: 0, seq: 1, session: SESSION, body: {scores: [{client_id: 'x', score: 0}]}}, 'invalid_message', /scores.scores\[0\].client_id/],
    [{kind: 'scores', run_id: 'r', step: 0, seq: 1, session: SESSION, body: {scores: Array(1025).fill({client_id: alice.id, score: 0})}}, 'invalid_message', /more than 1024/],
  ]
  for (const [payload, reason, detail] of cases) {
    const bytes = Buffer.from(typeof payload === 'string' ? payload : JSON.stringify(payload))
    const d = decodeClientMessage(signedEnvelope(alice, 0, bytes))
    assert.equal(d.ok, false, JSON.stringify(payload))
    if (!d.ok) {
      assert.equal(d.reason, reason, `${JSON.stringify(payload)}: ${d.detail}`)
      assert.match(d.detail, detail)
    }
  }
  // A server state whose text is not a coordinator state is refused, not handed to the client.
  const badState = signedEnvelope(
    server,
    1,
    Buffer.from(JSON.stringify({kind: 'state', run_id: 'r', step: 0, seq: 1, session: SESSION, body: {state: '{"version":9}', peers: {}, server_time: 0}})),
  )
  const d = decodeServerMessage(badState)
  assert.ok(!d.ok && d.reason === 'invalid_message' && /version/.test(d.detail))
})

test('FrameReader: frames split at every byte boundary come out whole; oversized is fatal; empty is refused', () => {
  const frames = [Buffer.from('a'), Buffer.alloc(300, 7), Buffer.from('xyz')].map(encodeFrame)
  const stream = Buffer.concat(frames)
  for (let cut = 0; cut <= stream.length; cut++) {
    const reader = new FrameReader(1024)
    const out = [...reader.push(stream.subarray(0, cut)), ...reader.push(stream.subarray(cut))]
    assert.deepEqual(
      out.map((e) => (e.ok ? e.body.toString('hex') : e.reason)),
      ['61', Buffer.alloc(300, 7).toString('hex'), '78797a'],
    )
    assert.equal(reader.pending, 0)
  }
  const reader = new FrameReader(100)
  const head = Buffer.alloc(4)
  head.writeUInt32LE(101)
  const [event] = reader.push(head)
  assert.ok(!event.ok && event.reason === 'oversized' && event.fatal)
  assert.deepEqual(reader.push(encodeFrame(Buffer.from('later'))), [], 'nothing after a fatal frame')
  const [empty] = new FrameReader().push(Buffer.alloc(4))
  assert.ok(!empty.ok && empty.reason === 'empty' && !empty.fatal)
  assert.equal(new FrameReader().maxFrameBytes, DEFAULT_MAX_FRAME_BYTES)
})

test('fuzz: random and mutated frames through FrameReader and both decoders never throw, and each is accepted or refused with a reason', () => {
  const seed = Number(process.env.FUZZ_SEED ?? Date.now() % 0xffffffff)
  const next = seededRng(seed)
  const pick = <T>(xs: readonly T[]): T => xs[next() % xs.length]
  const randomBytes = (n: number) => Buffer.from(Array.from({length: n}, () => next() & 0xff))
  const bob = identityFromSeed(Buffer.alloc(32, 3))
  const valid: Buffer[] = [
    body(encodeClientMessage(alice, 'hello', fields(), {run_id: 'run-a', client_id: alice.id, p2p_addrs: ['/ip4/1.1.1.1/tcp/1'], want_join: true})),
    body(encodeClientMessage(alice, 'witness', fields(2), {proof: {participant_bloom: 'AAAAAAAAAAA=', broadcast_bloom: 'AAAAAAAAAAA='}})),
    body(encodeClientMessage(bob, 'health_check', fields(3), {accused: [alice.id]})),
    body(encodeServerMessage(server, 'rejected', fields(), {code: 'x', reason: 'y'})),
    body(encodeServerMessage(server, 'welcome', fields(), {run_id: 'run-a', client_id: alice.id, server_time: 1})),
    body(encodeServerMessage(server, 'welcome', fields(), {run_id: 'run-a', client_id: alice.id, server_time: 1, relay_addrs: ['/ip4/1.2.3.4/tcp/9/p2p/12D3KooWR']})),
    body(encodeClientMessage(alice, 'addresses', fields(4), {p2p_addrs: ['/ip4/1.1.1.1/tcp/1']})),
  ]
  const payloads = valid.map((v) => v.subarray(102).toString('utf8'))
  const mutators: ((b: Buffer) => Buffer)[] = [
    (b) => {
      const c = Buffer.from(b)
      for (let k = 1 + (next() % 4); k > 0; k--) c[next() % c.length] ^= 1 << (next() % 8)
      return c
    },
    (b) => b.subarray(0, next() % b.length),
    (b) => Buffer.concat([b, randomBytes(next() % 16)]),
    (b) => {
      const c = Buffer.from(b)
      c.fill(next() & 0xff, next() % c.length)
      return c
    },
    () => randomBytes(next() % 300),
    () => Buffer.concat([Buffer.from('PSYC'), Buffer.from([1, next() % 3]), randomBytes(next() % 200)]),
    // Validly signed but mutated payloads: these get past the signature to the JSON and field checks.
    () => {
      const p = Buffer.from(pick(payloads))
      for (let k = 1 + (next() % 3); k > 0; k--) p[next() % p.length] = pick([0x22, 0x7b, 0x7d, 0x2c, 0x3a, 0x30, 0x2d, 0x5b, 0x5d, 0x6e, next() & 0xff])
      return signedEnvelope(pick([alice, bob, server]), (next() % 2) as 0 | 1, p)
    },
    () => {
      const obj = JSON.parse(pick(payloads))
      const keys = Object.keys(obj.body)
      const values = [null, -1, 1.5, 2 ** 60, '', 'x'.repeat(600), [], {}, [1], {a: 1}, true, alice.id]
      if (keys.length && next() % 2) obj.body[pick(keys)] = pick(values)
      else obj[pick(Object.keys(obj))] = pick(values)
      return signedEnvelope(pick([alice, server]), (next() % 2) as 0 | 1, Buffer.from(JSON.stringify(obj)))
    },
  ]
  const counts = {accepted: 0, rejected: 0}
  const reasons = new Set<string>()
  const deadline = Date.now() + 2500
  let n = 0
  while (Date.now() < deadline || n < 3000) {
    n++
    const bytes = pick(mutators)(pick(valid))
    for (const decode of [decodeClientMessage, decodeServerMessage]) {
      let d: ReturnType<typeof decodeClientMessage> | ReturnType<typeof decodeServerMessage>
      try {
        d = decode(bytes)
      } catch (error) {
        assert.fail(`seed ${seed}, case ${n}: the decoder threw ${(error as Error).message} on ${bytes.toString('hex')}`)
      }
      if (d.ok) counts.accepted++
      else {
        assert.ok(REASONS.includes(d.reason), `seed ${seed}: unknown reason ${d.reason}`)
        assert.ok(d.detail.length > 0, `seed ${seed}: a reason without detail`)
        reasons.add(d.reason)
        counts.rejected++
      }
    }
    // The same bytes as a stream (with a random length prefix now and then) through the frame reader.
    const reader = new FrameReader(512)
    const stream = next() % 4 === 0 ? randomBytes(next() % 64) : encodeFrame(bytes)
    for (const e of reader.push(stream)) if (!e.ok) assert.ok(['oversized', 'empty'].includes(e.reason))
  }
  assert.ok(n >= 3000, `only ${n} cases`)
  assert.ok(counts.rejected > n, `seed ${seed}: ${JSON.stringify(counts)}`)
  // Every layer of checks was reached.
  for (const r of ['truncated', 'bad_magic', 'wrong_direction', 'bad_signature', 'malformed', 'invalid_message'])
    assert.ok(reasons.has(r), `seed ${seed}: no case reached ${r} (${[...reasons]})`)
})
