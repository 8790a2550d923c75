import assert from 'node:assert/strict'
import {after, before, describe, it} from 'node:test'
import {ensureDemoCorpus} from '../../src/core/corpus.js'
import {tempDir} from '../helpers.js'
import {assertExchanged, NetRun, rounds, waitForStep} from './harness.js'
import {Lab, labUnavailable} from './lab.js'

// Real processes on separate network hosts (namespaces on one bridge); see lab.ts.
const unavailable = labUnavailable({rates: true})
if (unavailable) console.log(`# test/net skipped: ${unavailable}`)

describe('across hosts on one segment', {skip: unavailable, timeout: 420_000}, () => {
  before(async () => {
    await ensureDemoCorpus()
  })

  it("(a) a coordinator and 3 clients on 3 other hosts: every round applies the other clients' results over direct connections, hashes agree, the loss falls", async () => {
    const lab = new Lab()
    const dir = tempDir('psyche-net-a-')
    const run = new NetRun(lab, dir.path, lab.addPublicHost('coord'), {roundsPerEpoch: 4, totalSteps: 4, initMinClients: 3, lr: 1e-2, maxRoundTrainTime: 20, warmupTime: 40})
    try {
      await run.startServer()
      // The relay says where it listens: the coordinator host's public address, on its bound port.
      const listening = run.server.events.find((e) => e.event === 'relay_listening')!
      assert.ok(
        run.relay!.port > 0 && (listening.addrs as string[]).includes(`/ip4/${run.coordinator.ip}/tcp/${run.relay!.port}/p2p/${run.relay!.peer_id}`),
        JSON.stringify(listening),
      )
      // And on QUIC (UDP), beside TCP.
      assert.ok(
        (listening.quic_port as number) > 0 &&
          (listening.addrs as string[]).includes(`/ip4/${run.coordinator.ip}/udp/${listening.quic_port as number}/quic-v1/p2p/${run.relay!.peer_id}`),
        JSON.stringify(listening),
      )
      const hosts = ['a', 'b', 'c'].map((n) => lab.addPublicHost(n))
      for (const h of hosts) lab.countProtocols(h)
      const clients = await Promise.all(hosts.map((h) => run.startClient(h.name, h)))
      await waitForStep(run, clients, 4, 240_000)
      assertExchanged(clients, [1, 2, 3, 4], 2)
      for (const [i, c] of clients.entries()) {
        // The relay's dial-back confirmed its QUIC address (on its own host), not only its TCP one.
        const confirmed = c.events.find((e) => e.event === 'reachability')
        assert.ok(
          (confirmed?.addrs as string[] | undefined)?.some((a) => a.startsWith(`/ip4/${hosts[i].ip}/udp/`) && a.includes('/quic-v1/')),
          `${c.name}'s QUIC address confirmed by the dial-back: ${JSON.stringify(confirmed)}`,
        )
        const dialback = run.server.events.find((e) => e.event === 'dialback' && (e.reachable as string[]).some((a) => a.startsWith(`/ip4/${hosts[i].ip}/udp/`)))
        assert.ok(dialback, `the relay logged ${c.name}'s QUIC address reachable`)
        // And used: the results it downloaded came over QUIC (UDP bytes on its host's wire, from the kernel's counters).
        const wire = lab.protocolBytes(hosts[i])
        const received = rounds(c).at(-1)!.bytes_in
        assert.ok(wire.udp >= received && wire.udp > wire.tcp, `${c.name}: ${wire.udp} UDP bytes on its wire for ${received} result bytes received (TCP ${wire.tcp})`)
        console.log(`# (a) ${c.name}: ${received} result bytes in, wire UDP ${wire.udp} B, TCP ${wire.tcp} B`)
        // Peers were told the hosts' own addresses, never a loopback one, and connected directly.
        const started = c.events.find((e) => e.event === 'started')!
        // On a public segment libp2p announces no unconfirmed public address: psyche still tells peers its own.
        assert.ok((started.p2p as string[]).length > 0, `${c.name} announced an address: ${JSON.stringify(started)}`)
        // TCP and QUIC addresses, both on its host.
        for (const a of started.p2p as string[])
          assert.match(a, new RegExp(`^/ip4/${lab.net.replaceAll('.', '\\.')}\\.\\d+/(tcp/\\d+|udp/\\d+/quic-v1)/p2p/`), `${c.name} announced ${a}`)
        assert.ok(
          (started.p2p as string[]).some((a) => a.includes('/quic-v1/')) && (started.p2p as string[]).some((a) => a.includes('/tcp/')),
          `${c.name} announced both: ${JSON.stringify(started.p2p)}`,
        )
        assert.ok(rounds(c).at(-1)!.bytes_in > 0, `${c.name} downloaded results`)
        assert.equal(c.events.filter((e) => e.event === 'model_fetched' && e.relayed).length, 0)
        // The relay dialled it back at its own address: publicly reachable, so it reserved no relay slot.
        const verdict = c.events.find((e) => e.event === 'reachability')
        assert.equal(verdict?.reachable, true, `${c.name}: ${JSON.stringify(verdict)}`)
        assert.ok(!c.events.some((e) => e.event === 'addresses_changed' && e.addrs.some((a) => a.includes('/p2p-circuit'))), `${c.name} announced no relayed address`)
      }
      assert.deepEqual(
        run.server.events.filter((e) => e.event === 'relay_reservation'),
        [],
        'no client reserved a relay slot',
      )
    } finally {
      await run.stop()
      lab.destroySync()
      dir.cleanup()
    }
    assert.deepEqual(lab.remaining(), [], 'every namespace is gone')
  })

  it("(c) on an all-private segment (10.77.0.0/24: a LAN, a cloud VPC), one client on a 5 Mbit/s link: it keeps up, and every round still applies everyone's results", async () => {
    const lab = new Lab({segment: 'private'})
    const dir = tempDir('psyche-net-c-')
    const run = new NetRun(lab, dir.path, lab.addPublicHost('coord'), {roundsPerEpoch: 4, totalSteps: 4, initMinClients: 3, lr: 1e-2, maxRoundTrainTime: 20, warmupTime: 40})
    try {
      await run.startServer()
      const slowHost = lab.addPublicHost('slow')
      lab.limitRate(slowHost, 5)
      const clients = [await run.startClient('slow', slowHost), ...(await Promise.all(['b', 'c'].map((n) => run.startClient(n, lab.addPublicHost(n)))))]
      await waitForStep(run, clients, 4, 240_000)
      assertExchanged(clients, [1, 2, 3, 4], 2)
    } finally {
      await run.stop()
      lab.destroySync()
      dir.cleanup()
    }
  })

  it('a run in which nothing can be exchanged is loud: every round line says so, a no_exchange warning names the addresses that failed, and with --max-rounds-without-exchange 4 each client leaves with a clear error and exit 1', async () => {
    // What the issue saw: libp2p on loopback only and no relay, so every peer is told an address it cannot use.
    const lab = new Lab()
    const dir = tempDir('psyche-net-x-')
    const run = new NetRun(lab, dir.path, lab.addPublicHost('coord'), {roundsPerEpoch: 5, totalSteps: 5, initMinClients: 3, lr: 1e-2, maxRoundTrainTime: 4, warmupTime: 25})
    try {
      await run.startServer(['--no-relay'])
      const clients = await Promise.all(
        ['a', 'b', 'c'].map((n) => run.startClient(n, lab.addPublicHost(n), ['--p2p-listen', '/ip4/127.0.0.1/tcp/0', '--max-rounds-without-exchange', '4'])),
      )
      const warnings = await Promise.all(
        clients.map((c) => c.waitFor((e) => e.event === 'no_exchange', 'the no_exchange warning', 240_000).catch((error) => assert.fail(`${error.message}\n${run.tails()}`))),
      )
      for (const [i, w] of warnings.entries()) {
        assert.ok((w.rounds as number) >= 3 && (w.other_trainers as number) === 2, JSON.stringify(w))
        const unreachable = w.unreachable as {addrs: string[]}[]
        assert.equal(unreachable.length, 2, `${clients[i].name} names both peers: ${JSON.stringify(w)}`)
        for (const u of unreachable)
          assert.ok(
            u.addrs.every((a) => a.startsWith('/ip4/127.0.0.1/')),
            JSON.stringify(u),
          )
        for (const r of rounds(clients[i])) assert.equal(r.peers_applied, 0, JSON.stringify(r))
      }
      // It does not train alone for long: at the 4th such round it withdraws and exits 1, saying why.
      for (const c of clients) {
        const result = await c.proc
        assert.equal(result.exitCode, 1, `${c.name} exited 1: ${c.stderr.join('').slice(-600)}`)
        assert.deepEqual(
          rounds(c).map((r) => r.rounds_without_exchange),
          rounds(c).map((_, i) => i + 1),
          `${c.name}: every round line counts the rounds without exchange`,
        )
        assert.equal(rounds(c).length, 4, `${c.name} left after 4 rounds without exchange`)
        assert.ok(c.events.some((e) => e.event === 'no_exchange' && e.leaving === true && e.rounds === 4))
        assert.match(c.stderr.join('') + JSON.stringify(c.events.at(-1)), /applied no other client's results for 4 rounds in a row/, c.name)
      }
    } finally {
      await run.stop()
      lab.destroySync()
      dir.cleanup()
    }
  })
})
