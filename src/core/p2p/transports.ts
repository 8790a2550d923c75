import {quic} from '@chainsafe/libp2p-quic'
import {tcp} from '@libp2p/tcp'
import type {Multiaddr} from '@multiformats/multiaddr'
import type {Libp2pOptions} from 'libp2p'

/** A libp2p transport as createLibp2p takes it (tcp(), a memory transport in tests, QUIC). */
export type TransportFactory = NonNullable<Libp2pOptions['transports']>[number]

/**
 * The transports a client node dials and listens with unless told otherwise (the circuit relay is added apart):
 * QUIC (one UDP socket that listens and dials) beside TCP, or TCP alone with `quic: false` (`join --no-quic`).
 */
export function defaultTransports(options: {quic?: boolean} = {}): TransportFactory[] {
  return options.quic === false ? [tcp()] : [quic(), tcp()]
}

/**
 * The listen addresses with a QUIC address beside each TCP one (the same host, the same port number on UDP; port 0:
 * any free one), unless QUIC addresses are already listed.
 */
export function withQuicListen(listen: readonly string[]): string[] {
  if (listen.some((a) => a.includes('/quic-v1'))) return [...listen]
  const quicAddrs = listen.flatMap((a) => {
    const m = /^\/(ip4|ip6)\/([^/]+)\/tcp\/(\d+)$/.exec(a)
    return m ? [`/${m[1]}/${m[2]}/udp/${m[3]}/quic-v1`] : []
  })
  return [...listen, ...quicAddrs]
}

/** A direct QUIC address (/…/udp/…/quic-v1, not through a relay). */
export function isQuicAddr(addr: Multiaddr): boolean {
  const names = addr.getComponents().map((c) => c.name)
  return names.includes('quic-v1') && !names.includes('p2p-circuit')
}
