import net from 'node:net'
import type {Logger} from '@libp2p/interface'
import {AbstractMultiaddrConnection} from '@libp2p/utils'
import type {Multiaddr} from '@multiformats/multiaddr'
import {setTimeout as sleep} from 'node:timers/promises'
import {anySignal, deadline} from './util.js'

// TCP sockets for hole punching: dialled from a chosen local port (so a port-preserving NAT maps every dial from it
// the same way), retried until the other side's dial crosses ours (TCP simultaneous open), then handed to libp2p's
// upgrader as a MultiaddrConnection.

/** One TCP dial from `localPort` (0: any), resolved with the socket or the error. */
export function dialFrom(host: string, port: number, localPort: number, signal: AbortSignal): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    if (signal.aborted) return reject(signal.reason as Error)
    // A local address makes Node bind before connecting, and libuv binds TCP sockets with SO_REUSEADDR: several
    // sockets (one per peer, and sockets in TIME_WAIT) may then share the punch port.
    const socket = net.connect({host, port, localAddress: net.isIPv6(host) ? '::' : '0.0.0.0', localPort})
    const onAbort = (): void => {
      socket.destroy()
      reject(signal.reason as Error)
    }
    signal.addEventListener('abort', onAbort, {once: true})
    socket.once('connect', () => {
      signal.removeEventListener('abort', onAbort)
      resolve(socket)
    })
    socket.once('error', (error) => {
      signal.removeEventListener('abort', onAbort)
      socket.destroy()
      reject(error)
    })
  })
}

interface PunchOutcome {
  socket?: net.Socket
  attempts: number
  /** The last dial's error when no dial succeeded. */
  lastError?: string
}

/**
 * Dials host:port from localPort again and again until one dial connects or `windowMs` passes. Before the other
 * side's packets have opened its NAT, its router refuses our SYN (RST) or drops it; once both sides dial at about
 * the same time, the SYNs cross and each NAT lets the other's in (TCP simultaneous open). One dial at a time, at
 * most one every `retryMs`: a peer that gives a third party's address makes us send at most windowMs / retryMs SYNs.
 */
export async function punchTcp(host: string, port: number, localPort: number, options: {windowMs: number; retryMs: number; signal?: AbortSignal}): Promise<PunchOutcome> {
  const end = Date.now() + options.windowMs
  let attempts = 0
  let lastError: string | undefined
  while (Date.now() < end && !options.signal?.aborted) {
    attempts++
    const started = Date.now()
    const timeout = deadline(Math.max(1, end - started))
    try {
      const socket = await dialFrom(host, port, localPort, options.signal ? anySignal(timeout, options.signal) : timeout)
      return {socket, attempts}
    } catch (error) {
      lastError = (error as NodeJS.ErrnoException).code ?? (error as Error).message
    }
    const wait = options.retryMs - (Date.now() - started)
    if (wait > 0) await sleep(wait)
  }
  return {attempts, lastError}
}

/** A connected TCP socket as libp2p's MultiaddrConnection (what a transport gives the upgrader). */
class SocketConnection extends AbstractMultiaddrConnection {
  constructor(
    private readonly socket: net.Socket,
    remoteAddr: Multiaddr,
    direction: 'inbound' | 'outbound',
    log: Logger,
  ) {
    super({remoteAddr, direction, log})
    socket.on('data', (data: Buffer) => this.onData(data))
    socket.on('error', (error) => this.abort(error))
    socket.on('drain', () => this.safeDispatchEvent('drain'))
    socket.once('close', (hadError) => (hadError ? this.abort(new Error('TCP transmission error')) : this.onTransportClosed()))
    // As @libp2p/tcp: an idle connection is closed after 2 minutes (yamux keeps a live one busy with pings).
    socket.setTimeout(2 * 60 * 1000)
    socket.once('timeout', () => this.abort(new Error('TCP connection idle for 2 minutes')))
    socket.setNoDelay(true)
  }

  sendData(data: Parameters<AbstractMultiaddrConnection['sendData']>[0]): {sentBytes: number; canSendMore: boolean} {
    let sentBytes = 0
    let canSendMore = true
    for (const chunk of data) {
      sentBytes += chunk.byteLength
      canSendMore = this.socket.write(chunk)
      if (!canSendMore) break
    }
    return {sentBytes, canSendMore}
  }

  async sendClose(): Promise<void> {
    if (this.socket.destroyed) return
    await new Promise<void>((resolve) => {
      this.socket.once('close', () => resolve())
      this.socket.destroySoon()
    })
  }

  sendReset(): void {
    if (this.socket.writableEnded) this.socket.destroy()
    else this.socket.resetAndDestroy()
  }

  sendPause(): void {
    this.socket.pause()
  }

  sendResume(): void {
    this.socket.resume()
  }
}

export function socketConnection(socket: net.Socket, remoteAddr: Multiaddr, direction: 'inbound' | 'outbound', log: Logger): AbstractMultiaddrConnection {
  return new SocketConnection(socket, remoteAddr, direction, log)
}
