import assert from 'node:assert/strict'
import {before, describe, it} from 'node:test'
import {ensureDemoCorpus} from '../../src/core/corpus.js'
import {tempDir} from '../helpers.js'
import {assertExchanged, assertWebRtcMesh, eventsOf, firstDirectMs, linkTotals, NetRun, peerIdsOf, perRound, RESULTS_SHAPE as SHAPE, rounds, waitForStep} from './harness.js'
import {Lab, labUnavailable} from './lab.js'

const unavailable = labUnavailable({nat: true})
if (unavailable) console.log(`# test/net skipped: ${unavailable}`)

describe('direct connections between NATed clients: WebRTC (UDP, ICE) first, then TCP hole punching, then the relay', {skip: unavailable, timeout: 600_000}, () => {
  before(async () => {
    await ensureDemoCorpus()
  })

  it("(h) 3 clients behind NAT routers that answer unsolicited packets (RST, ICMP: a Linux box with no firewall), 20 ms apart: every pair connects over UDP within 5 s, no result byte is relayed, and the coordinator's link carries under 20 % of what the clients receive", async () => {
    // On a LAN-speed segment (microseconds) no punching can cross two such NATs: the first packet of either side
    // arrives before the other side's own left, and is remembered (webrtc.ts). Internet paths take milliseconds.
    const lab = new Lab({delayMs: 20})
    const dir = tempDir('psyche-net-h-')
    const coordinator = lab.addPublicHost('coord')
    const run = new NetRun(lab, dir.path, coordinator, SHAPE)
    try {
      await run.startServer()
      const hosts = ['a', 'b', 'c'].map((n) => lab.addNatHost(n, {unsolicited: 'answer'}))
      for (const h of hosts) lab.countSenders(h, coordinator.ip)
      const clients = await Promise.all(hosts.map((h) => run.startClient(h.name, h)))
      await waitForStep(run, clients, 1, 240_000)
      const first = linkTotals(lab, coordinator, hosts)
      await waitForStep(run, clients, 4, 240_000)
      const last = linkTotals(lab, coordinator, hosts)
      perRound('h', first, last, clients, [1, 4])
      assertExchanged(clients, [1, 2, 3, 4], 2)
      for (const c of clients) assert.equal(c.events.find((e) => e.event === 'reachability')?.reachable, false, `${c.name} is behind NAT`)
      assertWebRtcMesh(clients, hosts, 5_000)
      for (const [i, c] of clients.entries()) {
        // Not one result byte through the relay, in any round.
        for (const r of rounds(c)) assert.equal(r.relayed_in, 0, `${c.name} step ${r.step}: relayed ${r.relayed_in} bytes in`)
        // The kernel's counters: the results came from the peers' addresses, over UDP.
        const wire = lab.receivedBytes(hosts[i])
        const received = rounds(c).at(-1)!.bytes_in
        console.log(
          `# (h) ${c.name}: ${received} result bytes in; received from peers UDP ${wire.peers.udp} B, TCP ${wire.peers.tcp} B; from the coordinator's host ${wire.coordinator.udp + wire.coordinator.tcp} B`,
        )
        assert.ok(wire.peers.udp >= received && wire.peers.tcp === 0, `${c.name}: ${wire.peers.udp} UDP bytes from its peers for ${received} result bytes (TCP ${wire.peers.tcp})`)
      }
      const coordinatorBytes = last.coordinator - first.coordinator
      const clientBytes = last.clientsReceived - first.clientsReceived
      console.log(
        `# (h) rounds 1-4: coordinator link ${coordinatorBytes} bytes, clients received ${clientBytes} bytes (${((100 * coordinatorBytes) / clientBytes).toFixed(2)} %); first direct ms ${JSON.stringify(firstDirectMs(clients))}`,
      )
      assert.ok(
        clientBytes > 0 && coordinatorBytes < 0.2 * clientBytes,
        `the coordinator's link carried ${coordinatorBytes} bytes, >= 20 % of the ${clientBytes} the clients received`,
      )
    } finally {
      await run.stop()
      lab.destroySync()
      dir.cleanup()
    }
    assert.deepEqual(lab.remaining(), [], 'every namespace is gone')
  })

  it('(f) 3 clients behind symmetric NATs (masquerade random): WebRTC and then TCP punching fail within their windows, they stay on the relay, and every round still applies every result', async () => {
    const lab = new Lab()
    const dir = tempDir('psyche-net-f-')
    const coordinator = lab.addPublicHost('coord')
    // A run long enough for every pair's attempts (WebRTC twice, ~7 s each, then a 5 s TCP window); stopped once they
    // are logged.
    const run = new NetRun(lab, dir.path, coordinator, {...SHAPE, totalSteps: 40})
    try {
      await run.startServer()
      const hosts = ['a', 'b', 'c'].map((n) => lab.addNatHost(n, {nat: 'symmetric'}))
      const clients = await Promise.all(hosts.map((h) => run.startClient(h.name, h)))
      await waitForStep(run, clients, 1, 240_000)
      const first = linkTotals(lab, coordinator, hosts)
      await waitForStep(run, clients, 4, 240_000)
      perRound('f', first, linkTotals(lab, coordinator, hosts), clients, [1, 4])
      assertExchanged(clients, [1, 2, 3, 4], 2)
      const logged = () => clients.reduce((n, c) => n + eventsOf(c, 'hole_punch_failed').length, 0)
      const done = () => logged() >= 6 && clients.every((c) => eventsOf(c, 'hole_punch_failed').length >= 1)
      for (const end = Date.now() + 90_000; !done() && Date.now() < end;) await new Promise((r) => setTimeout(r, 250))
      for (const c of clients) {
        assert.deepEqual(eventsOf(c, 'webrtc_connected'), [], `${c.name}: no WebRTC connection through a symmetric NAT`)
        assert.deepEqual(eventsOf(c, 'hole_punched'), [], `${c.name}: nothing punched through a symmetric NAT`)
        const webrtc = eventsOf(c, 'webrtc_failed')
        assert.ok(webrtc.length >= 1, `${c.name} tried WebRTC and failed`)
        for (const e of webrtc) assert.ok(e.ms < 20_000, `${c.name}: the WebRTC attempt gave up in bounded time: ${JSON.stringify(e)}`)
        const failed = eventsOf(c, 'hole_punch_failed')
        assert.ok(failed.length >= 1, `${c.name} tried to punch over TCP and failed`)
        for (const e of failed) {
          assert.ok(e.ms < 40_000, `${c.name}: the punch gave up in bounded time: ${JSON.stringify(e)}`)
        }
        assert.ok(
          rounds(c).every((r) => r.conn_relayed !== null && r.conn_relayed >= 2 && (r.relayed_in ?? 0) > 0),
          `${c.name} exchanged with both peers through the relay: ${JSON.stringify(rounds(c).map((r) => [r.conn_direct, r.conn_relayed, r.relayed_in]))}`,
        )
      }
    } finally {
      await run.stop()
      lab.destroySync()
      dir.cleanup()
    }
    assert.deepEqual(lab.remaining(), [], 'every namespace is gone')
  })

  it('(g) UDP blocked on every host, clients behind NAT routers: QUIC dials and WebRTC fail fast, every pair punches a direct TCP connection, and every round applies every result over it', async () => {
    const lab = new Lab()
    const dir = tempDir('psyche-net-g-')
    const coordinator = lab.addPublicHost('coord')
    const run = new NetRun(lab, dir.path, coordinator, SHAPE)
    try {
      lab.blockUdp(coordinator)
      await run.startServer()
      const hosts = ['a', 'b', 'c'].map((n) => lab.addNatHost(n))
      for (const h of hosts) lab.blockUdp(h)
      const clients = await Promise.all(hosts.map((h) => run.startClient(h.name, h)))
      await waitForStep(run, clients, 1, 240_000)
      const first = linkTotals(lab, coordinator, hosts)
      await waitForStep(run, clients, 4, 240_000)
      perRound('g', first, linkTotals(lab, coordinator, hosts), clients, [1, 4])
      assertExchanged(clients, [1, 2, 3, 4], 2)
      const ids = peerIdsOf(clients)
      for (const [i, c] of clients.entries()) {
        const started = c.events.find((e) => e.event === 'started')!
        // Without a flag it still announces and tries QUIC; its packets are dropped, and TCP carries the run.
        assert.ok(
          (started.p2p as string[]).some((a) => a.includes('/quic-v1/')),
          `${c.name} announced QUIC: ${JSON.stringify(started.p2p)}`,
        )
        assert.ok(lab.udpDropped(hosts[i]) > 0, `${c.name}'s UDP packets were dropped`)
        assert.deepEqual(eventsOf(c, 'webrtc_connected'), [], `${c.name}: no WebRTC without UDP`)
        for (const e of eventsOf(c, 'webrtc_failed')) assert.ok(e.ms < 5_000, `${c.name}: WebRTC gave up fast without UDP: ${JSON.stringify(e)}`)
        // A direct TCP connection to each of the two others, punched by one side or the other.
        const punchedWith = new Set(eventsOf(c, 'hole_punched').map((e) => e.peer_id))
        assert.deepEqual(
          [...punchedWith].sort(),
          clients
            .filter((o) => o !== c)
            .map((o) => ids.get(o)!)
            .sort(),
          `${c.name} punched through to both others: ${JSON.stringify(c.events.filter((e) => /^(webrtc|hole_punch)/.test(String(e.event))))}`,
        )
        for (const e of eventsOf(c, 'hole_punched')) {
          const other = hosts[clients.findIndex((o) => ids.get(o) === e.peer_id)]
          assert.ok(e.addr.startsWith(`/ip4/${other.publicIp}/tcp/`), `${c.name} reached ${e.peer_id} at its router's public address: ${e.addr}`)
        }
        const r = rounds(c).at(-1)!
        assert.ok(r.relayed_in !== null && r.bytes_in > 0 && r.relayed_in < 0.05 * r.bytes_in, `${c.name}: relayed ${r.relayed_in} of ${r.bytes_in} bytes in`)
        assert.ok(!c.events.some((e) => e.event === 'no_exchange'), `${c.name} never lacked an exchange`)
      }
    } finally {
      await run.stop()
      lab.destroySync()
      dir.cleanup()
    }
    assert.deepEqual(lab.remaining(), [], 'every namespace is gone')
  })
})
