"""Turns text or JSONL files into Psyche token files with a Hugging Face tokenizer (tokenizer.json).

    python -m psyche_worker.tokenize_files --tokenizer tokenizer.json --out DIR [--token-size 2|4] FILE...

Input: *.jsonl / *.ndjson: one JSON object per line, its --text-field (default "text") is a document;
anything else: the whole file is one document (UTF-8). Files are streamed in ~1 MB pieces cut at line
ends, so no input has to fit in memory. An end-of-text token (--eos-token, or the tokenizer's own
<|endoftext|>, </s>, <eos> or <|end_of_text|> when present) follows every document.

Output: DIR/tokens-NNNNN.bin (flat little-endian uint16 or uint32 ids, at most --shard-tokens per file)
and DIR/manifest.json ({format: "psyche-tokens/1", token_size, vocab_size, tokens, files, tokenizer,
tokenizer_sha256, source}), each written under a temporary name and renamed into place; the manifest
comes last, so a directory with a manifest is always complete.

stdout carries JSON lines only: {"event": "start" | "progress" | "done" | "error", ...}.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>")
PIECE_BYTES = 1 << 20
PROGRESS_EVERY_S = 0.25


class InputError(Exception):
    """Bad input: reported as one line naming the file (and line)."""


def emit(event: str, **fields) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def is_jsonl(path: Path) -> bool:
    return path.suffix.lower() in (".jsonl", ".ndjson")


def documents(path: Path, text_field: str):
    """Yields (text piece, ends a document, bytes consumed) for one input file."""
    if is_jsonl(path):
        with path.open("rb") as f:
            for number, raw in enumerate(f, 1):
                if not raw.strip():
                    yield "", False, len(raw)
                    continue
                try:
                    record = json.loads(raw)
                except (json.JSONDecodeError, UnicodeDecodeError) as error:
                    raise InputError(f"{path}:{number}: not valid JSON ({error})") from None
                text = record.get(text_field) if isinstance(record, dict) else None
                if not isinstance(text, str):
                    raise InputError(f"{path}:{number}: no string field {text_field!r}")
                yield text, True, len(raw)
        return
    with path.open("rb") as f:
        piece: list[bytes] = []
        size = 0
        for raw in f:
            piece.append(raw)
            size += len(raw)
            if size >= PIECE_BYTES:
                yield decode(b"".join(piece), path), False, size
                piece, size = [], 0
        yield decode(b"".join(piece), path), True, size


def decode(data: bytes, path: Path) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise InputError(f"{path}: not UTF-8 text at byte {error.start} of a piece ({error.reason})") from None


class ShardWriter:
    """Writes ids into shards of at most `shard_tokens`, each under a temporary name until complete."""

    def __init__(self, out: Path, dtype: str, shard_tokens: int):
        self.out, self.dtype, self.shard_tokens = out, dtype, shard_tokens
        self.files: list[str] = []
        self.tokens = 0
        self.handle = None
        self.in_shard = 0

    def _tmp(self, name: str) -> Path:
        return self.out / f".{name}.tmp"

    def write(self, ids: np.ndarray) -> None:
        while ids.size:
            if self.handle is None:
                self.files.append(f"tokens-{len(self.files):05d}.bin")
                self.handle = self._tmp(self.files[-1]).open("wb")
                self.in_shard = 0
            take = min(ids.size, self.shard_tokens - self.in_shard)
            self.handle.write(ids[:take].astype(self.dtype, copy=False).tobytes())
            self.in_shard += take
            self.tokens += take
            ids = ids[take:]
            if self.in_shard == self.shard_tokens:
                self._finish()

    def _finish(self) -> None:
        self.handle.close()
        self.handle = None
        os.replace(self._tmp(self.files[-1]), self.out / self.files[-1])

    def close(self) -> None:
        if self.handle is not None:
            self._finish()

    def abort(self) -> None:
        if self.handle is not None:
            self.handle.close()
            self._tmp(self.files[-1]).unlink(missing_ok=True)


def tokenize(
    inputs: list[Path],
    tokenizer_path: Path,
    out: Path,
    token_size: int,
    text_field: str = "text",
    eos_token: str | None = None,
    no_eos: bool = False,
    shard_tokens: int = 1 << 28,
    force: bool = False,
) -> dict:
    from tokenizers import Tokenizer

    for path in inputs:
        if not path.is_file():
            raise InputError(f"{path}: no such input file")
    try:
        tokenizer = Tokenizer.from_file(str(tokenizer_path))
    except Exception as error:  # tokenizers raises plain Exception for unreadable files
        raise InputError(f"{tokenizer_path}: not a Hugging Face tokenizer.json ({str(error).splitlines()[0]})") from None
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    if token_size == 2 and vocab_size > 1 << 16:
        raise InputError(f"{tokenizer_path}: vocabulary of {vocab_size} ids does not fit 2-byte tokens; use --token-size 4")
    eos_id = None
    if not no_eos:
        if eos_token is not None:
            eos_id = tokenizer.token_to_id(eos_token)
            if eos_id is None:
                raise InputError(f"{tokenizer_path}: has no token {eos_token!r} (--eos-token)")
        else:
            eos_id = next((tokenizer.token_to_id(t) for t in EOS_CANDIDATES if tokenizer.token_to_id(t) is not None), None)
    out.mkdir(parents=True, exist_ok=True)
    existing = [p.name for p in out.iterdir() if p.name == "manifest.json" or p.suffix in (".bin", ".ds", ".npy")]
    if existing and not force:
        raise InputError(f"{out}: already holds token data ({', '.join(sorted(existing)[:3])}); use --force to replace it")
    for name in existing:
        (out / name).unlink()

    total_bytes = sum(p.stat().st_size for p in inputs)
    emit("start", files=len(inputs), bytes_total=total_bytes, vocab_size=vocab_size, eos_id=eos_id)
    writer = ShardWriter(out, "<u2" if token_size == 2 else "<u4", shard_tokens)
    done_bytes = 0
    last = 0.0
    started = time.time()
    batch: list[tuple[str, bool]] = []
    batch_bytes = 0

    def flush(path: Path) -> None:
        # Many small documents are encoded together: one encode_batch call per ~1 MB of text.
        nonlocal batch, batch_bytes, done_bytes, last
        encodings = tokenizer.encode_batch([text for text, _ in batch], add_special_tokens=False)
        for (_, ends_doc), encoding in zip(batch, encodings):
            ids = encoding.ids
            if ends_doc and eos_id is not None:
                ids.append(eos_id)
            writer.write(np.asarray(ids, dtype=np.uint32))
        done_bytes += batch_bytes
        batch, batch_bytes = [], 0
        now = time.time()
        if now - last >= PROGRESS_EVERY_S:
            last = now
            emit("progress", file=str(path), bytes_done=done_bytes, bytes_total=total_bytes, tokens=writer.tokens)

    try:
        for path in inputs:
            for text, ends_doc, consumed in documents(path, text_field):
                batch.append((text, ends_doc))
                batch_bytes += consumed
                if batch_bytes >= PIECE_BYTES:
                    flush(path)
            if batch:
                flush(path)
        writer.close()
    except BaseException:
        writer.abort()
        raise
    if writer.tokens == 0:
        raise InputError(f"{', '.join(map(str, inputs))}: no text to tokenize")
    manifest = {
        "format": "psyche-tokens/1",
        "token_size": token_size,
        "vocab_size": vocab_size,
        "tokens": writer.tokens,
        "files": writer.files,
        "tokenizer": str(tokenizer_path.resolve()),
        "tokenizer_sha256": hashlib.sha256(tokenizer_path.read_bytes()).hexdigest(),
        "source": ", ".join(p.name for p in inputs),
    }
    tmp = out / ".manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(tmp, out / "manifest.json")
    emit("progress", file=str(inputs[-1]), bytes_done=total_bytes, bytes_total=total_bytes, tokens=writer.tokens)
    return {**manifest, "dir": str(out), "seconds": round(time.time() - started, 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="psyche_worker.tokenize_files", description=__doc__.split("\n\n")[0])
    parser.add_argument("inputs", nargs="+", type=Path)
    parser.add_argument("--tokenizer", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--token-size", type=int, choices=(2, 4), default=2)
    parser.add_argument("--text-field", default="text")
    parser.add_argument("--eos-token")
    parser.add_argument("--no-eos", action="store_true")
    parser.add_argument("--shard-tokens", type=int, default=1 << 28)
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args(argv)
    if args.shard_tokens <= 0:
        parser.error("--shard-tokens must be positive")
    try:
        result = tokenize(args.inputs, args.tokenizer, args.out, args.token_size, args.text_field, args.eos_token, args.no_eos, args.shard_tokens, args.force)
    except InputError as error:
        emit("error", message=str(error))
        return 1
    except OSError as error:
        emit("error", message=f"{error.filename or ''}: {error.strerror or error}".lstrip(": "))
        return 1
    emit("done", **result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
