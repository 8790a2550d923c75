"""Data parallelism inside one client: one worker, N ranks (Psyche's data parallelism within a client).

The client starts one worker with ``--device cuda:0,cuda:1`` (or ``cpu,cpu``). That process is rank 0: it
serves the client over ZeroMQ as always, starts ranks 1..N-1 as child processes (``--follower``), and joins
them in a ``torch.distributed`` group: NCCL between GPUs, gloo on CPU. Every request rank 0 receives is
broadcast to the followers (over a gloo group) before rank 0 runs it, so all ranks execute the same ops on
the same inputs in the same order. Only ``forward_backward`` differs per rank: each takes a contiguous shard
of the batch's rows, and the gradients (and the loss) are summed across ranks with one all-reduce before
anything reads them. From there on every rank holds identical gradients and runs the identical optimizer
step, so parameters stay identical on all ranks; only rank 0 answers, writes files, and reports hashes.
The rest of the system sees one client, one result and one parameter hash.
"""

from __future__ import annotations

import datetime
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from .protocol import WorkerError


@dataclass
class Group:
    rank: int
    world: int
    #: all-reduce of gradients: the default group (NCCL on GPUs, gloo on CPU)
    data: Any
    #: requests from rank 0 to the followers: always gloo (Python objects on the CPU)
    control: Any

    def shard(self, rows: int) -> tuple[int, int]:
        """This rank's contiguous rows [start, end) of a batch of `rows`: sizes differ by at most one."""
        base, extra = divmod(rows, self.world)
        start = self.rank * base + min(self.rank, extra)
        return start, start + base + (1 if self.rank < extra else 0)

    def all_reduce_sum(self, tensors: list[torch.Tensor]) -> None:
        """Sums `tensors` across ranks in place, as one flat buffer (one collective per step)."""
        if not tensors:
            return
        flat = torch.cat([t.reshape(-1) for t in tensors])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.data)
        offset = 0
        for t in tensors:
            n = t.numel()
            t.copy_(flat[offset : offset + n].view_as(t))
            offset += n

    def broadcast_request(self, parts: list[bytes] | None) -> list[bytes]:
        """Rank 0 sends a request's raw frames; followers receive them. Returns the frames on every rank."""
        box = [parts]
        dist.broadcast_object_list(box, src=0, group=self.control)
        return box[0]


def parse_devices(spec: str, data_parallel: int = 1) -> list[str]:
    """``cuda:0,cuda:1`` -> one device per rank; a single name -> one rank, or `data_parallel` ranks: on CPU
    that many CPU ranks, on CUDA (or auto with a GPU) GPUs 0..N-1."""
    if data_parallel < 1:
        raise WorkerError(f"--data-parallel {data_parallel}: must be ≥ 1", kind="device")
    devices = [d.strip() for d in spec.split(",")]
    if data_parallel > 1:
        if len(devices) > 1 and len(devices) != data_parallel:
            raise WorkerError(f"--data-parallel {data_parallel} with {len(devices)} devices ({spec}): give one or the other", kind="device")
        if len(devices) == 1:
            one = devices[0]
            if one == "auto":
                one = "cuda" if torch.cuda.is_available() else "cpu"
            if one == "cpu":
                devices = ["cpu"] * data_parallel
            elif one == "cuda":
                devices = [f"cuda:{i}" for i in range(data_parallel)]
            else:
                raise WorkerError(f"--data-parallel {data_parallel} with device {one!r}: use --device cpu or cuda, or list the devices", kind="device")
    if any(not d for d in devices):
        raise WorkerError(f"device list {spec!r}: empty entry (expected e.g. cuda:0,cuda:1)", kind="device")
    kinds = {d.split(":")[0] for d in devices}
    if len(devices) > 1 and (len(kinds) != 1 or kinds - {"cpu", "cuda"}):
        raise WorkerError(f"device list {spec!r}: all ranks must be cpu, or all cuda", kind="device")
    cuda = [d for d in devices if d.startswith("cuda")]
    if len(cuda) > 1 and len(set(cuda)) != len(cuda):
        raise WorkerError(f"device list {spec!r}: each GPU may appear once", kind="device")
    return devices


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listen_loopback(port: int = 0, backlog: int = 64) -> socket.socket:
    """The rendezvous listener, bound to 127.0.0.1 (on a free port by default): torch's TCPStore, left to
    itself, listens on every interface, where anyone on the network could read and write the group's keys."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", port))
    s.listen(backlog)
    return s


def keep_collectives_on_loopback() -> None:
    """gloo and NCCL open sockets of their own between ranks: all ranks are on this machine, so loopback."""
    names = {name for _, name in socket.if_nameindex()} if hasattr(socket, "if_nameindex") else set()
    loopback = "lo" if "lo" in names else "lo0" if "lo0" in names else None
    if loopback:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", loopback)
        os.environ.setdefault("NCCL_SOCKET_IFNAME", loopback)


def start_followers(devices: list[str], threads: int | None, port: int, precision: str = "auto", shard: bool = False) -> list[subprocess.Popen]:
    """Ranks 1..N-1 as child processes of rank 0 (they exit when it does: see server.die_with_parent)."""
    procs = []
    for rank in range(1, len(devices)):
        args = [
            sys.executable,
            "-m",
            "psyche_worker",
            "--follower",
            "--rank",
            str(rank),
            "--world",
            str(len(devices)),
            "--master-port",
            str(port),
            "--device",
            devices[rank],
            "--precision",
            precision,
            "--endpoint",
            "-",
        ]
        if threads:
            args += ["--threads", str(threads)]
        if shard:
            args += ["--shard", str(len(devices))]
        procs.append(subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=os.environ.copy()))
    return procs


def join_group(rank: int, world: int, port: int, device: torch.device, listener: socket.socket | None = None) -> Group:
    """Joins the ranks' group. Rank 0 serves the rendezvous store on `listener` (loopback only); the others
    connect to it on 127.0.0.1:`port`."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    keep_collectives_on_loopback()
    timeout = datetime.timedelta(seconds=300)
    if rank == 0:
        listener = listener or listen_loopback(port)
        # the store owns the descriptor from here on (detach: the socket object's collection must not close it)
        store = dist.TCPStore("127.0.0.1", port, world, True, timeout=timeout, master_listen_fd=listener.detach())
    else:
        store = dist.TCPStore("127.0.0.1", port, world, False, timeout=timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
    control = dist.new_group(backend="gloo") if backend != "gloo" else dist.group.WORLD
    return Group(rank=rank, world=world, data=dist.group.WORLD, control=control)
