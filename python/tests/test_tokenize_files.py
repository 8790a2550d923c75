"""psyche_worker.tokenize_files: text/JSONL -> token files + manifest, with a tiny BPE trained here."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from psyche_worker import tokenize_files

ROOT = Path(__file__).resolve().parents[2]
TEXT = "The quick brown fox jumps over the lazy dog.\nPack my box with five dozen liquor jugs.\n"


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"], show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([TEXT] * 20, trainer=trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


def read_ids(out: Path, manifest: dict) -> np.ndarray:
    dtype = "<u2" if manifest["token_size"] == 2 else "<u4"
    return np.concatenate([np.fromfile(out / name, dtype=dtype) for name in manifest["files"]])


@pytest.mark.parametrize("token_size", [2, 4])
def test_text_and_jsonl_round_trip_with_eos_and_shards(tmp_path, tokenizer_path, token_size, capsys):
    from tokenizers import Tokenizer

    (tmp_path / "a.txt").write_text(TEXT)
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "five dozen"}) + "\n\n" + json.dumps({"text": "lazy dog", "id": 2}) + "\n")
    out = tmp_path / "out"
    code = tokenize_files.main(
        [
            str(tmp_path / "a.txt"),
            str(tmp_path / "b.jsonl"),
            "--tokenizer",
            str(tokenizer_path),
            "--out",
            str(out),
            "--token-size",
            str(token_size),
            "--shard-tokens",
            "7",
        ]
    )
    assert code == 0
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [e["event"] for e in events][0] == "start" and events[-1]["event"] == "done"
    manifest = json.loads((out / "manifest.json").read_text())
    ids = read_ids(out, manifest)
    assert manifest["format"] == "psyche-tokens/1" and manifest["token_size"] == token_size
    assert manifest["tokens"] == ids.size and len(manifest["files"]) == -(-ids.size // 7)
    assert manifest["vocab_size"] == 300 and len(manifest["tokenizer_sha256"]) == 64
    assert all((out / f).stat().st_size <= 7 * token_size for f in manifest["files"])
    assert not list(out.glob(".*.tmp")), "no temporary files left behind"
    tok = Tokenizer.from_file(str(tokenizer_path))
    eos = tok.token_to_id("<|endoftext|>")
    docs = np.split(ids, np.where(ids == eos)[0] + 1)[:-1]
    assert [tok.decode(d[:-1].tolist()) for d in docs] == [TEXT, "five dozen", "lazy dog"]
    assert all(d[-1] == eos for d in docs)


def test_bad_inputs_are_one_clear_line(tmp_path, tokenizer_path, capsys):
    def error(*args) -> str:
        assert tokenize_files.main([*map(str, args), "--tokenizer", str(tokenizer_path), "--out", str(tmp_path / "o")]) == 1
        return json.loads(capsys.readouterr().out.splitlines()[-1])["message"]

    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"text": \n')
    assert error(tmp_path / "bad.jsonl") == f"{tmp_path / 'bad.jsonl'}:2: not valid JSON (Expecting value: line 2 column 1 (char 10))"
    (tmp_path / "nofield.jsonl").write_text('{"body": "x"}\n')
    assert error(tmp_path / "nofield.jsonl").endswith("nofield.jsonl:1: no string field 'text'")
    assert error(tmp_path / "missing.txt").endswith("missing.txt: no such input file")
    assert not (tmp_path / "o" / "manifest.json").exists()
    (tmp_path / "ok.txt").write_text("dog")
    assert tokenize_files.main([str(tmp_path / "ok.txt"), "--tokenizer", str(tokenizer_path), "--out", str(tmp_path / "o")]) == 0
    capsys.readouterr()
    assert "already holds token data (manifest.json" in error(tmp_path / "ok.txt")
    (tmp_path / "junk.json").write_text("not a tokenizer")
    code = tokenize_files.main([str(tmp_path / "ok.txt"), "--tokenizer", str(tmp_path / "junk.json"), "--out", str(tmp_path / "p")])
    assert code == 1 and "junk.json: not a Hugging Face tokenizer.json" in capsys.readouterr().out


def test_runs_as_a_module_printing_json_lines(tmp_path, tokenizer_path):
    (tmp_path / "a.txt").write_text(TEXT * 3)
    result = subprocess.run(
        [sys.executable, "-m", "psyche_worker.tokenize_files", str(tmp_path / "a.txt"), "--tokenizer", str(tokenizer_path), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT / "python"), "PATH": "/usr/bin:/bin"},
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines()]
    assert events[-1]["event"] == "done" and events[-1]["tokens"] > 0
