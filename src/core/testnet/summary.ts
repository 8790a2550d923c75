/**
 * The testnet's picture of the run, from the clients' round events: pure bookkeeping, no processes. The
 * launcher feeds it events (recordRound, recordKill...) and asks for the summary at the end.
 */

export interface ClientRound {
  loss: number | null
  /** The validation loss after the round, when the client evaluated (join --eval-every); else null. */
  val_loss: number | null
  param_hash: string
  /** Other clients' results it applied, and how many other clients trained in the round (null: not reported). */
  peers_applied: number | null
  other_trainers: number | null
}

export interface TestnetSummary {
  run_id: string
  clients: string[]
  /** Per applied round: each client's loss (null: did not train in it) and parameter hash, and whether all hashes agree. */
  rounds: {step: number; epoch: number; clients: Record<string, ClientRound>; hashes_equal: boolean; exchanged: boolean}[]
  /**
   * Rounds in which some client applied no other client's result although others trained: no exchange happened
   * for it (equal hashes then prove nothing). A healthy run has none.
   */
  rounds_without_exchange: number
  kills: {client: string; at_seconds: number; after_step: number | null}[]
  /** A killed client's first applied round after its restart (null: it did not get to apply one). */
  rejoins: {client: string; at_seconds: number; first_step: number | null; param_hash: string | null}[]
  /** Bytes of result/model transfers per client, summed over its restarts. */
  bytes: Record<string, {in: number; out: number}>
  /** Mean compressed result size per client per round, and the dense fp32 size it replaces (when known). */
  result_bytes_per_round: number | null
  /**
   * Per client: rounds whose compute it began on their predicted batches before they started (client/training.ts
   * speculate), and of those, how many the round used and how many were undone (its batches changed).
   */
  speculation: Record<string, {used: number; discarded: number}>
  /** The validation loss (held-out samples) at each evaluated step: the clients' mean (replicas agree). */
  validation: {step: number; loss: number}[]
  wall_seconds: number
  ended: 'rounds' | 'finished' | 'timeout' | 'failed' | 'interrupted'
}

/** One client's `round` event, as `psyche join --json` prints it (the fields the summary uses). */
interface RoundLine {
  step: number
  epoch: number
  loss: number | null
  param_hash: string
  bytes_in: number
  bytes_out: number
  result_bytes: number | null
  peers_applied: number | null
  other_trainers: number | null
  val_loss?: number | null
}

/** Reads a `round` event's fields, or undefined when the line is not a well-formed one. */
export function parseRoundLine(e: Record<string, unknown>): RoundLine | undefined {
  if (e.event !== 'round' || typeof e.step !== 'number' || typeof e.param_hash !== 'string') return undefined
  return {
    step: e.step,
    epoch: e.epoch as number,
    loss: (e.loss as number | null) ?? null,
    param_hash: e.param_hash,
    bytes_in: e.bytes_in as number,
    bytes_out: e.bytes_out as number,
    result_bytes: typeof e.result_bytes === 'number' ? e.result_bytes : null,
    peers_applied: typeof e.peers_applied === 'number' ? e.peers_applied : null,
    other_trainers: typeof e.other_trainers === 'number' ? e.other_trainers : null,
    val_loss: typeof e.val_loss === 'number' ? e.val_loss : null,
  }
}

/** Per-client byte counters: a restarted process counts from zero, so earlier generations are summed. */
interface ClientBytes {
  before: {in: number; out: number}
  now: {in: number; out: number}
}

export class RoundBook {
  private readonly rounds = new Map<number, {epoch: number; clients: Record<string, ClientRound>}>()
  private readonly resultBytes: number[] = []
  private readonly bytes = new Map<string, ClientBytes>()
  readonly kills: TestnetSummary['kills'] = []
  readonly rejoins: TestnetSummary['rejoins'] = []
  private readonly speculation = new Map<string, {used: number; discarded: number}>()

  constructor(readonly clients: readonly string[]) {
    for (const c of clients) this.bytes.set(c, {before: {in: 0, out: 0}, now: {in: 0, out: 0}})
  }

  recordRound(client: string, r: RoundLine): void {
    let round = this.rounds.get(r.step)
    if (!round) this.rounds.set(r.step, (round = {epoch: r.epoch, clients: {}}))
    round.clients[client] = {loss: r.loss, val_loss: r.val_loss ?? null, param_hash: r.param_hash, peers_applied: r.peers_applied, other_trainers: r.other_trainers}
    this.bytesOf(client).now = {in: r.bytes_in, out: r.bytes_out}
    if (r.result_bytes !== null) this.resultBytes.push(r.result_bytes)
  }

  /** A client process ended: its counters so far belong to an earlier generation. */
  recordExit(client: string): void {
    const b = this.bytesOf(client)
    b.before = {in: b.before.in + b.now.in, out: b.before.out + b.now.out}
    b.now = {in: 0, out: 0}
  }

  /** A client's `speculation` event: its outcome `used` or `discarded` counts (`begun` does not). */
  recordSpeculation(client: string, outcome: unknown): void {
    if (outcome !== 'used' && outcome !== 'discarded') return
    let counts = this.speculation.get(client)
    if (!counts) this.speculation.set(client, (counts = {used: 0, discarded: 0}))
    counts[outcome]++
  }

  recordKill(client: string, atSeconds: number, afterStep: number | null): void {
    this.kills.push({client, at_seconds: atSeconds, after_step: afterStep})
  }

  recordRejoin(client: string, atSeconds: number, first: {step: number; param_hash: string} | null): void {
    this.rejoins.push({client, at_seconds: atSeconds, first_step: first?.step ?? null, param_hash: first?.param_hash ?? null})
  }

  /** The summary; with `rounds`, steps past it are left out (clients may have applied a few more before stopping). */
  summary(o: {runId: string; rounds?: number; wallSeconds: number; ended: TestnetSummary['ended']}): TestnetSummary {
    const steps = [...this.rounds.keys()].sort((a, b) => a - b).filter((s) => o.rounds === undefined || s <= o.rounds)
    const rounds = steps.map((step) => {
      const r = this.rounds.get(step)!
      const hashes = new Set(Object.values(r.clients).map((c) => c.param_hash))
      // A client whose peers trained but whose round took none of their results did not exchange anything.
      const alone = Object.values(r.clients).some((c) => c.other_trainers !== null && c.other_trainers > 0 && c.peers_applied === 0)
      return {step, epoch: r.epoch, clients: r.clients, hashes_equal: hashes.size === 1, exchanged: !alone}
    })
    return {
      run_id: o.runId,
      clients: [...this.clients],
      rounds,
      rounds_without_exchange: rounds.filter((r) => !r.exchanged).length,
      kills: this.kills,
      rejoins: this.rejoins,
      bytes: Object.fromEntries(
        this.clients.map((c) => {
          const b = this.bytesOf(c)
          return [c, {in: b.before.in + b.now.in, out: b.before.out + b.now.out}]
        }),
      ),
      validation: rounds.flatMap((r) => {
        const v = Object.values(r.clients)
          .map((c) => c.val_loss)
          .filter((x): x is number => x !== null)
        return v.length ? [{step: r.step, loss: Math.round((v.reduce((a, b) => a + b, 0) / v.length) * 1e4) / 1e4}] : []
      }),
      speculation: Object.fromEntries(this.clients.map((c) => [c, this.speculation.get(c) ?? {used: 0, discarded: 0}])),
      result_bytes_per_round: this.resultBytes.length ? Math.round(this.resultBytes.reduce((a, b) => a + b, 0) / this.resultBytes.length) : null,
      wall_seconds: Math.round(o.wallSeconds * 10) / 10,
      ended: o.ended,
    }
  }

  private bytesOf(client: string): ClientBytes {
    let b = this.bytes.get(client)
    if (!b) this.bytes.set(client, (b = {before: {in: 0, out: 0}, now: {in: 0, out: 0}}))
    return b
  }
}
