import {
  SOLANA_ERROR__INSTRUCTION_ERROR__CUSTOM,
  SOLANA_ERROR__JSON_RPC__SERVER_ERROR_SEND_TRANSACTION_PREFLIGHT_FAILURE,
  appendTransactionMessageInstructions,
  createSolanaRpc,
  createSolanaRpcSubscriptions,
  createTransactionMessage,
  getBase64EncodedWireTransaction,
  getSignatureFromTransaction,
  isSolanaError,
  pipe,
  setTransactionMessageFeePayerSigner,
  setTransactionMessageLifetimeUsingBlockhash,
  signTransactionMessageWithSigners,
  type Address,
  type Instruction,
  type Signature,
  type TransactionSigner,
} from '@solana/kit'
import {PsycheError} from '../../errors.js'
import {withComputeBudget} from './instructions.js'
import {PROGRAM_ERRORS} from './layout.js'

/** The outcome of one transaction. */
export interface SendResult {
  ok: boolean
  /** The program's custom error code, when it failed with one. */
  code?: number
  /** Its name (PROGRAM_ERRORS), or the runtime's error text. */
  error?: string
  logs: string[]
  computeUnits: bigint
}

/**
 * What psyche needs from a Solana cluster: send a transaction, read an account, price rent. Two
 * implementations: RpcChain (the standard JSON-RPC API of a validator: solana-test-validator, devnet,
 * mainnet) and LocalChain (LiteSVM in this process, for tests and simulations).
 */
export interface Chain {
  send(payer: TransactionSigner, instructions: Instruction[]): Promise<SendResult>
  fetchAccount(address: Address): Promise<Uint8Array | undefined>
  minimumBalance(bytes: number): Promise<bigint>
}

/**
 * A cluster behind a JSON-RPC endpoint (`--rpc`), driven with @solana/kit. With the cluster's websocket (`--ws-rpc`)
 * a transaction's confirmation comes as a signatureSubscribe notification; without, by polling getSignatureStatuses.
 */
export class RpcChain implements Chain {
  readonly rpc: ReturnType<typeof createSolanaRpc>
  private readonly subscriptions?: ReturnType<typeof createSolanaRpcSubscriptions>

  constructor(
    readonly url: string,
    private readonly options: {confirmTimeoutMs?: number; pollMs?: number; wsUrl?: string} = {},
  ) {
    this.rpc = createSolanaRpc(url)
    if (options.wsUrl) this.subscriptions = createSolanaRpcSubscriptions(options.wsUrl)
  }

  async fetchAccount(address: Address): Promise<Uint8Array | undefined> {
    const {value} = await this.call(() => this.rpc.getAccountInfo(address, {encoding: 'base64', commitment: 'confirmed'}).send())
    return value ? Buffer.from(value.data[0], 'base64') : undefined
  }

  async minimumBalance(bytes: number): Promise<bigint> {
    return this.call(() => this.rpc.getMinimumBalanceForRentExemption(BigInt(bytes)).send())
  }

  /** Signs, sends (with preflight simulation) and waits until the transaction is confirmed. */
  async send(payer: TransactionSigner, instructions: Instruction[]): Promise<SendResult> {
    const {value: blockhash} = await this.call(() => this.rpc.getLatestBlockhash({commitment: 'confirmed'}).send())
    const message = pipe(
      createTransactionMessage({version: 0}),
      (m) => setTransactionMessageFeePayerSigner(payer, m),
      (m) => setTransactionMessageLifetimeUsingBlockhash(blockhash, m),
      (m) => appendTransactionMessageInstructions(withComputeBudget(instructions), m),
    )
    const tx = await signTransactionMessageWithSigners(message)
    const signature = getSignatureFromTransaction(tx)
    try {
      await this.rpc.sendTransaction(getBase64EncodedWireTransaction(tx), {encoding: 'base64', preflightCommitment: 'confirmed'}).send()
    } catch (error) {
      if (isSolanaError(error, SOLANA_ERROR__JSON_RPC__SERVER_ERROR_SEND_TRANSACTION_PREFLIGHT_FAILURE)) {
        const logs = (error.context.logs ?? []) as string[]
        const cause = error.cause
        if (isSolanaError(cause, SOLANA_ERROR__INSTRUCTION_ERROR__CUSTOM)) {
          const code = cause.context.code
          return {ok: false, code, error: PROGRAM_ERRORS[code] ?? `custom error ${code}`, logs, computeUnits: BigInt(error.context.unitsConsumed ?? 0)}
        }
        return {ok: false, error: (cause as Error | undefined)?.message ?? error.message, logs, computeUnits: BigInt(error.context.unitsConsumed ?? 0)}
      }
      throw this.unreachable(error)
    }
    const deadline = Date.now() + (this.options.confirmTimeoutMs ?? 60_000)
    if (this.subscriptions) return this.confirmByNotification(signature, deadline)
    // Asked at once, then every pollMs: a cluster that confirms quickly (a localnet at once) costs one round trip.
    for (let wait = 50; ; wait = this.options.pollMs ?? 400) {
      const decided = await this.status(signature)
      if (decided) return decided
      if (Date.now() > deadline) throw this.notConfirmed(signature)
      await new Promise((r) => setTimeout(r, wait))
    }
  }

  /** The transaction's outcome once the cluster has confirmed it (undefined while it has not). */
  private async status(signature: Signature): Promise<SendResult | undefined> {
    const {value} = await this.call(() => this.rpc.getSignatureStatuses([signature]).send())
    const status = value[0]
    if (status?.err) return {ok: false, error: JSON.stringify(status.err, (_k, v) => (typeof v === 'bigint' ? Number(v) : v)), logs: [], computeUnits: 0n}
    if (status && (status.confirmationStatus === 'confirmed' || status.confirmationStatus === 'finalized')) return {ok: true, logs: [], computeUnits: 0n}
    return undefined
  }

  /** Waits for the signatureSubscribe notification (asking once after subscribing, in case it was confirmed before). */
  private async confirmByNotification(signature: Signature, deadline: number): Promise<SendResult> {
    const abort = new AbortController()
    const timer = setTimeout(() => abort.abort(), Math.max(0, deadline - Date.now()))
    try {
      const notifications = await this.subscriptions!.signatureNotifications(signature, {commitment: 'confirmed'}).subscribe({abortSignal: abort.signal})
      const already = await this.status(signature)
      if (already) return already
      for await (const n of notifications) {
        const err = (n.value as {err: unknown}).err
        if (err) return {ok: false, error: JSON.stringify(err, (_k, v) => (typeof v === 'bigint' ? Number(v) : v)), logs: [], computeUnits: 0n}
        return {ok: true, logs: [], computeUnits: 0n}
      }
      throw this.notConfirmed(signature)
    } catch (error) {
      if (abort.signal.aborted) throw this.notConfirmed(signature)
      throw this.unreachable(error)
    } finally {
      clearTimeout(timer)
      abort.abort()
    }
  }

  private notConfirmed(signature: Signature): PsycheError {
    return new PsycheError(`${this.url}: transaction ${signature} was not confirmed within ${(this.options.confirmTimeoutMs ?? 60_000) / 1000} s`)
  }

  private async call<T>(fn: () => Promise<T>): Promise<T> {
    try {
      return await fn()
    } catch (error) {
      throw this.unreachable(error)
    }
  }

  private unreachable(error: unknown): Error {
    if (error instanceof PsycheError) return error
    const message = error instanceof Error ? error.message : String(error)
    return new PsycheError(`${this.url}: ${message}`, {code: 'ERPC', cause: error})
  }
}
