"""Every model directory psyche writes is complete (weights, config, tokenizer, model card), loads with plain
transformers, and is written atomically (a crash mid-write leaves the previous model intact)."""

import json
import os
import signal
import subprocess
import sys

import pytest
import torch

from psyche_worker import model as models
from psyche_worker.protocol import WorkerError

from conftest import ROOT


def load_with_transformers(path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(str(path)), AutoTokenizer.from_pretrained(str(path))


def test_saved_model_has_tokenizer_and_card_and_loads_with_auto_classes(tiny_config, tmp_path):
    cfg = dict(tiny_config, vocab_size=300)
    m = models.init_model(cfg, seed=3)
    out = tmp_path / "model"
    models.save_model(m, str(out), card={"step": 12, "run_id": "test-run"})
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "README.md"):
        assert (out / name).is_file(), name
    card = (out / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: transformers")
    assert models.param_hash(m) in card and "| step | 12 |" in card
    loaded, tok = load_with_transformers(out)
    assert models.param_hash(loaded.float()) == models.param_hash(m)
    text = "Hello, psyche! ünïcode"
    ids = tok(text)["input_ids"]
    assert tok.decode(ids) == text
    assert max(ids) < cfg["vocab_size"]
    with torch.no_grad():
        logits = loaded(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), cfg["vocab_size"])
    assert tok.eos_token == models.EOS


def test_a_given_tokenizer_is_copied_and_a_loaded_models_tokenizer_is_kept(tiny_config, tmp_path):
    from tokenizers import Tokenizer, models as tok_models, pre_tokenizers, trainers

    tok = Tokenizer(tok_models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=[models.EOS], show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog " * 20, "psyche trains together " * 20], trainer=trainer)
    tok.save(str(tmp_path / "tokenizer.json"))
    cfg = dict(tiny_config, vocab_size=512)
    m = models.init_model(cfg, seed=1)
    first = tmp_path / "first"
    models.save_model(m, str(first), tokenizer=str(tmp_path / "tokenizer.json"))
    assert (first / "tokenizer.json").read_bytes() == (tmp_path / "tokenizer.json").read_bytes()
    _, auto = load_with_transformers(first)
    assert auto("the lazy fox")["input_ids"] == tok.encode("the lazy fox").ids
    # a model loaded from a directory is saved with that directory's tokenizer files
    again = tmp_path / "again"
    models.save_model(models.load_model(str(first)), str(again), tokenizer=str(first))
    assert (again / "tokenizer_config.json").read_bytes() == (first / "tokenizer_config.json").read_bytes()
    with pytest.raises(WorkerError, match="more than the model's vocab_size"):
        models.save_model(models.init_model(dict(tiny_config, vocab_size=128), seed=1), str(tmp_path / "small"), tokenizer=str(tmp_path / "tokenizer.json"))
    assert not (tmp_path / "small").exists()


def test_tiny_vocab_gets_a_tokenizer_within_its_ids(tiny_config, tmp_path):
    m = models.init_model(tiny_config, seed=0)  # vocab_size 64
    models.save_model(m, str(tmp_path / "m"))
    _, tok = load_with_transformers(tmp_path / "m")
    assert max(tok("any text at all, ÿ")["input_ids"]) < 64


CRASH = r"""
import os, signal, sys
sys.path.insert(0, {python!r})
from psyche_worker import model as models
stage = {stage!r}
if stage == "tokenizer":
    real = models.write_tokenizer
    def crash(dest, config, source):
        real(dest, config, source)
        os.kill(os.getpid(), signal.SIGKILL)  # the weights and tokenizer are half-way into the temporary directory
    models.write_tokenizer = crash
else:
    real_rename = os.rename
    calls = []
    def rename(a, b):
        calls.append(a)
        real_rename(a, b)
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGKILL)  # the old model moved aside, the new one not yet in place
    os.rename = rename
import json
cfg = json.loads({cfg!r})
models.save_model(models.init_model(cfg, seed=99), {out!r})
"""


@pytest.mark.parametrize("stage", ["tokenizer", "swap"])
def test_a_crash_mid_save_leaves_the_previous_model_intact(tiny_config, tmp_path, stage):
    out = tmp_path / "checkpoint"
    previous = models.init_model(tiny_config, seed=1)
    models.save_model(previous, str(out))
    before = models.param_hash(previous)
    code = CRASH.format(python=str(ROOT / "python"), stage=stage, cfg=json.dumps(tiny_config), out=str(out))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert r.returncode == -signal.SIGKILL, r.stderr.decode()
    # the previous checkpoint is still what loads (after the swap crash: recovered from its .old sibling)
    assert models.param_hash(models.load_model(str(out))) == before
    assert (out / "tokenizer.json").is_file()
    # and the next save succeeds and replaces it
    newer = models.init_model(tiny_config, seed=2)
    models.save_model(newer, str(out))
    assert models.param_hash(models.load_model(str(out))) == models.param_hash(newer) != before


def test_saved_in_several_files_with_an_index_loads_everywhere(tiny_config, tmp_path):
    """save_model with whole tensors given (as a sharded client gathers them) and a small max_shard_size writes
    Hugging Face's sharded layout; load_model and transformers read it back; a broken index is refused by name."""
    m = models.init_model(dict(tiny_config, vocab_size=300), seed=4)
    state = {n: p.detach().clone() for n, p in models.named_parameters_sorted(m)}
    out = tmp_path / "model"
    models.save_model(m, str(out), state=state, max_shard_size=20_000)
    files = sorted(p.name for p in out.iterdir())
    assert "model.safetensors.index.json" in files and "model.safetensors" not in files
    assert len([f for f in files if f.endswith(".safetensors")]) >= 2
    assert models.param_hash(m) in (out / "README.md").read_text()
    assert models.param_hash(models.load_model(str(out))) == models.param_hash(m)
    loaded, _ = load_with_transformers(out)
    assert models.param_hash(loaded.float()) == models.param_hash(m)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.norm.weight"] = "../elsewhere.safetensors"
    (out / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(WorkerError, match="model.safetensors.index.json: weight_map names '../elsewhere.safetensors'"):
        models.load_model(str(out))
