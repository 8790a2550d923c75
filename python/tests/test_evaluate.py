"""Validation: the worker's evaluate op gives the loss at the replicated parameters (what every replica holds after a
step), with any DisTrO speculation set aside and put back bit-exactly."""

import numpy as np
import torch
from test_worker_server import Client, tokens

from psyche_worker.model import hash_named_tensors, init_model
from psyche_worker.trainer import Trainer

DISTRO = {"Distro": {"compression_decay": 0.9, "compression_chunk": 8, "compression_topk": 2, "quantize_1bit": True}}
SCHEDULE = {"Constant": {"base_lr": 1e-2}}


def trainer(config):
    t = Trainer(init_model(config, 3), torch.device("cpu"))
    t.configure(DISTRO, SCHEDULE, micro_batch=2, delay_correction=True)
    return t


def live_hash(t):
    return hash_named_tensors([(n, p.detach()) for n, p in sorted(t.model.named_parameters(), key=lambda kv: kv[0])])


def test_evaluate_sets_the_speculation_aside_and_changes_nothing(tiny_config):
    held_out = torch.from_numpy(tokens(4, 16, tiny_config["vocab_size"], seed=99).astype(np.int32))
    train = [torch.from_numpy(tokens(4, 16, tiny_config["vocab_size"], seed=s).astype(np.int32)) for s in (1, 2)]
    with_eval, without = trainer(tiny_config), trainer(tiny_config)
    before = with_eval.evaluate_replicated(held_out)["loss"]
    results = []
    for t in (with_eval, without):
        t.begin_round(train[0], 1)
        _, r = t.finish_round(1, None, [])
        results.append(r)
    assert results[0] == results[1]
    # Our own result is applied speculatively: the live parameters differ from the replicated ones...
    speculative = live_hash(with_eval)
    assert speculative != hash_named_tensors(with_eval.replicated_parameters())
    assert with_eval.evaluate(held_out)["loss"] != before
    # ...but validation is at the replicated parameters (still the initial ones), and leaves the speculation in place.
    assert with_eval.evaluate_replicated(held_out)["loss"] == before
    assert live_hash(with_eval) == speculative
    # The next round goes exactly as on a replica that never evaluated.
    outs = []
    for t in (with_eval, without):
        t.begin_round(train[1], 2)
        outs.append(t.finish_round(2, 1, [results[0]]))
    assert outs[0][1] == outs[1][1] and outs[0][0] == outs[1][0]
    assert hash_named_tensors(with_eval.replicated_parameters()) == hash_named_tensors(without.replicated_parameters())
    # After step 1's result is applied, the validation loss is that of the new replicated parameters, on both.
    after = with_eval.evaluate_replicated(held_out)["loss"]
    assert after != before
    assert after == without.evaluate_replicated(held_out)["loss"]


def test_evaluate_op_over_zeromq(tmp_path, tiny_config):
    """The op as the client calls it: after a round, the held-out loss equals the loss of the replicated parameters,
    and it falls once the round's result is applied (on the batch that was trained)."""
    client = Client(tmp_path)
    try:
        assert client.call("init_model", config=tiny_config, seed=3)[0]["ok"]
        assert client.call("configure", optimizer=DISTRO, lr_schedule=SCHEDULE, micro_batch=2, delay_correction=True)[0]["ok"]
        batch = tokens(4, 16, tiny_config["vocab_size"], seed=5)
        first = client.call("evaluate", [batch])[0]
        assert first["ok"] and first["tokens"] == 4 * 16
        losses = [first["loss"]]
        result = None
        for step in range(1, 6):
            assert client.call("begin_round", [batch], step=step)[0]["ok"]
            args = {"step": step} if result is None else {"step": step, "apply_step": step - 1}
            reply, frames = client.call("finish_round", [] if result is None else [np.frombuffer(result, dtype=np.uint8)], **args)
            assert reply["ok"], reply
            result = bytes(frames[0])
            ev = client.call("evaluate", [batch])[0]
            assert ev["ok"], ev
            losses.append(ev["loss"])
        # step 1 applied nothing yet (results land one round late): the replicated parameters are still the initial ones
        assert losses[1] == losses[0]
        assert losses[-1] < losses[0], losses
    finally:
        client.close()
