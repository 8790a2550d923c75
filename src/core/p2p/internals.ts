/**
 * How long an address psyche confirmed stays confirmed before libp2p would want it checked again: for the process's
 * life. libp2p announces a public (non-RFC 1918) address only once something confirmed it (AutoNAT, which needs
 * several peers on different networks; psyche's dial-back, dialback.ts, for a client; the relay's own bound
 * addresses, relay.ts); until then getMultiaddrs() leaves it out. On the internet that is every address of a
 * coordinator's VM, so without this its relay announced nothing and its clients nothing but loopback. Both confirm
 * through the AddressManager libp2p gives its services (reachability.ts, relay.ts's BoundAddresses), not through
 * libp2p's private fields.
 */
export const CONFIRMED_TTL_MS = 10 * 365 * 24 * 60 * 60 * 1000
