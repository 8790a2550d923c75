import type {MetricsRegister} from '@libp2p/gossipsub/metrics'
import type {Metrics, MultiaddrConnection, Stream} from '@libp2p/interface'

interface InOut {
  in: number
  out: number
}

/** What WireMetrics counted since the node started. */
export interface WireCounts {
  /** Every byte on the node's connections (TCP: after noise and yamux framing, the bytes on the socket). */
  connections: InOut
  /** Bytes on negotiated protocol streams, by protocol id (multistream-select negotiation not included). */
  protocols: Record<string, InOut>
  /**
   * Gossipsub's own counters (its metrics' `…_total` counters, summed over their labels), e.g. rpc_sent_bytes,
   * rpc_sent_message (messages), rpc_sent_ihave (IHAVE entries), ihave_rcv_msgids (message ids in IHAVEs received).
   */
  gossipsub: Record<string, number>
}

type Counted = {onData?: (data: {byteLength: number}) => void; sendData?: (data: {byteLength: number}) => unknown}

/**
 * Counts a node's bytes per connection and per protocol, and gossipsub's message and control counters (IHAVE,
 * IWANT, GRAFT, PRUNE, IDONTWANT), so a measurement can say which kind of traffic grows (bench/scale.bench.ts).
 * It is libp2p's `metrics` component and gossipsub's `metricsRegister` at once; the libp2p metrics that other
 * components register are accepted and dropped. Bytes are counted where a stream hands data in (`onData`) and out
 * (`sendData`), so nothing about the stream's reading changes.
 */
export class WireMetrics {
  private readonly connections: InOut = {in: 0, out: 0}
  private readonly protocols = new Map<string, InOut>()
  private readonly gossip = new Map<string, number>()

  counts(): WireCounts {
    return {
      connections: {...this.connections},
      protocols: Object.fromEntries([...this.protocols].map(([k, v]) => [k, {...v}])),
      gossipsub: Object.fromEntries(this.gossip),
    }
  }

  /** libp2p's metrics component (`createLibp2p({metrics: wire.component})`). */
  readonly component = (): Metrics => {
    // Any metric object other components ask for: every property a function doing nothing (never a thenable).
    const noop = (): never => new Proxy(() => undefined, {get: (_t, key) => (key === 'then' ? undefined : noop)}) as never
    return {
      trackMultiaddrConnection: (maConn: MultiaddrConnection) => count(maConn as unknown as Counted, this.connections),
      trackProtocolStream: (stream: Stream) => {
        let io = this.protocols.get(stream.protocol)
        if (!io) this.protocols.set(stream.protocol, (io = {in: 0, out: 0}))
        count(stream as unknown as Counted, io)
      },
      registerMetric: noop,
      registerMetricGroup: noop,
      registerCounter: noop,
      registerCounterGroup: noop,
      registerHistogram: noop,
      registerHistogramGroup: noop,
      registerSummary: noop,
      registerSummaryGroup: noop,
      traceFunction: <F>(_name: string, fn: F): F => fn,
      createTrace: () => undefined,
    }
  }

  /** Gossipsub's metrics register (`gossipsub({metricsRegister: wire.gossipsubRegister, metricsTopicStrToLabel: new Map()})`). */
  readonly gossipsubRegister: MetricsRegister = {
    gauge: ({name}: {name: string}) => {
      const key = name.replace(/^gossipsub_/, '').replace(/_total$/, '')
      const counted = name.endsWith('_total')
      const inc = (a?: unknown, b?: number) => {
        if (!counted) return
        const value = typeof a === 'number' ? a : typeof b === 'number' ? b : 1
        this.gossip.set(key, (this.gossip.get(key) ?? 0) + value)
      }
      return {inc, set: () => {}, addCollect: () => {}} as never
    },
    histogram: () => ({startTimer: () => () => {}, observe: () => {}, reset: () => {}}) as never,
    avgMinMax: () => ({set: () => {}}) as never,
  }
}

/** Counts what a stream or connection hands in (onData) and out (sendData) into `io`. */
function count(target: Counted, io: InOut): void {
  const onData = target.onData
  const sendData = target.sendData
  if (typeof onData === 'function') {
    target.onData = (data) => {
      io.in += data.byteLength
      return onData.call(target, data)
    }
  }
  if (typeof sendData === 'function') {
    target.sendData = (data) => {
      io.out += data.byteLength
      return sendData.call(target, data)
    }
  }
}
