import {tmpdir} from 'node:os'
import {dirname, join} from 'node:path'
import {Checkpointer, CHECKPOINT_META_FILE, type CheckpointMeta} from '../checkpoint/checkpointer.js'
import {checkpointStepDir, DEFAULT_KEEP_CHECKPOINTS, pruneCheckpoints} from '../checkpoint/retention.js'
import {writeFileAtomic} from '../checkpoint/store.js'
import {agreedParamHash, checkpointRefusal, type Round} from '../coordinator/index.js'
import {errorMessage, PsycheError} from '../errors.js'
import type {ClientContext} from './context.js'

/** An uploaded checkpoint not reported yet: it waits for the epoch's witnesses to agree on a parameter hash. */
interface Uploaded {
  step: number
  epoch: number
  repo_id: string
  revision: string
  param_hash: string | undefined
  /** The upload finished in time, and the report waited for the witnesses' agreement. */
  waited?: boolean
}

/**
 * Checkpointing (Psyche's `--hub-repo`): a checkpointer saves the model once per epoch, when the epoch's last round
 * is applied (Cooldown), uploads it to the Hub in the background, and reports it to the coordinator, with the hash of
 * the parameters it saved, if the coordinator still takes it (its own rule, coordinator/rules.ts checkpointRefusal).
 * The coordinator records the checkpoint with the hash the last round's witnesses agreed on, so the report waits for
 * that agreement to show in the state (on a backend that carries Cooldown witnesses).
 */
export class Checkpointing {
  private readonly checkpointer: Checkpointer | undefined
  private checkpointedEpoch: number | null = null
  /** The last Cooldown seen: its epoch and last round's step. */
  private epochEnd: {epoch: number; step: number} | undefined
  /** The parameter hash of each step saved for upload. */
  private readonly savedHashes = new Map<number, string>()
  private waiting: Uploaded | undefined
  /** The removal of older saves under way (--keep-checkpoints). */
  private pruning: Promise<void> = Promise.resolve()

  constructor(private readonly ctx: ClientContext) {
    const {opts} = ctx
    if (opts.checkpointDir && !ctx.worker.save) throw new PsycheError('this worker cannot save models (--checkpoint-dir)')
    const hub = opts.hub
    if (!hub?.repo) return
    if (!ctx.worker.save) throw new PsycheError('this worker cannot save models, so the client cannot be a checkpointer')
    if (!hub.token) throw new PsycheError('a checkpointer needs a Hub token (--hub-token or HF_TOKEN)')
    this.checkpointer = new Checkpointer({
      repo: hub.repo,
      revision: hub.revision,
      hubUrl: hub.url,
      token: hub.token,
      maxShardBytes: hub.maxShardBytes,
      stagingDir: hub.stagingDir ?? join(tmpdir(), `psyche-checkpoints-${opts.id.slice(0, 16)}`),
      save: (dir, card) => ctx.worker.save!(dir, {card: {...card, run_id: opts.runId}}),
      log: opts.log,
      onUploaded: (c) => {
        const param_hash = this.savedHashes.get(c.step)
        this.savedHashes.delete(c.step)
        this.waiting = {step: c.step, epoch: c.epoch, repo_id: c.repo_id, revision: c.revision, param_hash}
        this.report()
      },
    })
  }

  /**
   * A new coordinator state: an upload waiting for the witnesses' agreement may be reported now (or be late). A
   * Cooldown names the epoch's last round, remembered so that an apply of it that ends after the Cooldown still saves.
   */
  onState(): void {
    const state = this.ctx.state
    const last = state.epoch.round?.step
    if (state.run_state === 'Cooldown' && last !== undefined) this.epochEnd = {epoch: state.progress.epoch, step: last}
    if (this.waiting) this.report()
  }

  /** The epoch whose last round is `step` (seen in its Cooldown), or undefined. */
  epochEndingAt(step: number): number | undefined {
    const state = this.ctx.state
    if (state.run_state === 'Cooldown' && state.epoch.round?.step === step) return state.progress.epoch
    return this.epochEnd?.step === step ? this.epochEnd.epoch : undefined
  }

  private report(): void {
    const ctx = this.ctx
    const c = this.waiting
    if (!c) return
    const state = ctx.state
    const refusal = checkpointRefusal(state)
    const ownCooldown = state.run_state === 'Cooldown' && state.progress.epoch === c.epoch
    // After its Cooldown, the coordinator still takes the checkpoint if it is the run's current model (the hash it
    // recorded at the epoch's end): a run whose members all left resumes from it.
    const current = state.current_model?.param_hash
    const late = state.run_state !== 'Cooldown' && !refusal && c.param_hash !== undefined && current === c.param_hash
    // The coordinator takes a checkpoint only in the Cooldown of the epoch it ends, once, or late as above. Otherwise
    // (finished after that Cooldown, another checkpointer reported first, no quorum agreed on the hash): the commit is
    // on the Hub branch but the coordinator will not take it; it is reported here, with what a user needs to find it.
    if (!late && (refusal || !ownCooldown)) {
      this.waiting = undefined
      ctx.log({
        event: 'checkpoint_late',
        step: c.step,
        epoch: c.epoch,
        repo_id: c.repo_id,
        revision: c.revision,
        reason:
          ownCooldown && state.epoch.checkpointed
            ? 'another checkpointer reported this epoch first'
            : state.run_state !== 'Cooldown' && refusal?.code === 'AlreadyCheckpointed'
              ? `the run's current model (step ${state.current_model?.step}) is already checkpointed`
              : c.waited
                ? `no quorum of the epoch's last round's witnesses attested a parameter hash before its Cooldown ended`
                : `the upload finished in ${state.run_state} of epoch ${state.progress.epoch}, after the Cooldown the coordinator takes checkpoints in, and it is not the run's current model`,
      })
      return
    }
    // Wait for a quorum of the last round's witnesses to attest the parameters (the state shows it as it arrives).
    if (!late && c.param_hash !== undefined && ctx.conn.sendCooldownWitness !== undefined && agreedParamHash(state) === undefined) {
      c.waited = true
      return
    }
    this.waiting = undefined
    if (ctx.conn.sendCheckpoint({repo_id: c.repo_id, revision: c.revision}, c.param_hash))
      ctx.log({
        event: 'checkpoint',
        step: c.step,
        epoch: c.epoch,
        repo_id: c.repo_id,
        revision: c.revision,
        ...(c.param_hash ? {param_hash: c.param_hash} : {}),
        ...(late ? {late: true} : {}),
      })
  }

  /**
   * After applying `round`: if it is its epoch's last round (in the Cooldown, or after it when the apply ended late),
   * once per epoch, save the model (the upload runs in the background). With --checkpoint-dir the model is saved there once, and a checkpointer uploads that save.
   */
  async afterApply(round: Round): Promise<void> {
    const ctx = this.ctx
    if (!this.checkpointer && !ctx.opts.checkpointDir) return
    // The epoch's last round, applied in its Cooldown or after it (a slow apply): the model is that epoch's either way.
    const epoch = this.epochEndingAt(round.step)
    if (epoch === undefined || this.checkpointedEpoch === epoch) return
    this.checkpointedEpoch = epoch
    if (ctx.lastHash) this.savedHashes.set(round.step, ctx.lastHash)
    if (ctx.opts.checkpointDir) {
      const dir = await this.saveToDir(ctx.opts.checkpointDir, round.step, epoch)
      if (dir === undefined) return void this.savedHashes.delete(round.step)
      await this.checkpointer?.upload(round.step, epoch, dir)
      // off the training path: the next round need not wait for older saves to be removed
      const checkpointDir = ctx.opts.checkpointDir
      this.pruning = this.pruning
        .then(() => this.prune(checkpointDir, round.step))
        .catch((error: unknown) => ctx.log({event: 'checkpoint_prune_failed', dir: checkpointDir, message: errorMessage(error)}))
      return
    }
    await this.checkpointer
      ?.checkpoint(round.step, epoch, {run_id: ctx.opts.runId, param_hash: ctx.lastHash ?? undefined})
      .catch((error: unknown) => ctx.log({event: 'checkpoint_save_failed', step: round.step, message: errorMessage(error)}))
  }

  /**
   * --checkpoint-dir: the model in `step-S` (the worker replaces the directory in two renames), then its
   * psyche-checkpoint.json. Returns the directory, or undefined when the save failed (logged).
   */
  private async saveToDir(checkpointDir: string, step: number, epoch: number): Promise<string | undefined> {
    const ctx = this.ctx
    const dir = checkpointStepDir(checkpointDir, step)
    try {
      await ctx.worker.save!(dir, {card: {step, epoch, run_id: ctx.opts.runId}})
      const meta: CheckpointMeta = {run_id: ctx.opts.runId, step, epoch, ...(ctx.lastHash ? {param_hash: ctx.lastHash} : {})}
      await writeFileAtomic(join(dir, CHECKPOINT_META_FILE), JSON.stringify(meta, null, 2) + '\n')
      ctx.log({event: 'checkpoint_saved', step, epoch, dir, param_hash: ctx.lastHash ?? null})
      return dir
    } catch (error) {
      ctx.log({event: 'checkpoint_save_failed', step, message: `${dir}: ${errorMessage(error)}`})
      return undefined
    }
  }

  /**
   * --keep-checkpoints: the run's older saves beyond the last N are removed, never the one being uploaded, the run's
   * current model, or the directory the client loaded its model from.
   */
  private async prune(checkpointDir: string, saved: number): Promise<void> {
    const ctx = this.ctx
    const current = ctx.state.current_model?.step
    const source = ctx.opts.plan.model
    await pruneCheckpoints({
      checkpointDir,
      runId: ctx.opts.runId,
      keep: ctx.opts.keepCheckpoints ?? DEFAULT_KEEP_CHECKPOINTS,
      saved,
      protect: [...(this.checkpointer?.uploading ?? []), ...(current === undefined ? [] : [current])],
      protectDirs: source.kind === 'dir' ? [source.dir] : [dirname(source.configPath)],
      log: ctx.log,
    })
  }

  /** Waits for the upload and the pruning under way (the last epoch's checkpoint is not abandoned when the run finishes). */
  async idle(): Promise<void> {
    await this.checkpointer?.idle()
    await this.pruning
  }
}
