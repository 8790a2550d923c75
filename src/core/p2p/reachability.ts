import type {PeerId, Startable} from '@libp2p/interface'
import type {AddressManager, ConnectionManager, TransportManager} from '@libp2p/interface-internal'
import {peerIdFromString} from '@libp2p/peer-id'
import {multiaddr, type Multiaddr} from '@multiformats/multiaddr'
import {errorMessage} from '../errors.js'
import {addrPeerId, isCircuit, publishableAddrs} from './addresses.js'
import {CONFIRMED_TTL_MS} from './internals.js'
import {askDialback} from './dialback-service.js'
import type {PeerDialer} from './dialer.js'
import type {EventLog} from '../events.js'

export type ReachabilityState = 'unknown' | 'public' | 'relayed'

interface ReachabilityInit {
  /** Circuit relay v2 on: reserve a slot on a relay when its dial-back finds us unreachable. */
  relay: boolean
  /** --p2p-announce: exactly the announced direct addresses are ours. */
  announced: boolean
  log: EventLog
}

interface ReachabilityComponents {
  peerId: PeerId
  connectionManager: ConnectionManager
  transportManager: TransportManager
  addressManager: AddressManager
  dialer: PeerDialer
}

/**
 * Are we reachable at our direct addresses, or do we need a relay slot? Decided once, by the first relay that can
 * dial us back (see dialback.ts). A libp2p service: see `reachability()`.
 */
export class Reachability implements Startable {
  private state: ReachabilityState = 'unknown'
  private deciding: Promise<void> | undefined
  private stopped = false

  constructor(
    private readonly components: ReachabilityComponents,
    private readonly init: ReachabilityInit,
  ) {}

  start(): void {
    this.stopped = false
  }

  beforeStop(): void {
    this.stopped = true
  }

  stop(): void {
    this.stopped = true
  }

  /**
   * Connects to relays (multiaddrs ending in /p2p/<relay id>) and decides whether we need one (see dialback.ts):
   * the first relay we reach dials our direct addresses back. If one answers, we are reachable and reserve nothing
   * ({event: 'reachability', reachable: true}); if none does (behind NAT), or the relay cannot tell, we reserve a
   * slot on it, and our relayed address joins the published ones. Called again after a reconnect: a held
   * reservation or a reachable verdict is kept.
   */
  async useRelays(addrs: string[]): Promise<void> {
    await this.components.dialer.connect(addrs)
    if (!this.init.relay || this.stopped) return
    this.deciding ??= this.decide(addrs).finally(() => (this.deciding = undefined))
    await this.deciding
  }

  /** 'public': a relay reached us at a direct address; 'relayed': we hold (or asked for) a reservation. */
  reachability(): ReachabilityState {
    return this.state
  }

  /**
   * Multiaddrs to publish to the coordinator, each ending in /p2p/<peerId>: only addresses a remote peer can use
   * (see publishableAddrs), direct ones before relayed ones.
   */
  addresses(): string[] {
    const ours = `/p2p/${this.components.peerId.toString()}`
    // libp2p's announced addresses leave out a public interface address until something confirmed it (see
    // internals.ts); peers are told it anyway, as they are told a private one: they dial direct addresses briefly
    // before relayed ones. With --p2p-announce, only relayed addresses join the announced ones.
    const transport = this.components.transportManager.getAddrs()
    const candidates = [...this.components.addressManager.getAddresses(), ...(this.init.announced ? transport.filter(isCircuit) : transport)]
    const unique = new Map<string, Multiaddr>()
    for (const a of candidates) {
      const text = a.toString()
      const key = text.endsWith(ours) ? text.slice(0, -ours.length) : text
      if (!unique.has(key)) unique.set(key, a)
    }
    return publishableAddrs([...unique.values()]).map((a) => (a.endsWith(ours) ? a : `${a}${ours}`))
  }

  /** Our relayed addresses (held reservations), for logs and tests. */
  relayedAddresses(): string[] {
    return this.components.addressManager
      .getAddresses()
      .filter(isCircuit)
      .map((a) => a.toString())
  }

  private async decide(relayAddrs: string[]): Promise<void> {
    if (this.state !== 'unknown') return
    const log = this.init.log
    for (const addr of relayAddrs) {
      let relayAddr: Multiaddr
      try {
        relayAddr = multiaddr(addr)
      } catch {
        continue
      }
      const relayPeer = addrPeerId(relayAddr)
      if (relayPeer === undefined || isCircuit(relayAddr)) continue
      const connection = this.components.connectionManager.getConnections(peerIdFromString(relayPeer)).find((c) => c.status === 'open' && !isCircuit(c.remoteAddr))
      if (!connection) continue
      const asked = this.addresses().filter((a) => !isCircuit(multiaddr(a)))
      let verdict: {reachable: string[]; checked: string[]} | undefined
      let reason = ''
      try {
        verdict = await askDialback(connection, asked)
      } catch (error) {
        reason = `the relay could not check (${errorMessage(error)})`
      }
      if (verdict && verdict.reachable.length > 0) {
        this.state = 'public'
        // Confirmed: libp2p now announces them too (identify).
        for (const a of verdict.reachable) this.components.addressManager.confirmObservedAddr(multiaddr(a).decapsulateCode(421), {type: 'transport', ttl: CONFIRMED_TTL_MS})
        log({event: 'reachability', reachable: true, via: relayPeer, addrs: verdict.reachable})
        return
      }
      log({
        event: 'reachability',
        reachable: false,
        via: relayPeer,
        reason: reason || (verdict!.checked.length === 0 ? 'no direct address on the IP our connection comes from (behind NAT)' : 'no direct address answered'),
      })
      try {
        // The circuit relay transport listens on the relay: it reserves a slot there.
        await this.components.transportManager.listen([relayAddr.encapsulate('/p2p-circuit')])
        this.state = 'relayed'
        return
      } catch (error) {
        log({event: 'reservation_failed', relay: addr, reason: errorMessage(error)})
      }
    }
  }
}

/** Reachability as a libp2p service (`services: {reachability: reachability({relay, log})}`), after the dialer. */
export function reachability(init: ReachabilityInit): (components: ReachabilityComponents) => Reachability {
  return (components) => new Reachability(components, init)
}
