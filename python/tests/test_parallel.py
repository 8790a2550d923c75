"""Data parallelism inside one client: device lists, shards, and 2 gloo ranks against 1 (parallel.py)."""

import pytest
import torch

from psyche_worker.parallel import Group, parse_devices
from psyche_worker.protocol import WorkerError

HAS_CUDA = torch.cuda.is_available()


def test_device_lists():
    assert parse_devices("cpu") == ["cpu"]
    assert parse_devices("cpu", 3) == ["cpu", "cpu", "cpu"]
    assert parse_devices("cuda:0,cuda:1") == ["cuda:0", "cuda:1"]
    assert parse_devices("cuda", 2) == ["cuda:0", "cuda:1"]
    with pytest.raises(WorkerError, match="all ranks must be cpu, or all cuda"):
        parse_devices("cpu,cuda:0")
    with pytest.raises(WorkerError, match="each GPU may appear once"):
        parse_devices("cuda:0,cuda:0")
    with pytest.raises(WorkerError, match="give one or the other"):
        parse_devices("cuda:0,cuda:1", 3)
    with pytest.raises(WorkerError, match="empty entry"):
        parse_devices("cuda:0,")


def test_shards_tile_the_batch():
    for world in (1, 2, 3, 5):
        for rows in (1, 2, 7, 16):
            shards = [Group(rank=r, world=world, data=None, control=None).shard(rows) for r in range(world)]
            assert shards[0][0] == 0 and shards[-1][1] == rows
            assert all(a[1] == b[0] for a, b in zip(shards, shards[1:]))
            sizes = [e - s for s, e in shards]
            assert max(sizes) - min(sizes) <= 1


def _nccl_rank(rank, port, config, tokens, out):
    from psyche_worker.model import init_model, param_hash
    from psyche_worker.parallel import join_group
    from psyche_worker.trainer import Trainer

    device = torch.device(f"cuda:{rank}")
    group = join_group(rank, 2, port, device)
    trainer = Trainer(init_model(config, 0), device, group=group)
    trainer.configure({"AdamW": {"clip_grad_norm": 1.0}}, {"Constant": {"base_lr": 1e-2}}, micro_batch=2)
    loss = trainer.train_step(tokens, 1)["loss"]
    out.put((rank, loss, param_hash(trainer.model)))
    torch.distributed.destroy_process_group()


@pytest.mark.skipif(not HAS_CUDA or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs (NCCL)")
def test_two_gpu_ranks_stay_identical_and_match_one_gpu(tiny_config):
    import torch.multiprocessing as mp

    from psyche_worker.model import init_model
    from psyche_worker.parallel import free_port
    from psyche_worker.trainer import Trainer

    tokens = torch.randint(0, tiny_config["vocab_size"], (4, 17), dtype=torch.int64).to(torch.int32)
    single = Trainer(init_model(tiny_config, 0), torch.device("cuda:0"))
    single.configure({"AdamW": {"clip_grad_norm": 1.0}}, {"Constant": {"base_lr": 1e-2}}, micro_batch=2)
    expected = single.train_step(tokens, 1)["loss"]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_nccl_rank, args=(r, port, tiny_config, tokens, out)) for r in range(2)]
    for p in procs:
        p.start()
    got = sorted(out.get(timeout=300) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    assert got[0][2] == got[1][2]  # NCCL all-reduce leaves both ranks with identical parameters
    assert got[0][1] == pytest.approx(expected, rel=1e-5)
