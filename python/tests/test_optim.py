"""The optimizer interface (psyche_worker/optim/): the registry, state_dict / load_state_dict, and a communicating
optimizer that is not DisTrO plugging in beside it with no change to the trainer or the server."""

import copy
import struct

import numpy as np
import pytest
import torch

from psyche_worker import optim
from psyche_worker.model import hash_named_tensors, init_model
from psyche_worker.optim.base import Batch, BuildContext, CommunicatingOptimizer, clip_grad_norm, read
from psyche_worker.protocol import WorkerError
from psyche_worker.server import Worker
from psyche_worker.trainer import Trainer

SCHEDULE = {"Constant": {"base_lr": 1e-2}}
DISTRO = {"Distro": {"clip_grad_norm": 1.0, "compression_decay": 0.9, "compression_chunk": 8, "compression_topk": 2, "quantize_1bit": True}}


def tokens(seed: int, rows: int = 4) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).integers(0, 64, size=(rows, 17), dtype=np.int64))


def trainer(config, optimizer, **kw) -> Trainer:
    t = Trainer(init_model(config, 0), torch.device("cpu"))
    t.configure(optimizer, SCHEDULE, micro_batch=2, **kw)
    return t


def hashed(t: Trainer) -> str:
    return hash_named_tensors(t.replicated_parameters())


def test_the_registry_builds_by_name_and_names_what_it_knows(tiny_config):
    t = Trainer(init_model(tiny_config, 0), torch.device("cpu"))
    ctx = BuildContext(t.model, t.device, lambda step: 1e-3)
    assert isinstance(optim.build_optimizer({"AdamW": {}}, ctx), optim.Optimizer)
    assert isinstance(optim.build_optimizer({"Distro": None}, ctx), CommunicatingOptimizer)
    with pytest.raises(WorkerError, match="expected AdamW, Distro or SparseLoCo") as unknown:
        optim.build_optimizer({"Lion": {}}, ctx)
    assert unknown.value.kind == "unsupported"
    with pytest.raises(WorkerError, match="exactly one of AdamW, Distro, SparseLoCo"):
        optim.build_optimizer({"AdamW": {}, "Distro": {}}, ctx)
    with pytest.raises(WorkerError, match="optimizer.Distro: .*compression_topk"):
        optim.build_optimizer({"Distro": {"compression_topk": 0}}, ctx)
    with pytest.raises(WorkerError, match="simulate_peers needs an optimizer that exchanges results"):
        optim.build_optimizer({"AdamW": {}}, BuildContext(t.model, t.device, lambda step: 1e-3, simulate_peers=2))


def test_an_optimizer_that_trains_alone_refuses_the_network_ops(tiny_config):
    t = trainer(tiny_config, {"AdamW": {}})
    for call in (lambda: t.begin_round(tokens(1), 1), lambda: t.apply_results([], 1), lambda: t.score_results([], 1, [tokens(1)])):
        with pytest.raises(WorkerError, match="needs an optimizer that exchanges results; AdamW trains alone") as refused:
            call()
        assert refused.value.kind == "state"
    assert t.result_format() is None


def test_adamw_state_dict_resumes_training_bit_for_bit(tiny_config):
    a = trainer(tiny_config, {"AdamW": {"clip_grad_norm": 1.0, "weight_decay": 0.1}})
    for step in range(3):
        a.train_step(tokens(step), step)
    params = [p.clone() for _, p in a.replicated_parameters()]
    state = copy.deepcopy(a.optimizer.state_dict())

    def resumed(load: bool) -> Trainer:
        b = trainer(tiny_config, {"AdamW": {"clip_grad_norm": 1.0, "weight_decay": 0.1}})
        with torch.no_grad():
            for (_, p), saved in zip(sorted(b.model.named_parameters()), params):
                p.copy_(saved)
        if load:
            b.optimizer.load_state_dict(state)
        return b

    b, fresh = resumed(True), resumed(False)
    assert hashed(a) == hashed(b) == hashed(fresh)
    for step in range(3, 6):
        assert a.train_step(tokens(step), step) == b.train_step(tokens(step), step)
        fresh.train_step(tokens(step), step)
    assert hashed(a) == hashed(b) != hashed(fresh)


def test_distro_state_dict_resumes_rounds_bit_for_bit_with_a_speculation_pending(tiny_config):
    a = trainer(tiny_config, DISTRO, delay_correction=True)
    previous = None
    for step in range(1, 4):
        _, result = a.train_round(tokens(step), step, None if previous is None else step - 1, [] if previous is None else [previous])
        previous = result
    assert a.optimizer.peers[0].speculating
    live = [p.detach().clone() for _, p in sorted(a.model.named_parameters())]
    state = a.optimizer.state_dict()

    def resumed(load: bool) -> Trainer:
        b = trainer(tiny_config, DISTRO, delay_correction=True)
        with torch.no_grad():
            for (_, p), saved in zip(sorted(b.model.named_parameters()), live):
                p.copy_(saved)
        if load:
            b.optimizer.load_state_dict(state)
        return b

    b, fresh = resumed(True), resumed(False)
    assert hashed(a) == hashed(b) != hashed(fresh)  # the committed parameters travel in the state
    for step in range(4, 7):
        ra, rb = (t.train_round(tokens(step), step, step - 1, [previous])[1] for t in (a, b))
        assert ra == rb
        previous = ra
    assert hashed(a) == hashed(b)
    with pytest.raises(ValueError, match="expected 1 peers' states"):
        b.optimizer.load_state_dict({**state, "peers": []})
    with pytest.raises(ValueError, match="format"):
        b.optimizer.load_state_dict(a.optimizer.peers[0].state_dict())


class DenseMean(CommunicatingOptimizer):
    """Plain data-parallel SGD as a communicating optimizer: a result is every gradient times the LR, dense float32
    after an 8-byte header; apply subtracts the mean of the results. Not DisTrO in any part, so the trainer and the
    server meet it only through the interface."""

    name = "DenseMean"

    def __init__(self, ctx: BuildContext):
        super().__init__(ctx.model)
        self.schedule = ctx.schedule
        self.params = [p for _, p in sorted(ctx.model.named_parameters())]
        self.size = sum(p.numel() for p in self.params)

    @classmethod
    def build(cls, config, ctx):
        if config:
            raise WorkerError(f"optimizer.DenseMean: unknown field(s) {sorted(config)}")
        return cls(ctx)

    def step(self, batch, step, gradients):
        stats = self.begin_round(batch, step, gradients)
        result, more = self.produce(step)
        self.apply([result], step)
        return {**stats, **more}

    def begin_round(self, batch, step, gradients):
        return {"loss": float(gradients(batch)), "grad_norm": 0.0}

    def produce(self, step):
        lr = self.schedule(step)
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in self.params]) * lr
        return b"DMv1" + struct.pack("<I", self.size) + flat.numpy().tobytes(), {"lr": lr}

    def _decode(self, i, result):
        if len(result) != 8 + 4 * self.size or result[:4] != b"DMv1":
            raise WorkerError(f"rejected result: result {i}: not a DenseMean result of {self.size} values", kind="bad_result", index=i)
        return torch.from_numpy(np.frombuffer(result, dtype=np.float32, offset=8).copy())

    @torch.no_grad()
    def _subtract(self, flat):
        offset = 0
        for p in self.params:
            p.sub_(flat[offset : offset + p.numel()].reshape(p.shape))
            offset += p.numel()

    def apply(self, results, step):
        decoded = [self._decode(i, r) for i, r in enumerate(results)]
        if decoded:
            self._subtract(torch.stack(decoded).mean(0))

    def score(self, results, step, losses):
        saved = [p.detach().clone() for p in self.params]
        before, after = losses(None), []
        for j, result in enumerate(results):
            try:
                flat = self._decode(j, result)
            except WorkerError:
                after.append(None)
                continue
            self._subtract(flat)
            after.append(losses(j))
            with torch.no_grad():
                for p, s in zip(self.params, saved):
                    p.copy_(s)
        return {"before": before, "after": after, "lr": self.schedule(step)}

    def result_format(self):
        return {"dense_mean": self.size}

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


def test_a_second_communicating_optimizer_plugs_in_with_no_change_to_trainer_or_server(tiny_config, monkeypatch):
    monkeypatch.setitem(optim.OPTIMIZERS, "DenseMean", DenseMean.build)
    workers = []
    for _ in range(2):
        w = Worker("cpu", 1)
        w.op_init_model({"config": tiny_config, "seed": 7}, [])
        reply, _ = w.op_configure({"optimizer": {"DenseMean": {}}, "lr_schedule": SCHEDULE, "micro_batch": 2, "delay_correction": True}, [])
        assert reply["optimizer"] == "DenseMean" and reply["result_format"]["dense_mean"] > 1000
        workers.append(w)
    start = workers[0].op_param_hash({}, [])[0]["param_hash"]
    previous = None
    for step in range(1, 4):
        replies = []
        for i, w in enumerate(workers):
            header = {"step": step} if previous is None else {"step": step, "apply_step": step - 1}
            frames = [] if previous is None else [torch.frombuffer(bytearray(r), dtype=torch.uint8) for r in (previous if i == 0 else previous[::-1])]
            w.op_begin_round({"step": step}, [tokens(10 * step + i)])
            replies.append(w.op_finish_round(header, frames))
        assert replies[0][0]["param_hash"] == replies[1][0]["param_hash"]
        assert replies[0][0]["result_bytes"] == len(replies[0][1][0]) and replies[0][0]["tokens"] == 4 * 16
        previous = [bytes(r[1][0]) for r in replies]
    assert workers[0].op_param_hash({}, [])[0]["param_hash"] != start
    scored, _ = workers[0].op_score_results(
        {"step": 3, "results": 2, "own_batches": True},
        [
            torch.frombuffer(bytearray(previous[0]), dtype=torch.uint8),
            torch.frombuffer(bytearray(b"junk"), dtype=torch.uint8),
            tokens(30),
            tokens(31),
            tokens(33),
        ],
    )
    assert scored["after"][1] is None and scored["after"][0][0] < scored["before"][0]
    with pytest.raises(WorkerError, match="result 1: not a DenseMean result") as refused:
        workers[0].op_apply_results(
            {"step": 3}, [torch.frombuffer(bytearray(previous[0]), dtype=torch.uint8), torch.frombuffer(bytearray(b"junk"), dtype=torch.uint8)]
        )
    assert refused.value.kind == "bad_result" and refused.value.fields == {"index": 1}
    assert workers[0].op_evaluate({}, [tokens(40)])[0]["loss"] > 0


def test_gradients_stay_on_the_device_and_optimizers_reply_with_host_numbers(tiny_config):
    """One sync per step: the trainer's forward/backward returns the loss unread (a 0-d device tensor), the norm is
    measured without touching the gradients when nothing is clipped, and each optimizer reads its numbers once, as
    plain floats for the reply."""
    t = trainer(tiny_config, {"AdamW": {}})
    loss = t.gradients(Batch(tokens(1)))
    assert isinstance(loss, torch.Tensor) and loss.ndim == 0 and loss.dtype == torch.float64
    grads = [p.grad.clone() for p in t.model.parameters()]
    norm = clip_grad_norm(t.model, None)
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, t.model.parameters()))
    measured, before_clipping = read(norm, clip_grad_norm(t.model, 1e-3))
    assert measured == before_clipping == pytest.approx(float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))), rel=1e-6)
    assert float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in t.model.parameters()]))) == pytest.approx(1e-3, rel=1e-4)
    for config, kw in (({"AdamW": {"clip_grad_norm": 1.0}}, {}), (DISTRO, {}), (DISTRO, {"simulate_peers": 2})):
        stats = trainer(tiny_config, config, **kw).train_step(tokens(2), 1)
        assert all(type(stats[k]) is float for k in ("loss", "grad_norm", "lr")), stats
    stats = trainer(tiny_config, DISTRO, delay_correction=True).begin_round(tokens(3), 1)
    assert type(stats["loss"]) is float and type(stats["grad_norm"]) is float
