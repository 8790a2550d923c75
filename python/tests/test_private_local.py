"""The worker keeps to this machine and this user: its ipc socket is the owner's only, and the data-parallel
rendezvous (torch's TCPStore) and collectives listen on loopback only."""

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq

from conftest import ROOT

LOOPBACK = {"0100007F", "00000000000000000000000001000000"}  # 127.0.0.1 and ::1 as /proc/net/tcp{,6} write them


def start_worker(tmp_path: Path, *args: str, umask: int | None = None) -> tuple[subprocess.Popen, str]:
    endpoint = f"ipc://{tmp_path}/w.sock"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "psyche_worker", "--endpoint", endpoint, "--threads", "1", *args],
        stdout=subprocess.PIPE,
        env=env,
        text=True,
        preexec_fn=(lambda: os.umask(umask)) if umask is not None else None,
    )
    ready = json.loads(proc.stdout.readline())
    assert ready["event"] == "ready", ready
    return proc, endpoint


def stop_worker(proc: subprocess.Popen, endpoint: str) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 30000)
    try:
        sock.connect(endpoint)
        sock.send_multipart([json.dumps({"op": "shutdown", "id": 1, "frames": []}).encode()])
        sock.recv_multipart()
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
        sock.close(0)
        ctx.term()


def descendants(pid: int) -> set[int]:
    out = {pid}
    grew = True
    while grew:
        grew = False
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) in out:
                continue
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid in out:
                out.add(int(entry))
                grew = True
    return out


def listening(pids: set[int]) -> list[tuple[str, int]]:
    """(local address in /proc/net hex, port) of every TCP socket these processes listen on."""
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            local, state, inode = cols[1], cols[3], cols[9]
            if state == "0A" and inode in inodes:
                address, port = local.split(":")
                found.append((address, int(port, 16)))
    return found


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc")
def test_data_parallel_rendezvous_and_collectives_listen_on_loopback_only(tmp_path):
    proc, endpoint = start_worker(tmp_path, "--device", "cpu,cpu")
    try:
        time.sleep(0.5)
        sockets = listening(descendants(proc.pid))
        assert sockets, "the 2-rank worker listens somewhere (the rendezvous store at least)"
        exposed = [s for s in sockets if s[0] not in LOOPBACK]
        assert exposed == [], f"listening beyond loopback: {exposed}"
    finally:
        stop_worker(proc, endpoint)


def test_ipc_socket_is_owner_only_whatever_the_umask(tmp_path):
    proc, endpoint = start_worker(tmp_path, umask=0)
    try:
        mode = stat.S_IMODE(os.stat(endpoint[len("ipc://") :]).st_mode)
        assert mode & 0o077 == 0, f"socket mode {oct(mode)} under umask 000"
    finally:
        stop_worker(proc, endpoint)
