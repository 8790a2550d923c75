import {PsycheError} from '../errors.js'

/** Parses "host:port" (IPv6 hosts in brackets: "[::1]:5000"); `where` names the setting in the error. */
export function parseHostPort(address: string, where: string): {host: string; port: number} {
  const match = /^(?:\[([^\]]+)\]|([^:]+)):(\d+)$/.exec(address)
  const port = Number(match?.[3])
  if (!match || port <= 0 || port > 65535) throw new PsycheError(`${where}: ${JSON.stringify(address)}: expected "host:port"`)
  return {host: match[1] ?? match[2], port}
}
