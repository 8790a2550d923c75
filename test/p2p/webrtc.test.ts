import assert from 'node:assert/strict'
import dgram from 'node:dgram'
import {after, before, describe, it} from 'node:test'
import {defaultLogger} from '@libp2p/logger'
import {multiaddr} from '@multiformats/multiaddr'
import nodeDataChannel from 'node-datachannel'
import {framed} from '../../src/core/p2p/framing.js'
import {RelayNode} from '../../src/core/p2p/relay.js'
import {decodeBindingRequest, decodeBindingSuccess, encodeBindingSuccess, MAX_STUN_REQUEST_BYTES, StunServer} from '../../src/core/p2p/stun.js'
import {parseStunServer, WEBRTC_PROTOCOL} from '../../src/core/p2p/webrtc.js'
import {dataChannelConnection} from '../../src/core/p2p/webrtc-channel.js'
import {checkSdp, decodeSignal, encodeSignal, MAX_SIGNAL_FRAME_BYTES, parseCandidate, usableCandidate, type IceCandidate} from '../../src/core/p2p/webrtc-signal.js'
import {waitFor, seededRng} from '../helpers.js'
import {randomBlob, startNodes, stopAll, testIdentity, type TestNode} from './helpers.js'

/** A STUN Binding request as ICE agents send it, optionally with a FINGERPRINT. */
function bindingRequest(transactionId: Buffer, fingerprint: boolean): Buffer {
  const header = Buffer.alloc(20)
  header.writeUInt16BE(0x0001, 0)
  header.writeUInt16BE(fingerprint ? 8 : 0, 2)
  header.writeUInt32BE(0x2112a442, 4)
  transactionId.copy(header, 8)
  if (!fingerprint) return header
  // A success response carries a FINGERPRINT over the same kind of header: borrow the encoder's arithmetic by
  // checking it through the decoder (a request with a wrong one is refused below).
  const attr = Buffer.alloc(8)
  attr.writeUInt16BE(0x8028, 0)
  attr.writeUInt16BE(4, 2)
  const crc = crc32(header) ^ 0x5354554e
  attr.writeUInt32BE(crc >>> 0, 4)
  return Buffer.concat([header, attr])
}

function crc32(bytes: Uint8Array): number {
  let c = ~0
  for (const b of bytes) {
    c ^= b
    for (let k = 0; k < 8; k++) c = (c >>> 1) ^ (0xedb88320 & -(c & 1))
  }
  return ~c >>> 0
}

describe('STUN (stun.ts): the Binding method, answered with the address a datagram came from', () => {
  const txid = Buffer.from('0123456789ab')

  it('encodes the mapped address a decoder reads back, IPv4 and IPv6, with a FINGERPRINT', () => {
    for (const [address, port] of [
      ['45.77.0.2', 40001],
      ['127.0.0.1', 1],
      ['2001:db8::7', 65535],
      ['::ffff:45.77.0.2', 3478],
    ] as const) {
      const answer = encodeBindingSuccess(txid, address, port)
      const back = decodeBindingSuccess(answer, txid)
      const expect = address === '2001:db8::7' ? '2001:db8:0:0:0:0:0:7' : address === '::ffff:45.77.0.2' ? '0:0:0:0:0:ffff:2d4d:2' : address
      assert.deepEqual(back, {address: expect, port}, address)
      assert.equal(decodeBindingSuccess(answer, Buffer.from('another txid')), undefined, 'another transaction')
    }
  })

  it('answers well-formed Binding requests only, each refusal with a reason', () => {
    for (const fp of [false, true]) assert.deepEqual(decodeBindingRequest(bindingRequest(txid, fp)), {ok: true, transactionId: txid})
    const good = bindingRequest(txid, true)
    const cases: [Buffer, RegExp][] = [
      [good.subarray(0, 19), /shorter than a STUN header/],
      [Buffer.alloc(MAX_STUN_REQUEST_BYTES + 4), /larger than/],
      [Buffer.concat([Buffer.from([0x80]), good.subarray(1)]), /first two bits/],
      [Buffer.concat([good.subarray(0, 4), Buffer.from([0, 0, 0, 0]), good.subarray(8)]), /magic cookie/],
      [Buffer.concat([good, Buffer.alloc(4)]), /length field/],
      [Buffer.concat([Buffer.from([0x01, 0x01]), good.subarray(2)]), /not a Binding request/],
      [Buffer.concat([good.subarray(0, 24), Buffer.from([0, 0, 0, 0])]), /FINGERPRINT does not match/],
      [Buffer.concat([good.subarray(0, 2), Buffer.from([0, 8]), good.subarray(4, 20), Buffer.from([0, 6, 0, 40, 1, 2, 3, 4])]), /runs past the message/],
    ]
    for (const [bytes, reason] of cases) {
      const r = decodeBindingRequest(bytes)
      assert.ok(!r.ok && reason.test(r.reason), `${bytes.toString('hex')}: ${JSON.stringify(r)}`)
    }
  })

  it('fuzz: random and mutated datagrams never throw, and what is answered is a Binding request', () => {
    const seed = Number(process.env.FUZZ_SEED ?? Date.now() % 0xffffffff)
    const next = seededRng(seed)
    const valid = [bindingRequest(txid, false), bindingRequest(txid, true)]
    let answered = 0
    for (let i = 0; i < 20_000; i++) {
      const base = Buffer.from(valid[next() % 2])
      const kind = next() % 4
      let bytes: Buffer
      if (kind === 0) bytes = Buffer.from(Array.from({length: next() % 80}, () => next() & 0xff))
      else if (kind === 1) {
        bytes = base
        for (let k = 1 + (next() % 3); k > 0; k--) bytes[next() % bytes.length] ^= 1 << (next() % 8)
      } else if (kind === 2) bytes = Buffer.concat([base, Buffer.from(Array.from({length: 4 * (next() % 6)}, () => next() & 0xff))])
      else bytes = base.subarray(0, next() % base.length)
      if (kind === 2) bytes.writeUInt16BE(bytes.length - 20, 2)
      let r: ReturnType<typeof decodeBindingRequest>
      try {
        r = decodeBindingRequest(bytes)
      } catch (error) {
        assert.fail(`seed ${seed}: ${bytes.toString('hex')} threw ${String(error)}`)
      }
      if (r.ok) {
        answered++
        assert.equal(bytes.readUInt16BE(0), 0x0001, `seed ${seed}`)
        assert.equal(bytes.readUInt32BE(4), 0x2112a442, `seed ${seed}`)
        assert.equal(bytes.length, 20 + bytes.readUInt16BE(2), `seed ${seed}`)
        assert.ok(bytes.length <= MAX_STUN_REQUEST_BYTES)
      } else assert.ok(r.reason.length > 0)
    }
    assert.ok(answered > 0, 'some cases were well-formed')
  })

  it('a STUN server on UDP tells a client its address and port, ignores anything else, and answers one source at most ratePerSecond times a second', async () => {
    const server = await StunServer.start({port: 0, host: '127.0.0.1', ratePerSecond: 5})
    const client = dgram.createSocket('udp4')
    await new Promise<void>((r) => client.bind(0, '127.0.0.1', () => r()))
    const answers: Buffer[] = []
    client.on('message', (m) => answers.push(m))
    try {
      client.send(bindingRequest(txid, true), server.port, '127.0.0.1')
      await waitFor(() => answers.length === 1, 5_000, 'the STUN answer')
      assert.deepEqual(decodeBindingSuccess(answers[0], txid), {address: '127.0.0.1', port: client.address().port})
      client.send(Buffer.from('GET / HTTP/1.1\r\n\r\n'), server.port, '127.0.0.1')
      for (let i = 0; i < 30; i++) client.send(bindingRequest(txid, false), server.port, '127.0.0.1')
      await waitFor(() => server.answered + server.dropped >= 32, 5_000, 'the server to see every datagram')
      await new Promise((r) => setTimeout(r, 200))
      // The bucket held 4 more answers (5 a second, one spent), plus what refilled meanwhile.
      assert.ok(answers.length >= 5 && answers.length <= 8, `${answers.length} answers`)
      assert.ok(server.dropped >= 24, `${server.dropped} dropped`)
    } finally {
      client.close()
      await server.stop()
    }
  })
})

/**
 * The native objects this file makes itself, referenced until the process ends: a node's stop cleans the native
 * library up, which must not meet a wrapper the garbage collector took (see `retained` in webrtc.ts).
 */
const keep: object[] = []

/** A real offer and answer (and candidates) from the native library, as a peer would send them. */
async function nativeSession(): Promise<{offer: string; answer: string; candidates: string[]}> {
  const a = new nodeDataChannel.PeerConnection('a', {iceServers: [], disableAutoNegotiation: true})
  const b = new nodeDataChannel.PeerConnection('b', {iceServers: [], disableAutoNegotiation: true})
  keep.push(a, b)
  const candidates: string[] = []
  try {
    const offer = await new Promise<string>((resolve) => {
      a.onLocalDescription((sdp) => resolve(sdp))
      a.onLocalCandidate((c) => candidates.push(c))
      keep.push(a.createDataChannel('psyche', {negotiated: true, id: 0}))
      a.setLocalDescription('offer')
    })
    const answer = await new Promise<string>((resolve) => {
      b.onLocalDescription((sdp) => resolve(sdp))
      b.setRemoteDescription(offer, 'offer')
      keep.push(b.createDataChannel('psyche', {negotiated: true, id: 0}))
      b.setLocalDescription('answer')
    })
    await waitFor(() => candidates.length > 0, 5_000, 'a candidate')
    return {offer, answer, candidates}
  } finally {
    a.close()
    b.close()
  }
}

const stripCandidates = (sdp: string) =>
  sdp
    .split('\r\n')
    .filter((l) => l && !l.startsWith('a=candidate') && !l.startsWith('a=end-of-candidates'))
    .join('\r\n') + '\r\n'

describe('WebRTC signalling (webrtc-signal.ts): what a peer sends is checked before the native library sees it', () => {
  let session: {offer: string; answer: string; candidates: string[]}
  before(async () => {
    session = await nativeSession()
  })

  it("takes the native library's own offer, answer and candidates", () => {
    assert.equal(checkSdp(stripCandidates(session.offer), 'offer'), stripCandidates(session.offer))
    assert.equal(checkSdp(stripCandidates(session.answer), 'answer'), stripCandidates(session.answer))
    for (const c of session.candidates) {
      const parsed = parseCandidate(c)
      assert.match(parsed.line, /^candidate:\S+ 1 UDP \d+ \S+ \d+ typ host$/)
      assert.deepEqual(parseCandidate(parsed.line), parsed, 'canonical')
    }
  })

  it('refuses a session description that is not one data channel with credentials and a fingerprint, or that carries candidates', () => {
    const offer = stripCandidates(session.offer)
    const swap = (from: RegExp, to: string) => offer.replace(from, to)
    const cases: [unknown, 'offer' | 'answer', RegExp][] = [
      [undefined, 'offer', /no session description/],
      [offer + 'a=x\r\n'.repeat(1000), 'offer', /characters/],
      [offer + 'a=candidate:1 1 UDP 1 45.77.0.9 9 typ host\r\n', 'offer', /a=candidate/],
      [offer + 'a=end-of-candidates\r\n', 'offer', /a=end-of-candidates/],
      [offer + 'm=application 9 UDP/DTLS/SCTP webrtc-datachannel\r\n', 'offer', /2 media sections/],
      [swap(/m=application[^\r]*/, 'm=audio 9 RTP/AVP 0'), 'offer', /not one data-channel section/],
      [swap(/a=ice-ufrag:[^\r]*/, 'a=ice-ufrag:ab'), 'offer', /ice-ufrag/],
      [swap(/a=ice-pwd:[^\r]*/, 'a=ice-pwd:has spaces in it that are not ice chars'), 'offer', /ice-pwd/],
      [swap(/a=fingerprint:[^\r]*\r\n/, ''), 'offer', /0 a=fingerprint/],
      [swap(/a=fingerprint:[^\r]*/, 'a=fingerprint:sha-1 00:11'), 'offer', /fingerprint is not a SHA-256/],
      [offer, 'answer', /DTLS role is "actpass"/],
      [swap(/v=0/, 'v=1'), 'offer', /v=0/],
      [offer.replace('s=-', 's=\u0000'), 'offer', /printable/],
      [offer + 'a=BAD:1\r\n', 'offer', /attribute named/],
      [swap(/a=max-message-size:[^\r]*/, 'a=max-message-size:lots'), 'offer', /max-message-size/],
    ]
    for (const [value, type, reason] of cases) assert.throws(() => checkSdp(value, type), reason, String(value).slice(0, 80))
  })

  it('takes UDP host, srflx and prflx candidates with a literal address, rewritten canonically, and nothing else', () => {
    assert.deepEqual(parseCandidate('a=candidate:2 1 UDP 1678769919 45.77.0.2 37979 typ srflx raddr 0.0.0.0 rport 0'), {
      line: 'candidate:2 1 UDP 1678769919 45.77.0.2 37979 typ srflx',
      address: '45.77.0.2',
      port: 37979,
      type: 'srflx',
    })
    assert.equal(parseCandidate('candidate:1 1 udp 2122260223 2001:db8::1 5000 typ host').address, '2001:db8::1')
    for (const bad of [
      7,
      'x'.repeat(300),
      'candidate:1 1 TCP 1 45.77.0.2 9 typ host tcptype active',
      'candidate:1 1 UDP 1 45.77.0.2 9 typ relay',
      'candidate:1 1 UDP 1 abcdef.local 9 typ host',
      'candidate:1 2 UDP 1 45.77.0.2 9 typ host',
      'candidate:1 1 UDP 1 45.77.0.2 0 typ host',
      'candidate:1 1 UDP 1 45.77.0.2 70000 typ host',
      'candidate:1 1 UDP 0 45.77.0.2 9 typ host',
      'candidate:1 1 UDP 1 999.1.1.1 9 typ host',
      'candidate:1 1 UDP 1 45.77.0.2 9 typ host\r\na=x',
    ])
      assert.throws(() => parseCandidate(bad), Error, String(bad).slice(0, 60))
  })

  it('uses a candidate only where it can lead: not another LAN, loopback only between loopback peers', () => {
    const c = (address: string): IceCandidate => ({line: '', address, port: 9, type: 'host'})
    const networks = ['10.77.10.2/24', '127.0.0.1/8']
    assert.ok(usableCandidate(c('45.77.0.3'), {networks, loopback: false}))
    assert.ok(usableCandidate(c('10.77.10.9'), {networks, loopback: false}), 'a peer behind the same router')
    assert.ok(!usableCandidate(c('10.77.11.2'), {networks, loopback: false}), "another LAN's private address")
    assert.ok(!usableCandidate(c('192.168.1.5'), {networks, loopback: false}))
    assert.ok(!usableCandidate(c('127.0.0.1'), {networks, loopback: false}))
    assert.ok(usableCandidate(c('127.0.0.3'), {networks, loopback: true}))
    for (const a of ['0.0.0.0', '169.254.1.1', '224.0.0.1', 'fe80::1', 'ff02::1']) assert.ok(!usableCandidate(c(a), {networks, loopback: true}), a)
  })

  it('decodes the messages of /psyche/webrtc/1, bounding the candidate list (--webrtc-max-candidates)', () => {
    const cand = (i: number) => `candidate:${i} 1 UDP 1 45.77.0.${i} 9 typ srflx`
    const frame = (v: unknown) => new TextEncoder().encode(JSON.stringify(v))
    const list = decodeSignal(frame({type: 'candidates', candidates: [cand(1), cand(2), cand(1)]}), ['candidates'], {maxCandidates: 8})
    assert.equal(list.type === 'candidates' && list.candidates.length, 2, 'duplicates collapse')
    assert.throws(
      () => decodeSignal(frame({type: 'candidates', candidates: Array.from({length: 9}, (_, i) => cand(i + 1))}), ['candidates'], {maxCandidates: 8}),
      /9 ICE candidates \(at most 8: --webrtc-max-candidates\)/,
    )
    assert.throws(() => decodeSignal(frame({type: 'ping'}), ['pong', 'decline'], {maxCandidates: 8}), /expected a pong or decline message, got "ping"/)
    assert.throws(() => decodeSignal(new Uint8Array([0xff, 0xfe]), ['ping'], {maxCandidates: 8}), /not UTF-8 JSON/)
    assert.throws(() => decodeSignal(frame([1]), ['ping'], {maxCandidates: 8}), /not a JSON object/)
    assert.throws(() => decodeSignal(new Uint8Array(MAX_SIGNAL_FRAME_BYTES + 1), ['ping'], {maxCandidates: 8}), /at most/)
    assert.deepEqual(decodeSignal(frame({type: 'decline', reason: 'r'.repeat(500)}), ['decline'], {maxCandidates: 8}), {type: 'decline', reason: 'r'.repeat(200)})
    const sent = encodeSignal({type: 'candidates', candidates: [parseCandidate(cand(3))]})
    assert.deepEqual(decodeSignal(sent, ['candidates'], {maxCandidates: 8}), {type: 'candidates', candidates: [parseCandidate(cand(3))]})
  })

  it('fuzz: random and mutated signalling frames never throw anything but an Error, and what is taken is well-formed', () => {
    const seed = Number(process.env.FUZZ_SEED ?? Date.now() % 0xffffffff)
    const next = seededRng(seed)
    const pick = <T>(xs: readonly T[]): T => xs[next() % xs.length]
    const valid = [
      {type: 'offer', sdp: stripCandidates(session.offer)},
      {type: 'answer', sdp: stripCandidates(session.answer)},
      {type: 'candidates', candidates: session.candidates},
      {type: 'ping'},
      {type: 'sync'},
      {type: 'decline', reason: 'no'},
    ].map((v) => JSON.stringify(v))
    const pieces = ['"', '\\', '\r\n', 'a=candidate:1 1 UDP 1 1.2.3.4 5 typ host', 'm=', '\u0000', ':', '{', '}', '[', ']', 'typ relay', '999', '-1', 'é']
    let accepted = 0
    for (let i = 0; i < 5_000; i++) {
      let text = pick(valid)
      for (let k = next() % 4; k >= 0; k--) {
        const at = next() % (text.length + 1)
        text = next() % 2 ? text.slice(0, at) + pick(pieces) + text.slice(at) : text.slice(0, at) + text.slice(at + 1 + (next() % 8))
      }
      const bytes = next() % 10 === 0 ? new Uint8Array(Array.from({length: next() % 64}, () => next() & 0xff)) : new TextEncoder().encode(text)
      try {
        const m = decodeSignal(bytes, ['offer', 'answer', 'candidates', 'ping', 'pong', 'sync', 'decline'], {maxCandidates: 16})
        accepted++
        if (m.type === 'offer' || m.type === 'answer') assert.equal(checkSdp(m.sdp, m.type), m.sdp, `seed ${seed}`)
        if (m.type === 'offer' || m.type === 'answer') assert.ok(!m.sdp.includes('a=candidate'), `seed ${seed}`)
        if (m.type === 'candidates') for (const c of m.candidates) assert.deepEqual(parseCandidate(c.line), c, `seed ${seed}`)
      } catch (error) {
        assert.ok(error instanceof Error, `seed ${seed}: ${String(error)}`)
      }
    }
    assert.ok(accepted > 0, `seed ${seed}: some mutations are still valid`)
  })

  it('a data-channel message larger than the bound ends the connection (--webrtc-max-message-kib)', async () => {
    const a = new nodeDataChannel.PeerConnection('a', {iceServers: [], disableAutoNegotiation: true})
    const b = new nodeDataChannel.PeerConnection('b', {iceServers: [], disableAutoNegotiation: true})
    keep.push(a, b)
    try {
      const da = a.createDataChannel('psyche', {negotiated: true, id: 0})
      keep.push(da)
      let db!: nodeDataChannel.DataChannel
      a.onLocalDescription((sdp) =>
        setImmediate(() => {
          b.setRemoteDescription(sdp, 'offer')
          db = b.createDataChannel('psyche', {negotiated: true, id: 0})
          keep.push(db)
          b.setLocalDescription('answer')
        }),
      )
      b.onLocalDescription((sdp) => setImmediate(() => a.setRemoteDescription(sdp, 'answer')))
      a.onLocalCandidate((c, mid) => setImmediate(() => b.addRemoteCandidate(c, mid)))
      b.onLocalCandidate((c, mid) => setImmediate(() => a.addRemoteCandidate(c, mid)))
      a.setLocalDescription('offer')
      // Each wait is bounded and named, with room for a loaded machine: a wait here once failed in CI, unexplained.
      await waitFor(() => da.isOpen(), 30_000, 'the channel to open')
      await waitFor(() => db?.isOpen(), 30_000, "the other end's channel")
      const conn = dataChannelConnection(db, () => b.close(), multiaddr('/ip4/127.0.0.1/udp/9/webrtc'), 'inbound', defaultLogger().forComponent('test'), 1024)
      const got: number[] = []
      conn.addEventListener('message', (e) => got.push(e.data.byteLength))
      da.sendMessageBinary(Buffer.alloc(1000))
      await waitFor(() => got.length === 1, 30_000, 'a message within the bound')
      da.sendMessageBinary(Buffer.alloc(2000))
      await waitFor(() => conn.status !== 'open', 30_000, 'the connection to end')
      assert.deepEqual(got, [1000])
    } finally {
      a.close()
      b.close()
    }
  })
})

describe('WebRTC between peers that meet through a relay (one machine, loopback)', () => {
  let relay: RelayNode
  let a: TestNode
  let b: TestNode
  before(async () => {
    relay = await RelayNode.start({identity: testIdentity(), listen: ['/ip4/127.0.0.1/tcp/0']})
    // Each listens on an address other than the one it reaches the relay from, so the relay's dial-back cannot check
    // it: both reserve a slot, as two clients behind NATs. TCP punching is off: WebRTC alone is checked here.
    ;[a] = await startNodes(1, {listen: ['/ip4/127.0.0.2/tcp/0'], holePunch: false})
    ;[b] = await startNodes(1, {listen: ['/ip4/127.0.0.3/tcp/0'], holePunch: false})
    for (const n of [a, b]) await n.node.useRelays(relay.addressFor('127.0.0.1'))
    await waitFor(() => a.node.relayedAddresses().length > 0 && b.node.relayedAddresses().length > 0, 10_000, 'relay reservations')
  })
  after(async () => {
    await stopAll([a, b].filter(Boolean))
    await relay?.stop()
  })

  it('the relay serves STUN; the pair upgrades to a direct WebRTC connection, the relayed one is closed, and results and gossip go direct', async () => {
    assert.ok(relay.stunPort > 0, 'the relay runs a STUN server')
    await a.node.connect(b.node.addresses().filter((x) => x.includes('/p2p-circuit/')))
    const connected = (n: TestNode) => n.events.find((e) => e.event === 'webrtc_connected')
    await waitFor(
      () => connected(a) !== undefined && connected(b) !== undefined,
      15_000,
      `webrtc_connected on both sides: ${JSON.stringify([...a.events, ...b.events].filter((e) => e.event.startsWith('webrtc')))}`,
    )
    const [ca, cb] = [connected(a)!, connected(b)!]
    assert.ok(ca.event === 'webrtc_connected' && cb.event === 'webrtc_connected')
    assert.deepEqual([ca.role, cb.role].sort(), ['initiator', 'responder'])
    for (const e of [ca, cb]) assert.ok(e.addr.includes('/udp/') && e.addr.includes('/webrtc/') && e.ms < 10_000, JSON.stringify(e))
    await waitFor(
      () => !a.node.libp2p.getConnections(b.node.libp2p.peerId).some((c) => c.remoteAddr.toString().includes('/p2p-circuit')),
      10_000,
      'the relayed connection to close',
    )
    assert.ok(a.events.some((e) => e.event === 'relayed_closed') || b.events.some((e) => e.event === 'relayed_closed'))
    assert.equal(a.node.onlyRelayed(b.node.libp2p.peerId), false)
    assert.deepEqual(a.node.connectionKinds(), {direct: 2, relayed: 0}, 'the relay and the peer, both direct')
    // Gossip (the announcement) and the result itself come over the direct connection.
    await waitFor(() => a.node.topicPeers() >= 1 && b.node.topicPeers() >= 1, 10_000, 'topic subscriptions on the direct connection')
    const relayedBefore = a.node.stats().relayedReceived
    const blob = randomBlob(300_000)
    const got = new Promise<Uint8Array>((resolve, reject) => a.node.onAnnouncement((x) => void a.node.fetchResult(x).then(resolve, reject)))
    await b.node.publishResult(1, 0, 1, blob)
    assert.deepEqual(await got, blob)
    assert.equal(a.node.stats().relayedReceived, relayedBefore, 'nothing through the relay')
  })

  it("refuses signalling over a direct connection, a peer's candidate list over --webrtc-max-candidates, and a fifth attempt in a minute", async () => {
    // The stranger's peer id is the smaller one, so that the victim never starts an attempt of its own (upgrade.ts).
    const [stranger] = await startNodes(1, {listen: ['/ip4/127.0.0.5/tcp/0'], holePunch: false, webrtc: false})
    let victim: TestNode
    for (;;) {
      ;[victim] = await startNodes(1, {listen: ['/ip4/127.0.0.4/tcp/0'], holePunch: false, webrtcLimits: {maxCandidates: 8}})
      if (victim.node.peerId > stranger.node.peerId) break
      await victim.node.stop()
    }
    try {
      for (const n of [victim, stranger]) await n.node.useRelays(relay.addressFor('127.0.0.1'))
      await waitFor(() => victim.node.relayedAddresses().length > 0, 10_000, 'the reservation')
      // Directly: the stream is refused.
      const direct = await stranger.node.libp2p.dial(multiaddr(victim.node.allAddresses().find((x) => x.includes('127.0.0.4/tcp/'))!))
      const refused = await direct.newStream(WEBRTC_PROTOCOL)
      await assert.rejects(framed(refused, 1024).read({signal: AbortSignal.timeout(5_000)}))
      await direct.close()
      await waitFor(() => victim.node.libp2p.getConnections(stranger.node.libp2p.peerId).length === 0, 10_000, 'the direct connection to close on both sides')
      // Through the relay: a real offer, then nine candidates.
      const relayed = await stranger.node.libp2p.dial(multiaddr(victim.node.relayedAddresses()[0]))
      const stream = await relayed.newStream(WEBRTC_PROTOCOL, {runOnLimitedConnection: true})
      const lp = framed(stream, MAX_SIGNAL_FRAME_BYTES)
      const {offer} = await nativeSession()
      await lp.write(encodeSignal({type: 'offer', sdp: stripCandidates(offer)}))
      const answer = decodeSignal((await lp.read()).subarray(), ['answer'], {maxCandidates: 8})
      assert.equal(answer.type, 'answer')
      await lp.write(
        new TextEncoder().encode(JSON.stringify({type: 'candidates', candidates: Array.from({length: 9}, (_, i) => `candidate:${i} 1 UDP 1 45.77.0.${i + 1} 9 typ srflx`)})),
      )
      const refusal = () => victim.events.find((e) => e.event === 'webrtc_failed' && e.role === 'responder')
      await waitFor(() => refusal() !== undefined, 10_000, 'the refusal')
      const failed = refusal()!
      assert.ok(failed.event === 'webrtc_failed' && /9 ICE candidates \(at most 8: --webrtc-max-candidates\)/.test(failed.reason), JSON.stringify(failed))
      assert.ok(!victim.events.some((e) => e.event === 'webrtc_connected'))
      // At most 4 attempts a minute from one peer: three more (each refused for its offer), then one that is not read.
      const refusals = () => victim.events.filter((e) => e.event === 'webrtc_failed' && e.role === 'responder').length
      for (let i = 2; i <= 5; i++) {
        const again = await relayed.newStream(WEBRTC_PROTOCOL, {runOnLimitedConnection: true})
        const lpAgain = framed(again, MAX_SIGNAL_FRAME_BYTES)
        await lpAgain.write(new TextEncoder().encode(JSON.stringify({type: 'offer', sdp: 'v=0\r\n'}))).catch(() => {})
        await assert.rejects(lpAgain.read({signal: AbortSignal.timeout(5_000)}))
        if (i <= 4) await waitFor(() => refusals() === i, 5_000, `attempt ${i} to be refused for its offer`)
      }
      await new Promise((r) => setTimeout(r, 300))
      assert.equal(refusals(), 4, 'the fifth attempt was not even read')
    } finally {
      await stopAll([victim, stranger])
    }
  })

  it('a node at --webrtc-max-connections refuses a further WebRTC connection; its peer keeps the relay', async () => {
    const [full] = await startNodes(1, {listen: ['/ip4/127.0.0.6/tcp/0'], holePunch: false, webrtcLimits: {maxConnections: 1}})
    const [first, second] = await startNodes(2, {listen: ['/ip4/127.0.0.7/tcp/0'], holePunch: false})
    try {
      for (const n of [full, first, second]) await n.node.useRelays(relay.addressFor('127.0.0.1'))
      await waitFor(() => full.node.relayedAddresses().length > 0, 10_000, 'the reservation')
      const relayedOf = full.node.addresses().filter((x) => x.includes('/p2p-circuit/'))
      await first.node.connect(relayedOf)
      await waitFor(() => full.events.some((e) => e.event === 'webrtc_connected'), 15_000, 'the first WebRTC connection')
      await second.node.connect(relayedOf)
      const outcome = () => [...full.events, ...second.events].filter((e) => e.event === 'webrtc_failed' || (e.event === 'webrtc_connected' && e.peer_id !== first.node.peerId))
      await waitFor(() => outcome().length > 0, 15_000, 'the second attempt to end')
      assert.equal(full.events.filter((e) => e.event === 'webrtc_connected').length, 1, JSON.stringify(outcome()))
      assert.equal(second.node.onlyRelayed(full.node.libp2p.peerId), true, 'the second peer stays on the relay')
    } finally {
      await stopAll([full, first, second])
    }
  })
})

describe('--stun values', () => {
  it('takes host:port (an IPv6 one in brackets, a stun: prefix) and refuses anything else', () => {
    assert.deepEqual(parseStunServer('45.77.0.1:3478'), {hostname: '45.77.0.1', port: 3478})
    assert.deepEqual(parseStunServer('stun:stun.example.org:19302'), {hostname: 'stun.example.org', port: 19302})
    assert.deepEqual(parseStunServer('[2001:db8::1]:3478'), {hostname: '2001:db8::1', port: 3478})
    for (const bad of ['45.77.0.1', '45.77.0.1:0', '45.77.0.1:70000', 'stun:', 'a b:1', 'turn:x:1', '']) assert.throws(() => parseStunServer(bad), /want host:port/, bad)
  })
})
