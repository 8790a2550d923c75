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
