"""A learning Ethernet switch in user space that holds every frame for a fixed time: the lab's segment with the
latency of an internet path (this kernel has no netem). Run inside the switch namespace:

    python3 delay_switch.py DELAY_MS

It takes every interface of its namespace but loopback as a port (new ones as they appear), reads frames with
AF_PACKET, learns which port each source MAC is behind, and sends each frame DELAY_MS later out of the port its
destination MAC was learned on (every other port for broadcasts and unknown destinations), as a kernel bridge
would, only later. PACKET_VNET_HDR carries the kernel's offload metadata (large segments, checksums still to be
filled in) through unchanged, so frames leave exactly as they came.
"""

import heapq
import select
import socket
import sys
import time

ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_VNET_HDR = 15
PACKET_OUTGOING = 4
VNET_HDR_BYTES = 10


def main() -> None:
    delay = float(sys.argv[1]) / 1000
    ports: dict[str, socket.socket] = {}
    by_fd: dict[int, str] = {}
    macs: dict[bytes, str] = {}
    queue: list[tuple[float, int, str, bytes]] = []
    seq = 0
    poller = select.poll()
    next_scan = 0.0
    print("delay switch up", flush=True)
    while True:
        now = time.monotonic()
        if now >= next_scan:
            next_scan = now + 0.02
            for _, name in socket.if_nameindex():
                if name == "lo" or name in ports:
                    continue
                s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
                s.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
                s.bind((name, 0))
                s.setblocking(False)
                ports[name] = s
                by_fd[s.fileno()] = name
                poller.register(s, select.POLLIN)
        wait = next_scan - now
        if queue:
            wait = min(wait, queue[0][0] - now)
        for fd, _ in poller.poll(max(0, wait) * 1000):
            name = by_fd[fd]
            s = ports[name]
            while True:
                try:
                    data, addr = s.recvfrom(65536 + VNET_HDR_BYTES)
                except BlockingIOError:
                    break
                except OSError:
                    break
                if addr[2] == PACKET_OUTGOING or len(data) < VNET_HDR_BYTES + 14:
                    continue
                frame = data[VNET_HDR_BYTES:]
                macs[frame[6:12]] = name
                seq += 1
                heapq.heappush(queue, (time.monotonic() + delay, seq, name, data))
        now = time.monotonic()
        while queue and queue[0][0] <= now:
            _, _, came_in, data = heapq.heappop(queue)
            dst = data[VNET_HDR_BYTES : VNET_HDR_BYTES + 6]
            out = macs.get(dst)
            targets = [out] if out is not None and not (dst[0] & 1) else [p for p in ports if p != came_in]
            for port in targets:
                if port == came_in or port not in ports:
                    continue
                try:
                    ports[port].send(data)
                except OSError:
                    pass


if __name__ == "__main__":
    main()
