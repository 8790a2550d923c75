"""The worker process: a ZeroMQ ROUTER socket serving one client's requests, one at a time.

Started by the TypeScript client (src/core/worker/) as ``python -m psyche_worker --endpoint E``.
Prints one JSON line ``{"event": "ready", ...}`` on stdout once it listens. Every request gets a
reply: a result, or ``{"ok": false, "error": {"kind", "message", ...}}`` — never silence: an error is
data, and a kind may carry structured fields (a refused result's ``index``) so the client never parses the message.
The ops and the error kinds with their fields are listed in ops.json, the table the TypeScript client reads too.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import torch
import zmq

from . import model as models
from .loss_mask import pair_frames
from .protocol import (
    ProtocolError,
    WorkerError,
    decode_header,
    encode_header,
    frame_specs,
    frame_to_tensor,
    tensor_to_frame,
)
from . import reuse_freed_memory
from .parallel import Group, join_group, listen_loopback, parse_devices, start_followers
from .sharding import Sharding
from .trainer import Trainer

Reply = tuple[dict[str, Any], list]

OPS_TABLE = json.loads((Path(__file__).parent / "ops.json").read_text(encoding="utf-8"))
"""ops.json: the worker's ops and error kinds, shared with the TypeScript client (src/core/worker/ops.ts)."""
# served by handle() itself: it ends the loop
LOOP_OPS = {"shutdown"}


def die_with_parent() -> None:
    """Never outlive the client: the kernel signals us when the parent dies (Linux), and a watchdog
    thread covers other platforms and the race where the parent died before prctl ran."""
    from . import STARTUP_PARENT_PID

    parent = STARTUP_PARENT_PID
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        except OSError:
            pass
    if os.getppid() != parent:
        os._exit(3)

    def watch() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(3)
            time.sleep(0.5)

    threading.Thread(target=watch, daemon=True, name="parent-watchdog").start()


def _buffer(part: Any) -> Any:
    """A request frame's bytes: a zmq.Frame on rank 0, plain bytes on the followers (parallel.py)."""
    return part.buffer if isinstance(part, zmq.Frame) else part


class Worker:
    def __init__(self, device: str, threads: int | None, group: Group | None = None, precision: str = "auto", shard: bool = False):
        if threads:
            torch.set_num_threads(threads)
            try:
                torch.set_num_interop_threads(1)
            except RuntimeError:
                pass  # already set once in this process
        self.device = models.resolve_device(device)
        self.precision = models.resolve_precision(precision, self.device)
        self.group = group
        # --shard: the ranks hold one model in shards (sharding.py) rather than a replica each (parallel.py)
        self.shard = shard and group is not None and group.world > 1
        self.trainer: Trainer | None = None
        # the loaded model's directory, if it came from one: its tokenizer goes with a saved model
        self.source_dir: str | None = None
        self.ops = handlers(self)

    @property
    def t(self) -> Trainer:
        if self.trainer is None:
            raise WorkerError("no model loaded: send init_model first", kind="state")
        return self.trainer

    # -- ops ---------------------------------------------------------------------------------------
    def op_hello(self, h, frames) -> Reply:
        return {
            "pid": os.getpid(),
            "torch": torch.__version__,
            "device": str(self.device),
            "threads": torch.get_num_threads(),
            "cuda": torch.cuda.is_available(),
            "data_parallel": self.group.world if self.group and not self.shard else 1,
            "shards": self.group.world if self.group and self.shard else 1,
            "precision": self.precision,
            # what init_model builds: Psyche's architecture names -> config.json model types (null: any causal LM)
            "architectures": {name: list(types) if types else None for name, types in models.ARCHITECTURES.items()},
        }, []

    def op_init_model(self, h, frames) -> Reply:
        seed = int(h.get("seed", 0))
        self.source_dir = None
        # the run's Psyche architecture (HfLlama, HfDeepseek, HfAuto) the model must be; none: any causal LM
        architecture = h.get("architecture")
        if architecture is not None and not isinstance(architecture, str):
            raise WorkerError(f"init_model: architecture must be a string, got {architecture!r}")
        if h.get("model_dir"):
            m = models.load_model(h["model_dir"], architecture)
            self.source_dir = h["model_dir"]
        elif isinstance(h.get("config"), dict):
            m = models.init_model(h["config"], seed, architecture)
        else:
            raise WorkerError("init_model needs model_dir or config")
        torch.manual_seed(seed)
        # sharded: each model is sharded afresh (Trainer.configure)
        sharding = Sharding(self.group.rank, self.group.world, self.group.data) if self.shard and self.group else None
        self.trainer = Trainer(m, self.device, group=self.group, precision=self.precision, sharding=sharding)
        n = sum(p.numel() for p in m.parameters())
        return {
            "parameters": n,
            "vocab_size": self.trainer.vocab_size,
            "max_position_embeddings": self.trainer.max_positions,
            "param_hash": models.param_hash(m),
        }, []

    def op_configure(self, h, frames) -> Reply:
        self.t.configure(
            h.get("optimizer") or {},
            h.get("lr_schedule"),
            int(h.get("micro_batch", 8)),
            simulate_peers=int(h.get("simulate_peers", 1)),
            delay_correction=bool(h.get("delay_correction", False)),
        )
        reply: dict[str, Any] = {"optimizer": self.t.optimizer_name}
        # What a peer's result must look like, for the client's validator (src/core/verify/result.ts).
        result_format = self.t.result_format()
        if result_format is not None:
            reply["result_format"] = result_format
        return reply, []

    def _tokens(self, h, frames: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One batch: its token ids, and its loss mask when the header says loss_mask (loss_mask.py)."""
        batches = pair_frames(h, frames, h.get("op", "?"))
        if len(batches) != 1:
            raise WorkerError(f"expected one frame of token ids, got {len(frames)}")
        return batches[0]

    def op_train_step(self, h, frames) -> Reply:
        tokens, mask = self._tokens(h, frames)
        return self.t.train_step(tokens, int(h.get("step", 0)), mask), []

    def op_evaluate(self, h, frames) -> Reply:
        """Frame: token ids (and loss mask). The mean loss on them at the replicated parameters (validation: changes nothing)."""
        return self.t.evaluate_replicated(*self._tokens(h, frames)), []

    def op_apply_results(self, h, frames) -> Reply:
        for i, f in enumerate(frames):
            if f.dtype != torch.uint8 or f.ndim != 1:
                raise WorkerError(f"apply_results: frame {i} must be a 1-D uint8 result")
        self.t.apply_results([f.numpy().tobytes() for f in frames], int(h.get("step", 0)))
        return {"applied": len(frames), "param_hash": self._param_hash()}, []

    def op_train_round(self, h, frames) -> Reply:
        """Frames: token ids, then the previous round's result frames (uint8) to apply."""
        if not frames:
            raise WorkerError("train_round: expected a frame of token ids first")
        batch = 2 if h.get("loss_mask") else 1
        self.op_begin_round(h, frames[:batch])
        return self.op_finish_round(h, frames[batch:])

    def op_begin_round(self, h, frames) -> Reply:
        """Frame: token ids. Forward/backward of the round; finish_round applies and produces."""
        tokens, mask = self._tokens(h, frames)
        return self.t.begin_round(tokens, int(h.get("step", 0)), mask, speculative=bool(h.get("speculative", False))), []

    def op_discard_round(self, h, frames) -> Reply:
        """Undo a speculative begin_round (header speculative) whose round gave this client other batches."""
        self.t.discard_round(int(h.get("step", 0)))
        return {"discarded": int(h.get("step", 0))}, []

    def op_finish_round(self, h, frames) -> Reply:
        """Frames: the previous round's result frames (uint8) to apply, then this round's result is produced."""
        for i, f in enumerate(frames):
            if f.dtype != torch.uint8 or f.ndim != 1:
                raise WorkerError(f"train_round: result frame {i} must be a 1-D uint8 result")
        apply_step = h.get("apply_step")
        if apply_step is None and frames:
            raise WorkerError("train_round: results given without apply_step")
        reply, result = self.t.finish_round(int(h.get("step", 0)), None if apply_step is None else int(apply_step), [f.numpy().tobytes() for f in frames])
        return {
            **reply,
            "applied": len(frames),
            "param_hash": self._param_hash(),
            "frames": [{"name": "result", "dtype": "uint8", "shape": [len(result)]}],
        }, [result]

    def op_score_results(self, h, frames) -> Reply:
        """Frames: `results` result frames (uint8), then token batches. Reply: losses before / after each (with
        header `own_batches`: after each result, on its own batch and the last one only)."""
        n = int(h.get("results", 0))
        if n < 0 or n > len(frames):
            raise WorkerError(f"score_results: {n} results but {len(frames)} frames")
        for i, f in enumerate(frames[:n]):
            if f.dtype != torch.uint8 or f.ndim != 1:
                raise WorkerError(f"score_results: frame {i} must be a 1-D uint8 result")
        own = bool(h.get("own_batches", False))
        batches = pair_frames(h, frames[n:], "score_results")
        if own and len(batches) != n + 1:
            raise WorkerError(f"score_results: own_batches needs {n + 1} batches after the {n} results, got {len(batches)}")
        tokens, masks = [t for t, _ in batches], [m for _, m in batches]
        reply = self.t.score_results([f.numpy().tobytes() for f in frames[:n]], int(h.get("step", 0)), tokens, own_batches=own, masks=masks)
        return reply, []

    def op_param_hash(self, h, frames) -> Reply:
        return {"param_hash": self._param_hash()}, []

    @property
    def _answers(self) -> bool:
        """Rank 0 answers the client; the other ranks run each op only for its collectives."""
        return self.group is None or self.group.rank == 0

    def _whole(self):
        """The whole parameters on rank 0; on the others, the collectives that gather them, and nothing kept."""
        whole = self.t.whole_parameters()
        if self._answers:
            return whole
        for _ in whole:
            pass
        return iter(())

    def _param_hash(self) -> str:
        return models.hash_sorted_tensors(self._whole())

    def op_export_params(self, h, frames) -> Reply:
        specs, bufs = [], []
        named = list(self._whole())
        for name, p in named:
            spec, buf = tensor_to_frame(name, p)
            specs.append(spec)
            bufs.append(buf)
        return {"frames": specs, "param_hash": models.hash_named_tensors(named)}, bufs

    def op_import_params(self, h, frames) -> Reply:
        names = [s["name"] for s in h["frames"]]
        params = {name: p for name, p in self.t.model.named_parameters()}
        if sorted(names) != sorted(params):
            missing, extra = sorted(set(params) - set(names)), sorted(set(names) - set(params))
            raise WorkerError(f"import_params: parameter names differ from the model (missing {missing[:4]}, unexpected {extra[:4]})")
        for name, tensor in zip(names, frames):
            p = params[name]
            if tuple(tensor.shape) != tuple(p.shape) or tensor.dtype != p.dtype:
                raise WorkerError(f"import_params: {name} is {tensor.dtype}{list(tensor.shape)}, model has {p.dtype}{list(p.shape)}")
        self.t.import_whole(dict(zip(names, frames)))
        return {"param_hash": self._param_hash()}, []

    def op_save_model(self, h, frames) -> Reply:
        if not h.get("dir"):
            raise WorkerError("save_model needs dir")
        # save what every replica holds, not a local change such as a pending speculative update
        self.t.restore_replicated()
        state = dict(self._whole()) if self.shard else None  # every rank gathers; rank 0 writes
        if self.group and self.group.rank != 0:
            return {"dir": h["dir"]}, []  # the ranks hold identical parameters: rank 0 writes them
        # the tokenizer: as asked, else the one the loaded model came with, else a byte-level one
        tokenizer = h.get("tokenizer") or self.source_dir
        card = h.get("card") if isinstance(h.get("card"), dict) else None
        size = h.get("max_shard_size")
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise WorkerError(f"save_model: max_shard_size {size!r} must be a positive number of bytes")
        models.save_model(self.t.model, h["dir"], tokenizer=tokenizer, card=card, state=state, max_shard_size=size or "5GB")
        return {"dir": h["dir"]}, []

    # -- loop --------------------------------------------------------------------------------------
    def handle(self, parts: list[zmq.Frame]) -> tuple[dict[str, Any], list, bool]:
        header: dict[str, Any] = {}
        try:
            header = decode_header(_buffer(parts[0]))
            rid = header.get("id")
            if header["op"] in LOOP_OPS:
                return {"id": rid, "ok": True}, [], True
            op = self.ops.get(header["op"])
            if op is None:
                raise ProtocolError(f"unknown op {header['op']!r}")
            specs = frame_specs(header, len(parts) - 1)
            started = time.perf_counter()
            tensors = [frame_to_tensor(s, _buffer(p)) for s, p in zip(specs, parts[1:])]
            result, out_frames = op(header, tensors)
            # time spent inside the worker: the client subtracts it from its round trip to see overhead
            return {"id": rid, "ok": True, **result, "op_seconds": time.perf_counter() - started}, out_frames, False
        except ProtocolError as exc:
            return {"id": header.get("id"), "ok": False, "error": {"kind": "protocol", "message": str(exc)}}, [], False
        except WorkerError as exc:
            return {"id": header.get("id"), "ok": False, "error": exc.reply()}, [], False
        except Exception as exc:  # a bug or a torch error: report it rather than die silently
            traceback.print_exc(file=sys.stderr)
            return {"id": header.get("id"), "ok": False, "error": {"kind": "internal", "message": f"{type(exc).__name__}: {exc}"}}, [], False


def handlers(worker: Worker) -> dict[str, Callable[[dict[str, Any], list[torch.Tensor]], Reply]]:
    """Every op of ops.json but the loop's own, served by the worker's op_<name> method."""
    missing = [name for name in OPS_TABLE["ops"] if name not in LOOP_OPS and not callable(getattr(worker, f"op_{name}", None))]
    if missing:
        raise RuntimeError(f"ops.json lists op(s) the worker does not serve: {missing}")
    return {name: getattr(worker, f"op_{name}") for name in OPS_TABLE["ops"] if name not in LOOP_OPS}


def serve(endpoint: str, device: str, threads: int | None, data_parallel: int = 1, precision: str = "auto", shard: int = 1) -> None:
    die_with_parent()
    reuse_freed_memory()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if shard > 1 and data_parallel > 1:
        raise WorkerError(
            f"--shard {shard} with --data-parallel {data_parallel}: give one or the other (sharded and replicated at once is not supported)", kind="device"
        )
    devices = parse_devices(device, shard if shard > 1 else data_parallel)
    group: Group | None = None
    followers = []
    if len(devices) > 1:
        # data parallelism (parallel.py): this process is rank 0 and the only one the client talks to
        listener = listen_loopback()
        port = listener.getsockname()[1]
        followers = start_followers(devices, threads, port, precision, shard=shard > 1)
        group = join_group(0, len(devices), port, models.resolve_device(devices[0]), listener)
    worker = Worker(devices[0], threads, group, precision, shard=shard > 1)
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 1000)
    # an ipc socket file is created with the umask's permissions: owner only, whatever the umask
    umask = os.umask(0o177)
    try:
        sock.bind(endpoint)
    finally:
        os.umask(umask)
    print(
        json.dumps(
            {
                "event": "ready",
                "pid": os.getpid(),
                "endpoint": endpoint,
                "device": str(worker.device),
                "devices": devices,
                "threads": torch.get_num_threads(),
                "torch": torch.__version__,
                "precision": worker.precision,
            }
        ),
        flush=True,
    )
    try:
        while True:
            identity, *parts = sock.recv_multipart(copy=False)
            if not parts:
                continue
            if group:
                group.broadcast_request([bytes(p.buffer) for p in parts])
            reply, frames, stop = worker.handle(parts)
            sock.send_multipart([identity, encode_header(reply), *frames], copy=False)
            if stop:
                break
    finally:
        sock.close(linger=1000)
        ctx.term()
        if endpoint.startswith("ipc://"):
            try:
                os.unlink(endpoint[len("ipc://") :])
            except OSError:
                pass
        for p in followers:
            try:
                p.wait(timeout=10)
            except Exception:
                p.kill()


def follow(rank: int, world: int, port: int, device: str, threads: int | None, precision: str = "auto", shard: bool = False) -> None:
    """A data-parallel rank > 0: runs every request rank 0 broadcasts, and answers nothing (parallel.py)."""
    die_with_parent()
    reuse_freed_memory()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    group = join_group(rank, world, port, models.resolve_device(device))
    worker = Worker(device, threads, group, precision, shard=shard)
    while True:
        parts = group.broadcast_request(None)
        _, _, stop = worker.handle(parts)
        if stop:
            break
    torch.distributed.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="psyche_worker", description="psyche's PyTorch worker")
    parser.add_argument("--endpoint", required=True, help="ZeroMQ endpoint to bind, e.g. ipc:///tmp/w.sock")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N, or one device per data-parallel rank: cuda:0,cuda:1 or cpu,cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (per rank)")
    parser.add_argument("--data-parallel", type=int, default=1, help="ranks of one device kind (cpu: N processes; cuda: GPUs 0..N-1)")
    parser.add_argument("--shard", type=int, default=1, help="ranks that hold one model in shards (FSDP2): cpu: N processes; cuda: GPUs 0..N-1")
    parser.add_argument("--precision", default="auto", help="auto | fp32 | bf16: forward passes under bf16 autocast (weights stay fp32); auto = bf16 on CUDA")
    # internal: a data-parallel rank > 0, started by rank 0 (parallel.start_followers)
    parser.add_argument("--follower", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--world", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--master-port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        if args.follower:
            follow(args.rank, args.world, args.master_port, args.device, args.threads, args.precision, shard=args.shard > 1)
            return
        serve(args.endpoint, args.device, args.threads, args.data_parallel, args.precision, args.shard)
    except WorkerError as exc:
        print(json.dumps({"event": "fatal", "kind": exc.kind, "message": str(exc)}), flush=True)
        sys.exit(2)
