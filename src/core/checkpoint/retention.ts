import {readdir, rm} from 'node:fs/promises'
import {join, resolve} from 'node:path'
import {errorMessage} from '../errors.js'
import type {EventLog} from '../events.js'
import {readCheckpointMeta} from './checkpointer.js'

/** `join --keep-checkpoints`'s default: the last three epochs' checkpoints, as Psyche's client keeps (its keep_steps). */
export const DEFAULT_KEEP_CHECKPOINTS = 3

/** The directory of step `step`'s checkpoint in a `--checkpoint-dir`. */
export function checkpointStepDir(checkpointDir: string, step: number): string {
  return join(resolve(checkpointDir), `step-${step}`)
}

const STEP_DIR = /^step-(\d{1,15})$/

/**
 * After a successful save in `checkpointDir`, removes the run's older checkpoints beyond the newest `keep`: the
 * directories named `step-S` whose psyche-checkpoint.json records this run and step S (anything else in the directory
 * is left alone, another run's checkpoints included). The save just made always counts among the kept ones, and a
 * checkpoint in `protect` (the one being uploaded, the run's current model, the one the client loaded) is never
 * removed. Returns the steps removed; a removal that fails is logged and the run goes on.
 */
export async function pruneCheckpoints(o: {
  checkpointDir: string
  runId: string
  keep: number
  /** The step just saved. */
  saved: number
  /** Steps that must stay whatever their age. */
  protect: Iterable<number>
  /** Directories that must stay (the model the client loaded from). */
  protectDirs?: Iterable<string>
  log: EventLog
}): Promise<number[]> {
  const root = resolve(o.checkpointDir)
  const protectedSteps = new Set(o.protect)
  const protectedDirs = new Set([...(o.protectDirs ?? [])].map((d) => resolve(d)))
  let names: string[]
  try {
    names = await readdir(root)
  } catch (error) {
    o.log({event: 'checkpoint_prune_failed', dir: root, message: errorMessage(error)})
    return []
  }
  const ours: number[] = []
  for (const name of names) {
    const m = STEP_DIR.exec(name)
    if (!m) continue
    const step = Number(m[1])
    const meta = await readCheckpointMeta(join(root, name)).catch(() => undefined)
    if (meta?.run_id === o.runId && meta.step === step) ours.push(step)
  }
  // The save just made first, then the newest by step.
  const order = [o.saved, ...ours.filter((s) => s !== o.saved).sort((a, b) => b - a)]
  const removed: number[] = []
  for (const step of order.slice(Math.max(o.keep, 1))) {
    const dir = join(root, `step-${step}`)
    if (protectedSteps.has(step) || protectedDirs.has(dir)) continue
    try {
      await rm(dir, {recursive: true, force: true})
      removed.push(step)
      o.log({event: 'checkpoint_pruned', step, dir})
    } catch (error) {
      o.log({event: 'checkpoint_prune_failed', dir, message: errorMessage(error)})
    }
  }
  return removed
}
