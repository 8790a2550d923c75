import {readFile, rm} from 'node:fs/promises'
import {join} from 'node:path'
import {errorMessage} from '../errors.js'
import {writeFileAtomic} from './store.js'
import {uploadCheckpoint, type UploadResult} from './hub.js'
import type {EventLog} from '../events.js'

/**
 * What psyche records next to a checkpoint's weights: the run, the step the model is at and the worker's hash of
 * its parameters. A client loading the checkpoint checks the hash; one falling back to it from a P2P epoch checks
 * that the step is the epoch's.
 */
export const CHECKPOINT_META_FILE = 'psyche-checkpoint.json'

export interface CheckpointMeta {
  run_id?: string
  step: number
  epoch?: number
  param_hash?: string
}

/** The checkpoint's psyche-checkpoint.json (it came from the Hub: checked), or undefined when it has none. */
export async function readCheckpointMeta(dir: string): Promise<CheckpointMeta | undefined> {
  let text: string
  try {
    text = await readFile(join(dir, CHECKPOINT_META_FILE), 'utf8')
  } catch {
    return undefined
  }
  if (text.length > 64 * 1024) throw new Error(`${CHECKPOINT_META_FILE}: ${text.length} bytes is too long`)
  let raw: unknown
  try {
    raw = JSON.parse(text)
  } catch {
    throw new Error(`${CHECKPOINT_META_FILE} is not JSON`)
  }
  if (typeof raw !== 'object' || raw === null || Array.isArray(raw)) throw new Error(`${CHECKPOINT_META_FILE} is not a JSON object`)
  const r = raw as Record<string, unknown>
  const uint = (v: unknown) => typeof v === 'number' && Number.isSafeInteger(v) && v >= 0
  if (!uint(r.step)) throw new Error(`${CHECKPOINT_META_FILE}: step is not a non-negative integer`)
  if (r.epoch !== undefined && !uint(r.epoch)) throw new Error(`${CHECKPOINT_META_FILE}: epoch is not a non-negative integer`)
  if (r.param_hash !== undefined && (typeof r.param_hash !== 'string' || r.param_hash.length === 0 || r.param_hash.length > 256))
    throw new Error(`${CHECKPOINT_META_FILE}: param_hash is not a short string`)
  if (r.run_id !== undefined && typeof r.run_id !== 'string') throw new Error(`${CHECKPOINT_META_FILE}: run_id is not a string`)
  return {run_id: r.run_id as string | undefined, step: r.step as number, epoch: r.epoch as number | undefined, param_hash: r.param_hash as string | undefined}
}

interface CheckpointerOptions {
  repo: string
  /** branch the checkpoints are committed to */
  revision?: string
  hubUrl?: string
  token: string
  /** where model directories are staged before upload (one per epoch, removed once uploaded) */
  stagingDir: string
  maxShardBytes?: number
  /** writes the current model (config, weights, tokenizer, card) to a directory; runs on the caller's turn */
  save: (dir: string, card: Record<string, string | number>) => Promise<void>
  /** called when an upload has become a Hub commit: the client reports it to the coordinator */
  onUploaded: (checkpoint: {step: number; epoch: number; repo_id: string; revision: string; result: UploadResult}) => void
  log?: EventLog
}

/**
 * A checkpointer client's uploads (Psyche: clients started with a Hub repository upload the model after each
 * epoch). `checkpoint(step, epoch)` saves the model to a staging directory — the only part on the training
 * path, a local write — and returns; the upload runs in the background. One upload runs at a time; if epochs
 * end faster than uploads finish, only the newest waiting checkpoint is uploaded next (an older one is
 * superseded, its staging directory removed).
 */
export class Checkpointer {
  private running: Promise<void> | undefined
  /** The checkpoint next to upload; `owned`: a staging directory of ours, removed once uploaded or superseded. */
  private waiting: {step: number; epoch: number; dir: string; owned: boolean} | undefined
  private uploadingStep: number | undefined
  private readonly done: {step: number; commit: string}[] = []

  constructor(private readonly options: CheckpointerOptions) {}

  /** Saves the model now (with its psyche-checkpoint.json) and queues its upload; resolves once saved (not uploaded). */
  async checkpoint(step: number, epoch: number, meta: {run_id?: string; param_hash?: string} = {}): Promise<void> {
    const dir = join(this.options.stagingDir, `step-${step}`)
    await this.options.save(dir, {step, epoch})
    const record: CheckpointMeta = {...(meta.run_id ? {run_id: meta.run_id} : {}), step, epoch, ...(meta.param_hash ? {param_hash: meta.param_hash} : {})}
    await writeFileAtomic(join(dir, CHECKPOINT_META_FILE), JSON.stringify(record, null, 2) + '\n')
    this.options.log?.({event: 'checkpoint_saved', step, epoch, dir, param_hash: meta.param_hash ?? null, staged: true})
    await this.enqueue({step, epoch, dir, owned: true})
  }

  /**
   * Queues the upload of a checkpoint already saved in `dir` with its psyche-checkpoint.json (a --checkpoint-dir save):
   * the directory is the caller's and is never removed here.
   */
  async upload(step: number, epoch: number, dir: string): Promise<void> {
    await this.enqueue({step, epoch, dir, owned: false})
  }

  /** The steps whose checkpoints are being uploaded or wait for it: their directories must stay. */
  get uploading(): number[] {
    return [this.uploadingStep, this.waiting?.step].filter((s): s is number => s !== undefined)
  }

  private async enqueue(job: {step: number; epoch: number; dir: string; owned: boolean}): Promise<void> {
    const superseded = this.waiting
    this.waiting = job
    if (superseded) {
      this.options.log?.({event: 'checkpoint_superseded', step: superseded.step, by: job.step})
      if (superseded.owned) await rm(superseded.dir, {recursive: true, force: true})
    }
    if (!this.running) this.running = this.drain()
  }

  /** Resolves when every queued upload has finished (for shutdown and tests). */
  async idle(): Promise<void> {
    while (this.running) await this.running
  }

  get uploaded(): readonly {step: number; commit: string}[] {
    return this.done
  }

  private async drain(): Promise<void> {
    try {
      while (this.waiting) {
        const job = this.waiting
        this.waiting = undefined
        this.uploadingStep = job.step
        const revision = this.options.revision ?? 'main'
        this.options.log?.({event: 'checkpoint_upload_started', step: job.step, repo: this.options.repo, revision})
        try {
          const result = await uploadCheckpoint({
            dir: job.dir,
            repo: this.options.repo,
            revision,
            hubUrl: this.options.hubUrl,
            token: this.options.token,
            message: `psyche checkpoint: step ${job.step} (epoch ${job.epoch})`,
            maxShardBytes: this.options.maxShardBytes,
          })
          this.done.push({step: job.step, commit: result.commit})
          this.options.log?.({event: 'checkpoint_uploaded', step: job.step, commit: result.commit, bytes: result.bytes, seconds: Number(result.seconds.toFixed(2))})
          this.options.onUploaded({step: job.step, epoch: job.epoch, repo_id: this.options.repo, revision: result.commit, result})
        } catch (error) {
          // a failed upload is logged and dropped: the run goes on, the next epoch's checkpoint tries again
          this.options.log?.({event: 'checkpoint_upload_failed', step: job.step, message: errorMessage(error)})
        } finally {
          this.uploadingStep = undefined
          if (job.owned) await rm(job.dir, {recursive: true, force: true})
        }
      }
    } finally {
      this.running = undefined
    }
  }
}
