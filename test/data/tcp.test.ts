import assert from 'node:assert/strict'
import {connect, createServer, type AddressInfo, type Socket} from 'node:net'
import {after, before, describe, it} from 'node:test'
import fc from 'fast-check'
import {DataServer, LocalTokenDataset, TcpDataProvider, openDataProvider} from '../../src/core/data/index.js'
import {FrameDecoder, MAX_REQUEST_BYTES, decodeServerMessage, encodeGet, encodeHello, encodeSamples, encodeInfo, type ServerMessage} from '../../src/core/data/wire.js'
import {tempDir, tokens, writeTokenFiles} from './fixtures.js'

const SEQ = 16

/**
 * Sends raw bytes and collects the server's decoded frames: until `expect` frames have come (or, with untilClose,
 * until the server hangs up; at most 10 s), then until it has been quiet for quietMs, so that a frame too many is seen too. The
 * wait is for the frames themselves, never a guess at how long a loaded machine takes to send them.
 */
async function exchange(
  port: number,
  bytes: Buffer[],
  {expect = 0, untilClose = false, quietMs = 60}: {expect?: number; untilClose?: boolean; quietMs?: number} = {},
): Promise<{messages: ServerMessage[]; closed: boolean}> {
  const socket = connect({host: '127.0.0.1', port})
  const decoder = new FrameDecoder(1 << 26)
  const messages: ServerMessage[] = []
  let closed = false
  socket.on('data', (chunk) => messages.push(...decoder.push(chunk).map(decodeServerMessage)))
  socket.on('error', () => {})
  await new Promise((resolve) => socket.once('connect', resolve))
  for (const b of bytes) socket.write(b)
  await new Promise<void>((resolve) => {
    let timer: NodeJS.Timeout | undefined
    // Frames that never come: the assertions then fail on what did come.
    setTimeout(resolve, 10_000).unref()
    const check = () => {
      if (untilClose || messages.length < expect) return
      clearTimeout(timer)
      timer = setTimeout(resolve, quietMs)
    }
    socket.on('data', check)
    socket.once('close', () => {
      closed = true
      clearTimeout(timer)
      resolve()
    })
    check()
  })
  socket.destroy()
  return {messages, closed}
}

describe('TCP data server and client', () => {
  let server: DataServer
  let dataset: LocalTokenDataset
  let dir: string
  let numSamples: number

  before(async () => {
    dir = await tempDir()
    await writeTokenFiles(dir, [
      {name: 'a.bin', ids: tokens(1000, 50_000), tokenSize: 2},
      {name: 'b.bin', ids: tokens(777, 50_000, 9), tokenSize: 2},
    ])
    dataset = await LocalTokenDataset.open(dir)
    server = await DataServer.start(dataset.provider({seqLen: SEQ}), {host: '127.0.0.1', port: 0})
    numSamples = dataset.numSamples(SEQ)
  })
  after(async () => {
    await server.close()
    await dataset.close()
  })

  it('serves the same samples as the local provider, in order, for many concurrent requests', async () => {
    const local = await openDataProvider({Local: dir}, {seqLen: SEQ})
    const client = await openDataProvider({Server: `127.0.0.1:${server.port}`}, {seqLen: SEQ})
    assert.equal(client.numSamples(), numSamples)
    const requests = [[0, 1, 2], [numSamples - 1], [5, 3, 99, 100, 62], [7]]
    const answers = await Promise.all(requests.map((ids) => client.getSamples(ids)))
    for (const [i, ids] of requests.entries()) assert.deepEqual(answers[i], await local.getSamples(ids))
    await Promise.all([local.close(), client.close()])
  })

  it('passes past-the-end and wrap-around through the one mapping, naming the batch', async () => {
    const strict = await TcpDataProvider.connect(`127.0.0.1:${server.port}`, {seqLen: SEQ})
    await assert.rejects(strict.getSamples([1, numSamples + 4]), new RegExp(`data server 127.0.0.1:\\d+: .*batch ${numSamples + 4} is past the end`))
    // The connection survives a refused request.
    const wrapping = await TcpDataProvider.connect(`127.0.0.1:${server.port}`, {seqLen: SEQ, wrap: true})
    assert.deepEqual(await wrapping.getSamples([numSamples + 4]), await strict.getSamples([4]))
    await Promise.all([strict.close(), wrapping.close()])
  })

  it("refuses a client whose seq_len differs and ids beyond the model's vocabulary", async () => {
    await assert.rejects(TcpDataProvider.connect(`127.0.0.1:${server.port}`, {seqLen: SEQ + 1}), /cannot connect: client expects seq_len 17 but this server serves seq_len 16/)
    const client = await TcpDataProvider.connect(`127.0.0.1:${server.port}`, {seqLen: SEQ, vocabSize: 1000})
    await assert.rejects(client.getSamples([2]), /data server 127.0.0.1:\d+: batch 2: token id \d+ at position \d+ is beyond the model's vocabulary \(1000\)/)
    await client.close()
    await assert.rejects(TcpDataProvider.connect('127.0.0.1:1', {seqLen: SEQ}), /data server 127.0.0.1:1: cannot connect: ECONNREFUSED/)
    await assert.rejects(openDataProvider({Server: 'nohost'}, {seqLen: SEQ}), /data_location.Server: "nohost": expected "host:port"/)
  })

  it('answers bad requests with error frames and keeps serving', async () => {
    const hello = encodeHello(SEQ)
    const unknown = Buffer.from([1, 0, 0, 0, 0x42])
    const shortGet = Buffer.from([5, 0, 0, 0, 0x02, 7, 0, 0, 0])
    const zeroIds = Buffer.from([10, 0, 0, 0, 0x02, 8, 0, 0, 0, 0, 0, 0, 0, 0])
    const {messages, closed} = await exchange(server.port, [encodeGet(1, [0], false), hello, unknown, shortGet, zeroIds, encodeGet(9, [3], false)], {expect: 6})
    assert.equal(closed, false)
    assert.deepEqual(
      messages.map((m) => m.type),
      ['error', 'info', 'error', 'error', 'error', 'samples'],
    )
    assert.match((messages[0] as {message: string}).message, /GET before HELLO/)
    assert.match((messages[2] as {message: string}).message, /unknown client frame type 66/)
    assert.equal((messages[4] as {requestId: number}).requestId, 8)
    assert.match((messages[4] as {message: string}).message, /GET of 0 batch ids/)
    assert.deepEqual((messages[5] as {ids: Uint32Array}).ids, await dataset.getSamples([3], SEQ))
    // An oversized frame cannot be skipped: the server says why and hangs up on that client only.
    const huge = Buffer.alloc(4)
    huge.writeUInt32LE(MAX_REQUEST_BYTES + 1)
    const oversized = await exchange(server.port, [hello, huge], {untilClose: true})
    assert.equal(oversized.closed, true)
    assert.match((oversized.messages.at(-1) as {message: string}).message, /bad frame: frame of 65537 bytes/)
    const still = await TcpDataProvider.connect(`127.0.0.1:${server.port}`, {seqLen: SEQ})
    assert.equal((await still.getSamples([1])).length, SEQ + 1)
    await still.close()
  })

  it('survives random and mutated frames (fuzz), always answering with error frames', async () => {
    const valid = [encodeHello(SEQ), encodeGet(3, [1, 2], false), encodeGet(4, [0], true)]
    const mutated = fc.tuple(fc.constantFrom(...valid), fc.array(fc.tuple(fc.nat(), fc.integer({min: 0, max: 255})), {maxLength: 4})).map(([frame, edits]) => {
      const copy = Buffer.from(frame)
      for (const [at, value] of edits) copy[at % copy.length] = value
      return copy
    })
    const random = fc.uint8Array({maxLength: 64}).map((a) => Buffer.from(a))
    await fc.assert(
      fc.asyncProperty(fc.array(fc.oneof(mutated, random), {minLength: 1, maxLength: 4}), async (frames) => {
        const {messages} = await exchange(server.port, frames, {quietMs: 15})
        for (const m of messages) assert.ok(['info', 'samples', 'error'].includes(m.type))
      }),
      {numRuns: 40},
    )
    const after = await TcpDataProvider.connect(`127.0.0.1:${server.port}`, {seqLen: SEQ})
    assert.deepEqual(await after.getSamples([2]), await dataset.getSamples([2], SEQ))
    await after.close()
  })

  it('client decoder rejects random server bytes without crashing', () => {
    fc.assert(
      fc.property(fc.uint8Array({maxLength: 200}), (bytes) => {
        const decoder = new FrameDecoder(1 << 20)
        try {
          decoder.push(Buffer.from(bytes)).map(decodeServerMessage)
        } catch (error) {
          assert.equal((error as Error).name, 'Error')
        }
      }),
      {numRuns: 500},
    )
  })
})

describe('TCP client against a misbehaving server', () => {
  /** A fake data server that greets properly, then answers GET with `reply(socket)`. */
  async function rogue(reply: (socket: Socket) => void): Promise<number> {
    const server = createServer((socket) => {
      socket.on('error', () => {})
      socket.once('data', () => {
        socket.write(encodeInfo(SEQ, 100, undefined))
        socket.once('data', () => reply(socket))
      })
    })
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
    after(() => new Promise<void>((resolve) => server.close(() => resolve())))
    return (server.address() as AddressInfo).port
  }

  it('reports a server that closes mid-frame, naming the server', async () => {
    const port = await rogue((socket) => {
      const frame = encodeSamples(0, SEQ + 1, new Uint32Array(SEQ + 1))
      socket.end(frame.subarray(0, 30))
    })
    const client = await TcpDataProvider.connect(`127.0.0.1:${port}`, {seqLen: SEQ})
    await assert.rejects(client.getSamples([5]), new RegExp(`data server 127.0.0.1:${port}: closed the connection mid-frame \\(received 30 of 85 bytes\\)`))
    await client.close()
  })

  it('never hands over a reply of the wrong shape', async () => {
    const port = await rogue((socket) => socket.write(encodeSamples(0, SEQ + 1, new Uint32Array(2 * (SEQ + 1)))))
    const client = await TcpDataProvider.connect(`127.0.0.1:${port}`, {seqLen: SEQ})
    await assert.rejects(client.getSamples([5]), /batches 5: answered 2×17 ids, expected 1×17/)
    await client.close()
  })
})
