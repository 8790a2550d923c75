import type {ConfigIssue, CoordinatorConfig, RunConfigFile} from './types.js'

/**
 * Rounds an epoch needs to judge its members' health: a round, and the next, in which Psyche's health checks judge
 * the trainers of the one before. (This coordinator also drops the trainers a round's witnesses did not see when it
 * closes, so one round judges them here; a Psyche coordinator needs the second.)
 */
const ROUNDS_TO_JUDGE_HEALTH = 2

/**
 * The rounds an epoch fits when every round times out, as one member that never trains makes each: the epoch's clock
 * starts at its Warmup, each round then takes max_round_train_time + round_witness_time, and the epoch ends after the
 * first round that closes past epoch_time (at least one runs), or after rounds_per_epoch.
 */
function roundsPerTimedOutEpoch(c: CoordinatorConfig): number {
  const round = c.max_round_train_time + c.round_witness_time
  const byTime = Math.max(1, Math.ceil((c.epoch_time - c.warmup_time) / round))
  return c.rounds_per_epoch === undefined ? byTime : Math.min(byTime, c.rounds_per_epoch)
}

/**
 * Warnings about a config's timings (`server validate-config`): an epoch that fits fewer rounds than
 * ROUNDS_TO_JUDGE_HEALTH when its rounds time out. Psyche's health checks then never judge anyone, and one idle member
 * turns every epoch into a single timed-out round for ever under a Psyche coordinator (Solana's program included).
 */
export function timingWarnings(run: RunConfigFile): ConfigIssue[] {
  const c = run.config
  if (!c) return []
  const fits = roundsPerTimedOutEpoch(c)
  if (fits >= ROUNDS_TO_JUDGE_HEALTH) return []
  const round = c.max_round_train_time + c.round_witness_time
  const limitedByRounds = c.rounds_per_epoch !== undefined && c.rounds_per_epoch < ROUNDS_TO_JUDGE_HEALTH
  return [
    {
      file: run.path,
      path: limitedByRounds ? 'config.rounds_per_epoch' : 'config.epoch_time',
      value: String(limitedByRounds ? c.rounds_per_epoch : c.epoch_time),
      message:
        `an epoch whose rounds time out (one member that never trains makes every round do so) fits ${fits} round of ` +
        `${round} s (max_round_train_time + round_witness_time) after its ${c.warmup_time} s warmup, fewer than the ` +
        `${ROUNDS_TO_JUDGE_HEALTH} that health checks need (they judge a round in the next one): such a member is never ` +
        `judged by them. This coordinator still drops it when its round closes; Psyche's would not. ` +
        (limitedByRounds ? `Raise rounds_per_epoch to at least ${ROUNDS_TO_JUDGE_HEALTH}` : `Raise epoch_time above ${c.warmup_time + round} s`),
    },
  ]
}
