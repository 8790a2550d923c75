import type {LLMArchitecture} from '../config/index.js'
import {PsycheError} from '../errors.js'
import type {ModelInfo} from '../worker/model-worker.js'
import type {ModelSource} from './plan.js'

/** The worker operations that create a model (ModelWorker, and the client's worker component). */
interface ModelLoader {
  load(modelDir: string, seed?: number, architecture?: LLMArchitecture): Promise<ModelInfo>
  initFromConfig(config: Record<string, unknown>, seed: number, architecture?: LLMArchitecture): Promise<ModelInfo>
}

/**
 * Loads the model a plan names into the worker (weights from a directory, or initialised from its config with
 * `seed`), as the architecture the source names, and checks that sequences of `seqLen` tokens fit it.
 */
export async function loadModel(worker: ModelLoader, model: ModelSource, seed: number, seqLen: number): Promise<ModelInfo> {
  const info = model.kind === 'dir' ? await worker.load(model.dir, seed, model.architecture) : await worker.initFromConfig(model.config, seed, model.architecture)
  if (seqLen > info.max_position_embeddings) {
    throw new PsycheError(`max_seq_len ${seqLen} exceeds the model's max_position_embeddings ${info.max_position_embeddings}`)
  }
  return info
}
