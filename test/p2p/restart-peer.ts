// A peer in its own process, for restart.test.ts: killed with SIGKILL (no FIN, no QUIC CONNECTION_CLOSE) and started
// again with the same key. Arguments: identity file, step, and the addresses to dial (JSON list), which it dials again
// every 300 ms as a client does on each coordinator state. Prints one JSON line with its addresses, then one when it
// has published a result for `step` (once a peer subscribes to the topic); then it re-announces it until killed.
import {loadIdentity} from '../../src/core/protocol/identity.js'
import {P2PNode, ResultStore} from '../../src/core/p2p/index.js'

const [idPath, step, targetsJson] = process.argv.slice(2)
const targets = JSON.parse(targetsJson) as string[]
const node = await P2PNode.start({runId: 'test-run', listen: ['/ip4/127.0.0.1/tcp/0'], quic: true, identity: await loadIdentity(idPath), resultStore: new ResultStore()})
process.stdout.write(`${JSON.stringify({addrs: node.addresses()})}\n`)
const dial = () => void node.connect(targets).catch(() => {})
dial()
setInterval(dial, 300)
while (node.topicPeers() < 1) await new Promise((r) => setTimeout(r, 50))
const blob = new Uint8Array(1000).fill(Number(step))
const announcement = await node.publishResult(Number(step), 0, 1, blob)
process.stdout.write(`${JSON.stringify({published: announcement.commitment})}\n`)
setInterval(() => void node.reannounce(announcement).catch(() => {}), 300)
