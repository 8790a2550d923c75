import {resolve} from 'node:path'
import {Flags, type Interfaces} from '@oclif/core'
import {checkRepoId, checkToken, transferLabel} from '../checkpoint/hub.js'
import {DEFAULT_KEEP_CHECKPOINTS} from '../checkpoint/retention.js'
import {DEFAULT_MAX_ROUNDS_WITHOUT_EXCHANGE} from '../client/runner.js'
import type {ClientSetup} from '../compose/client.js'
import {demoCorpusDir, ensureDemoCorpus} from '../corpus.js'
import {listenAddrsForPort, parseMultiaddrs} from '../p2p/addresses.js'
import {DEFAULT_MODEL_SERVE_LIMITS} from '../p2p/index.js'
import {DEFAULT_MAX_PEER_CONNECTIONS} from '../p2p/overlay.js'
import {DEFAULT_SERVING_LIMITS} from '../p2p/result-exchange.js'
import {BLOCK_BYTES, MAX_PIECE_BYTES} from '../primitives/pieces.js'
import type {Progress} from './progress.js'
import {parseAddress} from './solana-flags.js'
import {webrtcFlags, webrtcOptionsFromFlags} from './webrtc-flags.js'
import {resolveTrainPlan, type Precision, type TrainPlan} from '../train/plan.js'

/** `psyche join`'s flags. */
export const joinFlags = {
  'server-addr': Flags.string({summary: 'the coordinator server, host:port', exactlyOne: ['server-addr', 'rpc']}),
  rpc: Flags.string({summary: 'join a run on Solana: JSON-RPC URL of the cluster (several, comma-separated: tried in order)', exactlyOne: ['server-addr', 'rpc']}),
  'priority-fee': Flags.integer({summary: 'Solana: priority fee in micro-lamports per compute unit (default 0)', min: 0, dependsOn: ['rpc']}),
  'ws-rpc': Flags.string({summary: "Solana: the cluster's websocket URL (accountSubscribe); default: poll --rpc", dependsOn: ['rpc']}),
  'program-id': Flags.string({summary: 'Solana: address of the coordinator program', env: 'PSYCHE_COORDINATOR_PROGRAM'}),
  keypair: Flags.string({summary: 'Solana: keypair file (JSON array of 64 bytes) of the client (default ~/.config/solana/id.json)', exclusive: ['identity']}),
  authorization: Flags.string({summary: "Solana, permissioned runs: the authorization that admits this key (default: the join authority's grant to it)"}),
  'poll-ms': Flags.integer({summary: 'Solana: how often the coordinator account is read without --ws-rpc (ms)', default: 500, min: 50}),
  'run-id': Flags.string({summary: "the run to join (must match the server's)", required: true}),
  identity: Flags.string({summary: 'identity file (psyche-identity JSON); default: a new random identity for this process (with --rpc: --keypair)'}),
  config: Flags.string({char: 'c', summary: 'the run config (state.toml) whose model directory and data this client uses'}),
  template: Flags.string({summary: 'use templates/NAME/state.toml for model and data (default tiny-demo when no --config)'}),
  model: Flags.string({summary: "model directory (config.json [+ model.safetensors]); overrides the config's checkpoint"}),
  data: Flags.string({summary: "directory of token files; overrides the config's data_location"}),
  'micro-batch': Flags.integer({summary: 'sequences per forward/backward', min: 1}),
  threads: Flags.integer({summary: 'torch threads of the worker', min: 1}),
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
  'metrics-port': Flags.integer({summary: 'serve Prometheus metrics at http://HOST:PORT/metrics (0: any free port)', min: 0, max: 65535}),
  'metrics-host': Flags.string({summary: 'address the metrics endpoint listens on', default: '127.0.0.1'}),
  'p2p-listen': Flags.string({summary: 'libp2p listen multiaddr(s) (default /ip4/0.0.0.0/tcp/0: every interface)', multiple: true, exclusive: ['p2p-port']}),
  'p2p-port': Flags.integer({summary: 'libp2p TCP port on every interface (default: any free port)', min: 0, max: 65535}),
  quic: Flags.boolean({
    summary: 'QUIC (UDP) beside TCP: listen and announce both, dial QUIC first; --no-quic for TCP only where UDP is blocked',
    default: true,
    allowNo: true,
  }),
  'p2p-max-connections': Flags.integer({
    summary: `most libp2p connections this client holds (default ${DEFAULT_MAX_PEER_CONNECTIONS}); past half of it, not every member is dialled (about 2·log2 N neighbours; transfers open and close connections on demand)`,
    default: DEFAULT_MAX_PEER_CONNECTIONS,
    min: 4,
  }),
  'max-serves-per-result': Flags.integer({
    summary: 'our own result is served to at most this many peers; the others fetch it from them (swarmed downloads)',
    default: DEFAULT_SERVING_LIMITS.maxServesPerResult,
    min: 1,
  }),
  'swarm-min-bytes': Flags.integer({
    summary: 'results smaller than this are served to every peer that asks (no --max-serves-per-result, no have messages in a full mesh)',
    default: DEFAULT_SERVING_LIMITS.swarmMinBytes,
    min: 0,
  }),
  'piece-bytes': Flags.integer({
    summary: `results of --swarm-min-bytes or more are fetched in pieces of this many bytes from several holders at once, each checked on arrival (a multiple of ${BLOCK_BYTES}, at most ${MAX_PIECE_BYTES})`,
    default: DEFAULT_SERVING_LIMITS.pieceBytes,
    min: BLOCK_BYTES,
    max: MAX_PIECE_BYTES,
  }),
  'max-haves-per-peer': Flags.integer({
    summary: 'results one peer may tell us it holds that we remember (have messages), until their round is dropped; past it they are ignored',
    default: DEFAULT_SERVING_LIMITS.maxHavesPerPeer,
    min: 1,
  }),
  'max-serves-per-peer': Flags.integer({summary: 'result transfers served to one peer at once', default: DEFAULT_SERVING_LIMITS.maxServesPerPeer, min: 1}),
  'max-concurrent-serves': Flags.integer({summary: 'result transfers served at once, to all peers', default: DEFAULT_SERVING_LIMITS.maxConcurrentServes, min: 1}),
  'p2p-announce': Flags.string({summary: 'tell peers exactly these multiaddr(s): a public address or a forwarded port', multiple: true}),
  ...webrtcFlags,
  'max-model-uploads': Flags.integer({
    summary: 'model pieces this client uploads to joining clients at once, all joiners together (more wait, or take them from another member)',
    default: DEFAULT_MODEL_SERVE_LIMITS.maxUploads,
    min: 1,
  }),
  'max-model-uploads-per-peer': Flags.integer({
    summary: 'model pieces this client uploads to one joining client at once',
    default: DEFAULT_MODEL_SERVE_LIMITS.maxUploadsPerPeer,
    min: 1,
  }),
  'max-model-upload-mbit': Flags.integer({
    summary: "Mbit/s of model uploads to joining clients, all together (0: no cap); below your uplink, it leaves the round's own exchange room",
    default: 0,
    min: 0,
  }),
  relay: Flags.string({summary: 'also use this circuit relay (multiaddr ending in /p2p/<id>, from psyche relay): reserve a slot there when not reachable', multiple: true}),
  'checkpoint-dir': Flags.string({
    summary: 'save the model after each epoch in DIR/step-S (Hugging Face layout with psyche-checkpoint.json); a checkpointer (--hub-repo) uploads that save',
  }),
  'keep-checkpoints': Flags.integer({
    summary: `keep the last N epochs' checkpoints in --checkpoint-dir, removing older ones after each save (never the one being uploaded, nor the run's current model) [default: ${DEFAULT_KEEP_CHECKPOINTS}]`,
    min: 1,
    dependsOn: ['checkpoint-dir'],
  }),
  'eval-every': Flags.integer({
    summary: 'validation loss on held-out samples after every N-th round and the last (0: never); the same on every replica',
    default: 10,
    min: 0,
  }),
  'eval-batches': Flags.integer({summary: 'held-out samples (sequences) per validation', default: 8, min: 1}),
  'eval-data': Flags.string({
    summary:
      "a held-out split (directory of token files) for the validation loss; default: the demo corpus's validation split, else the tail of the training data when the run never reaches it",
  }),
  'max-rounds-without-exchange': Flags.integer({
    summary:
      'leave the run (exit 1) after this many rounds in a row in which other clients trained and none of their results reached this client (it cannot reach its peers and would train alone); 0: never leave, only warn',
    default: DEFAULT_MAX_ROUNDS_WITHOUT_EXCHANGE,
    min: 0,
  }),
  'worker-restarts': Flags.integer({
    summary: 'start a new worker this many times when the worker dies (it rejoins at the next epoch with the model from a peer); 0: a dead worker ends the client',
    default: 0,
    min: 0,
  }),
  'hub-repo': Flags.string({summary: 'be a checkpointer: upload the model to this Hub repository (NS/NAME) after each epoch'}),
  'hub-revision': Flags.string({summary: 'branch the checkpoints are committed to', default: 'main'}),
  'hub-url': Flags.string({summary: 'Hub endpoint for checkpoints', env: 'HF_ENDPOINT'}),
  'hub-token': Flags.string({summary: 'Hub token (starts with hf_) for uploads and private repositories', env: 'HF_TOKEN'}),
}

type JoinFlags = Interfaces.InferredFlags<typeof joinFlags>

/**
 * The plan join's flags give (model, data, worker settings; the LR schedule and optimizer come from the run), with the
 * demo corpus made when the plan trains on it; `progress` shows a Hub download and the corpus being made.
 */
export async function joinPlan(flags: JoinFlags, progress: Pick<Progress, 'status' | 'update'>): Promise<TrainPlan> {
  const plan = await resolveTrainPlan({
    config: flags.config,
    template: flags.template,
    model: flags.model,
    data: flags.data,
    microBatch: flags['micro-batch'],
    optimizer: 'distro',
    threads: flags.threads,
    device: flags.device,
    devices: flags.devices,
    dataParallel: flags['data-parallel'],
    shard: flags.shard,
    precision: flags.precision as Precision,
    valData: flags['eval-data'],
    evalEvery: flags['eval-every'],
    evalBatches: flags['eval-batches'],
    hub: {url: flags['hub-url'], token: flags['hub-token'], onProgress: (p) => progress.update(`from the Hub: ${transferLabel(p)}`, p.phase === 'done')},
  })
  const d = plan.data
  if (typeof d === 'object' && 'Local' in d && resolve(plan.dataBaseDir, d.Local).startsWith(demoCorpusDir)) await ensureDemoCorpus((m) => progress.status(m))
  return plan
}

/** The client join's flags describe, for the composition root (compose/client.ts). */
export function joinSetup(flags: JoinFlags, plan: TrainPlan, log: ClientSetup['log']): ClientSetup {
  const hub = {url: flags['hub-url'], token: flags['hub-token'], repo: flags['hub-repo'], revision: flags['hub-revision']}
  if (hub.repo) {
    checkRepoId(hub.repo, '--hub-repo')
    checkToken(hub.token, true)
  }
  const rpc = flags.rpc
  return {
    runId: flags['run-id'],
    coordinator: rpc
      ? {
          solana: {
            rpc,
            wsRpc: flags['ws-rpc'],
            pollMs: flags['poll-ms'],
            programId: parseAddress(flags['program-id'], 'program-id'),
            priorityFee: flags['priority-fee'],
            authorization: flags.authorization ? parseAddress(flags.authorization, 'authorization') : undefined,
            keypair: flags.keypair,
          },
        }
      : {server: flags['server-addr']!},
    identity: flags.identity,
    plan,
    p2p: {
      listen: flags['p2p-listen'] ? parseMultiaddrs(flags['p2p-listen'], '--p2p-listen') : listenAddrsForPort(flags['p2p-port']),
      announce: flags['p2p-announce'] ? parseMultiaddrs(flags['p2p-announce'], '--p2p-announce') : undefined,
      quic: flags.quic,
      maxPeerConnections: flags['p2p-max-connections'],
      serving: {
        maxServesPerResult: flags['max-serves-per-result'],
        maxServesPerPeer: flags['max-serves-per-peer'],
        maxConcurrentServes: flags['max-concurrent-serves'],
        swarmMinBytes: flags['swarm-min-bytes'],
        maxHavesPerPeer: flags['max-haves-per-peer'],
        pieceBytes: flags['piece-bytes'],
      },
      ...webrtcOptionsFromFlags(flags),
      modelServeLimits: {
        maxUploads: flags['max-model-uploads'],
        maxUploadsPerPeer: flags['max-model-uploads-per-peer'],
        maxUploadBytesPerSecond: (flags['max-model-upload-mbit'] * 1e6) / 8,
      },
    },
    client: {
      relays: flags.relay ? parseMultiaddrs(flags.relay, '--relay', {needPeer: true}) : undefined,
      hub,
      checkpointDir: flags['checkpoint-dir'],
      keepCheckpoints: flags['keep-checkpoints'],
      workerRestarts: flags['worker-restarts'],
      maxRoundsWithoutExchange: flags['max-rounds-without-exchange'],
    },
    log,
  }
}
