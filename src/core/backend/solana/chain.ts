import {
  SOLANA_ERROR__INSTRUCTION_ERROR__CUSTOM,
  SOLANA_ERROR__JSON_RPC__SERVER_ERROR_SEND_TRANSACTION_PREFLIGHT_FAILURE,
  SOLANA_ERROR__RPC__TRANSPORT_HTTP_ERROR,
  SOLANA_ERROR__TRANSACTION_ERROR__BLOCKHASH_NOT_FOUND,
  appendTransactionMessageInstructions,
  createSolanaRpc,
  createSolanaRpcSubscriptions,
  createTransactionMessage,
  getBase64EncodedWireTransaction,
  getSignatureFromTransaction,
  getTransactionSize,
  isSolanaError,
  pipe,
  setTransactionMessageFeePayerSigner,
  setTransactionMessageLifetimeUsingBlockhash,
  signTransactionMessageWithSigners,
  type Address,
  type Instruction,
  type Signature,
  type Transaction,
  type TransactionSigner,
} from '@solana/kit'
import {PsycheError} from '../../errors.js'
import {withComputeBudget} from './instructions.js'
import {PROGRAM_ERRORS} from './layout.js'

/** The most bytes a cluster accepts in one transaction (IPv6 MTU less headers), signatures included. */
export const TRANSACTION_SIZE_LIMIT = 1232

/** Why a cluster would refuse the transaction's size, or undefined when it fits. */
export function oversized(tx: Transaction): string | undefined {
  const size = getTransactionSize(tx)
  return size > TRANSACTION_SIZE_LIMIT ? `the transaction is ${size} bytes, more than a cluster accepts (${TRANSACTION_SIZE_LIMIT})` : undefined
}

/** The outcome of one transaction. */
export interface SendResult {
  ok: boolean
  /** The program's custom error code, when it failed with one. */
  code?: number
  /** Its name (PROGRAM_ERRORS), or the runtime's error text. */
  error?: string
  logs: string[]
  computeUnits: bigint
  /** The transaction's wire size (LocalChain reports it). */
  bytes?: number
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

/** Options of RpcChain. */
interface RpcChainOptions {
  /** How long one send may take, resends and rebuilt transactions included (60 s). */
  confirmTimeoutMs?: number
  /** Polling period of getSignatureStatuses without a websocket (400 ms). */
  pollMs?: number
  /** The cluster's websocket: confirmations by signatureSubscribe. */
  wsUrl?: string
  /** Resend an unconfirmed transaction this often (2 s), until it lands or its blockhash expires. */
  resendMs?: number
  /** Priority fee in micro-lamports per requested compute unit (0: none). */
  priorityFee?: bigint
}

/**
 * A cluster behind JSON-RPC endpoints (`--rpc`, comma-separated for fallbacks), driven with @solana/kit. A call that
 * cannot reach an endpoint moves to the next. A transaction is resent until the cluster confirms it; once its blockhash
 * has expired unconfirmed (it can never land then), it is built again with a fresh one. With the cluster's websocket
 * (`--ws-rpc`) the confirmation comes as a signatureSubscribe notification; without, by polling getSignatureStatuses.
 */
export class RpcChain implements Chain {
  /** The endpoints, in order of preference. */
  readonly urls: string[]
  private readonly rpcs: ReturnType<typeof createSolanaRpc>[]
  private active = 0
  private readonly subscriptions?: ReturnType<typeof createSolanaRpcSubscriptions>

  constructor(
    url: string | string[],
    private readonly options: RpcChainOptions = {},
  ) {
    this.urls = (Array.isArray(url) ? url : url.split(',')).map((u) => u.trim()).filter((u) => u.length > 0)
    if (this.urls.length === 0) throw new PsycheError('no JSON-RPC endpoint given (--rpc)', {code: 'EUSAGE'})
    this.rpcs = this.urls.map((u) => createSolanaRpc(u))
    if (options.wsUrl) this.subscriptions = createSolanaRpcSubscriptions(options.wsUrl)
  }

  /** The endpoint in use. */
  get url(): string {
    return this.urls[this.active]!
  }

  /** The first endpoint's RPC client. */
  get rpc(): ReturnType<typeof createSolanaRpc> {
    return this.rpcs[this.active]!
  }

  async fetchAccount(address: Address): Promise<Uint8Array | undefined> {
    const {value} = await this.call((rpc) => rpc.getAccountInfo(address, {encoding: 'base64', commitment: 'confirmed'}).send())
    return value ? Buffer.from(value.data[0], 'base64') : undefined
  }

  async minimumBalance(bytes: number): Promise<bigint> {
    return this.call((rpc) => rpc.getMinimumBalanceForRentExemption(BigInt(bytes)).send())
  }

  /** Signs, sends (with preflight simulation), resends and, past its blockhash, rebuilds until the transaction is confirmed. */
  async send(payer: TransactionSigner, instructions: Instruction[]): Promise<SendResult> {
    const deadline = Date.now() + (this.options.confirmTimeoutMs ?? 60_000)
    let signature: Signature | undefined
    for (;;) {
      const {value: blockhash} = await this.call((rpc) => rpc.getLatestBlockhash({commitment: 'confirmed'}).send())
      const message = pipe(
        createTransactionMessage({version: 0}),
        (m) => setTransactionMessageFeePayerSigner(payer, m),
        (m) => setTransactionMessageLifetimeUsingBlockhash(blockhash, m),
        (m) => appendTransactionMessageInstructions(withComputeBudget(instructions, this.options.priorityFee ?? 0n), m),
      )
      const tx = await signTransactionMessageWithSigners(message)
      const tooLarge = oversized(tx)
      if (tooLarge) throw new PsycheError(`${this.url}: ${tooLarge}`, {code: 'ETXSIZE'})
      signature = getSignatureFromTransaction(tx)
      const wire = getBase64EncodedWireTransaction(tx)
      const refused = await this.submit(wire, false)
      if (refused === 'expired') {
        if (Date.now() > deadline) throw this.notConfirmed(signature)
        continue
      }
      if (refused) return refused
      const outcome = await this.confirm(signature, wire, blockhash.lastValidBlockHeight, deadline)
      if (outcome !== 'expired') return outcome
      if (Date.now() > deadline) throw this.notConfirmed(signature)
    }
  }

  /**
   * Sends the transaction: undefined once accepted, its failure when preflight refused it, 'expired' when its blockhash is
   * unknown to the cluster. A resend skips preflight (the transaction was simulated once; the cluster drops duplicates).
   */
  private async submit(wire: ReturnType<typeof getBase64EncodedWireTransaction>, resend: boolean): Promise<SendResult | 'expired' | undefined> {
    try {
      await this.call((rpc) => rpc.sendTransaction(wire, {encoding: 'base64', preflightCommitment: 'confirmed', skipPreflight: resend, ...(resend ? {maxRetries: 0n} : {})}).send())
      return undefined
    } catch (error) {
      const preflight = error instanceof PsycheError ? error.cause : error
      if (isSolanaError(preflight, SOLANA_ERROR__JSON_RPC__SERVER_ERROR_SEND_TRANSACTION_PREFLIGHT_FAILURE)) {
        const logs = (preflight.context.logs ?? []) as string[]
        const cause = preflight.cause
        const computeUnits = BigInt(preflight.context.unitsConsumed ?? 0)
        if (isSolanaError(cause, SOLANA_ERROR__TRANSACTION_ERROR__BLOCKHASH_NOT_FOUND)) return 'expired'
        if (isSolanaError(cause, SOLANA_ERROR__INSTRUCTION_ERROR__CUSTOM)) {
          const code = cause.context.code
          return {ok: false, code, error: programErrorName(logs, code), logs, computeUnits}
        }
        return {ok: false, error: (cause as Error | undefined)?.message ?? preflight.message, logs, computeUnits}
      }
      if (resend) return undefined // a failed resend changes nothing: the first send was accepted
      throw error
    }
  }

  /** Waits for the confirmation, resending every resendMs; 'expired' once the blockhash's last valid block height has passed. */
  private async confirm(signature: Signature, wire: ReturnType<typeof getBase64EncodedWireTransaction>, lastValid: bigint, deadline: number): Promise<SendResult | 'expired'> {
    const resendMs = this.options.resendMs ?? 2000
    let notified: SendResult | undefined
    const abort = new AbortController()
    let wake: () => void = () => {}
    if (this.subscriptions) {
      const notifications = await this.subscriptions
        .signatureNotifications(signature, {commitment: 'confirmed'})
        .subscribe({abortSignal: abort.signal})
        .catch((error: unknown) => {
          throw this.unreachable(error)
        })
      void (async () => {
        try {
          for await (const n of notifications) {
            const err = (n.value as {err: unknown}).err
            notified = err
              ? {ok: false, error: JSON.stringify(err, (_k, v) => (typeof v === 'bigint' ? Number(v) : v)), logs: [], computeUnits: 0n}
              : {ok: true, logs: [], computeUnits: 0n}
            wake()
            return
          }
        } catch {
          // aborted
        }
      })()
    }
    try {
      let lastResend = Date.now()
      // Asked at once, then every pollMs (with a websocket: once, then the notification): a cluster that confirms
      // quickly (a localnet at once) costs one round trip.
      for (let asked = false; ;) {
        if (notified) return notified
        if (!this.subscriptions || !asked) {
          const decided = await this.status(signature)
          if (decided) return decided
          asked = true
        }
        if (Date.now() > deadline) throw this.notConfirmed(signature)
        if (Date.now() - lastResend >= resendMs) {
          lastResend = Date.now()
          const height = await this.call((rpc) => rpc.getBlockHeight({commitment: 'confirmed'}).send())
          if (height > lastValid) {
            const decided = await this.status(signature)
            return decided ?? 'expired'
          }
          await this.submit(wire, true)
        }
        const wait = this.subscriptions ? Math.min(resendMs, Math.max(0, deadline - Date.now())) : (this.options.pollMs ?? 400)
        await new Promise<void>((resolve) => {
          const timer = setTimeout(resolve, wait)
          wake = () => {
            clearTimeout(timer)
            resolve()
          }
        })
      }
    } finally {
      abort.abort()
    }
  }

  /** The transaction's outcome once the cluster has confirmed it (undefined while it has not). */
  private async status(signature: Signature): Promise<SendResult | undefined> {
    const {value} = await this.call((rpc) => rpc.getSignatureStatuses([signature]).send())
    const status = value[0]
    if (status?.err) return {ok: false, error: JSON.stringify(status.err, (_k, v) => (typeof v === 'bigint' ? Number(v) : v)), logs: [], computeUnits: 0n}
    if (status && (status.confirmationStatus === 'confirmed' || status.confirmationStatus === 'finalized')) return {ok: true, logs: [], computeUnits: 0n}
    return undefined
  }

  private notConfirmed(signature: Signature): PsycheError {
    return new PsycheError(`${this.url}: transaction ${signature} was not confirmed within ${(this.options.confirmTimeoutMs ?? 60_000) / 1000} s`)
  }

  /** Calls the active endpoint; one it cannot reach (no answer, HTTP error) gives way to the next, each tried once. */
  private async call<T>(fn: (rpc: ReturnType<typeof createSolanaRpc>) => Promise<T>): Promise<T> {
    let last: unknown
    for (let tried = 0; tried < this.rpcs.length; tried++) {
      const index = (this.active + tried) % this.rpcs.length
      try {
        const result = await fn(this.rpcs[index]!)
        this.active = index
        return result
      } catch (error) {
        last = error
        if (!unreachableEndpoint(error)) {
          this.active = index
          throw this.unreachable(error)
        }
      }
    }
    throw this.unreachable(last)
  }

  private unreachable(error: unknown): Error {
    if (error instanceof PsycheError) return error
    const message = error instanceof Error ? error.message : String(error)
    return new PsycheError(`${this.url}: ${message}`, {code: 'ERPC', cause: error})
  }
}

/** The endpoint did not answer (connection refused, reset, DNS, timeout) or answered with an HTTP error: another may. */
function unreachableEndpoint(error: unknown): boolean {
  if (isSolanaError(error, SOLANA_ERROR__RPC__TRANSPORT_HTTP_ERROR)) return true
  if (isSolanaError(error)) return false // the endpoint answered (a JSON-RPC error)
  return (
    error instanceof TypeError || (error instanceof Error && /fetch failed|ECONNREFUSED|ECONNRESET|ENOTFOUND|ETIMEDOUT|socket/i.test(`${error.message} ${String(error.cause)}`))
  )
}

/** The system program's errors (SystemError), which its callers pass on as their own. */
const SYSTEM_ERRORS: Record<number, string> = {
  0: 'AccountAlreadyInUse',
  1: 'ResultWithNegativeLamports (the payer holds too few lamports)',
  2: 'InvalidProgramId',
  3: 'InvalidAccountDataLength',
  4: 'MaxSeedLengthExceeded',
  5: 'AddressWithSeedMismatch',
  6: 'NonceNoRecentBlockhashes',
  7: 'NonceBlockhashNotExpired',
  8: 'NonceUnexpectedBlockhashValue',
}

/**
 * The name of a custom error, by the program that raised it: the first program the logs show failing (a call the
 * program made, to the system program, may have failed, and the program passed its error on). psyche's programs share
 * their codes (PROGRAM_ERRORS); a program of its own kind is named by its id.
 */
export function programErrorName(logs: string[], code: number): string {
  const failing = logs.find((l) => / failed: custom program error: /.test(l))
  const program = failing?.match(/^Program (\S+) failed/)?.[1]
  if (program === '11111111111111111111111111111111') return `system program: ${SYSTEM_ERRORS[code] ?? `custom error ${code}`}`
  return PROGRAM_ERRORS[code] ?? `custom error ${code}${program ? ` of program ${program}` : ''}`
}
