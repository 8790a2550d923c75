import {tcp} from '@libp2p/tcp'
import type {Libp2pOptions} from 'libp2p'

/** A libp2p transport as createLibp2p takes it (tcp(), a memory transport in tests, QUIC). */
export type TransportFactory = NonNullable<Libp2pOptions['transports']>[number]

/** The transports a client node dials and listens with unless told otherwise (the circuit relay is added apart). */
export function defaultTransports(): TransportFactory[] {
  return [tcp()]
}
