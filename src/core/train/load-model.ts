import {PsycheError} from '../errors.js'
import type {ModelInfo} from '../worker/model-worker.js'
import type {ModelSource} from './plan.js'

/** The worker operations that create a model (ModelWorker, and the client's worker component). */
interface ModelLoader {
  load(modelDir: string, seed?: number): Promise<ModelInfo>
  initFromConfig(config: Record<string, unknown>, seed: number): Promise<ModelInfo>
}

/**
 * Loads the model a plan names into the worker (weights from a directory, or initialised from its config with
 * `seed`), and checks that sequences of `seqLen` tokens fit it.
 */
export async function loadModel(worker: ModelLoader, model: ModelSource, seed: number, seqLen: number): Promise<ModelInfo> {
  const info = model.kind === 'dir' ? await worker.load(model.dir, seed) : await worker.initFromConfig(model.config, seed)
  if (seqLen > info.max_position_embeddings) {
    throw new PsycheError(`max_seq_len ${seqLen} exceeds the model's max_position_embeddings ${info.max_position_embeddings}`)
  }
  return info
}
