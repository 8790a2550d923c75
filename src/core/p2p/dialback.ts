import {multiaddr, type Multiaddr} from '@multiformats/multiaddr'
import {addrPeerId, isCircuit} from './addresses.js'
import {isQuicAddr} from './transports.js'

/**
 * The dial-back check: is a client reachable from the internet, or does it need a relay slot?
 *
 * libp2p's AutoNAT (v1) needs four successful dial-backs from four different network segments and never verifies a
 * private address, so in a small run, or on a LAN, it never decides. The relay is reachable by every client by
 * definition; it dials the client's direct addresses once and says which answered:
 *
 *   client -> relay  /psyche/dialback/1  {"addrs": ["/ip4/…/tcp/…/p2p/<client>", "/ip4/…/udp/…/quic-v1/p2p/<client>", …]}
 *   relay  -> client                      {"reachable": [addrs that answered as that client], "checked": [addrs dialled]}
 *
 * Like AutoNAT, the relay only dials addresses on the IP address the request came from (so it cannot be made to
 * dial anyone else) and at most MAX_DIALBACK_ADDRS of them, TCP and QUIC alike (a QUIC dial-back is one handshake
 * to that UDP port, under the same DIALBACK_DIAL_TIMEOUT_MS). A client behind NAT announces its private address,
 * which is not the address its connection comes from (its router's), so nothing is dialled and it reserves a slot.
 */
export const DIALBACK_PROTOCOL = '/psyche/dialback/1'
export const MAX_DIALBACK_ADDRS = 8
export const MAX_DIALBACK_REQUEST_BYTES = 8 * 1024
export const DIALBACK_DIAL_TIMEOUT_MS = 5_000

/** The host part (IP or DNS name) of a multiaddr, lower-cased; an IPv4-mapped IPv6 address as its IPv4 address. */
export function hostOf(addr: Multiaddr): string | undefined {
  const host = addr
    .getComponents()
    .find((c) => c.name === 'ip4' || c.name === 'ip6')
    ?.value?.toLowerCase()
  if (host === undefined) return undefined
  if (/^::ffff:\d+\.\d+\.\d+\.\d+$/.test(host)) return host.slice(7)
  const mapped = /^::ffff:([0-9a-f]{1,4}):([0-9a-f]{1,4})$/.exec(host)
  if (mapped) {
    const [hi, lo] = [parseInt(mapped[1], 16), parseInt(mapped[2], 16)]
    return `${hi >> 8}.${hi & 255}.${lo >> 8}.${lo & 255}`
  }
  return host
}

type DialbackSelection = {ok: true; targets: Multiaddr[]; skipped: {addr: string; reason: string}[]} | {ok: false; reason: string}

/**
 * Which addresses of a dial-back request (untrusted JSON from the wire) the relay dials: direct TCP or QUIC addresses on
 * `remoteHost` (where the request's connection comes from) that name no peer or the requesting peer, each ending in
 * /p2p/<requester>. Pure.
 */
export function dialbackTargets(request: Record<string, unknown>, remoteHost: string | undefined, requester: string): DialbackSelection {
  const addrs = request.addrs
  if (!Array.isArray(addrs)) return {ok: false, reason: 'addrs is not a list'}
  if (addrs.length > MAX_DIALBACK_ADDRS) return {ok: false, reason: `more than ${MAX_DIALBACK_ADDRS} addrs`}
  if (remoteHost === undefined) return {ok: false, reason: 'the request came over a connection without an IP address (relayed?)'}
  const targets: Multiaddr[] = []
  const skipped: {addr: string; reason: string}[] = []
  const seen = new Set<string>()
  for (const value of addrs) {
    if (typeof value !== 'string' || value.length > 512) return {ok: false, reason: 'an addr is not a string of at most 512 characters'}
    let addr: Multiaddr
    try {
      addr = multiaddr(value)
    } catch {
      skipped.push({addr: value, reason: 'not a multiaddr'})
      continue
    }
    const names = addr.getComponents().map((c) => c.name)
    if (isCircuit(addr) || !(names.includes('tcp') || isQuicAddr(addr))) {
      skipped.push({addr: value, reason: 'not a direct TCP or QUIC address'})
      continue
    }
    const peer = addrPeerId(addr)
    if (peer !== undefined && peer !== requester) {
      skipped.push({addr: value, reason: 'names another peer'})
      continue
    }
    if (hostOf(addr) !== remoteHost) {
      skipped.push({addr: value, reason: `not on ${remoteHost}, where the request came from`})
      continue
    }
    const target = peer === undefined ? addr.encapsulate(`/p2p/${requester}`) : addr
    const key = target.toString()
    if (seen.has(key)) continue
    seen.add(key)
    targets.push(target)
  }
  return {ok: true, targets, skipped}
}

/** The relay's answer, checked (a client trusts only its own addresses back, and only as strings). */
export function parseDialbackResponse(response: Record<string, unknown>, asked: readonly string[]): {reachable: string[]; checked: string[]} {
  const pick = (value: unknown) => (Array.isArray(value) ? value.filter((a): a is string => typeof a === 'string' && asked.includes(a)) : [])
  return {reachable: pick(response.reachable), checked: pick(response.checked)}
}
