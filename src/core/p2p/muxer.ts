import {yamux} from '@chainsafe/libp2p-yamux'
import type {StreamMuxer, StreamMuxerFactory} from '@libp2p/interface'

/**
 * yamux (@chainsafe/libp2p-yamux 8.0.1 on @libp2p/utils 7.4.1), with an abort that cannot throw.
 *
 * When a frame fails to parse, or arrives for a stream the muxer no longer knows, the muxer's message listener calls
 * `abort`, which sends a GoAway frame on the underlying connection. If that connection is already closed, the send
 * throws a StreamStateError out of an event listener, with no caller to catch it: an uncaught exception that ended
 * whole client processes under load (a saturated uplink, peers cutting connections). Here a throw from the muxer's
 * abort is reported through `onAbortThrow`, and the connection is aborted as the listener would have done next.
 */
export function safeYamux(onAbortThrow: (error: unknown) => void): ReturnType<typeof yamux> {
  const make = yamux()
  return () => guardAborts(make(), onAbortThrow)
}

/** `factory`'s muxers with an `abort` that reports a throw instead of raising it (see safeYamux). */
function guardAborts<M extends StreamMuxer>(factory: StreamMuxerFactory<M>, onAbortThrow: (error: unknown) => void): StreamMuxerFactory<M> {
  const create = factory.createStreamMuxer.bind(factory)
  factory.createStreamMuxer = (maConn) => {
    const muxer = create(maConn)
    const abort = muxer.abort.bind(muxer)
    muxer.abort = (err: Error) => {
      try {
        abort(err)
      } catch (thrown) {
        onAbortThrow(thrown)
        try {
          maConn.abort(err)
        } catch {
          // closed already: nothing is left to release
        }
      }
    }
    return muxer
  }
  return factory
}
