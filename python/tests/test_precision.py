"""bf16 autocast: forward passes in bfloat16, master weights in fp32. On CPU torch runs the same autocast code
path as on CUDA (only the kernels differ), so training, determinism across replicas and the fp32 state are
checked here; the CUDA variant runs where a GPU exists."""

import pytest
import torch

from psyche_worker.model import init_model, param_hash, resolve_device, resolve_precision
from psyche_worker.protocol import WorkerError
from psyche_worker.server import Worker
from psyche_worker.trainer import Trainer

HAS_CUDA = torch.cuda.is_available()
DISTRO = {"Distro": {"compression_decay": 0.9, "compression_chunk": 8, "compression_topk": 2, "quantize_1bit": True}}


def batches(cfg: dict, n: int, seed: int = 1) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    # a learnable pattern (each row counts upward) so the loss falls quickly
    starts = torch.randint(0, cfg["vocab_size"], (n, 4, 1), generator=g)
    return [((s + torch.arange(17)) % cfg["vocab_size"]).to(torch.int32) for s in starts]


def adamw(cfg: dict, precision: str, device: torch.device | None = None) -> Trainer:
    t = Trainer(init_model(cfg, 0), device or torch.device("cpu"), precision=precision)
    t.configure({"AdamW": {"clip_grad_norm": 1.0}}, {"Constant": {"base_lr": 1e-2}}, micro_batch=2)
    return t


def test_precision_names_and_auto():
    cpu = torch.device("cpu")
    assert resolve_precision("auto", cpu) == "fp32"
    assert resolve_precision("bf16", cpu) == "bf16"
    assert resolve_precision("fp32", cpu) == "fp32"
    with pytest.raises(WorkerError, match="'fp16'"):
        resolve_precision("fp16", cpu)
    with pytest.raises(WorkerError, match="'half'"):
        Trainer(torch.nn.Linear(2, 2), cpu, precision="half")


def test_bf16_autocast_trains_and_keeps_fp32_master_weights(tiny_config):
    bf16, fp32 = adamw(tiny_config, "bf16"), adamw(tiny_config, "fp32")
    data = batches(tiny_config, 30)
    first = bf16.train_step(data[0], 0)["loss"]
    first32 = fp32.train_step(data[0], 0)["loss"]
    for step, tokens in enumerate(data[1:], start=1):
        last = bf16.train_step(tokens, step)["loss"]
    assert last < first * 0.8, (first, last)
    # the forward ran in bf16 (its loss is not the fp32 loss), the weights and gradients stayed fp32
    assert first != first32
    assert abs(first - first32) < 0.05 * first32
    assert all(p.dtype == torch.float32 for p in bf16.model.parameters())
    assert all(p.grad is None or p.grad.dtype == torch.float32 for p in bf16.model.parameters())
    assert all(s.dtype == torch.float32 for st in bf16.optimizer.state_dict()["state"].values() for s in st.values() if s.numel() > 1)


def test_bf16_replicas_stay_bit_identical(tiny_config):
    """Two replicas with the same seed and batches: identical losses and parameter hashes after every step,
    with AdamW and with DisTrO (identical result bytes, too)."""
    a, b = adamw(tiny_config, "bf16"), adamw(tiny_config, "bf16")
    for step, tokens in enumerate(batches(tiny_config, 5)):
        assert a.train_step(tokens, step) == b.train_step(tokens, step)
        assert param_hash(a.model) == param_hash(b.model)
    start = param_hash(init_model(tiny_config, 0))
    assert param_hash(a.model) != start

    replicas = []
    for _ in range(2):
        t = Trainer(init_model(tiny_config, 0), torch.device("cpu"), precision="bf16")
        t.configure(DISTRO, {"Constant": {"base_lr": 1e-2}}, micro_batch=2, delay_correction=True)
        replicas.append(t)
    previous: list[bytes] = []
    for step, tokens in enumerate(batches(tiny_config, 4, seed=2)):
        outs = [t.train_round(tokens, step, step - 1 if step else None, previous) for t in replicas]
        (ra, res_a), (rb, res_b) = outs
        assert ra == rb and res_a == res_b
        assert len(res_a) > 0
        hashes = {param_hash(t.model) for t in replicas}
        assert len(hashes) == 1
        previous = [res_a]
    assert hashes != {start}


def test_worker_reports_and_uses_its_precision(tiny_config):
    w = Worker("cpu", 1, precision="bf16")
    reply, _ = w.op_hello({}, [])
    assert reply["precision"] == "bf16"
    w.op_init_model({"config": tiny_config, "seed": 0}, [])
    assert w.t.precision == "bf16"
    assert Worker("cpu", 1).op_hello({}, [])[0]["precision"] == "fp32"


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU on this machine")
def test_bf16_on_cuda_trains_and_replicas_agree(tiny_config):
    device = resolve_device("cuda")
    assert resolve_precision("auto", device) == ("bf16" if torch.cuda.is_bf16_supported() else "fp32")
    if not torch.cuda.is_bf16_supported():
        pytest.skip(f"{torch.cuda.get_device_name(device)} has no bfloat16")
    a, b = adamw(tiny_config, "bf16", device), adamw(tiny_config, "bf16", device)
    data = batches(tiny_config, 30)
    first = a.train_step(data[0], 0)["loss"]
    b.train_step(data[0], 0)
    for step, tokens in enumerate(data[1:], start=1):
        last = a.train_step(tokens, step)["loss"]
        b.train_step(tokens, step)
    assert last < first * 0.8
    assert param_hash(a.model) == param_hash(b.model)
    assert all(p.dtype == torch.float32 and p.device.type == "cuda" for p in a.model.parameters())
