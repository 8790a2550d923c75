import assert from 'node:assert/strict'
import {describe, it} from 'node:test'
import {startNodes, stopAll} from './helpers.js'

describe('the full mesh of a run', () => {
  it('clients sharing one address are not scored down for it (gossipsub would graylist them past 10 and drop their subscriptions)', async () => {
    // With the default (weight −5, threshold 10), 16 clients on one host saw 0–7 of their 15 peers subscribed and no
    // announcement spread (bench/README.md, "Scale"); a NAT or the run's relay puts many clients on one address too.
    const [a] = await startNodes(1, {relay: false})
    try {
      const pubsub = a.node.libp2p.services.pubsub as unknown as {score: {params: {IPColocationFactorWeight: number}}}
      assert.equal(pubsub.score.params.IPColocationFactorWeight, 0)
    } finally {
      await stopAll([a])
    }
  })
})
