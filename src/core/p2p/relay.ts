import './polyfill.js'
import {noise} from '@chainsafe/libp2p-noise'
import {circuitRelayServer, type CircuitRelayService} from '@libp2p/circuit-relay-v2'
import {generateKeyPairFromSeed} from '@libp2p/crypto/keys'
import type {Listener, Startable} from '@libp2p/interface'
import type {AddressManager, TransportManager} from '@libp2p/interface-internal'
import {identify} from '@libp2p/identify'
import {multiaddr, type Multiaddr} from '@multiformats/multiaddr'
import {createLibp2p, type Libp2p} from 'libp2p'
import {PsycheError, errorMessage} from '../errors.js'
import {identityPrivateSeed} from '../primitives/identity.js'
import type {SigningIdentity} from '../primitives/announcement.js'
import {addressScope, isCircuit, listenAddrsForPort} from './addresses.js'
import {dialbackServer, type DialbackServer} from './dialback-service.js'
import {CONFIRMED_TTL_MS} from './internals.js'
import {encodeStunInfo, StunServer, STUN_INFO_PROTOCOL} from './stun.js'
import {framed} from './framing.js'
import {safeYamux} from './muxer.js'
import {defaultTransports, isQuicAddr, withQuicListen} from './transports.js'
import {abortStream, deadline, type Libp2pEventTarget} from './util.js'
import type {EventLog} from '../events.js'

/**
 * What one relayed connection may carry before the relay resets it (the peers then dial again). Sized for
 * results (KiB to MiB per round) and a whole model for a rejoining client (the tiny demo is 6 MB, real runs GBs).
 */
export interface RelayLimits {
  /** Reservations held at once (one per client behind NAT); default 512. */
  maxReservations: number
  /** A reservation's lifetime before the client must refresh it (libp2p refreshes on its own); default 2 h. */
  reservationTtlMs: number
  /** Bytes through one relayed connection, each direction counted; default 4 GiB. */
  dataLimitBytes: bigint
  /** Lifetime of one relayed connection; default 1 h. */
  durationLimitMs: number
}

export const DEFAULT_RELAY_LIMITS: RelayLimits = {
  maxReservations: 512,
  reservationTtlMs: 2 * 60 * 60 * 1000,
  dataLimitBytes: 4n * 1024n * 1024n * 1024n,
  durationLimitMs: 60 * 60 * 1000,
}

interface RelayNodeOptions {
  identity: SigningIdentity
  /** default ['/ip4/0.0.0.0/tcp/0'] (and, with `quic`, a QUIC address beside each TCP one: see withQuicListen) */
  listen?: string[]
  /**
   * QUIC beside TCP (default true), as clients: the relay listens on UDP too (the same port number as TCP when one is
   * given), clients are told both addresses, and its dial-back checks clients' QUIC addresses too. False: TCP only.
   */
  quic?: boolean
  /** Addresses to give clients instead of our interface addresses (a public IP in front of a private one). */
  announce?: string[]
  limits?: Partial<RelayLimits>
  log?: EventLog
  /**
   * The peers the relay serves (reservations, relayed connections, dial-backs), by libp2p peer id: `psyche server
   * run` admits the run's members as its coordinator lists them. Default: every peer (`psyche relay` knows no run).
   */
  admit?: (peerId: string) => boolean
  /**
   * A STUN server beside the relay (stun.ts; default on, any free UDP port): clients learn their NAT mappings from it
   * for WebRTC, and ask the relay where it is (/psyche/stun/1). false: none.
   */
  stun?: {port: number; ratePerSecond?: number} | false
}

interface BoundAddressesComponents {
  transportManager: TransportManager
  addressManager: AddressManager
  events: Libp2pEventTarget
}

/**
 * The relay's bound addresses, as a libp2p service (its components are what libp2p gives every service): the
 * addresses its listeners are bound to (interface addresses, whatever the address manager thinks of them), and,
 * with `confirm`, each remote one confirmed as it starts listening (`transport:listening`). A relay is where clients
 * reach it: its interface addresses are its public ones, while libp2p announces a public address only once something
 * confirmed it, so reservations and identify would otherwise carry none (on a cloud VM, every address).
 */
class BoundAddresses implements Startable {
  private readonly onListening = (event: CustomEvent<Listener>): void => {
    for (const a of event.detail.getAddrs())
      if (addressScope(a) === 'remote' && !isCircuit(a)) this.components.addressManager.confirmObservedAddr(a, {type: 'transport', ttl: CONFIRMED_TTL_MS})
  }

  constructor(
    private readonly components: BoundAddressesComponents,
    private readonly confirm: boolean,
  ) {}

  start(): void {
    if (this.confirm) this.components.events.addEventListener('transport:listening', this.onListening)
  }

  stop(): void {
    this.components.events.removeEventListener('transport:listening', this.onListening)
  }

  /** The addresses our listeners are bound to now. */
  addrs(): Multiaddr[] {
    return this.components.transportManager.getAddrs()
  }
}

type RelayServices = {identify: ReturnType<ReturnType<typeof identify>>; relay: CircuitRelayService; dialback: DialbackServer; bound: BoundAddresses}

/**
 * A libp2p circuit relay v2 server (@libp2p/circuit-relay-v2): clients behind NAT reserve a slot on it and are
 * reached through it; it also answers psyche's dial-back requests (dialback.ts) and identify (telling clients their observed
 * address, which hole punching needs: punch.ts). `psyche server run` runs one next to the coordinator (the
 * coordinator's host is reachable by every client by definition); `psyche relay` runs one alone.
 */
export class RelayNode {
  readonly peerId: string
  private watch: NodeJS.Timeout | undefined
  private constructor(
    readonly libp2p: Libp2p<RelayServices>,
    readonly limits: RelayLimits,
    private readonly announce: string[],
    private readonly stun: StunServer | undefined,
  ) {
    this.peerId = libp2p.peerId.toString()
  }

  /** The UDP port of our STUN server; 0 without one. */
  get stunPort(): number {
    return this.stun?.port ?? 0
  }

  static async start(options: RelayNodeOptions): Promise<RelayNode> {
    const limits = {...DEFAULT_RELAY_LIMITS, ...options.limits}
    const log = options.log ?? (() => {})
    const admit = options.admit
    // A stranger gets no slot and no relayed connection; each refusal is logged.
    const refused = (peerId: string, what: string): boolean => {
      if (!admit || admit(peerId)) return false
      log({event: 'relay_refused', peer_id: peerId, what, reason: 'not a member of the run'})
      return true
    }
    const privateKey = await generateKeyPairFromSeed('Ed25519', identityPrivateSeed(options.identity))
    const quicOn = options.quic ?? true
    const baseListen = options.listen ?? listenAddrsForPort(undefined)
    const listen = quicOn ? withQuicListen(baseListen) : [...baseListen]
    let libp2p: Libp2p<RelayServices>
    try {
      libp2p = await createLibp2p<RelayServices>({
        privateKey,
        addresses: {listen, ...(options.announce?.length ? {announce: options.announce} : {})},
        // The connection bounds below (maxConnections, libp2p's inbound rate and pending-handshake limits) and the
        // gater hold for QUIC as for TCP: @chainsafe/libp2p-quic hands every inbound connection to libp2p's upgrader.
        transports: defaultTransports({quic: quicOn}),
        connectionEncrypters: [noise()],
        streamMuxers: [safeYamux((error) => log({event: 'muxer_abort_failed', reason: errorMessage(error)}))],
        connectionManager: {maxConnections: Math.max(300, limits.maxReservations * 2 + 64)},
        ...(admit
          ? {
              connectionGater: {
                denyInboundRelayReservation: async (peer) => refused(peer.toString(), 'reservation'),
                denyOutboundRelayedConnection: async (source, destination) =>
                  refused(source.toString(), 'relayed connection') || refused(destination.toString(), 'relayed connection'),
              },
            }
          : {}),
        services: {
          // Without --relay-announce, our interface addresses are confirmed as they are bound (see BoundAddresses).
          bound: (components: BoundAddressesComponents) => new BoundAddresses(components, !options.announce?.length),
          identify: identify(),
          // No AutoNAT (v1): asked to verify a peer it is already connected to, its server "dials" the existing
          // connection, finds the address differs and closes that connection — the client's only one to us.
          // Our dial-back (dialback.ts) answers the same question.
          dialback: dialbackServer({log, admit: (peerId) => !refused(peerId, 'dial-back')}),
          relay: circuitRelayServer({
            reservations: {
              maxReservations: limits.maxReservations,
              reservationTtl: limits.reservationTtlMs,
              applyDefaultLimit: true,
              defaultDataLimit: limits.dataLimitBytes,
              defaultDurationLimit: limits.durationLimitMs,
            },
            // A relayed connection per pair of NATed clients, a few streams each.
            maxInboundHopStreams: Math.max(64, limits.maxReservations),
            maxOutboundStopStreams: Math.max(300, limits.maxReservations),
          }),
        },
      })
    } catch (error) {
      throw new PsycheError(`cannot start the relay on ${listen.join(', ')}: ${errorMessage(error)}`, {cause: error})
    }
    let stun: StunServer | undefined
    if (options.stun !== false) {
      const host = /^\/ip[46]\/([^/]+)\//.exec(listen[0] ?? '')?.[1] ?? '0.0.0.0'
      try {
        stun = await StunServer.start({port: options.stun?.port ?? 0, host, ratePerSecond: options.stun?.ratePerSecond, log})
      } catch (error) {
        await libp2p.stop()
        throw error
      }
      const port = stun.port
      await libp2p.handle(
        STUN_INFO_PROTOCOL,
        async (stream, connection) => {
          if (refused(connection.remotePeer.toString(), 'STUN info')) return abortStream(stream, new Error('not a member of the run'))
          try {
            const signal = deadline(5_000)
            await framed(stream, 64).write(encodeStunInfo(port), {signal})
            await stream.close({signal})
          } catch (error) {
            abortStream(stream, error)
          }
        },
        {maxInboundStreams: 2},
      )
    }
    const node = new RelayNode(libp2p, limits, options.announce ?? [], stun)
    // The relay server emits no event for a reservation: its reservation table is watched instead (a peer and
    // its expiry: a refresh is logged again).
    const seen = new Map<string, number>()
    node.watch = setInterval(() => {
      const now = new Set<string>()
      for (const [peer, reservation] of libp2p.services.relay.reservations) {
        const id = peer.toString()
        now.add(id)
        if (seen.get(id) === reservation.expiry.getTime()) continue
        seen.set(id, reservation.expiry.getTime())
        log({event: 'relay_reservation', peer_id: id, addr: reservation.addr.toString(), expiry: reservation.expiry.toISOString()})
      }
      for (const id of seen.keys())
        if (!now.has(id)) {
          seen.delete(id)
          log({event: 'relay_reservation_ended', peer_id: id})
        }
    }, 500)
    node.watch.unref()
    return node
  }

  /** The addresses our listeners are bound to (interface addresses), whether or not libp2p announces them. */
  private transportAddrs(): Multiaddr[] {
    return this.libp2p.services.bound.addrs()
  }

  /** Our TCP port (the first TCP listener's, as bound). */
  get port(): number {
    return this.boundPort('tcp')
  }

  /** Our QUIC (UDP) port (the first QUIC listener's, as bound); 0 without QUIC. */
  get quicPort(): number {
    return this.boundPort('udp')
  }

  private boundPort(proto: 'tcp' | 'udp'): number {
    for (const a of this.transportAddrs()) {
      if (proto === 'udp' && !isQuicAddr(a)) continue
      const part = a.getComponents().find((c) => c.name === proto)
      if (part?.value) return Number(part.value)
    }
    return 0
  }

  /** Every address we listen on or announce, each ending in /p2p/<peer id>. */
  addresses(): string[] {
    const withId = (a: string) => (a.includes(`/p2p/${this.peerId}`) ? a : `${a}/p2p/${this.peerId}`)
    return [...new Set([...this.libp2p.getMultiaddrs(), ...this.transportAddrs()].map((a) => withId(a.toString())))]
  }

  /**
   * The relay's addresses as a client that reached us at `localAddress` (the address its TCP connection to the
   * coordinator arrived on) can use them: the same IP, the relay's TCP port and (with QUIC) its UDP port, QUIC first
   * (the client's dialer tries QUIC briefly, then TCP). Announced addresses, when configured, win.
   */
  addressFor(localAddress: string | undefined): string[] {
    const withId = (a: string) => (a.includes(`/p2p/${this.peerId}`) ? a : `${a}/p2p/${this.peerId}`)
    if (this.announce.length > 0) return this.announce.map(withId)
    if (localAddress === undefined || localAddress === '') {
      return [
        ...new Set(
          this.transportAddrs()
            .filter((a) => addressScope(a) === 'remote' && !isCircuit(a))
            .map((a) => withId(a.toString())),
        ),
      ]
    }
    const ip = localAddress.startsWith('::ffff:') ? localAddress.slice(7) : localAddress
    const family = ip.includes(':') ? 'ip6' : 'ip4'
    const quicPort = this.quicPort
    return [...(quicPort > 0 ? [withId(multiaddr(`/${family}/${ip}/udp/${quicPort}/quic-v1`).toString())] : []), withId(multiaddr(`/${family}/${ip}/tcp/${this.port}`).toString())]
  }

  /** Reservations held now. */
  reservations(): number {
    return this.libp2p.services.relay.reservations.size
  }

  async stop(): Promise<void> {
    clearInterval(this.watch)
    await Promise.all([this.libp2p.stop(), this.stun?.stop()])
  }
}
