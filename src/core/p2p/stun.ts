import dgram from 'node:dgram'
import {isIP} from 'node:net'
import {crc32} from 'node:zlib'
import {PsycheError, errorMessage} from '../errors.js'
import type {EventLog} from '../events.js'

/**
 * A STUN server (RFC 8489's Binding method, nothing else): a client sends a Binding request to our UDP port and
 * we answer with the address and port its packet came from (XOR-MAPPED-ADDRESS). That is how a client behind NAT
 * learns how its router maps its WebRTC socket (ICE's server-reflexive candidate, webrtc.ts), from the coordinator
 * (`psyche server run`) or a `psyche relay` it already trusts, never from a public STUN server.
 *
 * Untrusted bytes from anyone: a datagram is answered only when it is a well-formed Binding request (header, length,
 * magic cookie, attributes that fit, a FINGERPRINT that matches when there is one); anything else is dropped without
 * an answer. Answers are at most a few bytes larger than the request, and each source address gets at most
 * `ratePerSecond` of them a second (a spoofed source cannot turn us into a flood towards its victim).
 */

const MAGIC_COOKIE = 0x2112a442
const HEADER_BYTES = 20
const BINDING_REQUEST = 0x0001
const BINDING_SUCCESS = 0x0101
const ATTR_XOR_MAPPED_ADDRESS = 0x0020
const ATTR_FINGERPRINT = 0x8028
const FINGERPRINT_XOR = 0x5354554e
/** A Binding request has no business being larger (ICE's carry a few short attributes). */
export const MAX_STUN_REQUEST_BYTES = 548
/** Source addresses whose answer rate is tracked at once; past it the table starts afresh (it is a rate, not a ban). */
const MAX_TRACKED_SOURCES = 16_384

export const DEFAULT_STUN_RATE_PER_SECOND = 20

/** A decoded request: its transaction id (answered as is), or why it is not one we answer. */
type StunRequest = {ok: true; transactionId: Buffer} | {ok: false; reason: string}

/** Decodes a datagram as a STUN Binding request (RFC 8489 §5, §6.3). Pure; never throws. */
export function decodeBindingRequest(packet: Uint8Array): StunRequest {
  const bytes = Buffer.from(packet.buffer, packet.byteOffset, packet.byteLength)
  if (bytes.length < HEADER_BYTES) return {ok: false, reason: 'shorter than a STUN header'}
  if (bytes.length > MAX_STUN_REQUEST_BYTES) return {ok: false, reason: `larger than ${MAX_STUN_REQUEST_BYTES} bytes`}
  const type = bytes.readUInt16BE(0)
  const length = bytes.readUInt16BE(2)
  if ((type & 0xc000) !== 0) return {ok: false, reason: 'not a STUN message (the first two bits are not zero)'}
  if (bytes.readUInt32BE(4) !== MAGIC_COOKIE) return {ok: false, reason: 'no STUN magic cookie'}
  if (length % 4 !== 0 || HEADER_BYTES + length !== bytes.length) return {ok: false, reason: `the length field (${length}) does not match the datagram (${bytes.length} bytes)`}
  if (type !== BINDING_REQUEST) return {ok: false, reason: `not a Binding request (type 0x${type.toString(16).padStart(4, '0')})`}
  let at = HEADER_BYTES
  while (at < bytes.length) {
    if (at + 4 > bytes.length) return {ok: false, reason: 'a truncated attribute header'}
    const attrType = bytes.readUInt16BE(at)
    const attrLength = bytes.readUInt16BE(at + 2)
    const end = at + 4 + attrLength
    const padded = at + 4 + Math.ceil(attrLength / 4) * 4
    if (padded > bytes.length) return {ok: false, reason: `attribute 0x${attrType.toString(16)} runs past the message`}
    if (attrType === ATTR_FINGERPRINT) {
      if (attrLength !== 4 || padded !== bytes.length) return {ok: false, reason: 'FINGERPRINT is not the last 4-byte attribute'}
      if (bytes.readUInt32BE(at + 4) !== fingerprint(bytes.subarray(0, at))) return {ok: false, reason: 'FINGERPRINT does not match'}
    }
    at = Math.max(end, padded)
  }
  return {ok: true, transactionId: Buffer.from(bytes.subarray(8, HEADER_BYTES))}
}

/** CRC-32 of the message so far, XORed as RFC 8489 §14.7 says. */
function fingerprint(bytes: Uint8Array): number {
  return (crc32(bytes) ^ FINGERPRINT_XOR) >>> 0
}

/** A Binding success response telling the requester the address (IPv4 or IPv6) and port we saw it at, with a FINGERPRINT. */
export function encodeBindingSuccess(transactionId: Uint8Array, address: string, port: number): Buffer {
  const family = isIP(address)
  if (family === 0) throw new Error(`${address} is not an IP address`)
  const addrBytes = family === 4 ? Buffer.from(address.split('.').map(Number)) : ipv6Bytes(address)
  const xorKey = Buffer.alloc(16)
  xorKey.writeUInt32BE(MAGIC_COOKIE, 0)
  Buffer.from(transactionId).copy(xorKey, 4)
  const value = Buffer.alloc(4 + addrBytes.length)
  value.writeUInt8(0, 0)
  value.writeUInt8(family === 4 ? 0x01 : 0x02, 1)
  value.writeUInt16BE((port ^ (MAGIC_COOKIE >>> 16)) & 0xffff, 2)
  for (let i = 0; i < addrBytes.length; i++) value[4 + i] = addrBytes[i] ^ xorKey[i]
  const message = Buffer.alloc(HEADER_BYTES + 4 + value.length + 8)
  message.writeUInt16BE(BINDING_SUCCESS, 0)
  message.writeUInt16BE(message.length - HEADER_BYTES, 2)
  message.writeUInt32BE(MAGIC_COOKIE, 4)
  Buffer.from(transactionId).copy(message, 8)
  message.writeUInt16BE(ATTR_XOR_MAPPED_ADDRESS, HEADER_BYTES)
  message.writeUInt16BE(value.length, HEADER_BYTES + 2)
  value.copy(message, HEADER_BYTES + 4)
  const fpAt = HEADER_BYTES + 4 + value.length
  message.writeUInt16BE(ATTR_FINGERPRINT, fpAt)
  message.writeUInt16BE(4, fpAt + 2)
  message.writeUInt32BE(fingerprint(message.subarray(0, fpAt)), fpAt + 4)
  return message
}

/** The 16 bytes of an IPv6 address (with :: and an embedded IPv4 tail). */
function ipv6Bytes(address: string): Buffer {
  let text = address.split('%')[0]
  const v4 = /(\d+\.\d+\.\d+\.\d+)$/.exec(text)
  if (v4) {
    const o = v4[1].split('.').map(Number)
    text = text.slice(0, -v4[1].length) + `${((o[0] << 8) | o[1]).toString(16)}:${((o[2] << 8) | o[3]).toString(16)}`
  }
  const [head, tail] = text.includes('::') ? text.split('::') : [text, undefined]
  const headParts = head ? head.split(':') : []
  const tailParts = tail ? tail.split(':') : []
  const groups = tail === undefined ? headParts : [...headParts, ...Array(8 - headParts.length - tailParts.length).fill('0'), ...tailParts]
  const out = Buffer.alloc(16)
  groups.forEach((g, i) => out.writeUInt16BE(parseInt(g, 16), i * 2))
  return out
}

/** Reads the XOR-MAPPED-ADDRESS of a Binding success response (for our own checks and tests); undefined when it is not one. */
export function decodeBindingSuccess(packet: Uint8Array, transactionId: Uint8Array): {address: string; port: number} | undefined {
  const bytes = Buffer.from(packet.buffer, packet.byteOffset, packet.byteLength)
  if (bytes.length < HEADER_BYTES || bytes.readUInt16BE(0) !== BINDING_SUCCESS || bytes.readUInt32BE(4) !== MAGIC_COOKIE) return undefined
  if (!bytes.subarray(8, HEADER_BYTES).equals(Buffer.from(transactionId))) return undefined
  let at = HEADER_BYTES
  while (at + 4 <= bytes.length) {
    const type = bytes.readUInt16BE(at)
    const length = bytes.readUInt16BE(at + 2)
    if (at + 4 + length > bytes.length) return undefined
    if (type === ATTR_XOR_MAPPED_ADDRESS && (length === 8 || length === 20)) {
      const port = bytes.readUInt16BE(at + 6) ^ (MAGIC_COOKIE >>> 16)
      const key = Buffer.concat([Buffer.from([0x21, 0x12, 0xa4, 0x42]), Buffer.from(transactionId)])
      const raw = bytes.subarray(at + 8, at + 4 + length)
      const addr = Buffer.from(raw.map((b, i) => b ^ key[i]))
      if (length === 8) return {address: [...addr].join('.'), port}
      const groups: string[] = []
      for (let i = 0; i < 16; i += 2) groups.push(addr.readUInt16BE(i).toString(16))
      return {address: groups.join(':'), port}
    }
    at += 4 + Math.ceil(length / 4) * 4
  }
  return undefined
}

interface StunServerOptions {
  /** UDP port (0: any free one). */
  port: number
  /** Address to bind; default every IPv4 interface. */
  host?: string
  /** Answers per second to one source address (default DEFAULT_STUN_RATE_PER_SECOND). */
  ratePerSecond?: number
  log?: EventLog
}

/** The STUN server on one UDP socket: see the comment at the top. */
export class StunServer {
  /** Datagrams answered, and dropped (not a Binding request, or over the source's rate). */
  answered = 0
  dropped = 0
  private readonly buckets = new Map<string, {tokens: number; at: number}>()

  private constructor(
    private readonly socket: dgram.Socket,
    private readonly ratePerSecond: number,
  ) {}

  static async start(options: StunServerOptions): Promise<StunServer> {
    const host = options.host ?? '0.0.0.0'
    const socket = dgram.createSocket({type: host.includes(':') ? 'udp6' : 'udp4'})
    const server = new StunServer(socket, options.ratePerSecond ?? DEFAULT_STUN_RATE_PER_SECOND)
    socket.on('message', (packet, from) => server.onPacket(packet, from))
    // A send error (an ICMP error for an earlier answer) is no reason to stop serving.
    socket.on('error', (error) => options.log?.({event: 'stun_error', reason: errorMessage(error)}))
    await new Promise<void>((resolve, reject) => {
      socket.once('error', reject)
      socket.bind(options.port, host, () => {
        socket.off('error', reject)
        resolve()
      })
    }).catch((error) => {
      socket.close()
      throw new PsycheError(`cannot serve STUN on UDP ${host}:${options.port}: ${errorMessage(error)}`, {cause: error})
    })
    return server
  }

  /** The UDP port we answer on. */
  get port(): number {
    return this.socket.address().port
  }

  private onPacket(packet: Buffer, from: dgram.RemoteInfo): void {
    const request = decodeBindingRequest(packet)
    if (!request.ok || !this.take(from.address)) {
      this.dropped++
      return
    }
    this.answered++
    this.socket.send(encodeBindingSuccess(request.transactionId, from.address, from.port), from.port, from.address)
  }

  /** One answer's worth of this source's token bucket (ratePerSecond a second, as many at once). */
  private take(source: string): boolean {
    const now = Date.now()
    let bucket = this.buckets.get(source)
    if (!bucket) {
      if (this.buckets.size >= MAX_TRACKED_SOURCES) this.buckets.clear()
      this.buckets.set(source, (bucket = {tokens: this.ratePerSecond, at: now}))
    }
    bucket.tokens = Math.min(this.ratePerSecond, bucket.tokens + ((now - bucket.at) / 1000) * this.ratePerSecond)
    bucket.at = now
    if (bucket.tokens < 1) return false
    bucket.tokens -= 1
    return true
  }

  async stop(): Promise<void> {
    await new Promise<void>((resolve) => this.socket.close(() => resolve()))
  }
}

/**
 * Where a relay's STUN server listens, asked over libp2p by its clients (webrtc.ts): one JSON frame {"port": N},
 * the host being the address the client reached the relay at.
 */
export const STUN_INFO_PROTOCOL = '/psyche/stun/1'

export function encodeStunInfo(port: number): Uint8Array {
  return new TextEncoder().encode(JSON.stringify({port}))
}

/** The port of a /psyche/stun/1 answer; throws on anything but {"port": 1..65535}. */
export function decodeStunInfo(frame: Uint8Array): number {
  let value: unknown
  try {
    value = JSON.parse(new TextDecoder('utf-8', {fatal: true}).decode(frame))
  } catch {
    throw new Error('the STUN info is not JSON')
  }
  const port = (value as {port?: unknown} | null)?.port
  if (typeof port !== 'number' || !Number.isInteger(port) || port < 1 || port > 65535) throw new Error('the STUN info has no port')
  return port
}
