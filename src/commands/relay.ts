import {Flags} from '@oclif/core'
import {PsycheCommand} from '../core/cli/base-command.js'
import {relayFlags, relayOptionsFromFlags} from '../core/cli/relay-flags.js'
import {RelayNode} from '../core/p2p/relay.js'
import {generateIdentity, loadIdentity} from '../core/protocol/identity.js'
import type {PsycheEvent} from '../core/events.js'

export default class Relay extends PsycheCommand {
  static summary = 'Run a standalone libp2p circuit relay for clients behind NAT'
  static description = `A libp2p circuit relay v2 (@libp2p/circuit-relay-v2) with identify and psyche's dial-back check, on a host every client can reach.
Clients pass one of the printed addresses to \`psyche join --relay\`: each reserves a slot and is reached through
it when no direct connection works; WebRTC (UDP) and then TCP hole punching upgrade to a direct connection where
the NATs allow it. It also serves STUN on a UDP port (--stun-port), from which clients learn their NAT mappings.
\`psyche server run\` already runs one next to the coordinator; use this one for a second relay, or when the
coordinator is elsewhere (e.g. on Solana). Runs until SIGINT/SIGTERM.

--json prints one JSON object per line; the first is {"event":"relay_listening","peer_id","port","quic_port","stun_port","addrs",...}.`

  static examples = [
    '<%= config.bin %> relay --relay-port 4001 --identity relay.json',
    '<%= config.bin %> relay --relay-port 4001 --relay-announce /ip4/203.0.113.7/tcp/4001 --json',
  ]

  static flags = {
    identity: Flags.string({summary: "identity file (psyche identity new): keeps the relay's peer id across restarts; default a random one"}),
    ...relayFlags,
  }

  async run(): Promise<void> {
    const {flags} = await this.parse(Relay)
    const identity = flags.identity ? await loadIdentity(flags.identity) : generateIdentity()
    const json = this.jsonEnabled()
    const log = (event: PsycheEvent) => {
      if (json) process.stdout.write(`${JSON.stringify({...event, time: new Date().toISOString()})}\n`)
      else if (event.event === 'relay_reservation') process.stderr.write(`reservation: ${event.peer_id} from ${event.addr}\n`)
    }
    const relay = await RelayNode.start({identity, ...relayOptionsFromFlags(flags), log})
    const addrs = relay.addressFor(undefined)
    log({
      event: 'relay_listening',
      peer_id: relay.peerId,
      port: relay.port,
      quic_port: relay.quicPort,
      stun_port: relay.stunPort,
      addrs,
      max_reservations: relay.limits.maxReservations,
      data_limit_bytes: Number(relay.limits.dataLimitBytes),
      duration_limit_ms: relay.limits.durationLimitMs,
    })
    if (!json) {
      process.stdout.write(
        `relay ${relay.peerId} listening on TCP port ${relay.port}${relay.quicPort ? ` and UDP port ${relay.quicPort} (QUIC)` : ''}${relay.stunPort ? `, STUN on UDP port ${relay.stunPort}` : ''}\n`,
      )
      process.stdout.write(`clients join with one of:\n${(addrs.length ? addrs : relay.addresses()).map((a) => `  --relay ${a}`).join('\n')}\n`)
    }
    await this.shutdown.requested()
    await relay.stop()
  }
}
