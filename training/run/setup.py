"""Everything a training run needs, built once from its config: ``build_run(cfg, run_dir, ...)``.

The order is the order in which things can fail: the config's choices first (nothing read, nothing written),
then the run's identity against its directory, the model (built once, drawn from the run's seed, for the
tokenizer the run will have) and its hooks, before any data is read; then the corpus and its tokenizer, the
token arrays, the optimizer (restored from the newest checkpoint), and last the record and the loggers, on rank
0. A run with nothing left to do (finished, or diverged: its result) gives ``None``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from model import ModelConfig, Transformer, build_model
from norms.cpu.denormals import flush_denormals
from training.checkpoints.files import list_checkpoints, remove_partial_checkpoints, rng_states, save_checkpoint
from training.config import Config, ConfigError, check_config, model_config
from training.data.batches import split_global_batch
from training.data.build import Data, open_corpus, tokenize
from training.data.tokenizer import get_tokenizer, read_tokenizer_file
from training.run.cpu_threads import use_thread_share
from training.run.record import read_record
from training.run.runtime import autocast_context, resolve_precision, seed_everything, should_compile
from training.step.distributed import Distributed
from training.step.nonfinite import NonFinitePolicy
from training.step.optim import build_optimizer, memory_per_rank, optimizer_groups
from training.step.post_step import PostStepHook, post_step_hooks
from training.telemetry.loggers import Loggers, open_loggers
from training.telemetry.probes import Probe, resolve_probe
from training.telemetry.throughput import PeakFlops, ThroughputMeter, peak_flops

log = logging.getLogger("normlab.train")


@dataclass
class RunSettings:
    """What the config asks for, checked: precision, threads, sequence length and batch split."""

    precision: str
    cpu_threads: int
    threads_why: str
    seq_len: int
    global_batch: int
    accum: int
    probes: list[type[Probe]]  # train.probes, resolved

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len


@dataclass(kw_only=True)
class TrainingRun:
    """What the loop in train.py reads: the config, its settings, the data, the model in three views, the optimizer
    where the run resumes, the hooks after each step, and where the run's metrics go."""

    cfg: Config
    run_dir: Path
    device: torch.device
    dist: Distributed
    settings: RunSettings
    data: Data
    model: Transformer  # the plain module (sharded in place under FSDP): probes, checkpoints and evaluation use it
    compiled: torch.nn.Module  # what steps and evaluation run (torch.compile'd when on)
    train_model: torch.nn.Module  # compiled, wrapped in DDP under torchrun (FSDP: the sharded model)
    sharded: bool  # train.parallel=fsdp: every process evaluates, probes and saves (collectives), rank 0 logs
    model_cfg: ModelConfig
    optimizer: torch.optim.Optimizer  # or an optimizer of several parts (training/step/optim.py), which steps like one
    post_step_hooks: list[PostStepHook]  # after every optimizer step (training/step/post_step.py)
    start_step: int  # 0, or the step of the checkpoint it resumed from
    resumed_from: Path | None
    elapsed_before: float  # training seconds before this process, across resumes
    run_config: dict  # the record: the resolved config and runtime:, stored in every checkpoint
    loggers: Loggers
    meter: ThroughputMeter
    nonfinite: NonFinitePolicy
    unreadable: set[Path]  # checkpoints the resume passed over: pruning keeps train.keep_checkpoints readable ones
    started: float = field(default_factory=time.perf_counter)

    @property
    def autocast(self):
        return autocast_context(self.settings.precision, self.device)

    def elapsed(self) -> float:
        """Wall-clock seconds of training so far, across resumes."""
        return self.elapsed_before + time.perf_counter() - self.started

    def checkpoint(self, step: int) -> Path:
        state = {
            "step": step,
            "rng": rng_states(),
            "model_config": self.model_cfg.to_dict(),
            "config": self.run_config,
            "tokenizer": self.data.tokenizer.to_str(),
            "elapsed_s": self.elapsed(),
        }
        keep = self.cfg.train.keep_checkpoints
        if self.sharded:  # each process writes its shards
            from training.checkpoints.sharded import save_sharded

            return save_sharded(self.run_dir, state, self.model, self.optimizer, keep, self.dist, self.unreadable)
        state.update(model=self.model.state_dict(), optimizer=self.optimizer.state_dict())
        return save_checkpoint(self.run_dir, state, keep, self.unreadable)


def resolve_settings(cfg: Config, dist: Distributed, device: torch.device) -> RunSettings:
    """The config's choices checked before any data loads; a bad one raises ConfigError naming its key."""
    try:
        precision = resolve_precision(cfg.train.precision, device)
        cpu_threads, threads_why = use_thread_share(cfg.cpu_threads)
    except ValueError as err:
        raise ConfigError(str(err)) from err
    seq_len = cfg.train.seq_len or cfg.model.max_seq_len
    if seq_len > cfg.model.max_seq_len:
        raise ConfigError(f"train.seq_len={seq_len} exceeds model.max_seq_len={cfg.model.max_seq_len}")
    global_batch, accum = split_global_batch(cfg.train, seq_len, dist.world_size)
    if cfg.train.parallel == "fsdp":
        from training.step.fsdp import check_config

        check_config(cfg)
    try:
        probes = [resolve_probe(name) for name in cfg.train.probes]
    except ValueError as err:
        raise ConfigError(f"train.probes: {err}") from err
    return RunSettings(precision, cpu_threads, threads_why, seq_len, global_batch, accum, probes)


def check_run_identity(cfg: Config, run_dir: Path, settings: RunSettings) -> dict | None:
    """Refuse to train in ``run_dir`` if it holds a run of another configuration (before anything is written).

    Returns None for a new run, else the entry that the resume will add to the run's record.
    """
    if read_record(run_dir) is None and not list_checkpoints(run_dir):
        return None  # a new run
    from training.run.resume import check_resume

    config = {
        **dataclasses.asdict(cfg),
        "runtime": {"precision": settings.precision, "global_batch_tokens": settings.tokens_per_step},
    }
    return check_resume(run_dir, config, dataclasses.asdict(Config()), list(cfg.resume_with_changes))


def configure_device(device: torch.device) -> None:
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if device.type == "cpu":
        # Subnormal floats (post-norm's vanishing gradients at high learning rates) made every op
        # 5-30x slower in the stability study; flushing them to zero changes values below 1.2e-38.
        flush_denormals()


def checked_hooks(model: Transformer, cfg: Config, dist: Distributed) -> list[PostStepHook]:
    """The post-step hooks of the model and the training options; one that refuses the model names the fix."""
    try:
        return post_step_hooks(model, cfg.train, dist)
    except ValueError as err:
        raise ConfigError(f"model/norm config: {err}") from err


def node_first(dist: Distributed, fill):
    """``fill()`` in each node's first process, then in the others, which read the caches it filled."""
    if dist.local_rank != 0:
        dist.barrier()
    filled = fill()
    if dist.local_rank == 0:
        dist.barrier()
    return filled


def known_vocab_size(cfg: Config, run_dir: Path, source) -> int:
    """The tokenizer's size as known before the corpus is read: the source's or the run's own tokenizer, a
    tokenizer file's, else the size a BPE is asked for (data.vocab_size; build_run builds the model again in the
    rare case that the corpus gives a BPE fewer tokens)."""
    if source is not None:
        return source.tokenizer.get_vocab_size()
    own = Path(run_dir) / "tokenizer.json"
    if own.is_file():
        return read_tokenizer_file(own, "the run", "restore the tokenizer.json it was trained with").get_vocab_size()
    if cfg.data.tokenizer != "bpe":
        return get_tokenizer(cfg.data, None, None).get_vocab_size()
    return cfg.data.vocab_size


def seeded_model(
    cfg: Config, vocab_size: int, device: torch.device, rows: int | None
) -> tuple[Transformer, ModelConfig]:
    """The model, drawn from the run's seed: runs of one seed start from the same weights whatever the norm.
    ``rows``: the embedding rows of the checkpoint it resumes or starts from (training/config.py model_config)."""
    seed_everything(cfg.seed)
    try:
        model_cfg = model_config(cfg, vocab_size, rows)
        model = build_model(model_cfg).to("cpu" if cfg.train.parallel == "fsdp" else device)  # FSDP moves shards
    except ValueError as err:  # a bad model shape or norm option
        raise ConfigError(f"model/norm config: {err}") from err
    return model, model_cfg


def runtime_record(
    model: Transformer,
    settings: RunSettings,
    device,
    dist,
    compiled: bool,
    peak: PeakFlops,
    optimizer,
    data_fingerprint,
) -> dict:
    """What actually ran, recorded as ``runtime:`` in the run's config.yaml."""
    return {
        "norm_backend": {norm.role: norm.backend(device) for norm in model.norm_modules().values()},
        "norm_roles": {name: norm.role for name, norm in model.norm_modules().items()},
        "device": str(device),
        "cpu_threads": settings.cpu_threads,
        "precision": settings.precision,
        "world_size": dist.world_size,
        "grad_accum": settings.accum,
        "global_batch_tokens": settings.tokens_per_step,
        "vocab_size": model.cfg.vocab_size,
        "data_fingerprint": data_fingerprint,
        "params": sum(p.numel() for p in model.parameters()),
        "flops_per_token": model.flops_per_token(settings.seq_len),
        "peak_flops": peak.flops,
        "peak_flops_source": peak.source,
        "torch": str(torch.__version__),
        "compiled": compiled,
        "optimizer_groups": optimizer_groups(optimizer, model),
        "memory_per_rank": memory_per_rank(model, optimizer),
    }


def build_run(cfg: Config, run_dir: Path, device: torch.device, dist: Distributed) -> TrainingRun | None:
    """The run ``cfg`` describes in ``run_dir``, resumed where it stopped; None when nothing is left to train."""
    source = init_record = None
    if cfg.train.init_from:  # a new run with another's architecture, weights and tokenizer (training/run/init_from.py)
        from training.run import init_from

        source = init_from.read_source(cfg, run_dir, init_from.user_keys(cfg, init_from.command_line_overrides()))
        init_from.adopt(cfg, source)
        cfg.variant = init_from.run_label(cfg)  # what it trains; the run keeps the name it was given
        check_config(cfg)  # the source's values beside the user's
    settings = resolve_settings(cfg, dist, device)
    configure_device(device)
    resume_entry = check_run_identity(cfg, run_dir, settings)
    if resume_entry is not None:
        from training.run.resume import diverged

        if diverged(cfg, run_dir):
            return None
    rows = resume_entry["vocab_size"] if resume_entry is not None else None  # the embedding rows of the run it
    if rows is None and source is not None and source.model_config is not None:  # resumes, or of its source
        rows = source.model_config.vocab_size
    # The model before any data is read (a bad design choice fails first), for the tokenizer the run will have
    model, model_cfg = seeded_model(cfg, known_vocab_size(cfg, run_dir, source), device, rows)
    if source is not None and source.state is not None:  # before the hooks, which may set the model up
        init_from.check_same_function(model, source)
        init_record = init_from.load_weights(model, source)
    hooks = checked_hooks(model, cfg, dist)  # before compiling and sharding: a hook may set the model up
    corpus = node_first(dist, lambda: open_corpus(cfg.data, source and source.tokenizer))  # the BPE, cached
    source = None  # the source's tensors are freed
    if resume_entry is not None:
        from training.run.resume import check_same_data

        check_same_data(resume_entry, {"train": corpus.train.fingerprint, "val": corpus.val.fingerprint}, run_dir)
    learned = model_config(cfg, corpus.tokenizer.get_vocab_size(), rows)
    if learned.vocab_size != model_cfg.vocab_size:  # a BPE that learned fewer tokens than data.vocab_size asked
        log.info("the tokenizer has %d tokens: the model is built again for them", corpus.tokenizer.get_vocab_size())
        model, model_cfg = seeded_model(cfg, corpus.tokenizer.get_vocab_size(), device, rows)
        hooks = checked_hooks(model, cfg, dist)
    data = node_first(dist, lambda: tokenize(corpus, cfg.data, settings.seq_len, settings.global_batch, cfg.seed))
    use_compile = should_compile(cfg.train.compile, device, cfg.train.max_steps)
    if cfg.train.parallel == "fsdp":  # in place, the blocks compiled first when compiling (training/step/fsdp.py)
        from training.step.fsdp import shard

        compiled = train_model = shard(model, device, dist, use_compile, settings.precision)
    else:
        compiled = train_model = torch.compile(model) if use_compile else model
        if dist.enabled:
            train_model = DDP(compiled, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = build_optimizer(model, cfg.train, device)  # on the shards, under FSDP
    unreadable: set[Path] = set()
    start_step, resumed_from, elapsed_before = 0, None, 0.0
    if dist.is_main:
        remove_partial_checkpoints(run_dir)
    if list_checkpoints(run_dir):  # load the newest readable one into the model and the optimizer
        from training.run.resume import restore

        sharded = cfg.train.parallel == "fsdp"
        found = restore(run_dir, model, optimizer, model_cfg, data.tokenizer, sharded, unreadable)
        start_step, resumed_from, elapsed_before = found
    if resumed_from and start_step >= cfg.train.max_steps:
        log.info("%s finished at step %d: nothing to train (a rerun of a sweep skips it)", run_dir, start_step)
        return None
    peak = peak_flops(device, settings.precision, cfg.train.peak_flops)
    runtime = runtime_record(model, settings, device, dist, use_compile, peak, optimizer, data.fingerprint)
    if init_record is not None:
        runtime["init_from"] = init_record
    run_config = {**dataclasses.asdict(cfg), "runtime": runtime}
    loggers = Loggers([])
    if dist.is_main:
        if resume_entry is not None:
            resume_entry.update(step=start_step, checkpoint=str(resumed_from) if resumed_from else None)
        loggers = open_loggers(cfg, run_dir, run_config, data, resume_entry)
        log_start(cfg, runtime, settings, device, dist, start_step if resumed_from else None)
    return TrainingRun(
        cfg=cfg,
        run_dir=run_dir,
        device=device,
        dist=dist,
        settings=settings,
        data=data,
        model=model,
        compiled=compiled,
        train_model=train_model,
        sharded=cfg.train.parallel == "fsdp",
        model_cfg=model_cfg,
        optimizer=optimizer,
        post_step_hooks=hooks,
        start_step=start_step,
        resumed_from=resumed_from,
        elapsed_before=elapsed_before,
        run_config=run_config,
        loggers=loggers,
        meter=ThroughputMeter(runtime["flops_per_token"], peak.flops * dist.world_size, cfg.train.perf_warmup_steps),
        nonfinite=NonFinitePolicy(cfg.train.nan_policy, cfg.train.max_skipped_steps),
        unreadable=unreadable,
    )


def log_start(cfg: Config, runtime: dict, settings: RunSettings, device, dist, resumed_at: int | None) -> None:
    log.info(
        "run %s: %s params, norm %s (%s), %s on %s x%d, %d tokens/step (accum %d), %d CPU threads (%s)%s",
        cfg.run_name,
        f"{runtime['params']:,}",
        cfg.variant,
        ", ".join(sorted(set(runtime["norm_backend"].values()))) or "no norms",
        settings.precision,
        device,
        dist.world_size,
        settings.tokens_per_step,
        settings.accum,
        settings.cpu_threads,
        settings.threads_why,
        f", resuming from step {resumed_at}" if resumed_at is not None else "",
    )
