"""Loss masks (fine-tuning): only the counted targets make the loss and the gradient."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from psyche_worker.loss_mask import lm_loss
from psyche_worker.protocol import WorkerError
from psyche_worker.server import Worker

ADAMW = {"AdamW": {"betas": [0.9, 0.95], "weight_decay": 0.0, "eps": 1e-8}}
SCHEDULE = {"Constant": {"base_lr": 1e-2, "warmup_steps": 0}}


def worker(tiny_config, micro_batch=8, optimizer=ADAMW) -> Worker:
    w = Worker("cpu", 1)
    w.op_init_model({"config": tiny_config, "seed": 3}, [])
    w.op_configure({"optimizer": optimizer, "lr_schedule": SCHEDULE, "micro_batch": micro_batch}, [])
    return w


def batch(seed=0, rows=4, length=17):
    rng = np.random.default_rng(seed)
    ids = torch.from_numpy(rng.integers(0, 64, size=(rows, length), dtype=np.int64))
    # a prompt (not counted) then a reply (counted), of a different split in each row
    mask = torch.zeros((rows, length - 1), dtype=torch.uint8)
    for r in range(rows):
        mask[r, 3 + 2 * r :] = 1
    return ids, mask


def test_lm_loss_is_the_mean_over_counted_targets_only():
    logits = torch.randn(2, 5, 11)
    targets = torch.randint(0, 11, (2, 5))
    mask = torch.tensor([[0, 1, 1, 0, 1], [0, 0, 0, 1, 1]], dtype=torch.bool)
    per = F.cross_entropy(logits.reshape(-1, 11), targets.reshape(-1), reduction="none").reshape(2, 5)
    assert torch.allclose(lm_loss(logits, targets, mask), per[mask].mean())
    assert torch.equal(lm_loss(logits, targets, None), F.cross_entropy(logits.reshape(-1, 11), targets.reshape(-1)))
    nothing = torch.zeros_like(mask)
    assert float(lm_loss(logits, targets, nothing)) == 0.0


def test_masked_targets_do_not_change_the_loss_or_the_gradient(tiny_config):
    ids, mask = batch()
    mask[:, -1] = 0  # the last id of each row is only a target: change it where it does not count
    other = ids.clone()
    other[:, -1] = (other[:, -1] + 1) % 64
    a, b, unmasked = worker(tiny_config), worker(tiny_config), worker(tiny_config)
    ra = a.op_train_step({"step": 0, "loss_mask": True}, [ids, mask])[0]
    rb = b.op_train_step({"step": 0, "loss_mask": True}, [other, mask])[0]
    ru = unmasked.op_train_step({"step": 0}, [ids])[0]
    assert ra["loss"] == rb["loss"]
    assert a.op_param_hash({}, [])[0] == b.op_param_hash({}, [])[0]
    assert ra["loss"] != ru["loss"]


def test_the_masked_loss_is_token_weighted_whatever_the_micro_batch(tiny_config):
    ids, mask = batch(seed=1)
    whole = worker(tiny_config, micro_batch=8)
    split = worker(tiny_config, micro_batch=1)
    loss_whole = whole.op_train_step({"step": 0, "loss_mask": True}, [ids, mask])[0]["loss"]
    loss_split = split.op_train_step({"step": 0, "loss_mask": True}, [ids, mask])[0]["loss"]
    assert loss_whole == pytest.approx(loss_split, rel=1e-5)
    # the reference: one forward over the batch, cross-entropy over the counted targets
    ref = worker(tiny_config)
    with torch.no_grad():
        logits = ref.t.model(input_ids=ids[:, :-1]).logits
    expected = F.cross_entropy(logits.reshape(-1, 64), ids[:, 1:].reshape(-1), reduction="none")[mask.reshape(-1).bool()].mean()
    assert loss_whole == pytest.approx(float(expected), rel=1e-5)
    # evaluation agrees with training on the same parameters
    assert ref.op_evaluate({"loss_mask": True}, [ids, mask])[0]["loss"] == pytest.approx(float(expected), rel=1e-5)


def test_distro_rounds_and_scoring_take_masks(tiny_config):
    distro = {"Distro": {"clip_grad_norm": 1.0, "compression_decay": 0.999, "compression_chunk": 16, "compression_topk": 4, "quantize_1bit": True}}
    w = Worker("cpu", 1)
    w.op_init_model({"config": tiny_config, "seed": 3}, [])
    w.op_configure({"optimizer": distro, "lr_schedule": SCHEDULE, "micro_batch": 4, "delay_correction": True}, [])
    ids, mask = batch(seed=2)
    reply, frames = w.op_train_round({"step": 1, "loss_mask": True}, [ids, mask])
    assert reply["applied"] == 0 and np.isfinite(reply["loss"])
    result = torch.frombuffer(bytearray(bytes(frames[0])), dtype=torch.uint8)
    scored = w.op_score_results({"step": 1, "results": 1, "own_batches": True, "loss_mask": True}, [result, ids, mask, ids, mask])[0]
    assert len(scored["before"]) == 2 and scored["after"][0] is not None


def test_bad_masks_are_refused_naming_the_problem(tiny_config):
    w = worker(tiny_config)
    ids, mask = batch()
    with pytest.raises(WorkerError, match=r"loss mask must be uint8 of shape \[4, 16\]"):
        w.op_train_step({"step": 0, "loss_mask": True}, [ids, mask[:, :-1]])
    with pytest.raises(WorkerError, match="must be 0 or 1"):
        w.op_train_step({"step": 0, "loss_mask": True}, [ids, mask * 2])
    with pytest.raises(WorkerError, match="expected a mask frame after each tokens frame"):
        w.op_train_step({"step": 0, "loss_mask": True}, [ids])
