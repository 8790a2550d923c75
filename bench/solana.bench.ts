// `npm run bench -- solana`: compute units and transaction bytes of the coordinator program's instructions, by default
// at full capacity (MAX_CLIENTS = 256 clients, 32 automatic witnesses; PSYCHE_BENCH_CLIENTS=N for another size), in
// LiteSVM, and LiteSVM's time per transaction. Each transaction asks for its instructions' budgets (INSTRUCTION_UNITS).
import {performance} from 'node:perf_hooks'
import type {Address, KeyPairSigner} from '@solana/kit'
import {
  accuseInstruction,
  HEALTH_CHECK_BATCH,
  bufferedUpdateTransactions,
  updateBufferAddress,
  healthCheckInstruction,
  equivocationInstructions,
  joinRunInstruction,
  peerAddress,
  reportScoresInstruction,
  setPausedInstruction,
  setPeerInstruction,
  tickInstruction,
  updateInstruction,
  warmupWitnessInstruction,
  witnessInstruction,
} from '../src/core/backend/solana/instructions.js'
import {MAX_CLIENTS, PEER_SIZE, UPDATE_BUFFER_SIZE, clientIdOf} from '../src/core/backend/solana/layout.js'
import {constant} from '../src/core/layout/layout-table.js'
import {assignBatches, buildWitnessProof, selectWitnesses, type CoordinatorState} from '../src/core/coordinator/index.js'
import {deployRun, keypair, readRun} from '../test/solana/harness.js'
import {BloomFilter} from '../src/core/primitives/bloom.js'
import {assignedTrainers, participantKey, selectVerifiers, witnessBloomParams} from '../src/core/coordinator/rules.js'
import {createHash} from 'node:crypto'
import {signAnnouncement} from '../src/core/primitives/announcement.js'
import {identityFromSeed} from '../src/core/protocol/identity.js'

const N = Number(process.env.PSYCHE_BENCH_CLIENTS ?? MAX_CLIENTS)
if (!Number.isInteger(N) || N < 4 || N > MAX_CLIENTS) throw new Error(`PSYCHE_BENCH_CLIENTS must be 4 to ${MAX_CLIENTS}`)
const config = {
  warmup_time: 10,
  cooldown_time: 5,
  epoch_time: 10_000,
  max_round_train_time: 30,
  round_witness_time: 2,
  min_clients: N >= 48 ? 1 : Math.floor(N / 2),
  init_min_clients: N,
  witness_nodes: N >= 48 ? 0 : Math.floor(N / 2),
  /** a quarter of the roster verifies (64 of 256: their windows of 4 cover every trainer), for report_scores */
  verification_percent: 25,
  global_batch_size_start: Math.max(128, 2 * N),
  global_batch_size_end: Math.max(128, 2 * N),
  global_batch_size_warmup_tokens: 0,
  total_steps: 1000,
  waiting_for_members_extra_time: 0,
}
const model = {
  LLM: {
    architecture: 'HfLlama' as const,
    data_type: 'Pretraining' as const,
    max_seq_len: 512,
    cold_start_warmup_steps: 0,
    checkpoint: {Hub: {repo_id: 'org/model'}},
    data_location: {Server: '127.0.0.1:20001'},
    lr_schedule: {Constant: {base_lr: 1e-3, warmup_steps: 0, warmup_init_lr: 0}},
    optimizer: {AdamW: {betas: [0.9, 0.95] as [number, number], weight_decay: 0, eps: 1e-8}},
  },
}

const T0 = 1_700_000_000
const d = await deployRun('bench-run', T0)
const {chain, programId: p, coordinator: c, authority: a} = d
const cu = new Map<string, bigint[]>()
const sizes = new Map<string, number>()
let txs = 0
let txSeconds = 0
/** The run's payer pays every fee; the instruction's own signer (client, authority) signs too. */
async function send(name: string, _signer: KeyPairSigner, ix: Parameters<typeof chain.send>[1][number] | Parameters<typeof chain.send>[1]): Promise<void> {
  const start = performance.now()
  const r = await chain.send(d.payer, Array.isArray(ix) ? ix : [ix])
  txSeconds += (performance.now() - start) / 1000
  txs++
  if (!r.ok) throw new Error(`${name}: ${r.error}\n${r.logs.join('\n')}`)
  cu.set(name, [...(cu.get(name) ?? []), r.computeUnits])
  sizes.set(name, Math.max(sizes.get(name) ?? 0, r.bytes ?? 0))
}

const clients: KeyPairSigner[] = []
for (let i = 0; i < N; i++) clients.push(await keypair(`bench-${i}`))
const byId = new Map<string, KeyPairSigner>(clients.map((k) => [clientIdOf(k.address), k]))
// The largest configuration: MODEL_JSON_MAX bytes of model JSON, through the update buffer (init, chunks, apply).
{
  const {max_seq_len: _m, cold_start_warmup_steps: _c, checkpoint: _k, ...rest} = model.LLM
  const pad = constant('MODEL_JSON_MAX') - Buffer.byteLength(JSON.stringify({...rest, data_location: {Server: ''}}))
  const big = {LLM: {...model.LLM, data_location: {Server: 'x'.repeat(pad)}}}
  const buffer = await updateBufferAddress(p, c)
  const txs = bufferedUpdateTransactions(p, c, a, buffer, chain.rentExemption(UPDATE_BUFFER_SIZE), config, big)
  await send('buffer_init', a, txs[0])
  for (const tx of txs.slice(1, -1)) await send('buffer_write (700 B)', a, tx)
  await send('update_from_buffer (4,096 B of model JSON)', a, txs[txs.length - 1])
}
await send('update', a, updateInstruction(p, c, a, config, model))
await send('set_paused (resume)', a, setPausedInstruction(p, c, a, false))
for (const k of clients) await send('join_run', k, joinRunInstruction(p, c, k))
const addrs = ['/ip4/203.0.113.7/tcp/4001', '/ip4/203.0.113.7/tcp/4001/p2p/12D3KooWAbCdEfGhIjKlMnOpQrStUvWxYz0123456789abcdefgh']
for (const k of clients.slice(0, 8)) {
  chain.airdrop(k.address)
  const record = await peerAddress(p, c, k.address)
  await send('set_peer (creates the record)', k, setPeerInstruction(p, c, k, record, addrs, chain.rentExemption(PEER_SIZE)))
  await send('set_peer (updates it)', k, setPeerInstruction(p, c, k, record, addrs.slice(0, 1), chain.rentExemption(PEER_SIZE)))
}
let now = T0
const state = (): CoordinatorState => readRun(d).state
async function tick(): Promise<void> {
  chain.setTime(++now)
  await send(`tick (${state().run_state})`, d.payer, tickInstruction(p, c))
}
await tick() // WaitingForMembers → Warmup: N clients
for (const k of clients.slice(0, 32)) if (state().run_state === 'Warmup') await send('warmup_witness', k, warmupWitnessInstruction(p, c, k))

/** Every selected witness sends a proof that names every trainer with batches but those in `skip`. */
async function witnessRound(skip: string[] = []): Promise<void> {
  const s = state()
  const round = s.epoch.round!
  const seen = [...assignBatches(s)].filter(([id, r]) => r.end > r.start && !skip.includes(id)).map(([id, range]) => ({id, range, commitment: Buffer.alloc(32, 1)}))
  const proof = buildWitnessProof(s.config, round, seen)
  for (const w of selectWitnesses(s)) {
    if (state().run_state !== 'RoundTrain' && state().run_state !== 'RoundWitness') break
    await send(
      'witness',
      byId.get(w)!,
      witnessInstruction(p, c, byId.get(w)!, round.step, Buffer.from(proof.participant_bloom, 'base64'), Buffer.from(proof.broadcast_bloom, 'base64')),
    )
  }
}

/** Up to `n` non-witnesses of the round that a proof leaving them out does not name (a bloom's false positives would). */
function absentees(n: number): string[] {
  const s = state()
  const round = s.epoch.round!
  const witnesses = selectWitnesses(s)
  const ranges = assignBatches(s)
  const out: string[] = []
  for (const id of round.roster) {
    if (out.length === n) break
    if (witnesses.includes(id)) continue
    const skip = [...out, id]
    const seen = [...ranges].filter(([x, r]) => r.end > r.start && !skip.includes(x)).map(([x, range]) => ({id: x, range, commitment: Buffer.alloc(32, 1)}))
    const bloom = BloomFilter.fromBase64(witnessBloomParams(s.config, round), buildWitnessProof(s.config, round, seen).participant_bloom)
    if (skip.every((x) => !bloom.contains(participantKey(x)))) out.push(id)
  }
  return out
}

if (state().run_state !== 'RoundTrain') throw new Error(`expected RoundTrain, got ${state().run_state}`)
const first = state()
const absent = absentees(Math.min(HEALTH_CHECK_BATCH, Math.floor(N / 4)))
await witnessRound(absent) // round 1: nobody saw `absent`
while (state().run_state !== 'RoundTrain' || state().epoch.round!.step === first.epoch.round!.step) await tick()
const witnesses = selectWitnesses(state())
const reporter = byId.get(witnesses[0])!
await send('health_check (1 accused)', reporter, healthCheckInstruction(p, c, reporter, absent.slice(0, 1)))
if (absent.length > 1) await send(`health_check (${absent.length} accused)`, reporter, healthCheckInstruction(p, c, reporter, absent.slice(1).concat(absent[0])))
const victim = state().epoch.round!.roster.find((id) => !witnesses.includes(id) && !absent.includes(id))!
for (const w of witnesses.slice(0, Math.min(22, witnesses.length)))
  await send('accuse', byId.get(w)!, accuseInstruction(p, c, byId.get(w)!, state().epoch.round!.step, victim as Address))
// The verifiers of round 2 report their scores of round 1's results (each its K = 4 assigned trainers); one lists its
// trainers 16 times over (64 entries, the most one report holds).
{
  const s = state()
  const round = s.epoch.round!
  const scored = s.epoch.previous_round!
  for (const [i, v] of selectVerifiers(s).entries()) {
    const mine = assignedTrainers(s, round, scored, v).map((id) => ({index: scored.roster.indexOf(id), score: 300_000}))
    const entries = i === 0 ? Array.from({length: 64}, (_, k) => mine[k % mine.length]) : mine
    await send(`report_scores (${entries.length} entries)`, byId.get(v)!, reportScoresInstruction(p, c, byId.get(v)!, scored.step, entries))
  }
}
// An equivocation proof: two signed announcements of one producer, checked by the Ed25519 program and the coordinator.
const producer = state().epoch.round!.roster.find((id) => !witnesses.includes(id) && !absent.includes(id) && id !== victim)!
const producerIdentity = identityFromSeed(
  createHash('sha256')
    .update(`psyche-test-key/bench-${clients.findIndex((k) => clientIdOf(k.address) === producer)}`)
    .digest(),
)
const announce = (commitment: number) =>
  signAnnouncement(producerIdentity, {
    run_id: 'bench-run',
    step: state().epoch.round!.step,
    client_id: producer,
    batch_start: 0,
    batch_end: 2,
    commitment: Buffer.alloc(32, commitment).toString('hex'),
    size: 1000,
  })
await send('equivocation (with the Ed25519 check)', reporter, equivocationInstructions(p, c, reporter, {a: announce(1), b: announce(2)}))
if (state().epoch.clients.find((x) => x.id === producer)?.state !== 'Ejected') throw new Error('the equivocation did not eject the producer')
await witnessRound()
await tick()
// Pausing: the round ends in Cooldown, whose last tick carries every healthy client into the pending list (Paused);
// resumed and paused again in WaitingForMembers, the healthy clients are already pending (the list is deduplicated).
await send('set_paused (pause, in a round)', a, setPausedInstruction(p, c, a, true))
await witnessRound()
for (let i = 0; i < 100 && state().run_state !== 'Paused'; i++) await tick()
if (state().run_state !== 'Paused' || state().pending.length < N - 8) throw new Error(`expected Paused with the clients pending, got ${state().run_state}`)
await send('set_paused (resume)', a, setPausedInstruction(p, c, a, false))
await send('set_paused (pause, in WaitingForMembers)', a, setPausedInstruction(p, c, a, true))

const rows = [...cu.entries()].map(([name, values]) => {
  const sorted = values.map(Number).sort((x, y) => x - y)
  return {name, n: sorted.length, median: sorted[Math.floor(sorted.length / 2)], max: sorted[sorted.length - 1], bytes: sizes.get(name) ?? 0}
})
console.log(`${N} clients`)
console.log('| instruction | count | median CU | max CU | max bytes |')
console.log('|---|---|---|---|---|')
for (const r of rows) console.log(`| ${r.name} | ${r.n} | ${r.median.toLocaleString('en-US')} | ${r.max.toLocaleString('en-US')} | ${r.bytes.toLocaleString('en-US')} |`)
console.log(`\n${txs} transactions in LiteSVM: ${((txSeconds / txs) * 1000).toFixed(2)} ms each on average (sign, execute, read back excluded)`)
