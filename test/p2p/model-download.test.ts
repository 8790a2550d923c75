import type {EventLine} from '../../src/core/events.js'
import assert from 'node:assert/strict'
import {randomBytes} from 'node:crypto'
import {describe, it} from 'node:test'
import fc from 'fast-check'
import {
  BadPeerError,
  BusyPeerError,
  chooseManifest,
  downloadModel,
  manifestRoot,
  parseManifest,
  parseTensorRequest,
  planPieces,
  signManifest,
  type ModelManifest,
  type ModelPeerTransport,
  type ModelSnapshot,
} from '../../src/core/p2p/index.js'
import {generateIdentity, type Identity} from '../../src/core/protocol/identity.js'

const RUN = 'run-x'
const MAX = 1 << 30

function model(step = 7, seed = 0): ModelSnapshot {
  const t = (name: string, shape: number[]) => ({name, dtype: 'float32', shape, data: new Uint8Array(randomBytes(shape.reduce((a, b) => a * b, 1) * 4))})
  const frames = [t('embed', [256, 16]), t('l0.q', [16, 16]), t('l0.k', [16, 16]), t('l0.mlp', [64, 16]), t('norm', [16]), t('head', [256, 16]), t('scalar', [])]
  return {step, paramHash: `hash-${seed}-${step}`, frames}
}

/** A peer of the in-process network: what it signs, and what it serves (honest peers serve what they sign). */
interface Peer {
  identity: Identity
  model: ModelSnapshot
  /** bytes served instead of the model's, per tensor name (a dishonest peer) */
  corrupt?: Set<string>
  /** requests that fail (a flaky or dead peer) */
  failTensors?: number
  down?: boolean
  /** tensor requests answered busy (a holder at its upload bound); Infinity: always */
  busy?: number
  /** each tensor request takes this long */
  delayMs?: number
  manifestOverride?: unknown
  requests: number
}

function network(peers: Peer[], log: string[] = []): ModelPeerTransport {
  const byId = new Map(peers.map((p) => [p.identity.id, p]))
  return {
    async manifest(id) {
      const p = byId.get(id)
      if (!p || p.down) throw new Error('unreachable')
      return p.manifestOverride ?? JSON.parse(JSON.stringify(signManifest(p.identity, RUN, p.model)))
    },
    async tensors(id, step, tensors) {
      const p = byId.get(id)!
      p.requests++
      log.push(id)
      await new Promise((r) => (p.delayMs ? setTimeout(r, p.delayMs) : setImmediate(r)))
      if (p.down) throw new Error('unreachable')
      if ((p.busy ?? 0) > 0) {
        p.busy!--
        throw new BusyPeerError('serving 4 model pieces, its bound', 20)
      }
      if ((p.failTensors ?? 0) > 0) {
        p.failTensors!--
        throw new Error('connection reset')
      }
      if (step !== p.model.step) throw new Error('stale')
      return tensors.map(({index}) => {
        const f = p.model.frames[index]
        const bytes = Buffer.from(f.data)
        if (p.corrupt?.has(f.name)) bytes[0] ^= 1
        return new Uint8Array(bytes)
      })
    },
  }
}

function peer(m: ModelSnapshot, extra: Partial<Peer> = {}): Peer {
  return {identity: generateIdentity(), model: m, requests: 0, ...extra}
}

function assertSameModel(got: ModelSnapshot, want: ModelSnapshot): void {
  assert.equal(got.step, want.step)
  assert.equal(got.paramHash, want.paramHash)
  assert.deepEqual(
    got.frames.map((f) => [f.name, f.dtype, f.shape]),
    want.frames.map((f) => [f.name, f.dtype, f.shape]),
  )
  got.frames.forEach((f, i) => assert.ok(Buffer.from(f.data).equals(Buffer.from(want.frames[i].data)), `tensor ${f.name} differs`))
}

describe('p2p model download: manifests, quorum and verified tensors (in process)', () => {
  it('spreads the tensors over every peer that signed the manifest, with bounded concurrency', async () => {
    const m = model()
    const peers = [peer(m), peer(m), peer(m)]
    let inFlight = 0
    let peak = 0
    const base = network(peers)
    const transport: ModelPeerTransport = {
      manifest: base.manifest,
      async tensors(...args) {
        peak = Math.max(peak, ++inFlight)
        try {
          return await base.tensors(...args)
        } finally {
          inFlight--
        }
      },
    }
    const got = await downloadModel(transport, {runId: RUN, peers: peers.map((p) => p.identity.id), maxModelBytes: MAX, step: 7, pieceBytes: 2048, concurrency: 2})
    assertSameModel(got.snapshot, m)
    assert.equal(got.attesters.length, 3)
    assert.ok(peak <= 2, `at most 2 requests in flight (saw ${peak})`)
    const sources = Object.values(got.bytesFrom).filter((b) => b > 0)
    assert.ok(sources.length >= 2, `tensors came from several peers: ${JSON.stringify(got.bytesFrom)}`)
    assert.equal(
      Object.values(got.bytesFrom).reduce((a, b) => a + b, 0),
      got.totalBytes,
    )
    assert.deepEqual(got.dropped, [])
  })

  it('a holder at its upload bound (busy) is no failure: the piece goes to another holder, nobody is dropped, and the busy one is asked again', async () => {
    // 40 pieces of 256 bytes, each request taking 5 ms: the busy holder's rest (50 ms, the least a holder may ask for) ends before the other is done
    const m: ModelSnapshot = {
      step: 7,
      paramHash: 'many',
      frames: Array.from({length: 40}, (_, i) => ({name: `t${i}`, dtype: 'float32', shape: [64], data: new Uint8Array(randomBytes(256))})),
    }
    const [busy, free] = [peer(m, {busy: 2, delayMs: 5}), peer(m, {delayMs: 5})]
    const got = await downloadModel(network([busy, free]), {runId: RUN, peers: [busy, free].map((p) => p.identity.id), maxModelBytes: MAX, step: 7, pieceBytes: 256})
    assertSameModel(got.snapshot, m)
    assert.deepEqual(got.dropped, [])
    assert.equal(got.busy, 2)
    assert.ok(got.bytesFrom[free.identity.id] > 0)
    assert.ok(busy.requests > 2 && got.bytesFrom[busy.identity.id] > 0, `the busy holder was asked again once it could serve: ${JSON.stringify(got.bytesFrom)}`)
  })

  it('with one holder, busy answers make the joiner wait and ask again; when every holder stays busy past the bound it fails naming it', async () => {
    const m = model()
    const one = peer(m, {busy: 5})
    const got = await downloadModel(network([one]), {runId: RUN, peers: [one.identity.id], maxModelBytes: MAX, step: 7, pieceBytes: 1 << 20})
    assertSameModel(got.snapshot, m)
    assert.equal(got.busy, 5)
    assert.deepEqual(got.dropped, [])
    const stuck = [peer(m, {busy: Infinity}), peer(m, {busy: Infinity})]
    const started = Date.now()
    await assert.rejects(
      downloadModel(network(stuck), {runId: RUN, peers: stuck.map((p) => p.identity.id), maxModelBytes: MAX, step: 7, busyTimeoutMs: 300}),
      /could not fetch the model: every holder stayed busy \(at its upload bound\) for 0 s, the last: busy: serving 4 model pieces, its bound/,
    )
    assert.ok(Date.now() - started < 5_000, 'it gave up in bounded time')
    // it rested between asks: a few requests per holder, not a spin
    for (const p of stuck) assert.ok(p.requests <= 40, `${p.requests} requests to one always-busy holder in 300 ms`)
  })

  it('drops a peer that serves bytes not matching the manifest it signed, and takes those tensors from another', async () => {
    const m = model()
    const liar = peer(m, {corrupt: new Set(m.frames.map((f) => f.name))})
    const honest = [peer(m), peer(m)]
    const events: EventLine[] = []
    const got = await downloadModel(network([liar, ...honest]), {
      runId: RUN,
      peers: [liar, ...honest].map((p) => p.identity.id),
      maxModelBytes: MAX,
      pieceBytes: 1024,
      log: (e) => events.push(e),
    })
    assertSameModel(got.snapshot, m)
    // (pieces it served intact before are kept: they hash to the manifest like anyone's)
    assert.deepEqual(
      got.dropped.map((d) => [d.client_id, d.bad]),
      [[liar.identity.id, true]],
    )
    assert.match(got.dropped[0].reason, /do not hash to the manifest's sha256/)
    assert.ok(
      events.some((e) => e.event === 'model_peer_dropped' && e.client_id === liar.identity.id && e.bad === true),
      'the bad peer is reported',
    )
  })

  it('retries a failing piece on another peer and gives a peer up after repeated failures', async () => {
    const m = model()
    const flaky = peer(m, {failTensors: 100})
    const good = peer(m)
    const got = await downloadModel(network([flaky, good]), {runId: RUN, peers: [flaky.identity.id, good.identity.id], maxModelBytes: MAX, pieceBytes: 1024, maxPeerFailures: 2})
    assertSameModel(got.snapshot, m)
    // given up at its second failure; with 2 requests in flight per peer, at most one more was already sent
    assert.ok(flaky.requests >= 2 && flaky.requests <= 3, `the flaky peer was asked ${flaky.requests} times, then given up`)
    assert.deepEqual(
      got.dropped.map((d) => [d.client_id, d.bad]),
      [[flaky.identity.id, false]],
    )
    assert.match(got.dropped[0].reason, /2 failed requests.*connection reset/)
  })

  it('fails, naming the peers, when every signer is given up', async () => {
    const m = model()
    const a = peer(m, {corrupt: new Set(['embed'])})
    const b = peer(m, {failTensors: 100})
    await assert.rejects(
      downloadModel(network([a, b]), {runId: RUN, peers: [a.identity.id, b.identity.id], maxModelBytes: MAX}),
      /every peer that signed the manifest was given up .*do not hash.*failed requests/,
    )
  })

  it('takes the majority root: a minority peer with other parameters is not used', async () => {
    const m = model()
    const other = peer(model(7, 1)) // same step, other bytes (a forked or forged replica)
    const honest = [peer(m), peer(m)]
    const got = await downloadModel(network([other, ...honest]), {runId: RUN, peers: [other, ...honest].map((p) => p.identity.id), maxModelBytes: MAX})
    assertSameModel(got.snapshot, m)
    assert.equal(other.requests, 0, 'no tensor was asked of the dissenter')
    assert.deepEqual(
      got.dropped.map((d) => [d.client_id, d.bad]),
      [[other.identity.id, false]],
    )
  })

  it('refuses when no root has a strict majority (one honest and one forged peer)', async () => {
    const a = peer(model())
    const b = peer(model(7, 1))
    await assert.rejects(
      downloadModel(network([a, b]), {runId: RUN, peers: [a.identity.id, b.identity.id], maxModelBytes: MAX}),
      /no manifest root is signed by a majority of the 2 answering peers/,
    )
  })

  it("with the run's parameter hash (the coordinator's record): a lone answering peer with another model is refused, and the run's model wins over a majority of others", async () => {
    const m = model()
    const lone = peer(model(7, 1)) // the only peer that answers, serving another model than the run's
    const silent = peer(m, {down: true})
    await assert.rejects(
      downloadModel(network([lone, silent]), {runId: RUN, peers: [lone.identity.id, silent.identity.id], maxModelBytes: MAX, paramHash: m.paramHash}),
      /none of the 1 answering peers serves the run's model \(parameter hash hash-0-7…, recorded by the coordinator\)/,
    )
    assert.equal(lone.requests, 0, 'nothing was downloaded from it')
    // without the record, the lone peer decided alone (a strict majority of those that answer)
    assertSameModel((await downloadModel(network([lone, silent]), {runId: RUN, peers: [lone.identity.id, silent.identity.id], maxModelBytes: MAX})).snapshot, lone.model)
    const others = [peer(model(7, 2)), peer(model(7, 2))]
    const honest = peer(m)
    const got = await downloadModel(network([...others, honest]), {runId: RUN, peers: [...others, honest].map((p) => p.identity.id), maxModelBytes: MAX, paramHash: m.paramHash})
    assertSameModel(got.snapshot, m)
    assert.deepEqual(got.attesters, [honest.identity.id])
    assert.match(got.dropped[0].reason, /is not the run's model/)
  })

  it('counts only peers at the requested step; unreachable peers and forged signatures do not count', async () => {
    const m = model(7)
    const ahead = peer(model(8))
    const down = peer(m, {down: true})
    const good = peer(m)
    const forger = peer(m)
    const forged = signManifest(forger.identity, RUN, model(7, 3))
    forger.manifestOverride = {...forged, param_hash: 'something-else'} // the signature no longer covers the fields
    const impostor = peer(m)
    impostor.manifestOverride = signManifest(good.identity, RUN, m) // another peer's manifest
    const got = await downloadModel(network([ahead, down, good, forger, impostor]), {
      runId: RUN,
      peers: [ahead, down, good, forger, impostor].map((p) => p.identity.id),
      step: 7,
      maxModelBytes: MAX,
    })
    assertSameModel(got.snapshot, m)
    assert.deepEqual(got.attesters, [good.identity.id])
  })

  it('a replica got from peers hashes to the same root as the served one (the root binds every tensor)', () => {
    const m = model()
    const id = generateIdentity()
    const signed = signManifest(id, RUN, m)
    const {root} = parseManifest(JSON.parse(JSON.stringify(signed)), RUN, MAX)
    assert.equal(root, manifestRoot(signed))
    const changed = {...signed, tensors: signed.tensors.map((t, i) => (i === 2 ? {...t, sha256: 'f'.repeat(64)} : t))}
    assert.notEqual(manifestRoot(changed), root)
    assert.throws(() => parseManifest(changed, RUN, MAX), /signature does not verify/)
  })

  it('chooseManifest and planPieces', () => {
    const id = generateIdentity()
    const m = signManifest(id, RUN, model())
    assert.deepEqual(chooseManifest([]), {ok: false, reason: 'no peer served a manifest'})
    const one = chooseManifest([{clientId: 'a', root: 'r1', manifest: m}])
    assert.ok(one.ok && one.root === 'r1')
    const three = chooseManifest([
      {clientId: 'a', root: 'r1', manifest: m},
      {clientId: 'b', root: 'r2', manifest: m},
      {clientId: 'c', root: 'r2', manifest: m},
    ])
    assert.ok(three.ok && three.root === 'r2' && three.dissenters[0] === 'a')
    assert.deepEqual(planPieces([10, 10, 100, 5, 5, 5], 20), [[0, 1], [2], [3, 4, 5]])
    assert.deepEqual(planPieces([], 20), [])
  })

  it('BadPeerError is what a transport throws for bytes beyond the declared size', () => {
    assert.ok(new BadPeerError('x') instanceof Error)
  })
})

describe('decoders of the model protocol (fuzzed)', () => {
  const id = generateIdentity()
  const valid = JSON.parse(JSON.stringify(signManifest(id, RUN, model()))) as ModelManifest

  /** Either a parse succeeds with a manifest whose signature covers it, or it throws an Error with a message. */
  function parsesOrErrors(raw: unknown): void {
    let parsed: ReturnType<typeof parseManifest> | undefined
    try {
      parsed = parseManifest(raw, RUN, MAX)
    } catch (error) {
      assert.ok(error instanceof Error && error.message.length > 0, String(error))
      return
    }
    assert.equal(parsed.root, manifestRoot(parsed.manifest))
    assert.equal(
      parsed.totalBytes,
      parsed.manifest.tensors.reduce((s, t) => s + t.size, 0),
    )
  }

  it('parseManifest: arbitrary JSON values', () => {
    fc.assert(
      fc.property(fc.jsonValue(), (v) => parsesOrErrors(v)),
      {numRuns: 2000},
    )
    fc.assert(
      fc.property(fc.dictionary(fc.constantFrom('run_id', 'step', 'param_hash', 'tensors', 'signer', 'signature', 'x'), fc.jsonValue()), (v) => parsesOrErrors(v)),
      {numRuns: 2000},
    )
  })

  it('parseManifest: mutations of a valid manifest are rejected unless they leave it intact', () => {
    const fields = ['run_id', 'step', 'param_hash', 'signer', 'signature'] as const
    fc.assert(
      fc.property(fc.constantFrom(...fields), fc.jsonValue(), (field, value) => {
        const raw = {...valid, [field]: value}
        parsesOrErrors(raw)
        if (JSON.stringify(value) !== JSON.stringify(valid[field])) assert.throws(() => parseManifest(raw, RUN, MAX))
      }),
      {numRuns: 2000},
    )
    fc.assert(
      fc.property(fc.nat(valid.tensors.length - 1), fc.constantFrom('name', 'dtype', 'shape', 'size', 'sha256', 'extra'), fc.jsonValue(), (i, key, value) => {
        const tensors = valid.tensors.map((t, k) => (k === i ? {...t, [key]: value} : t))
        const raw = {...valid, tensors}
        parsesOrErrors(raw)
        const before = (valid.tensors[i] as unknown as Record<string, unknown>)[key]
        if (key !== 'extra' && JSON.stringify(value) !== JSON.stringify(before)) assert.throws(() => parseManifest(raw, RUN, MAX))
      }),
      {numRuns: 2000},
    )
    // bytes of the JSON text flipped at random: still parsed or refused, never accepted with another root
    const text = Buffer.from(JSON.stringify(valid))
    fc.assert(
      fc.property(fc.nat(text.length - 1), fc.integer({min: 1, max: 255}), (at, x) => {
        const bytes = Buffer.from(text)
        bytes[at] ^= x
        let raw: unknown
        try {
          raw = JSON.parse(bytes.toString('utf8'))
        } catch {
          return
        }
        parsesOrErrors(raw)
      }),
      {numRuns: 3000},
    )
  })

  it('parseTensorRequest: arbitrary requests', () => {
    fc.assert(
      fc.property(fc.dictionary(fc.constantFrom('step', 'indices', 'run_id', 'kind'), fc.jsonValue()), (v) => {
        try {
          const r = parseTensorRequest(v)
          assert.ok(Number.isSafeInteger(r.step) && r.indices.length > 0 && r.indices.every((i) => Number.isSafeInteger(i) && i >= 0))
        } catch (error) {
          assert.ok(error instanceof Error && /^tensor request: /.test(error.message))
        }
      }),
      {numRuns: 3000},
    )
    assert.deepEqual(parseTensorRequest({step: 3, indices: [0, 5]}), {step: 3, indices: [0, 5]})
    assert.throws(() => parseTensorRequest({step: 3, indices: [1, 1]}), /repeats/)
    assert.throws(() => parseTensorRequest({step: 3, indices: Array.from({length: 65}, (_, i) => i)}), /1\.\.64/)
  })
})
