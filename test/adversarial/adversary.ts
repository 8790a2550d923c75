/**
 * A hostile client for the adversarial tests: the real client (PsycheClient, its worker, P2P node and
 * coordinator connection) with a hostile result producer. Test-only: no CLI command or flag reaches it.
 *
 *   node --import tsx test/adversarial/adversary.ts SERVER_ADDR RUN_ID STATE_TOML ATTACK
 *
 * Prints the client's events as JSON lines, like `psyche join --json`.
 */
import {randomBytes} from 'node:crypto'
import {snakeKeys} from '../../src/core/cli/json.js'
import {PsycheClient, seedForRun, type ProducerContext, type ResultProducer} from '../../src/core/client/runner.js'
import {generateIdentity} from '../../src/core/protocol/identity.js'
import {resolveTrainPlan} from '../../src/core/train/plan.js'
import {startComponents} from '../../src/core/compose/client.js'
import {nearCopy, randomWellFormed, signFlipped} from './forge.js'

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms))

/** Waits until a peer's result for this step is here (up to `ms`). */
async function peerResult(ctx: ProducerContext, ms: number): Promise<Uint8Array | undefined> {
  const deadline = Date.now() + ms
  while (Date.now() < deadline) {
    const [first] = [...ctx.peerResults(ctx.step).values()]
    if (first) return first
    await sleep(50)
  }
  return undefined
}

const published = new Map<number, Uint8Array>()

export const attacks: Record<string, ResultProducer> = {
  /** Random bytes of the right size, properly signed and committed. */
  garbage: {publish: async (ctx) => (await ctx.publish(randomBytes(ctx.honest.length)), ctx.honest)},
  random: {publish: async (ctx) => (await ctx.publish(randomWellFormed(ctx.honest, ctx.format!)), ctx.honest)},
  sign_flip: {publish: async (ctx) => (await ctx.publish(signFlipped(ctx.honest, ctx.format!)), ctx.honest)},
  /** Another client's result for this step, one bit changed (so its bytes differ), re-signed as ours. */
  copy: {
    async publish(ctx) {
      const theirs = await peerResult(ctx, 20_000)
      if (!theirs) return undefined
      const copy = nearCopy(theirs, ctx.format!)
      await ctx.publish(copy)
      return copy
    },
  },
  /** Trains on batches far from its assignment, announces its assignment. */
  wrong_batches: {
    batches: (ids) => ids.map((id) => id + 100_000),
    publish: async (ctx) => (await ctx.publish(ctx.honest), ctx.honest),
  },
  /** The honest result, once the round's training time is over. */
  late: {
    async publish(ctx) {
      while (ctx.state().epoch.round?.step === ctx.step && ctx.state().run_state === 'RoundTrain') await sleep(100)
      await sleep(500)
      await ctx.publish(ctx.honest)
      return ctx.honest
    },
  },
  /** Two different signed results for one step. */
  equivocation: {
    async publish(ctx) {
      await ctx.publish(ctx.honest)
      await ctx.publish(signFlipped(ctx.honest, ctx.format!))
      return ctx.honest
    },
  },
  /** A valid result with 64 KiB appended. */
  oversized: {publish: async (ctx) => (await ctx.publish(Buffer.concat([ctx.honest, Buffer.alloc(65_536, 7)])), ctx.honest)},
  /** Its first result again, in every later round. */
  replay: {
    async publish(ctx) {
      const old = published.get(0) ?? ctx.honest
      published.set(0, old)
      await ctx.publish(old)
      return old
    },
  },
}

async function main(): Promise<void> {
  const [serverAddr, runId, config, attack] = process.argv.slice(2)
  const producer = attacks[attack]
  if (!producer) throw new Error(`unknown attack ${attack}; one of ${Object.keys(attacks).join(', ')}`)
  const plan = await resolveTrainPlan({config, optimizer: 'distro', threads: 1, device: 'cpu'})
  const log = (event: Record<string, unknown>) => process.stdout.write(JSON.stringify(event) + '\n')
  const seed = seedForRun(runId)
  const identity = generateIdentity()
  // The real client's components (worker, data, libp2p node, TCP coordinator connection), as `psyche join` builds them.
  // One machine: libp2p on loopback, like the honest clients of the test (startClient).
  const components = await startComponents({serverAddr, runId, identity, plan, seed, log, p2p: {listen: ['/ip4/127.0.0.1/tcp/0']}})
  // The hostile producer is one more component: the real client publishes through it.
  const client = await PsycheClient.start({id: identity.id, runId, plan, seed, log}, {...components, producer})
  log({event: 'adversary', attack, client_id: client.id})
  const summary = await client.run()
  log({event: 'finished', ...snakeKeys(summary)})
}

main().catch((error) => {
  process.stdout.write(JSON.stringify({event: 'error', message: String(error?.message ?? error)}) + '\n')
  process.exit(1)
})
