/**
 * The worker's operations, as python/psyche_worker/ops.json lists them: the one table both sides read. The worker
 * serves each with its op_<name> method and refuses to start without one; WorkerClient.call takes only these names;
 * test/worker/ops.test.ts fails when this list and the table differ.
 */
export const WORKER_OPS = [
  'hello',
  'init_model',
  'configure',
  'train_step',
  'train_round',
  'begin_round',
  'discard_round',
  'finish_round',
  'apply_results',
  'score_results',
  'evaluate',
  'param_hash',
  'export_params',
  'import_params',
  'save_model',
  'shutdown',
] as const

export type WorkerOp = (typeof WORKER_OPS)[number]
