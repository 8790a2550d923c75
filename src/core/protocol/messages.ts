import {sha256} from '../primitives/hash.js'
import type {HubRepo} from '../config/types.js'
import {RUN_ID_MAX as MAX_RUN_ID_BYTES} from '../layout/layout-table.js'
import type {AccusationReason, ClientId, CoordinatorState, WitnessProof} from '../coordinator/types.js'
import type {EquivocationProof} from '../coordinator/equivocation.js'
import type {RewardRow} from '../coordinator/rewards.js'
import {deserializeState} from '../coordinator/serialize.js'
import {isParamHash} from '../coordinator/rules.js'
import {FRAME_HEADER_BYTES} from './frames.js'
import {parseDeltaOps, type DeltaOp} from './state-delta.js'
import {isIdentityId, signBytes, verifyBytes, type Identity} from './identity.js'

/** Each client's P2P addresses (multiaddrs), as the coordinator hands them out. */
export type PeerDirectory = Record<ClientId, string[]>

/** A verification score the server keeps per client (its rewards ledger, coordinator/rewards.ts scoreRows), as sent to watchers. */
export interface ClientScore {
  client_id: ClientId
  /**
   * Moving average over the steps scored (weight 1/2, coordinator/rewards.ts), of each step's mean over its verifiers' reports:
   * the same average each verifier keeps, when verifiers agree.
   */
  average: number
  /** The mean score of the last step scored, that step, and how many verifiers reported it. */
  last: number
  last_step: number
  verifiers: number
  /** Reports received. */
  count: number
}

/**
 * How the coordinator server's saves of its state are going (--save-state-dir), as watchers get it: status, the
 * dashboard and /metrics show a failing save as an error.
 */
export interface SaveStatus {
  /** The last save succeeded (true before the first one). */
  ok: boolean
  /** Saves that failed since the last one that succeeded, and since the server started. */
  failures_in_a_row: number
  failures: number
  /** Failures in a row after which the server halts (--max-save-failures). */
  max_failures: number
  /** Why the last failed save failed (null: none failed since the last success). */
  last_error: string | null
  /** The step of the last state saved, and when (unix seconds; null: none yet). */
  last_saved_step: number | null
  last_saved_at: number | null
}

/** Scores are kept for at most this many clients (the scoreboard's bound, and a message's). */
const MAX_SCORED_CLIENTS = 4096

/**
 * Signed envelopes of the client ↔ coordinator-server protocol. One envelope is the body of one frame
 * (frames.ts):
 *
 *   offset  0  4 bytes   magic "PSYC"
 *           4  u8        version (1)
 *           5  u8        direction: 0 client → server, 1 server → client
 *           6  32 bytes  from: the sender's raw ed25519 public key (its identity id, in hex, is the ClientId)
 *          38  64 bytes  ed25519 signature of  "psyche/envelope/v1\0" ‖ bytes[0, 38) ‖ SHA-256(payload)
 *         102  payload   UTF-8 JSON {"kind", "run_id", "step", "seq", "session", "body"}
 *
 * The signature binds every field: the kind, the run, the step, the connection (`session`, a random
 * nonce the server sends first) and the sequence number (strictly increasing per connection and
 * direction). So a message cannot be replayed into another run, connection or later step, nor twice.
 *
 * client → server  hello {run_id, client_id, p2p_addrs, want_join}   (first message; seq 1)
 *                  witness {proof, param_hash?}   step = the round it witnesses (in Warmup: "model loaded"; in Cooldown:
 *                                           param_hash, the parameters' hash after applying the epoch's last round)
 *                  health_check {accused}   step = the current step when sent
 *                  accuse {accused, reason} step = the round whose result the witness found invalid
 *                  equivocation {proof}     two signed announcements of one producer for one step
 *                  report {loss, ...}       step = the round applied; what the client measured (for dashboards only)
 *                  scores {scores: [{client_id, score}]}   step = the round scored; a verifier's scores of its peers'
 *                                           results (kept by the server as moving averages: status, dashboards)
 *                  withdraw {}
 *                  checkpoint {repo, param_hash?}
 *                  addresses {p2p_addrs}    our libp2p addresses changed (a relay reservation, an observed address)
 *                  resync {}                a state_delta did not apply: send the whole state
 * server → client  challenge {session}      (first message, as soon as the TCP connection opens)
 *                  welcome {run_id, client_id, server_time, relay_addrs?}
 *                                           relay_addrs: the coordinator's circuit relay, as this client can dial it
 *                  state {state: serialized CoordinatorState, peers: {ClientId: multiaddrs}, server_time, scores?,
 *                         peers_reset?, peers_removed?}
 *                                           peers: the directory entries (the run's members) added or changed since this
 *                                           connection's previous state; peers_reset: true replaces the whole directory
 *                                           (the first state of a connection); peers_removed: members gone since
 *                                           scores (to watchers): the verification scores the server keeps (ClientScore[])
 *                                           save_state (to watchers, from a server that saves its state): how its saves
 *                                           are going (SaveStatus)
 *                                           rev: the state's revision (counts the server's state changes)
 *                  state_delta {base, rev, ops, hash, peers, server_time, scores?, peers_reset?, peers_removed?}
 *                                           to a client that asked for deltas (hello.state_deltas): the state of revision
 *                                           `rev` as ops on the client's revision `base` (protocol/state-delta.ts); hash:
 *                                           SHA-256 (hex) of the new state's serialization, checked after applying
 *                  rejected {code, reason, of?}
 *                  client_report {client, step, report}   a client's report, forwarded to watchers (dashboards)
 */
const ENVELOPE_MAGIC = Buffer.from('PSYC', 'latin1')
const PROTOCOL_VERSION = 1
const SIGNING_DOMAIN = Buffer.from('psyche/envelope/v1\0', 'latin1')
const HEADER_BYTES = 38
const SIGNATURE_BYTES = 64
const ENVELOPE_OVERHEAD = HEADER_BYTES + SIGNATURE_BYTES

type Direction = 'to_server' | 'to_client'

// Bounds on what a peer may send inside one (already size-bounded) frame.
export const MAX_P2P_ADDRS = 32
const MAX_RELAY_ADDRS = 8
export const MAX_ADDR_CHARS = 512
const MAX_ACCUSED = 10_000
const MAX_REASON_CHARS = 4096
const MAX_REPO_CHARS = 512
/** Most ids one state may name as removed from the peer directory (the server sends a reset past it). */
const MAX_DIRECTORY_REMOVALS = 4096
/** Most clients' reports one state push carries to a watcher (the server keeps this many recent ones). */
export const MAX_FORWARDED_REPORTS = 1024
const SESSION_HEX_CHARS = 32

export interface HelloBody {
  run_id: string
  client_id: ClientId
  p2p_addrs: string[]
  want_join: boolean
  /** Send state changes as deltas (state_delta) after the first whole state (issue 23: O(change) per event, not O(N)). */
  state_deltas?: boolean
}
export interface WitnessBody {
  proof: WitnessProof
  /** In Cooldown: the hash of the witness's parameters after applying the epoch's last round (blooms empty). */
  param_hash?: string
}
export interface HealthCheckBody {
  accused: ClientId[]
}
export interface AccuseBody {
  accused: ClientId
  reason: AccusationReason
}
export interface EquivocationBody {
  proof: EquivocationProof
}
export type WithdrawBody = Record<string, never>
/** A state_delta did not apply to the state this client holds: send the whole state again. */
export type ResyncBody = Record<string, never>
/**
 * What a client measured in a round it applied, sent after applying it. Display only (dashboards, status):
 * the coordinator's state never depends on it. Numbers are finite and non-negative; null when not measured.
 */
export interface ReportBody {
  loss: number | null
  val_loss: number | null
  tokens_per_second: number | null
  compute_ms: number | null
  apply_ms: number | null
  result_bytes: number | null
  /** Cumulative P2P bytes of this client's process. */
  bytes_in: number
  bytes_out: number
  /** Results applied in the round, and how many the witness quorum accepted. */
  applied: number
  accepted: number
  peers: number
  /** Rounds in a row in which others trained and none of their results reached this client (0: it exchanges). */
  rounds_without_exchange?: number
  /**
   * Its last checkpoint save (--checkpoint-dir, or a checkpointer's staging) failed: the step and why, one line of at
   * most MAX_SAVE_FAILURE_CHARS. Absent once a later save succeeds.
   */
  checkpoint_save_failed?: {step: number; message: string}
}
/** The longest reason a report's checkpoint_save_failed carries. */
export const MAX_SAVE_FAILURE_CHARS = 300
/** A verifier's scores of its peers' results of round `step` (src/core/verify/score.ts scoreOf: in [−1, 1]). */
export interface ScoresBody {
  scores: {client_id: ClientId; score: number}[]
}
const MAX_SCORES = 1024
const REPORT_NUMBERS = ['loss', 'val_loss', 'tokens_per_second', 'compute_ms', 'apply_ms', 'result_bytes'] as const
const REPORT_COUNTS = ['bytes_in', 'bytes_out', 'applied', 'accepted', 'peers'] as const
export interface AddressesBody {
  p2p_addrs: string[]
}
export interface CheckpointBody {
  repo: HubRepo
  /** The parameter hash of the uploaded model (the coordinator checks it against its witnesses' agreed hash). */
  param_hash?: string
}
export interface ChallengeBody {
  session: string
}
export interface WelcomeBody {
  run_id: string
  client_id: ClientId
  /** Unix seconds on the server's clock (the coordinator's `now`). */
  server_time: number
  /** The coordinator's libp2p circuit relay, as multiaddrs this client can dial (absent: the server runs none). */
  relay_addrs?: string[]
}
export interface StateBody {
  state: CoordinatorState
  /** Directory entries added or changed since the previous state on this connection (all of them with peers_reset). */
  peers: PeerDirectory
  /** The directory is `peers`, not an update of the previous one (a connection's first state). */
  peers_reset?: boolean
  /** Members no longer in the directory since the previous state. */
  peers_removed?: ClientId[]
  server_time: number
  /** Sent to watchers (status, dashboards): the verification scores the server keeps (src/core/verify/scoreboard.ts). */
  scores?: ClientScore[]
  /** Sent to watchers: each client's rewards (src/core/coordinator/rewards.ts rewardRows). */
  rewards?: RewardRow[]
  /** Sent to watchers: the round trainers' reports that arrived since this connection's previous state (oldest first). */
  reports?: ClientReportBody[]
  /** Sent to watchers of a server that saves its state: how its saves are going. */
  save_state?: SaveStatus
  /** The state's revision: a later state_delta with this base applies to it. */
  rev?: number
}
/** A state as ops on the revision the client holds (protocol/state-delta.ts); the directory and scores as in StateBody. */
export type StateDeltaBody = Omit<StateBody, 'state' | 'rev'> & {base: number; rev: number; ops: DeltaOp[]; hash: string}
/** On the wire the state travels as serializeState's text (so BigInts survive). */
type StateWireBody = Omit<StateBody, 'state'> & {state: string}
export interface RejectedBody {
  /** A short machine-readable reason: a wire reason (RejectReason) or a coordinator RejectionCode. */
  code: string
  /** Human-readable: what was wrong. */
  reason: string
  /** The kind of the message rejected, when known. */
  of?: string
}

export interface ClientBodies {
  hello: HelloBody
  witness: WitnessBody
  health_check: HealthCheckBody
  accuse: AccuseBody
  equivocation: EquivocationBody
  withdraw: WithdrawBody
  checkpoint: CheckpointBody
  report: ReportBody
  scores: ScoresBody
  addresses: AddressesBody
  resync: ResyncBody
}
export interface ServerBodies {
  challenge: ChallengeBody
  welcome: WelcomeBody
  state: StateBody
  state_delta: StateDeltaBody
  rejected: RejectedBody
  client_report: ClientReportBody
}
/** A client's report (ReportBody) of round `step`, as the server forwards it to watching connections. */
export interface ClientReportBody {
  client: ClientId
  step: number
  report: ReportBody
}
type ServerWireBodies = Omit<ServerBodies, 'state'> & {state: StateWireBody}

export type ClientKind = keyof ClientBodies
export type ServerKind = keyof ServerBodies

interface EnvelopeFields {
  run_id: string
  step: number
  seq: number
  session: string
}
export type Envelope<K extends string, B> = EnvelopeFields & {kind: K; from: string; body: B}
export type ClientEnvelope = {[K in ClientKind]: Envelope<K, ClientBodies[K]>}[ClientKind]
export type ServerEnvelope = {[K in ServerKind]: Envelope<K, ServerBodies[K]>}[ServerKind]

/** Why an envelope was refused by the decoder. */
export type DecodeReason = 'truncated' | 'bad_magic' | 'bad_version' | 'wrong_direction' | 'bad_signature' | 'malformed' | 'invalid_message'
type Decoded<E> = {ok: true; envelope: E} | {ok: false; reason: DecodeReason; detail: string}

const DIRECTION_BYTE: Record<Direction, number> = {to_server: 0, to_client: 1}

function signedBytes(header: Uint8Array, payload: Uint8Array): Buffer {
  return Buffer.concat([SIGNING_DOMAIN, header, sha256(payload)])
}

/**
 * An envelope as one length-prefixed frame, built in a single buffer (a state with the whole directory can be a
 * megabyte, and the server frames one for each connection): the payload is written in place and signed there.
 */
function encodeEnvelopeFrame(identity: Identity, direction: Direction, kind: string, fields: EnvelopeFields, bodyJson: string): Buffer {
  const text = `{"kind":${JSON.stringify(kind)},"run_id":${JSON.stringify(fields.run_id)},"step":${fields.step},"seq":${fields.seq},"session":${JSON.stringify(fields.session)},"body":${bodyJson}}`
  const payloadBytes = Buffer.byteLength(text, 'utf8')
  const frame = Buffer.allocUnsafe(FRAME_HEADER_BYTES + ENVELOPE_OVERHEAD + payloadBytes)
  frame.writeUInt32LE(ENVELOPE_OVERHEAD + payloadBytes, 0)
  const header = frame.subarray(FRAME_HEADER_BYTES, FRAME_HEADER_BYTES + HEADER_BYTES)
  ENVELOPE_MAGIC.copy(header, 0)
  header[4] = PROTOCOL_VERSION
  header[5] = DIRECTION_BYTE[direction]
  header.set(identity.publicKey, 6)
  const payload = frame.subarray(FRAME_HEADER_BYTES + ENVELOPE_OVERHEAD)
  payload.write(text, 'utf8')
  frame.set(signBytes(identity, signedBytes(header, payload)), FRAME_HEADER_BYTES + HEADER_BYTES)
  return frame
}

/** A client message as one length-prefixed frame, ready to write to the socket. */
export function encodeClientMessage<K extends ClientKind>(identity: Identity, kind: K, fields: EnvelopeFields, body: ClientBodies[K]): Buffer {
  return encodeEnvelopeFrame(identity, 'to_server', kind, fields, JSON.stringify(body))
}

/**
 * A server message as one frame. `bodyJson` lets the server serialize a large state body once and
 * frame it for every connection (each frame still signs its own session and sequence number).
 */
export function encodeServerMessage<K extends ServerKind>(identity: Identity, kind: K, fields: EnvelopeFields, body: ServerWireBodies[K] | {json: string}): Buffer {
  const json = 'json' in body && typeof body.json === 'string' && Object.keys(body).length === 1 ? body.json : JSON.stringify(body)
  return encodeEnvelopeFrame(identity, 'to_client', kind, fields, json)
}

// ---- decoding: every check, typed reasons, never an exception ----

class Invalid extends Error {}

type Obj = Record<string, unknown>

function isObj(v: unknown): v is Obj {
  return v !== null && typeof v === 'object' && !Array.isArray(v)
}

function exactKeys(o: Obj, required: string[], optional: string[] = [], where: string): void {
  for (const k of required) if (!Object.hasOwn(o, k)) throw new Invalid(`${where}: missing "${k}"`)
  for (const k of Object.keys(o)) if (!required.includes(k) && !optional.includes(k)) throw new Invalid(`${where}: unexpected field "${k}"`)
}

function str(v: unknown, where: string, max: number, opts: {nonEmpty?: boolean} = {}): string {
  if (typeof v !== 'string') throw new Invalid(`${where} must be text`)
  if (v.length > max) throw new Invalid(`${where} is longer than ${max} characters`)
  if (opts.nonEmpty && v === '') throw new Invalid(`${where} must not be empty`)
  return v
}

function count(v: unknown, where: string, min: number): number {
  if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < min) throw new Invalid(`${where} must be an integer ≥ ${min}`)
  return v
}

function time(v: unknown, where: string): number {
  if (typeof v !== 'number' || !Number.isFinite(v) || v < 0) throw new Invalid(`${where} must be a non-negative number`)
  return v
}

function unit(v: unknown, where: string): number {
  if (typeof v !== 'number' || !Number.isFinite(v) || v < -1 || v > 1) throw new Invalid(`${where} must be a number in [-1, 1]`)
  return v
}

function id(v: unknown, where: string): string {
  if (!isIdentityId(v)) throw new Invalid(`${where} must be an identity id (64 lowercase hex digits)`)
  return v
}

function paramHash(v: unknown, where: string): string {
  if (!isParamHash(v)) throw new Invalid(`${where} must be a parameter hash (64 lowercase hex digits)`)
  return v
}

function strings(v: unknown, where: string, maxItems: number, maxChars: number): string[] {
  if (!Array.isArray(v)) throw new Invalid(`${where} must be a list`)
  if (v.length > maxItems) throw new Invalid(`${where} has more than ${maxItems} entries`)
  return v.map((x, i) => str(x, `${where}[${i}]`, maxChars))
}

const clientBodyCheckers: {[K in ClientKind]: (b: Obj) => ClientBodies[K]} = {
  hello(b) {
    exactKeys(b, ['run_id', 'client_id', 'p2p_addrs', 'want_join'], ['state_deltas'], 'hello')
    if (typeof b.want_join !== 'boolean') throw new Invalid('hello.want_join must be true or false')
    const out: HelloBody = {
      run_id: str(b.run_id, 'hello.run_id', MAX_RUN_ID_BYTES * 4),
      client_id: id(b.client_id, 'hello.client_id'),
      p2p_addrs: strings(b.p2p_addrs, 'hello.p2p_addrs', MAX_P2P_ADDRS, MAX_ADDR_CHARS),
      want_join: b.want_join,
    }
    if (b.state_deltas !== undefined) {
      if (typeof b.state_deltas !== 'boolean') throw new Invalid('hello.state_deltas must be true or false')
      out.state_deltas = b.state_deltas
    }
    return out
  },
  witness(b) {
    exactKeys(b, ['proof'], ['param_hash'], 'witness')
    if (!isObj(b.proof)) throw new Invalid('witness.proof must be an object')
    exactKeys(b.proof, ['participant_bloom', 'broadcast_bloom'], [], 'witness.proof')
    const out: WitnessBody = {
      proof: {
        participant_bloom: str(b.proof.participant_bloom, 'witness.proof.participant_bloom', Number.MAX_SAFE_INTEGER),
        broadcast_bloom: str(b.proof.broadcast_bloom, 'witness.proof.broadcast_bloom', Number.MAX_SAFE_INTEGER),
      },
    }
    if (b.param_hash !== undefined) out.param_hash = paramHash(b.param_hash, 'witness.param_hash')
    return out
  },
  health_check(b) {
    exactKeys(b, ['accused'], [], 'health_check')
    if (!Array.isArray(b.accused) || b.accused.length === 0) throw new Invalid('health_check.accused must be a non-empty list')
    if (b.accused.length > MAX_ACCUSED) throw new Invalid(`health_check.accused has more than ${MAX_ACCUSED} entries`)
    return {accused: b.accused.map((x, i) => id(x, `health_check.accused[${i}]`))}
  },
  accuse(b) {
    exactKeys(b, ['accused', 'reason'], [], 'accuse')
    if (b.reason !== 'invalid_result' && b.reason !== 'low_score') throw new Invalid('accuse.reason must be "invalid_result" or "low_score"')
    return {accused: id(b.accused, 'accuse.accused'), reason: b.reason}
  },
  equivocation(b) {
    exactKeys(b, ['proof'], [], 'equivocation')
    if (!isObj(b.proof)) throw new Invalid('equivocation.proof must be an object')
    exactKeys(b.proof, ['a', 'b'], [], 'equivocation.proof')
    // The coordinator checks the signatures (checkEquivocation); the frame size already bounds the rest.
    if (!isObj(b.proof.a) || !isObj(b.proof.b)) throw new Invalid('equivocation.proof.a and .b must be announcements')
    return {proof: b.proof as unknown as EquivocationProof}
  },
  withdraw(b) {
    exactKeys(b, [], [], 'withdraw')
    return {}
  },
  report(b) {
    exactKeys(b, [...REPORT_NUMBERS, ...REPORT_COUNTS], ['rounds_without_exchange', 'checkpoint_save_failed'], 'report')
    const out: Record<string, unknown> = {}
    for (const k of REPORT_NUMBERS) out[k] = b[k] === null ? null : time(b[k], `report.${k}`)
    for (const k of REPORT_COUNTS) out[k] = count(b[k], `report.${k}`, 0)
    if (b.rounds_without_exchange !== undefined) out.rounds_without_exchange = count(b.rounds_without_exchange, 'report.rounds_without_exchange', 0)
    const failed = b.checkpoint_save_failed
    if (failed !== undefined) {
      const where = 'report.checkpoint_save_failed'
      if (!isObj(failed)) throw new Invalid(`${where} must be an object`)
      exactKeys(failed, ['step', 'message'], [], where)
      const message = str(failed.message, `${where}.message`, MAX_SAVE_FAILURE_CHARS, {nonEmpty: true})
      // shown on terminals (status, the dashboard): one line of printable text
      if (/[\u0000-\u001f\u007f-\u009f]/.test(message)) throw new Invalid(`${where}.message must be one line without control characters`)
      out.checkpoint_save_failed = {step: count(failed.step, `${where}.step`, 0), message}
    }
    return out as unknown as ReportBody
  },
  scores(b) {
    exactKeys(b, ['scores'], [], 'scores')
    if (!Array.isArray(b.scores)) throw new Invalid('scores.scores must be a list')
    if (b.scores.length > MAX_SCORES) throw new Invalid(`scores.scores has more than ${MAX_SCORES} entries`)
    return {
      scores: b.scores.map((e: unknown, i: number) => {
        if (!isObj(e)) throw new Invalid(`scores.scores[${i}] must be an object`)
        exactKeys(e, ['client_id', 'score'], [], `scores.scores[${i}]`)
        return {client_id: id(e.client_id, `scores.scores[${i}].client_id`), score: unit(e.score, `scores.scores[${i}].score`)}
      }),
    }
  },
  checkpoint(b) {
    exactKeys(b, ['repo'], ['param_hash'], 'checkpoint')
    if (!isObj(b.repo)) throw new Invalid('checkpoint.repo must be an object')
    exactKeys(b.repo, ['repo_id'], ['revision'], 'checkpoint.repo')
    const repo: HubRepo = {repo_id: str(b.repo.repo_id, 'checkpoint.repo.repo_id', MAX_REPO_CHARS, {nonEmpty: true})}
    if (b.repo.revision !== undefined && b.repo.revision !== null) repo.revision = str(b.repo.revision, 'checkpoint.repo.revision', MAX_REPO_CHARS)
    return b.param_hash === undefined ? {repo} : {repo, param_hash: paramHash(b.param_hash, 'checkpoint.param_hash')}
  },
  addresses(b) {
    exactKeys(b, ['p2p_addrs'], [], 'addresses')
    return {p2p_addrs: strings(b.p2p_addrs, 'addresses.p2p_addrs', MAX_P2P_ADDRS, MAX_ADDR_CHARS)}
  },
  resync(b) {
    exactKeys(b, [], [], 'resync')
    return {}
  },
}

/** The peer directory (delta) and watchers' scores of a state or state_delta body. */
function directoryAndScores(b: Obj, where: string): Omit<StateBody, 'state' | 'rev'> {
  if (!isObj(b.peers)) throw new Invalid(`${where}.peers must be an object`)
  const peers: PeerDirectory = {}
  for (const [k, v] of Object.entries(b.peers)) peers[id(k, `${where}.peers key`)] = strings(v, `${where}.peers.${k}`, MAX_P2P_ADDRS, MAX_ADDR_CHARS)
  const out: Omit<StateBody, 'state' | 'rev'> = {peers, server_time: time(b.server_time, `${where}.server_time`)}
  if (b.peers_reset !== undefined) {
    if (typeof b.peers_reset !== 'boolean') throw new Invalid(`${where}.peers_reset must be a boolean`)
    out.peers_reset = b.peers_reset
  }
  if (b.peers_removed !== undefined) {
    if (!Array.isArray(b.peers_removed) || b.peers_removed.length > MAX_DIRECTORY_REMOVALS)
      throw new Invalid(`${where}.peers_removed must be a list of at most ${MAX_DIRECTORY_REMOVALS} ids`)
    out.peers_removed = b.peers_removed.map((v: unknown, i: number) => id(v, `${where}.peers_removed[${i}]`))
  }
  if (b.scores !== undefined) {
    if (!Array.isArray(b.scores) || b.scores.length > MAX_SCORED_CLIENTS) throw new Invalid(`${where}.scores must be a list of at most ${MAX_SCORED_CLIENTS} entries`)
    out.scores = b.scores.map((e: unknown, i: number) => {
      const at = `${where}.scores[${i}]`
      if (!isObj(e)) throw new Invalid(`${at} must be an object`)
      exactKeys(e, ['client_id', 'average', 'last', 'last_step', 'verifiers', 'count'], [], at)
      return {
        client_id: id(e.client_id, `${at}.client_id`),
        average: unit(e.average, `${at}.average`),
        last: unit(e.last, `${at}.last`),
        last_step: count(e.last_step, `${at}.last_step`, 0),
        verifiers: count(e.verifiers, `${at}.verifiers`, 0),
        count: count(e.count, `${at}.count`, 0),
      }
    })
  }
  if (b.rewards !== undefined) {
    if (!Array.isArray(b.rewards) || b.rewards.length > MAX_SCORED_CLIENTS) throw new Invalid(`${where}.rewards must be a list of at most ${MAX_SCORED_CLIENTS} entries`)
    out.rewards = b.rewards.map((e: unknown, i: number) => {
      const at = `${where}.rewards[${i}]`
      if (!isObj(e)) throw new Invalid(`${at} must be an object`)
      exactKeys(e, ['client_id', 'score', 'weight', 'rounds', 'batches', 'pending', 'earned', 'slashed'], [], at)
      const weight = unit(e.weight, `${at}.weight`)
      if (weight < 0) throw new Invalid(`${at}.weight must be in [0, 1]`)
      return {
        client_id: id(e.client_id, `${at}.client_id`),
        score: e.score === null ? null : unit(e.score, `${at}.score`),
        weight,
        rounds: count(e.rounds, `${at}.rounds`, 0),
        batches: count(e.batches, `${at}.batches`, 0),
        pending: count(e.pending, `${at}.pending`, 0),
        earned: count(e.earned, `${at}.earned`, 0),
        slashed: count(e.slashed, `${at}.slashed`, 0),
      }
    })
  }
  if (b.save_state !== undefined) {
    const v = b.save_state
    const at = `${where}.save_state`
    if (!isObj(v)) throw new Invalid(`${at} must be an object`)
    exactKeys(v, ['ok', 'failures_in_a_row', 'failures', 'max_failures', 'last_error', 'last_saved_step', 'last_saved_at'], [], at)
    if (typeof v.ok !== 'boolean') throw new Invalid(`${at}.ok must be a boolean`)
    out.save_state = {
      ok: v.ok,
      failures_in_a_row: count(v.failures_in_a_row, `${at}.failures_in_a_row`, 0),
      failures: count(v.failures, `${at}.failures`, 0),
      max_failures: count(v.max_failures, `${at}.max_failures`, 1),
      last_error: v.last_error === null ? null : str(v.last_error, `${at}.last_error`, MAX_REASON_CHARS),
      last_saved_step: v.last_saved_step === null ? null : count(v.last_saved_step, `${at}.last_saved_step`, 0),
      last_saved_at: v.last_saved_at === null ? null : time(v.last_saved_at, `${at}.last_saved_at`),
    }
  }
  if (b.reports !== undefined) {
    if (!Array.isArray(b.reports) || b.reports.length > MAX_FORWARDED_REPORTS) throw new Invalid(`${where}.reports must be a list of at most ${MAX_FORWARDED_REPORTS} reports`)
    out.reports = b.reports.map((r: unknown, i: number) => {
      if (!isObj(r)) throw new Invalid(`${where}.reports[${i}] must be an object`)
      return serverBodyCheckers.client_report(r)
    })
  }
  return out
}

const serverBodyCheckers: {[K in ServerKind]: (b: Obj) => ServerBodies[K]} = {
  challenge(b) {
    exactKeys(b, ['session'], [], 'challenge')
    return {session: session(b.session, 'challenge.session')}
  },
  welcome(b) {
    exactKeys(b, ['run_id', 'client_id', 'server_time'], ['relay_addrs'], 'welcome')
    const out: WelcomeBody = {
      run_id: str(b.run_id, 'welcome.run_id', MAX_RUN_ID_BYTES * 4),
      client_id: id(b.client_id, 'welcome.client_id'),
      server_time: time(b.server_time, 'welcome.server_time'),
    }
    if (b.relay_addrs !== undefined) out.relay_addrs = strings(b.relay_addrs, 'welcome.relay_addrs', MAX_RELAY_ADDRS, MAX_ADDR_CHARS)
    return out
  },
  state(b) {
    exactKeys(b, ['state', 'peers', 'server_time'], ['scores', 'rewards', 'reports', 'save_state', 'peers_reset', 'peers_removed', 'rev'], 'state')
    const text = str(b.state, 'state.state', Number.MAX_SAFE_INTEGER)
    let state: CoordinatorState
    try {
      state = deserializeState(text)
    } catch (error) {
      throw new Invalid(`state.state: ${(error as Error).message}`)
    }
    const out: StateBody = {state, ...directoryAndScores(b, 'state')}
    if (b.rev !== undefined) out.rev = count(b.rev, 'state.rev', 0)
    return out
  },
  state_delta(b) {
    exactKeys(b, ['base', 'rev', 'ops', 'hash', 'peers', 'server_time'], ['scores', 'rewards', 'reports', 'save_state', 'peers_reset', 'peers_removed'], 'state_delta')
    let ops: DeltaOp[]
    try {
      ops = parseDeltaOps(b.ops)
    } catch (error) {
      throw new Invalid(`state_delta.${(error as Error).message}`)
    }
    if (typeof b.hash !== 'string' || !/^[0-9a-f]{64}$/.test(b.hash)) throw new Invalid('state_delta.hash must be 64 hex characters')
    return {base: count(b.base, 'state_delta.base', 0), rev: count(b.rev, 'state_delta.rev', 0), ops, hash: b.hash, ...directoryAndScores(b, 'state_delta')}
  },
  rejected(b) {
    exactKeys(b, ['code', 'reason'], ['of'], 'rejected')
    const out: RejectedBody = {code: str(b.code, 'rejected.code', 64, {nonEmpty: true}), reason: str(b.reason, 'rejected.reason', MAX_REASON_CHARS)}
    if (b.of !== undefined) out.of = str(b.of, 'rejected.of', 64)
    return out
  },
  client_report(b) {
    exactKeys(b, ['client', 'step', 'report'], [], 'client_report')
    if (!isObj(b.report)) throw new Invalid('client_report.report must be an object')
    return {client: id(b.client, 'client_report.client'), step: count(b.step, 'client_report.step', 0), report: clientBodyCheckers.report(b.report)}
  },
}

function session(v: unknown, where: string): string {
  if (typeof v !== 'string' || v.length !== SESSION_HEX_CHARS || !/^[0-9a-f]+$/.test(v)) throw new Invalid(`${where} must be ${SESSION_HEX_CHARS} lowercase hex digits`)
  return v
}

function decode(bytes: Uint8Array, direction: Direction, checkers: Record<string, (b: Obj) => unknown>): Decoded<Envelope<string, unknown>> {
  try {
    if (bytes.length < ENVELOPE_OVERHEAD + 2) return {ok: false, reason: 'truncated', detail: `${bytes.length} bytes is shorter than an envelope`}
    const buf = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.length)
    if (!buf.subarray(0, 4).equals(ENVELOPE_MAGIC)) return {ok: false, reason: 'bad_magic', detail: 'not a psyche envelope (bad magic)'}
    if (buf[4] !== PROTOCOL_VERSION) return {ok: false, reason: 'bad_version', detail: `protocol version ${buf[4]}, expected ${PROTOCOL_VERSION}`}
    if (buf[5] !== DIRECTION_BYTE[direction])
      return {ok: false, reason: 'wrong_direction', detail: `a message meant for the ${buf[5] === 0 ? 'server' : buf[5] === 1 ? 'client' : 'unknown side'}`}
    const from = buf.subarray(6, HEADER_BYTES).toString('hex')
    const header = buf.subarray(0, HEADER_BYTES)
    const signature = buf.subarray(HEADER_BYTES, ENVELOPE_OVERHEAD)
    const payload = buf.subarray(ENVELOPE_OVERHEAD)
    // The signature is checked before the payload is parsed: unsigned bytes never reach JSON.parse.
    if (!verifyBytes(from, signedBytes(header, payload), signature)) return {ok: false, reason: 'bad_signature', detail: `signature does not verify for sender ${from}`}
    let json: unknown
    try {
      json = JSON.parse(new TextDecoder('utf-8', {fatal: true}).decode(payload))
    } catch (error) {
      return {ok: false, reason: 'malformed', detail: `payload is not UTF-8 JSON: ${(error as Error).message}`}
    }
    if (!isObj(json)) return {ok: false, reason: 'malformed', detail: 'payload is not a JSON object'}
    exactKeys(json, ['kind', 'run_id', 'step', 'seq', 'session', 'body'], [], 'envelope')
    const kind = json.kind
    if (typeof kind !== 'string' || !Object.hasOwn(checkers, kind)) throw new Invalid(`unknown message kind ${JSON.stringify(kind)?.slice(0, 64)}`)
    if (!isObj(json.body)) throw new Invalid(`${kind}: body must be an object`)
    const envelope = {
      kind,
      run_id: str(json.run_id, 'run_id', MAX_RUN_ID_BYTES * 4),
      step: count(json.step, 'step', 0),
      seq: count(json.seq, 'seq', 1),
      session: session(json.session, 'session'),
      from,
      body: checkers[kind](json.body),
    }
    return {ok: true, envelope}
  } catch (error) {
    if (error instanceof Invalid) return {ok: false, reason: 'invalid_message', detail: error.message}
    // Nothing above should throw otherwise; if it does, the input is still refused, never propagated.
    return {ok: false, reason: 'malformed', detail: `undecodable: ${(error as Error)?.message ?? String(error)}`}
  }
}

/** Decodes and validates one frame body sent to the server. Never throws. */
export function decodeClientMessage(bytes: Uint8Array): Decoded<ClientEnvelope> {
  return decode(bytes, 'to_server', clientBodyCheckers) as Decoded<ClientEnvelope>
}

/** Decodes and validates one frame body sent to a client. Never throws. */
export function decodeServerMessage(bytes: Uint8Array): Decoded<ServerEnvelope> {
  return decode(bytes, 'to_client', serverBodyCheckers) as Decoded<ServerEnvelope>
}
