import {createKeyPairSignerFromPrivateKeyBytes, type Address, type Instruction, type KeyPairSigner} from '@solana/kit'
import {createHash} from 'node:crypto'
import {readFileSync} from 'node:fs'
import {AUTHORIZER_PROGRAM_PATH, COORDINATOR_PROGRAM_PATH, LocalChain, programPath, type ChainFeatures} from '../../src/core/backend/solana/local-chain.js'
import {
  accuseInstruction,
  checkpointInstruction,
  hashWitnessInstruction,
  coordinatorAddress,
  ejectInstruction,
  equivocationInstructions,
  healthCheckInstruction,
  initCoordinatorInstructions,
  joinRunInstruction,
  reportScoresInstruction,
  setPausedInstruction,
  tickInstruction,
  updateInstruction,
  warmupWitnessInstruction,
  witnessInstruction,
  withdrawInstruction,
} from '../../src/core/backend/solana/instructions.js'
import type {CoordinatorEvent, CoordinatorState} from '../../src/core/coordinator/index.js'
import {recordScores, type RewardsLedger} from '../../src/core/coordinator/rewards.js'
import {assignedTrainers, selectVerifiers} from '../../src/core/coordinator/rules.js'
import type {SendResult} from '../../src/core/backend/solana/chain.js'
import {STATE_SIZE, decodeCoordinator} from '../../src/core/backend/solana/layout.js'
import type {CoordinatorConfig, LLMConfig} from '../../src/core/config/index.js'

/** A deterministic keypair from a label (tests and vectors name their clients). */
export async function keypair(label: string): Promise<KeyPairSigner> {
  return createKeyPairSignerFromPrivateKeyBytes(createHash('sha256').update(`psyche-test-key/${label}`).digest())
}

export interface Deployed {
  chain: LocalChain
  programId: Address
  coordinator: Address
  payer: KeyPairSigner
  authority: KeyPairSigner
  /** The authorizer program, deployed beside the coordinator. */
  authorizer: Address
}

/**
 * A LiteSVM with the committed programs deployed as a cluster deploys them (the loader's deploy-time checks, with the
 * `features` of a current cluster: the sBPF v3 builds; 'legacy': the v0 builds), and a run's coordinator account
 * initialized at `now`.
 */
export async function deployRun(runId: string, now: number, joinAuthority: Address | null = null, features: ChainFeatures = 'current'): Promise<Deployed> {
  const programId = (await keypair('program')).address
  const chain = new LocalChain(programId, null, features)
  await chain.deploy(programId, readFileSync(programPath(COORDINATOR_PROGRAM_PATH, features)))
  const payer = await keypair('payer')
  const authority = await keypair('authority')
  chain.airdrop(payer.address)
  chain.airdrop(authority.address)
  const authorizer = (await keypair('authorizer-program')).address
  await chain.deploy(authorizer, readFileSync(programPath(AUTHORIZER_PROGRAM_PATH, features)))
  chain.setTime(now)
  const coordinator = await coordinatorAddress(programId, runId)
  const r = await chain.send(
    payer,
    initCoordinatorInstructions({programId, coordinator, payer, runId, mainAuthority: authority.address, joinAuthority, authorizer, lamports: chain.rentExemption(STATE_SIZE)}),
  )
  if (!r.ok) throw new Error(`init_coordinator failed: ${r.error}\n${r.logs.join('\n')}`)
  return {chain, programId, coordinator, payer, authority, authorizer}
}

export function readRun(d: Deployed) {
  const data = d.chain.accountData(d.coordinator)
  if (!data) throw new Error('no coordinator account')
  return decodeCoordinator(data)
}

function inRoundWitness(d: Deployed): boolean {
  try {
    return readRun(d).state.run_state === 'RoundWitness'
  } catch {
    return false
  }
}

/** The run config the program tests install with `update`. */
export const testConfig: CoordinatorConfig = {
  warmup_time: 10,
  cooldown_time: 5,
  epoch_time: 100,
  max_round_train_time: 10,
  round_witness_time: 2,
  min_clients: 1,
  init_min_clients: 1,
  witness_nodes: 1,
  verification_percent: 0,
  global_batch_size_start: 8,
  global_batch_size_end: 8,
  global_batch_size_warmup_tokens: 0,
  total_steps: 100,
  waiting_for_members_extra_time: 3,
}
export const testModel: {LLM: LLMConfig} = {
  LLM: {
    architecture: 'HfLlama',
    data_type: 'Pretraining',
    max_seq_len: 16,
    cold_start_warmup_steps: 0,
    checkpoint: {Hub: {repo_id: 'org/model', revision: 'v1'}},
    data_location: {Server: '127.0.0.1:20001'},
    lr_schedule: {Constant: {base_lr: 1e-3, warmup_steps: 0, warmup_init_lr: 0}},
    optimizer: {AdamW: {betas: [0.9, 0.95], weight_decay: 0, eps: 1e-8}},
  },
}

/** The instruction (and its signer) that carries a reference event to the program. */
export function toInstruction(d: Deployed, signers: Map<string, KeyPairSigner>, event: CoordinatorEvent): {signer: KeyPairSigner; ix: Instruction | Instruction[]} {
  const {programId: p, coordinator: c, authority, payer} = d
  const who = (id: string): KeyPairSigner => {
    const s = signers.get(id)
    if (!s) throw new Error(`no keypair for client ${id}`)
    return s
  }
  switch (event.type) {
    case 'join':
      return {signer: who(event.id), ix: joinRunInstruction(p, c, who(event.id))}
    case 'withdraw':
      return {signer: who(event.id), ix: withdrawInstruction(p, c, who(event.id))}
    case 'eject':
      return {signer: authority, ix: ejectInstruction(p, c, authority, event.id)}
    case 'tick':
      // as the client does: a tick in RoundWitness may close the round, and asks for that budget
      return {signer: payer, ix: tickInstruction(p, c, inRoundWitness(d))}
    case 'witness':
      if (event.param_hash !== undefined) return {signer: who(event.from), ix: hashWitnessInstruction(p, c, who(event.from), event.step, event.param_hash)}
      if (event.proof.participant_bloom === '' && event.proof.broadcast_bloom === '') return {signer: who(event.from), ix: warmupWitnessInstruction(p, c, who(event.from))}
      return {
        signer: who(event.from),
        ix: witnessInstruction(p, c, who(event.from), event.step, Buffer.from(event.proof.participant_bloom, 'base64'), Buffer.from(event.proof.broadcast_bloom, 'base64')),
      }
    case 'health_check':
      return {signer: who(event.from), ix: healthCheckInstruction(p, c, who(event.from), event.accused)}
    case 'pause':
    case 'resume':
      return {signer: authority, ix: setPausedInstruction(p, c, authority, event.type === 'pause')}
    case 'checkpoint':
      return {signer: who(event.from), ix: checkpointInstruction(p, c, who(event.from), event.repo, event.param_hash)}
    case 'config_update':
      return {signer: authority, ix: updateInstruction(p, c, authority, event.config, event.model)}
    case 'accuse':
      return {signer: who(event.from), ix: accuseInstruction(p, c, who(event.from), event.step, event.accused, event.reason)}
    case 'equivocation':
      return {signer: who(event.from), ix: equivocationInstructions(p, c, who(event.from), event.proof)}
  }
}

/**
 * Every verifier of `state`'s round reports `scoreOf(trainer)` (fixed point) for the previous round's trainers the seed
 * assigned it (report_scores), as honest Solana clients do; each report is also taken into the reference `ledger`
 * (rewards.ts recordScores), which must accept it. Returns the ledger after them and each report's send result.
 */
export async function reportAssignedScores(
  d: Deployed,
  signers: Map<string, KeyPairSigner>,
  state: CoordinatorState,
  ledger: RewardsLedger,
  scoreOf: (trainer: string) => number,
): Promise<{ledger: RewardsLedger; sent: SendResult[]}> {
  const round = state.epoch.round
  const scored = state.epoch.previous_round
  if (!round || !scored || round.step !== scored.step + 1) throw new Error(`no round to score: step ${round?.step}, previous ${scored?.step}`)
  const sent: SendResult[] = []
  for (const v of selectVerifiers(state)) {
    const scores = assignedTrainers(state, round, scored, v).map((client_id) => ({client_id, score: scoreOf(client_id)}))
    const signer = signers.get(v)!
    const entries = scores.map((e) => ({index: scored.roster.indexOf(e.client_id), score: e.score}))
    sent.push(await d.chain.send(signer, [reportScoresInstruction(d.programId, d.coordinator, signer, scored.step, entries)]))
    const out = recordScores(ledger, state, v, scored.step, scores)
    if ('code' in out) throw new Error(`the reference refuses ${v.slice(0, 8)}'s scores: ${out.reason}`)
    ledger = out
  }
  return {ledger, sent}
}
