import type {EventLine} from '../../src/core/events.js'
import assert from 'node:assert/strict'
import {after, before, describe, it} from 'node:test'
import {P2PNode, validateModelHeader, type ModelSnapshot} from '../../src/core/p2p/index.js'
import {meshUp, randomBlob, startNodes, stopAll, testIdentity, type TestNode} from './helpers.js'

function snapshot(): ModelSnapshot {
  const f32 = (name: string, shape: number[]) => ({name, dtype: 'float32', shape, data: randomBlob(shape.reduce((a, b) => a * b, 1) * 4)})
  return {
    step: 42,
    paramHash: 'abc123',
    frames: [
      f32('model.embed_tokens.weight', [4096, 64]),
      f32('model.layers.0.mlp.up_proj.weight', [128, 64]),
      {name: 'lm_head.bias', dtype: 'bfloat16', shape: [7], data: randomBlob(14)},
      f32('scalar', []),
    ],
  }
}

describe('p2p: model sharing over /psyche/model/2', () => {
  let nodes: TestNode[] = []
  const model = snapshot()
  // three pieces of > 4 MiB, so a download spreads over both serving peers
  const big: ModelSnapshot = {
    step: 9,
    paramHash: 'big',
    frames: ['a', 'b', 'c'].map((name) => ({name, dtype: 'float32', shape: [1024, 1025], data: randomBlob(1024 * 1025 * 4)})),
  }
  let provided = 0
  before(async () => {
    nodes = await startNodes(5)
    await meshUp(nodes)
    for (const i of [0, 3]) {
      nodes[i].node.serveModel(async () => {
        provided++
        return model
      })
    }
  })
  after(async () => stopAll(nodes))

  it('a joining node gets identical frames, checked against the manifest its peers signed', async () => {
    const [server, joiner, noModel, server2] = nodes
    const stranger = testIdentity().id // a valid key nobody runs
    const got = await joiner.node.fetchModel([stranger, noModel.identity.id, server.identity.id, server2.identity.id], {step: 42})
    assert.equal(got.step, 42)
    assert.equal(got.paramHash, 'abc123')
    assert.deepEqual(
      got.frames.map((f) => [f.name, f.dtype, f.shape]),
      model.frames.map((f) => [f.name, f.dtype, f.shape]),
    )
    got.frames.forEach((f, i) => assert.deepEqual(Buffer.from(f.data), Buffer.from(model.frames[i].data)))
    assert.ok(provided >= 3, 'both servers were asked for a manifest, and one for the tensors')
    const failed = joiner.events.filter((e) => e.event === 'model_fetch_failed')
    assert.deepEqual(new Set(failed.map((e) => e.client_id)), new Set([stranger, noModel.identity.id]))
    assert.match(String(failed.find((e) => e.client_id === noModel.identity.id)!.reason), /not_available/)
    const fetched = joiner.events.find((e) => e.event === 'model_fetched')!
    assert.equal(fetched.attesters, 2)
    assert.equal(fetched.relayed, false)
    const total = model.frames.reduce((s, f) => s + f.data.length, 0)
    assert.equal(fetched.bytes, total)
    assert.equal(joiner.node.stats().bytesReceived, total)
    assert.equal(server.node.stats().bytesSent + server2.node.stats().bytesSent, total)
    // bytes per peer (client ids): what the joiner received from each server is what that server sent it
    const perPeer = joiner.node.stats().peerBytes
    for (const srv of [server, server2]) assert.equal(perPeer[srv.identity.id]?.in ?? 0, srv.node.stats().peerBytes[joiner.identity.id]?.out ?? 0)
    assert.equal((perPeer[server.identity.id]?.in ?? 0) + (perPeer[server2.identity.id]?.in ?? 0), total)
  })

  it('spreads the tensors over the signers, and drops a peer whose bytes do not match the manifest it signed', async () => {
    const [, , , , joiner] = nodes
    const honest = testIdentity()
    const liar = testIdentity()
    const extra: P2PNode[] = []
    try {
      for (const identity of [honest, liar]) {
        const node = await P2PNode.start({identity, runId: 'test-run', listen: ['/ip4/127.0.0.1/tcp/0']})
        extra.push(node)
        await joiner.node.connect(node.addresses())
      }
      extra[0].serveModel(async () => big)
      // the liar signs the true manifest, then serves other bytes
      const tampered: ModelSnapshot = {...big, frames: big.frames.map((f) => ({...f}))}
      let asked = 0
      extra[1].serveModel(async () => {
        if (asked++ === 1) tampered.frames.forEach((f) => (f.data = randomBlob(f.data.length)))
        return tampered
      })
      const got = await joiner.node.fetchModel([honest.id, liar.id], {step: 9})
      got.frames.forEach((f, i) => assert.ok(Buffer.from(f.data).equals(Buffer.from(big.frames[i].data)), `frame ${f.name}`))
      const dropped = joiner.events.filter((e) => e.event === 'model_peer_dropped')
      assert.deepEqual(
        dropped.map((e) => [e.client_id, e.bad]),
        [[liar.id, true]],
      )
      assert.match(String(dropped[0].reason), /do not hash to the manifest's sha256/)
      assert.ok(extra[1].stats().bytesSent > 0, 'the liar was asked for tensors (the download spread over both)')
    } finally {
      await Promise.all(extra.map((n) => n.stop()))
    }
  })

  it('throws naming every peer tried when none serves the model', async () => {
    const [, joiner, noModel] = nodes
    await assert.rejects(joiner.node.fetchModel([noModel.identity.id, 'zz']), (error: Error) => {
      assert.match(error.message, /could not fetch the model: no peer served a manifest; /)
      assert.match(error.message, /not_available/)
      assert.match(error.message, /zz is not a 32-byte hex public key/)
      return true
    })
    await assert.rejects(joiner.node.fetchModel([]), /no peers given/)
  })

  it('refuses a model larger than maxModelBytes before reading its frames', async () => {
    const identity = testIdentity()
    const events: EventLine[] = []
    const small = await P2PNode.start({identity, runId: 'test-run', listen: ['/ip4/127.0.0.1/tcp/0'], maxModelBytes: 1000, log: (e) => events.push(e)})
    try {
      await small.connect(nodes[0].node.addresses())
      await assert.rejects(small.fetchModel([nodes[0].identity.id]), /exceeds the 1000-byte maximum/)
      assert.equal(small.stats().bytesReceived, 0)
    } finally {
      await small.stop()
    }
  })
})

describe('p2p: a serving peer bounds its model uploads (--max-model-uploads, --max-model-uploads-per-peer)', () => {
  let nodes: TestNode[] = []
  after(async () => stopAll(nodes))

  it('three joiners at once from one holder allowed one upload: it never serves two, the others are told busy and ask again, and each gets the model', async () => {
    nodes = await startNodes(4, {modelServeLimits: {maxUploads: 1, maxUploadsPerPeer: 1}})
    const [holder, ...joiners] = nodes
    for (const j of joiners) await j.node.connect(holder.node.addresses())
    const model: ModelSnapshot = {
      step: 3,
      paramHash: 'bounded',
      frames: ['a', 'b', 'c', 'd'].map((name) => ({name, dtype: 'float32', shape: [1024, 1025], data: randomBlob(1024 * 1025 * 4)})),
    }
    holder.node.serveModel(async () => model)
    const got = await Promise.all(joiners.map((j) => j.node.fetchModel([holder.identity.id], {step: 3})))
    for (const g of got) g.frames.forEach((f, i) => assert.ok(Buffer.from(f.data).equals(Buffer.from(model.frames[i].data)), `frame ${f.name}`))
    const served = holder.node.modelServeStats()
    assert.equal(served.peakUploads, 1, 'never two uploads at once')
    assert.equal(served.uploads, 3 * model.frames.length, 'every piece uploaded once per joiner')
    assert.ok(served.busy > 0, 'joiners beyond the bound were told busy')
    const busyAnswers = joiners.map((j) => j.events.find((e) => e.event === 'model_fetched')!.busy as number)
    assert.equal(
      busyAnswers.reduce((a, b) => a + b, 0),
      served.busy,
      `each busy answer reached a joiner, which asked again (${JSON.stringify(busyAnswers)})`,
    )
    for (const j of joiners)
      assert.deepEqual(
        j.events.filter((e) => e.event === 'model_peer_dropped'),
        [],
        'a busy holder is not given up',
      )
  })
  it('--max-model-upload-mbit paces what a holder uploads: 8 MiB at 8 MB/s take a second, whoever asks', async () => {
    const [holder, joiner] = await startNodes(2, {modelServeLimits: {maxUploadBytesPerSecond: 8e6}})
    nodes.push(holder, joiner)
    await joiner.node.connect(holder.node.addresses())
    const model: ModelSnapshot = {step: 5, paramHash: 'paced', frames: ['a', 'b'].map((name) => ({name, dtype: 'float32', shape: [1 << 20], data: randomBlob(4 << 20)}))}
    holder.node.serveModel(async () => model)
    const t = performance.now()
    const got = await joiner.node.fetchModel([holder.identity.id], {step: 5})
    const ms = performance.now() - t
    got.frames.forEach((f, i) => assert.ok(Buffer.from(f.data).equals(Buffer.from(model.frames[i].data))))
    // 8,388,608 bytes at 8e6 B/s is 1,049 ms, less the 256 KiB the pacer lets go ahead (33 ms)
    assert.ok(ms >= 1_000, `the upload was paced: ${ms.toFixed(0)} ms`)
  })
})

describe('p2p: validateModelHeader', () => {
  const ok = {step: 1, paramHash: 'h', frames: [{name: 'w', dtype: 'float16', shape: [2, 3], size: 12}]}
  it('accepts a consistent header and sums the sizes', () => {
    assert.equal(validateModelHeader(ok, 100).totalBytes, 12)
    assert.equal(validateModelHeader({...ok, frames: [{name: 'w', dtype: 'torch.int64', shape: [5], size: 40}]}, 100).totalBytes, 40)
  })
  const bad: [string, Record<string, unknown>, RegExp][] = [
    ['size not matching shape x dtype', {...ok, frames: [{name: 'w', dtype: 'float16', shape: [2, 3], size: 13}]}, /declares 13 bytes, its shape and dtype need 12/],
    ['unknown dtype', {...ok, frames: [{name: 'w', dtype: 'complex64', shape: [1], size: 8}]}, /unsupported dtype complex64/],
    ['negative dimension', {...ok, frames: [{name: 'w', dtype: 'uint8', shape: [-1], size: 1}]}, /invalid shape/],
    ['repeated name', {...ok, frames: [ok.frames[0], ok.frames[0]]}, /repeats/],
    ['no frames', {...ok, frames: []}, /frames is not a list/],
    ['bad step', {...ok, step: -1}, /step/],
    ['over the bound', {...ok, frames: [{name: 'w', dtype: 'float64', shape: [1000], size: 8000}]}, /exceeds the 100-byte maximum/],
  ]
  for (const [what, header, reason] of bad) {
    it(`rejects ${what}`, () => assert.throws(() => validateModelHeader(header, 100), reason))
  }
})
