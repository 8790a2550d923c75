import {multiaddr, type Multiaddr} from '@multiformats/multiaddr'
import {BlockList, isIP} from 'node:net'
import {networkInterfaces} from 'node:os'
import {PsycheError, errorMessage} from '../errors.js'

/**
 * Which of a node's addresses to tell its peers. Pure: given libp2p's view of our addresses (listen addresses
 * expanded to interface addresses, identify's confirmed observed addresses, relayed /p2p-circuit addresses).
 *
 * - Never a loopback, unspecified or link-local address to a remote peer: they name the peer's own host.
 * - Except on a node that can only be reached through loopback anyway (it listens on 127.0.0.1 only, or the
 *   machine has no other interface): then its loopback addresses are all it has, and the only peers that can
 *   use them are on the same machine (a one-machine testnet).
 * - Relayed addresses count by their relay's address: one through a relay on 127.0.0.1 is loopback too.
 * - Direct addresses first, relayed last, each address once.
 */
export function publishableAddrs(addrs: readonly Multiaddr[]): string[] {
  const direct: string[] = []
  const relayed: string[] = []
  const local: string[] = []
  const seen = new Set<string>()
  for (const addr of addrs) {
    const text = addr.toString()
    if (seen.has(text)) continue
    seen.add(text)
    const kind = addressScope(addr)
    if (kind === 'unusable') continue
    if (kind === 'loopback') local.push(text)
    else if (isCircuit(addr)) relayed.push(text)
    else direct.push(text)
  }
  if (direct.length === 0 && relayed.length === 0) return local
  return [...direct, ...relayed]
}

/** The host part of an address (the relay's, for a relayed address): usable from elsewhere, loopback, or never usable. */
export function addressScope(addr: Multiaddr): 'remote' | 'loopback' | 'unusable' {
  const host = addr.getComponents().find((c) => c.name === 'ip4' || c.name === 'ip6' || c.name === 'dns' || c.name === 'dns4' || c.name === 'dns6' || c.name === 'dnsaddr')
  if (!host?.value) return 'unusable'
  const value = host.value.toLowerCase()
  if (host.name === 'ip4') {
    if (value.startsWith('127.')) return 'loopback'
    if (value === '0.0.0.0' || value.startsWith('169.254.')) return 'unusable'
    return 'remote'
  }
  if (host.name === 'ip6') {
    if (value === '::1') return 'loopback'
    if (value === '::' || value.startsWith('fe80:')) return 'unusable'
    return 'remote'
  }
  return value === 'localhost' ? 'loopback' : 'remote'
}

export function isCircuit(addr: Multiaddr): boolean {
  return addr.getComponents().some((c) => c.name === 'p2p-circuit')
}

/** The peer id a multiaddr ends in (/p2p/<id>, after any /p2p-circuit), or undefined. */
export function addrPeerId(addr: Multiaddr): string | undefined {
  const components = addr.getComponents()
  for (let i = components.length - 1; i >= 0; i--) {
    if (components[i].name === 'p2p') return components[i].value
    if (components[i].name === 'p2p-circuit') return undefined
  }
  return undefined
}

/**
 * Parses user-given multiaddrs (a --p2p-listen, --p2p-announce or --relay flag): a clear error naming the flag
 * and the address. `needPeer`: the address must end in /p2p/<peer id> (a relay to dial).
 */
export function parseMultiaddrs(values: readonly string[], flag: string, options: {needPeer?: boolean} = {}): string[] {
  return values.map((value) => {
    let addr: Multiaddr
    try {
      addr = multiaddr(value)
    } catch (error) {
      throw new PsycheError(`${flag} ${value}: not a multiaddr (${errorMessage(error)}); e.g. /ip4/203.0.113.7/tcp/4001`, {code: 'EUSAGE'})
    }
    const names = addr.getComponents().map((c) => c.name)
    const quicAddr = names.includes('udp') && names.includes('quic-v1')
    if (!names.includes('tcp') && !quicAddr)
      throw new PsycheError(`${flag} ${value}: psyche's peers speak TCP or QUIC; the address needs a /tcp/PORT part (or /udp/PORT/quic-v1)`, {code: 'EUSAGE'})
    if (options.needPeer && addrPeerId(addr) === undefined)
      throw new PsycheError(`${flag} ${value}: a relay address must end in /p2p/<the relay's peer id> (psyche relay prints it)`, {code: 'EUSAGE'})
    return addr.toString()
  })
}

/** Listen addresses for --p2p-port N (every IPv4 interface), or the default (any free port). */
export function listenAddrsForPort(port: number | undefined): string[] {
  return [`/ip4/0.0.0.0/tcp/${port ?? 0}`]
}

/** Private (RFC 1918, carrier-grade NAT 100.64/10, IPv6 unique-local fc00::/7) ranges: addresses of someone's own network. */
const PRIVATE = new BlockList()
for (const [net, prefix] of [
  ['10.0.0.0', 8],
  ['172.16.0.0', 12],
  ['192.168.0.0', 16],
  ['100.64.0.0', 10],
] as const)
  PRIVATE.addSubnet(net, prefix, 'ipv4')
PRIVATE.addSubnet('fc00::', 7, 'ipv6')

/** The IP host of a direct multiaddr, with its family, or undefined (a DNS name, a relayed address). */
function ipHost(addr: Multiaddr): {host: string; family: 'ipv4' | 'ipv6'} | undefined {
  if (isCircuit(addr)) return undefined
  const c = addr.getComponents().find((x) => x.name === 'ip4' || x.name === 'ip6')
  if (!c?.value || isIP(c.value) === 0) return undefined
  return {host: c.value, family: c.name === 'ip4' ? 'ipv4' : 'ipv6'}
}

/** This machine's networks as CIDRs (10.77.10.2/24, 127.0.0.1/8, …): where a peer's private address may be ours too. */
export function localNetworks(): string[] {
  return Object.values(networkInterfaces())
    .flat()
    .flatMap((i) => (i?.cidr ? [i.cidr] : []))
}

/**
 * A direct address in a private range on none of `networks` (CIDRs, see localNetworks): some other network's own
 * address (a peer behind its NAT, on its LAN), which from here leads nowhere — on the internet such a dial gets no
 * answer at all and runs to its timeout. Pure.
 */
export function isOtherPrivateNetwork(addr: Multiaddr, networks: readonly string[]): boolean {
  const ip = ipHost(addr)
  if (!ip || !PRIVATE.check(ip.host, ip.family)) return false
  const ours = new BlockList()
  for (const cidr of networks) {
    const [net, bits] = cidr.split('/')
    const family = isIP(net) === 4 ? 'ipv4' : isIP(net) === 6 ? 'ipv6' : undefined
    const prefix = Number(bits)
    if (family && Number.isInteger(prefix)) ours.addSubnet(net, prefix, family)
  }
  return !ours.check(ip.host, ip.family)
}
