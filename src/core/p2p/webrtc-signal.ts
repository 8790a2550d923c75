import {multiaddr} from '@multiformats/multiaddr'
import {isIP} from 'node:net'
import {addressScope, isOtherPrivateNetwork} from './addresses.js'

/**
 * The messages of /psyche/webrtc/1 (webrtc.ts), which two peers exchange over their relayed connection to open a
 * WebRTC connection: decoded and checked here, before anything reaches the native WebRTC library. Pure.
 *
 *   initiator -> responder  {type: 'offer', sdp}          its session description (no candidates in it)
 *   responder -> initiator  {type: 'answer', sdp}
 *   initiator -> responder  {type: 'candidates', candidates: [...]}   its ICE candidates, at most maxCandidates
 *   responder -> initiator  {type: 'candidates', candidates: [...]}
 *   initiator -> responder  {type: 'ping'}               (or 'decline' when no candidate of the peer is usable)
 *   responder -> initiator  {type: 'pong'}               (or 'decline')
 *   initiator -> responder  {type: 'sync'}               both start ICE checks now (the initiator half a round trip later)
 *
 * A peer is an untrusted stranger until proven otherwise: a session description is held to a short, printable text
 * with the few attributes a data-channel session has (a candidate inside it is refused: candidates travel apart, so
 * that each is checked and counted); a candidate to `candidate:F 1 UDP P ADDRESS PORT typ host|srflx|prflx` with a
 * literal IP address, rewritten in that canonical form. Anything else is an Error naming what is wrong.
 */

/** The largest signalling frame (a JSON message); session descriptions are ~600 bytes, candidates ~80. */
export const MAX_SIGNAL_FRAME_BYTES = 8 * 1024
const MAX_SDP_BYTES = 4 * 1024
const MAX_SDP_LINES = 48
const MAX_CANDIDATE_BYTES = 256

export type SignalMessage =
  | {type: 'offer'; sdp: string}
  | {type: 'answer'; sdp: string}
  | {type: 'candidates'; candidates: IceCandidate[]}
  | {type: 'ping'}
  | {type: 'pong'}
  | {type: 'sync'}
  | {type: 'decline'; reason: string}

export interface IceCandidate {
  /** The canonical candidate line (what the native library is given). */
  line: string
  address: string
  port: number
  type: 'host' | 'srflx' | 'prflx'
}

/**
 * One signalling frame (UTF-8 JSON) as a message of the `expected` types, checked; throws an Error that says why
 * not. `maxCandidates` bounds a candidate list (a longer one is refused whole: the peer breaks the limit).
 */
export function decodeSignal(frame: Uint8Array, expected: readonly SignalMessage['type'][], options: {maxCandidates: number}): SignalMessage {
  if (frame.byteLength > MAX_SIGNAL_FRAME_BYTES) throw new Error(`a signalling message of ${frame.byteLength} bytes (at most ${MAX_SIGNAL_FRAME_BYTES})`)
  let value: unknown
  try {
    value = JSON.parse(new TextDecoder('utf-8', {fatal: true}).decode(frame))
  } catch {
    throw new Error('a signalling message that is not UTF-8 JSON')
  }
  if (typeof value !== 'object' || value === null || Array.isArray(value)) throw new Error('a signalling message that is not a JSON object')
  const message = value as Record<string, unknown>
  const type = message.type
  if (typeof type !== 'string' || !(expected as readonly string[]).includes(type))
    throw new Error(`expected a ${expected.join(' or ')} message, got ${typeof type === 'string' ? JSON.stringify(type.slice(0, 32)) : 'no type'}`)
  switch (type) {
    case 'offer':
    case 'answer':
      return {type, sdp: checkSdp(message.sdp, type)}
    case 'candidates': {
      const list = message.candidates
      if (!Array.isArray(list)) throw new Error('candidates is not a list')
      if (list.length > options.maxCandidates) throw new Error(`${list.length} ICE candidates (at most ${options.maxCandidates}: --webrtc-max-candidates)`)
      const out: IceCandidate[] = []
      const seen = new Set<string>()
      for (const item of list) {
        const candidate = parseCandidate(item)
        const key = `${candidate.address} ${candidate.port}`
        if (seen.has(key)) continue
        seen.add(key)
        out.push(candidate)
      }
      return {type, candidates: out}
    }
    case 'decline': {
      const reason = typeof message.reason === 'string' ? message.reason.slice(0, 200) : 'no reason given'
      return {type, reason}
    }
    default:
      return {type: type as 'ping' | 'pong' | 'sync'}
  }
}

export function encodeSignal(message: SignalMessage): Uint8Array {
  const wire = message.type === 'candidates' ? {type: message.type, candidates: message.candidates.map((c) => c.line)} : message
  return new TextEncoder().encode(JSON.stringify(wire))
}

const ICE_CHARS = /^[A-Za-z0-9+/]+$/
const FINGERPRINT = /^sha-256 ([0-9A-F]{2}:){31}[0-9A-F]{2}$/i
/** Session-level and media-level lines a data-channel session has: v o s t c m a (b: a bandwidth, harmless). */
const LINE = /^[vostcmab]=[\x20-\x7e]*$/
/** Attributes that would hand the native library addresses without their being checked and counted. */
const FORBIDDEN_ATTRIBUTES = new Set(['candidate', 'end-of-candidates', 'remote-candidates', 'ice-lite'])

/**
 * A session description of a WebRTC data-channel session (an offer or an answer), checked: short printable lines,
 * one `m=application … UDP/DTLS/SCTP webrtc-datachannel` section, ICE credentials and a SHA-256 DTLS fingerprint
 * in their formats, the DTLS role an offer or answer may take, and no candidate. Returns it with CRLF line ends.
 */
export function checkSdp(value: unknown, type: 'offer' | 'answer'): string {
  if (typeof value !== 'string') throw new Error(`the ${type} has no session description`)
  if (value.length > MAX_SDP_BYTES) throw new Error(`the ${type}'s session description has ${value.length} characters (at most ${MAX_SDP_BYTES})`)
  const lines = value.split(/\r?\n/)
  if (lines.at(-1) === '') lines.pop()
  if (lines.length > MAX_SDP_LINES) throw new Error(`the ${type}'s session description has ${lines.length} lines (at most ${MAX_SDP_LINES})`)
  if (lines[0] !== 'v=0') throw new Error(`the ${type}'s session description does not start with v=0`)
  const attributes = new Map<string, string[]>()
  let media = 0
  for (const line of lines) {
    if (!LINE.test(line)) throw new Error(`the ${type}'s session description has a line that is not a printable v/o/s/t/c/m/a/b line: ${JSON.stringify(line.slice(0, 60))}`)
    if (line.startsWith('m=')) {
      media++
      if (!/^m=application \d{1,5} UDP\/DTLS\/SCTP webrtc-datachannel$/.test(line))
        throw new Error(`the ${type} offers ${JSON.stringify(line.slice(0, 60))}, not one data-channel section`)
    }
    if (!line.startsWith('a=')) continue
    const colon = line.indexOf(':')
    const name = colon < 0 ? line.slice(2) : line.slice(2, colon)
    if (!/^[a-z][a-z0-9-]{0,31}$/.test(name)) throw new Error(`the ${type} has an attribute named ${JSON.stringify(name.slice(0, 40))}`)
    if (FORBIDDEN_ATTRIBUTES.has(name)) throw new Error(`the ${type} carries a=${name} (candidates are sent apart, each checked)`)
    const values = attributes.get(name) ?? []
    values.push(colon < 0 ? '' : line.slice(colon + 1))
    attributes.set(name, values)
  }
  if (media !== 1) throw new Error(`the ${type} has ${media} media sections (one data-channel section expected)`)
  const one = (name: string): string => {
    const v = attributes.get(name) ?? []
    if (v.length !== 1) throw new Error(`the ${type} has ${v.length} a=${name} lines (one expected)`)
    return v[0]
  }
  const ufrag = one('ice-ufrag')
  if (!ICE_CHARS.test(ufrag) || ufrag.length < 4 || ufrag.length > 256) throw new Error(`the ${type}'s ice-ufrag is not 4-256 ICE characters`)
  const pwd = one('ice-pwd')
  if (!ICE_CHARS.test(pwd) || pwd.length < 22 || pwd.length > 256) throw new Error(`the ${type}'s ice-pwd is not 22-256 ICE characters`)
  if (!FINGERPRINT.test(one('fingerprint'))) throw new Error(`the ${type}'s fingerprint is not a SHA-256 one`)
  const setup = one('setup')
  const roles = type === 'offer' ? ['actpass'] : ['active', 'passive']
  if (!roles.includes(setup)) throw new Error(`the ${type}'s DTLS role is ${JSON.stringify(setup.slice(0, 20))} (${roles.join(' or ')} expected)`)
  const size = attributes.get('max-message-size')
  if (size !== undefined && (size.length !== 1 || !/^\d{1,10}$/.test(size[0]))) throw new Error(`the ${type}'s max-message-size is not one number`)
  return lines.join('\r\n') + '\r\n'
}

/**
 * One ICE candidate from a peer (`candidate:F 1 UDP P ADDRESS PORT typ TYPE …`, an optional leading `a=`), checked
 * and rewritten canonically (what follows the type, such as raddr/rport, is dropped): UDP, component 1, a literal
 * IPv4 or IPv6 address (no mDNS name), a port, and a host, srflx or prflx type (no TURN relay: the circuit relay is
 * ours). Throws an Error saying what is wrong.
 */
export function parseCandidate(value: unknown): IceCandidate {
  if (typeof value !== 'string' || value.length > MAX_CANDIDATE_BYTES) throw new Error('an ICE candidate that is not a short string')
  const text = value.startsWith('a=') ? value.slice(2) : value
  const m = /^candidate:([A-Za-z0-9+/]{1,32}) (\d{1,3}) (udp|UDP) (\d{1,10}) ([0-9A-Fa-f:.]{2,45}) (\d{1,5}) typ (host|srflx|prflx)(?: [\x21-\x7e]+)*$/.exec(text)
  if (!m) throw new Error(`not a UDP ICE candidate: ${JSON.stringify(text.slice(0, 80))}`)
  const [, foundation, component, , priority, address, portText, type] = m
  if (component !== '1') throw new Error(`an ICE candidate for component ${component} (a data channel has one)`)
  const prio = Number(priority)
  if (prio < 1 || prio > 0xffffffff) throw new Error(`an ICE candidate with priority ${priority}`)
  if (isIP(address) === 0) throw new Error(`an ICE candidate whose address ${JSON.stringify(address)} is not an IP address`)
  const port = Number(portText)
  if (port < 1 || port > 65535) throw new Error(`an ICE candidate with port ${portText}`)
  return {line: `candidate:${foundation} 1 UDP ${prio} ${address} ${port} typ ${type}`, address, port, type: type as IceCandidate['type']}
}

/**
 * Whether a candidate (a peer's, or our own before we send it) can lead anywhere from here: not an unspecified,
 * link-local or multicast address; loopback only when ours is too (peers on one machine); a private address only on
 * one of our own networks (a peer behind the same router), never another LAN's, which on the internet leads nowhere
 * and which ICE would otherwise send checks to. Pure.
 */
export function usableCandidate(c: IceCandidate, options: {networks: readonly string[]; loopback: boolean}): boolean {
  const family = isIP(c.address) === 6 ? 'ip6' : 'ip4'
  const addr = multiaddr(`/${family}/${c.address}/udp/${c.port}`)
  const scope = addressScope(addr)
  if (scope === 'unusable') return false
  if (scope === 'loopback') return options.loopback
  if (family === 'ip4' && Number(c.address.split('.')[0]) >= 224) return false
  if (family === 'ip6' && /^ff/i.test(c.address)) return false
  return !isOtherPrivateNetwork(addr, options.networks)
}
