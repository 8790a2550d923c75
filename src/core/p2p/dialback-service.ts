import type {Connection, Startable, Stream} from '@libp2p/interface'
import type {ConnectionManager, Registrar} from '@libp2p/interface-internal'
import {errorMessage} from '../errors.js'
import {DIALBACK_DIAL_TIMEOUT_MS, DIALBACK_PROTOCOL, dialbackTargets, hostOf, MAX_DIALBACK_ADDRS, MAX_DIALBACK_REQUEST_BYTES, parseDialbackResponse} from './dialback.js'
import {framed, readJsonObject, writeJson} from './framing.js'
import {abortStream, deadline} from './util.js'
import type {EventLog} from '../events.js'

// The two sides of the dial-back protocol (see dialback.ts): the relay's server, a libp2p service, and the
// client's request.

interface DialbackServerInit {
  log: EventLog
  /** Whom to answer, by libp2p peer id (default: anyone); a refused peer's stream is reset. */
  admit?: (peerId: string) => boolean
}

interface DialbackServerComponents {
  registrar: Registrar
  connectionManager: ConnectionManager
}

/** The relay's side: answers /psyche/dialback/1 requests. */
export class DialbackServer implements Startable {
  constructor(
    private readonly components: DialbackServerComponents,
    private readonly init: DialbackServerInit,
  ) {}

  async start(): Promise<void> {
    await this.components.registrar.handle(DIALBACK_PROTOCOL, (stream, connection) => this.serve(stream, connection), {maxInboundStreams: 2})
  }

  async stop(): Promise<void> {
    await this.components.registrar.unhandle(DIALBACK_PROTOCOL)
  }

  /**
   * Answers a client's dial-back request (see dialback.ts): dials the addresses it gives on the IP its connection
   * comes from, each once, on a new connection, and says which answered as that client.
   */
  private async serve(stream: Stream, connection: Connection): Promise<void> {
    const log = this.init.log
    const signal = AbortSignal.timeout(4 * DIALBACK_DIAL_TIMEOUT_MS)
    const client = connection.remotePeer.toString()
    if (this.init.admit && !this.init.admit(client)) return abortStream(stream, new Error('not a member of the run'))
    try {
      const lp = framed(stream, MAX_DIALBACK_REQUEST_BYTES)
      const request = await readJsonObject(lp, 'dial-back request', {signal})
      const selection = dialbackTargets(request, connection.limits === undefined ? hostOf(connection.remoteAddr) : undefined, client)
      if (!selection.ok) {
        await writeJson(lp, {status: 'error', reason: selection.reason}, {signal})
        await stream.close({signal})
        return
      }
      const reachable: string[] = []
      // One after another (libp2p joins a second dial to the same peer onto the first, so a QUIC and a TCP dial at once
      // would both report the first's connection); each bounded by DIALBACK_DIAL_TIMEOUT_MS, all by `signal`.
      for (const target of selection.targets) {
        if (signal.aborted) break
        try {
          // force: a new connection to that address, not the one the request came over (priority as libp2p.dial).
          const back = await this.components.connectionManager.openConnection(target, {priority: 75, force: true, signal: AbortSignal.timeout(DIALBACK_DIAL_TIMEOUT_MS)})
          if (back.remotePeer.toString() === client) reachable.push(target.toString())
          await back.close().catch(() => {})
        } catch {
          // unreachable at that address
        }
      }
      log({event: 'dialback', peer_id: client, checked: selection.targets.map((t) => t.toString()), reachable})
      await writeJson(lp, {status: 'ok', reachable, checked: selection.targets.map((t) => t.toString())}, {signal})
      await stream.close({signal})
    } catch (error) {
      log({event: 'dialback_failed', peer_id: client, reason: errorMessage(error)})
      abortStream(stream, error)
    }
  }
}

/** The relay's dial-back server as a libp2p service (`services: {dialback: dialbackServer({log})}`). */
export function dialbackServer(init: DialbackServerInit): (components: DialbackServerComponents) => DialbackServer {
  return (components) => new DialbackServer(components, init)
}

/** The client's side: asks the relay at the other end of `connection` to dial these addresses of ours back. */
export async function askDialback(connection: Connection, addrs: string[]): Promise<{reachable: string[]; checked: string[]}> {
  const signal = deadline(4 * DIALBACK_DIAL_TIMEOUT_MS)
  const stream = await connection.newStream(DIALBACK_PROTOCOL, {signal})
  try {
    const lp = framed(stream, MAX_DIALBACK_REQUEST_BYTES)
    await writeJson(lp, {addrs: addrs.slice(0, MAX_DIALBACK_ADDRS)}, {signal})
    const response = await readJsonObject(lp, 'dial-back response', {signal})
    if (response.status !== 'ok') throw new Error(`refused: ${String(response.reason ?? response.status).slice(0, 200)}`)
    await stream.close({signal}).catch(() => {})
    return parseDialbackResponse(response, addrs)
  } catch (error) {
    abortStream(stream, error)
    throw error
  }
}
