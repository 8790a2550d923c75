import assert from 'node:assert/strict'
import {describe, it} from 'node:test'
import {setFlagsFromString} from 'node:v8'
import {runInNewContext} from 'node:vm'
import {anySignal, deadline} from '../../src/core/p2p/util.js'

setFlagsFromString('--expose-gc')
const gc = runInNewContext('gc') as () => void

/** Resolves with the reason once `signal` aborts, or with 'never' after `ms`, collecting garbage meanwhile. */
async function abortedWithin(signal: AbortSignal, ms: number): Promise<unknown> {
  const end = Date.now() + ms
  return await new Promise((resolve) => {
    signal.addEventListener('abort', () => resolve(signal.reason), {once: true})
    const tick = () => {
      gc()
      if (Date.now() >= end) resolve('never')
      else setTimeout(tick, 5)
    }
    tick()
  })
}

describe('deadlines and composed signals', () => {
  it('a deadline inside a composed signal fires though nothing else holds it (garbage collected meanwhile)', async () => {
    const running = new AbortController()
    for (let i = 0; i < 20; i++) {
      // The deadline is referenced by nothing but the composite: with AbortSignal.timeout inside AbortSignal.any,
      // Node 20 may collect it and the composite never aborts.
      const reason = await abortedWithin(anySignal(deadline(20), running.signal), 2_000)
      assert.equal((reason as Error).name, 'TimeoutError', `attempt ${i}: ${String(reason)}`)
    }
  })

  it('a deadline counts only the time the event loop could run: a blocked loop stretches it, to at most 3× its length', async () => {
    const blockFor = (ms: number) => {
      const until = performance.now() + ms
      while (performance.now() < until) {
        // busy: the event loop runs nothing else
      }
    }
    const firedAfter = (signal: AbortSignal, start: number) =>
      new Promise<number>((resolve) => signal.addEventListener('abort', () => resolve(performance.now() - start), {once: true}))
    // 250 ms of a 300 ms deadline blocked: it fires after about 550 ms, not 300.
    let start = performance.now()
    let signal = deadline(300)
    let fired = firedAfter(signal, start)
    await new Promise((r) => setTimeout(r, 20))
    blockFor(250)
    let at = await fired
    assert.ok(at >= 500 && at < 900 + 500, `fired after ${at.toFixed(0)} ms`)
    assert.equal((signal.reason as Error).name, 'TimeoutError')
    // Blocked for longer than 3× its length: it fires as soon as the loop runs again.
    start = performance.now()
    signal = deadline(100)
    fired = firedAfter(signal, start)
    blockFor(500)
    at = await fired
    assert.ok(at >= 500 && at < 500 + 300, `fired after ${at.toFixed(0)} ms`)
  })

  it('aborts with the first source’s reason, at once when one already aborted, and lets go of the others', async () => {
    const a = new AbortController()
    const b = new AbortController()
    const composite = anySignal(a.signal, b.signal, deadline(60_000))
    assert.equal(composite.aborted, false)
    b.abort(new Error('b first'))
    assert.equal(composite.aborted, true)
    assert.equal((composite.reason as Error).message, 'b first')
    a.abort(new Error('a later'))
    assert.equal((composite.reason as Error).message, 'b first')
    assert.equal((anySignal(new AbortController().signal, b.signal).reason as Error).message, 'b first')
  })
})
