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


SPARSELOCO = {"SparseLoCo": {"inner_steps": 3, "chunk": 8, "topk": 4, "outer_lr": 0.5}}


def configured(config, optimizer):
    t = Trainer(init_model(config, 0), torch.device("cpu"))
    t.configure(optimizer, {"Constant": {"base_lr": 1e-2}}, micro_batch=2, delay_correction=True)
    return t


def batch(config, seed: int) -> torch.Tensor:
    return torch.randint(0, config["vocab_size"], (6, 17), generator=torch.Generator().manual_seed(seed)).to(torch.int32)


@pytest.mark.parametrize("optimizer", [DISTRO, SPARSELOCO], ids=["distro", "sparseloco"])
def test_speculative_round_is_bit_identical_and_a_wrong_one_is_undone(tiny_config, optimizer):
    """The client begins round r+1 on its predicted batches right after producing round r's result (with an evaluation
    after it, as the client runs one), instead of when round r+1 starts. Where the prediction holds, every result and
    the parameters are the same bytes; where it fails (step 3 here: other batches), discard_round undoes the
    speculative round (SparseLoCo: its error feedback and inner AdamW moments) and the real one gives the same bytes as
    a client that never speculated."""
    usual, early = configured(tiny_config, optimizer), configured(tiny_config, optimizer)
    held = batch(tiny_config, 99)
    previous: list[bytes] = []
    for step in range(1, 5):
        tokens = batch(tiny_config, step)
        apply_step = step - 1 if previous else None
        usual.evaluate_replicated(held)
        usual.begin_round(tokens, step)
        a, ra = usual.finish_round(step, apply_step, previous)
        if step == 1:
            early.begin_round(tokens, step)
        elif step == 3:
            # the round gave this client other batches than the ones it predicted
            with pytest.raises(WorkerError, match="not begun speculative"):
                early.discard_round(step + 1)
            early.discard_round(step)
            early.begin_round(tokens, step)
        b, rb = early.finish_round(step, apply_step, previous)
        assert ra == rb and a == b, f"step {step}"
        # round step + 1 begins at once, before this round's results have arrived (step 2: on the wrong batches)
        early.begin_round(batch(tiny_config, 1000 + step) if step == 2 else batch(tiny_config, step + 1), step + 1, speculative=True)
        early.evaluate_replicated(held)
        previous = [ra]
    for x, y in zip(usual.replicated_parameters(), early.replicated_parameters()):
        assert torch.equal(x[1], y[1]), x[0]
    early.discard_round(5)


def test_discard_is_refused_for_a_round_begun_for_real(tiny_config):
    t = configured(tiny_config, SPARSELOCO)
    t.begin_round(batch(tiny_config, 1), 1)
    with pytest.raises(WorkerError, match="not begun speculative"):
        t.discard_round(1)
