"""The GPU path in one command: is normlab correct on this GPU, and how fast is it, within a time budget.

    python scripts/gpu_check.py                            # one H100/H200-class GPU: about 8 minutes
    python scripts/gpu_check.py --budget-s 900 --out bench_out/gpu data.cache_dir=/scratch/normlab
    python scripts/gpu_check.py --stages kernels,profile   # some of the stages
    python scripts/gpu_check.py --dry-run --out /tmp/gpu_check    # every stage's code on this CPU, tiny

Six stages, in order of value, each a module of lab/gpu_check/ (its docstring says what it measures):
correctness, kernels, profile, training, compiled_vs_eager, distributed. Each gets its share of --budget-s (time a
stage leaves unused passes on to the next); a stage whose share runs out is stopped and recorded as skipped, with
the reason and what it had measured, and a stage that fails records its error in one line, with the failed
process's last lines; the next stage runs either way. The stages and the processes they start share one compile
cache (Inductor's and Triton's, in bench_out/compile_cache), so a model compiled once is not compiled again.

Every number is written with its unit and the baseline it is compared with, measured in the same run, to
<out>/<device>-<date>.json and a Markdown table beside it (also printed), both rewritten after every stage.

--dry-run takes every stage's code path on this CPU: tiny shapes and model=tiny, a step or two, gloo instead of
NCCL, the fused kernel in Triton's interpreter, a trivial pytest selection, and aot_eager instead of inductor
(the same tracing and autograd without the code generation, which takes half a minute per model on a CPU).
The suite runs it (tests/e2e/test_gpu_check.py), so that a bug costs CPU time, not a lent GPU's.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import re
import signal
import sys
import tempfile
import time
from pathlib import Path

import torch

from lab.gpu_check.compiled_vs_eager import compiled_vs_eager
from lab.gpu_check.correctness import correctness
from lab.gpu_check.distributed import distributed
from lab.gpu_check.kernels import kernels
from lab.gpu_check.profile import profile
from lab.gpu_check.report import environment, markdown, status_line
from lab.gpu_check.stage import ROOT, Stage, run_stage
from lab.gpu_check.training import training

# The recipe the README gives for GPUs, and the dry run's stand-in.
RECIPE = ["model=gpu_125m", "train=gpu", "logger=none"]
DRY_RECIPE = ["model=tiny", "train=gpu", "logger=none", "device=cpu", "train.batch_size=2", "train.seq_len=16",
              "data.val_windows=2", "train.perf_warmup_steps=1", "train.peak_flops=1e11"]  # fmt: skip
STAGES = [  # (stage, share of the budget): the Triton compiles of correctness and the model compiles take longest
    (correctness, 0.20),
    (kernels, 0.15),
    (profile, 0.10),
    (training, 0.25),
    (compiled_vs_eager, 0.12),
    (distributed, 0.18),
]


def arguments_refusal(budget_s: float, out: Path, stages: list[str]) -> str | None:
    """Why the command line cannot work, in one line, or None: a budget that is not a positive number of seconds,
    an output folder that is a file, a link or not writable, a stage that is not one."""
    if not (math.isfinite(budget_s) and budget_s > 0):
        return f"--budget-s {budget_s} is not a number of seconds > 0: give the time all stages may take, e.g. 480"
    if out.is_symlink():
        return f"--out {out} is a link to {os.readlink(out)}: give the folder itself"
    if out.exists() and not out.is_dir():
        return f"--out {out} is a file, not a folder: give a folder for the JSON and the table"
    existing = next(parent for parent in (out, *out.parents) if parent.exists())
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"--out {out}: {existing} is not writable: give a folder this user can write"
    names = [function.__name__ for function, _ in STAGES]
    unknown = [name for name in stages if name not in names]
    if unknown:
        return f"--stages {','.join(stages)}: {unknown[0]} is not a stage; the stages are {','.join(names)}"
    return None


def share_compile_cache() -> None:
    """One compile cache for this process and every process it starts (train.py, torchrun's workers, pytest), in
    bench_out/ (ignored by git): not beside the report, which is committed or copied back from a lent machine."""
    cache = ROOT / "bench_out" / "compile_cache"
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache / "inductor"))
    os.environ.setdefault("TRITON_CACHE_DIR", str(cache / "triton"))


def _terminated(signum, frame):
    sys.exit(128 + signum)  # unwinds like an exception, so that a stage stops the processes it started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of every training run (the stages that train)")
    parser.add_argument("--budget-s", type=float, default=480, help="seconds for all stages together (default 480)")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="folder for the JSON and the table (default docs/benchmarks/gpu; bench_out/gpu_check for a dry run)",
    )
    parser.add_argument("--stages", default="", help="a comma-separated choice of stages (default: all, in order)")
    parser.add_argument("--dry-run", action="store_true", help="every stage's code on this CPU, tiny")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    out = args.out or ROOT / ("bench_out/gpu_check" if args.dry_run else "docs/benchmarks/gpu")
    chosen = [name for name in args.stages.split(",") if name]
    refusal = arguments_refusal(args.budget_s, out, chosen)
    if refusal:  # before the first stage: a lent GPU's minutes are the scarcest thing this command spends
        print(f"gpu_check: {refusal}", file=sys.stderr)
        return 2
    if args.dry_run:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # a CPU run, for this process and what it starts, even beside a GPU
        os.environ["TRITON_INTERPRET"] = "1"  # read when the fused kernel loads: Triton's interpreter on CPU tensors
        torch.compile = functools.partial(torch.compile, backend="aot_eager")
    elif not torch.cuda.is_available():
        print(
            "gpu_check: needs a CUDA GPU and torch sees none here; `python scripts/gpu_check.py --dry-run` runs "
            "every stage's code on this CPU",
            file=sys.stderr,
        )
        return 1
    signal.signal(signal.SIGTERM, _terminated)
    out.mkdir(parents=True, exist_ok=True)
    share_compile_cache()
    device = torch.device("cpu") if args.dry_run else torch.device("cuda", 0)
    overrides = [*(DRY_RECIPE if args.dry_run else RECIPE), *args.overrides]
    report = {"meta": environment(device, args, argv), "stages": []}
    slug = re.sub(r"[^a-z0-9]+", "-", report["meta"]["device"].lower()).strip("-")
    json_path = out / f"{slug}-{report['meta']['date'][:10]}.json"
    stages = [(function, share) for function, share in STAGES if not chosen or function.__name__ in chosen]
    scale = 1 / sum(share for _, share in stages)  # the chosen stages share the whole budget

    started, share_end = time.monotonic(), 0.0
    with tempfile.TemporaryDirectory(prefix="gpu_check-") as scratch:
        for index, (function, share) in enumerate(stages, 1):
            share_s = share * scale * args.budget_s
            share_end += share_s  # a stage may use what the ones before it left
            stage = Stage(function.__name__, device, args.dry_run, overrides, Path(scratch), started + share_end,
                          share_s)  # fmt: skip
            print(f"[{index}/{len(stages)}] {stage.name}: until {share_end:.0f} s of {args.budget_s:.0f}", flush=True)
            report["stages"].append(run_stage(function, stage))
            print(f"    {status_line(report['stages'][-1])}", flush=True)
            json_path.write_text(json.dumps(report, indent=1) + "\n")  # rewritten after each stage: a killed run
            json_path.with_suffix(".md").write_text(markdown(report))  # leaves what it had found
    print(markdown(report))  # then the verdicts again, last, where a truncated log still shows them
    print("\n".join(status_line(record) for record in report["stages"]))
    print(f"wrote {json_path} and {json_path.with_suffix('.md')}")
    return 1 if any(stage["status"] == "failed" for stage in report["stages"]) else 0


if __name__ == "__main__":
    sys.exit(main())
