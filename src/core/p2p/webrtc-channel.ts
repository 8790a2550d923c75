import type {Logger} from '@libp2p/interface'
import {AbstractMultiaddrConnection} from '@libp2p/utils'
import type {Multiaddr} from '@multiformats/multiaddr'
import type {DataChannel} from 'node-datachannel'

// One WebRTC data channel as a byte stream for libp2p's upgrader (as punch-socket.ts does for a punched TCP socket):
// noise then authenticates the peer over it and yamux multiplexes the exchanges' streams on it, so a WebRTC
// connection is a libp2p connection like any other (its stream and window limits are yamux's).

/** Bytes handed to the data channel in one message (SCTP messages; well under any peer's max-message-size). */
const SEND_MESSAGE_BYTES = 16 * 1024
/** Stop writing while this much is queued in the channel, and go on once it drained below DRAIN_BYTES. */
const HIGH_WATER_BYTES = 1024 * 1024
const DRAIN_BYTES = 256 * 1024

class DataChannelConnection extends AbstractMultiaddrConnection {
  constructor(
    private readonly channel: DataChannel,
    private readonly closePeer: () => void,
    remoteAddr: Multiaddr,
    direction: 'inbound' | 'outbound',
    log: Logger,
    maxMessageBytes: number,
  ) {
    super({remoteAddr, direction, log, maxMessageSize: SEND_MESSAGE_BYTES})
    // The native library calls these from its own threads through the event loop: none may throw.
    channel.onMessage((message) => {
      try {
        if (typeof message === 'string') return this.abort(new Error('the peer sent a text message on the data channel'))
        const bytes = message instanceof ArrayBuffer ? new Uint8Array(message) : new Uint8Array(message.buffer, message.byteOffset, message.byteLength)
        if (bytes.byteLength > maxMessageBytes)
          return this.abort(new Error(`the peer sent a ${bytes.byteLength}-byte message (at most ${maxMessageBytes}: --webrtc-max-message-kib)`))
        this.onData(bytes)
      } catch (error) {
        this.abort(error instanceof Error ? error : new Error(String(error)))
      }
    })
    channel.onClosed(() => {
      try {
        this.onTransportClosed()
      } catch {
        // already closed
      }
    })
    channel.onError((reason) => this.abort(new Error(`data channel: ${reason}`)))
    channel.setBufferedAmountLowThreshold(DRAIN_BYTES)
    channel.onBufferedAmountLow(() => this.safeDispatchEvent('drain'))
  }

  sendData(data: Parameters<AbstractMultiaddrConnection['sendData']>[0]): {sentBytes: number; canSendMore: boolean} {
    const bytes = data.subarray()
    try {
      this.channel.sendMessageBinary(bytes)
      return {sentBytes: bytes.byteLength, canSendMore: this.channel.bufferedAmount() < HIGH_WATER_BYTES}
    } catch (error) {
      // The channel closed under us: the connection ends here.
      this.abort(error instanceof Error ? error : new Error(String(error)))
      return {sentBytes: bytes.byteLength, canSendMore: false}
    }
  }

  async sendClose(): Promise<void> {
    this.shut()
  }

  sendReset(): void {
    this.shut()
  }

  // A data channel cannot ask its peer to pause; yamux's stream windows bound what it sends meanwhile.
  sendPause(): void {}

  sendResume(): void {}

  private shut(): void {
    try {
      if (this.channel.isOpen()) this.channel.close()
    } catch {
      // already closed
    }
    this.closePeer()
  }
}

/** An open data channel as libp2p's MultiaddrConnection; `closePeer` closes its peer connection with it. */
export function dataChannelConnection(
  channel: DataChannel,
  closePeer: () => void,
  remoteAddr: Multiaddr,
  direction: 'inbound' | 'outbound',
  log: Logger,
  maxMessageBytes: number,
): AbstractMultiaddrConnection {
  return new DataChannelConnection(channel, closePeer, remoteAddr, direction, log, maxMessageBytes)
}
