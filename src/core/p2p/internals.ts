import type {Multiaddr} from '@multiformats/multiaddr'

/**
 * The two libp2p components psyche reaches past the public Libp2p interface for: the transport manager (the
 * addresses our listeners are bound to, whatever the address manager thinks of them; listening on a relay) and
 * the address manager (marking an address as confirmed, so that identify and a relay's reservations
 * include it).
 *
 * Why: libp2p announces a public (non-RFC 1918) address only once something confirmed it (AutoNAT, which needs
 * several peers on different networks; psyche's dial-back, dialback.ts); until then getMultiaddrs() leaves it out. On the internet that is every
 * address of a coordinator's VM, so without this its relay announced nothing and its clients nothing but loopback.
 */
interface Libp2pInternals {
  transportManager: {getAddrs(): Multiaddr[]; listen(addrs: Multiaddr[]): Promise<void>}
  addressManager: {
    confirmObservedAddr(addr: Multiaddr, options?: {type?: 'transport' | 'observed' | 'ip-mapping' | 'dns-mapping'; ttl?: number}): void
    getObservedAddrs(): Multiaddr[]
  }
}

export function internals(libp2p: object): Libp2pInternals {
  const components = (libp2p as {components?: Libp2pInternals}).components
  if (!components?.transportManager || !components.addressManager) throw new Error('libp2p internals changed: no components.transportManager/addressManager')
  return components
}

/** How long a confirmed address stays confirmed before libp2p would want it checked again: for the process's life. */
export const CONFIRMED_TTL_MS = 10 * 365 * 24 * 60 * 60 * 1000
