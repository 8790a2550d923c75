import {createServer, connect, type AddressInfo, type Server, type Socket} from 'node:net'
import {PsycheError, errorMessage} from '../errors.js'
import {parseHostPort} from '../protocol/address.js'
import {effectiveMaxConnections} from '../descriptors.js'
import {checkVocab} from './batches.js'
import type {DataProvider, TokenFilesProvider} from './provider.js'
import {
  FrameDecoder,
  MAX_BATCH_IDS,
  MAX_REQUEST_BYTES,
  MAX_RESPONSE_BYTES,
  NO_REQUEST,
  WIRE_VERSION,
  decodeClientMessage,
  decodeServerMessage,
  encodeError,
  encodeGet,
  encodeHello,
  encodeInfo,
  encodeSamples,
  type ServerMessage,
} from './wire.js'

/** Requests one connection may have queued on the server; past it the server stops reading from that connection. */
const MAX_QUEUED_PER_CONNECTION = 8

/** Bounds of a data server against clients that connect too much or never read (flags of psyche data serve). */
export interface DataServerLimits {
  /** Connections open at once (lowered to what `ulimit -n` leaves room for). */
  maxConnections: number
  /** Connections open at once from one IP address. */
  maxConnectionsPerIp: number
  /** Response bytes queued for one connection before the server stops answering (and reading) until it drains: with 100
   * clients that never read, about 100 × (this + one answer) of memory. */
  maxUnsentBytes: number
  /** A connection whose queued responses do not drain for this long is closed. */
  stallTimeoutMs: number
}

export const DEFAULT_DATA_SERVER_LIMITS: DataServerLimits = {maxConnections: 1024, maxConnectionsPerIp: 64, maxUnsentBytes: 256 * 1024, stallTimeoutMs: 60_000}

/**
 * `psyche data serve`: serves the samples of one token directory (data.toml's layout and shuffle) to the
 * clients of a run. Every frame is size-bounded; a bad request gets an ERROR frame and the server carries on.
 */
export class DataServer {
  private readonly sockets = new Set<Socket>()
  private readonly perIp = new Map<string, number>()

  private constructor(
    private readonly server: Server,
    readonly provider: TokenFilesProvider,
    private readonly log: (line: string) => void,
    readonly limits: DataServerLimits,
  ) {
    server.on('connection', (socket) => this.accept(socket))
  }

  static async start(
    provider: TokenFilesProvider,
    options: {host?: string; port?: number; log?: (line: string) => void; limits?: Partial<DataServerLimits>} = {},
  ): Promise<DataServer> {
    const limits = {...DEFAULT_DATA_SERVER_LIMITS, ...options.limits}
    const log = options.log ?? (() => {})
    const connections = effectiveMaxConnections(limits.maxConnections, undefined, 'data server --max-connections')
    if (connections.lowered) log(connections.lowered)
    limits.maxConnections = connections.max
    const server = createServer()
    server.maxConnections = limits.maxConnections + 64
    const instance = new DataServer(server, provider, log, limits)
    await new Promise<void>((resolve, reject) => {
      server.once('error', (error: NodeJS.ErrnoException) =>
        reject(new PsycheError(`data server: cannot listen on ${options.host ?? '0.0.0.0'}:${options.port ?? 0} (${error.code ?? error.message})`)),
      )
      server.listen(options.port ?? 0, options.host ?? '0.0.0.0', () => resolve())
    })
    return instance
  }

  get port(): number {
    return (this.server.address() as AddressInfo).port
  }

  /** A new connection: refused with an ERROR frame naming the bound when the server is at one, else served. */
  private accept(socket: Socket): void {
    const ip = socket.remoteAddress ?? '?'
    const peer = `${socket.remoteAddress}:${socket.remotePort}`
    socket.on('error', () => {})
    const refusal =
      this.sockets.size >= this.limits.maxConnections
        ? `the data server holds ${this.limits.maxConnections} connections (--max-connections)`
        : (this.perIp.get(ip) ?? 0) >= this.limits.maxConnectionsPerIp
          ? `${ip} has ${this.limits.maxConnectionsPerIp} connections open (--max-connections-per-ip)`
          : undefined
    if (refusal) {
      this.log(`${peer}: refused: ${refusal}`)
      socket.end(encodeError(NO_REQUEST, refusal))
      setTimeout(() => socket.destroy(), 1000).unref()
      return
    }
    this.sockets.add(socket)
    this.perIp.set(ip, (this.perIp.get(ip) ?? 0) + 1)
    socket.on('close', () => {
      this.sockets.delete(socket)
      const n = (this.perIp.get(ip) ?? 1) - 1
      if (n <= 0) this.perIp.delete(ip)
      else this.perIp.set(ip, n)
    })
    this.serve(socket, peer)
  }

  /**
   * Answers one connection's requests in order. Backpressure: a response is only produced once what is queued for
   * the client is below maxUnsentBytes, and past MAX_QUEUED_PER_CONNECTION waiting requests the server stops reading
   * from it, so a client that never reads holds at most one response and a few requests of the server's memory.
   * One that does not drain within stallTimeoutMs is closed.
   */
  private serve(socket: Socket, peer: string): void {
    const decoder = new FrameDecoder(MAX_REQUEST_BYTES)
    let greeted = false
    let queued = 0
    let blocked = false
    let chain = Promise.resolve()
    const send = (frame: Buffer) => {
      if (!socket.destroyed) socket.write(frame)
    }
    const drained = (): Promise<void> => {
      if (socket.destroyed || socket.writableLength < this.limits.maxUnsentBytes) return Promise.resolve()
      return new Promise<void>((resolve) => {
        const done = () => {
          clearTimeout(stall)
          socket.off('drain', done)
          socket.off('close', done)
          resolve()
        }
        const stall = setTimeout(() => {
          this.log(`${peer}: read nothing of ${socket.writableLength} queued bytes for ${this.limits.stallTimeoutMs} ms; closing the connection`)
          socket.destroy()
        }, this.limits.stallTimeoutMs)
        stall.unref()
        socket.on('drain', done)
        socket.on('close', done)
      })
    }
    socket.on('data', (chunk) => {
      let frames: Buffer[]
      try {
        frames = decoder.push(chunk)
      } catch (error) {
        // The stream cannot be re-synchronised after a bad length: say why, then hang up on this client only.
        this.log(`${peer}: ${errorMessage(error)}; closing the connection`)
        send(encodeError(NO_REQUEST, `bad frame: ${errorMessage(error)}`))
        socket.end()
        return
      }
      for (const body of frames) {
        let message
        try {
          message = decodeClientMessage(body)
        } catch (error) {
          const requestId = body[0] === 0x02 && body.length >= 5 ? body.readUInt32LE(1) : NO_REQUEST
          send(encodeError(requestId, `bad request: ${errorMessage(error)}`))
          continue
        }
        if (message.type === 'hello') {
          const seqLen = this.provider.seqLen
          if (message.version !== WIRE_VERSION || (message.seqLen !== 0 && message.seqLen !== seqLen)) {
            send(
              encodeError(
                NO_REQUEST,
                message.version !== WIRE_VERSION
                  ? `wire version ${message.version} not supported (server speaks ${WIRE_VERSION})`
                  : `client expects seq_len ${message.seqLen} but this server serves seq_len ${seqLen}`,
              ),
            )
            socket.end()
            return
          }
          greeted = true
          send(encodeInfo(seqLen, this.provider.numSamples(), this.provider.vocabSize()))
          continue
        }
        const {requestId, batchIds, wrap} = message
        if (!greeted) {
          send(encodeError(requestId, 'GET before HELLO'))
          continue
        }
        if (13 + batchIds.length * (this.provider.seqLen + 1) * 4 > MAX_RESPONSE_BYTES) {
          send(encodeError(requestId, `${batchIds.length} samples would exceed the ${MAX_RESPONSE_BYTES}-byte response bound; ask for fewer`))
          continue
        }
        queued++
        // Enough waiting: read no more requests from this client until it has taken some answers.
        if (queued >= MAX_QUEUED_PER_CONNECTION) socket.pause()
        chain = chain.then(async () => {
          try {
            await drained()
            if (socket.destroyed) return
            const ids = await this.provider.getSamples(batchIds, {wrap})
            send(encodeSamples(requestId, this.provider.seqLen + 1, ids))
          } catch (error) {
            this.log(`${peer}: request ${requestId}: ${errorMessage(error)}`)
            send(encodeError(requestId, errorMessage(error)))
          } finally {
            queued--
            if (queued < MAX_QUEUED_PER_CONNECTION && !blocked && socket.isPaused()) socket.resume()
          }
        })
      }
      // Error answers (bad or early requests) also wait for the client to read: no more reading until it has.
      if (!blocked && socket.writableLength >= this.limits.maxUnsentBytes) {
        blocked = true
        socket.pause()
        void drained().then(() => {
          blocked = false
          if (queued < MAX_QUEUED_PER_CONNECTION && !socket.destroyed) socket.resume()
        })
      }
    })
  }

  async close(): Promise<void> {
    for (const socket of this.sockets) socket.destroy()
    await new Promise<void>((resolve) => this.server.close(() => resolve()))
  }
}

interface Pending {
  batchIds: readonly number[]
  resolve: (message: Extract<ServerMessage, {type: 'samples'}>) => void
  reject: (error: Error) => void
  timer: NodeJS.Timeout
}

interface TcpClientOptions {
  seqLen: number
  vocabSize?: number
  wrap?: boolean
  timeoutMs?: number
}

/** One connection to a data server: a client's `data_location.Server = "host:port"`. Reconnects once per request if the connection dropped. */
export class TcpDataProvider implements DataProvider {
  private socket: Socket | undefined
  private decoder = new FrameDecoder(MAX_RESPONSE_BYTES)
  private readonly pending = new Map<number, Pending>()
  private nextRequestId = 0
  private info: Extract<ServerMessage, {type: 'info'}> | undefined
  private onInfo: ((message: ServerMessage | Error) => void) | undefined
  private closed = false

  private constructor(
    readonly description: string,
    private readonly host: string,
    private readonly port: number,
    private readonly options: TcpClientOptions,
  ) {}

  static async connect(address: string, options: TcpClientOptions): Promise<TcpDataProvider> {
    const {host, port} = parseHostPort(address, 'data_location.Server')
    const provider = new TcpDataProvider(`data server ${address}`, host, port, options)
    await provider.ensureConnected()
    return provider
  }

  numSamples(): number | undefined {
    return this.info?.numSamples
  }

  vocabSize(): number | undefined {
    return this.info?.vocabSize
  }

  private get timeoutMs(): number {
    return this.options.timeoutMs ?? 30_000
  }

  private connecting: Promise<void> | undefined

  /** Connects (again) unless connected; concurrent callers share one attempt. */
  private async ensureConnected(): Promise<void> {
    if (this.closed) throw new PsycheError(`${this.description}: provider is closed`)
    if (this.connecting) return this.connecting
    if (this.socket && !this.socket.destroyed && this.info) return
    this.connecting = this.handshake().finally(() => {
      this.connecting = undefined
    })
    return this.connecting
  }

  private async handshake(): Promise<void> {
    this.info = undefined
    this.decoder = new FrameDecoder(MAX_RESPONSE_BYTES)
    const socket = connect({host: this.host, port: this.port})
    this.socket = socket
    socket.setNoDelay(true)
    socket.on('data', (chunk) => this.receive(chunk))
    socket.on('error', () => {})
    socket.on('close', () => this.dropped(socket))
    const info = await new Promise<ServerMessage | Error>((resolve) => {
      const timer = setTimeout(() => resolve(new Error(`no answer within ${this.timeoutMs} ms`)), this.timeoutMs)
      this.onInfo = (message) => {
        clearTimeout(timer)
        resolve(message)
      }
      socket.once('error', (error: NodeJS.ErrnoException) => this.onInfo?.(new Error(error.code ?? error.message)))
      socket.once('connect', () => socket.write(encodeHello(this.options.seqLen)))
    })
    this.onInfo = undefined
    if (info instanceof Error || info.type !== 'info') {
      socket.destroy()
      const why = info instanceof Error ? info.message : info.type === 'error' ? info.message : `unexpected ${info.type} frame`
      throw new PsycheError(`${this.description}: cannot connect: ${why}`, {code: 'EDATA_SERVER'})
    }
    if (info.seqLen !== this.options.seqLen) {
      socket.destroy()
      throw new PsycheError(`${this.description}: serves seq_len ${info.seqLen} but the run's max_seq_len is ${this.options.seqLen}`, {code: 'EDATA_SERVER'})
    }
    if (this.options.vocabSize !== undefined && info.vocabSize !== undefined && info.vocabSize > this.options.vocabSize) {
      socket.destroy()
      throw new PsycheError(`${this.description}: data tokenized with a vocabulary of ${info.vocabSize} ids, larger than the model's ${this.options.vocabSize}`, {
        code: 'EDATA_VOCAB',
      })
    }
    this.info = info
  }

  private failAll(error: PsycheError): void {
    for (const [id, pending] of this.pending) {
      clearTimeout(pending.timer)
      pending.reject(error)
      this.pending.delete(id)
    }
    this.onInfo?.(new Error(error.message))
  }

  private dropped(socket: Socket): void {
    if (socket !== this.socket) return
    const {have, need} = this.decoder.partial
    const how = have > 0 ? `closed the connection mid-frame (received ${have} of ${need ?? 'at least 4'} bytes)` : 'closed the connection'
    this.failAll(new PsycheError(`${this.description}: ${how}`, {code: 'EDATA_SERVER'}))
  }

  private receive(chunk: Buffer): void {
    let messages: ServerMessage[]
    try {
      messages = this.decoder.push(chunk).map(decodeServerMessage)
    } catch (error) {
      const socket = this.socket
      this.socket = undefined
      socket?.destroy()
      this.failAll(new PsycheError(`${this.description}: sent a malformed frame (${errorMessage(error)})`, {code: 'EDATA_SERVER'}))
      return
    }
    for (const message of messages) {
      if (this.onInfo && (message.type === 'info' || message.type === 'error')) {
        this.onInfo(message)
        continue
      }
      const pending = message.type === 'info' ? undefined : this.pending.get(message.requestId)
      if (message.type === 'error' && message.requestId === NO_REQUEST) {
        this.failAll(new PsycheError(`${this.description}: ${message.message}`, {code: 'EDATA_SERVER'}))
        continue
      }
      if (!pending) continue
      this.pending.delete((message as {requestId: number}).requestId)
      clearTimeout(pending.timer)
      if (message.type === 'error') pending.reject(new PsycheError(`${this.description}: ${message.message}`, {code: 'EDATA_SERVER'}))
      else if (message.type === 'samples') pending.resolve(message)
    }
  }

  private async request(batchIds: readonly number[]): Promise<Uint32Array> {
    await this.ensureConnected()
    const requestId = this.nextRequestId
    this.nextRequestId = (this.nextRequestId + 1) % NO_REQUEST
    const message = await new Promise<Extract<ServerMessage, {type: 'samples'}>>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(requestId)
        reject(new PsycheError(`${this.description}: batches ${batchIds.join(', ')}: no answer within ${this.timeoutMs} ms`, {code: 'EDATA_SERVER'}))
      }, this.timeoutMs)
      this.pending.set(requestId, {batchIds, resolve, reject, timer})
      this.socket!.write(encodeGet(requestId, batchIds, this.options.wrap ?? false))
    })
    const rowLength = this.options.seqLen + 1
    if (message.rows !== batchIds.length || message.rowLength !== rowLength) {
      throw new PsycheError(`${this.description}: batches ${batchIds.join(', ')}: answered ${message.rows}×${message.rowLength} ids, expected ${batchIds.length}×${rowLength}`, {
        code: 'EDATA_SERVER',
      })
    }
    for (const [row, id] of batchIds.entries()) checkVocab(message.ids, row * rowLength, rowLength, this.options.vocabSize, id, this.description)
    return message.ids
  }

  async getSamples(batchIds: readonly number[]): Promise<Uint32Array> {
    for (const id of batchIds) {
      if (!Number.isSafeInteger(id) || id < 0) throw new PsycheError(`${this.description}: batch ${id}: a batch id is a non-negative integer`, {code: 'EDATA_BATCH'})
    }
    const rowLength = this.options.seqLen + 1
    const out = new Uint32Array(batchIds.length * rowLength)
    const chunkSize = Math.max(1, Math.min(MAX_BATCH_IDS, Math.floor((MAX_RESPONSE_BYTES - 13) / (rowLength * 4))))
    const parts: Promise<void>[] = []
    for (let at = 0; at < batchIds.length; at += chunkSize) {
      const ids = batchIds.slice(at, at + chunkSize)
      parts.push(this.request(ids).then((rows) => out.set(rows, at * rowLength)))
    }
    await Promise.all(parts)
    return out
  }

  async close(): Promise<void> {
    this.closed = true
    const socket = this.socket
    this.socket = undefined
    this.failAll(new PsycheError(`${this.description}: provider closed`))
    if (socket && !socket.destroyed) {
      await new Promise<void>((resolve) => {
        socket.once('close', () => resolve())
        socket.end()
        setTimeout(() => {
          socket.destroy()
          resolve()
        }, 1000).unref()
      })
    }
  }
}
