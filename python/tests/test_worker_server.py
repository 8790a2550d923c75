"""The worker over a real ZeroMQ socket in a real subprocess."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from conftest import ROOT


class Client:
    def __init__(self, tmp_path: Path):
        self.endpoint = f"ipc://{tmp_path}/w.sock"
        env = {**os.environ, "PYTHONPATH": str(ROOT / "python")}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "psyche_worker", "--endpoint", self.endpoint, "--threads", "1"], stdout=subprocess.PIPE, env=env, text=True
        )
        ready = json.loads(self.proc.stdout.readline())
        assert ready["event"] == "ready"
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        # a request left unsent to a worker that died must not block the context's term (pytest's last gc)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVTIMEO, 60000)
        self.sock.connect(self.endpoint)
        self.next_id = 0

    def call(self, op, frames=(), **args):
        self.next_id += 1
        specs = [{"name": f"f{i}", "dtype": str(a.dtype), "shape": list(a.shape)} for i, a in enumerate(frames)]
        self.sock.send_multipart([json.dumps({"op": op, "id": self.next_id, "frames": specs, **args}).encode(), *[a.tobytes() for a in frames]])
        header, *rest = self.sock.recv_multipart()
        reply = json.loads(header)
        assert reply["id"] == self.next_id
        return reply, rest

    def close(self):
        try:
            self.call("shutdown")
        finally:
            self.proc.wait(10)
            self.sock.close(0)
            self.ctx.term()


@pytest.fixture
def client(tmp_path):
    c = Client(tmp_path)
    yield c
    if c.proc.poll() is None:
        c.close()
    else:
        c.sock.close(0)
        c.ctx.term()


def tokens(rows, seq, vocab, seed=0):
    return np.random.default_rng(seed).integers(0, vocab, size=(rows, seq + 1), dtype=np.uint32)


def test_train_loss_falls_and_hash_is_deterministic(client, tiny_config, tmp_path):
    r, _ = client.call("init_model", config=tiny_config, seed=7)
    assert r["ok"] and r["parameters"] > 1000
    first_hash = r["param_hash"]
    r, _ = client.call("init_model", config=tiny_config, seed=7)
    assert r["param_hash"] == first_hash, "same config and seed must give identical parameters"
    r, _ = client.call(
        "configure", optimizer={"AdamW": {"betas": [0.9, 0.95], "clip_grad_norm": 1.0}}, lr_schedule={"Constant": {"base_lr": 1e-2}}, micro_batch=2
    )
    assert r["ok"], r
    batch = tokens(4, 16, 64)
    losses = [client.call("train_step", [batch], step=s)[0]["loss"] for s in range(15)]
    assert losses[-1] < losses[0] - 0.5
    ev, _ = client.call("evaluate", [batch])
    assert ev["ok"] and ev["loss"] < losses[0]
    h, _ = client.call("param_hash")
    assert h["param_hash"] != first_hash


def test_export_import_roundtrip_and_save(client, tiny_config, tmp_path):
    client.call("init_model", config=tiny_config, seed=1)
    exported, frames = client.call("export_params")
    client.call("init_model", config=tiny_config, seed=2)
    arrays = [np.frombuffer(f, dtype=s["dtype"]).reshape(s["shape"]) for s, f in zip(exported["frames"], frames)]
    specs = exported["frames"]
    client.next_id += 1
    client.sock.send_multipart([json.dumps({"op": "import_params", "id": client.next_id, "frames": specs}).encode(), *[a.tobytes() for a in arrays]])
    reply = json.loads(client.sock.recv_multipart()[0])
    assert reply["ok"] and reply["param_hash"] == exported["param_hash"]
    saved, _ = client.call("save_model", dir=str(tmp_path / "m"))
    assert saved["ok"] and (tmp_path / "m" / "model.safetensors").is_file()
    loaded, _ = client.call("init_model", model_dir=str(tmp_path / "m"))
    assert loaded["param_hash"] == exported["param_hash"]
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path / "m"))
    assert hf.config.vocab_size == 64


def test_errors_are_typed_replies(client, tiny_config, tmp_path):
    r, _ = client.call("train_step", [tokens(1, 4, 64)])
    assert not r["ok"] and r["error"]["kind"] == "state"
    r, _ = client.call("no_such_op")
    assert not r["ok"] and r["error"]["kind"] == "protocol"
    r, _ = client.call("init_model", model_dir=str(tmp_path))
    assert not r["ok"] and "config.json" in r["error"]["message"]
    client.call("init_model", config=tiny_config, seed=0)
    r, _ = client.call("configure", optimizer={"Lion": {}})
    assert not r["ok"] and "Lion" in r["error"]["message"]
    client.call("configure", optimizer={"AdamW": {}})
    r, _ = client.call("train_step", [tokens(1, 4, 1000)])
    assert not r["ok"] and r["error"]["kind"] == "data" and "vocab" in r["error"]["message"]
    # a frame whose size disagrees with its header
    client.next_id += 1
    client.sock.send_multipart([json.dumps({"op": "evaluate", "id": client.next_id, "frames": [{"dtype": "uint32", "shape": [2, 5]}]}).encode(), b"\0" * 7])
    reply = json.loads(client.sock.recv_multipart()[0])
    assert not reply["ok"] and reply["error"]["kind"] == "protocol"
    # the worker is still alive and serving
    r, _ = client.call("hello")
    assert r["ok"]


def alive(pid: int) -> bool:
    """Whether a process runs: it exists and is not a zombie (exited, not yet reaped by whoever adopted it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def test_worker_exits_when_parent_dies(tmp_path):
    # a parent shell that starts the worker and is then killed: the worker must not outlive it
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python")}
    script = f"{sys.executable} -m psyche_worker --endpoint ipc://{tmp_path}/p.sock --threads 1 & echo $! ; wait"
    parent = subprocess.Popen(["bash", "-c", script], stdout=subprocess.PIPE, text=True, env=env)
    worker_pid = int(parent.stdout.readline())
    # the worker shares the shell's stdout: its ready line says it runs (and watches its parent), whatever the load
    assert json.loads(parent.stdout.readline())["event"] == "ready"
    parent.kill()
    parent.wait()
    for _ in range(120):
        if not alive(worker_pid):
            return
        time.sleep(0.25)
    os.kill(worker_pid, signal.SIGKILL)
    pytest.fail(f"the worker (pid {worker_pid}) outlived its killed parent by 30 s")
    pytest.fail("worker outlived its parent")
