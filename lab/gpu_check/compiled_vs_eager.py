"""Stage 5, compiled against eager: train.py's run of the GPU recipe with the fused RMSNorm, 20 steps compiled and 20
eager, two processes at once: the losses agree within bf16 tolerance, and the Triton kernel ran inside the
compiled model."""

from __future__ import annotations

from lab.gpu_check.stage import CheckFailed, Stage, last, launched, losses, one_batch_per_step, runtime, train_command

# Losses of bf16 runs that sum in another order (compiled against eager) drift apart over steps: bf16 keeps 8
# significant bits (0.4%), and the difference compounds through the updates.
BF16_RTOL = 2e-2


def compiled_vs_eager(stage: Stage) -> None:
    steps = 3 if stage.dry_run else 20
    batch = one_batch_per_step(stage)
    # A short warm-up, so that the 20 steps train at the recipe's rate and a wrong compiled gradient would show.
    overrides = ["norm=fused_rmsnorm", f"train.max_steps={steps}", "train.warmup_steps=2",
                 "train.log_every=1", batch]  # fmt: skip
    stage.notes["runs"] = f"{steps} steps of norm=fused_rmsnorm each, one micro-batch a step, train.warmup_steps=2"
    dirs = {mode: stage.scratch / f"{stage.name}-{mode}" for mode in ("eager", "compiled")}
    stage.progress = "training compiled and eager, at once"
    commands = {mode: train_command(stage, [*overrides, f"train.compile={mode == 'compiled'}"], run_dir)
                for mode, run_dir in dirs.items()}  # fmt: skip
    launched(stage, commands)
    got, expected = losses(dirs["compiled"]), losses(dirs["eager"])
    if sorted(got) != list(range(1, steps + 1)) or sorted(expected) != sorted(got):
        raise CheckFailed(f"logged losses at steps {sorted(got)} compiled and {sorted(expected)} eager, not 1-{steps}")
    worst = max(abs(got[s] - expected[s]) / abs(expected[s]) for s in got)
    stage.number(
        f"largest relative loss difference over {steps} steps",
        worst,
        "relative",
        f"bf16 tolerance {BF16_RTOL}",
        worst / BF16_RTOL,
    )
    for name, key, unit in [
        ("training loss at the last step", "train/loss", "nats"),
        ("validation loss", "val/loss", "nats"),
        ("tokens/s", "perf/tokens_per_sec", "tokens/s"),
    ]:
        value, eager = last(dirs["compiled"], key), last(dirs["eager"], key)
        stage.number(f"{name}, compiled", value, unit, f"eager: {eager:,.4g}", value / eager)
    record = runtime(dirs["compiled"])
    backends = sorted(set(record["norm_backend"].values()))
    stage.notes["compiled run"] = f"compiled: {record['compiled']}; norm backends: {', '.join(backends)}"
    kernel = "triton-interpreter" if stage.dry_run else "triton"
    if not record["compiled"] or backends != [kernel]:
        raise CheckFailed(f"the compiled run's norms ran on {backends} (compiled: {record['compiled']}), not {kernel}")
    if worst > BF16_RTOL:
        raise CheckFailed(f"compiled and eager losses differ by {worst:.3g} (relative) > {BF16_RTOL}")
