import {createServer, connect, type AddressInfo, type Server, type Socket} from 'node:net'
import {PsycheError, errorMessage} from '../errors.js'
import {parseHostPort} from '../protocol/address.js'
import {checkVocab} from './batches.js'
import type {DataProvider, TokenFilesProvider} from './provider.js'
import {
  FrameDecoder,
  MAX_BATCH_IDS,
  MAX_REQUEST_BYTES,
  MAX_RESPONSE_BYTES,
  NO_REQUEST,
  WIRE_VERSION,
  WireError,
  decodeClientMessage,
  decodeServerMessage,
  encodeError,
  encodeGet,
  encodeHello,
  encodeInfo,
  encodeSamples,
  type ServerMessage,
} from './wire.js'

/** Requests one connection may have queued on the server before further ones are refused. */
const MAX_QUEUED_PER_CONNECTION = 64

/**
 * `psyche data serve`: serves the samples of one token directory (data.toml's layout and shuffle) to the
 * clients of a run. Every frame is size-bounded; a bad request gets an ERROR frame and the server carries on.
 */
export class DataServer {
  private readonly sockets = new Set<Socket>()

  private constructor(
    private readonly server: Server,
    readonly provider: TokenFilesProvider,
    private readonly log: (line: string) => void,
  ) {
    server.on('connection', (socket) => this.serve(socket))
  }

  static async start(provider: TokenFilesProvider, options: {host?: string; port?: number; log?: (line: string) => void} = {}): Promise<DataServer> {
    const server = createServer()
    const instance = new DataServer(server, provider, options.log ?? (() => {}))
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

  private serve(socket: Socket): void {
    this.sockets.add(socket)
    const peer = `${socket.remoteAddress}:${socket.remotePort}`
    const decoder = new FrameDecoder(MAX_REQUEST_BYTES)
    let greeted = false
    let queued = 0
    let chain = Promise.resolve()
    const send = (frame: Buffer) => {
      if (!socket.destroyed) socket.write(frame)
    }
    socket.on('error', () => {})
    socket.on('close', () => this.sockets.delete(socket))
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
        if (queued >= MAX_QUEUED_PER_CONNECTION) {
          send(encodeError(requestId, `more than ${MAX_QUEUED_PER_CONNECTION} requests in flight on one connection`))
          continue
        }
        queued++
        chain = chain.then(async () => {
          try {
            const ids = await this.provider.getSamples(batchIds, {wrap})
            send(encodeSamples(requestId, this.provider.seqLen + 1, ids))
          } catch (error) {
            this.log(`${peer}: request ${requestId}: ${errorMessage(error)}`)
            send(encodeError(requestId, errorMessage(error)))
          } finally {
            queued--
          }
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

export interface TcpClientOptions {
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
