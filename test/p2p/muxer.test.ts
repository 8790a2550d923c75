import {strict as assert} from 'node:assert'
import {describe, it} from 'node:test'
import {yamux} from '@chainsafe/libp2p-yamux'
import {StreamMessageEvent, StreamStateError, type StreamMuxerFactory} from '@libp2p/interface'
import {multiaddrConnectionPair} from '@libp2p/utils'
import {safeYamux} from '../../src/core/p2p/muxer.js'

/**
 * A yamux muxer whose connection can no longer be written to receives a frame it cannot parse: the muxer aborts and
 * sends a GoAway on the dead connection. Returns the exceptions that escaped to the process (uncaughtException).
 */
async function abortOnDeadConnection(factory: StreamMuxerFactory): Promise<unknown[]> {
  const [conn] = multiaddrConnectionPair()
  factory.createStreamMuxer(conn)
  conn.send = () => {
    throw new StreamStateError('Cannot write to a stream that is closed')
  }
  const escaped: unknown[] = []
  const listeners = process.listeners('uncaughtException')
  process.removeAllListeners('uncaughtException')
  const catcher = (error: unknown) => escaped.push(error)
  process.on('uncaughtException', catcher)
  try {
    // version 9 is no yamux frame: the muxer's message listener fails to parse it and aborts
    conn.dispatchEvent(new StreamMessageEvent(new Uint8Array([9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])))
    await new Promise((r) => setTimeout(r, 20))
  } finally {
    process.off('uncaughtException', catcher)
    for (const l of listeners) process.on('uncaughtException', l)
  }
  return escaped
}

describe('the stream muxer', () => {
  it("yamux's abort on a connection that is already closed throws out of its event listener; ours reports it", async () => {
    const raw = await abortOnDeadConnection(yamux()())
    assert.equal(raw.length, 1, 'the library throws where nothing can catch it (if this fails, the library was fixed)')
    assert.ok(raw[0] instanceof StreamStateError)
    const reported: unknown[] = []
    const ours = await abortOnDeadConnection(safeYamux((e) => reported.push(e))())
    assert.deepEqual(ours, [])
    assert.equal(reported.length, 1)
    assert.ok(reported[0] instanceof StreamStateError)
  })
})
