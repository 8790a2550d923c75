import type {EventLine} from '../../src/core/events.js'
import {randomBytes} from 'node:crypto'
import {generateIdentity} from '../../src/core/protocol/identity.js'
import {P2PNode, ResultStore, type P2PNodeOptions, type SigningIdentity} from '../../src/core/p2p/index.js'
import {waitFor} from '../helpers.js'

const LOOPBACK = ['/ip4/127.0.0.1/tcp/0']

export function testIdentity(): SigningIdentity {
  return generateIdentity()
}

export interface TestNode {
  node: P2PNode
  identity: SigningIdentity
  events: EventLine[]
  /** The node's result store: a test puts bytes of its choosing there to play a dishonest peer. */
  store: ResultStore
}

export async function startNodes(count: number, options: Partial<P2PNodeOptions> & {runId?: string} = {}): Promise<TestNode[]> {
  const out: TestNode[] = []
  for (let i = 0; i < count; i++) {
    const identity = testIdentity()
    const events: EventLine[] = []
    // Loopback only: in-process tests never send traffic to this machine's other addresses.
    const store = new ResultStore()
    // TCP only unless a test asks for QUIC (quic.test.ts).
    const node = await P2PNode.start({runId: 'test-run', listen: LOOPBACK, quic: false, ...options, identity, resultStore: store, log: (e) => events.push(e)})
    out.push({node, identity, events, store})
  }
  return out
}

/** Connects every node to every other and waits until each sees the others subscribed to the results topic. */
export async function meshUp(nodes: TestNode[]): Promise<void> {
  for (const n of nodes) await n.node.connect(nodes.flatMap((m) => m.node.addresses()))
  await waitFor(() => nodes.every((n) => n.node.libp2p.services.pubsub.getSubscribers(n.node.topic).length >= nodes.length - 1), 10_000, 'topic subscriptions to propagate')
}

export async function stopAll(nodes: TestNode[]): Promise<void> {
  await Promise.all(nodes.map((n) => n.node.stop()))
}

export function randomBlob(size: number): Uint8Array {
  return new Uint8Array(randomBytes(size))
}
