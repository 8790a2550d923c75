import {Flags} from '@oclif/core'
import {listenAddrsForPort, parseMultiaddrs} from '../p2p/addresses.js'
import {DEFAULT_RELAY_LIMITS, type RelayLimits} from '../p2p/relay.js'
import {DEFAULT_STUN_RATE_PER_SECOND} from '../p2p/stun.js'

/** The circuit relay's flags, shared by `psyche server run` (its built-in relay) and `psyche relay`. */
export const relayFlags = {
  'relay-port': Flags.integer({
    summary: 'TCP port of the circuit relay (libp2p), on every interface, and the same UDP port for its QUIC (default: any free ports)',
    min: 0,
    max: 65535,
  }),
  'relay-quic': Flags.boolean({
    summary: 'the relay listens on QUIC (UDP) beside TCP, tells clients both, and its dial-back checks their QUIC addresses; --no-relay-quic for TCP only',
    default: true,
    allowNo: true,
  }),
  'relay-listen': Flags.string({summary: "the relay's listen multiaddr(s) instead of every interface (e.g. /ip4/0.0.0.0/tcp/4001)", multiple: true, exclusive: ['relay-port']}),
  'relay-announce': Flags.string({summary: 'give clients these relay multiaddr(s) (a public address in front of a private one)', multiple: true}),
  'relay-max-reservations': Flags.integer({summary: 'clients behind NAT the relay holds a slot for at once', default: DEFAULT_RELAY_LIMITS.maxReservations, min: 1}),
  'relay-data-limit-mb': Flags.integer({
    summary: 'MiB one relayed connection may carry before it is reset (results, and whole models for rejoining clients)',
    default: Number(DEFAULT_RELAY_LIMITS.dataLimitBytes / 1024n / 1024n),
    min: 1,
  }),
  'relay-duration-limit-s': Flags.integer({
    summary: 'seconds one relayed connection may stay open before it is reset (peers then dial again)',
    default: DEFAULT_RELAY_LIMITS.durationLimitMs / 1000,
    min: 10,
  }),
  'relay-reservation-ttl-s': Flags.integer({
    summary: 'seconds a reservation lasts before the client must refresh it (libp2p refreshes on its own)',
    default: DEFAULT_RELAY_LIMITS.reservationTtlMs / 1000,
    min: 60,
  }),
  'relay-stun': Flags.boolean({
    summary: 'serve STUN beside the relay, so that clients learn their NAT mappings for WebRTC from it (--no-relay-stun: none)',
    default: true,
    allowNo: true,
  }),
  'stun-port': Flags.integer({summary: "UDP port of the relay's STUN server (default: any free port; clients ask the relay for it)", min: 0, max: 65535}),
  'stun-rate': Flags.integer({summary: 'STUN answers per second to one source address (more are dropped)', default: DEFAULT_STUN_RATE_PER_SECOND, min: 1}),
}

interface RelayFlagValues {
  'relay-port'?: number
  'relay-quic': boolean
  'relay-listen'?: string[]
  'relay-announce'?: string[]
  'relay-max-reservations': number
  'relay-data-limit-mb': number
  'relay-duration-limit-s': number
  'relay-reservation-ttl-s': number
  'relay-stun': boolean
  'stun-port'?: number
  'stun-rate': number
}

export function relayOptionsFromFlags(
  flags: RelayFlagValues,
  defaultHost = '0.0.0.0',
): {listen: string[]; quic: boolean; announce?: string[]; limits: RelayLimits; stun: {port: number; ratePerSecond: number} | false} {
  const listen = flags['relay-listen']
    ? parseMultiaddrs(flags['relay-listen'], '--relay-listen')
    : defaultHost === '0.0.0.0'
      ? listenAddrsForPort(flags['relay-port'])
      : [`/${defaultHost.includes(':') ? 'ip6' : 'ip4'}/${defaultHost}/tcp/${flags['relay-port'] ?? 0}`]
  return {
    listen,
    quic: flags['relay-quic'],
    stun: flags['relay-stun'] ? {port: flags['stun-port'] ?? 0, ratePerSecond: flags['stun-rate']} : false,
    announce: flags['relay-announce'] ? parseMultiaddrs(flags['relay-announce'], '--relay-announce') : undefined,
    limits: {
      maxReservations: flags['relay-max-reservations'],
      dataLimitBytes: BigInt(flags['relay-data-limit-mb']) * 1024n * 1024n,
      durationLimitMs: flags['relay-duration-limit-s'] * 1000,
      reservationTtlMs: flags['relay-reservation-ttl-s'] * 1000,
    },
  }
}
