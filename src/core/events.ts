/**
 * Every event a command emits: the JSON lines of `--json` (join, server run, relay, dashboard, solana localnet), and what
 * the plain and live views are drawn from. One discriminated union on `event`; an emitter's log function takes a
 * PsycheEvent, so a new kind or field is declared here first, and the tests read the JSON lines as PsycheEvents.
 * The keys are snake_case and stable (`--json` is an interface). Where several components emit one kind (e.g.
 * `disconnected` by the server and by a client's connection), the fields only some of them set are optional.
 */

/** One line per applied round: what the testnet and the tests compare across clients. */
export type RoundEvent = {
  event: 'round'
  step: number
  epoch: number
  /** This client's training loss in the round (null: it did not train in it). */
  loss: number | null
  /** The committed parameters after applying the round's accepted results. */
  param_hash: string
  applied: number
  /** The round's trainers: its members, or max_trainers_per_round of them when that is fewer. */
  trainers: number
  /** Other clients' results applied in this round (our own excluded). */
  peers_applied: number
  /** Other clients' results the witness quorum accepted for this round. */
  peers_accepted: number
  /** Other clients that had batches to train in this round. */
  other_trainers: number
  result_bytes: number | null
  compute_ms: number | null
  /** Time spent applying the round outside the worker's training call (collecting results, a separate apply). */
  apply_ms: number
  bytes_in: number
  bytes_out: number
  peers: number
  /** P2P connections now: direct and relayed (through a circuit relay); null when the P2P layer cannot tell. */
  conn_direct: number | null
  conn_relayed: number | null
  /**
   * Loss on the run's held-out samples at the parameters after this round (the same on every replica); null when
   * this client did not evaluate after this round (see join --eval-every).
   */
  val_loss: number | null
  /** Worker time of that evaluation (run after our next result is published, so training does not wait for it). */
  eval_ms: number | null
  /** P2P bytes per peer since the client started (keyed by client id, or libp2p peer id); {} when not counted. */
  peer_bytes: Record<string, {in: number; out: number}>
  /** Of bytes_in/bytes_out, those that went through a circuit relay (cumulative); null when the P2P layer cannot tell. */
  relayed_in: number | null
  relayed_out: number | null
  /** Of peer_bytes, those that went through a circuit relay, per peer (cumulative). */
  peer_relayed_bytes: Record<string, {in: number; out: number}>
  /**
   * Rounds in a row, this one included, in which other clients trained and none of their results was applied
   * here (0: this round exchanged, or nobody else trained). See join --max-rounds-without-exchange.
   */
  rounds_without_exchange: number
}

export type PsycheEvent =
  | RoundEvent
  | {event: 'accepted'; peer: string; client?: string; kind: string}
  | {event: 'accused'; step: number; client_id: string; reason: string}
  // core/p2p/node.ts
  | {event: 'address_handler_failed'; reason: string}
  | {event: 'addresses'; peer: string; client: string; p2p_addrs: string[]}
  // core/p2p/node.ts
  | {event: 'addresses_changed'; addrs: string[]}
  // core/p2p/node.ts
  | {event: 'announcement_handler_failed'; reason: string}
  | {event: 'announcement_ignored'; client_id: string; step: number; reason: string}
  // core/p2p/node.ts
  | {event: 'announcement_rejected'; reason: string; from?: string; via: string}
  | {event: 'have_rejected'; from: string; reason: string}
  | {event: 'authority'; type: string}
  // core/p2p/node.ts
  | {event: 'bad_blob'; from: string; client_id: string; commitment: string; reason: string}
  /** A swarmed result's piece or hash list that did not check, blamed on the peer that sent it (p2p/piece-fetch.ts). */
  | {event: 'bad_piece'; from: string; client_id: string; commitment: string; reason: string}
  | {event: 'banned'; epoch: number; detail: string}
  // core/p2p/node.ts
  | {event: 'blob_refused'; client_id: string; commitment: string; reason: string}
  | {event: 'checkpoint'; step: number; epoch: number; repo_id: string; revision: string; param_hash?: string; late?: boolean}
  | {event: 'checkpoint_download_failed'; step: number; repo_id: string; message: string}
  | {event: 'checkpoint_downloaded'; step: number; repo_id: string; revision: string; bytes: number; downloaded_bytes: number}
  | {event: 'checkpoint_late'; step: number; epoch: number; repo_id: string; revision: string; reason: string}
  | {event: 'checkpoint_rejected'; step: number; message: string; repo_id?: string; revision?: string | null; expected?: string; actual?: string}
  | {event: 'checkpoint_prune_failed'; dir: string; message: string}
  | {event: 'checkpoint_pruned'; step: number; dir: string}
  | {event: 'checkpoint_save_failed'; step: number; message: string}
  /** staged: saved in the checkpointer's staging directory for upload (removed once uploaded). */
  | {event: 'checkpoint_saved'; step: number; epoch: number; dir: string; param_hash: string | null; staged?: boolean}
  | {event: 'checkpoint_step'; step: number; checkpoint_step: number}
  | {event: 'checkpoint_superseded'; step: number; by: number}
  | {event: 'checkpoint_upload_failed'; step: number; message: string}
  | {event: 'checkpoint_upload_started'; step: number; repo: string; revision: string}
  | {event: 'checkpoint_uploaded'; step: number; commit: string; bytes: number; seconds: number}
  | {
      event: 'client_report'
      loss: number | null
      val_loss: number | null
      tokens_per_second: number | null
      compute_ms: number | null
      apply_ms: number | null
      result_bytes: number | null
      bytes_in: number
      bytes_out: number
      applied: number
      accepted: number
      peers: number
      client: string
      step: number
    }
  | {event: 'connected'; peer: string}
  | {event: 'coordinator_account_invalid'; message: string}
  | {event: 'dashboard_listening'; url: string; port: number; run_id?: string; host?: string}
  | {event: 'data_server'; message: string}
  | {event: 'data_server_listening'; host: string; port: number; dir: string; samples: number}
  // core/p2p/node.ts
  | {event: 'dial_failed'; addr?: string; reason: string; peer_id?: string; addrs?: string[]}
  // core/p2p/relay.ts
  | {event: 'dialback'; peer_id: string; checked: string[]; reachable: string[]}
  // core/p2p/relay.ts
  | {event: 'dialback_failed'; peer_id: string; reason: string}
  | {event: 'disconnected'; addr?: string; client?: string; peer?: string; message?: string}
  | {event: 'equivocation_reported'; client_id: string; step: number}
  // where: save (the coordinator server's saved state): with the saves that failed in a row, and the step of the last state saved
  | {event: 'error'; where?: string; message: string; path?: string; peer?: string; code?: string; failures_in_a_row?: number; last_saved_step?: number | null}
  | {event: 'eval_failed'; step: number; message: string}
  | {event: 'eval_set'; source: string; samples: number; data: string}
  | {event: 'eval_unavailable'; reason: string}
  // core/p2p/node.ts
  | {event: 'fetch_failed'; from: string; client_id: string; commitment: string; step: number; pass: number; reason: string}
  // core/p2p/node.ts
  | {event: 'fetch_retried'; from: string; client_id: string; step: number; pass: number}
  | {event: 'finished'; rounds: number; last_step: number | null; param_hash: string | null; bytes_in: number; bytes_out: number}
  | {event: 'health_check'; step: number; judged: number; accused: string[]}
  // core/p2p/liveness.ts: a peer dialled us again while we held older connections to it that no longer answer (it
  // restarted with the same key): they were closed, and the peer dialled afresh
  | {event: 'stale_connection'; peer_id: string; addrs: string[]; replaced_by: string}
  | {event: 'stale_connection_failed'; peer_id: string; reason: string}
  /** The stream muxer's abort of a connection already closed threw (p2p/muxer.ts): reported, the process goes on. */
  | {event: 'muxer_abort_failed'; reason: string}
  // core/p2p/punch.ts: a relayed connection upgraded to a direct one by TCP hole punching, or the attempt that failed
  | {event: 'hole_punched'; peer_id: string; addr: string; role: 'initiator' | 'responder'; attempts: number; ms: number}
  | {event: 'hole_punch_failed'; peer_id: string; role: 'initiator' | 'responder'; attempts: number; ms: number; reason: string}
  // core/p2p/webrtc.ts: a relayed connection upgraded to a direct WebRTC (UDP) one, with the ICE candidate types of the
  // chosen pair (host, srflx: the NAT mapping STUN told, prflx), or the attempt that failed; unavailable: no native library
  | {event: 'webrtc_connected'; peer_id: string; addr: string; role: 'initiator' | 'responder'; local: string; remote: string; ms: number}
  | {event: 'webrtc_failed'; peer_id: string; role: 'initiator' | 'responder'; ms: number; reason: string}
  | {event: 'webrtc_unavailable'; reason: string}
  // core/p2p/upgrade.ts: a peer's relayed connections closed once a direct one was up (after waited_ms of transfers)
  | {event: 'relayed_closed'; peer_id: string; direct: string; waited_ms: number}
  | {event: 'relayed_close_failed'; peer_id: string; reason: string}
  // core/p2p/stun.ts: the STUN server's socket reported an error (it goes on serving)
  | {event: 'stun_error'; reason: string}
  | {event: 'hello'; peer: string; client: string; want_join: boolean; p2p_addrs: string[]}
  | {event: 'joined'; peer?: string; client?: string; client_id?: string; address?: string}
  | {event: 'limit_lowered'; limit: string; to: number; reason: string}
  | {event: 'listening'; host?: string; port?: number; run_id?: string; server_id?: string; run_state?: string; step?: number; url?: string}
  | {event: 'metrics_listening'; host: string; port: number; path: string}
  // core/client/runner.ts, core/p2p/model-download.ts
  | {event: 'model_fetch_failed'; client_id?: string; reason?: string; step?: number; message?: string}
  // core/p2p/node.ts
  | {
      event: 'model_fetched'
      from: string[]
      step: number
      bytes: number
      peers: number
      attesters: number
      dropped: number
      root: string
      ms: number
      relayed: boolean
      busy: number
    }
  | {event: 'model_loaded'; step: number; source: string; param_hash: string; parameters?: number}
  // core/p2p/model-download.ts
  | {event: 'model_manifest'; step: number; root: string; param_hash: string; attesters: number; answered: number; tensors: number}
  // core/p2p/model-download.ts
  | {event: 'model_peer_dropped'; client_id: string; reason: string; bad?: boolean}
  // core/p2p/model-download.ts
  | {event: 'model_piece_failed'; client_id: string; tensors: number; attempt: number; reason: string}
  | {
      event: 'no_exchange'
      step: number
      rounds: number
      other_trainers: number
      peers: number
      unreachable: {peer_id: string; addrs: string[]; reason: string}[]
      detail: string
      leaving?: boolean
    }
  | {event: 'out_of_sync'; step: number; unannounced: string[]; unfetched: string[]; detail: string}
  | {event: 'peer_record_closed'; address: string}
  | {event: 'peer_record_invalid'; client_id: string; message: string}
  | {event: 'peer_record_not_closed'; message: string}
  | {event: 'peers_changed'; peers: number}
  // core/p2p/node.ts
  | {event: 'reachability'; reachable: boolean; via: string; addrs?: string[]; reason?: string}
  | {event: 'reannounce_failed'; message: string}
  | {event: 'reconnected'; addr?: string; rpc?: string}
  | {event: 'rejected'; peer?: string; code: string; reason: string; of?: string; client?: string; closed?: boolean}
  | {event: 'rejected_by_program'; of: string; code?: string; reason: string}
  | {event: 'rejected_by_server'; of?: string; code: string; reason: string}
  // core/backend/solana/client.ts: a verifier's scores of a round the state no longer holds
  | {event: 'scores_not_sent'; step: number; reason: string}
  | {event: 'rejoined'; peer: string; client: string; detail: string}
  | {event: 'rejoining'; run_state: string}
  | {event: 'relay'; addrs: string[]}
  | {
      event: 'relay_listening'
      peer_id: string
      port: number
      quic_port: number
      /** The relay's STUN server (UDP); 0: none. */
      stun_port?: number
      addrs: string[]
      max_reservations: number
      data_limit_bytes: number
      duration_limit_ms: number
    }
  // core/p2p/relay.ts
  | {event: 'relay_reservation'; peer_id: string; addr: string; expiry: string}
  // core/p2p/relay.ts: a stranger (not a member of the run) asked for a slot, a relayed connection or a dial-back
  | {event: 'relay_refused'; peer_id: string; what: string; reason: string}
  // core/p2p/relay.ts
  | {event: 'relay_reservation_ended'; peer_id: string}
  // core/p2p/node.ts
  | {event: 'reservation_failed'; relay: string; reason: string}
  | {event: 'result_dropped'; client_id: string; step: number; reason?: string}
  | {event: 'result_fetch_failed'; client_id: string; step: number; message: string}
  // core/p2p/result-exchange.ts
  /** from: the peer that sent the most of it; pieces: when fetched in pieces, how many each peer sent. */
  | {event: 'result_fetched'; from: string; client_id: string; step: number; bytes: number; pieces?: {peer_id: string; pieces: number}[]}
  | {event: 'result_rejected'; client_id: string; step: number; reason: string}
  | {event: 'results_excluded'; step: number; client_ids: string[]}
  | {event: 'resumed'; path: string; run_id: string; run_state: string; step: number; epoch: number; clients: number; pending: number}
  | {event: 'scored'; step: number; client_id: string; score: number; average: number; count: number; gain_assigned: number; gain_random: number}
  | {event: 'scores'; client: string; step: number; scores: {client_id: string; score: number}[]}
  // core/backend/centralized/ledger.ts: an epoch's points settled (coordinator/rewards.ts), per client that got any
  | {event: 'epoch_rewards'; epoch: number; clients: {client_id: string; earned: number; slashed: number}[]}
  | {event: 'send_failed'; of: string; message: string}
  // core/p2p/node.ts
  | {event: 'serve_failed'; protocol: string; to: string; reason: string}
  | {event: 'server_error'; message: string}
  | {event: 'server_identity_changed'; previous: string; now: string}
  | {event: 'server_message_dropped'; reason: string; detail: string}
  | {event: 'started'; client_id: string; p2p: string[]; worker_pid?: number}
  | {event: 'stopped'; run_state: string; step: number}
  // core/backend/centralized/server.ts: the server's saves kept failing (--max-save-failures): it starts no more rounds and exits
  | {event: 'halted'; reason: string; run_state: string; step: number; last_saved_step: number | null}
  | {event: 'subscription_failed'; ws_rpc: string; message: string}
  | {event: 'tick_refused'; reason: string}
  /**
   * core/client/training.ts: the next round's compute begun on the batches predicted for it, before it began (`begun`);
   * the round began as predicted and its work was kept (`used`), or not and it was undone (`discarded`, with why).
   */
  | {event: 'speculation'; step: number; outcome: 'begun' | 'used' | 'discarded'; batches: number; reason?: string}
  | {event: 'trained'; step: number; loss: number; batches: number; result_bytes: number; compute_ms: number; produce_ms: number}
  | {event: 'transition'; from: string; to: string; step: number; epoch?: number; clients?: number; pending?: number}
  | {event: 'verify_failed'; step: number; message: string}
  | {event: 'warmup_ready'; epoch: number; step: number | null}
  | {event: 'waiting'; reason: 'members' | 'model' | 'next_epoch' | 'paused'; detail: string; seconds: number | null}
  | {event: 'warning'; message: string}
  // core/backend/centralized/admission.ts: a bound lowered at start (--max-connections to fit ulimit -n)
  | {event: 'limit_lowered'; limit: string; to: number; reason: string}
  | {event: 'withdrawn'; client?: string; reason: string}
  | {event: 'witness'; step: number; seen: number}
  /** Cooldown: as a witness of the epoch's last round, we attested our parameters' hash after applying it. */
  | {event: 'cooldown_witness'; step: number; param_hash: string}
  | {event: 'worker_crashed'; message: string; restarting?: boolean}
  | {event: 'worker_restarted'; restarts: number; worker_pid?: number}

/** A function an emitter logs its events with. */
export type EventLog = (event: PsycheEvent) => void

/**
 * A line as a command writes it: `join` marks the events of its P2P node and its coordinator connection with
 * `source: 'p2p' | 'coordinator'` (model_loaded and eval_set carry a source of their own); `server run` and `relay`
 * add the time (ISO 8601).
 */
export type EventLine = PsycheEvent & {source?: string; time?: string}
