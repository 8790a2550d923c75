"""begin_round + finish_round (the client downloads the previous round's results in between) equal train_round."""

import pytest
import torch

from psyche_worker.model import init_model
from psyche_worker.protocol import WorkerError
from psyche_worker.trainer import Trainer

DISTRO = {"Distro": {"compression_decay": 0.9, "compression_chunk": 8, "compression_topk": 2, "quantize_1bit": True}}


def trainer(config):
    t = Trainer(init_model(config, 0), torch.device("cpu"))
    t.configure(DISTRO, {"Constant": {"base_lr": 1e-2}}, micro_batch=2, delay_correction=True)
    return t


def test_split_round_is_bit_identical_to_train_round(tiny_config):
    whole, split = trainer(tiny_config), trainer(tiny_config)
    previous: list[bytes] = []
    for step in range(1, 4):
        tokens = torch.randint(0, tiny_config["vocab_size"], (4, 17), generator=torch.Generator().manual_seed(step)).to(torch.int32)
        apply_step = step - 1 if previous else None
        a, ra = whole.train_round(tokens, step, apply_step, previous)
        split.begin_round(tokens, step)
        b, rb = split.finish_round(step, apply_step, previous)
        assert ra == rb and a == b
        previous = [ra]
    hashes = [[p.detach().clone() for _, p in t.replicated_parameters()] for t in (whole, split)]
    assert all(torch.equal(x, y) for x, y in zip(*hashes))


def test_finish_without_begin_is_refused(tiny_config):
    t = trainer(tiny_config)
    with pytest.raises(WorkerError, match="without its begin_round"):
        t.finish_round(1, None, [])
