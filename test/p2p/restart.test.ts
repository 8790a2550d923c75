import assert from 'node:assert/strict'
import {spawn, type ChildProcess} from 'node:child_process'
import {join} from 'node:path'
import {createInterface} from 'node:readline'
import {after, describe, it} from 'node:test'
import {generateIdentity, saveIdentity, type Identity} from '../../src/core/protocol/identity.js'
import {peerIdOfClient} from '../../src/core/p2p/peer-id.js'
import {ALIVE_TIMEOUT_MS} from '../../src/core/p2p/liveness.js'
import {P2PNode, ResultStore, type ResultAnnouncement} from '../../src/core/p2p/index.js'
import type {EventLine} from '../../src/core/events.js'
import {projectRoot} from '../../src/core/worker/python.js'
import {tempDir, waitFor} from '../helpers.js'

/** A peer in its own process (restart-peer.ts), and the JSON lines it printed. */
function startPeer(idPath: string, step: number, targets: string[]): {proc: ChildProcess; lines: Record<string, unknown>[]} {
  const proc = spawn(process.execPath, ['--import', 'tsx', 'test/p2p/restart-peer.ts', idPath, String(step), JSON.stringify(targets)], {
    cwd: projectRoot,
    stdio: ['ignore', 'pipe', 'inherit'],
  })
  const lines: Record<string, unknown>[] = []
  createInterface({input: proc.stdout!}).on('line', (line) => lines.push(JSON.parse(line) as Record<string, unknown>))
  return {proc, lines}
}

async function kill(proc: ChildProcess): Promise<void> {
  if (proc.exitCode !== null || proc.signalCode !== null) return
  const exited = new Promise((r) => proc.once('exit', r))
  proc.kill('SIGKILL')
  await exited
}

/** An identity whose peer id sorts after (or before) `than`: which side of a pair dialled matters to the gater. */
function identityOrdered(than: string, after: boolean): Identity {
  for (;;) {
    const id = generateIdentity()
    if (peerIdOfClient(id.id).toString() > than === after) return id
  }
}

describe('p2p: a peer killed and restarted with the same key is reached again at once', {timeout: 120_000}, () => {
  const dir = tempDir('psyche-p2p-restart-')
  const procs: ChildProcess[] = []
  const nodes: P2PNode[] = []
  after(async () => {
    await Promise.all(procs.map(kill))
    await Promise.all(nodes.map((n) => n.stop()))
    dir.cleanup()
  })

  // Over QUIC a killed peer's connection stays open on our side until its idle timeout (10 s), and gossipsub keeps
  // its one outbound stream to the peer on it: without the liveness check the restarted peer got no announcement
  // (no topic peer) until then, and its results reached no one.
  for (const [name, weDialled] of [
    ['it dialled us', false],
    ['we dialled it (and our peer id is the lower: our gater once refused its new connection)', true],
  ] as const) {
    it(`${name}: its new connection replaces the dead one, and its result arrives within seconds`, async () => {
      const events: EventLine[] = []
      const announcements: ResultAnnouncement[] = []
      const node = await P2PNode.start({
        runId: 'test-run',
        listen: ['/ip4/127.0.0.1/tcp/0'],
        quic: true,
        identity: generateIdentity(),
        resultStore: new ResultStore(),
        log: (e) => events.push(e),
      })
      nodes.push(node)
      node.onAnnouncement((a) => announcements.push(a))
      const identity = identityOrdered(node.peerId, true)
      const peerId = peerIdOfClient(identity.id).toString()
      const idPath = join(dir.path, `${weDialled ? 'b' : 'a'}.json`)
      await saveIdentity(identity, idPath)
      // Over QUIC only, where a kill leaves the connection looking open (TCP's RST closes it at once).
      const ours = node.addresses().filter((a) => a.includes('/quic-v1/'))
      const theirs = (lines: Record<string, unknown>[]) => (lines.find((l) => l.addrs)!.addrs as string[]).filter((a) => a.includes('/quic-v1/'))

      for (const step of [1, 2]) {
        // A restarted client dials every member on its first state; in the second case only we dialled the first one.
        const peer = startPeer(idPath, step, weDialled && step === 1 ? [] : ours)
        procs.push(peer.proc)
        await waitFor(() => peer.lines.some((l) => l.addrs), 30_000, `peer ${step} to listen`)
        const started = Date.now()
        if (weDialled) await node.connect(theirs(peer.lines))
        // As a client does on every coordinator state: dial what the coordinator lists (skipped while connected).
        const redial = setInterval(() => void node.connect(theirs(peer.lines)).catch(() => {}), 300)
        try {
          await waitFor(() => announcements.some((a) => a.step === step), 20_000, `the result of step ${step}`)
        } finally {
          clearInterval(redial)
        }
        const announcement = announcements.find((a) => a.step === step)!
        const blob = await node.fetchResult(announcement)
        assert.equal(blob.length, 1000)
        assert.equal(blob[0], step, 'the bytes the peer published')
        const ms = Date.now() - started
        if (step === 2) {
          // The probe of the dead connection takes ALIVE_TIMEOUT_MS, the new connection and gossip a little more;
          // QUIC's idle timeout (10 s) is what it took before.
          assert.ok(ms < ALIVE_TIMEOUT_MS + 6_000, `the restarted peer's result arrived after ${ms} ms`)
          const stale = events.filter((e) => e.event === 'stale_connection')
          assert.equal(stale.length, 1, JSON.stringify(stale))
          assert.equal(stale[0].peer_id, peerId)
        }
        await kill(peer.proc)
      }
    })
  }
})
