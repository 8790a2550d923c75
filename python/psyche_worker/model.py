"""Models in Hugging Face layout (config.json + model.safetensors): create, load, hash, save."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from collections.abc import Iterable
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


PRECISIONS = ("auto", "fp32", "bf16")


def resolve_precision(name: str, device: torch.device) -> str:
    """The compute precision of forward passes: "fp32", or "bf16" (torch.autocast to bfloat16; the master
    weights, gradients, optimizer state and everything hashed or sent stay fp32). "auto": bf16 on a CUDA
    device that supports it, fp32 otherwise (CPU bf16 autocast works but is slower than fp32 on most CPUs)."""
    if name not in PRECISIONS:
        raise WorkerError(f"precision {name!r}: expected auto, fp32 or bf16", kind="device")
    cuda_bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
    if name == "auto":
        return "bf16" if cuda_bf16 else "fp32"
    if name == "bf16" and device.type == "cuda" and not cuda_bf16:
        raise WorkerError(f"precision bf16: {torch.cuda.get_device_name(device)} does not support bfloat16", kind="device")
    return name


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
    recover_interrupted_save(path.resolve())
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise WorkerError(f"{model_dir}: not a model directory (no config.json)", kind="model")
    try:
        config_dict = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as exc:
        raise WorkerError(f"{cfg_path}: not valid JSON ({exc})", kind="model") from None
    weights = path / "model.safetensors"
    index = path / "model.safetensors.index.json"
    if not weights.is_file() and not index.is_file():
        raise WorkerError(f"{model_dir}: no model.safetensors (create one with `psyche model init`)", kind="model")
    from safetensors.torch import load_file

    model = _llama_from_config(config_dict)
    files = [weights] if weights.is_file() else _index_files(index)
    state: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            state.update(load_file(str(file)))
        except Exception as exc:  # safetensors raises several types for corrupt files
            raise WorkerError(f"{file}: cannot read safetensors ({exc})", kind="model") from None
    weights = weights if weights.is_file() else index
    missing, unexpected = model.load_state_dict(state, strict=False)
    # lm_head may be tied to the embeddings and therefore absent from the file
    missing = [m for m in missing if not (m == "lm_head.weight" and model.config.tie_word_embeddings)]
    if missing or unexpected:
        raise WorkerError(f"{weights}: tensors do not match config.json (missing {missing[:4]}, unexpected {unexpected[:4]})", kind="model")
    return model.float()


def _index_files(index: Path) -> list[Path]:
    """The files a sharded checkpoint's model.safetensors.index.json names (each in the index's directory)."""
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        names = sorted(set(weight_map.values()))
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise WorkerError(f"{index}: not a safetensors index (a weight_map of tensor -> file): {exc}", kind="model") from None
    files = []
    for name in names:
        if not isinstance(name, str) or Path(name).name != name or not name.endswith(".safetensors"):
            raise WorkerError(f"{index}: weight_map names {name!r}, not a .safetensors file in the same directory", kind="model")
        file = index.parent / name
        if not file.is_file():
            raise WorkerError(f"{index}: names {name}, which is missing", kind="model")
        files.append(file)
    return files


def named_parameters_sorted(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    return sorted(model.named_parameters(), key=lambda kv: kv[0])


def param_hash(model: torch.nn.Module) -> str:
    """SHA-256 over every parameter (sorted by name): name, dtype, shape, then the raw bytes."""
    return hash_named_tensors(named_parameters_sorted(model))


def hash_named_tensors(named: list[tuple[str, torch.Tensor]]) -> str:
    return hash_sorted_tensors(sorted(named, key=lambda kv: kv[0]))


def hash_sorted_tensors(named: Iterable[tuple[str, torch.Tensor]]) -> str:
    """hash_named_tensors of tensors already sorted by name, read one at a time (a sharded model's are gathered as
    they come)."""
    h = hashlib.sha256()
    for name, p in named:
        t = p.detach().to("cpu").contiguous()
        h.update(name.encode())
        h.update(f"|{str(t.dtype).removeprefix('torch.')}|{list(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.dtype == torch.bfloat16 else t.numpy().tobytes())
    return h.hexdigest()


EOS = "<|endoftext|>"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def byte_level_tokenizer(vocab_size: int = 257):
    """A tokenizer for a model that came with none: one token per byte (byte-level BPE without merges) plus
    <|endoftext|> — 257 ids, which round-trip any text. A model with fewer ids gets the first vocab_size - 1
    byte symbols (others map to <|endoftext|>), so no id ever exceeds the model's vocabulary."""
    from tokenizers import Tokenizer, decoders, models as tok_models, pre_tokenizers

    if vocab_size < 2:
        raise WorkerError(f"vocab_size {vocab_size} is too small for a tokenizer", kind="model")
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())[: min(256, vocab_size - 1)]
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    vocab[EOS] = len(vocab)
    tok = Tokenizer(tok_models.BPE(vocab=vocab, merges=[], unk_token=EOS))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([EOS])
    return tok


def write_tokenizer(dest: Path, config, source: str | None) -> str:
    """Writes tokenizer.json + tokenizer_config.json into ``dest``: from ``source`` (a tokenizer.json file or a
    model directory holding one), else a byte-level tokenizer. Returns where it came from."""
    from tokenizers import Tokenizer

    src = Path(source) if source else None
    if src is not None and src.is_dir():
        src = src / "tokenizer.json" if (src / "tokenizer.json").is_file() else None
    if src is not None and not src.is_file():
        raise WorkerError(f"tokenizer {source}: no such file", kind="model")
    if src is not None:
        try:
            tok = Tokenizer.from_file(str(src))
        except Exception as exc:
            raise WorkerError(f"{src}: not a tokenizers tokenizer.json ({exc})", kind="model") from None
        origin = str(src)
    else:
        vocab_size = int(getattr(config, "vocab_size", 0) or 0)
        tok, origin = byte_level_tokenizer(vocab_size or 257), "byte-level (the model came without a tokenizer)"
    vocab_size = int(getattr(config, "vocab_size", 0) or 0)
    if vocab_size and tok.get_vocab_size() > vocab_size:
        raise WorkerError(f"tokenizer {origin} has {tok.get_vocab_size()} tokens, more than the model's vocab_size {vocab_size}", kind="model")
    if src is not None:
        shutil.copyfile(src, dest / "tokenizer.json")
    else:
        tok.save(str(dest / "tokenizer.json"))
    sibling_config = src.parent / "tokenizer_config.json" if src is not None else None
    if sibling_config is not None and sibling_config.is_file():
        shutil.copyfile(sibling_config, dest / "tokenizer_config.json")
        if (src.parent / "special_tokens_map.json").is_file():
            shutil.copyfile(src.parent / "special_tokens_map.json", dest / "special_tokens_map.json")
    else:
        tok_config: dict[str, Any] = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": int(getattr(config, "max_position_embeddings", 2048) or 2048),
            "clean_up_tokenization_spaces": False,
        }
        if tok.token_to_id(EOS) is not None:
            tok_config.update(eos_token=EOS, bos_token=EOS, unk_token=EOS)
        (dest / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2) + "\n")
    return origin


def model_card(name: str, parameters: int, phash: str, tokenizer: str, card: dict[str, Any]) -> str:
    lines = [
        "---",
        "library_name: transformers",
        "pipeline_tag: text-generation",
        "tags:",
        "- psyche",
        "- llama",
        "---",
        "",
        f"# {name}",
        "",
        "A causal language model written by [psyche](https://github.com/PsycheFoundation/psyche) (untrusted machines training one model together).",
        "",
        "| | |",
        "|---|---|",
        f"| parameters | {parameters:,} |",
        f"| parameter hash (sha256) | `{phash}` |",
        f"| tokenizer | {tokenizer} |",
    ]
    for key, value in card.items():
        lines.append(f"| {str(key).replace('_', ' ')} | {value} |")
    lines += [
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        f'model = AutoModelForCausalLM.from_pretrained("{name}")',
        f'tokenizer = AutoTokenizer.from_pretrained("{name}")',
        "```",
        "",
    ]
    return "\n".join(lines)


def recover_interrupted_save(out: Path) -> None:
    """A save replaces ``out`` in two renames (out -> .out.old-PID, then the new one -> out). If it died between
    them, ``out`` is missing and the previous model sits in the .old sibling: put it back."""
    if out.exists():
        return
    olds = sorted(out.parent.glob(f".{out.name}.old-*"), key=lambda p: p.stat().st_mtime, reverse=True)
    if olds and (olds[0] / "config.json").is_file():
        os.rename(olds[0], out)


def save_model(
    model: torch.nn.Module,
    out_dir: str,
    tokenizer: str | None = None,
    card: dict[str, Any] | None = None,
    state: dict[str, torch.Tensor] | None = None,
    max_shard_size: int | str = "5GB",
) -> None:
    """Writes a complete model directory to ``out_dir`` atomically — config.json, model.safetensors, the tokenizer
    (tokenizer.json + tokenizer_config.json) and a model card (README.md) — into a temporary sibling directory
    first, then renamed over, so a crash never leaves a half-written model and the previous one stays intact."""
    out = Path(out_dir).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    recover_interrupted_save(out)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        # `state`: the whole tensors (a sharded model's, gathered); safetensors files of at most max_shard_size each,
        # with model.safetensors.index.json when there are several (Hugging Face's layout)
        # (hashed first: save_pretrained may drop entries of the dict it is given)
        named = sorted(state.items(), key=lambda kv: kv[0]) if state is not None else named_parameters_sorted(model)
        parameters, phash = sum(p.numel() for _, p in named), hash_sorted_tensors(named)
        model.save_pretrained(str(tmp), safe_serialization=True, state_dict=None if state is None else dict(state), max_shard_size=max_shard_size)
        origin = write_tokenizer(tmp, model.config, tokenizer)
        (tmp / "README.md").write_text(model_card(out.name, parameters, phash, origin, card or {}))
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; a model is not secret
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
