// Batches per second from each data provider (Local, Http, TCP data server) for the demo model's batch
// shape (templates/tiny-demo: global batch 16 × max_seq_len 128) and the llama2-20m shape (8 × 2048),
// random shuffled batch ids over a 16M-token dataset in 4 files. The HTTP and TCP servers run in this same
// process on 127.0.0.1, so their numbers include the server's work too.
import {mkdtemp, rm, writeFile} from 'node:fs/promises'
import {createServer} from 'node:http'
import type {AddressInfo} from 'node:net'
import {tmpdir} from 'node:os'
import {join} from 'node:path'
import {closeSync, openSync, readSync, statSync} from 'node:fs'
import {DataServer, LocalTokenDataset, openDataProvider, type DataLocation, type DataProvider} from '../src/core/data/index.js'

const FILES = 4
const TOKENS_PER_FILE = 4 << 20
const SEED = Array.from({length: 32}, (_, i) => i)
const SECONDS = Number(process.env.BENCH_SECONDS ?? 1.5)

const dir = await mkdtemp(join(tmpdir(), 'psyche-data-bench-'))
try {
  const names: string[] = []
  for (let f = 0; f < FILES; f++) {
    const ids = new Uint16Array(TOKENS_PER_FILE)
    for (let i = 0; i < ids.length; i++) ids[i] = (i * 2654435761 + f) % 32000
    names.push(`${String(f).padStart(3, '0')}.ds`)
    await writeFile(join(dir, names[f]), Buffer.from(ids.buffer))
  }
  // A minimal static server honouring single byte ranges (the shape of a CDN or `python -m http.server` with ranges).
  const http = createServer((req, res) => {
    const path = join(dir, new URL(req.url!, 'http://x').pathname)
    const size = statSync(path).size
    if (req.method === 'HEAD') return void res.writeHead(200, {'content-length': size}).end()
    const [, a, b] = /bytes=(\d+)-(\d+)/.exec(req.headers.range ?? '') ?? []
    const body = Buffer.alloc(Number(b) - Number(a) + 1)
    const fd = openSync(path, 'r')
    readSync(fd, body, 0, body.length, Number(a))
    closeSync(fd)
    res.writeHead(206, {'content-range': `bytes ${a}-${b}/${size}`, 'content-length': body.length}).end(body)
  })
  await new Promise<void>((resolve) => http.listen(0, '127.0.0.1', resolve))
  const base = `http://127.0.0.1:${(http.address() as AddressInfo).port}`

  const rows: string[] = []
  for (const [batch, seqLen] of [
    [16, 128],
    [8, 2048],
  ]) {
    const dataset = await LocalTokenDataset.open(dir, {tokenSize: 2})
    const server = await DataServer.start(dataset.provider({seqLen, shuffleSeed: Uint8Array.from(SEED)}), {host: '127.0.0.1', port: 0})
    const locations: Array<[string, DataLocation]> = [
      ['Local', {Local: dir}],
      [
        'Http',
        {
          Http: {
            location: {NumberedFiles: {url_template: `${base}/{}.ds`, start_index: 0, n_left_pad_zeros: 3, num_files: FILES}},
            token_size_in_bytes: 'TwoBytes',
            shuffle: {Seeded: SEED},
          },
        },
      ],
      ['Server (TCP)', {Server: `127.0.0.1:${server.port}`}],
    ]
    for (const [name, location] of locations) {
      const provider: DataProvider = await openDataProvider(location, {seqLen, shuffleSeed: SEED, vocabSize: 32000, wrap: true})
      let step = 0
      const next = () => Array.from({length: batch}, (_, i) => (step * batch + i) * 7919)
      for (let i = 0; i < 5; i++, step++) await provider.getSamples(next()) // warm-up
      const started = performance.now()
      let batches = 0
      while (performance.now() - started < SECONDS * 1000) {
        await provider.getSamples(next())
        step++
        batches++
      }
      const seconds = (performance.now() - started) / 1000
      const perSecond = batches / seconds
      rows.push(
        `| ${batch} × ${seqLen + 1} | ${name} | ${perSecond.toFixed(0)} | ${((1000 * seconds) / batches).toFixed(2)} | ${((perSecond * batch * (seqLen + 1)) / 1e6).toFixed(1)} |`,
      )
      await provider.close()
    }
    await server.close()
    await dataset.close()
  }
  http.close()
  console.log('| batch shape (samples × ids) | provider | batches/s | ms/batch | M tokens/s |')
  console.log('|---|---|---|---|---|')
  for (const row of rows) console.log(row)
} finally {
  await rm(dir, {recursive: true, force: true})
}
