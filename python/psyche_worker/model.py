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

# Psyche's architecture names -> the transformers model types (config.json's model_type) each one builds; None: any
# causal language model that transformers' AutoModelForCausalLM builds. architectures.json is the one table of what
# the worker can build: the TypeScript side reads the same file (src/core/config/support.ts) for validate-config,
# create-run and `psyche train`, and hello reports it (README, "Models", names the test that proves each).
ARCHITECTURES_FILE = Path(__file__).with_name("architectures.json")


def _read_architectures(path: Path) -> dict[str, tuple[str, ...] | None]:
    table = json.loads(path.read_text())
    if not isinstance(table, dict) or not table:
        raise ValueError(f"{path}: expected an object of architecture names")
    for name, types in table.items():
        if types is not None and (not isinstance(types, list) or not types or not all(isinstance(t, str) and t for t in types)):
            raise ValueError(f"{path}: {name}: expected null (any causal LM) or a non-empty list of model types")
    return {name: tuple(types) if types is not None else None for name, types in table.items()}


ARCHITECTURES: dict[str, tuple[str, ...] | None] = _read_architectures(ARCHITECTURES_FILE)


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


def _quiet_transformers() -> None:
    """No progress bars or advice on the worker's stderr (the client reads its errors as data)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def causal_lm_types() -> frozenset[str]:
    """The config.json model types that this transformers' AutoModelForCausalLM builds."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return frozenset(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def check_architecture(config_dict: dict[str, Any], architecture: str | None, where: str) -> str:
    """The model type of a config.json that ``architecture`` (a Psyche name; None: HfAuto) runs, or a WorkerError
    naming the field: a config without model_type, one transformers cannot build as a causal LM, or one of another
    architecture than the run's."""
    name = architecture or "HfAuto"
    if name not in ARCHITECTURES:
        raise WorkerError(f"model.LLM.architecture = {name!r}: expected one of {', '.join(ARCHITECTURES)}", kind="unsupported")
    model_type = config_dict.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise WorkerError(f'{where}: no model_type (the transformers architecture of the model, e.g. "llama" or "qwen3")', kind="model")
    allowed = ARCHITECTURES[name]
    if allowed is not None and model_type not in allowed:
        raise WorkerError(
            f'{where}: model_type {model_type!r} is not a {name} model ({name} runs {", ".join(allowed)}); set model.LLM.architecture = "HfAuto" to train it',
            kind="model",
        )
    if model_type not in causal_lm_types():
        import transformers

        raise WorkerError(
            f"{where}: model_type {model_type!r} is not a causal language model that transformers {transformers.__version__} builds", kind="model"
        )
    return model_type


def _config_from_dict(config_dict: dict[str, Any], architecture: str | None, where: str):
    from transformers import AutoConfig

    model_type = check_architecture(config_dict, architecture, where)
    fields = {k: v for k, v in config_dict.items() if k not in ("model_type", "auto_map", "transformers_version")}
    try:
        return AutoConfig.for_model(model_type, **fields)
    except (TypeError, ValueError) as exc:
        raise WorkerError(f"{where}: not a valid {model_type} config ({exc})", kind="model") from None


def _check_unshared(model: torch.nn.Module, where: str) -> None:
    """Every parameter owns its storage: tied weights are one Parameter (transformers ties them so), which
    named_parameters() yields once, so hashing, DisTrO and the optimizer each count a tied tensor once. Two
    Parameters over one storage would be counted, compressed and updated twice."""
    seen: dict[int, str] = {}
    for name, p in model.named_parameters():
        ptr = p.untyped_storage().data_ptr()
        if ptr in seen:
            raise WorkerError(f"{where}: parameters {seen[ptr]} and {name} share storage without being one tied parameter", kind="model")
        seen[ptr] = name


def init_model(config_dict: dict[str, Any], seed: int, architecture: str | None = None) -> torch.nn.Module:
    """A randomly initialised model (AutoModelForCausalLM.from_config, fp32); the same config and seed give the same
    parameter bytes. ``architecture``: the run's Psyche architecture the config must be (None: any causal LM)."""
    from transformers import AutoModelForCausalLM

    _quiet_transformers()
    config = _config_from_dict(config_dict, architecture, "config.json")
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).float()
    _check_unshared(model, "config.json")
    return model


def _shape_mismatch(entry: Any) -> str:
    """transformers' mismatched_keys entry (name, shape in the file, shape in the model), for an error message."""
    if isinstance(entry, tuple) and len(entry) == 3:
        name, found, wanted = entry
        return f"{name}: {list(found)} in the file, {list(wanted)} in the model"
    return str(entry)


def load_model(model_dir: str, architecture: str | None = None) -> torch.nn.Module:
    """A model directory in Hugging Face layout (config.json and model.safetensors, or shards with their
    model.safetensors.index.json), loaded with AutoModelForCausalLM.from_pretrained in fp32. Every parameter must
    come from the files: a missing, unexpected or misshapen tensor is an error, never a random initialisation."""
    path = Path(model_dir)
    recover_interrupted_save(path.resolve())
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise WorkerError(f"{model_dir}: not a model directory (no config.json)", kind="model")
    try:
        config_dict = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as exc:
        raise WorkerError(f"{cfg_path}: not valid JSON ({exc})", kind="model") from None
    if not isinstance(config_dict, dict):
        raise WorkerError(f"{cfg_path}: not a JSON object", kind="model")
    weights = path / "model.safetensors"
    index = path / "model.safetensors.index.json"
    if not weights.is_file() and not index.is_file():
        raise WorkerError(f"{model_dir}: no model.safetensors (create one with `psyche model init`)", kind="model")
    check_architecture(config_dict, architecture, str(cfg_path))
    from transformers import AutoModelForCausalLM

    _quiet_transformers()
    if not weights.is_file():
        _index_files(index)  # every file it names is a .safetensors file beside it, and present
    source = weights if weights.is_file() else index
    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            str(path),
            dtype=torch.float32,
            output_loading_info=True,
            trust_remote_code=False,
            local_files_only=True,
            use_safetensors=True,
            ignore_mismatched_sizes=True,  # reported in the loading info, refused below by name
        )
    except WorkerError:
        raise
    except Exception as exc:  # safetensors and transformers raise several types for corrupt or mismatched files
        raise WorkerError(f"{source}: cannot load the model ({type(exc).__name__}: {exc})", kind="model") from None
    missing, unexpected = sorted(info.get("missing_keys") or ()), sorted(info.get("unexpected_keys") or ())
    mismatched = sorted(_shape_mismatch(m) for m in info.get("mismatched_keys") or ())
    if missing or unexpected or mismatched:
        raise WorkerError(
            f"{source}: tensors do not match config.json (missing {missing[:4]}, unexpected {unexpected[:4]}, wrong shape {mismatched[:4]})", kind="model"
        )
    model = model.float()
    _check_unshared(model, str(source))
    return model


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
# What a tokenizer.json travels with: its settings, special tokens and chat template (transformers 5 writes the template
# to chat_template.jinja; older versions put it in tokenizer_config.json)
TOKENIZER_SIDE_FILES = ("tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", "chat_template.json")
# Files of a tokenizer without a tokenizer.json that transformers' AutoTokenizer reads (BPE vocab and merges,
# SentencePiece model)
TOKENIZER_SOURCE_FILES = ("vocab.json", "merges.txt", "tokenizer.model", "spiece.model", "vocab.txt")


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
    """Writes the tokenizer into ``dest``: from ``source`` (a tokenizer.json file, or a model directory: its
    tokenizer.json with the files beside it, else whatever tokenizer files of its own AutoTokenizer reads), else a
    byte-level tokenizer. Returns where it came from."""
    from tokenizers import Tokenizer

    src = Path(source) if source else None
    if src is not None and src.is_dir():
        if (src / "tokenizer.json").is_file():
            src = src / "tokenizer.json"
        elif any((src / name).is_file() for name in TOKENIZER_SOURCE_FILES):
            return _save_auto_tokenizer(src, dest, config)
        else:
            src = None
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
    _check_tokenizer_fits(tok.get_vocab_size(), config, origin)
    if src is not None:
        shutil.copyfile(src, dest / "tokenizer.json")
    else:
        tok.save(str(dest / "tokenizer.json"))
    if src is not None and (src.parent / "tokenizer_config.json").is_file():
        for name in TOKENIZER_SIDE_FILES:
            if (src.parent / name).is_file():
                shutil.copyfile(src.parent / name, dest / name)
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


def _check_tokenizer_fits(size: int, config, origin: str) -> None:
    vocab_size = int(getattr(config, "vocab_size", 0) or 0)
    if vocab_size and size > vocab_size:
        raise WorkerError(f"tokenizer {origin} has {size} tokens, more than the model's vocab_size {vocab_size}", kind="model")


def _save_auto_tokenizer(src: Path, dest: Path, config) -> str:
    """A model's own tokenizer that has no tokenizer.json (e.g. vocab.json + merges.txt, or a SentencePiece model):
    loaded with AutoTokenizer (no remote code) and saved as transformers saves it."""
    from transformers import AutoTokenizer

    _quiet_transformers()
    try:
        tok = AutoTokenizer.from_pretrained(str(src), trust_remote_code=False, local_files_only=True)
    except Exception as exc:  # transformers raises several types for a tokenizer it cannot read
        raise WorkerError(f"{src}: its tokenizer files do not load with AutoTokenizer ({type(exc).__name__}: {exc})", kind="model") from None
    _check_tokenizer_fits(len(tok), config, str(src))
    tok.save_pretrained(str(dest))
    return str(src)


def model_card(name: str, model_type: str, parameters: int, phash: str, tokenizer: str, card: dict[str, Any]) -> str:
    lines = [
        "---",
        "library_name: transformers",
        "pipeline_tag: text-generation",
        "tags:",
        "- psyche",
        f"- {model_type}",
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
        (tmp / "README.md").write_text(model_card(out.name, str(model.config.model_type), parameters, phash, origin, card or {}))
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
