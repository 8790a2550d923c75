import {createSolanaRpcSubscriptions, type Address} from '@solana/kit'
import type {Chain} from './chain.js'

/**
 * Following an account (the coordinator's) as it changes: over a validator's websocket
 * (accountSubscribe: one notification per change), or by polling any Chain (LiteSVM, an RPC without a
 * websocket). `onData` gets the account's bytes each time they differ from the last; it runs until
 * `signal` aborts.
 */

export async function subscribeAccount(wsUrl: string, address: Address, onData: (data: Uint8Array) => void, signal: AbortSignal): Promise<void> {
  const subscriptions = createSolanaRpcSubscriptions(wsUrl)
  const notifications = await subscriptions.accountNotifications(address, {encoding: 'base64', commitment: 'confirmed'}).subscribe({abortSignal: signal})
  try {
    for await (const n of notifications) onData(Buffer.from(n.value.data[0], 'base64'))
  } catch (error) {
    if (!signal.aborted) throw error
  }
}

export async function pollAccount(chain: Chain, address: Address, onData: (data: Uint8Array) => void, signal: AbortSignal, intervalMs = 500): Promise<void> {
  let last: Buffer | undefined
  while (!signal.aborted) {
    const data = await chain.fetchAccount(address)
    if (data && (!last || !last.equals(data))) {
      last = Buffer.from(data)
      onData(data)
    }
    await new Promise<void>((resolve) => {
      const t = setTimeout(resolve, intervalMs)
      signal.addEventListener('abort', () => (clearTimeout(t), resolve()), {once: true})
    })
  }
}
