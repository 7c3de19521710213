"""Run a learning-rate study to the end in one command, and write its report.

    python -m lab study +experiment=stability --out docs/study
    python -m lab study +experiment=stability --dry-run       # what it would train, and how long
    python -m lab study +experiment=stability plan.report_seeds=3   # the spec's plan, changed

The study's spec is configs/study/<experiment>.yaml (lab/study_spec.py); ``plan.<key>=<value>``
arguments change its plan. The other arguments besides --out and --dry-run are Hydra overrides, passed
to every training command (hydra/launcher=submitit_slurm fans the runs out on a cluster). Stage by stage
(lab/study_plan.py: the grid, the edges, the seeds at the best rates) it trains what is
missing through ``python train.py -m``, so an interrupted study resumes where it stopped when the
command is run again. The report lands in --out: lab/study_report.py's, or lab/across_models.py's where the
plan names an ``axis`` (a study of several models).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from lab import across_models, study_report
from lab.results import PLAN_FILE, VAL_LOSS, Result, capped_loss
from lab.runs import BASELINE, RunsError, load_runs
from lab.study import skip_deltas
from lab.study_plan import Job, StudyPlan, next_jobs, planned_runs, report_seeds
from lab.study_spec import StudySpecError, load_study_spec
from lab.unigram import compute_unigram_val_loss
from training.config import register_configs
from training.run.cpu_threads import concurrent_jobs
from training.run.lock import lock_holder

ROOT = Path(__file__).resolve().parents[1]
PERF_ELAPSED = "perf/elapsed_s"


# The sweep axes the study plans over; the same keys on the command line replace the experiment's.
AXES = ("+variant", "train.lr", "model")


def split_axes(overrides: list[str]) -> tuple[dict[str, str], list[str]]:
    """The command line's sweep axes (``+variant=a,b``), and the overrides every run shares."""
    axes = {o.split("=", 1)[0]: o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0] in AXES}
    return axes, [o for o in overrides if o.split("=", 1)[0] not in AXES]


def compose_study(overrides: list[str]):
    """The experiment's config with its Hydra node; its variants, rates and models (``[None]`` when it
    sweeps no model); and each (model name, label) that its runs record, as (model, variant)."""
    given, overrides = split_axes(overrides)
    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("config", overrides=overrides, return_hydra_config=True)
        axes = {**{k: str(v) for k, v in (cfg.hydra.sweeper.params or {}).items()}, **given}
        if "+variant" not in axes or "train.lr" not in axes:
            raise SystemExit("lab study: the experiment must sweep +variant and train.lr (hydra.sweeper.params)")
        arms = axes["+variant"].split(",")
        models = axes["model"].split(",") if "model" in axes else [None]
        labels = {}
        for model in models:
            for arm in arms:
                chosen = [f"+variant={arm}"] + ([f"model={model}"] if model else [])
                v = compose("config", overrides=[*overrides, *chosen])
                labels[(v.model.name, v.variant)] = (model, arm)
    rates = sorted(float(lr) for lr in axes["train.lr"].split(","))
    return cfg, overrides, arms, rates, models, labels


def finished_losses(sweep_dir: Path, labels: dict):
    """Per (model, variant), ``{(lr, seed): capped loss}`` of its finished runs; their wall-clock seconds; and
    the unfinished runs another process is training now, ``{(model, variant, lr, seed): that process}``."""
    losses: dict[str, dict] = defaultdict(dict)
    seconds = []
    elsewhere = {}
    try:
        runs, _ = load_runs([str(sweep_dir)])  # a run that does not load yet trains again
    except RunsError:  # nothing trained yet
        return losses, seconds, elsewhere
    for run in runs:
        arm = labels.get((run.config["model"]["name"], run.config["variant"]))
        if arm is None:
            continue
        lr, seed = float(run.config["train"]["lr"]), int(run.config["seed"])
        if run.unfinished:
            if (holder := lock_holder(run.path)) is not None:
                elsewhere[(*arm, lr, seed)] = holder
            continue
        losses[arm][(lr, seed)] = capped_loss(Result(run, arm, lr, seed, run.last(VAL_LOSS), run.diverged_at))
        if (elapsed := run.last(PERF_ELAPSED)) is not None:
            seconds.append(elapsed)
    return losses, seconds, elsewhere


def describe_job(model: str | None, job: Job) -> str:
    return f"{model or ''} {job.arm} lr {job.lr:g} seed {job.seed}".strip()


def commands(jobs: dict[str | None, list[Job]]) -> list[list[str]]:
    """Hydra multirun sweeps, each a product of variants x rates x seeds on one model, that train
    exactly ``jobs`` (by model)."""
    out = []
    for model, model_jobs in jobs.items():
        by_arm: dict[str, dict[int, set]] = defaultdict(lambda: defaultdict(set))
        for job in model_jobs:
            by_arm[job.arm][job.seed].add(job.lr)
        grouped: dict[tuple, list[str]] = defaultdict(list)
        for arm, rates_by_seed in by_arm.items():
            seeds_by_rates: dict[tuple, list[int]] = defaultdict(list)
            for seed, rates in rates_by_seed.items():
                seeds_by_rates[tuple(sorted(rates))].append(seed)
            for rates, seeds in seeds_by_rates.items():
                grouped[(rates, tuple(sorted(seeds)))].append(arm)
        out += [
            ([f"model={model}"] if model else [])
            + [
                f"+variant={','.join(arms)}",
                f"train.lr={','.join(repr(lr) for lr in rates)}",
                f"seed={','.join(map(str, seeds))}",
            ]
            for (rates, seeds), arms in grouped.items()
        ]
    return out


def describe(todo: int, done: int, planned: int, seconds: list[float], plan: StudyPlan, at_once: int) -> str:
    per_run = statistics.fmean(seconds) if seconds else plan.seconds_per_run
    source = f"{len(seconds)} finished runs" if seconds else "the plan's seconds_per_run"
    left = max(todo, planned - done)
    return (
        f"{todo} runs to train now; {done} finished, about {planned} in the whole study "
        f"(more if a best rate sits at an edge). At {per_run:.0f} s a run ({source}), {at_once} at once: "
        f"about {left * per_run / at_once / 60:.0f} min left."
    )


def evaluate_layer_importance(sweep_dir: Path, labels: dict, plan: StudyPlan) -> None:
    """``eval.py layer_importance=true`` on the final checkpoint of every report seed's run (they ran at the
    best rates only) that has no skip deltas yet; its results land in each run's eval.json."""
    runs, _ = load_runs([str(sweep_dir)])
    seeds = set(report_seeds(plan))
    todo = [
        run.path
        for run in runs
        if (run.config["model"]["name"], run.config["variant"]) in labels
        and int(run.config["seed"]) in seeds
        and not run.unfinished
        and run.diverged_at is None
        and not skip_deltas(run)
    ]
    if todo:
        print(f"lab study: skip deltas of {len(todo)} report runs (eval.py layer_importance=true)", flush=True)
        checkpoints = ",".join(f"'{path}'" for path in todo)
        command = [sys.executable, "eval.py", f"checkpoint=[{checkpoints}]", "layer_importance=true"]
        subprocess.run([*command, f"hydra.run.dir={sweep_dir / 'eval'}"], cwd=ROOT, check=False)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.usage = "python -m lab study +experiment=<name> [plan.<key>=<value> ...] [Hydra overrides ...] [--out OUT]"
    parser.add_argument("--out", type=Path, default=None, help="the report's folder (default: <sweep dir>/report)")
    parser.add_argument("--dry-run", action="store_true", help="say what the next stage trains, and stop")
    parser.set_defaults(overrides=[])  # the other arguments: +experiment=<name>, plan.<key>=<value>, Hydra overrides


def run(args: argparse.Namespace) -> int:
    overrides = args.overrides
    experiment = next((o.split("=", 1)[1] for o in overrides if o.lstrip("+").startswith("experiment=")), None)
    if experiment is None:
        print("lab study: name the study: +experiment=<name> (its sweep), with its spec in configs/study/<name>.yaml")
        return 2
    if args.out is not None and args.out.exists() and not args.out.is_dir():
        print(f"lab study: --out {args.out} is a file; give a folder for the report (it is created if missing)")
        return 2
    plan_overrides = [o for o in overrides if o.startswith("plan.")]
    overrides = [o for o in overrides if not o.startswith("plan.")]
    try:
        spec = load_study_spec(experiment, plan_overrides)
    except StudySpecError as err:
        print(f"lab study: {err}")
        return 2
    cfg, overrides, arms, rates, models, labels = compose_study(overrides)
    plan = spec.plan
    unknown = sorted(set(plan.headline) - set(arms))
    if unknown:
        print(
            f"lab study: configs/study/{experiment}.yaml's plan.headline names {', '.join(unknown)}, "
            f"not among +variant: {', '.join(arms)}"
        )
        return 2
    sweep_dir = ROOT / cfg.hydra.sweep.dir if not Path(cfg.hydra.sweep.dir).is_absolute() else Path(cfg.hydra.sweep.dir)
    at_once = concurrent_jobs(OmegaConf.to_container(cfg.hydra.launcher), os.cpu_count() or 1)
    record = {
        "title": spec.title,
        "unigram_val_loss": None if args.dry_run else compute_unigram_val_loss(cfg),  # the line "trained" reads
        "learning_rates": rates,
        "variants": arms,
        "models": models,
        "runs": sorted([name, label] for name, label in labels),  # (model name, variant label): what the report reads
        "plan": dataclasses.asdict(plan),
        "claims": [dataclasses.asdict(claim) for claim in spec.claims],
    }
    if not args.dry_run:  # a dry run writes nothing
        sweep_dir.mkdir(parents=True, exist_ok=True)
        (sweep_dir / PLAN_FILE).write_text(json.dumps(record, indent=1))
    planned = planned_runs(plan, arms, rates) * len(models)
    failed_before: set[tuple] = set()
    while True:
        losses, seconds, elsewhere = finished_losses(sweep_dir, labels)
        jobs = {m: [j for v in arms for j in next_jobs(plan, v, rates, losses.get((m, v), {}))] for m in models}
        todo = {(m, j) for m, model_jobs in jobs.items() for j in model_jobs}
        held_by = {(m, j): elsewhere[key] for m, j in todo if (key := (m, j.arm, j.lr, j.seed)) in elsewhere}
        busy = set(held_by)
        if busy and busy == todo:  # train.py would refuse each of them: say who holds them instead
            held = "; ".join(f"{describe_job(m, j)} ({held_by[(m, j)]})" for m, j in sorted(busy, key=str))
            print(
                f"lab study: the runs left are training in another process: {held}. Rerun this command when they finish"
            )
            return 1
        jobs = {m: [j for j in model_jobs if (m, j) not in busy] for m, model_jobs in jobs.items()}
        if not todo:
            if args.dry_run:
                print("lab study: nothing to train; the study is complete")
                return 0
            break
        done = sum(len(v) for v in losses.values())
        ready = todo - busy
        print(f"lab study: {describe(len(ready), done, planned, seconds, plan, at_once)}", flush=True)
        if args.dry_run:
            for command in commands(jobs):
                print("  python train.py -m " + " ".join([*overrides, *command]))
            return 0
        if failed_before & ready:
            stuck = ", ".join(describe_job(m, j) for m, j in sorted(failed_before & ready, key=str))
            print(f"lab study: these runs did not finish when trained: {stuck}; see their train.log under {sweep_dir}")
            return 1
        for command in commands(jobs):
            subprocess.run([sys.executable, "train.py", "-m", *overrides, *command], cwd=ROOT, check=False)
        failed_before = todo
    if plan.layer_importance:
        evaluate_layer_importance(sweep_dir, labels, plan)
    out = args.out or sweep_dir / "report"
    if plan.axis is None:
        study_report.write_report([str(sweep_dir)], out, "val/loss", None, BASELINE)
    else:
        across_models.write_report([str(sweep_dir)], out, "val/loss", BASELINE, plan.axis)
    print(f"lab study: complete; the report is {out / 'report.md'}")
    return 0
