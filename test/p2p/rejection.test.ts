import assert from 'node:assert/strict'
import {after, before, describe, it} from 'node:test'
import {lpStream} from '@libp2p/utils'
import {peerIdOfClient, resultCommitment, signAnnouncement, type ResultAnnouncement} from '../../src/core/p2p/index.js'
import {blockHashes} from '../../src/core/primitives/pieces.js'
import {encodeHave, HAVE_PROTOCOL} from '../../src/core/p2p/have.js'
import {ANNOUNCE_PROTOCOL, RESULT_PROTOCOL} from '../../src/core/p2p/result-exchange.js'
import {encodePieceRequest} from '../../src/core/p2p/piece-fetch.js'
import {waitFor} from '../helpers.js'
import {meshUp, randomBlob, startNodes, stopAll, testIdentity, type TestNode} from './helpers.js'

describe('p2p: forged announcements and dishonest blobs are rejected with a logged reason', () => {
  let nodes: TestNode[] = []
  before(async () => {
    // Short retry pauses (the default is 0.5 + 2 + 5 s): a fetch that fails with every holder still makes all its passes.
    nodes = await startNodes(3, {fetchBackoffMs: [20, 50, 100]})
    await meshUp(nodes)
  })
  after(async () => stopAll(nodes))

  it('drops announcements with a bad signature, another run id, a client_id that is not the signer, or no JSON', async () => {
    const [forger, a, b] = nodes
    const delivered: ResultAnnouncement[][] = [[], []]
    a.node.onAnnouncement((x) => delivered[0].push(x))
    b.node.onAnnouncement((x) => delivered[1].push(x))
    const fields = {run_id: 'test-run', step: 3, client_id: forger.identity.id, batch_start: 0, batch_end: 2, commitment: resultCommitment(Buffer.from('x')), size: 1}
    const good = signAnnouncement(forger.identity, fields)
    const flipped = good.signature.slice(0, -1) + (good.signature.endsWith('0') ? '1' : '0')
    const someoneElse = testIdentity()
    const forgeries: [string, unknown][] = [
      ['signature does not verify', {...good, signature: flipped}],
      ['signature does not verify', {...good, step: 4}],
      ['is not this run', signAnnouncement(forger.identity, {...fields, run_id: 'other-run'})],
      // Signed by the forger but claiming to be someone else's result.
      ['signature does not verify', {...signAnnouncement(forger.identity, {...fields, client_id: someoneElse.id}), client_id: someoneElse.id}],
      ['batch_end is not greater', signAnnouncement(forger.identity, {...fields, batch_end: 0})],
      ['is not JSON', 'not json {'],
    ]
    const pubsub = forger.node.libp2p.services.pubsub
    for (const [, forged] of forgeries) {
      await pubsub.publish(forger.node.topic, Buffer.from(typeof forged === 'string' ? forged : JSON.stringify(forged)))
    }
    // A valid announcement sent afterwards proves the channel works and gives the forgeries time to arrive.
    const honest = await forger.node.publishResult(3, 0, 2, randomBlob(10))
    await waitFor(() => delivered.every((d) => d.length === 1), 10_000, 'the honest announcement')
    await waitFor(() => [a, b].every((n) => n.events.filter((e) => e.event === 'announcement_rejected').length === forgeries.length), 10_000, 'all rejections logged')
    for (const d of delivered) assert.deepEqual(d, [honest])
    for (const n of [a, b]) {
      const rejected = n.events.filter((e) => e.event === 'announcement_rejected')
      assert.deepEqual(
        rejected.map((e) => forgeries.findIndex(([reason]) => String(e.reason).includes(reason)) >= 0),
        forgeries.map(() => true),
        JSON.stringify(rejected),
      )
      for (const e of rejected) assert.equal(e.from, forger.node.peerId, 'the sender is named')
    }
  })

  it('drops the same forgeries, and garbage or oversized frames, sent directly over /psyche/announce/1', async () => {
    const [forger, a] = nodes
    const delivered: ResultAnnouncement[] = []
    a.node.onAnnouncement((x) => delivered.push(x))
    const fields = {run_id: 'test-run', step: 9, client_id: forger.identity.id, batch_start: 0, batch_end: 2, commitment: resultCommitment(Buffer.from('y')), size: 1}
    const good = signAnnouncement(forger.identity, fields)
    const flipped = good.signature.slice(0, -1) + (good.signature.endsWith('0') ? '1' : '0')
    const frames: Uint8Array[] = [
      Buffer.from(JSON.stringify({...good, signature: flipped})),
      Buffer.from(JSON.stringify(signAnnouncement(forger.identity, {...fields, run_id: 'other-run'}))),
      Buffer.from('not json {'),
      new Uint8Array(randomBlob(300)),
    ]
    const before = a.events.filter((e) => e.event === 'announcement_rejected').length
    const send = async (frame: Uint8Array) => {
      const stream = await forger.node.libp2p.dialProtocol(peerIdOfClient(a.identity.id), ANNOUNCE_PROTOCOL)
      await lpStream(stream).write(frame)
      await stream.close().catch(() => {})
    }
    for (const frame of frames) await send(frame)
    // A frame past the 4 KiB bound is cut off before it is read.
    await send(new Uint8Array(randomBlob(64 * 1024))).catch(() => {})
    await send(Buffer.from(JSON.stringify(good)))
    await waitFor(() => delivered.length === 1, 10_000, 'the honest announcement')
    assert.deepEqual(delivered, [good])
    await waitFor(() => a.events.filter((e) => e.event === 'announcement_rejected').length - before === frames.length, 10_000, 'every forgery rejected')
    await waitFor(() => a.events.some((e) => e.event === 'serve_failed' && e.protocol === ANNOUNCE_PROTOCOL), 10_000, 'the oversized frame refused')
    // Sent again, it is not delivered twice.
    await send(Buffer.from(JSON.stringify(good)))
    await new Promise((r) => setTimeout(r, 300))
    assert.equal(delivered.length, 1)
  })

  it('discards a blob whose bytes do not match the commitment, reports the sender, and throws when no holder has the right bytes', async () => {
    const [liar, fetcher, honest] = nodes
    const real = randomBlob(300_000)
    const fake = randomBlob(real.length)
    const commitment = resultCommitment(real)
    liar.store.put(commitment, 5, fake)
    const a = signAnnouncement(liar.identity, {run_id: 'test-run', step: 5, client_id: liar.identity.id, batch_start: 0, batch_end: 1, commitment, size: real.length})

    // Fetched in pieces (300 kB is past --swarm-min-bytes): the liar's hash list is refused before any piece.
    await assert.rejects(fetcher.node.fetchResult(a), /could not fetch result.*hash list does not match the commitment/)
    const bad = fetcher.events.filter((e) => e.event === 'bad_blob')
    assert.equal(bad.length, 1)
    assert.equal(bad[0].from, liar.node.peerId)
    assert.match(String(bad[0].reason), /hash list does not match the commitment/)
    assert.equal(fetcher.node.stats().badBlobs, 1)
    assert.equal(fetcher.node.hasResult(commitment), false, 'the wrong bytes are not kept')
    // The honest peer was asked on every pass (one more than the three pauses); the liar only once.
    assert.equal(fetcher.events.filter((e) => e.event === 'fetch_failed' && e.from === honest.node.peerId && /does not hold it/.test(String(e.reason))).length, 4)

    // Once an honest peer holds the real bytes, the fetch falls through the liar to it.
    honest.store.put(commitment, 5, real)
    const bytes = await fetcher.node.fetchResult(a)
    assert.deepEqual(Buffer.from(bytes), Buffer.from(real))
    assert.equal(fetcher.node.stats().badBlobs, 2)
    assert.equal(fetcher.events.filter((e) => e.event === 'bad_blob').at(-1)?.from, liar.node.peerId)
  })

  it('a piece that does not match the hash list is blamed on its sender and fetched from another holder, keeping the pieces already held', async () => {
    const [liar, fetcher, honest] = nodes
    const real = randomBlob(2_500_000)
    const corrupt = Buffer.from(real)
    corrupt[(1 << 20) + 1234] ^= 0xff
    const commitment = resultCommitment(real)
    // The liar serves the right hash list and a wrong second piece.
    liar.store.put(commitment, 7, corrupt, blockHashes(real))
    honest.store.put(commitment, 7, real)
    const a = signAnnouncement(liar.identity, {run_id: 'test-run', step: 7, client_id: liar.identity.id, batch_start: 0, batch_end: 1, commitment, size: real.length})
    const before = {badPieces: fetcher.node.stats().badPieces, honestSent: honest.node.stats().bytesSent}
    const bytes = await fetcher.node.fetchResult(a)
    assert.deepEqual(Buffer.from(bytes), Buffer.from(real))
    assert.equal(fetcher.node.stats().badPieces, before.badPieces + 1)
    const blamed = fetcher.events.flatMap((e) => (e.event === 'bad_piece' && e.commitment === commitment ? [e] : []))
    assert.deepEqual(
      blamed.map((e) => e.from),
      [liar.node.peerId],
    )
    assert.match(String(blamed[0].reason), /block 16 does not match/)
    // The first piece (1 MiB) came from the liar and checked; the honest holder sent only the rest.
    const fetched = fetcher.events.flatMap((e) => (e.event === 'result_fetched' && e.step === 7 ? [e] : [])).at(-1)
    assert.deepEqual(
      [...(fetched?.pieces ?? [])].sort((x, y) => x.peer_id.localeCompare(y.peer_id)),
      [
        {peer_id: liar.node.peerId, pieces: 1},
        {peer_id: honest.node.peerId, pieces: 2},
      ].sort((x, y) => x.peer_id.localeCompare(y.peer_id)),
    )
    assert.equal(honest.node.stats().bytesSent - before.honestSent, real.length - (1 << 20))
  })

  it('a holder ends a piece session that asks a block twice or a run of blocks past the result', async () => {
    const [holderNode, asker] = nodes
    const blob = randomBlob(300_000)
    const commitment = resultCommitment(blob)
    holderNode.store.put(commitment, 8, blob)
    const session = async (requests: Uint8Array[]) => {
      const stream = await asker.node.libp2p.dialProtocol(peerIdOfClient(holderNode.identity.id), RESULT_PROTOCOL)
      const lp = lpStream(stream)
      await lp.write(Buffer.from(JSON.stringify({run_id: 'test-run', commitment, pieces: true, list: true})))
      const header = JSON.parse(Buffer.from((await lp.read()).subarray()).toString('utf8'))
      assert.deepEqual(header, {status: 'ok', size: blob.length})
      assert.deepEqual(Buffer.from((await lp.read()).subarray()), Buffer.from(blockHashes(blob)))
      for (const r of requests) await lp.write(r)
      const got: number[] = []
      try {
        for (;;) got.push((await lp.read()).byteLength)
      } catch {
        // the holder ended the session
      }
      stream.abort(new Error('done'))
      return got
    }
    const failures = () => holderNode.events.flatMap((e) => (e.event === 'serve_failed' ? [String(e.reason)] : []))
    // Block 0 is served once; asked again, the session ends.
    assert.deepEqual(await session([encodePieceRequest(0, 1), encodePieceRequest(0, 1)]), [65_536])
    await waitFor(() => failures().some((r) => /block 0 asked twice/.test(r)), 5_000, 'the repeated block refused')
    assert.deepEqual(await session([encodePieceRequest(4, 2)]), [])
    await waitFor(() => failures().some((r) => /blocks 4\.\.5 of a result of 5 blocks/.test(r)), 5_000, 'the run past the end refused')
  })

  it('reports a sender whose declared size differs from the announcement', async () => {
    const [liar, fetcher] = nodes
    const real = randomBlob(1000)
    const commitment = resultCommitment(real)
    liar.store.put(commitment, 6, randomBlob(5000))
    const a = signAnnouncement(liar.identity, {run_id: 'test-run', step: 6, client_id: liar.identity.id, batch_start: 0, batch_end: 1, commitment, size: real.length})
    const before = fetcher.node.stats().badBlobs
    await assert.rejects(fetcher.node.fetchResult(a), /declared 5000 bytes, announcement says 1000/)
    assert.equal(fetcher.node.stats().badBlobs, before + 1)
    const reported = fetcher.events.filter((e) => e.event === 'bad_blob').filter((e) => /declared 5000 bytes/.test(e.reason))
    assert.deepEqual(
      reported.map((e) => e.from),
      [liar.node.peerId],
    )
    assert.equal(fetcher.node.hasResult(commitment), false)
  })
})

describe('p2p: a peer telling us of results it holds fills its own share of what we remember (join --max-haves-per-peer)', () => {
  let nodes: TestNode[] = []
  before(async () => {
    nodes = await startNodes(3, {serving: {maxHavesPerPeer: 8}})
    await meshUp(nodes)
  })
  after(async () => stopAll(nodes))

  it('a stranger claiming 20 made-up results of a far-future round gets 8 remembered; an honest peer after it still gets its 3', async () => {
    const [a, stranger, honest] = nodes
    const tell = async (from: TestNode, step: number, count: number) => {
      const stream = await from.node.libp2p.dialProtocol(peerIdOfClient(a.identity.id), HAVE_PROTOCOL)
      const commitments = Array.from({length: count}, () => resultCommitment(randomBlob(32)))
      await lpStream(stream).write(encodeHave(step, commitments))
      await stream.close().catch(() => {})
    }
    await tell(stranger, 4_000_000_000, 20)
    await waitFor(() => a.node.stats().havesIgnored === 12, 10_000, "the stranger's holdings past its share ignored")
    await tell(honest, 5, 3)
    // the honest peer's 3 are kept: nothing more is ignored, while a 9th from the stranger is
    await tell(stranger, 4_000_000_000, 1)
    await waitFor(() => a.node.stats().havesIgnored === 13, 10_000, "the stranger's 21st")
    await new Promise((r) => setTimeout(r, 200))
    assert.equal(a.node.stats().havesIgnored, 13)
  })
})
