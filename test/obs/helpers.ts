import assert from 'node:assert/strict'

/** Prometheus text format → {`name{labels}`: value}. */
function parseMetrics(text: string): Map<string, number> {
  const out = new Map<string, number>()
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue
    const m = /^(\S+?(?:\{[^}]*\})?) (\S+)$/.exec(line)
    if (m) out.set(m[1], Number(m[2]))
  }
  return out
}

export async function scrape(port: number): Promise<{text: string; metrics: Map<string, number>; contentType: string | null}> {
  const res = await fetch(`http://127.0.0.1:${port}/metrics`)
  assert.equal(res.status, 200)
  const text = await res.text()
  return {text, metrics: parseMetrics(text), contentType: res.headers.get('content-type')}
}
