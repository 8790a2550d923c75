"""SparseLoCo: the wire format (every shape, canonical, decoded strictly), the optimizer's rounds (replicas bit-identical
in any order, the one-round delay with its speculation, verification, resuming), and its size against τemplar's."""

import copy
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from psyche_worker import optim
from psyche_worker import sparseloco_codec as codec
from psyche_worker.model import hash_named_tensors, init_model
from psyche_worker.optim.base import BuildContext
from psyche_worker.protocol import WorkerError
from psyche_worker.server import Worker
from psyche_worker.trainer import Trainer

SCHEDULE = {"Constant": {"base_lr": 1e-2}}
SPARSELOCO = {"SparseLoCo": {"inner_steps": 3, "chunk": 8, "topk": 4, "outer_lr": 0.5}}
SHAPES = [
    ("a.matrix", (40, 24)),
    ("b.vector", (16,)),
    ("c.prime", (67,)),  # a 1-D tensor of prime length above the chunk: τemplar's topk raises on it
    ("d.experts", (3, 16, 12)),  # a mixture of experts' fused [E, R, C]
    ("e.four_d", (2, 2, 8, 8)),
    ("f.tiny", (5, 3)),
]


def layouts(chunk=8, topk=4):
    return [codec.layout_for(n, s, chunk, topk) for n, s in SHAPES]


def tokens(seed: int, rows: int = 6) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).integers(0, 64, size=(rows, 17), dtype=np.int64))


def trainer(config, optimizer=SPARSELOCO, **kw) -> Trainer:
    t = Trainer(init_model(config, 0), torch.device("cpu"))
    t.configure(optimizer, SCHEDULE, micro_batch=2, **kw)
    return t


def hashed(t: Trainer) -> str:
    return hash_named_tensors(t.replicated_parameters())


def encoded(seed: int, value_bits: int = 2, dct: bool = False, chunk=8, topk=4) -> tuple[bytes, list[codec.TensorLayout], bytes]:
    ls = layouts(chunk, topk)
    lid = codec.layout_id(ls, value_bits, dct)
    g = torch.Generator().manual_seed(seed)
    comp = [codec.compress(torch.randn(t.shape, generator=g), t, value_bits, dct) for t in ls]
    return codec.encode(comp, value_bits, dct, lid), ls, lid


# ---------------------------------------------------------------- the wire format


def test_every_shape_has_a_layout_and_round_trips():
    ls = layouts()
    by = {t.name: t for t in ls}
    assert by["c.prime"].chunk == (1,) and by["c.prime"].dense
    assert by["d.experts"].chunk == (1, 8, 6) and by["d.experts"].n_chunks == 3 * 2 * 2
    assert by["e.four_d"].chunk == (1, 1, 8, 8) and by["e.four_d"].n_chunks == 4
    assert not by["b.vector"].dense and by["b.vector"].n_chunks == 2  # top-4 of 8: indices are sent
    for value_bits in (1, 2, 3, 8):
        for dct in (False, True):
            data, ls, lid = encoded(1, value_bits, dct)
            assert len(data) == codec.result_size(ls, value_bits)
            decoded = codec.decode(data, ls, value_bits, dct, lid)
            g = torch.Generator().manual_seed(1)
            for t, d in zip(ls, decoded):
                c = codec.compress(torch.randn(t.shape, generator=g), t, value_bits, dct)
                assert torch.equal(d.levels, c.levels) and torch.equal(d.codes, c.codes.long().reshape(d.codes.shape))
                assert (d.indices is None) == (c.indices is None)
                if c.indices is not None:
                    assert torch.equal(d.indices, c.indices)
                # what peers decode is what the producer subtracts from its error feedback
                back = codec.from_chunks(codec.idct_chunks(c.dense_chunks(), t) if dct else c.dense_chunks(), t)
                assert torch.equal(back, codec.transmitted(c, dct))


def test_dense_only_where_every_element_is_selected():
    """A chunk whose top-k is all of it carries no indices; any other keeps τemplar's selection."""
    assert codec.layout_for("v", (128,), 64, 64).dense  # τemplar: 2 chunks of 64, top-64 of each, with 12-bit indices
    assert not codec.layout_for("m", (128, 128), 64, 64).dense
    assert codec.layout_for("odd", (63,), 64, 64).topk == 62 and not codec.layout_for("odd", (63,), 64, 64).dense


def mutate(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    kind = rng.randrange(6)
    if kind == 0:
        i = rng.randrange(len(b))
        b[i] ^= 1 << rng.randrange(8)
    elif kind == 1:
        b[rng.randrange(len(b))] = rng.randrange(256)
    elif kind == 2:
        b = b[: rng.randrange(len(b))]
    elif kind == 3:
        b += bytes([rng.randrange(256)])
    elif kind == 4:
        i = rng.randrange(max(0, len(b) - 24), len(b))
        b[i] ^= 1 << rng.randrange(8)
    else:
        for _ in range(rng.randrange(1, 5)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    return bytes(b)


def test_the_decoder_is_strict_and_the_encoding_canonical():
    """Thousands of mutated results: each is refused, or decodes to a content whose encoding is those very bytes
    (so one content has one byte string, and a commitment hash identifies it)."""
    data, ls, lid = encoded(2)
    rng = random.Random(7)
    refused = accepted = 0
    for _ in range(1500):
        bad = mutate(rng, data)
        try:
            decoded = codec.decode(bad, ls, 2, False, lid)
        except codec.ResultDecodeError:
            refused += 1
            continue
        accepted += 1
        again = [codec.Compressed(d.layout, d.indices, d.codes.to(torch.uint8), d.levels) for d in decoded]
        assert codec.encode(again, 2, False, lid) == bad
    assert refused > 500 and accepted > 100  # codes and low bits take any value, levels any finite float
    for junk in (b"", b"PSSL", bytes(len(data)), data[:-1], data + b"\0", "text"):
        with pytest.raises(codec.ResultDecodeError):
            codec.decode(junk, ls, 2, False, lid)
    with pytest.raises(codec.ResultDecodeError, match="value_bits 2 does not match the run's 3"):
        codec.decode(data, ls, 3, False, lid)
    with pytest.raises(codec.ResultDecodeError, match="layout id"):
        codec.decode(data, ls, 2, False, b"\0" * 8)


def test_decode_names_what_is_wrong():
    data, ls, lid = encoded(3)
    b = bytearray(data)
    nan = bytes(np.array([np.nan], dtype="<f4").tobytes())
    b[codec.HEADER_BYTES : codec.HEADER_BYTES + 4] = nan
    with pytest.raises(codec.ResultDecodeError, match="non-finite level"):
        codec.decode(bytes(b), ls, 2, False, lid)
    # the first tensor's first upper byte: clear its bits, so its first chunk holds fewer than k indices
    levels = 4 * 4 * len(ls)
    b = bytearray(data)
    b[codec.HEADER_BYTES + levels] = 0
    with pytest.raises(codec.ResultDecodeError, match=r"tensor 0 \('a.matrix'\): a chunk does not hold exactly 4 indices"):
        codec.decode(bytes(b), ls, 2, False, lid)


def test_smaller_than_templars_wire_format_on_the_demo_model():
    """The demo model's shapes at τemplar's settings (chunk 64, top-64, 2-bit): our bytes against what τemplar's
    miner uploads for the same tensors (fixtures: torch.save of idxs, vals and quant_params, and their payload)."""
    theirs = json.loads((Path(__file__).parent / "fixtures" / "templar_vectors.json").read_text())["theirs_demo"]
    config = json.loads((Path(__file__).parents[2] / "templates" / "tiny-demo" / "model" / "config.json").read_text())
    model = init_model(config, 0)
    ls = [codec.layout_for(n, tuple(p.shape), 64, 64) for n, p in sorted(model.named_parameters())]
    ours = codec.result_size(ls, 2)
    assert sum(t.numel for t in ls) == theirs["parameters"]
    assert ours < 0.6 * theirs["payload_bytes"] < theirs["torch_save_bytes"]


# ---------------------------------------------------------------- the optimizer


def test_config_is_validated_by_field(tiny_config):
    t = Trainer(init_model(tiny_config, 0), torch.device("cpu"))
    ctx = BuildContext(t.model, t.device, lambda step: 1e-3)
    assert isinstance(optim.build_optimizer({"SparseLoCo": {}}, ctx), optim.CommunicatingOptimizer)
    for bad, field in [
        ({"inner_steps": 0}, "inner_steps"),
        ({"value_bits": 9}, "value_bits"),
        ({"outer_lr": 0}, "outer_lr"),
        ({"error_feedback_decay": 1.5}, "error_feedback_decay"),
        ({"topk": 65, "chunk": 8}, "topk"),
        ({"chunk": 4097}, "chunk"),
        ({"dct": 1}, "dct"),
        ({"inner": {"betas": [0.9]}}, "inner: optimizer.AdamW.betas"),
        ({"lookahead": 1}, "unknown field"),
    ]:
        with pytest.raises(WorkerError, match=f"optimizer.SparseLoCo: .*{field}"):
            optim.build_optimizer({"SparseLoCo": bad}, ctx)


def test_replicas_stay_bit_identical_whatever_the_order_and_every_round_changes_the_model(tiny_config):
    clients = [trainer(tiny_config, delay_correction=True) for _ in range(3)]
    start = hashed(clients[0])
    previous: list[bytes] = []
    rng = random.Random(3)
    for step in range(1, 5):
        results = []
        for i, c in enumerate(clients):
            order = previous[:]
            rng.shuffle(order)
            stats, result = c.train_round(tokens(10 * step + i), step, step - 1 if previous else None, order)
            assert stats["tokens"] == 6 * 16 and stats["result_bytes"] == len(result)
            results.append(result)
        assert len({hashed(c) for c in clients}) == 1
        previous = results
    before = hashed(clients[0])
    for c in clients:
        c.apply_results(previous[::-1], 4)
    assert len({hashed(c) for c in clients}) == 1 and hashed(clients[0]) not in (start, before)


def test_one_client_with_the_delay_follows_the_undelayed_trajectory_bit_for_bit(tiny_config):
    undelayed, delayed = trainer(tiny_config), trainer(tiny_config, delay_correction=True)
    previous = None
    for step in range(1, 6):
        a = undelayed.train_step(tokens(step), step)
        b, previous_result = delayed.train_round(tokens(step), step, None if previous is None else step - 1, [] if previous is None else [previous])
        previous = previous_result
        assert a["loss"] == b["loss"]
    assert delayed.optimizer._committed is not None  # speculating with the last result, which nobody applied yet
    delayed.apply_results([previous], 5)
    assert hashed(undelayed) == hashed(delayed)


def test_simulated_clients_with_and_without_the_delay(tiny_config):
    """4 simulated clients: each its own inner AdamW and error feedback; the delayed simulation starts each client's
    inner steps from the parameters before the last round's results, moved by its own result, as the network does."""
    runs = {}
    for delayed in (False, True):
        t = trainer(tiny_config, simulate_peers=4, delay_correction=delayed)
        for step in range(4):
            out = t.train_step(tokens(step, rows=8), step)
        assert out["result_bytes"] > 0
        runs[delayed] = hashed(t)
    assert runs[False] != runs[True]
    with pytest.raises(WorkerError, match="does not split evenly among 4 simulated peers"):
        trainer(tiny_config, simulate_peers=4).train_step(tokens(0, rows=6), 0)


def test_apply_refuses_a_bad_result_by_index_and_changes_nothing(tiny_config):
    a, b = trainer(tiny_config, delay_correction=True), trainer(tiny_config, delay_correction=True)
    _, ra = a.train_round(tokens(1), 1, None, [])
    _, rb = b.train_round(tokens(2), 1, None, [])
    before = hashed(a)
    live = [p.detach().clone() for p in a.model.parameters()]
    with pytest.raises(WorkerError, match="rejected result: result 1") as refused:
        a.apply_results([ra, rb[:-1], rb], 1)
    assert refused.value.kind == "bad_result" and refused.value.fields == {"index": 1}
    assert hashed(a) == before and all(torch.equal(p, q) for p, q in zip(a.model.parameters(), live))


def test_score_measures_each_result_alone_and_changes_nothing(tiny_config):
    clients = [trainer(tiny_config, delay_correction=True) for _ in range(2)]
    results = [c.train_round(tokens(5 + i), 1, None, [])[1] for i, c in enumerate(clients)]
    verifier = clients[0]
    live = [p.detach().clone() for p in verifier.model.parameters()]
    before_hash = hashed(verifier)
    scored = verifier.score_results([results[0], b"junk", results[1]], 1, [tokens(5), tokens(7), tokens(6), tokens(99)], own_batches=False)
    assert scored["after"][1] is None and len(scored["after"][0]) == 4 and scored["lr"] == 0.5
    assert scored["after"][0][0] < scored["before"][0]  # its own batch: the loss it removes
    assert hashed(verifier) == before_hash and all(torch.equal(p, q) for p, q in zip(verifier.model.parameters(), live))


def test_state_dict_resumes_rounds_bit_for_bit_with_a_speculation_pending(tiny_config):
    a = trainer(tiny_config, delay_correction=True)
    previous = None
    for step in range(1, 4):
        _, previous = a.train_round(tokens(step), step, None if previous is None else step - 1, [] if previous is None else [previous])
    live = [p.detach().clone() for _, p in sorted(a.model.named_parameters())]
    state = copy.deepcopy(a.optimizer.state_dict())

    def resumed(load: bool) -> Trainer:
        b = trainer(tiny_config, delay_correction=True)
        with torch.no_grad():
            for (_, p), saved in zip(sorted(b.model.named_parameters()), live):
                p.copy_(saved)
        if load:
            b.optimizer.load_state_dict(state)
        return b

    b, fresh = resumed(True), resumed(False)
    assert hashed(a) == hashed(b) != hashed(fresh)
    for step in range(4, 7):
        ra, rb = (t.train_round(tokens(step), step, step - 1, [previous])[1] for t in (a, b))
        assert ra == rb
        previous = ra
    with pytest.raises(ValueError, match="format"):
        b.optimizer.load_state_dict({"peers": []})
    with pytest.raises(ValueError, match="expected 1 peers"):
        b.optimizer.load_state_dict({**state, "peers": []})


def test_the_worker_serves_it_and_reports_its_result_format(tiny_config):
    w = Worker("cpu", 1)
    w.op_init_model({"config": tiny_config, "seed": 7}, [])
    reply, _ = w.op_configure({"optimizer": SPARSELOCO, "lr_schedule": SCHEDULE, "micro_batch": 2, "delay_correction": True}, [])
    fmt = reply["result_format"]
    assert reply["optimizer"] == "SparseLoCo" and fmt["format"] == "sparseloco" and fmt["value_bits"] == 2 and len(fmt["layout_id"]) == 16
    ls = [codec.TensorLayout(t["name"], tuple(t["shape"]), tuple(t["chunk"]), t["topk"]) for t in fmt["tensors"]]
    w.op_begin_round({"step": 1}, [tokens(1)])
    out, frames = w.op_finish_round({"step": 1}, [])
    assert len(bytes(frames[0])) == codec.result_size(ls, 2) == out["result_bytes"]
