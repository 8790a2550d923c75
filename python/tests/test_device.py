"""Device selection: CUDA when torch sees a GPU, CPU otherwise; the CUDA path runs where a GPU exists."""

import pytest
import torch

from psyche_worker.model import init_model, resolve_device
from psyche_worker.protocol import WorkerError
from psyche_worker.trainer import Trainer

HAS_CUDA = torch.cuda.is_available()


def test_auto_picks_what_torch_sees():
    assert resolve_device("auto").type == ("cuda" if HAS_CUDA else "cpu")
    assert resolve_device("cpu") == torch.device("cpu")


@pytest.mark.skipif(HAS_CUDA, reason="this machine has a GPU")
def test_cuda_without_a_gpu_is_a_clear_error():
    with pytest.raises(WorkerError, match="no CUDA GPU"):
        resolve_device("cuda")
    with pytest.raises(WorkerError, match="no CUDA GPU"):
        resolve_device("cuda:1")


def test_unknown_device_names_the_value():
    with pytest.raises(WorkerError, match="'tpu'"):
        resolve_device("tpu")


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU on this machine")
def test_train_and_distro_on_cuda_match_hash_format(tiny_config):
    device = resolve_device("cuda")
    for optimizer in (
        {"AdamW": {"clip_grad_norm": 1.0}},
        {"Distro": {"compression_decay": 0.9, "compression_chunk": 8, "compression_topk": 2, "quantize_1bit": True}},
    ):
        trainer = Trainer(init_model(tiny_config, 0), device)
        trainer.configure(optimizer, {"Constant": {"base_lr": 1e-2}}, micro_batch=2)
        tokens = torch.randint(0, tiny_config["vocab_size"], (4, 17), dtype=torch.int64).to(torch.int32)
        first = trainer.train_step(tokens, 0)["loss"]
        for step in range(1, 10):
            last = trainer.train_step(tokens, step)["loss"]
        assert last < first
        assert all(p.device.type == "cuda" for p in trainer.model.parameters())


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU on this machine")
def test_cuda_batches_go_through_pinned_memory_to_the_device(tiny_config):
    trainer = Trainer(init_model(tiny_config, 0), resolve_device("cuda"))
    tokens = torch.randint(0, tiny_config["vocab_size"], (4, 17), dtype=torch.int64).to(torch.int32)
    on_device = trainer.to_device_tokens(tokens)
    assert on_device.device.type == "cuda" and on_device.dtype == torch.int64
    assert torch.equal(on_device.cpu(), tokens.to(torch.int64))
    assert tokens.to(torch.int64).pin_memory().is_pinned()  # the host staging buffer the worker uses


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU on this machine")
def test_worker_on_cuda_defaults_to_bf16_where_supported():
    from psyche_worker.server import Worker

    hello, _ = Worker("auto", None).op_hello({}, [])
    assert hello["device"].startswith("cuda") and hello["cuda"] is True
    assert hello["precision"] == ("bf16" if torch.cuda.is_bf16_supported() else "fp32")
