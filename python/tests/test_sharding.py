"""A model sharded across 4 gloo ranks (sharding.py, FSDP2; 2 NCCL ranks on a machine with 2 GPUs) trains DisTrO and
SparseLoCo rounds with the bytes of an unsharded client: the same results, the same parameters after apply, the same
hashes and losses. (test/worker/sharded.test.ts: 2 ranks on llama2-20m.)"""

import pytest
import torch

DISTRO = {"Distro": {"clip_grad_norm": 1.0, "compression_decay": 0.96, "compression_chunk": 16, "compression_topk": 4, "quantize_1bit": True}}
SCHEDULE = {"Constant": {"base_lr": 1e-2, "warmup_steps": 0, "warmup_init_lr": 0}}
SPARSELOCO = {"SparseLoCo": {"inner_steps": 2, "chunk": 16, "topk": 8, "outer_lr": 0.7, "inner": {"weight_decay": 0.1, "clip_grad_norm": 0.5}}}
ROWS, ROUNDS = 8, 3


def _batches(vocab: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return [torch.randint(0, vocab, (ROWS, 17), generator=g, dtype=torch.int64).to(torch.int32) for _ in range(ROUNDS)]


def _rounds(trainer, batches):
    """Rounds with delay correction, each applying the previous round's own result: results and hashes."""
    from psyche_worker.model import hash_sorted_tensors

    results, hashes, losses = [], [], []
    previous = None
    for step, tokens in enumerate(batches, 1):
        losses.append(trainer.begin_round(tokens, step)["loss"])
        stats, result = trainer.finish_round(step, None if previous is None else step - 1, [] if previous is None else [previous])
        results.append(result)
        hashes.append(hash_sorted_tensors(trainer.whole_parameters()))
        previous = result
    return results, hashes, losses


def _rank(rank, world, port, configs, out, kind):
    """One rank: every case's rounds with the model in `world` shards (one process group for all of them)."""
    torch.set_num_threads(1)
    from psyche_worker.model import init_model
    from psyche_worker.parallel import join_group
    from psyche_worker.sharding import Sharding
    from psyche_worker.trainer import Trainer

    device = torch.device("cpu" if kind == "cpu" else f"cuda:{rank}")
    group = join_group(rank, world, port, device)
    got = {}
    for case, (config, optimizer, gradient_rows) in configs.items():
        trainer = Trainer(init_model(config, 0), device, precision="fp32", sharding=Sharding(rank, world, group.data))
        trainer.configure(optimizer, SCHEDULE, micro_batch=gradient_rows // world, delay_correction=True)
        results, hashes, losses = _rounds(trainer, _batches(config["vocab_size"]))
        got[case] = (results, hashes, losses, *_held(trainer.optimizer))
    out.put((rank, got))
    torch.distributed.destroy_process_group()


def _held(optimizer) -> tuple[int, int]:
    """The parameter elements this rank holds, and the optimizer state's per parameter element (DisTrO's momentum;
    SparseLoCo's error feedback and each inner AdamW moment)."""
    if optimizer.name == "Distro":
        peer = optimizer.peers[0]
        return sum(p.numel() for p in peer.params), sum(m.numel() for m in peer._momentum)
    peer = optimizer.peers[0]
    moments = [t for s in peer.adamw.state.values() for k, t in s.items() if k in ("exp_avg", "exp_avg_sq")]
    local = [t.to_local() if hasattr(t, "to_local") else t for t in moments]
    assert len(local) == 2 * len(optimizer.params)
    assert sum(t.numel() for t in local) == 2 * sum(p.numel() for p in optimizer.params)
    return sum(p.numel() for p in optimizer.params), sum(e.numel() for e in peer.error)


def _sharded(configs, world=2, kind="cpu"):
    import torch.multiprocessing as mp

    from psyche_worker.parallel import free_port

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, world, port, configs, out, kind)) for r in range(world)]
    for p in procs:
        p.start()
    got = []
    while len(got) < len(procs):
        try:
            got.append(out.get(timeout=5))
        except Exception:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead:
                for p in procs:  # the others wait in a collective for the dead one: end them now
                    p.kill()
            assert not dead, f"a rank failed (exit codes {dead})"
    for p in procs:
        p.join(timeout=60)
    return sorted(got, key=lambda r: r[0])


# chunk 16 splits only the embeddings and the head of the tiny model (its 16-row tensors stay whole on each rank);
# chunk 8 on a wider one splits every tensor, and its results carry bf16 values rather than signs. The last item is
# the rows of one gradient (a SparseLoCo inner step's); both clients take micro-batches of one rank's share, so that the
# accumulation adds what FSDP's sum of the ranks' gradients adds.
CASES = {
    "some tensors split, signs": ({}, DISTRO, ROWS),
    "every tensor split, values": (
        {"hidden_size": 32, "intermediate_size": 64},
        {"Distro": {**DISTRO["Distro"], "compression_chunk": 8, "compression_topk": 3, "quantize_1bit": False, "weight_decay": 0.1}},
        ROWS,
    ),
    # chunk 16 again: the tiny model's 64-row tensors split and the rest stay whole; chunk 8 on the wider one splits
    # every tensor, with 3-bit values, and its 1-D norms dense (chunks of 8 elements, all 8 selected)
    "SparseLoCo, 2 inner steps": ({}, SPARSELOCO, ROWS // 2),
    "SparseLoCo, every tensor split, 3 bits": (
        {"hidden_size": 32, "intermediate_size": 64},
        {"SparseLoCo": {**SPARSELOCO["SparseLoCo"], "chunk": 8, "topk": 8, "value_bits": 3}},
        ROWS // 2,
    ),
}


def _check(configs, ranks, device, world):
    from psyche_worker.model import init_model
    from psyche_worker.trainer import Trainer

    for case, (config, optimizer, gradient_rows) in configs.items():
        single = Trainer(init_model(config, 0), device, precision="fp32")
        single.configure(optimizer, SCHEDULE, micro_batch=gradient_rows // world, delay_correction=True)
        results, hashes, losses = _rounds(single, _batches(config["vocab_size"]))
        total = sum(p.numel() for p in single.model.parameters())
        for rank, got in ranks:
            r_results, r_hashes, r_losses, local, state = got[case]
            assert r_results == results, f"{case}, rank {rank}: results differ"
            assert r_hashes == hashes, f"{case}, rank {rank}: parameters differ"
            assert r_losses == losses, f"{case}, rank {rank}: losses differ"
            assert local < 0.75 * total and state == local, f"{case}: each rank holds a share"
            if "every tensor split" in case:
                assert local * world == total, f"{case}: each rank holds 1/{world}"
        assert len(set(hashes)) == ROUNDS, case  # the model changed every round
        assert all(len(r) > 100 for r in results)


def test_four_shards_give_the_unsharded_bytes(tiny_config):
    """4 ranks: FSDP's reduce-scatter adds the ranks' gradients in rank order (sharding.py), as the unsharded client
    accumulates its micro-batches; a ring's order would differ in the last bits."""
    torch.set_num_threads(1)
    configs = {case: ({**tiny_config, **changes}, optimizer, rows) for case, (changes, optimizer, rows) in CASES.items()}
    _check(configs, _sharded(configs, world=4), torch.device("cpu"), 4)


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="a 2-rank FSDP step with NCCL needs 2 CUDA GPUs (this machine has fewer)"
)
def test_two_gpu_shards_give_the_one_gpu_bytes(tiny_config):
    """bench/gpu-check.sh runs this on a lent machine with 2 or more GPUs: the same check with NCCL."""
    configs = {case: ({**tiny_config, **changes}, optimizer, rows) for case, (changes, optimizer, rows) in CASES.items()}
    _check(configs, _sharded(configs, kind="cuda"), torch.device("cuda:0"), 2)


def test_what_a_sharded_client_cannot_train_is_refused_by_name():
    from psyche_worker.optim import shard_rows
    from psyche_worker.protocol import WorkerError

    assert shard_rows(SPARSELOCO)((64, 32)) == 16 and shard_rows(SPARSELOCO)((48,)) == 16 and shard_rows(SPARSELOCO)((4, 64, 32)) == 1
    with pytest.raises(WorkerError, match="SparseLoCo.dct"):
        shard_rows({"SparseLoCo": {"dct": True}})
    with pytest.raises(WorkerError, match="'AdamW' does not train a sharded model"):
        shard_rows({"AdamW": {}})
