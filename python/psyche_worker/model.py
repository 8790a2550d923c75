"""Models in Hugging Face layout (config.json + model.safetensors): create, load, hash, save."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from .protocol import WorkerError

# Psyche's architecture names -> transformers model types we can build
ARCHITECTURES = {"HfLlama": "llama"}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise WorkerError(f"device {name!r} requested but torch sees no CUDA GPU", kind="device")
        dev = torch.device(name)
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise WorkerError(f"device {name!r}: only {torch.cuda.device_count()} CUDA device(s)", kind="device")
        return dev
    raise WorkerError(f"device {name!r}: expected auto, cpu, cuda or cuda:N")


def _llama_from_config(config_dict: dict[str, Any]):
    from transformers import LlamaConfig, LlamaForCausalLM

    model_type = config_dict.get("model_type", "llama")
    if model_type != "llama":
        raise WorkerError(f"config.json: model_type {model_type!r} is not supported (only llama / HfLlama)")
    cfg = LlamaConfig(**{k: v for k, v in config_dict.items() if k not in ("architectures", "transformers_version")})
    return LlamaForCausalLM(cfg)


def init_model(config_dict: dict[str, Any], seed: int) -> torch.nn.Module:
    """A randomly initialised model; the same config and seed give the same parameter bytes."""
    torch.manual_seed(seed)
    model = _llama_from_config(config_dict)
    return model.float()


def load_model(model_dir: str) -> torch.nn.Module:
    path = Path(model_dir)
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise WorkerError(f"{model_dir}: not a model directory (no config.json)", kind="model")
    try:
        config_dict = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as exc:
        raise WorkerError(f"{cfg_path}: not valid JSON ({exc})", kind="model") from None
    weights = path / "model.safetensors"
    if not weights.is_file():
        raise WorkerError(f"{model_dir}: no model.safetensors (create one with `psyche model init`)", kind="model")
    from safetensors.torch import load_file

    model = _llama_from_config(config_dict)
    try:
        state = load_file(str(weights))
    except Exception as exc:  # safetensors raises several types for corrupt files
        raise WorkerError(f"{weights}: cannot read safetensors ({exc})", kind="model") from None
    missing, unexpected = model.load_state_dict(state, strict=False)
    # lm_head may be tied to the embeddings and therefore absent from the file
    missing = [m for m in missing if not (m == "lm_head.weight" and model.config.tie_word_embeddings)]
    if missing or unexpected:
        raise WorkerError(f"{weights}: tensors do not match config.json (missing {missing[:4]}, unexpected {unexpected[:4]})", kind="model")
    return model.float()


def named_parameters_sorted(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    return sorted(model.named_parameters(), key=lambda kv: kv[0])


def param_hash(model: torch.nn.Module) -> str:
    """SHA-256 over every parameter (sorted by name): name, dtype, shape, then the raw bytes."""
    return hash_named_tensors(named_parameters_sorted(model))


def hash_named_tensors(named: list[tuple[str, torch.Tensor]]) -> str:
    h = hashlib.sha256()
    for name, p in sorted(named, key=lambda kv: kv[0]):
        t = p.detach().to("cpu").contiguous()
        h.update(name.encode())
        h.update(f"|{str(t.dtype).removeprefix('torch.')}|{list(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.dtype == torch.bfloat16 else t.numpy().tobytes())
    return h.hexdigest()


def save_model(model: torch.nn.Module, out_dir: str) -> None:
    """Writes config.json + model.safetensors to ``out_dir`` atomically: into a temporary sibling
    directory first, then renamed over, so a crash never leaves a half-written model."""
    out = Path(out_dir).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        model.save_pretrained(str(tmp), safe_serialization=True)
        old = None
        if out.exists():
            old = out.parent / f".{out.name}.old-{os.getpid()}"
            os.rename(out, old)
        os.rename(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
