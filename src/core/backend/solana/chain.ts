import {
  SOLANA_ERROR__INSTRUCTION_ERROR__CUSTOM,
  SOLANA_ERROR__JSON_RPC__SERVER_ERROR_SEND_TRANSACTION_PREFLIGHT_FAILURE,
  appendTransactionMessageInstructions,
  createSolanaRpc,
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

/** A cluster behind a JSON-RPC endpoint (`--rpc`), driven with @solana/kit. */
export class RpcChain implements Chain {
  readonly rpc: ReturnType<typeof createSolanaRpc>

  constructor(
    readonly url: string,
    private readonly options: {confirmTimeoutMs?: number; pollMs?: number} = {},
  ) {
    this.rpc = createSolanaRpc(url)
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
    // Asked at once, then every pollMs: a cluster that confirms quickly (a localnet at once) costs one round trip.
    for (let wait = 50; ; wait = this.options.pollMs ?? 400) {
      const {value} = await this.call(() => this.rpc.getSignatureStatuses([signature]).send())
      const status = value[0]
      if (status?.err) return {ok: false, error: JSON.stringify(status.err, (_k, v) => (typeof v === 'bigint' ? Number(v) : v)), logs: [], computeUnits: 0n}
      if (status && (status.confirmationStatus === 'confirmed' || status.confirmationStatus === 'finalized')) return {ok: true, logs: [], computeUnits: 0n}
      if (Date.now() > deadline) throw new PsycheError(`${this.url}: transaction ${signature} was not confirmed within ${(this.options.confirmTimeoutMs ?? 60_000) / 1000} s`)
      await new Promise((r) => setTimeout(r, wait))
    }
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
