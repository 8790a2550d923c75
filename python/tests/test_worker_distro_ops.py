"""The network path's combined op: train_round = forward/backward -> apply the previous round -> produce."""

import numpy as np
import pytest
import torch

from psyche_worker.protocol import WorkerError
from psyche_worker.server import Worker

DISTRO = {"Distro": {"clip_grad_norm": 1.0, "compression_decay": 0.999, "compression_chunk": 16,
                     "compression_topk": 4, "quantize_1bit": True}}


def worker(tiny_config) -> Worker:
    w = Worker("cpu", 1)
    w.op_init_model({"config": tiny_config, "seed": 7}, [])
    w.op_configure({"optimizer": DISTRO, "lr_schedule": {"Constant": {"base_lr": 1e-2, "warmup_steps": 0}},
                    "micro_batch": 4, "delay_correction": True}, [])
    return w


def tokens(seed: int) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).integers(0, 64, size=(4, 17), dtype=np.int64))


def result_frame(blob) -> torch.Tensor:
    return torch.frombuffer(bytearray(bytes(blob)), dtype=torch.uint8)


def test_train_round_keeps_replicas_identical(tiny_config):
    a, b, observer = worker(tiny_config), worker(tiny_config), worker(tiny_config)
    start = observer.op_param_hash({}, [])[0]["param_hash"]
    ra1 = a.op_train_round({"step": 1}, [tokens(1)])
    rb1 = b.op_train_round({"step": 1}, [tokens(2)])
    # nothing applied yet: the committed parameters are the initial ones (speculation excluded)
    assert ra1[0]["param_hash"] == start and ra1[0]["applied"] == 0
    blobs = [result_frame(ra1[1][0]), result_frame(rb1[1][0])]
    # round 2 applies round 1's results, given in different orders on the two replicas
    ra2 = a.op_train_round({"step": 2, "apply_step": 1}, [tokens(3), *blobs])
    rb2 = b.op_train_round({"step": 2, "apply_step": 1}, [tokens(4), *reversed(blobs)])
    applied = observer.op_apply_results({"step": 1}, blobs)[0]["param_hash"]
    assert ra2[0]["applied"] == 2
    assert ra2[0]["param_hash"] == rb2[0]["param_hash"] == applied != start
    assert np.isfinite(ra2[0]["loss"]) and ra2[0]["result_bytes"] == len(ra2[1][0]) > 0


def test_train_round_rejects_results_without_their_step(tiny_config):
    a = worker(tiny_config)
    blob = result_frame(a.op_train_round({"step": 1}, [tokens(1)])[1][0])
    with pytest.raises(WorkerError, match="without apply_step"):
        a.op_train_round({"step": 2}, [tokens(2), blob])
    with pytest.raises(WorkerError, match="1-D uint8"):
        a.op_train_round({"step": 2, "apply_step": 1}, [tokens(2), tokens(3)])


def test_configure_reports_the_result_format_peers_must_send(tiny_config):
    """The client validates peers' results against this (src/core/verify/result.ts): it must describe
    exactly what produce() makes and decode() accepts."""
    w = Worker("cpu", 1)
    w.op_init_model({"config": tiny_config, "seed": 7}, [])
    reply, _ = w.op_configure({"optimizer": DISTRO, "micro_batch": 4, "delay_correction": True}, [])
    fmt = reply["result_format"]
    specs = w.t.distro_peers[0].specs
    assert fmt["value_format"] == "sign"
    assert [t["name"] for t in fmt["tensors"]] == [s.name for s in specs] and len(specs) > 0
    assert all(t["topk"] <= 16 * 16 and max(t["chunk"]) <= 16 for t in fmt["tensors"])
    adamw, _ = w.op_configure({"optimizer": {"AdamW": {}}, "micro_batch": 4}, [])
    assert "result_format" not in adamw
