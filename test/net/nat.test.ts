import assert from 'node:assert/strict'
import {before, describe, it} from 'node:test'
import {ensureDemoCorpus} from '../../src/core/corpus.js'
import {tempDir} from '../helpers.js'
import {assertExchanged, assertWebRtcMesh, linkTotals, meanLoss, NetRun, perRound, RESULTS_SHAPE, rounds, waitForStep} from './harness.js'
import {Lab, labUnavailable} from './lab.js'

const unavailable = labUnavailable({nat: true})
if (unavailable) console.log(`# test/net skipped: ${unavailable}`)

describe('clients behind NAT, the coordinator public (its relay connects them)', {skip: unavailable, timeout: 600_000}, () => {
  before(async () => {
    await ensureDemoCorpus()
  })

  it("(b, e) 3 clients, each behind its own NAT router (dropping what arrives unasked, as home routers do): the relay's dial-back finds them unreachable, they reserve slots and meet through the relay, then connect directly over UDP (WebRTC); results travel there, and the coordinator's link carries under 5 % of what the clients receive", async () => {
    const lab = new Lab()
    const dir = tempDir('psyche-net-b-')
    const run = new NetRun(lab, dir.path, lab.addPublicHost('coord'), RESULTS_SHAPE)
    try {
      await run.startServer()
      const hosts = ['a', 'b', 'c'].map((n) => lab.addNatHost(n))
      for (const h of hosts) {
        lab.countStrayPrivate(h)
        lab.countSenders(h, run.coordinator.ip)
      }
      const clients = await Promise.all(hosts.map((h) => run.startClient(h.name, h)))
      await waitForStep(run, clients, 1, 240_000)
      const first = linkTotals(lab, run.coordinator, hosts)
      // Another LAN's private address (a peer's 10.77.K.2, behind its router) leads nowhere: the peer's relayed address
      // is waited for, and dialled first (dialer.ts dialPlan), and such an address is no ICE candidate (webrtc-signal.ts
      // usableCandidate). The routers count what was sent there: 28 packets per client when such addresses were tried
      // first for 3 s (QUIC) and 8 s (TCP), before the relay.
      for (const h of hosts) {
        const stray = lab.strayPrivatePackets(h)
        console.log(`# (b) ${h.name}: ${stray} packets to other LANs' private addresses`)
        assert.equal(stray, 0, `${h.name} sent ${stray} packets to other LANs' private addresses`)
      }
      await waitForStep(run, clients, 4, 240_000)
      const last = linkTotals(lab, run.coordinator, hosts)
      perRound('b', first, last, clients, [1, 4])
      assertExchanged(clients, [1, 2, 3, 4], 2)
      for (const c of clients) {
        const verdict = c.events.find((e) => e.event === 'reachability')
        assert.equal(verdict?.reachable, false, `${c.name}: the relay could not reach it directly: ${JSON.stringify(verdict)}`)
        // Each announced its private address and its address through the relay.
        const announced = c.events.filter((e) => e.event === 'addresses_changed').at(-1)?.addrs
        assert.ok(
          announced?.some((a) => a.startsWith(`/ip4/${run.coordinator.ip}/tcp/${run.relay!.port}/p2p/${run.relay!.peer_id}/p2p-circuit/p2p/`)),
          `${c.name}: ${JSON.stringify(announced)}`,
        )
      }
      // They met through the relay, and went direct over UDP within a few seconds.
      assertWebRtcMesh(clients, hosts, 5_000)
      for (const [i, c] of clients.entries()) {
        // From the first round on, results came over the direct connections: next to nothing relayed.
        const r = rounds(c).at(-1)!
        assert.ok(r.relayed_in !== null && r.bytes_in > 0 && r.relayed_in < 0.05 * r.bytes_in, `${c.name}: relayed ${r.relayed_in} of ${r.bytes_in} bytes in`)
        assert.equal(r.conn_relayed, 0, `${c.name}: its relayed connections were closed: ${JSON.stringify(r)}`)
        const wire = lab.receivedBytes(hosts[i])
        console.log(`# (b) ${c.name}: ${r.bytes_in} result bytes in; received from peers UDP ${wire.peers.udp} B, TCP ${wire.peers.tcp} B`)
        assert.ok(wire.peers.udp >= r.bytes_in, `${c.name}: ${wire.peers.udp} UDP bytes from its peers for ${r.bytes_in} result bytes`)
      }
      // One reservation per client behind NAT.
      const reserved = new Set(run.server.events.filter((e) => e.event === 'relay_reservation').map((e) => e.peer_id))
      assert.equal(reserved.size, 3, JSON.stringify(run.server.events.filter((e) => e.event === 'relay_reservation')))
      const coordinatorBytes = last.coordinator - first.coordinator
      const clientBytes = last.clientsReceived - first.clientsReceived
      console.log(`# (b) rounds 1-4: coordinator link ${coordinatorBytes} bytes, clients received ${clientBytes} bytes (${((100 * coordinatorBytes) / clientBytes).toFixed(2)} %)`)
      assert.ok(
        clientBytes > 0 && coordinatorBytes < 0.05 * clientBytes,
        `the coordinator's link carried ${coordinatorBytes} bytes, >= 5 % of the ${clientBytes} the clients received`,
      )
    } finally {
      await run.stop()
      lab.destroySync()
      dir.cleanup()
    }
    assert.deepEqual(lab.remaining(), [], 'every namespace is gone')
  })

  // Behind symmetric NATs, so that no direct connection (WebRTC, TCP punching) takes over: the rejoin goes through the relay.
  it('(d) a client behind a symmetric NAT killed mid-epoch and restarted rejoins and takes the model from its peers through the relay', async () => {
    const lab = new Lab()
    const dir = tempDir('psyche-net-d-')
    const run = new NetRun(lab, dir.path, lab.addPublicHost('coord'), {
      roundsPerEpoch: 3,
      totalSteps: 9,
      initMinClients: 3,
      minClients: 2,
      lr: 1e-2,
      maxRoundTrainTime: 8,
      warmupTime: 40,
      cooldownTime: 3,
    })
    try {
      await run.startServer()
      const hosts = ['a', 'b', 'c'].map((n) => lab.addNatHost(n, {nat: 'symmetric'}))
      const [a, b, c] = await Promise.all(hosts.map((h) => run.startClient(h.name, h)))
      await waitForStep(run, [c], 1, 240_000)
      c.kill('SIGKILL')
      await c.proc
      const killedAfter = rounds(c).at(-1)!.step
      const c2 = await run.startClient('c', hosts[2])
      const loaded = await c2
        .waitFor((e) => e.event === 'model_loaded', 'the restarted client to load the model', 240_000)
        .catch((e) => assert.fail(`${e.message}\n${run.tails()}`))
      assert.equal(loaded.source, 'peers', JSON.stringify(loaded))
      const fetched = c2.events.find((e) => e.event === 'model_fetched')
      assert.ok(fetched && fetched.relayed === true && (fetched.bytes as number) > 0, `the model came through the relay: ${JSON.stringify(fetched)}`)
      const first = (await c2.waitFor((e) => e.event === 'round', "the rejoined client's first round", 240_000)).step as number
      const last = first + 1
      await waitForStep(run, [a, b, c2], last, 240_000)
      // From its rejoin on, all three exchange every round; before, the survivors exchanged with each other.
      const steps = Array.from({length: last - first + 1}, (_, i) => first + i)
      assertExchanged([a, b, c2], steps, 2, {loss: false})
      assert.ok(meanLoss([a, b], last) < meanLoss([a, b], 1), `loss fell: ${meanLoss([a, b], 1)} -> ${meanLoss([a, b], last)}`)
      for (const s of rounds(a).filter((r) => r.step > killedAfter + 1 && r.step < first))
        assert.ok(s.peers_applied >= 1 && s.peers_applied === s.other_trainers, `a step ${s.step}: ${JSON.stringify(s)}`)
      assert.equal(rounds(c2)[0].param_hash, rounds(a).find((r) => r.step === first)!.param_hash)
    } finally {
      await run.stop()
      lab.destroySync()
      dir.cleanup()
    }
  })
})
