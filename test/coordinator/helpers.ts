import {applyEvent, assignBatches, buildWitnessProof, createCoordinator, selectWitnesses, type CoordinatorEvent, type CoordinatorState} from '../../src/core/coordinator/index.js'
import type {CoordinatorConfig, LLMConfig} from '../../src/core/config/index.js'

/** One second on the coordinator's clock (unix milliseconds). */
export const S = 1000

export const baseConfig: CoordinatorConfig = {
  warmup_time: 10,
  cooldown_time: 5,
  epoch_time: 100,
  max_round_train_time: 10,
  round_witness_time: 2,
  min_clients: 2,
  init_min_clients: 3,
  witness_nodes: 2,
  verification_percent: 0,
  global_batch_size_start: 8,
  global_batch_size_end: 8,
  global_batch_size_warmup_tokens: 0,
  total_steps: 1000,
  waiting_for_members_extra_time: 3,
}

export const baseLLM: LLMConfig = {
  architecture: 'HfLlama',
  data_type: 'Pretraining',
  max_seq_len: 16,
  cold_start_warmup_steps: 0,
  checkpoint: {Hub: {repo_id: 'org/model'}},
  data_location: {Server: '127.0.0.1:20001'},
  lr_schedule: {Constant: {base_lr: 1e-3, warmup_steps: 0, warmup_init_lr: 0}},
  optimizer: {AdamW: {betas: [0.9, 0.95], weight_decay: 0, eps: 1e-8}},
}

export function newRun(config: Partial<CoordinatorConfig> = {}, llm: Partial<LLMConfig> = {}, seed?: string): CoordinatorState {
  return createCoordinator(
    {run_id: 'test-run', run_state: 'WaitingForMembers', config: {...baseConfig, ...config}, model: {LLM: {...baseLLM, ...llm}}},
    {now: 0, ...(seed ? {seed} : {})},
  )
}

/** Applies an event that must be accepted. */
export function ok(state: CoordinatorState, event: CoordinatorEvent, now: number): CoordinatorState {
  const r = applyEvent(state, event, now)
  if (r.error) throw new Error(`${event.type} rejected: ${r.error.code}: ${r.error.message}`)
  return r.state
}

/** Applies an event that must be rejected with `code`; returns the (unchanged) state. */
export function rejected(state: CoordinatorState, event: CoordinatorEvent, now: number, code: string): string {
  const r = applyEvent(state, event, now)
  if (!r.error) throw new Error(`${event.type} was accepted, expected ${code}`)
  if (r.error.code !== code) throw new Error(`${event.type} rejected with ${r.error.code} (${r.error.message}), expected ${code}`)
  if (r.state !== state) throw new Error('a rejected event changed the state')
  return r.error.message
}

export function joinAll(state: CoordinatorState, ids: string[], now: number): CoordinatorState {
  for (const id of ids) state = ok(state, {type: 'join', id}, now)
  return state
}

/** A proof from `from` that saw every trainer's results (or only those in `saw`). */
export function honestProof(state: CoordinatorState, saw?: string[]): {participant_bloom: string; broadcast_bloom: string} {
  const round = state.epoch.round!
  const seen = [...assignBatches(state)].filter(([id, r]) => r.end > r.start && (!saw || saw.includes(id))).map(([id, range]) => ({id, range, commitment: Buffer.alloc(32, 1)}))
  return buildWitnessProof(state.config, round, seen)
}

/** All of the round's witnesses send proofs (seeing `saw`, default everyone). */
export function witnessAll(state: CoordinatorState, now: number, saw?: string[]): CoordinatorState {
  for (const w of selectWitnesses(state)) state = ok(state, {type: 'witness', from: w, step: state.epoch.round!.step, proof: honestProof(state, saw)}, now)
  return state
}

/**
 * In Warmup, the first client that has not yet reports its model loaded (a Warmup that ends with no report starts no
 * round); a state in any other phase is returned as it is.
 */
export function reportLoaded(state: CoordinatorState, now: number): CoordinatorState {
  if (state.run_state !== 'Warmup' || state.epoch.warmup_witnesses.length > 0) return state
  const id = state.epoch.clients.find((c) => c.state === 'Healthy')?.id
  return id === undefined ? state : ok(state, {type: 'witness', from: id, step: state.progress.step, proof: {participant_bloom: '', broadcast_bloom: ''}}, now)
}

/**
 * Runs from WaitingForMembers with `ids` to the first RoundTrain, ticking once a second (one client reports its model
 * loaded in Warmup, reportLoaded); returns the state and the time (ms).
 */
export function toFirstRound(ids: string[], config: Partial<CoordinatorConfig> = {}, llm: Partial<LLMConfig> = {}): {state: CoordinatorState; now: number} {
  let state = joinAll(newRun(config, llm), ids, 0)
  let now = 0
  for (let i = 0; i < 100 && state.run_state !== 'RoundTrain'; i++) state = reportLoaded(applyEvent(state, {type: 'tick'}, (now += S)).state, now)
  if (state.run_state !== 'RoundTrain') throw new Error(`never reached RoundTrain (${state.run_state})`)
  return {state, now}
}

/** The parameter hash attestParams attests. */
export const PARAMS = 'a1'.repeat(32)

/** In Cooldown: every witness of the epoch's last round still in the epoch attests `hash` (their agreement). */
export function attestParams(state: CoordinatorState, now: number, hash = PARAMS): CoordinatorState {
  const round = state.epoch.round!
  for (const w of selectWitnesses(state, round)) {
    if (state.epoch.clients.some((c) => c.id === w && c.state === 'Healthy'))
      state = ok(state, {type: 'witness', from: w, step: round.step, proof: {participant_bloom: '', broadcast_bloom: ''}, param_hash: hash}, now)
  }
  return state
}
