import {createServer, type IncomingMessage, type Server, type ServerResponse} from 'node:http'
import type {AddressInfo} from 'node:net'
import {getBase58Decoder, getCompiledTransactionMessageDecoder, getTransactionDecoder, lamports, type Address} from '@solana/kit'
import {FailedTransactionMetadata} from 'litesvm'
import {WebSocketServer, type WebSocket} from 'ws'
import {TRANSACTION_SIZE_LIMIT} from './chain.js'
import {LocalChain, type ChainFeatures} from './local-chain.js'

/**
 * A single-node Solana cluster on loopback: LiteSVM (the real runtime, loader and syscalls) behind the
 * standard JSON-RPC methods psyche's RpcChain uses (getLatestBlockhash, sendTransaction with preflight,
 * getSignatureStatuses, getAccountInfo, getMinimumBalanceForRentExemption, getBalance, requestAirdrop),
 * and accountSubscribe / signatureSubscribe (with their unsubscribes) on a websocket at the same address.
 * The clock follows wall time, and so do slots (one per `slotMs`, 400 ms as on a cluster).
 *
 * It deploys the programs as a cluster does, through the upgradeable loader and its deploy-time checks, with every
 * feature of a current cluster active (SIMD-0500: no sBPF v0 deployments; `features: 'legacy'` for an older one).
 * It refuses what a cluster refuses, which LiteSVM alone would run: a transaction over 1,232 bytes, and one whose
 * blockhash is unknown or older than 150 slots (BlockhashNotFound); the compute limit a transaction asks for is
 * enforced by the runtime. For trying runs on one machine and for testing the RPC path; a real cluster is
 * solana-test-validator or devnet (README).
 */

interface Status {
  slot: number
  err: unknown
}

type Params = unknown[]

interface LocalnetOptions {
  host?: string
  port?: number
  /** Programs to deploy: address → shared object bytes. */
  programs: {address: Address; bytes: Uint8Array}[]
  /** Milliseconds per slot (400 as on a cluster); a blockhash lives 150 slots. */
  slotMs?: number
  /** The feature set: 'current' (default; SIMD-0500 refuses to deploy sBPF v0) or 'legacy' (an older cluster). */
  features?: ChainFeatures
}

/** Slots a blockhash stays valid (MAX_PROCESSING_AGE). */
const BLOCKHASH_LIFETIME_SLOTS = 150

export class Localnet {
  readonly chain: LocalChain
  private server?: Server
  private readonly statuses = new Map<string, Status>()
  private slot = 1
  private readonly started = Date.now()
  /** Blockhashes handed out, with the slot each was issued at. */
  private readonly blockhashes = new Map<string, number>()
  private wss?: WebSocketServer
  private readonly subscriptions = new Map<number, {socket: WebSocket; address: Address; last?: string}>()
  private readonly signatureSubscriptions = new Map<number, {socket: WebSocket; signature: string}>()
  private nextSubscription = 1
  /** JSON-RPC requests answered, by method (HTTP and websocket): what tests check the path taken with. */
  readonly requests = new Map<string, number>()
  url = ''
  wsUrl = ''

  constructor(private readonly options: LocalnetOptions) {
    const [first] = options.programs
    if (!first) throw new RangeError('localnet: no program to deploy')
    this.chain = new LocalChain(first.address, null, options.features ?? 'current')
    this.chain.svm.withBlockhashCheck(false)
  }

  /** Deploys the programs (as a cluster does, with its deploy-time checks), then serves JSON-RPC. */
  async start(): Promise<string> {
    for (const p of this.options.programs) await this.chain.deploy(p.address, p.bytes)
    this.server = createServer((req, res) => void this.handle(req, res))
    await new Promise<void>((resolve, reject) => {
      this.server!.once('error', reject)
      this.server!.listen(this.options.port ?? 0, this.options.host ?? '127.0.0.1', () => resolve())
    })
    this.wss = new WebSocketServer({server: this.server})
    this.wss.on('connection', (socket) => this.onSocket(socket))
    const {address, port} = this.server.address() as AddressInfo
    this.url = `http://${address}:${port}`
    this.wsUrl = `ws://${address}:${port}`
    return this.url
  }

  async close(): Promise<void> {
    const server = this.server
    if (!server) return
    this.server = undefined
    for (const client of this.wss?.clients ?? []) client.terminate()
    this.wss?.close()
    server.closeAllConnections()
    await new Promise<void>((resolve) => server.close(() => resolve()))
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const chunks: Buffer[] = []
    for await (const c of req) chunks.push(c as Buffer)
    let id: unknown = null
    let body: string
    try {
      const request = JSON.parse(Buffer.concat(chunks).toString('utf8')) as {id?: unknown; method?: unknown; params?: unknown}
      id = request.id ?? null
      if (typeof request.method !== 'string') throw Object.assign(new Error('invalid request'), {rpcCode: -32600})
      this.requests.set(request.method, (this.requests.get(request.method) ?? 0) + 1)
      const result = this.dispatch(request.method, Array.isArray(request.params) ? request.params : [])
      body = JSON.stringify({jsonrpc: '2.0', id, result})
    } catch (error) {
      const e = error as Error & {rpcCode?: number; data?: unknown}
      body = JSON.stringify({jsonrpc: '2.0', id, error: {code: e.rpcCode ?? -32603, message: e.message, ...(e.data ? {data: e.data} : {})}})
    }
    res.writeHead(200, {'content-type': 'application/json'})
    res.end(body)
  }

  private onSocket(socket: WebSocket): void {
    socket.on('message', (raw) => {
      let id: unknown = null
      try {
        const request = JSON.parse(String(raw)) as {id?: unknown; method?: string; params?: unknown[]}
        id = request.id ?? null
        if (typeof request.method === 'string') this.requests.set(request.method, (this.requests.get(request.method) ?? 0) + 1)
        if (request.method === 'signatureSubscribe') {
          // as a validator: one notification once the transaction is processed (at once if it already was), then
          // the subscription ends by itself
          const subscription = this.nextSubscription++
          const signature = String((request.params ?? [])[0])
          socket.send(JSON.stringify({jsonrpc: '2.0', id, result: subscription}))
          this.signatureSubscriptions.set(subscription, {socket, signature})
          this.notifySignature(signature)
        } else if (request.method === 'signatureUnsubscribe') {
          socket.send(JSON.stringify({jsonrpc: '2.0', id, result: this.signatureSubscriptions.delete((request.params ?? [])[0] as number)}))
        } else if (request.method === 'accountSubscribe') {
          const subscription = this.nextSubscription++
          this.subscriptions.set(subscription, {socket, address: (request.params ?? [])[0] as Address})
          socket.send(JSON.stringify({jsonrpc: '2.0', id, result: subscription}))
        } else if (request.method === 'accountUnsubscribe') {
          socket.send(JSON.stringify({jsonrpc: '2.0', id, result: this.subscriptions.delete((request.params ?? [])[0] as number)}))
        } else throw new Error(`Method not found: ${request.method}`)
      } catch (error) {
        socket.send(JSON.stringify({jsonrpc: '2.0', id, error: {code: -32601, message: (error as Error).message}}))
      }
    })
    socket.on('close', () => {
      for (const [k, sub] of this.subscriptions) if (sub.socket === socket) this.subscriptions.delete(k)
      for (const [k, sub] of this.signatureSubscriptions) if (sub.socket === socket) this.signatureSubscriptions.delete(k)
    })
  }

  /** A processed transaction: its status to every subscriber waiting for it. */
  private notifySignature(signature: string): void {
    const status = this.statuses.get(signature)
    if (!status) return
    for (const [subscription, sub] of this.signatureSubscriptions) {
      if (sub.signature !== signature) continue
      this.signatureSubscriptions.delete(subscription)
      sub.socket.send(JSON.stringify({jsonrpc: '2.0', method: 'signatureNotification', params: {result: {context: {slot: status.slot}, value: {err: status.err}}, subscription}}))
    }
  }

  /** After a transaction: a notification to every subscriber whose account changed. */
  private notify(): void {
    for (const [subscription, sub] of this.subscriptions) {
      const account = this.chain.svm.getAccount(sub.address)
      const data = account.exists ? Buffer.from(account.data).toString('base64') : ''
      if (!account.exists || data === sub.last) continue
      sub.last = data
      const value = {
        data: [data, 'base64'],
        executable: account.executable,
        lamports: Number(account.lamports),
        owner: account.programAddress,
        rentEpoch: 0,
        space: account.data.length,
      }
      sub.socket.send(JSON.stringify({jsonrpc: '2.0', method: 'accountNotification', params: {result: {context: {slot: this.slot}, value}, subscription}}))
    }
  }

  /** The current slot: one per slotMs of wall time since start (never going back). */
  private currentSlot(): number {
    this.slot = Math.max(this.slot, 1 + Math.floor((Date.now() - this.started) / (this.options.slotMs ?? 400)))
    return this.slot
  }

  private context() {
    return {slot: this.currentSlot(), apiVersion: '2.0.0'}
  }

  /** The latest blockhash, recorded at the slot it was first handed out. */
  private latestBlockhash(): {blockhash: string; lastValidBlockHeight: number} {
    const slot = this.currentSlot()
    // as a cluster: each slot has its own blockhash
    const issued = this.blockhashes.get(this.chain.svm.latestBlockhash())
    if (issued !== undefined && issued < slot) this.chain.svm.expireBlockhash()
    const blockhash = this.chain.svm.latestBlockhash()
    if (!this.blockhashes.has(blockhash)) this.blockhashes.set(blockhash, slot)
    for (const [hash, at] of this.blockhashes) if (at + BLOCKHASH_LIFETIME_SLOTS < slot) this.blockhashes.delete(hash)
    return {blockhash, lastValidBlockHeight: this.blockhashes.get(blockhash)! + BLOCKHASH_LIFETIME_SLOTS}
  }

  private dispatch(method: string, params: Params): unknown {
    const svm = this.chain.svm
    switch (method) {
      case 'getHealth':
        return 'ok'
      case 'getSlot':
      case 'getBlockHeight':
        return this.currentSlot()
      case 'getLatestBlockhash':
        return {context: this.context(), value: this.latestBlockhash()}
      case 'isBlockhashValid': {
        const at = this.blockhashes.get(params[0] as string)
        return {context: this.context(), value: at !== undefined && at + BLOCKHASH_LIFETIME_SLOTS >= this.currentSlot()}
      }
      case 'getMinimumBalanceForRentExemption':
        return Number(svm.minimumBalanceForRentExemption(BigInt(params[0] as number)))
      case 'getBalance':
        return {context: this.context(), value: Number(svm.getBalance(params[0] as Address) ?? 0n)}
      case 'getAccountInfo': {
        const account = svm.getAccount(params[0] as Address)
        if (!account.exists) return {context: this.context(), value: null}
        return {
          context: this.context(),
          value: {
            data: [Buffer.from(account.data).toString('base64'), 'base64'],
            executable: account.executable,
            lamports: Number(account.lamports),
            owner: account.programAddress,
            rentEpoch: 0,
            space: account.data.length,
          },
        }
      }
      case 'requestAirdrop': {
        const r = svm.airdrop(params[0] as Address, lamports(BigInt(params[1] as number)))
        if (!r || r instanceof FailedTransactionMetadata) throw new Error(`airdrop failed: ${r?.toString()}`)
        const signature = getBase58Decoder().decode(r.signature())
        this.statuses.set(signature, {slot: this.currentSlot(), err: null})
        return signature
      }
      case 'sendTransaction':
        return this.sendTransaction(params)
      case 'getSignatureStatuses': {
        const signatures = (params[0] as string[]) ?? []
        return {
          context: this.context(),
          value: signatures.map((s) => {
            const status = this.statuses.get(s)
            return status ? {slot: status.slot, confirmations: null, err: status.err, status: status.err ? {Err: status.err} : {Ok: null}, confirmationStatus: 'finalized'} : null
          }),
        }
      }
      default:
        throw Object.assign(new Error(`Method not found: ${method}`), {rpcCode: -32601})
    }
  }

  private sendTransaction(params: Params): string {
    const encoding = (params[1] as {encoding?: string} | undefined)?.encoding ?? 'base58'
    if (encoding !== 'base64') throw Object.assign(new Error('localnet accepts base64 transactions only'), {rpcCode: -32602})
    const raw = Buffer.from(params[0] as string, 'base64')
    if (raw.length > TRANSACTION_SIZE_LIMIT)
      throw Object.assign(new Error(`base64 encoded VersionedTransaction too large: ${raw.length} bytes (max: ${TRANSACTION_SIZE_LIMIT} bytes)`), {rpcCode: -32602})
    const tx = getTransactionDecoder().decode(raw)
    const feePayerSignature = Object.values(tx.signatures)[0]
    if (!feePayerSignature) throw Object.assign(new Error('transaction is not signed'), {rpcCode: -32602})
    const signature = getBase58Decoder().decode(feePayerSignature)
    const slot = this.currentSlot()
    const lifetime = String(getCompiledTransactionMessageDecoder().decode(tx.messageBytes).lifetimeToken)
    const issued = this.blockhashes.get(lifetime)
    if (issued === undefined || issued + BLOCKHASH_LIFETIME_SLOTS < slot) {
      throw Object.assign(new Error('Transaction simulation failed: Blockhash not found'), {
        rpcCode: -32002,
        data: {err: 'BlockhashNotFound', logs: [], accounts: null, unitsConsumed: 0, returnData: null},
      })
    }
    if (this.statuses.has(signature)) return signature // a resend of a processed transaction: a cluster drops it
    this.chain.setClock(Math.floor(Date.now() / 1000), slot)
    const r = this.chain.svm.sendTransaction(tx)
    this.chain.svm.expireBlockhash()
    if (r instanceof FailedTransactionMetadata) {
      const meta = r.meta()
      const err = r.err() as unknown as {index?: number; err?: () => unknown; toString(): string}
      const inner = typeof err.err === 'function' ? (err.err() as {code?: number}) : undefined
      const jsonErr = typeof inner?.code === 'number' ? {InstructionError: [err.index ?? 0, {Custom: inner.code}]} : r.toString()
      throw Object.assign(new Error(`Transaction simulation failed: ${r.toString()}`), {
        rpcCode: -32002,
        data: {err: jsonErr, logs: meta.logs(), accounts: null, unitsConsumed: Number(meta.computeUnitsConsumed()), returnData: null},
      })
    }
    this.statuses.set(signature, {slot: this.slot, err: null})
    this.notify()
    this.notifySignature(signature)
    return signature
  }
}
