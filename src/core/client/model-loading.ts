import {existsSync} from 'node:fs'
import {dirname, join, resolve} from 'node:path'
import {CHECKPOINT_META_FILE, readCheckpointMeta, type CheckpointMeta} from '../checkpoint/checkpointer.js'
import {downloadCheckpoint} from '../checkpoint/hub.js'
import {exchangesResults} from '../config/index.js'
import type {HubRepo} from '../config/types.js'
import {isCheckpointP2P, modelMismatch, type CheckpointHash, type ClientId} from '../coordinator/index.js'
import {errorMessage} from '../errors.js'
import type {ModelSnapshot} from '../p2p/index.js'
import {loadModel} from '../train/load-model.js'
import {snapshotOf, type ClientContext} from './context.js'

/** After a failed attempt, how long the client waits before it tries to load the model again (the state may change sooner). */
const RETRY_MS = 2000

/**
 * Model loading (decide.ts's `load_model`): the run's starting model (the plan's, or the coordinator's Hub
 * checkpoint, downloaded and hash-checked), or our peers' model at the epoch's step over P2P, with the last Hub
 * checkpoint as the fallback when nobody serves it. Whatever the source, the model is loaded only if it is the run's
 * current model, as the coordinator recorded it at the last epoch's end (rules.ts modelMismatch): a client never
 * trains from an older one. When no source has it, the client loads nothing, and the epoch's Warmup ends without it.
 */
export class ModelLoading {
  private parameters: number | undefined
  /** The last failed attempt: the next waits RETRY_MS, unless the run's state named another source since. */
  private failed: {step: number; at: number; state: unknown} | undefined

  constructor(private readonly ctx: ClientContext) {}

  async load(step: number, from: 'checkpoint' | ClientId[]): Promise<boolean> {
    const last = this.failed
    const source = this.sourceKey()
    if (last && last.step === step && last.state === source && this.ctx.clock.now() - last.at < RETRY_MS) return false
    const loaded = await this.tryLoad(step, from)
    this.failed = loaded ? undefined : {step, at: this.ctx.clock.now(), state: source}
    return loaded
  }

  /** What the coordinator's state says about where the model is: a change is worth an attempt at once. */
  private sourceKey(): string {
    const s = this.ctx.state
    return JSON.stringify([s.model.LLM.checkpoint, s.current_model, s.checkpoint_hash, s.epoch.start_time])
  }

  private async tryLoad(step: number, from: 'checkpoint' | ClientId[]): Promise<boolean> {
    const ctx = this.ctx
    if (from === 'checkpoint') {
      const checkpoint = this.ctx.state.model.LLM.checkpoint
      const repo = typeof checkpoint === 'object' && 'Hub' in checkpoint ? checkpoint.Hub : undefined
      const dir = repo ? await this.downloadHubRepo(step, repo) : undefined
      if (dir === null) return false
      if (dir === undefined) {
        await this.initModel()
        const exported = await ctx.worker.exportParams()
        if (!(await this.isPlanModelCurrent(step, exported.paramHash))) return false
        ctx.snapshot = snapshotOf(step, exported)
        this.setLoaded(step, exported.paramHash, 'checkpoint')
        return true
      }
      const hash = await this.loadCheckpointDir(dir, step, false, repo!)
      if (hash === undefined) return false
      this.setLoaded(step, hash, 'checkpoint')
      return true
    }
    let snapshot: ModelSnapshot
    // The run's current model: only a manifest of it counts (a peer serving another cannot outvote it).
    const paramHash = ctx.state.current_model?.param_hash ?? undefined
    try {
      // Every peer is asked for its signed manifest; only those whose model is at `step` count.
      snapshot = await ctx.p2p.fetchModel(from, paramHash === undefined ? {step} : {step, paramHash})
    } catch (error) {
      ctx.log({event: 'model_fetch_failed', step, message: errorMessage(error)})
      return this.hubFallback(step)
    }
    if (snapshot.step !== step) {
      ctx.log({event: 'model_fetch_failed', step, message: `a peer served the model at step ${snapshot.step}, the epoch starts after step ${step}`})
      return false
    }
    await this.initModel() // the model's structure, and a fresh optimizer: any momentum we had belongs to rounds we missed
    const hash = await ctx.worker.importParams(snapshot.frames.map((f) => ({name: f.name, dtype: f.dtype as 'float32', shape: f.shape, data: f.data})))
    if (hash !== snapshot.paramHash) {
      ctx.log({event: 'model_fetch_failed', step, message: `imported parameters hash to ${hash}, the peer announced ${snapshot.paramHash}`})
      return false
    }
    const mismatch = modelMismatch(ctx.state, hash, snapshot.step)
    if (mismatch !== undefined) {
      ctx.log({event: 'model_fetch_failed', step, message: `the peers' model is not the run's current model: ${mismatch}`})
      return false
    }
    ctx.snapshot = snapshot
    this.setLoaded(step, hash, 'peers')
    return true
  }

  /**
   * The model directory of a Hub checkpoint (downloaded into the Hub cache: resumable, hash-checked), or undefined
   * when the repository is a local directory (the plan's model is used), or null when the download failed (retried
   * on the next pass).
   */
  private async downloadHubRepo(step: number, repo: HubRepo): Promise<string | undefined | null> {
    const {repo_id, revision} = repo
    const hub = this.ctx.opts.hub
    if (!repo_id || existsSync(join(resolve(repo_id), 'config.json'))) return undefined // a local directory: the plan resolved it
    try {
      const got = await downloadCheckpoint({repo: repo_id, revision: revision ?? undefined, hubUrl: hub?.url, token: hub?.token, cacheDir: hub?.cacheDir})
      this.ctx.log({event: 'checkpoint_downloaded', step, repo_id, revision: got.commit, bytes: got.bytes, downloaded_bytes: got.downloaded_bytes})
      return got.dir
    } catch (error) {
      this.ctx.log({event: 'checkpoint_download_failed', step, repo_id, message: errorMessage(error)})
      return null
    }
  }

  /**
   * The parameter hash the coordinator recorded with `repo` (the hash the epoch's witnesses agreed on when it took
   * the checkpoint), or undefined when it recorded none for that repository and revision.
   */
  private recordedHash(repo: HubRepo): CheckpointHash | undefined {
    const r = this.ctx.state.checkpoint_hash
    if (!r || r.repo.repo_id !== repo.repo_id || (r.repo.revision ?? null) !== (repo.revision ?? null)) return undefined
    return r
  }

  /**
   * Loads a Hub checkpoint's directory into the worker and checks it: its parameters must hash to the hash the
   * coordinator recorded with the checkpoint (what the epoch's witnesses agreed on: the repository's owner cannot
   * change it), and to its psyche-checkpoint.json's param_hash; with `exactStep` it must be the model at that step
   * (a P2P epoch's fallback: anything else would fork us from our peers). Returns the parameter hash, or undefined
   * (logged).
   */
  private async loadCheckpointDir(dir: string, step: number, exactStep: boolean, repo: HubRepo): Promise<string | undefined> {
    const ctx = this.ctx
    const recorded = this.recordedHash(repo)
    let meta: CheckpointMeta | undefined
    try {
      meta = await readCheckpointMeta(dir)
    } catch (error) {
      ctx.log({event: 'checkpoint_rejected', step, message: errorMessage(error)})
      return undefined
    }
    const checkpointStep = recorded?.step ?? meta?.step
    // With the run's model's hash recorded, the hash decides (below): a round nobody trained moves the step, not the model.
    if (exactStep && checkpointStep !== step && !ctx.state.current_model?.param_hash) {
      const why = checkpointStep !== undefined ? `it is the model at step ${checkpointStep}` : `it has no ${CHECKPOINT_META_FILE} naming its step`
      ctx.log({event: 'checkpoint_rejected', step, message: `the Hub checkpoint cannot stand in for our peers' model at step ${step}: ${why}`})
      return undefined
    }
    await this.initModel(dir)
    const exported = await ctx.worker.exportParams()
    const paramHash = exported.paramHash
    if (recorded && recorded.param_hash !== paramHash) {
      const revision = repo.revision ?? null
      ctx.log({
        event: 'checkpoint_rejected',
        step,
        repo_id: repo.repo_id,
        revision,
        expected: recorded.param_hash,
        actual: paramHash,
        message: `${repo.repo_id}@${revision ?? 'main'}: its parameters hash to ${paramHash}, but the coordinator recorded ${recorded.param_hash} (agreed by the witnesses of step ${recorded.step}) with this checkpoint`,
      })
      return undefined
    }
    if (meta?.param_hash !== undefined && meta.param_hash !== paramHash) {
      ctx.log({event: 'checkpoint_rejected', step, message: `its parameters hash to ${paramHash}, its ${CHECKPOINT_META_FILE} says ${meta.param_hash}`})
      return undefined
    }
    const mismatch = modelMismatch(ctx.state, paramHash, checkpointStep)
    if (mismatch !== undefined) {
      const revision = repo.revision ?? null
      ctx.log({event: 'checkpoint_rejected', step, repo_id: repo.repo_id, revision, message: `${repo.repo_id}@${revision ?? 'main'} is not the run's current model: ${mismatch}`})
      return undefined
    }
    // A whole run restarted from its last checkpoint: the coordinator may have closed rounds nobody trained since.
    if (meta && meta.step !== step) ctx.log({event: 'checkpoint_step', step, checkpoint_step: meta.step})
    ctx.snapshot = snapshotOf(step, exported)
    return paramHash
  }

  /**
   * Whether the plan's model (a config's Local or Dummy checkpoint), just loaded with `paramHash`, may stand for the run's
   * model: at step 0 (no epoch recorded one), or when the psyche-checkpoint.json in its directory (a --checkpoint-dir
   * save) records the run's current model and these very parameters. Logged when not.
   */
  private async isPlanModelCurrent(step: number, paramHash: string): Promise<boolean> {
    const ctx = this.ctx
    const model = ctx.state.current_model
    if (model === null) return true
    const source = ctx.opts.plan.model
    const dir = source.kind === 'dir' ? source.dir : dirname(source.configPath)
    let meta: CheckpointMeta | undefined
    try {
      meta = await readCheckpointMeta(dir)
    } catch (error) {
      ctx.log({event: 'checkpoint_rejected', step, message: `${dir}: ${errorMessage(error)}`})
      return false
    }
    const why =
      meta === undefined
        ? `it is the run's starting model (no ${CHECKPOINT_META_FILE} records a step and hash)`
        : meta.param_hash !== paramHash
          ? `its parameters hash to ${paramHash}, its ${CHECKPOINT_META_FILE} says ${meta.param_hash ?? '(none)'}`
          : modelMismatch(ctx.state, paramHash, meta.step)
    if (why === undefined) return true
    ctx.log({
      event: 'checkpoint_rejected',
      step,
      message: `${dir} cannot stand for the run's model at step ${model.step}: ${why}; a config's Local checkpoint counts only at step 0, or when it records the run's step and hash`,
    })
    return false
  }

  private async initModel(fromDir?: string): Promise<void> {
    const ctx = this.ctx
    const {microBatch} = ctx.opts.plan
    // a model from a peer or a checkpoint must be of the run's architecture too (the worker refuses another model_type)
    const model = fromDir ? ({kind: 'dir', dir: fromDir, architecture: ctx.opts.plan.model.architecture} as const) : ctx.opts.plan.model
    // The run's state is authoritative for what every replica must agree on: the LR schedule, and the optimizer
    // when the run names one that exchanges results (DisTrO, SparseLoCo: the network path needs one; a run that
    // names a single-node optimizer trains with the plan's).
    const llm = ctx.state.model.LLM
    const optimizer = exchangesResults(llm.optimizer) ? llm.optimizer : ctx.opts.plan.optimizer
    const lrSchedule = llm.lr_schedule
    const info = await loadModel(ctx.worker, model, ctx.opts.seed, ctx.opts.plan.seqLen)
    this.parameters = info.parameters
    const {resultFormat} = await ctx.worker.configure({
      optimizer: optimizer as Record<string, unknown>,
      lr_schedule: lrSchedule as Record<string, unknown>,
      micro_batch: microBatch,
      delay_correction: true,
    })
    ctx.resultFormat = resultFormat
  }

  /**
   * Nobody served the model in a P2P epoch: load the last Hub checkpoint the coordinator took (the P2P checkpoint
   * names its repository and revision), if it is the model at this step.
   */
  private async hubFallback(step: number): Promise<boolean> {
    const checkpoint = this.ctx.state.model.LLM.checkpoint
    if (!isCheckpointP2P(checkpoint) || !checkpoint.P2P.repo_id) return false
    const dir = await this.downloadHubRepo(step, checkpoint.P2P)
    if (!dir) return false
    const hash = await this.loadCheckpointDir(dir, step, true, checkpoint.P2P)
    if (hash === undefined) return false
    this.setLoaded(step, hash, 'hub_fallback')
    return true
  }

  private setLoaded(step: number, hash: string, source: 'checkpoint' | 'peers' | 'hub_fallback'): void {
    const ctx = this.ctx
    ctx.modelStep = step
    ctx.trainedStep = Math.max(ctx.trainedStep, step)
    ctx.lastHash = hash
    ctx.log({event: 'model_loaded', step, source, param_hash: hash, parameters: this.parameters})
    ctx.flushMessages()
  }
}
