import {existsSync, mkdirSync, readFileSync} from 'node:fs'
import {join} from 'node:path'
import {deserializeState, serializeState} from '../../coordinator/index.js'
import {checkLedger, emptyLedger, type RewardsLedger} from '../../coordinator/rewards.js'
import type {CoordinatorState} from '../../coordinator/types.js'
import {PsycheError} from '../../errors.js'
import type {EventLog} from '../../events.js'
import {writeFileAtomicSync} from '../../protocol/atomic-file.js'
import {generateIdentity, loadIdentity, saveIdentity, type Identity} from '../../protocol/identity.js'
import type {SaveStatus} from '../../protocol/messages.js'
import type {PeerDirectory} from '../types.js'

/** File names inside saveStateDir. */
export const SAVED_STATE_FILE = 'coordinator-state.json'
export const SAVED_IDENTITY_FILE = 'server-identity.json'

/** What the server keeps across restarts: the coordinator's state, the peer directory, the rewards ledger. */
interface Saved {
  state: CoordinatorState
  peers: PeerDirectory
  rewards: RewardsLedger
}

interface SavedStateFile {
  type: 'psyche-coordinator-state'
  version: 1
  state: string
  peers: PeerDirectory
  /** The rewards ledger (absent in files saved before there was one: an empty ledger). */
  rewards?: RewardsLedger
}

/**
 * The server's identity: the given one, else the one kept in saveStateDir (created there on first use, so clients
 * that pin it reconnect after a restart), else a new random one.
 */
export async function serverIdentity(saveStateDir: string | undefined, identity?: Identity): Promise<Identity> {
  if (identity) return identity
  if (!saveStateDir) return generateIdentity()
  mkdirSync(saveStateDir, {recursive: true})
  const identityPath = join(saveStateDir, SAVED_IDENTITY_FILE)
  if (existsSync(identityPath)) return loadIdentity(identityPath)
  const created = generateIdentity()
  await saveIdentity(created, identityPath)
  return created
}

/** How the saves are going (the wire's SaveStatus, less the server's limit), with the file they go to. */
type SaveHealth = Omit<SaveStatus, 'max_failures'> & {path: string}

/**
 * The saved state in saveStateDir (SAVED_STATE_FILE), the one owner of that directory and file: the directory is
 * created when the store is (whatever else the server was given: an identity file, a dashboard), the file read once
 * when the server starts (it resumes from it) and written after every change the server adopts (temp name + rename,
 * so a crash leaves the old file or the new one). It keeps count of the saves that failed (health()).
 */
export class StateStore {
  readonly path: string
  private readonly counts: Omit<SaveHealth, 'path'> = {ok: true, failures_in_a_row: 0, failures: 0, last_error: null, last_saved_step: null, last_saved_at: null}
  /** Changes whenever health() does (watchers get it again). */
  version = 0

  constructor(
    dir: string,
    private readonly log: EventLog,
  ) {
    try {
      mkdirSync(dir, {recursive: true})
    } catch (error) {
      throw new PsycheError(`the save-state directory ${dir}: cannot create it: ${(error as NodeJS.ErrnoException).code ?? (error as Error).message}`, {code: 'ESAVEDSTATE'})
    }
    this.path = join(dir, SAVED_STATE_FILE)
  }

  health(): SaveHealth {
    return {path: this.path, ...this.counts}
  }

  /** The state saved for run `runId` (undefined: none saved yet). A file that cannot be read, or is of another run, throws. */
  load(runId: string): Saved | undefined {
    if (!existsSync(this.path)) return undefined
    const bad = (what: string) => new PsycheError(`saved state ${this.path}: ${what} (move the file away to start the run afresh)`, {code: 'ESAVEDSTATE'})
    let saved: SavedStateFile
    try {
      saved = JSON.parse(readFileSync(this.path, 'utf8'))
    } catch (error) {
      throw bad(`cannot read: ${(error as NodeJS.ErrnoException).code ?? (error as Error).message}`)
    }
    if (saved?.type !== 'psyche-coordinator-state' || saved.version !== 1 || typeof saved.state !== 'string') throw bad('not a psyche coordinator state file (version 1)')
    let state: CoordinatorState
    try {
      state = deserializeState(saved.state)
    } catch (error) {
      throw bad((error as Error).message)
    }
    if (state.run_id !== runId) throw bad(`it is run "${state.run_id}", but the state.toml is run "${runId}"`)
    const peers: PeerDirectory = {}
    if (saved.peers && typeof saved.peers === 'object') {
      for (const [k, v] of Object.entries(saved.peers)) if (Array.isArray(v) && v.every((a) => typeof a === 'string')) peers[k] = v
    }
    let rewards = emptyLedger()
    try {
      if (saved.rewards !== undefined) rewards = checkLedger(saved.rewards)
    } catch (error) {
      throw bad((error as Error).message)
    }
    return {state, peers, rewards}
  }

  /**
   * Writes what the server holds now (`now`: unix seconds); a failure is counted, logged (where: save, with the
   * failures in a row) and returned as false.
   */
  save(saved: Saved, now: number = Date.now() / 1000): boolean {
    const file: SavedStateFile = {type: 'psyche-coordinator-state', version: 1, state: serializeState(saved.state), peers: saved.peers, rewards: saved.rewards}
    const c = this.counts
    try {
      writeFileAtomicSync(this.path, JSON.stringify(file))
      if (!c.ok) this.version++
      Object.assign(c, {ok: true, failures_in_a_row: 0, last_error: null, last_saved_step: saved.state.progress.step, last_saved_at: now})
      return true
    } catch (error) {
      const message = (error as Error).message
      Object.assign(c, {ok: false, failures_in_a_row: c.failures_in_a_row + 1, failures: c.failures + 1, last_error: message})
      this.version++
      this.log({event: 'error', where: 'save', path: this.path, message, failures_in_a_row: c.failures_in_a_row, last_saved_step: c.last_saved_step})
      return false
    }
  }
}

/** Saves that may fail in a row before the server halts (--max-save-failures). */
export const DEFAULT_MAX_SAVE_FAILURES = 10
/** A failed save is tried again this often while nothing else changes. */
const SAVE_RETRY_MS = 1000

/**
 * The server's saving rule over its StateStore: while saves fail, one is tried at most every SAVE_RETRY_MS (the
 * failures in a row count seconds of a failing disk, not a burst of changes), and after `maxFailures` in a row the
 * server halts: `haltedWith` says why, and `halted` resolves.
 */
export class SavePolicy {
  private lastAttempt = 0
  /** Why the server halted (its saves kept failing), once it has. */
  haltedWith: PsycheError | undefined
  private onHalt: (error: PsycheError) => void = () => {}
  readonly halted: Promise<PsycheError> = new Promise((resolve) => (this.onHalt = resolve))

  constructor(
    readonly store: StateStore,
    readonly maxFailures: number,
    private readonly log: EventLog,
  ) {
    if (!Number.isInteger(maxFailures) || maxFailures < 1)
      throw new PsycheError(`--max-save-failures: ${maxFailures} is not a positive whole number`, {exitCode: 2, code: 'EUSAGE'})
  }

  /** Whether a save is due now: always while saves succeed, else once the retry interval has passed. */
  due(): boolean {
    return this.store.health().ok !== false || performance.now() - this.lastAttempt >= SAVE_RETRY_MS
  }

  /** Saves; false when that failed (and halts at maxFailures in a row; `at` is where the run stands). */
  save(saved: Saved, now: number, at: {run_state: string; step: number}): boolean {
    this.lastAttempt = performance.now()
    if (this.store.save(saved, now)) return true
    const health = this.store.health()
    if (health.failures_in_a_row >= this.maxFailures) this.halt(health, at)
    return false
  }

  /**
   * The state cannot be saved: the server starts no more rounds and takes no more events (the clients keep what they
   * trained; a restart resumes from the last saved state), and `halted` tells the caller to stop it.
   */
  private halt(health: SaveHealth, at: {run_state: string; step: number}): void {
    if (this.haltedWith) return
    const message =
      `the coordinator state could not be saved to ${health.path} ${health.failures_in_a_row} times in a row (--max-save-failures ${this.maxFailures}), ` +
      `the last: ${health.last_error}; halted at step ${at.step} so that no more training depends on state a restart would lose ` +
      `(the last state saved is step ${health.last_saved_step ?? 'none'}): free the disk or fix the directory, then restart with the same --save-state-dir`
    this.haltedWith = new PsycheError(message, {code: 'ESAVEDSTATE'})
    this.log({event: 'halted', reason: message, run_state: at.run_state, step: at.step, last_saved_step: health.last_saved_step})
    this.onHalt(this.haltedWith)
  }
}
