import {join} from 'node:path'
import {Flags} from '@oclif/core'
import {PsycheCommand} from '../core/cli/base-command.js'
import {snakeKeys, type SnakeKeys} from '../core/cli/json.js'
import {transferLabel} from '../core/checkpoint/hub.js'
import {Progress, formatDuration, formatRate} from '../core/cli/progress.js'
import {resolveTrainPlan, type Precision} from '../core/train/plan.js'
import {runSingleNode, type TrainSummary} from '../core/train/single-node.js'

export default class Train extends PsycheCommand {
  static summary = 'Train a model on one node (the tool a model author uses before a distributed run)'
  static description = `Trains with the run config's model, data, optimizer and LR schedule, or flags that override them.
With no --config it trains the tiny demo model (templates/tiny-demo) on the bundled State of the Union corpus.
Per-step metrics go to a JSONL file; --json prints one summary object:
{steps, tokens, wall_seconds, tokens_per_second, first_loss, last_loss, param_hash, ...}.`

  static examples = [
    '<%= config.bin %> train --steps 30 --json',
    '<%= config.bin %> train --config run/state.toml --model run/model --save out/model',
    '<%= config.bin %> train --template tiny-demo --optimizer adamw --lr 3e-3 --threads 2',
  ]

  static flags = {
    config: Flags.string({char: 'c', summary: 'run config (Psyche state.toml or config.toml) with [model.LLM]'}),
    template: Flags.string({summary: 'use templates/NAME/state.toml as the run config (default tiny-demo when no --config)'}),
    model: Flags.string({summary: "model directory in Hugging Face layout (config.json [+ model.safetensors]); overrides the config's checkpoint"}),
    data: Flags.string({summary: "directory of token files (.bin/.ds + optional manifest.json); overrides the config's data_location"}),
    'val-data': Flags.string({summary: 'directory of held-out token files for validation loss'}),
    steps: Flags.integer({summary: "optimizer steps (SparseLoCo: rounds of H inner steps) to run (default: the LR schedule's total_steps, in rounds)", min: 1}),
    'micro-batch': Flags.integer({summary: 'sequences per forward/backward (gradient accumulation splits the total batch)', min: 1}),
    'total-batch': Flags.integer({summary: "sequences per optimizer step (default: config.global_batch_size_start, times SparseLoCo's inner steps)", min: 1}),
    'seq-len': Flags.integer({summary: 'tokens per sequence (default: model.LLM.max_seq_len)', min: 1}),
    optimizer: Flags.string({summary: "optimizer (default: the config's)", options: ['adamw', 'distro', 'sparseloco']}),
    lr: Flags.string({summary: 'base learning rate; the schedule keeps its shape'}),
    seed: Flags.integer({summary: 'seed of model initialisation and data order', default: 0}),
    threads: Flags.integer({summary: "torch threads of the worker (default: torch's choice)", min: 1}),
    device: Flags.string({summary: 'auto | cpu | cuda | cuda:N', default: 'auto'}),
    devices: Flags.string({summary: 'several devices in this client, one data-parallel rank each (torch.distributed): cuda:0,cuda:1'}),
    'data-parallel': Flags.integer({summary: 'N data-parallel ranks on --device (cpu: N processes with gloo; cuda: GPUs 0..N-1 with NCCL)', min: 1}),
    shard: Flags.integer({
      summary: 'hold the model in N shards, one per rank (FSDP2; cpu: N processes with gloo; cuda: GPUs 0..N-1 with NCCL), for a model larger than one device',
      min: 1,
    }),
    precision: Flags.string({
      summary: 'forward-pass precision: bf16 = torch autocast to bfloat16 with fp32 master weights; auto = bf16 on CUDA, fp32 on CPU',
      options: ['auto', 'fp32', 'bf16'],
      default: 'auto',
    }),
    'eval-every': Flags.integer({summary: 'validation loss every N steps (0: at start and end only)', default: 0, min: 0}),
    'eval-batches': Flags.integer({summary: 'validation sequences per evaluation', default: 8, min: 1}),
    'simulate-peers': Flags.integer({summary: 'DisTrO or SparseLoCo: train N simulated clients in one process, each on its own batches', min: 1}),
    'simulate-delay': Flags.boolean({
      summary: "SparseLoCo: the simulated clients apply a round's results one round late, as clients on a network do (what the delay costs in loss)",
    }),
    metrics: Flags.string({summary: 'per-step metrics JSONL file (default runs/<run>-<time>/metrics.jsonl)'}),
    save: Flags.string({summary: 'write the trained model (Hugging Face layout) to this directory'}),
  }

  async run(): Promise<SnakeKeys<TrainSummary>> {
    const {flags} = await this.parse(Train)
    const progress = Progress.for({json: this.jsonEnabled()})
    let lr: number | undefined
    if (flags.lr !== undefined) {
      lr = Number(flags.lr)
      if (!Number.isFinite(lr) || lr <= 0) this.error(`--lr ${flags.lr}: expected a positive number`, {exit: 2})
    }
    const plan = await resolveTrainPlan({
      config: flags.config,
      template: flags.template,
      model: flags.model,
      data: flags.data,
      valData: flags['val-data'],
      steps: flags.steps,
      microBatch: flags['micro-batch'],
      totalBatch: flags['total-batch'],
      seqLen: flags['seq-len'],
      optimizer: flags.optimizer as 'adamw' | 'distro' | 'sparseloco' | undefined,
      lr,
      seed: flags.seed,
      threads: flags.threads,
      device: flags.device,
      devices: flags.devices,
      dataParallel: flags['data-parallel'],
      shard: flags.shard,
      precision: flags.precision as Precision,
      evalEvery: flags['eval-every'],
      evalBatches: flags['eval-batches'],
      simulatePeers: flags['simulate-peers'],
      simulateDelay: flags['simulate-delay'],
      hub: {onProgress: (p) => progress.update(`from the Hub: ${transferLabel(p)}`, p.phase === 'done')},
    })
    const stamp = new Date().toISOString().replace(/[:.]/g, '-')
    const metricsPath = flags.metrics ?? join('runs', `${plan.runId}-${stamp}`, 'metrics.jsonl')
    try {
      const summary = await runSingleNode(plan, {
        metricsPath,
        savePath: flags.save,
        events: {
          onStatus: (m) => progress.status(m),
          onStep: (m, p) => {
            const eta = (m.elapsed_seconds / (m.step + 1)) * (p.steps - m.step - 1)
            progress.update(
              `step ${m.step + 1}/${p.steps}  loss ${m.loss.toFixed(3)}  lr ${m.lr.toExponential(2)}  ${formatRate(m.tokens_per_second)} tok/s  ETA ${formatDuration(eta)}`,
              m.step + 1 === p.steps,
            )
            if (m.val_loss !== undefined) progress.note(`step ${m.step + 1}: validation loss ${m.val_loss.toFixed(3)}`)
          },
        },
      })
      const val = summary.valLoss !== undefined ? `; validation ${summary.firstValLoss!.toFixed(3)} → ${summary.valLoss.toFixed(3)}` : ''
      progress.done(
        `trained ${summary.steps} steps, ${summary.tokens.toLocaleString('en-US')} tokens in ${formatDuration(summary.wallSeconds)} (${formatRate(summary.tokensPerSecond)} tok/s): loss ${summary.firstLoss.toFixed(3)} → ${summary.lastLoss.toFixed(3)}${val}`,
      )
      if (!this.jsonEnabled()) {
        this.log(`metrics: ${summary.metricsPath}`)
        if (summary.savedTo) this.log(`model: ${summary.savedTo}`)
        this.log(`parameter hash: ${summary.paramHash}`)
      }
      return snakeKeys(summary)
    } catch (error) {
      progress.fail('training failed')
      throw error
    }
  }
}
