import {CoordinatorConnection, type BackendConnector} from '../backend/index.js'
import {systemClock, type ClientComponents} from '../client/components.js'
import {openDataProvider, type DataProvider} from '../data/index.js'
import type {EventLine} from '../events.js'
import {P2PNode} from '../p2p/index.js'
import type {Identity} from '../protocol/identity.js'
import type {TrainPlan} from '../train/plan.js'
import {shuffleSeedFor} from '../train/single-node.js'
import {ModelWorker} from '../worker/model-worker.js'

// The composition root: where a client's real components are built and wired (commands only parse flags and call
// this; tests that run the real client, such as test/adversarial, build it here too).

type ProviderLocation = Parameters<typeof openDataProvider>[0]
type Log = (event: EventLine) => void

/**
 * The real components of a client: a PyTorch worker, the run's data, a libp2p node, and the coordinator: the TCP
 * server (a new connection per join), or `backend` (the Solana program). Whatever started is stopped again if a
 * later part fails.
 */
export async function startComponents(o: {
  serverAddr: string
  /** Another backend than the TCP server at serverAddr (a run on Solana). */
  backend?: BackendConnector
  runId: string
  identity: Identity
  plan: TrainPlan
  seed: number
  log: Log
  /** libp2p listen and announce addresses; quic false: TCP only (join --no-quic). */
  p2p: {listen: string[]; announce?: string[]; quic?: boolean}
  /** Each new coordinator connection (the first, and each rejoin's). */
  onConnected?: (connection: CoordinatorConnection) => void
}): Promise<ClientComponents> {
  const {serverAddr, runId, identity, plan, log} = o
  const startWorker = () => ModelWorker.start({threads: plan.threads, device: plan.device, dataParallel: plan.dataParallel, precision: plan.precision, label: 'client'})
  const worker = await startWorker()
  let p2p: P2PNode | undefined
  let data: DataProvider | undefined
  let evalData: DataProvider | undefined
  try {
    data = await openDataProvider(plan.data as ProviderLocation, {seqLen: plan.seqLen, baseDir: plan.dataBaseDir, shuffleSeed: shuffleSeedFor(o.seed), wrap: true})
    // The held-out split, in the run's shuffled order (the same samples on every client: client/eval.ts).
    if (plan.validation && plan.evalEvery > 0)
      evalData = await openDataProvider(plan.validation as ProviderLocation, {seqLen: plan.seqLen, baseDir: plan.dataBaseDir, shuffleSeed: shuffleSeedFor(o.seed)})
    p2p = await P2PNode.start({identity, runId, listen: o.p2p.listen, announce: o.p2p.announce, quic: o.p2p.quic, log: (e) => log({...e, source: 'p2p'})})
  } catch (error) {
    await p2p?.stop()
    await data?.close()
    await evalData?.close()
    await worker.shutdown()
    throw error
  }
  const backend: BackendConnector = o.backend ?? {
    description: `coordinator ${serverAddr}`,
    connect: async ({p2pAddrs}) => {
      const connection = await CoordinatorConnection.connect({
        addr: serverAddr,
        runId,
        identity,
        p2pAddrs,
        join: true,
        log: (e) => log({...e, source: 'coordinator'}),
      })
      o.onConnected?.(connection)
      return connection
    },
  }
  return {backend, p2p, worker, data, evalData, clock: systemClock, restartWorker: startWorker}
}
