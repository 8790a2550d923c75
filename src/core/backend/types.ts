import type {EventEmitter} from 'node:events'
import type {HubRepo} from '../config/types.js'
import type {AccusationReason, ClientId, CoordinatorState, WitnessProof} from '../coordinator/types.js'
import type {EquivocationProof} from '../coordinator/equivocation.js'

/** Client id → the libp2p multiaddrs it announced (the peer directory a coordinator publishes with its state). */
import type {PeerDirectory} from '../protocol/messages.js'

export type {PeerDirectory}

/** Details of a refusal: `code` is a wire reason or a coordinator RejectionCode; `of` the kind of message refused. */
export interface RejectionInfo {
  code: string
  of?: string
}

/**
 * The backend port: what a client needs from a coordinator, whichever backend holds it (the TCP server now,
 * Solana later, an in-process machine in the simulation): the latest state and peer directory, pushed as
 * events, and the client's few messages.
 *
 * Events: 'state' (state, peers) on every new state; 'rejected' (reason, info) when the coordinator
 * refuses one of our messages; 'disconnected' and 'reconnected' around a lost link; 'closed' when it
 * gives up for good (close(), or a fatal refusal while reconnecting).
 *
 * The send methods return false when the message could not be handed to the link (disconnected).
 */
export interface CoordinatorBackend extends EventEmitter {
  readonly state: CoordinatorState | undefined
  readonly peers: PeerDirectory
  on(event: 'state', listener: (state: CoordinatorState, peers: PeerDirectory) => void): this
  on(event: 'rejected', listener: (reason: string, info: RejectionInfo) => void): this
  on(event: 'disconnected' | 'reconnected' | 'closed', listener: () => void): this
  /** A witness proof for `step`; in Warmup it says "my model is loaded" (blooms unused: see sendWarmupReady). */
  sendWitness(step: number, proof: WitnessProof): boolean
  /** Warmup's witness: the model is loaded (the coordinator counts these to start training early). */
  sendWarmupReady(): boolean
  /**
   * Cooldown's witness: as a witness of the epoch's last round `step`, the hash of our parameters after applying it
   * (a quorum of equal hashes is what the coordinator records with the epoch's checkpoint). Absent: the backend
   * cannot carry it.
   */
  sendCooldownWitness?(step: number, paramHash: string): boolean
  sendHealthCheck(step: number, accused: ClientId[]): boolean
  /** As a witness of `step`: `accused`'s result for it failed validation. */
  sendAccusation(step: number, accused: ClientId, reason: AccusationReason): boolean
  /** As a verifier: the scores we gave peers' results of round `step` (the coordinator keeps moving averages: rewards.ts). */
  sendScores?(step: number, scores: {client_id: ClientId; score: number}[]): boolean
  /**
   * The run's agreed scores: the moving averages of every verifier's reports the coordinator keeps (rewards.ts), by
   * client, as decimals in [-1, 1], with the reports counted and the last step scored. Absent: the backend does not
   * deliver them to clients (the centralized server sends them to watchers only).
   */
  agreedScores?(): ReadonlyMap<ClientId, {average: number; count: number; last_step: number}>
  /** Two signed announcements of one producer for one step (it equivocated). */
  sendEquivocation(proof: EquivocationProof): boolean
  sendWithdraw(): boolean
  /** The model uploaded to `repo` at the epoch's end; `paramHash`: the hash of its parameters. */
  sendCheckpoint(repo: HubRepo, paramHash?: string): boolean
  /** The coordinator's circuit relay, as this client can dial it (absent or empty: none). */
  readonly relayAddrs?: string[]
  /** Our libp2p addresses changed (a relay reservation, an observed address): publish them in the peer directory. */
  sendAddresses?(p2pAddrs: string[]): boolean
  close(): Promise<void>
}

/** What a client announces when it joins: its P2P addresses (published to the others in the peer directory). */
export interface JoinRequest {
  p2pAddrs: string[]
}

/**
 * How a client reaches its coordinator: each join opens a new backend link (a join is part of the hello, so a
 * client that was dropped rejoins through a fresh connection). Resolves once the first state is in `state`.
 */
export interface BackendConnector {
  /** For messages: where the coordinator is (e.g. "coordinator 127.0.0.1:5000"). */
  readonly description: string
  connect(join: JoinRequest): Promise<CoordinatorBackend>
}
