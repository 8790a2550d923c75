import assert from 'node:assert/strict'
import {mkdir, writeFile} from 'node:fs/promises'
import {join} from 'node:path'
import {describe, it} from 'node:test'
import {openDataProvider, type DataLocation} from '../../src/core/data/index.js'
import {Mixture, WeightedHttpProvider} from '../../src/core/data/weighted.js'
import {serveBucket, serveDirectory, tempDir, tokens, writeTokenFiles} from './fixtures.js'

// Psyche's remote data locations against real HTTP servers on 127.0.0.1: a Cloud Storage bucket (Http.location.Gcp)
// and a weighted mixture of Http locations (WeightedHttp), with the bad input each can bring.

const SEQ = 8
const fast = {timeoutMs: 2000, attempts: 2, backoffMs: 10}
const row = (ids: Uint32Array, sample: number) => ids.slice(sample * SEQ, sample * SEQ + SEQ + 1)

function gcp(bucket: string, prefix: string): DataLocation {
  return {Http: {location: {Gcp: {bucket_name: bucket, filter_directory: prefix}}, token_size_in_bytes: 'TwoBytes', shuffle: 'DontShuffle'}}
}

describe('Gcp: a public Cloud Storage bucket', () => {
  it('lists the token files under the prefix, page by page, and reads them with range requests in media-link order', async () => {
    const dir = await tempDir()
    await mkdir(join(dir, 'tokens'))
    await mkdir(join(dir, 'other'))
    const files = [tokens(41, 900, 1), tokens(33, 900, 2), tokens(25, 900, 3)]
    await writeTokenFiles(join(dir, 'tokens'), [
      {name: 'b.ds', ids: files[1], tokenSize: 2},
      {name: 'a.bin', ids: files[0], tokenSize: 2},
      {name: 'c.npy', ids: files[2], tokenSize: 2},
    ])
    await writeFile(join(dir, 'tokens', 'README.md'), 'not tokens')
    await writeTokenFiles(join(dir, 'other'), [{name: 'x.ds', ids: tokens(100, 900, 9), tokenSize: 2}])
    const {endpoint, requests} = await serveBucket(dir, 'my-bucket', {pageSize: 2})
    const provider = await openDataProvider(gcp('my-bucket', 'tokens/'), {seqLen: SEQ, http: {...fast, gcsEndpoint: endpoint}})
    assert.match(provider.description, /^gs:\/\/my-bucket\/tokens\/ \(3 files\)$/)
    // windows per file: a.bin 4, b.ds 3, c.npy 2; files in media-link order (a, b, c)
    assert.equal(provider.numSamples(), 4 + 3 + 2)
    const got = await provider.getSamples([0, 4, 8])
    assert.deepEqual(got.subarray(0, SEQ + 1), row(files[0], 0))
    assert.deepEqual(got.subarray(SEQ + 1, 2 * (SEQ + 1)), row(files[1], 0))
    assert.deepEqual(got.subarray(2 * (SEQ + 1)), row(files[2], 1))
    const listings = requests.filter((r) => r.startsWith('GET /storage/v1/b/my-bucket/o'))
    assert.equal(listings.length, 2, 'four objects, two a page')
    assert.ok(listings.every((r) => r.includes('prefix=tokens%2F')))
    assert.ok(
      requests.filter((r) => r.startsWith('GET /download')).every((r) => /bytes=\d+-\d+$/.test(r)),
      'data is read with range requests only',
    )
    assert.ok(!requests.some((r) => r.includes('other%2Fx.ds')), 'nothing outside the prefix is touched')
    await provider.close()
  })

  it('the endpoint comes from PSYCHE_GCS_ENDPOINT when not given', async () => {
    const dir = await tempDir()
    await writeTokenFiles(dir, [{name: 'a.bin', ids: tokens(40, 900), tokenSize: 2}])
    const {endpoint} = await serveBucket(dir, 'env-bucket')
    const saved = process.env.PSYCHE_GCS_ENDPOINT
    process.env.PSYCHE_GCS_ENDPOINT = endpoint
    try {
      const provider = await openDataProvider(gcp('env-bucket', ''), {seqLen: SEQ, http: fast})
      assert.equal(provider.numSamples(), 4)
    } finally {
      if (saved === undefined) delete process.env.PSYCHE_GCS_ENDPOINT
      else process.env.PSYCHE_GCS_ENDPOINT = saved
    }
  })

  it('refuses a listing that lies about sizes, a truncated file, a link to another host and an empty prefix, naming the source', async () => {
    const dir = await tempDir()
    const ids = tokens(64, 900)
    await writeTokenFiles(dir, [
      {name: 'a.bin', ids, tokenSize: 2},
      {name: 'b.bin', ids: tokens(64, 900, 5), tokenSize: 2},
    ])
    const liar = await serveBucket(dir, 'liar', {listedSize: (name, size) => (name === 'b.bin' ? size * 2 : size)})
    await assert.rejects(openDataProvider(gcp('liar', ''), {seqLen: SEQ, http: {...fast, gcsEndpoint: liar.endpoint}}), (e: Error) =>
      /\/o\/b\.bin\?generation=1&alt=media: the listing says 256 bytes but the server holds 128/.test(e.message),
    )
    assert.ok(!liar.requests.some((r) => r.startsWith('GET /download')), 'no data is read from a lying listing')

    const cut = await serveBucket(dir, 'cut', {truncate: (name) => name === 'a.bin'})
    const provider = await openDataProvider(gcp('cut', ''), {seqLen: SEQ, http: {...fast, gcsEndpoint: cut.endpoint}})
    await assert.rejects(provider.getSamples([1]), /\/o\/a\.bin\?generation=1&alt=media: file too short: bytes=16-33 returned 9 of 18 bytes/)

    const elsewhere = await serveBucket(dir, 'elsewhere', {mediaLink: (name) => `http://127.0.0.2:9/${name}`})
    await assert.rejects(
      openDataProvider(gcp('elsewhere', ''), {seqLen: SEQ, http: {...fast, gcsEndpoint: elsewhere.endpoint}}),
      /not a Cloud Storage listing: items\[0\] \(a\.bin\): mediaLink points to http:\/\/127\.0\.0\.2:9, not the listing's http:\/\/127\.0\.0\.1:\d+/,
    )

    await assert.rejects(
      openDataProvider(gcp('liar', 'nothing-here/'), {seqLen: SEQ, http: {...fast, gcsEndpoint: liar.endpoint}}),
      /data_location\.Http\.location\.Gcp: gs:\/\/liar\/nothing-here\/ holds no token files/,
    )
    await assert.rejects(
      openDataProvider(gcp('no-such-bucket', ''), {seqLen: SEQ, http: {...fast, gcsEndpoint: liar.endpoint}}),
      /\/storage\/v1\/b\/no-such-bucket\/o\?.*: GET the listing of gs:\/\/no-such-bucket\/ answered HTTP 404/,
    )
  })
})

describe('WeightedHttp: a weighted mixture of Http locations', () => {
  /** Two sources of NumberedFiles on one server, and the mixture's JSON beside them. */
  async function mixture(config: (base: string) => unknown, sizes = [[50, 50], [70]]) {
    const dir = await tempDir()
    const ids: Uint32Array[][] = []
    for (const [s, files] of sizes.entries()) {
      await mkdir(join(dir, `s${s}`))
      ids.push(files.map((n, f) => tokens(n, 900, 10 * s + f + 1)))
      await writeTokenFiles(
        join(dir, `s${s}`),
        ids[s].map((data, f) => ({name: `${String(f).padStart(3, '0')}.ds`, ids: data, tokenSize: 2})),
      )
    }
    const server = await serveDirectory(dir)
    await writeFile(join(dir, 'mix.json'), JSON.stringify(config(server.base)))
    return {url: `${server.base}/mix.json`, base: server.base, ids, requests: server.requests, dir}
  }
  const source = (base: string, s: number, files: number, shuffle: unknown = 'DontShuffle') => ({
    location: {NumberedFiles: {url_template: `${base}/s${s}/{}.ds`, start_index: 0, n_left_pad_zeros: 3, num_files: files}},
    token_size_in_bytes: 'TwoBytes',
    shuffle,
  })

  it('draws each source by its weight, in Psyche order, and no sample twice in a pass', async () => {
    // source 0: two files of 50 ids (6 + 6 samples), source 1: one file of 70 ids (8 samples)
    const {url, ids} = await mixture((base) => ({
      shuffle: 'DontShuffle',
      providers: [
        [source(base, 0, 2), 3.0],
        [source(base, 1, 1), 1.0],
      ],
    }))
    const provider = (await openDataProvider({WeightedHttp: url}, {seqLen: SEQ, http: fast, wrap: true})) as WeightedHttpProvider
    // weights 0.75 / 0.25: Psyche's greedy order starts 0 1 0 0 0 1 0 0; the pass ends where source 0 (12 samples)
    // would have to repeat: after 16 draws (12 of source 0, 4 of source 1)
    const n = provider.numSamples()
    assert.equal(n, 16)
    const places = Array.from({length: n}, (_, b) => provider.locate(b))
    assert.deepEqual(
      places.slice(0, 8).map((p) => p.source),
      [0, 1, 0, 0, 0, 1, 0, 0],
    )
    assert.equal(new Set(places.map((p) => `${p.source}/${p.sample}`)).size, n, 'no sample is drawn twice in a pass')
    assert.deepEqual(provider.mixture.used, [12, 4])
    const samples = await provider.getSamples(Array.from({length: n}, (_, b) => b))
    places.forEach((p, b) => {
      const file = p.source === 0 ? Math.floor(p.sample / 6) : 0
      const within = p.source === 0 ? p.sample % 6 : p.sample
      assert.deepEqual(samples.subarray(b * (SEQ + 1), (b + 1) * (SEQ + 1)), row(ids[p.source][file], within), `batch ${b}`)
    })
    // past the end: the next pass, from the start
    assert.deepEqual(await provider.getSamples([n + 2]), await provider.getSamples([2]))
    // another replica reading the same JSON draws the same mixture
    const replica = await openDataProvider({WeightedHttp: url}, {seqLen: SEQ, http: fast, wrap: true})
    assert.deepEqual(await replica.getSamples([0, 5, 15, 3]), await provider.getSamples([0, 5, 15, 3]))
    await provider.close()
    await replica.close()
  })

  it('length-weighted sources give every sample once; a Seeded shuffle reorders the same samples, the same on every replica', async () => {
    const plain = await mixture((base) => ({shuffle: 'DontShuffle', providers: [source(base, 0, 2), source(base, 1, 1)]}))
    const provider = (await openDataProvider({WeightedHttp: plain.url}, {seqLen: SEQ, http: fast})) as WeightedHttpProvider
    assert.equal(provider.numSamples(), 20)
    assert.deepEqual(provider.mixture.used, [12, 8])
    const seed = Array.from({length: 32}, (_, i) => i * 7)
    const shuffledUrl = `${plain.base}/shuffled.json`
    await writeFile(join(plain.dir, 'shuffled.json'), JSON.stringify({shuffle: {Seeded: seed}, providers: [source(plain.base, 0, 2), source(plain.base, 1, 1)]}))
    const shuffled = (await openDataProvider({WeightedHttp: shuffledUrl}, {seqLen: SEQ, http: fast})) as WeightedHttpProvider
    const key = (p: WeightedHttpProvider) => Array.from({length: 20}, (_, b) => p.locate(b)).map((x) => `${x.source}/${x.sample}`)
    assert.deepEqual([...key(shuffled)].sort(), [...key(provider)].sort())
    assert.notDeepEqual(key(shuffled), key(provider))
    const again = (await openDataProvider({WeightedHttp: shuffledUrl}, {seqLen: SEQ, http: fast})) as WeightedHttpProvider
    assert.deepEqual(key(again), key(shuffled))
    await assert.rejects(provider.getSamples([20]), /mix\.json: batch 20 is past the end of the data \(20 samples; wrap-around is off\)/)
  })

  it('refuses zero or negative weights, a source without samples, a truncated file and a broken document, naming the URL and the entry, before reading any data', async () => {
    for (const [weight, shown] of [
      [0, '0'],
      [-1.5, '-1.5'],
      ['2', '"2"'],
    ] as const) {
      const {url, requests} = await mixture((base) => ({
        shuffle: 'DontShuffle',
        providers: [
          [source(base, 0, 2), 1],
          [source(base, 1, 1), weight],
        ],
      }))
      await assert.rejects(
        openDataProvider({WeightedHttp: url}, {seqLen: SEQ, http: fast}),
        new RegExp(`${url}: providers\\[1\\]\\[1\\]: weight ${shown.replace('.', '\\.')} must be a positive number`),
      )
      assert.ok(!requests.some((r) => r.includes('/s0/') || r.includes('/s1/')), 'no source is opened')
    }
    const short = await mixture(
      (base) => ({
        shuffle: 'DontShuffle',
        providers: [
          [source(base, 0, 2), 1],
          [source(base, 1, 1), 1],
        ],
      }),
      [[50, 50], [5]],
    )
    await assert.rejects(
      openDataProvider({WeightedHttp: short.url}, {seqLen: SEQ, http: fast}),
      new RegExp(`${short.url}: providers\\[1\\]\\[0\\]: .*/s1/000\\.ds holds no whole sample of 9 tokens`),
    )
    const odd = await mixture((base) => ({shuffle: 'DontShuffle', providers: [source(base, 0, 2), source(base, 1, 1)]}), [[50, 50], [70]])
    await writeFile(join(odd.dir, 's1', '000.ds'), Buffer.alloc(141))
    await assert.rejects(
      openDataProvider({WeightedHttp: odd.url}, {seqLen: SEQ, http: fast}),
      /\/s1\/000\.ds: size 141 bytes is not a multiple of the token size \(2 bytes\); wrong token size or a truncated file/,
    )
    const mixed = await mixture((base) => ({shuffle: 'DontShuffle', providers: [[source(base, 0, 2), 1], source(base, 1, 1)]}))
    await assert.rejects(openDataProvider({WeightedHttp: mixed.url}, {seqLen: SEQ, http: fast}), /mix\.json: providers\[1\]: expected a \[location, weight\] pair/)
    const broken = await mixture(() => 'x')
    await writeFile(join(broken.dir, 'mix.json'), '{"shuffle": "DontShuffle", "providers": [')
    await assert.rejects(openDataProvider({WeightedHttp: broken.url}, {seqLen: SEQ, http: fast}), /mix\.json: the weighted data locations is not valid JSON/)
    const missing = await mixture(() => ({providers: []}))
    await assert.rejects(openDataProvider({WeightedHttp: missing.url}, {seqLen: SEQ, http: fast}), /mix\.json: shuffle: missing/)
    await assert.rejects(openDataProvider({WeightedHttp: `${broken.base}/nope.json`}, {seqLen: SEQ, http: fast}), /nope\.json: GET the weighted data locations answered HTTP 404/)
  })

  it('a mixture is Psyche order, ends before any source repeats, and covers every sample with length weights', () => {
    const m = Mixture.build([4, 100], [1, 1])
    // 0.5 / 0.5: alternate until source 0's four samples are used
    assert.equal(m.length, 8)
    assert.deepEqual(
      Array.from({length: 8}, (_, k) => m.locate(k)),
      [0, 1, 0, 1, 0, 1, 0, 1].map((source, k) => ({source, sample: Math.floor(k / 2)})),
    )
    const big = Mixture.build([1000, 300, 7], [1000, 300, 7])
    assert.equal(big.length, 1307)
    const seen = Array.from({length: 1307}, (_, k) => big.locate(k))
    assert.deepEqual(big.used, [1000, 300, 7])
    for (const s of [0, 1, 2]) {
      const samples = seen.filter((p) => p.source === s).map((p) => p.sample)
      assert.deepEqual(
        samples,
        samples.map((_, i) => i),
        `source ${s} gives its samples in order`,
      )
    }
  })
})
