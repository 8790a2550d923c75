import {rm} from 'node:fs/promises'
import {join} from 'node:path'
import {errorMessage} from '../errors.js'
import {uploadCheckpoint, type UploadResult} from './hub.js'

export interface CheckpointerOptions {
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
  log?: (event: Record<string, unknown>) => void
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
  private waiting: {step: number; epoch: number; dir: string} | undefined
  private readonly done: {step: number; commit: string}[] = []

  constructor(private readonly options: CheckpointerOptions) {}

  /** Saves the model now and queues its upload; resolves once saved (not uploaded). */
  async checkpoint(step: number, epoch: number): Promise<void> {
    const dir = join(this.options.stagingDir, `step-${step}`)
    await this.options.save(dir, {step, epoch})
    if (this.waiting) {
      this.options.log?.({event: 'checkpoint_superseded', step: this.waiting.step, by: step})
      await rm(this.waiting.dir, {recursive: true, force: true})
    }
    this.waiting = {step, epoch, dir}
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
          await rm(job.dir, {recursive: true, force: true})
        }
      }
    } finally {
      this.running = undefined
    }
  }
}
