"""Train the LLaMA-style decoder with the norm the config names.

    python train.py norm=rmsnorm
    python train.py -m norm=layernorm,rmsnorm,prmsnorm,fused_rmsnorm seed=0,1,2
    torchrun --nproc_per_node=8 train.py norm=rmsnorm model=gpu_125m train=gpu

The story: config -> data -> model -> loop -> metrics and checkpoints. Hydra composes the config, ``main``
turns it into one typed ``Config`` (training/config.py), and ``training.run.setup.build_run`` turns that into a run (data, model, optimizer, resumed from the newest checkpoint in
runs/<run_name>, the hooks after each step, loggers); the loop below takes its steps, runs the hooks
that the model and the training options registered, and logs what the probes measure.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig
from tqdm.auto import tqdm

from training.checkpoints.files import list_checkpoints
from training.config import Config, check_config, register_configs, typed_config
from training.errors import NormlabError
from training.run.lock import RunLock, RunLockedError, discard_unused
from training.run.record import check_run_directory
from training.run.runtime import resolve_device
from training.run.setup import TrainingRun, build_run
from training.step.distributed import init_distributed
from training.step.nonfinite import StepAction
from training.step.optim import lr_at
from training.telemetry.evaluation import evaluate
from training.telemetry.metrics_file import read_metrics
from training.telemetry.probes import run_probes
from training.telemetry.probes.gradients import layer_grad_norms
from training.telemetry.throughput import peak_memory_gb

log = logging.getLogger("normlab.train")
register_configs()


def every(n: int, done: int, last: bool) -> bool:
    """Whether step ``done`` is one of every ``n`` steps, or the last."""
    return done % n == 0 or last


def train(cfg: Config, run_dir: Path) -> dict[str, float]:
    """Run (or resume) the training job ``cfg`` in ``run_dir``; returns the last logged metrics."""
    run_dir = Path(run_dir)
    check_config(cfg)  # every value in its range, no contradiction, before anything is written
    check_run_directory(run_dir)  # a folder that holds something else is left as it is
    device = resolve_device(cfg.device, int(os.environ.get("LOCAL_RANK", 0)))
    dist = init_distributed(device.type, cfg.train.dist_timeout_s)
    lock = RunLock(run_dir)
    try:
        refusal = None
        if dist.is_main:  # the ranks of one job are one writer
            try:
                lock.acquire()
            except RunLockedError as err:
                refusal = err
        if not dist.all_true(refusal is None, device):
            raise refusal or RunLockedError(f"rank 0 could not lock {run_dir}; see its log")
        return build_and_train(cfg, run_dir, device, dist)
    finally:
        lock.release()
        dist.close()


def build_and_train(cfg: Config, run_dir: Path, device: torch.device, dist) -> dict[str, float]:
    """A function of its own so that the run (and its DDP wrapper) is freed when it returns: a DDP
    wrapper destroyed after its process group hangs in gloo's destructor."""
    run = build_run(cfg, run_dir, device, dist)
    if run is None:
        return {}
    try:
        return train_loop(run)
    finally:
        run.loggers.close()


def train_step(run: TrainingRun, step: int) -> tuple[float, float, float]:
    """Forward and backward over the step's micro-batches, gradients clipped: (mean cross-entropy,
    mean z-loss term, grad norm). The optimizer step is left to the caller, which first checks them."""
    tcfg, dist = run.cfg.train, run.dist
    loss_sum = torch.zeros((), device=run.device)
    z_sum = torch.zeros((), device=run.device)
    for micro in range(run.settings.accum):
        first = (dist.rank * run.settings.accum + micro) * tcfg.batch_size
        inputs, targets = (
            t.to(run.device, non_blocking=True) for t in run.data.train.get(step, first, tcfg.batch_size)
        )
        # DDP averages gradients only on the last micro-step of an accumulation; FSDP reduce-scatters every one.
        accumulating = dist.enabled and not run.sharded and micro < run.settings.accum - 1
        with run.train_model.no_sync() if accumulating else nullcontext():
            with run.autocast:
                terms = run.train_model(inputs, targets, z_loss=tcfg.z_loss)
            (terms.objective / run.settings.accum).backward()
        loss_sum += terms.cross_entropy / run.settings.accum
        z_sum += terms.z_loss / run.settings.accum
    max_norm = math.inf if tcfg.grad_clip is None else tcfg.grad_clip  # inf: the norm, and no clipping
    grad_norm = torch.nn.utils.clip_grad_norm_(run.model.parameters(), max_norm).item()
    return dist.mean(loss_sum.item(), run.device), dist.mean(z_sum.item(), run.device), grad_norm


def measure(run: TrainingRun, step: int, done: int, last: bool, step_metrics: dict) -> dict:
    """The metrics row of step ``done``: the step's own numbers (every log_every steps), validation, and
    the probe pass on its own batch."""
    tcfg = run.cfg.train
    metrics: dict = {"step": done}
    if every(tcfg.log_every, done, last):
        metrics.update(
            {
                **step_metrics,
                "train/tokens": done * run.settings.tokens_per_step,
                "perf/peak_mem_gb": peak_memory_gb(run.device),
                "perf/elapsed_s": run.elapsed(),
                **run.meter.report(),
            }
        )
    if every(tcfg.eval_every, done, last):
        for prefix, windows in (("val", run.data.val), ("heldout", run.data.heldout)):
            if windows is not None:
                args = (windows, run.data.token_bytes, tcfg.batch_size, run.device, run.autocast, prefix)
                metrics.update(evaluate(run.compiled, *args))
        log.info("step %d: val loss %.4f, bpb %.4f", done, metrics["val/loss"], metrics["val/bpb"])
    if every(tcfg.stats_every, done, last):
        probe_batch, _ = run.data.train.get(step, run.dist.rank * run.settings.accum * tcfg.batch_size, tcfg.batch_size)
        metrics.update(run_probes(run.model, probe_batch.to(run.device), run.autocast, run.settings.probes))
    return metrics


def train_loop(run: TrainingRun) -> dict[str, float]:
    tcfg, dist = run.cfg.train, run.dist
    run.started = time.perf_counter()
    last_checkpoint, metrics = run.resumed_from, {}
    quiet = not (dist.is_main and sys.stderr.isatty())
    progress = tqdm(range(run.start_step, tcfg.max_steps), initial=run.start_step, total=tcfg.max_steps,
                    desc=run.cfg.run_name, disable=quiet, dynamic_ncols=True)  # fmt: skip
    for step in progress:
        done, last = step + 1, step + 1 == tcfg.max_steps
        lr = lr_at(step, tcfg)
        for group in run.optimizer.param_groups:
            group["lr"] = lr
        started = time.perf_counter()
        loss, z_loss, grad_norm = train_step(run, step)
        action = run.nonfinite.check(done, loss + z_loss, grad_norm, last_checkpoint)
        if action is not StepAction.APPLY:
            run.optimizer.zero_grad(set_to_none=True)
            if action is StepAction.END:
                metrics = run.nonfinite.divergence_row(done, loss, grad_norm)
                run.loggers.log(metrics)
                break
            continue
        gradients = layer_grad_norms(run.model) if every(tcfg.stats_every, done, last) else {}
        run.optimizer.step()
        run.optimizer.zero_grad(set_to_none=True)
        step_metrics = {"train/loss": loss, "train/lr": lr, "train/grad_norm": grad_norm}
        for hook in run.post_step_hooks:
            step_metrics.update(hook())
        if tcfg.z_loss:
            step_metrics["train/z_loss"] = z_loss
        run.meter.add(run.settings.tokens_per_step, time.perf_counter() - started)
        if not (dist.is_main or run.sharded):  # sharded, every process evaluates and saves; rank 0 logs
            continue
        metrics = {"step": done, **gradients, **measure(run, step, done, last, step_metrics)}
        progress.set_postfix(loss=f"{loss:.3f}")
        if quiet and "train/loss" in metrics:
            rate = metrics.get("perf/tokens_per_sec")
            log.info(
                "step %d/%d loss %.4f lr %.2e %s", done, tcfg.max_steps, loss, lr, f"{rate:.0f} tok/s" if rate else ""
            )
        if len(metrics) > 1:
            run.loggers.log(metrics)
        if every(tcfg.checkpoint_every, done, last):
            last_checkpoint = run.checkpoint(done)
    progress.close()
    if dist.enabled and not run.sharded:  # sharded, each process holds other weights
        checksum = dist.check_in_sync(run.model, run.device)
        if dist.is_main:
            log.info("all %d processes hold identical weights (checksum %.17g)", dist.world_size, checksum)
    return metrics


@hydra.main(version_base="1.3", config_path=str(Path(__file__).parent / "configs"), config_name="config")
def main(cfg: DictConfig) -> None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    fresh = not any(run_dir.iterdir())  # Hydra has just made it: a new run's directory is empty
    try:
        train(typed_config(cfg), run_dir)
    except (NormlabError, OSError, KeyboardInterrupt) as err:
        log.error("%s", stopped_because(err, run_dir))
        if fresh:
            discard_unused(run_dir)
        sys.exit(130 if isinstance(err, KeyboardInterrupt) else 1)


def stopped_because(err: BaseException, run_dir: Path) -> str:
    """One line for what stopped the run: our refusals say it themselves; a filesystem error and Ctrl-C are
    named with the file or the step, and with how to go on (a rerun resumes from the newest checkpoint)."""
    if isinstance(err, NormlabError):
        return str(err)
    if isinstance(err, OSError):
        where = f": {err.filename}" if err.filename else ""
        return (
            f"{err.strerror or err}{where}. Check that the path is a folder where one belongs, writable, with names "
            "under 255 bytes and space left; then rerun the same command, which resumes from the newest checkpoint"
        )
    logged = read_metrics(run_dir / "metrics.jsonl", damaged="skip").rows if run_dir.is_dir() else []
    saved = list_checkpoints(run_dir)
    last = logged[-1]["step"] if logged else 0
    resume = f"rerun the same command to resume from {saved[-1].name}" if saved else "it had saved no checkpoint yet"
    return f"interrupted (Ctrl-C) after step {last} in {run_dir}; {resume}"


if __name__ == "__main__":
    if int(os.environ.get("RANK", "0")) > 0:
        # Under torchrun all ranks share one run directory; only rank 0 writes Hydra's files and log.
        sys.argv += ["hydra.output_subdir=null", "hydra/job_logging=disabled", "hydra/hydra_logging=disabled"]
    # Hydra's joblib launcher pickles the task function for its worker processes; the copy in
    # `__main__` would be pickled by value with everything it references, the module's by name.
    from train import main as importable_main

    importable_main()
