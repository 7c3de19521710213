"""Train the LLaMA-style decoder with the norm the config names.

    python train.py norm=rmsnorm
    python train.py -m norm=layernorm,rmsnorm,prmsnorm,fused_rmsnorm seed=0,1,2
    torchrun --nproc_per_node=8 train.py norm=rmsnorm model=gpu_125m train=gpu

The story: config -> data -> model -> loop -> metrics and checkpoints. Rerunning a command
finds its run directory (runs/<run_name>) and resumes from the newest checkpoint there.
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
from omegaconf import DictConfig, OmegaConf
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm

from model import ModelConfig, Transformer
from norms.cpu import flush_denormals
from training.checkpoint import (
    CheckpointError,
    check_same_model,
    load_newest_readable,
    remove_partial_checkpoints,
    restore_rng_states,
    rng_states,
    save_checkpoint,
)
from training.config import Config, build_model_config, register_configs
from training.corpus import DataError
from training.cpu_threads import use_thread_share
from training.data import build_data
from training.distributed import Distributed, init_distributed
from training.evaluation import evaluate
from training.layer_stats import layer_grad_norms, probe_norms
from training.optim import build_optimizer, lr_at
from training.run_lock import RunLock, RunLockedError
from training.run_record import RunIdentityError, append_resume, check_resume, write_new_record
from training.runtime import autocast_context, resolve_device, resolve_precision, seed_everything
from training.sinks import MetricsFile, Sinks, WandbSink, diverged_step
from training.throughput import ThroughputMeter, peak_flops, peak_memory_gb

log = logging.getLogger("normlab.train")
register_configs()


class TrainingDiverged(RuntimeError):
    """The loss or gradient became NaN/Inf and the nan_policy says stop."""


class ConfigError(ValueError):
    """A config value that cannot work; the message names the key to change."""


def plan_batches(train_cfg, seq_len: int, world_size: int) -> tuple[int, int]:
    """(sequences per global batch, gradient-accumulation steps) from the configured global batch."""
    global_tokens = train_cfg.global_batch_tokens or train_cfg.batch_size * seq_len
    per_pass = train_cfg.batch_size * world_size
    if global_tokens % seq_len or (global_tokens // seq_len) % per_pass:
        raise ConfigError(
            f"train.global_batch_tokens={global_tokens} must be a multiple of seq_len ({seq_len}) x "
            f"train.batch_size ({train_cfg.batch_size}) x processes ({world_size}) = {per_pass * seq_len}; "
            "change train.batch_size or train.global_batch_tokens"
        )
    global_batch = global_tokens // seq_len
    return global_batch, global_batch // per_pass


# On CPU, torch.compile made training steps 5.6% faster (scripts/bench_train.py --compile: 12,263 vs
# 11,612 tokens/s on the default model) after 15-40 s of compilation; it pays back after 2,000 to
# 5,000 steps, so `train.compile: null` compiles CPU runs from this length on.
CPU_COMPILE_MIN_STEPS = 5000


def should_compile(setting: bool | None, device: torch.device, max_steps: int) -> bool:
    """train.compile, or when null: always on CUDA, and on CPU for runs long enough to pay the compile back."""
    if setting is not None:
        return setting
    return device.type == "cuda" or (device.type == "cpu" and max_steps >= CPU_COMPILE_MIN_STEPS)


def check_model_config(cfg: DictConfig) -> None:
    """Build the configured model on the meta device (no memory, no data): a bad norm choice fails here, first."""
    try:
        with torch.device("meta"):
            Transformer(build_model_config(cfg, cfg.data.vocab_size))
    except ValueError as err:
        raise ConfigError(f"model/norm config: {err}") from err


def norm_backends(model: Transformer, device: torch.device) -> dict[str, str]:
    """The implementation that runs each role's norms, e.g. {"attn_in": "pytorch", "q": "triton"}."""
    return {norm.role: norm.backend(device) for norm in model.norm_modules().values()}


def resume(run_dir: Path, model, optimizer, model_cfg: ModelConfig, data, cfg: DictConfig, dist: Distributed):
    """Load the newest checkpoint of ``run_dir`` into model and optimizer, if there is one.

    Returns (start step, checkpoint path or None, training seconds before this process).
    """
    if dist.is_main:
        remove_partial_checkpoints(run_dir)
    found = load_newest_readable(run_dir, map_location=next(model.parameters()).device)
    if found is None:
        return 0, None, 0.0
    source, state = found
    check_same_model(state["model_config"], model_cfg.to_dict(), source)
    if state["tokenizer"] != data.tokenizer.to_str():
        raise CheckpointError(
            f"{source} was trained with another tokenizer than data={cfg.data.name} now gives; "
            "use the same data settings, or a new run directory (run_name=...)"
        )
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    restore_rng_states(state["rng"])
    return state["step"], source, state["elapsed_s"]


def check_run_identity(cfg: DictConfig, run_dir: Path, precision: str, global_batch_tokens: int) -> dict | None:
    """Refuse to train in ``run_dir`` if it holds a run of another configuration (before anything is written).

    Returns None for a new run, else the entry that the resume will add to the run's record.
    """
    config = {
        **OmegaConf.to_container(cfg, resolve=True),
        "runtime": {"precision": precision, "global_batch_tokens": global_batch_tokens},
    }
    schema_defaults = OmegaConf.to_container(OmegaConf.structured(Config))
    return check_resume(run_dir, config, schema_defaults, list(cfg.resume_with_changes))


def open_sinks(cfg: DictConfig, run_dir: Path, run_config: dict, data, resume: dict | None) -> Sinks:
    """Record the run (or append this resume to its record), and open metrics.jsonl (and wandb when configured)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    if resume is None:
        write_new_record(run_dir, run_config)
        (run_dir / "tokenizer.json").write_text(data.tokenizer.to_str())
    else:
        append_resume(run_dir, resume, run_config["runtime"])
    sinks = [MetricsFile(run_dir / "metrics.jsonl", resume_step=None if resume is None else resume["step"])]
    if cfg.logger.name == "wandb":
        group = cfg.logger.group or f"{cfg.model.name}-{cfg.variant}"
        sinks.append(WandbSink(cfg.logger, run_dir, cfg.run_name, group, run_config))
    return Sinks(sinks)


def train(cfg: DictConfig, run_dir: Path) -> dict[str, float]:
    """Run (or resume) the training job ``cfg`` in ``run_dir``; returns the last logged metrics."""
    run_dir = Path(run_dir)
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
        return _train(cfg, run_dir, device, dist)
    finally:
        lock.release()
        dist.close()


def _train(cfg: DictConfig, run_dir: Path, device: torch.device, dist: Distributed) -> dict[str, float]:
    tcfg = cfg.train
    try:
        precision = resolve_precision(tcfg.precision, device)
    except ValueError as err:
        raise ConfigError(str(err)) from err
    try:
        cpu_threads, threads_why = use_thread_share(cfg.cpu_threads)
    except ValueError as err:
        raise ConfigError(str(err)) from err
    autocast = autocast_context(precision, device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if device.type == "cpu":
        # Subnormal floats (post-norm's vanishing gradients at high learning rates) made every op
        # 5-30x slower in the stability study; flushing them to zero changes values below 1.2e-38.
        flush_denormals()
    seq_len = tcfg.seq_len or cfg.model.max_seq_len
    if seq_len > cfg.model.max_seq_len:
        raise ConfigError(f"train.seq_len={seq_len} exceeds model.max_seq_len={cfg.model.max_seq_len}")
    global_batch, accum = plan_batches(tcfg, seq_len, dist.world_size)
    if tcfg.nan_policy not in ("stop", "skip", "record"):
        raise ConfigError(f"train.nan_policy must be stop, skip or record, got {tcfg.nan_policy!r}")
    check_model_config(cfg)
    resume_entry = check_run_identity(cfg, run_dir, precision, global_batch * seq_len)
    diverged_at = None if resume_entry is None else diverged_step(run_dir / "metrics.jsonl")
    if diverged_at is not None and not cfg.resume_with_changes:
        log.info("%s diverged at step %d: that is its result, nothing to train", run_dir, diverged_at)
        return {}

    # Data: each node's first process fills the caches (tokenizer, token arrays); the others then read them.
    if dist.local_rank != 0:
        dist.barrier()
    data = build_data(cfg.data, seq_len, global_batch, cfg.seed)
    if dist.local_rank == 0:
        dist.barrier()

    # Model and optimizer, restored from the newest checkpoint when the run directory has one.
    seed_everything(cfg.seed)
    try:
        model_cfg = build_model_config(cfg, data.tokenizer.get_vocab_size())
        model = Transformer(model_cfg).to(device)
    except ValueError as err:  # a bad model shape or norm option
        raise ConfigError(f"model/norm config: {err}") from err
    optimizer = build_optimizer(model, tcfg, device)
    start_step, resumed_from, elapsed_before = resume(run_dir, model, optimizer, model_cfg, data, cfg, dist)
    if resumed_from and start_step >= tcfg.max_steps:
        log.info("%s finished at step %d: nothing to train (a rerun of a sweep skips it)", run_dir, start_step)
        return {}
    use_compile = should_compile(tcfg.compile, device, tcfg.max_steps)
    compiled = torch.compile(model) if use_compile else model
    train_model = compiled
    if dist.enabled:
        train_model = DistributedDataParallel(compiled, device_ids=[device.index] if device.type == "cuda" else None)

    # Telemetry: the resolved config (with what actually ran) and the sinks, on rank 0 only.
    tokens_per_step = global_batch * seq_len
    peak, peak_source = peak_flops(device, precision, tcfg.peak_flops)
    flops_per_token = model.flops_per_token(seq_len)
    meter = ThroughputMeter(flops_per_token, peak * dist.world_size, tcfg.perf_warmup_steps)
    runtime = {
        "norm_backend": norm_backends(model, device),
        "norm_roles": {name: norm.role for name, norm in model.norm_modules().items()},
        "device": str(device),
        "cpu_threads": cpu_threads,
        "precision": precision,
        "world_size": dist.world_size,
        "grad_accum": accum,
        "global_batch_tokens": tokens_per_step,
        "vocab_size": model_cfg.vocab_size,
        "params": sum(p.numel() for p in model.parameters()),
        "flops_per_token": flops_per_token,
        "peak_flops": peak,
        "peak_flops_source": peak_source,
        "torch": str(torch.__version__),
        "compiled": use_compile,
    }
    run_config = {**OmegaConf.to_container(cfg, resolve=True), "runtime": runtime}
    sinks = Sinks([])
    if dist.is_main:
        if resume_entry is not None:
            resume_entry.update(step=start_step, checkpoint=str(resumed_from) if resumed_from else None)
        sinks = open_sinks(cfg, run_dir, run_config, data, resume_entry)
        log.info(
            "run %s: %s params, norm %s (%s), %s on %s x%d, %d tokens/step (accum %d), %d CPU threads (%s)%s",
            cfg.run_name,
            f"{runtime['params']:,}",
            cfg.variant,
            ", ".join(sorted(set(runtime["norm_backend"].values()))) or "no norms",
            precision,
            device,
            dist.world_size,
            tokens_per_step,
            accum,
            cpu_threads,
            threads_why,
            f", resuming from step {start_step}" if resumed_from else "",
        )

    def checkpoint(step: int) -> Path:
        state = {
            "step": step,
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "rng": rng_states(),
            "model_config": model_cfg.to_dict(),
            "config": run_config,
            "tokenizer": data.tokenizer.to_str(),
            "elapsed_s": elapsed(),
        }
        return save_checkpoint(run_dir, state, tcfg.keep_checkpoints)

    loop_started = time.perf_counter()

    def elapsed() -> float:
        """Wall-clock seconds of training so far, across resumes."""
        return elapsed_before + time.perf_counter() - loop_started

    # The loop.
    last_checkpoint, skipped, metrics, last_finite_loss = resumed_from, 0, {}, None
    progress = tqdm(
        range(start_step, tcfg.max_steps),
        initial=start_step,
        total=tcfg.max_steps,
        desc=cfg.run_name,
        disable=not (dist.is_main and sys.stderr.isatty()),
        dynamic_ncols=True,
    )
    for step in progress:
        done = step + 1
        lr = lr_at(step, tcfg)
        for group in optimizer.param_groups:
            group["lr"] = lr
        started = time.perf_counter()
        loss_sum = torch.zeros((), device=device)
        for micro in range(accum):
            first = (dist.rank * accum + micro) * tcfg.batch_size
            inputs, targets = (t.to(device, non_blocking=True) for t in data.train.get(step, first, tcfg.batch_size))
            # DDP averages gradients only on the last micro-step of an accumulation.
            no_sync = train_model.no_sync() if dist.enabled and micro < accum - 1 else nullcontext()
            with no_sync:
                with autocast:
                    loss = train_model(inputs, targets) / accum
                loss.backward()
            loss_sum += loss.detach()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), tcfg.grad_clip).item()
        train_loss = dist.mean(loss_sum.item(), device)

        if not (math.isfinite(train_loss) and math.isfinite(grad_norm)):
            skipped += 1
            optimizer.zero_grad(set_to_none=True)
            if tcfg.nan_policy == "skip" and skipped <= tcfg.max_skipped_steps:
                log.warning(
                    "step %d: non-finite loss, step skipped (%d of %d allowed)", done, skipped, tcfg.max_skipped_steps
                )
                continue
            if tcfg.nan_policy == "record":  # divergence is the run's result (a learning-rate sweep goes on)
                metrics = {"step": done, "diverged": True, "train/loss": train_loss, "train/grad_norm": grad_norm}
                metrics["train/last_finite_loss"] = last_finite_loss
                sinks.log(metrics)
                log.warning(
                    "step %d: loss %s, grad norm %s; the run diverged and ends here (recorded)",
                    done,
                    train_loss,
                    grad_norm,
                )
                break
            sinks.close()
            raise TrainingDiverged(
                f"loss became {train_loss} (grad norm {grad_norm}) at step {done}. Last good checkpoint: "
                f"{last_checkpoint or 'none yet'}. Lower train.lr or raise train.warmup_steps and rerun, "
                "or set train.nan_policy=skip to skip such steps (up to train.max_skipped_steps), "
                "or train.nan_policy=record to end the run with the divergence recorded."
            )
        last_finite_loss = train_loss

        stats_step = done % tcfg.stats_every == 0 or done == tcfg.max_steps
        metrics = {"step": done}
        if stats_step:
            metrics.update(layer_grad_norms(model))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        meter.add(tokens_per_step, time.perf_counter() - started)

        if not dist.is_main:
            continue
        last = done == tcfg.max_steps
        if done % tcfg.log_every == 0 or last:
            metrics.update(
                {
                    "train/loss": train_loss,
                    "train/lr": lr,
                    "train/grad_norm": grad_norm,
                    "train/tokens": done * tokens_per_step,
                    "perf/peak_mem_gb": peak_memory_gb(device),
                    "perf/elapsed_s": elapsed(),
                    **meter.report(),
                }
            )
            progress.set_postfix(loss=f"{train_loss:.3f}", tok_s=f"{metrics.get('perf/tokens_per_sec', 0):.0f}")
            if progress.disable:
                log.info(
                    "step %d/%d loss %.4f lr %.2e %s",
                    done,
                    tcfg.max_steps,
                    train_loss,
                    lr,
                    f"{metrics['perf/tokens_per_sec']:.0f} tok/s" if "perf/tokens_per_sec" in metrics else "",
                )
        if done % tcfg.eval_every == 0 or last:
            metrics.update(evaluate(compiled, data.val, data.token_bytes, tcfg.batch_size, device, autocast))
            log.info("step %d: val loss %.4f, bpb %.4f", done, metrics["val/loss"], metrics["val/bpb"])
        if stats_step:
            metrics.update(probe_norms(model, inputs, autocast))
        if len(metrics) > 1:
            sinks.log(metrics)
        if done % tcfg.checkpoint_every == 0 or last:
            last_checkpoint = checkpoint(done)
    progress.close()
    sinks.close()
    if dist.enabled:
        checksum = dist.check_in_sync(model, device)
        if dist.is_main:
            log.info("all %d processes hold identical weights (checksum %.17g)", dist.world_size, checksum)
    return metrics


@hydra.main(version_base="1.3", config_path=str(Path(__file__).parent / "configs"), config_name="config")
def main(cfg: DictConfig) -> None:
    try:
        train(cfg, Path(HydraConfig.get().runtime.output_dir))
    except (DataError, CheckpointError, TrainingDiverged, ConfigError, RunIdentityError, RunLockedError) as err:
        log.error("%s", err)
        sys.exit(1)


if __name__ == "__main__":
    if int(os.environ.get("RANK", "0")) > 0:
        # Under torchrun all ranks share one run directory; only rank 0 writes Hydra's files and log.
        sys.argv += ["hydra.output_subdir=null", "hydra/job_logging=disabled", "hydra/hydra_logging=disabled"]
    # Hydra's joblib launcher pickles the task function for its worker processes; the copy in
    # `__main__` would be pickled by value with everything it references, the module's by name.
    from train import main as importable_main

    importable_main()
