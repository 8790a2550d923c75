"""DisTrO compression throughput and size on the real gradients of the ~20M-parameter Llama.

Run: npm run bench -- distro   (or PYTHONPATH=python .venv/bin/python bench/distro_bench.py)

Compress   = chunked DCT + top-k + quantize + encode to the wire format (bytes out).
Decompress = decode + validate the bytes + inverse DCT back to dense tensors.
Throughput is fp32 megabytes of gradient per second (MB = 1e6 bytes). The reference is the DeMo
paper's code path (bloc97/DeMo, also Psyche's distro.rs): 3-operand einsum DCT over all chunks,
topk + gather; decompress by scatter_reduce(mean) into dense zeros and a dense 3-operand einsum IDCT.
A second, straightforward reference loops over chunks in Python (one einsum + topk per chunk).
Timings are medians of 5 after a warm-up; the machine is shared, so expect noise.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

from psyche_worker.distro import DistroConfig, DistroOptimizer, dct_matrix, topk_per_chunk  # noqa: E402
from psyche_worker.distro_codec import (  # noqa: E402
    EncodedTensor,
    decode_result,
    encode_result,
    quantize_values,
)

REPEATS = 5


def llama_gradients(seq_len=256):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = json.loads((ROOT / "templates/llama2-20m/model/config.json").read_text())
    for key in ("architectures", "model_type", "torch_dtype"):
        cfg.pop(key, None)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**cfg))
    tokens = torch.randint(0, cfg["vocab_size"], (1, seq_len))
    model(input_ids=tokens, labels=tokens).loss.backward()
    return model, [(n, p) for n, p in model.named_parameters()]


def timed(fn):
    fn()  # warm-up (caches, allocator)
    times = []
    out = None
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


# ---- ours


def ours_compress(opt: DistroOptimizer, grads):
    encoded = []
    for spec, transform, g in zip(opt.specs, opt.transforms, grads):
        indices, values = topk_per_chunk(transform.forward(g), spec.topk)
        payload, exponent, _ = quantize_values(values, opt.value_format)
        encoded.append(EncodedTensor(spec, indices.numpy(), payload, exponent))
    return encode_result(encoded, opt.value_format)


def ours_decompress(opt: DistroOptimizer, data: bytes):
    out = []
    for tensor, transform in zip(decode_result(data, opt.specs, opt.value_format), opt.transforms):
        out.append(transform.inverse_sparse(torch.from_numpy(tensor.indices),
                                            torch.from_numpy(tensor.values).float()))
    return out


# ---- reference (DeMo code path)


class ReferenceDeMo:
    def __init__(self, opt: DistroOptimizer, topk: int):
        self.chunks = [spec.chunk for spec in opt.specs]
        self.topk = topk
        # DeMo's f_dict holds dct(eye(n)) = D^T, b_dict holds idct(eye(n)) = D.
        self.f = {c: dct_matrix(c).T.contiguous() for spec in opt.specs for c in spec.chunk}
        self.b = {c: dct_matrix(c).contiguous() for spec in opt.specs for c in spec.chunk}

    def compress(self, grads):
        out = []
        for g, chunk in zip(grads, self.chunks):
            if g.dim() == 2:
                (rows, cols), (n1, n2) = g.shape, chunk
                x = g.reshape(rows // n1, n1, cols // n2, n2)  # "(y h) (x w) -> y h x w"
                x = torch.einsum("...ijkl, jb, ld -> ...ikbd", x, self.f[n1], self.f[n2])
                xshape = x.shape
                x = x.reshape(*xshape[:2], -1)  # "y x h w -> y x (h w)"
            else:
                x = g.reshape(-1, chunk[0]) @ self.f[chunk[0]]
                xshape = x.shape
            k = min(self.topk, x.shape[-1])
            idx = torch.topk(x.abs(), k=k, dim=-1, largest=True, sorted=False).indices
            out.append((idx, torch.gather(x, -1, idx), xshape))
        return out

    def decompress(self, compressed):
        out = []
        for (idx, val, xshape), chunk in zip(compressed, self.chunks):
            x = torch.zeros(xshape)
            if len(xshape) > 2:
                x = x.reshape(*xshape[:2], -1)
            x.scatter_reduce_(-1, idx, val, reduce="mean", include_self=False)
            if len(xshape) > 2:
                x = x.reshape(xshape)
                x = torch.einsum("...ijkl, kb, ld -> ...ibjd", x, self.b[chunk[0]], self.b[chunk[1]])
                out.append(x.reshape(x.shape[0] * x.shape[1], x.shape[2] * x.shape[3]))
            else:
                out.append((x @ self.b[chunk[0]]).reshape(-1))
        return out


class ReferencePerChunk:
    """The straightforward version: a Python loop over chunks, one einsum DCT + topk per chunk;
    decompress by scattering each chunk's top-k into zeros and one einsum IDCT per chunk."""

    def __init__(self, opt: DistroOptimizer, topk: int):
        self.specs = opt.specs
        self.topk = topk
        self.d = {c: dct_matrix(c) for spec in opt.specs for c in spec.chunk}

    def compress(self, grads):
        out = []
        for g, spec in zip(grads, self.specs):
            chunks = []
            if g.dim() == 2:
                (cr, cc) = spec.chunk
                d_r, d_c = self.d[cr], self.d[cc]
                for r in range(0, g.shape[0], cr):
                    for c in range(0, g.shape[1], cc):
                        coeffs = torch.einsum("ij,jk,lk->il", d_r, g[r:r + cr, c:c + cc], d_c).reshape(-1)
                        idx = torch.topk(coeffs.abs(), spec.topk, sorted=False).indices
                        chunks.append((idx, coeffs[idx]))
            else:
                d = self.d[spec.chunk[0]]
                for start in range(0, g.shape[0], spec.chunk[0]):
                    coeffs = torch.einsum("ij,j->i", d, g[start:start + spec.chunk[0]])
                    idx = torch.topk(coeffs.abs(), spec.topk, sorted=False).indices
                    chunks.append((idx, coeffs[idx]))
            out.append(chunks)
        return out

    def decompress(self, compressed):
        out = []
        for chunks, spec in zip(compressed, self.specs):
            x = torch.zeros(spec.shape)
            if len(spec.shape) == 2:
                (cr, cc) = spec.chunk
                d_r, d_c = self.d[cr], self.d[cc]
                per_row = spec.shape[1] // cc
                for n, (idx, val) in enumerate(chunks):
                    coeffs = torch.zeros(cr * cc).scatter_(0, idx, val).reshape(cr, cc)
                    r, c = (n // per_row) * cr, (n % per_row) * cc
                    x[r:r + cr, c:c + cc] = torch.einsum("ji,jk,kl->il", d_r, coeffs, d_c)
            else:
                c = spec.chunk[0]
                d = self.d[c]
                for n, (idx, val) in enumerate(chunks):
                    x[n * c:(n + 1) * c] = torch.einsum("ji,j->i", d, torch.zeros(c).scatter_(0, idx, val))
            out.append(x)
        return out


def machine():
    model_name = "unknown"
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name"):
                model_name = line.split(":", 1)[1].strip()
    except OSError:
        pass
    return os.cpu_count(), model_name


def main():
    threads = int(os.environ.get("DISTRO_BENCH_THREADS", os.cpu_count() or 1))
    torch.set_num_threads(threads)
    load_before = os.getloadavg()[0]
    model, named = llama_gradients()
    grads = [p.grad.detach().clone() for _, p in named]
    n_params = sum(g.numel() for g in grads)
    dense_bytes = 4 * n_params
    mb = dense_bytes / 1e6
    cpus, cpu_name = machine()
    print(f"model: llama2-20m, {n_params:,} parameters in {len(grads)} tensors; dense fp32 gradient {mb:.1f} MB")
    print(f"machine: nproc={cpus}, {cpu_name}; torch {torch.__version__}, {threads} threads")

    cfg = DistroConfig(compression_chunk=64, compression_topk=8, quantize_1bit=True)
    opt = DistroOptimizer(named, cfg, delay_correction=False)
    t_c, data = timed(lambda: ours_compress(opt, grads))
    t_d, dense_back = timed(lambda: ours_decompress(opt, data))

    ref = ReferenceDeMo(opt, cfg.compression_topk)
    t_rc, ref_compressed = timed(lambda: ref.compress(grads))
    t_rd, ref_back = timed(lambda: ref.decompress(ref_compressed))
    loop = ReferencePerChunk(opt, cfg.compression_topk)
    t_lc, loop_compressed = timed(lambda: loop.compress(grads))
    t_ld, loop_back = timed(lambda: loop.decompress(loop_compressed))
    loop_error = max(float((a - b).abs().max()) for a, b in zip(loop_back, ref_back))

    # Both implementations must agree on what they select and rebuild (values: 1-bit signs in ours).
    agree = all(set(map(tuple, torch.sort(ri, dim=-1).values.reshape(-1, ri.shape[-1]).tolist()))
                == set(map(tuple, torch.sort(torch.from_numpy(t.indices), dim=-1).values.tolist()))
                for (ri, _, _), t in zip(ref_compressed[:3], decode_result(data, opt.specs)[:3]))

    results = {}
    for value_format in ("fp16", "bf16"):
        opt_v = DistroOptimizer(named, DistroConfig(compression_chunk=64, compression_topk=8, quantize_1bit=False),
                                delay_correction=False, value_format=value_format)
        results[value_format] = len(ours_compress(opt_v, grads))

    # Full optimizer steps (momentum, residual, lookahead) for the worker's budget.
    step_opt = DistroOptimizer(named, cfg)
    t_produce, own = timed(lambda: step_opt.produce(1e-4))
    t_apply1, _ = timed(lambda: step_opt.apply([own], 1e-4))
    others = []
    for seed in range(3):
        for _, p in named:
            p.grad = torch.randn_like(p) * 1e-3
        others.append(DistroOptimizer(named, cfg, delay_correction=False).produce(1e-4))
    t_apply4, _ = timed(lambda: step_opt.apply([own] + others, 1e-4))

    lines = [
        f"compress   ours {mb / t_c:6.0f} MB/s ({t_c * 1e3:6.1f} ms) | per-chunk reference {mb / t_lc:5.0f} MB/s "
        f"({t_lc * 1e3:6.0f} ms) speed-up {t_lc / t_c:5.1f}x | DeMo batched einsum {mb / t_rc:5.0f} MB/s "
        f"({t_rc * 1e3:5.1f} ms) speed-up {t_rc / t_c:4.1f}x",
        f"decompress ours {mb / t_d:6.0f} MB/s ({t_d * 1e3:6.1f} ms) | per-chunk reference {mb / t_ld:5.0f} MB/s "
        f"({t_ld * 1e3:6.0f} ms) speed-up {t_ld / t_d:5.1f}x | DeMo batched einsum {mb / t_rd:5.0f} MB/s "
        f"({t_rd * 1e3:5.1f} ms) speed-up {t_rd / t_d:4.1f}x",
        f"per-chunk and DeMo references rebuild the same tensors: max difference {loop_error:.2e}",
        f"result size, topk 8 of 64x64, 1-bit: {len(data):,} bytes vs dense fp32 {dense_bytes:,} "
        f"= {dense_bytes / len(data):.0f}x smaller",
        f"result size with values: fp16 {results['fp16']:,} bytes ({dense_bytes / results['fp16']:.0f}x), "
        f"bf16 {results['bf16']:,} bytes ({dense_bytes / results['bf16']:.0f}x)",
        f"optimizer step: produce {t_produce * 1e3:.0f} ms, apply 1 result {t_apply1 * 1e3:.0f} ms, "
        f"apply 4 results {t_apply4 * 1e3:.0f} ms",
        f"ours and reference select the same coefficients (first 3 tensors): {agree}",
    ]
    print("\n".join(lines))
    targets = [
        ("compress >= 500 MB/s", mb / t_c >= 500), ("decompress >= 500 MB/s", mb / t_d >= 500),
        ("compress >= 10x per-chunk reference", t_lc / t_c >= 10),
        ("decompress >= 10x per-chunk reference", t_ld / t_d >= 10),
        ("compress >= 10x DeMo batched einsum", t_rc / t_c >= 10),
        ("decompress >= 10x DeMo batched einsum", t_rd / t_d >= 10),
        ("size >= 1200x smaller", dense_bytes / len(data) >= 1200),
    ]
    for name, ok in targets:
        print(f"target {name}: {'met' if ok else 'MISSED'}")
    print(f"load average (1 min) before/after: {load_before:.2f} / {os.getloadavg()[0]:.2f} "
          f"(above {threads} means other processes competed for the cores)")
    print(f"date: {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}")
    del model, dense_back, ref_back, loop_back


if __name__ == "__main__":
    main()
