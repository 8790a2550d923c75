import assert from 'node:assert/strict'
import {describe, it} from 'node:test'
import {openDataProvider, type DataLocation} from '../../src/core/data/index.js'
import {type HttpMode, serveDirectory, tempDir, tokens, writeTokenFiles} from './fixtures.js'

const SEQ = 8
const fast = {timeoutMs: 2000, attempts: 3, backoffMs: 10}

function http(location: Extract<DataLocation, {Http: unknown}>['Http']['location'], token: 'TwoBytes' | 'FourBytes' = 'TwoBytes'): DataLocation {
  return {Http: {location, token_size_in_bytes: token, shuffle: 'DontShuffle'}}
}

describe('HTTP data provider', () => {
  it('reads NumberedFiles with range requests only, HEADing each file once per process', async () => {
    const dir = await tempDir()
    const files = [tokens(50, 900, 1), tokens(33, 900, 2)]
    await writeTokenFiles(dir, [
      {name: 'shard-007.ds', ids: files[0], tokenSize: 4},
      {name: 'shard-008.ds', ids: files[1], tokenSize: 4},
    ])
    const {base, requests} = await serveDirectory(dir)
    const location = http({NumberedFiles: {url_template: `${base}/shard-{}.ds`, start_index: 7, n_left_pad_zeros: 3, num_files: 2}}, 'FourBytes')
    const provider = await openDataProvider(location, {seqLen: SEQ, http: fast})
    assert.equal(provider.numSamples(), 6 + 3)
    const got = await provider.getSamples([7, 0])
    assert.deepEqual(got.subarray(0, SEQ + 1), files[1].slice(SEQ, 2 * SEQ + 1))
    assert.deepEqual(got.subarray(SEQ + 1), files[0].slice(0, SEQ + 1))
    assert.ok(
      requests.filter((r) => r.startsWith('GET')).every((r) => /bytes=\d+-\d+$/.test(r)),
      'every GET is a range request',
    )
    assert.ok(requests.includes(`GET /shard-008.ds bytes=${SEQ * 4}-${2 * SEQ * 4 + 3}`))
    await openDataProvider(location, {seqLen: SEQ, http: fast})
    assert.equal(requests.filter((r) => r.startsWith('HEAD')).length, 2, 'file sizes are cached')
    // Consecutive unshuffled batches in one file share one range request (windows overlap by one id).
    requests.length = 0
    const run = await provider.getSamples([1, 2, 3, 6])
    assert.deepEqual(requests, [`GET /shard-007.ds bytes=${SEQ * 4}-${(4 * SEQ + 1) * 4 - 1}`, `GET /shard-008.ds bytes=0-${(SEQ + 1) * 4 - 1}`])
    assert.deepEqual(run.subarray(2 * (SEQ + 1), 3 * (SEQ + 1)), files[0].slice(3 * SEQ, 4 * SEQ + 1))
  })

  it('tells a server that ignores Range, a truncated body and a refused range apart, naming URL and batch', async () => {
    const dir = await tempDir()
    await writeTokenFiles(dir, [{name: 'a.bin', ids: tokens(100, 900), tokenSize: 2}])
    let mode: HttpMode = 'range'
    const {base} = await serveDirectory(dir, () => mode)
    const provider = await openDataProvider(http({SingleUrl: `${base}/a.bin`}), {seqLen: SEQ, http: fast})
    mode = 'ignore-range'
    await assert.rejects(provider.getSamples([1]), new RegExp(`${base}/a.bin: the server ignored the Range header \\(200 instead of 206 for bytes=16-33\\)`))
    mode = 'truncate'
    await assert.rejects(provider.getSamples([1]), new RegExp(`${base}/a.bin: file too short: bytes=16-33 returned 9 of 18 bytes`))
    mode = 'range'
    await assert.rejects(provider.getSamples([20]), new RegExp(`${base}/a.bin: batch 20 is past the end of the data \\(12 samples`))
    const vocab = await openDataProvider(http({SingleUrl: `${base}/a.bin`}), {seqLen: SEQ, http: fast, vocabSize: 10})
    await assert.rejects(vocab.getSamples([2]), new RegExp(`${base}/a.bin: batch 2: token id \\d+ at position \\d+ is beyond the model's vocabulary \\(10\\)`))
  })

  it('retries a flaky server, and reports a down server as down', async () => {
    const dir = await tempDir()
    const ids = tokens(100, 900)
    await writeTokenFiles(dir, [{name: 'a.bin', ids, tokenSize: 2}])
    let mode: HttpMode = 'fail-then-range'
    const {base, server} = await serveDirectory(dir, () => mode)
    const provider = await openDataProvider(http({SingleUrl: `${base}/a.bin`}), {seqLen: SEQ, http: fast})
    assert.deepEqual(await provider.getSamples([2]), ids.slice(2 * SEQ, 3 * SEQ + 1))
    mode = 'always-500'
    await assert.rejects(provider.getSamples([3]), new RegExp(`${base}/a.bin: server down or unreachable: GET bytes=48-65 failed 3 times \\(last: HTTP 503\\)`))
    mode = 'hang'
    const slow = await openDataProvider(http({SingleUrl: `${base}/a.bin`}), {seqLen: SEQ, http: {...fast, timeoutMs: 100, attempts: 2}})
    await assert.rejects(slow.getSamples([1]), new RegExp(`${base}/a.bin: server down or unreachable: GET bytes=16-33 failed 2 times \\(last: timed out after 100 ms\\)`))
    server.closeAllConnections()
    await new Promise((resolve) => server.close(resolve))
    await assert.rejects(
      openDataProvider(http({SingleUrl: `${base}/b.bin`}), {seqLen: SEQ, http: fast}),
      new RegExp(`${base}/b.bin: server down or unreachable: HEAD failed 3 times \\(last: ECONNREFUSED\\)`),
    )
  })

  it('rejects bad locations and files with clear errors', async () => {
    const dir = await tempDir()
    await writeTokenFiles(dir, [{name: 'odd.bin', ids: tokens(11, 900), tokenSize: 2}])
    const {base} = await serveDirectory(dir)
    await assert.rejects(
      openDataProvider(http({SingleUrl: `${base}/odd.bin`}, 'FourBytes'), {seqLen: SEQ, http: fast}),
      /odd.bin: size 22 bytes is not a multiple of the token size \(4 bytes\)/,
    )
    await assert.rejects(openDataProvider(http({SingleUrl: `${base}/missing.bin`}), {seqLen: SEQ, http: fast}), /missing.bin: HEAD answered HTTP 404/)
    await assert.rejects(
      openDataProvider(http({NumberedFiles: {url_template: `${base}/x.bin`, start_index: 0, n_left_pad_zeros: 0, num_files: 2}}), {seqLen: SEQ}),
      /url_template: .* must contain exactly one "\{\}"/,
    )
    await assert.rejects(
      openDataProvider(http({Gcp: {bucket_name: 'b', filter_directory: ''}}), {seqLen: SEQ}),
      /data_location.Http.location.Gcp.bucket_name: "b" is not a Cloud Storage bucket name/,
    )
    await assert.rejects(openDataProvider('Dummy', {seqLen: SEQ}), /data_location: "Dummy" is not supported here: Dummy is Psyche's test placeholder/)
  })
})
