import {spawn, spawnSync} from 'node:child_process'
import {randomBytes} from 'node:crypto'
import {dirname, join} from 'node:path'
import {fileURLToPath} from 'node:url'

/**
 * A small internet inside Linux network namespaces, for multi-host tests on one machine:
 *
 *   - a "switch" namespace holding one bridge: the shared segment, by default the public-range 45.77.0.0/24 (as
 *     on the internet: libp2p treats public addresses differently from RFC 1918 ones), or 10.77.0.0/24 with
 *     `new Lab({segment: 'private'})` (a LAN, or a cloud VPC);
 *   - public hosts: a namespace with one veth into the switch (45.77.0.N);
 *   - NATed hosts: a router namespace (WAN 45.77.0.N on the switch, LAN 10.77.K.1/24) doing nftables masquerade
 *     and dropping new inbound connections (silently, as most home routers do), and the host namespace behind it
 *     (10.77.K.2, default route via .1).
 *     Nothing routes 10.77.K.0/24 on the shared side, as on the internet;
 *   - optional link rates with `tc qdisc ... tbf` on both directions of a host's link (no netem on this kernel).
 *
 * Every name starts with a prefix unique to this lab, every address lives only inside these namespaces, and
 * destroy() (also run on process exit) deletes the namespaces — which removes their links — after killing the
 * processes this lab started in them. Traffic never leaves the namespaces.
 */

export interface Host {
  name: string
  ns: string
  /** The host's own address (private for a NATed host). */
  ip: string
  /** The address the public segment sees it as (its router's WAN address when NATed). */
  publicIp: string
  nat: boolean
  /** The interface of the host's link (for tc). */
  dev: string
  /** The NAT router's namespace (NATed hosts). */
  router?: string
  /** The link into the shared segment: the host's own, or its router's WAN side (namespace and interface). */
  uplink: {ns: string; dev: string}
}

const live = new Set<Lab>()
let exitHookInstalled = false

function sh(args: string[], what: string, options: {input?: string; allowFail?: boolean} = {}): string {
  const r = spawnSync(args[0], args.slice(1), {encoding: 'utf8', input: options.input, stdio: [options.input === undefined ? 'ignore' : 'pipe', 'pipe', 'pipe']})
  if ((r.status !== 0 || r.error) && !options.allowFail) throw new Error(`${what}: ${args.join(' ')} failed: ${r.error?.message ?? r.stderr.trim()}`)
  return r.stdout
}

/** Why network-namespace tests cannot run here (undefined: they can). */
export function labUnavailable(options: {nat?: boolean; rates?: boolean} = {}): string | undefined {
  if (process.platform !== 'linux') return `network namespaces need Linux (this is ${process.platform})`
  if (typeof process.getuid === 'function' && process.getuid() !== 0) return 'network namespaces need root (run the tests as root, as CI does)'
  for (const tool of ['ip', ...(options.nat ? ['nft'] : []), ...(options.rates ? ['tc'] : [])]) {
    if (spawnSync('sh', ['-c', `command -v ${tool}`]).status !== 0) return `\`${tool}\` is not installed (scripts/setup.mjs installs iproute2 and nftables with apt)`
  }
  const probe = `pnprobe${randomBytes(3).toString('hex')}`
  const r = spawnSync('ip', ['netns', 'add', probe], {encoding: 'utf8'})
  if (r.status !== 0) return `cannot create a network namespace: ${r.stderr.trim() || r.error?.message}`
  spawnSync('ip', ['netns', 'del', probe])
  return undefined
}

interface LabOptions {
  /** The shared segment: 'public' (45.77.0.0/24, the default) or 'private' (10.77.0.0/24). */
  segment?: 'public' | 'private'
  /**
   * One-way latency between any two hosts on the segment, in ms (default none: a kernel bridge, microseconds). The
   * segment is then delay_switch.py, a learning switch in user space that holds each frame this long: an internet
   * path's latency, which this kernel cannot add otherwise (no netem).
   */
  delayMs?: number
}

export class Lab {
  /** The shared segment's first three octets. */
  readonly net: string
  readonly prefix = `pn${randomBytes(3).toString('hex')}`
  readonly hosts = new Map<string, Host>()
  private readonly namespaces: string[] = []
  private readonly switchNs: string
  private readonly delayed: boolean
  private nextPublic = 1
  private nextLan = 10
  private ifaces = 0
  private destroyed = false

  constructor(options: LabOptions = {}) {
    this.net = options.segment === 'private' ? '10.77.0' : '45.77.0'
    this.switchNs = this.addNs('sw')
    this.delayed = (options.delayMs ?? 0) > 0
    if (this.delayed) {
      const script = join(dirname(fileURLToPath(import.meta.url)), 'delay_switch.py')
      // Detached, in the switch namespace: destroySync kills it with every other process there.
      spawn('ip', ['netns', 'exec', this.switchNs, 'python3', script, String(options.delayMs)], {stdio: 'ignore', detached: true}).unref()
    } else {
      sh(['ip', '-n', this.switchNs, 'link', 'add', 'br0', 'type', 'bridge'], 'bridge')
      sh(['ip', '-n', this.switchNs, 'link', 'set', 'br0', 'up'], 'bridge up')
    }
    live.add(this)
    if (!exitHookInstalled) {
      exitHookInstalled = true
      process.on('exit', () => {
        for (const lab of live) lab.destroySync()
      })
      // Interrupted (Ctrl-C, a killed test run): clean up too, then die of the signal as usual.
      for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) {
        process.once(signal, () => {
          for (const lab of live) lab.destroySync()
          process.kill(process.pid, signal)
        })
      }
    }
  }

  private addNs(suffix: string): string {
    const ns = `${this.prefix}-${suffix}`
    sh(['ip', 'netns', 'add', ns], 'netns')
    this.namespaces.push(ns)
    sh(['ip', '-n', ns, 'link', 'set', 'lo', 'up'], 'lo up')
    return ns
  }

  /** A veth pair: `a` into namespace nsA, `b` into nsB (names are short: interface names have 15 characters). */
  private veth(nsA: string, nsB: string): {a: string; b: string} {
    const n = this.ifaces++
    const a = `${this.prefix}a${n}`
    const b = `${this.prefix}b${n}`
    sh(['ip', 'link', 'add', a, 'netns', nsA, 'type', 'veth', 'peer', 'name', b, 'netns', nsB], 'veth')
    return {a, b}
  }

  private plugIntoSwitch(ns: string): {dev: string; switchDev: string; ip: string} {
    const ip = `${this.net}.${this.nextPublic++}`
    const {a, b} = this.veth(ns, this.switchNs)
    if (!this.delayed) sh(['ip', '-n', this.switchNs, 'link', 'set', b, 'master', 'br0'], 'bridge port')
    sh(['ip', '-n', this.switchNs, 'link', 'set', b, 'up'], 'port up')
    sh(['ip', '-n', ns, 'addr', 'add', `${ip}/24`, 'dev', a], 'addr')
    sh(['ip', '-n', ns, 'link', 'set', a, 'up'], 'link up')
    return {dev: a, switchDev: b, ip}
  }

  /** A host on the public segment. */
  addPublicHost(name: string): Host {
    const ns = this.addNs(name)
    const {dev, ip} = this.plugIntoSwitch(ns)
    const host: Host = {name, ns, ip, publicIp: ip, nat: false, dev, uplink: {ns, dev}}
    this.hosts.set(name, host)
    return host
  }

  /**
   * A host behind its own NAT router (masquerade), like a home router: `unsolicited: 'drop'` (the default) drops
   * what arrives from the WAN side unasked (a TCP SYN, a UDP datagram no connection of ours expects), silently, as
   * most home routers do; `'answer'` is a Linux NAT box with no firewall rules at all, whose kernel answers such a
   * SYN with a RST and such a datagram with an ICMP port unreachable (and, what matters for hole punching,
   * remembers it: its conntrack entry then takes the port our own reply would have been mapped to). Plain
   * masquerade keeps a connection's source port where it can (port-preserving: a port maps the same way towards
   * every destination, so hole punching works); `{nat: 'symmetric'}` (masquerade random) maps each connection to a
   * random port, as a symmetric NAT does.
   */
  addNatHost(name: string, options: {nat?: 'port-preserving' | 'symmetric'; unsolicited?: 'drop' | 'answer'} = {}): Host {
    const router = this.addNs(`${name}-r`)
    const wan = this.plugIntoSwitch(router)
    const lan = this.nextLan++
    const ns = this.addNs(name)
    const {a: routerLan, b: hostDev} = this.veth(router, ns)
    sh(['ip', '-n', router, 'addr', 'add', `10.77.${lan}.1/24`, 'dev', routerLan], 'router lan addr')
    sh(['ip', '-n', router, 'link', 'set', routerLan, 'up'], 'router lan up')
    sh(['ip', 'netns', 'exec', router, 'sysctl', '-qw', 'net.ipv4.ip_forward=1'], 'ip_forward')
    sh(['ip', '-n', ns, 'addr', 'add', `10.77.${lan}.2/24`, 'dev', hostDev], 'host addr')
    sh(['ip', '-n', ns, 'link', 'set', hostDev, 'up'], 'host up')
    sh(['ip', '-n', ns, 'route', 'add', 'default', 'via', `10.77.${lan}.1`], 'default route')
    const nat = `table ip nat {
  chain postrouting { type nat hook postrouting priority srcnat; policy accept; oifname "${wan.dev}" masquerade${options.nat === 'symmetric' ? ' random' : ''}; }
}
`
    const firewall = `table ip filter {
  chain forward { type filter hook forward priority filter; policy drop;
    ct state established,related accept
    iifname "${routerLan}" oifname "${wan.dev}" accept
  }
  chain input { type filter hook input priority filter; policy accept;
    ct state established,related accept
    iifname "${wan.dev}" drop
  }
}
`
    const rules = options.unsolicited === 'answer' ? nat : nat + firewall
    sh(['ip', 'netns', 'exec', router, 'nft', '-f', '-'], 'nftables', {input: rules})
    const host: Host = {name, ns, ip: `10.77.${lan}.2`, publicIp: wan.ip, nat: true, dev: hostDev, router, uplink: {ns: router, dev: wan.dev}}
    this.hosts.set(name, host)
    return host
  }

  /** Blocks UDP on a host (nftables drops every UDP packet in and out but loopback's), as a network that blocks UDP. */
  blockUdp(host: Host): void {
    const rules = `table inet noudp {
  chain input { type filter hook input priority filter; policy accept; iifname "lo" accept; meta l4proto udp counter drop; }
  chain output { type filter hook output priority filter; policy accept; oifname "lo" accept; meta l4proto udp counter drop; }
}
`
    sh(['ip', 'netns', 'exec', host.ns, 'nft', '-f', '-'], 'nftables', {input: rules})
  }

  /** UDP packets dropped on a host by blockUdp (in + out). */
  udpDropped(host: Host): number {
    const out = sh(['ip', 'netns', 'exec', host.ns, 'nft', 'list', 'table', 'inet', 'noudp'], 'nft list')
    return [...out.matchAll(/counter packets (\d+)/g)].reduce((s, m) => s + Number(m[1]), 0)
  }

  /** Starts counting a host's TCP and UDP bytes (in + out, loopback excluded) with nftables counters: see protocolBytes. */
  countProtocols(host: Host): void {
    const rules = `table inet protocount {
  chain input { type filter hook input priority filter; policy accept; iifname "lo" accept; meta l4proto tcp counter; meta l4proto udp counter; }
  chain output { type filter hook output priority filter; policy accept; oifname "lo" accept; meta l4proto tcp counter; meta l4proto udp counter; }
}
`
    sh(['ip', 'netns', 'exec', host.ns, 'nft', '-f', '-'], 'nftables', {input: rules})
  }

  /** TCP and UDP bytes through a host since countProtocols (the kernel's counters: what went over the wire). */
  protocolBytes(host: Host): {tcp: number; udp: number} {
    const out = sh(['ip', 'netns', 'exec', host.ns, 'nft', 'list', 'table', 'inet', 'protocount'], 'nft list')
    const bytes = {tcp: 0, udp: 0}
    for (const m of out.matchAll(/meta l4proto (tcp|udp) counter packets \d+ bytes (\d+)/g)) bytes[m[1] as 'tcp' | 'udp'] += Number(m[2])
    return bytes
  }

  /**
   * Starts counting the bytes a host receives (loopback excluded) by sender and protocol: from `coordinator` (its
   * server, relay and STUN) or from anyone else (its peers, directly), UDP or TCP: see receivedBytes.
   */
  countSenders(host: Host, coordinator: string): void {
    const rules = `table inet senders {
  chain input { type filter hook input priority filter; policy accept; iifname "lo" accept;
    ip saddr ${coordinator} meta l4proto udp counter
    ip saddr ${coordinator} meta l4proto tcp counter
    ip saddr != ${coordinator} meta l4proto udp counter
    ip saddr != ${coordinator} meta l4proto tcp counter
  }
}
`
    sh(['ip', 'netns', 'exec', host.ns, 'nft', '-f', '-'], 'nftables', {input: rules})
  }

  /** Bytes a host received since countSenders, by sender (the coordinator's host, or peers) and protocol: the kernel's counters. */
  receivedBytes(host: Host): {coordinator: {udp: number; tcp: number}; peers: {udp: number; tcp: number}} {
    const out = sh(['ip', 'netns', 'exec', host.ns, 'nft', 'list', 'table', 'inet', 'senders'], 'nft list')
    const bytes = {coordinator: {udp: 0, tcp: 0}, peers: {udp: 0, tcp: 0}}
    for (const m of out.matchAll(/ip saddr (!= )?\S+ meta l4proto (udp|tcp) counter packets \d+ bytes (\d+)/g))
      bytes[m[1] ? 'peers' : 'coordinator'][m[2] as 'udp' | 'tcp'] += Number(m[3])
    return bytes
  }

  /**
   * Starts counting, at a NATed host's router, the packets its host sends towards private addresses of other LANs
   * (10.0.0.0/8 outside its own /24): dials of other clients' private addresses, which on the internet lead nowhere.
   */
  countStrayPrivate(host: Host): void {
    if (!host.router) throw new Error(`${host.name} is not behind a NAT router`)
    const lan = host.ip.split('.').slice(0, 3).join('.')
    const rules = `table ip stray {
  chain pre { type filter hook prerouting priority -300; policy accept; ip saddr ${host.ip} ip daddr 10.0.0.0/8 ip daddr != ${lan}.0/24 counter; }
}
`
    sh(['ip', 'netns', 'exec', host.router, 'nft', '-f', '-'], 'nftables', {input: rules})
  }

  /** Packets counted by countStrayPrivate so far. */
  strayPrivatePackets(host: Host): number {
    const out = sh(['ip', 'netns', 'exec', host.router!, 'nft', 'list', 'table', 'ip', 'stray'], 'nft list')
    return [...out.matchAll(/counter packets (\d+)/g)].reduce((sum, m) => sum + Number(m[1]), 0)
  }

  /**
   * Limits a host's link to `mbit` Mbit/s in both directions (tbf on its interface and on the far end), or to `mbit`
   * up (what the host sends) and `downMbit` down (what it receives), as a home link is.
   */
  limitRate(host: Host, mbit: number, downMbit = mbit): void {
    const peerNs = host.router ?? this.switchNs
    const out = sh(['ip', '-n', host.ns, '-o', 'link', 'show', host.dev], 'link')
    const peerIndex = /@if(\d+)/.exec(out)?.[1]
    const peerDev = sh(['ip', '-n', peerNs, '-o', 'link'], 'links')
      .split('\n')
      .map((l) => /^(\d+):\s+([^@:]+)/.exec(l))
      .find((m) => m?.[1] === peerIndex)?.[2]
    if (!peerDev) throw new Error(`cannot find the far end of ${host.dev}`)
    const tbf = (rate: number) => ['root', 'tbf', 'rate', `${Math.round(rate * 1000)}kbit`, 'burst', '32kbit', 'latency', '400ms']
    sh(['ip', 'netns', 'exec', host.ns, 'tc', 'qdisc', 'add', 'dev', host.dev, ...tbf(mbit)], 'tc (egress)')
    sh(['ip', 'netns', 'exec', peerNs, 'tc', 'qdisc', 'add', 'dev', peerDev, ...tbf(downMbit)], 'tc (ingress)')
  }

  /**
   * Bytes through a host's link so far, read from the kernel's interface counters in its namespace (what its
   * network carried, whatever the processes say). For a NATed host, the WAN side of its router.
   */
  linkBytes(host: Host): {rx: number; tx: number} {
    const links = JSON.parse(sh(['ip', '-n', host.uplink.ns, '-j', '-s', 'link', 'show', 'dev', host.uplink.dev], 'link stats')) as {
      stats64?: {rx: {bytes: number}; tx: {bytes: number}}
    }[]
    const stats = links[0]?.stats64
    if (!stats) throw new Error(`no counters for ${host.name}'s link ${host.uplink.dev}`)
    return {rx: stats.rx.bytes, tx: stats.tx.bytes}
  }

  /** The command prefix that runs a program inside a host's namespace. */
  exec(host: Host, argv: string[]): string[] {
    return ['ip', 'netns', 'exec', host.ns, ...argv]
  }

  /** Kills whatever still runs in our namespaces (only processes we started live there), then deletes them. */
  destroySync(): void {
    if (this.destroyed) return
    this.destroyed = true
    live.delete(this)
    for (const ns of this.namespaces) {
      const pids = sh(['ip', 'netns', 'pids', ns], 'pids', {allowFail: true}).split(/\s+/).filter(Boolean)
      for (const pid of pids) {
        try {
          process.kill(Number(pid), 'SIGKILL')
        } catch {
          // already gone
        }
      }
    }
    for (const ns of [...this.namespaces].reverse()) sh(['ip', 'netns', 'del', ns], 'netns del', {allowFail: true})
  }

  /** The namespaces this lab still has (for the test that checks cleanup). */
  remaining(): string[] {
    const all = sh(['ip', 'netns', 'list'], 'netns list', {allowFail: true})
    return all
      .split('\n')
      .map((l) => l.split(' ')[0])
      .filter((n) => n.startsWith(`${this.prefix}-`))
  }
}
