"""The network path's combined op: train_round = forward/backward -> apply the previous round -> produce."""

import json

import numpy as np
import pytest
import torch

from psyche_worker.protocol import WorkerError
from psyche_worker.server import Worker

DISTRO = {"Distro": {"clip_grad_norm": 1.0, "compression_decay": 0.999, "compression_chunk": 16, "compression_topk": 4, "quantize_1bit": True}}


def worker(tiny_config) -> Worker:
    w = Worker("cpu", 1)
    w.op_init_model({"config": tiny_config, "seed": 7}, [])
    w.op_configure({"optimizer": DISTRO, "lr_schedule": {"Constant": {"base_lr": 1e-2, "warmup_steps": 0}}, "micro_batch": 4, "delay_correction": True}, [])
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
    specs = w.t.optimizer.peers[0].specs
    assert fmt["value_format"] == "sign"
    assert [t["name"] for t in fmt["tensors"]] == [s.name for s in specs] and len(specs) > 0
    assert all(t["topk"] <= 16 * 16 and max(t["chunk"]) <= 16 for t in fmt["tensors"])
    adamw, _ = w.op_configure({"optimizer": {"AdamW": {}}, "micro_batch": 4}, [])
    assert "result_format" not in adamw


def flip_signs(blob: bytes, w: Worker) -> bytes:
    """The result with every sign bit inverted (1-bit results: values are one bit each)."""
    from psyche_worker.distro_codec import decode_result, encode_result, EncodedTensor, VALUE_SIGN

    peer = w.t.optimizer.peers[0]
    decoded = decode_result(blob, peer.specs, VALUE_SIGN)
    out = []
    for d in decoded:
        negative = (d.values > 0).reshape(-1)  # flipped: previously positive values become negative
        out.append(EncodedTensor(d.spec, d.indices, np.packbits(negative, bitorder="little").tobytes()))
    return encode_result(out, VALUE_SIGN)


def test_score_results_measures_each_result_alone_and_changes_nothing(tiny_config):
    w = worker(tiny_config)
    train, other = tokens(11), tokens(12)
    _, out = w.op_train_round({"step": 1}, [train])
    blob = bytes(out[0])
    state_before = w.op_param_hash({}, [])[0]["param_hash"]
    momentum = [m.clone() for m in w.t.optimizer.peers[0].momentum]
    spec_params = [p.detach().clone() for p in w.t.optimizer.peers[0].params]
    reply, _ = w.op_score_results({"step": 1, "results": 3}, [result_frame(blob), result_frame(flip_signs(blob, w)), result_frame(b"junk"), train, other])
    (b_train, b_other), after = reply["before"], reply["after"]
    honest, flipped, junk = after
    assert junk is None
    # The honest update lowers the loss on the batch it was trained on; its negation raises it.
    assert honest[0] < b_train < flipped[0]
    assert (b_train - honest[0]) > (b_other - honest[1])
    # Nothing changed: committed parameters, speculation, momentum.
    assert w.op_param_hash({}, [])[0]["param_hash"] == state_before
    assert all(torch.equal(a, b) for a, b in zip(momentum, w.t.optimizer.peers[0].momentum))
    assert all(torch.equal(a, b.detach()) for a, b in zip(spec_params, w.t.optimizer.peers[0].params))


def test_score_results_own_batches_evaluates_each_result_on_its_batch_and_the_shared_one_only(tiny_config):
    w = worker(tiny_config)
    own_a, own_b, shared = tokens(21), tokens(22), tokens(23)
    _, out = w.op_train_round({"step": 1}, [own_a])
    blob = bytes(out[0])
    frames = [result_frame(blob), result_frame(flip_signs(blob, w)), own_a, own_b, shared]
    full, _ = w.op_score_results({"step": 1, "results": 2}, frames)
    calls = []
    evaluate = w.t.evaluate
    w.t.evaluate = lambda t, mask=None: (calls.append(t), evaluate(t, mask))[1]
    own, _ = w.op_score_results({"step": 1, "results": 2, "own_batches": True}, frames)
    # 3 batches before, then 2 per result: 7 evaluations (the full matrix costs 3 + 2 * 3 = 9).
    assert len(calls) == 7
    assert own["before"] == full["before"]
    assert own["after"] == [[full["after"][0][0], full["after"][0][2]], [full["after"][1][1], full["after"][1][2]]]
    with pytest.raises(WorkerError, match="own_batches needs 3 batches"):
        w.op_score_results({"step": 1, "results": 2, "own_batches": True}, frames[:4])


def test_a_refused_result_is_named_by_its_index_as_data(tiny_config):
    """The error reply names the refused result's position in the list sent ({"kind": "bad_result", "index": N}), so
    the client reads it as data; the message stays as people read it. Nothing is applied."""
    w = worker(tiny_config)
    good = bytes(w.op_train_round({"step": 1}, [tokens(1)])[1][0])
    start = w.op_param_hash({}, [])[0]["param_hash"]

    def request(op: str, header: dict, frames: list[bytes]) -> dict:
        specs = [{"name": f"r{i}", "dtype": "uint8", "shape": [len(f)]} for i, f in enumerate(frames)]
        reply, _, _ = w.handle([json.dumps({"op": op, "id": 9, **header, "frames": specs}).encode(), *frames])
        return reply

    for index in (0, 2):
        results = [good, good, good]
        results[index] = good[:-3]
        reply = request("apply_results", {"step": 1}, results)
        assert reply["ok"] is False and reply["error"]["kind"] == "bad_result" and reply["error"]["index"] == index
        assert reply["error"]["message"].startswith(f"rejected result: result {index}: truncated")
    assert w.op_param_hash({}, [])[0]["param_hash"] == start
    own = np.asarray(tokens(2), dtype=np.uint32)
    specs = [{"name": "tokens", "dtype": "uint32", "shape": list(own.shape)}, *({"name": "r", "dtype": "uint8", "shape": [len(f)]} for f in (good, b"junk"))]
    reply, _, _ = w.handle([json.dumps({"op": "train_round", "id": 10, "step": 2, "apply_step": 1, "frames": specs}).encode(), own.tobytes(), good, b"junk"])
    assert reply["error"] == {"kind": "bad_result", "message": reply["error"]["message"], "index": 1} and "result 1:" in reply["error"]["message"]
    # an error without structured fields has none
    reply, _, _ = w.handle([json.dumps({"op": "finish_round", "id": 11, "step": 5, "frames": []}).encode()])
    assert set(reply["error"]) == {"kind", "message"} and reply["error"]["kind"] == "state"
