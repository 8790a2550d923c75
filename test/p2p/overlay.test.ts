import assert from 'node:assert/strict'
import {randomBytes} from 'node:crypto'
import {describe, it} from 'node:test'
import {multiaddr} from '@multiformats/multiaddr'
import {encodeHave, HAVE_PREFIX_BYTES, MAX_HAVE_MESSAGE_BYTES, parseHave} from '../../src/core/p2p/have.js'
import {overlay} from '../../src/core/p2p/overlay.js'
import type {ResultAnnouncement} from '../../src/core/p2p/index.js'
import {waitFor} from '../helpers.js'
import {meshUp, randomBlob, startNodes, stopAll} from './helpers.js'

const ids = (n: number) => Array.from({length: n}, () => randomBytes(8).toString('hex'))

describe('the overlay: a bounded set of connections per client', () => {
  it('is a full mesh up to the bound, then about 2·log2 N neighbours, symmetric, connected, any two within log2 N hops', () => {
    const small = ids(9)
    assert.deepEqual(overlay(small[0], small, 8), {dial: small.slice(1), neighbours: new Set(small.slice(1)), fullMesh: true})
    for (const n of [18, 20, 64, 256, 1000]) {
      const members = ids(n)
      const plans = new Map(members.map((m) => [m, overlay(m, members, 16)]))
      const logN = Math.ceil(Math.log2(n))
      for (const [m, p] of plans) {
        assert.equal(p.fullMesh, false)
        assert.ok(p.neighbours.size <= 2 * logN, `N=${n}: ${p.neighbours.size} neighbours`)
        assert.ok(!p.neighbours.has(m))
        // Whoever we dial counts us among its neighbours, and so does everyone who dials us.
        for (const d of p.dial) assert.ok(plans.get(d)!.neighbours.has(m))
        for (const nb of p.neighbours) assert.ok(p.dial.includes(nb) || plans.get(nb)!.dial.includes(m))
      }
      // Breadth-first from one member over the connections: everyone, within ⌈log2 N⌉ hops.
      const hops = new Map([[members[0], 0]])
      const queue = [members[0]]
      while (queue.length) {
        const at = queue.shift()!
        for (const nb of plans.get(at)!.neighbours)
          if (!hops.has(nb)) {
            hops.set(nb, hops.get(at)! + 1)
            queue.push(nb)
          }
      }
      assert.equal(hops.size, n)
      assert.ok(Math.max(...hops.values()) <= logN)
    }
  })

  it('have messages: round trip, and random or mutated bytes are parsed or refused with a reason, never thrown', () => {
    const commitments = Array.from({length: 5}, () => randomBytes(32).toString('hex'))
    const parsed = parseHave(encodeHave(7, commitments))
    assert.ok(parsed.ok)
    assert.deepEqual(parsed.have, {step: 7, prefixes: commitments.map((c) => c.slice(0, 2 * HAVE_PREFIX_BYTES))})
    assert.throws(() => encodeHave(-1, []))
    const seed = Number(process.env.FUZZ_SEED ?? Date.now() % 0xffffffff)
    let x = seed || 1
    const rand = () => ((x ^= x << 13), (x ^= x >>> 17), (x ^= x << 5), (x >>> 0) / 2 ** 32)
    const good = encodeHave(3, commitments)
    for (let i = 0; i < 5_000; i++) {
      const bytes = rand() < 0.5 ? randomBytes(Math.floor(rand() * 64)) : Buffer.from(good)
      if (bytes === undefined) continue
      for (let k = 0; k < 3 && bytes.length; k++) bytes[Math.floor(rand() * bytes.length)] = Math.floor(rand() * 256)
      const cut = rand() < 0.3 ? bytes.subarray(0, Math.floor(rand() * bytes.length)) : bytes
      const r = parseHave(cut)
      if (r.ok) assert.equal(r.have.prefixes.length, (cut.length - 4) / HAVE_PREFIX_BYTES, `seed ${seed}`)
      else assert.match(r.reason, /have message/, `seed ${seed}`)
    }
    const huge = parseHave(new Uint8Array(MAX_HAVE_MESSAGE_BYTES + HAVE_PREFIX_BYTES))
    assert.ok(!huge.ok && /more than/.test(huge.reason))
  })

  it('8 clients in a full mesh, 400 kB results: each producer serves at most 4 peers, and the others wait for their have messages rather than be answered busy', async () => {
    const n = 8
    const nodes = await startNodes(n, {relay: false, connectionManager: {inboundConnectionThreshold: 10_000, maxIncomingPendingConnections: 64}})
    try {
      await meshUp(nodes)
      const received = nodes.map(() => [] as ResultAnnouncement[])
      nodes.forEach((t, i) => t.node.onAnnouncement((a) => received[i].push(a)))
      const blobs = nodes.map(() => randomBlob(400 * 1024))
      await Promise.all(nodes.map((t, i) => t.node.publishResult(1, i, i + 1, blobs[i])))
      await waitFor(() => received.every((r) => r.length === n - 1), 20_000, 'every announcement delivered to every client')
      await Promise.all(nodes.map((t, i) => Promise.all(received[i].map((a) => t.node.fetchResult(a)))))
      for (const [i, t] of nodes.entries()) for (const a of received[i]) assert.deepEqual(Buffer.from(t.node.getResult(a.commitment)!), Buffer.from(blobs[a.batch_start]))
      assert.ok(
        nodes.every((t) => t.node.stats().maxUploadsOfOwnResult <= 4),
        nodes.map((t) => t.node.stats().maxUploadsOfOwnResult).join(','),
      )
      // 3 of each result's 7 fetchers are not in line for its producer: asking it, each would be answered busy at
      // least once (8 × 3), and again every 250 ms until a holder told it; they wait for the have messages instead.
      const busy = nodes.reduce((acc, t) => acc + t.node.stats().servesRefused, 0)
      assert.ok(busy < n * 3, `${busy} busy answers`)
    } finally {
      await stopAll(nodes)
    }
  })

  it('16 clients under a bound of 12 connections: every announcement reaches everyone, results swarm (each producer serves at most 4 peers), transfer connections close when idle', async () => {
    const n = 16
    // All on 127.0.0.1: libp2p's inbound limit per host (5 a second) is lifted, as in the scale bench.
    const nodes = await startNodes(n, {
      relay: false,
      maxPeerConnections: 12,
      idleCloseMs: 1_500,
      fetchBackoffMs: [200, 500],
      // 16 kB results, swarmed as larger ones are by default.
      serving: {swarmMinBytes: 0},
      connectionManager: {inboundConnectionThreshold: 10_000, maxIncomingPendingConnections: 64},
    })
    let most = 0
    const sample = setInterval(() => {
      for (const t of nodes) most = Math.max(most, t.node.libp2p.getConnections().length)
    }, 50)
    try {
      const all = nodes.flatMap((t) => t.node.addresses())
      // One after another, as meshUp does (told at once, the 20 in one process on a loaded machine dial past their timeouts).
      for (const t of nodes) await t.node.connect(all)
      const missing = () => nodes.map((t) => t.node.notConnected(nodes.map((m) => m.identity.id)).length)
      await waitFor(() => missing().every((m) => m === 0), 20_000, 'every client connected to the peers it dials').catch((e) => {
        throw new Error(
          `${String(e)}: missing ${missing().join(',')}; connections ${nodes.map((t) => t.node.libp2p.getConnections().length).join(',')}; ${JSON.stringify(nodes.flatMap((t) => t.events.filter((x) => x.event === 'dial_failed')).slice(0, 2))}`,
        )
      })
      for (const t of nodes) assert.ok(t.node.libp2p.getConnections().length <= 8, `${t.node.libp2p.getConnections().length} connections`)
      const received = nodes.map(() => [] as ResultAnnouncement[])
      nodes.forEach((t, i) => t.node.onAnnouncement((a) => received[i].push(a)))
      const blobs = nodes.map(() => randomBlob(16 * 1024))
      await Promise.all(nodes.map((t, i) => t.node.publishResult(1, i, i + 1, blobs[i])))
      await waitFor(() => received.every((r) => r.length === n - 1), 20_000, 'every announcement delivered to every client')
      await Promise.all(nodes.map((t, i) => Promise.all(received[i].map((a) => t.node.fetchResult(a)))))
      for (const [i, t] of nodes.entries())
        for (const [j, blob] of blobs.entries())
          if (j !== i) assert.deepEqual(Buffer.from(nodes[i].node.getResult(received[i].find((a) => a.batch_start === j)!.commitment)!), Buffer.from(blob))
      for (const t of nodes) {
        assert.ok(t.node.stats().maxUploadsOfOwnResult <= 4, `served its result to ${t.node.stats().maxUploadsOfOwnResult} peers`)
        assert.equal(t.node.stats().badBlobs, 0)
      }
      // The producers' uplinks carried 16 × 4 copies at most; the other 15 × 16 − 64 came from other holders.
      assert.ok(nodes.some((t) => t.node.stats().servesRefused > 0))
      assert.ok(most <= 12, `a client held ${most} connections`)
      // Fetchers wait for their neighbours' have messages rather than dial producers, so a transfer connection is
      // rare here: open one to a member outside client 0's overlay, and it is closed once idle.
      const far = nodes.find((t) => t !== nodes[0] && nodes[0].node.libp2p.getConnections(t.node.libp2p.peerId).length === 0)!
      await nodes[0].node.libp2p.dial(multiaddr(far.node.addresses()[0]))
      await waitFor(() => nodes[0].node.libp2p.getConnections(far.node.libp2p.peerId).length === 0, 10_000, 'the transfer connection closed once idle')
      assert.ok(nodes.every((t) => t.node.libp2p.getConnections().length <= 8))
      assert.ok(nodes[0].node.stats().idleClosed + far.node.stats().idleClosed > 0)
    } finally {
      clearInterval(sample)
      await stopAll(nodes)
    }
  })
})
