"""Memory and speed of train.parallel=fsdp against DDP at 2 processes, as ratios against DDP measured in the same run.

    python scripts/bench_parallel.py                          # CPU, gloo: 2 processes of 1 thread each
    python scripts/bench_parallel.py --d-model 768 --layers 12 --batch-size 8 --seq-len 512   # on 2 GPUs

Each round launches ``torchrun --nproc_per_node 2`` once per mode (the order alternating between rounds, so
machine noise hits both), in which each process builds the same seeded model (norm=rmsnorm), wraps it as
training does (DistributedDataParallel, or training/step/fsdp.py's ``shard``), and takes warm-up then timed
AdamW steps on random tokens; rank 0 reports tokens/s. One more launch per mode measures memory: each process's
peak above what it held before the model was built (CPU: the peak resident set; CUDA: the allocator's peak),
and the bytes it holds for parameters, gradients and optimizer state (a run record's ``runtime.memory_per_rank``).
Printed: tokens/s as the median over rounds, and FSDP's ratio to DDP for each figure.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parents[1]
MODES = ("ddp", "fsdp")


def current_rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def warm_up_libraries(cfg, device: torch.device) -> None:
    """A step of a one-layer model and a collective, so that what loading kernels and communication costs is
    in the baseline, not in the figures (on CPU about 150 MB of resident memory per process)."""
    import dataclasses

    import torch.distributed as dist

    from model import build_model

    small = build_model(dataclasses.replace(cfg, d_model=64, n_heads=4, n_kv_heads=4, n_layers=1)).to(device)
    tokens = torch.randint(0, cfg.vocab_size, (2, 9), device=device)
    small(tokens[:, :-1], tokens[:, 1:]).objective.backward()
    dist.all_reduce(torch.ones(1, device=device))


def worker(args: argparse.Namespace) -> None:
    """One process of one launch: build, wrap, train, and (rank 0) write every rank's figures to args.out."""
    from training.run.runtime import resolve_device
    from training.step.distributed import init_distributed

    device = resolve_device(args.device, int(os.environ["LOCAL_RANK"]))
    group = init_distributed(device.type)
    try:
        measure(args, device, group)  # returns first: a DDP wrapper outliving its gloo group hangs at exit
    finally:
        group.close()


def measure(args: argparse.Namespace, device: torch.device, group) -> None:
    """Build, wrap and train as ``args.worker`` says; rank 0 writes every rank's figures and tokens/s."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from model import ModelConfig, build_model
    from training.step.adamw import adamw
    from training.step.fsdp import shard  # imported in both modes, so its import is in both baselines
    from training.step.optim import memory_per_rank

    cuda = device.type == "cuda"
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=args.vocab_size, d_model=args.d_model, n_layers=args.layers, n_heads=args.heads,
        n_kv_heads=args.heads, max_seq_len=args.seq_len,
    )  # fmt: skip
    warm_up_libraries(cfg, device)
    before = torch.cuda.memory_allocated(device) if cuda else current_rss_bytes()
    model = build_model(cfg)
    if args.worker == "fsdp":
        train_model = shard(model, device, group, use_compile=False, precision="bf16" if cuda else "fp32")
    else:
        model = model.to(device)
        train_model = DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    train_cfg = SimpleNamespace(
        lr=1e-4, weight_decay=0.1, weight_decay_mode="coupled", beta1=0.9, beta2=0.95, decay_norms_and_embeddings=False
    )
    optimizer = adamw(list(model.named_parameters()), train_cfg, device)
    generator = torch.Generator().manual_seed(1 + group.rank)
    tokens = torch.randint(0, cfg.vocab_size, (args.batch_size, args.seq_len + 1), generator=generator).to(device)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else torch.autocast("cpu", enabled=False)

    def step() -> None:
        with autocast:
            loss = train_model(tokens[:, :-1], tokens[:, 1:]).objective
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(args.warmup):
        step()
    if cuda:
        torch.cuda.synchronize(device)
    dist.barrier()
    started = time.perf_counter()
    for _ in range(args.steps):
        step()
    if cuda:
        torch.cuda.synchronize(device)
    dist.barrier()
    seconds = time.perf_counter() - started
    peak = torch.cuda.max_memory_allocated(device) if cuda else peak_rss_bytes()
    figures = {"peak_bytes": peak - before, **memory_per_rank(model, optimizer)}
    gathered = [None] * group.world_size
    dist.all_gather_object(gathered, figures)
    if group.is_main:
        tokens_per_s = args.steps * args.batch_size * args.seq_len * group.world_size / seconds
        Path(args.out).write_text(json.dumps({"tokens_per_s": tokens_per_s, "ranks": gathered}))
    dist.barrier()  # every rank done before any tears its connections down


def launch(mode: str, args: argparse.Namespace, out: Path, memory: bool = False) -> dict:
    """One ``torchrun --nproc_per_node 2`` of ``mode``. A memory launch takes one step after one warm-up step
    (the peak comes with the first optimizer step) under glibc's fixed mmap threshold, which hands every
    freed block over 128 KiB back at once, so that the resident set follows the live tensors instead of
    what the allocator kept (FSDP frees and allocates a block's gathered weights every step)."""
    passed = {**vars(args), **({"steps": 1, "warmup": 1} if memory else {})}
    passed = [f"--{k.replace('_', '-')}={v}" for k, v in passed.items() if k not in ("worker", "out", "rounds")]
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", __file__,
        f"--worker={mode}", f"--out={out}", *passed,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), **({"MALLOC_MMAP_THRESHOLD_": "131072"} if memory else {})}
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env, timeout=3600)
    if result.returncode != 0:
        sys.exit(f"bench_parallel: the {mode} launch failed:\n{result.stderr[-3000:]}")
    return json.loads(out.read_text())


def median_over(rounds: list[dict], rank: int, key: str) -> float:
    return statistics.median(r["ranks"][rank][key] for r in rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=4, help="sequences per process per step")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per launch")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3, help="launches per mode, alternating")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)

    speed: dict[str, list[dict]] = {mode: [] for mode in MODES}
    memory: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in MODES:
            memory[mode] = [launch(mode, args, Path(tmp) / f"{mode}-memory.json", memory=True)]
        for round_ in range(args.rounds):
            for mode in MODES if round_ % 2 == 0 else reversed(MODES):
                speed[mode].append(launch(mode, args, Path(tmp) / f"{mode}-{round_}.json"))
    print(
        f"d_model={args.d_model} layers={args.layers} vocab={args.vocab_size} batch={args.batch_size}x{args.seq_len} "
        f"per process, 2 processes, torch {torch.__version__}; tokens/s: {args.steps} timed steps after "
        f"{args.warmup}, median of {args.rounds} launches per mode"
    )
    rows = {"tokens/s (both processes)": (speed, lambda rounds: statistics.median(r["tokens_per_s"] for r in rounds))}
    for rank in (0, 1):
        for label, key in (
            ("peak memory", "peak_bytes"),
            ("parameters", "param_bytes"),
            ("gradients", "grad_bytes"),
            ("optimizer state", "optimizer_state_bytes"),
        ):
            rows[f"{label}, rank {rank} (MB)"] = (
                memory,
                lambda rounds, r=rank, k=key: median_over(rounds, r, k) / 2**20,
            )
    print("\n| | DDP | FSDP | FSDP / DDP |\n|---|---|---|---|")
    for label, (results, value) in rows.items():
        ddp, fsdp = value(results["ddp"]), value(results["fsdp"])
        print(f"| {label} | {ddp:,.1f} | {fsdp:,.1f} | {fsdp / ddp:.2f} |")


if __name__ == "__main__":
    main()
