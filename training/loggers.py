"""Where a run's metrics rows go: metrics.jsonl always (training/metrics_file.py), and wandb when configured;
and, once a run is accepted, its log (train.log) and Hydra's record of the command (.hydra/).

wandb must never hang a run: with mode ``auto`` it goes online only when the user is logged
in, waits at most ``logger.init_timeout`` seconds for the server, and otherwise runs offline
inside the run directory and says how to upload it later.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import uuid
from pathlib import Path
from typing import Any

from training.atomic import atomic_write_text
from training.metrics_file import MetricsFile
from training.run_record import append_resume, write_new_record

log = logging.getLogger(__name__)

WANDB_MODES = ("auto", "online", "offline", "disabled")


def _logged_in() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    return netrc.is_file() and "api.wandb.ai" in netrc.read_text(errors="ignore")


class WandbLogger:
    def __init__(
        self, logger_cfg, run_dir: Path, run_name: str, group: str, config: dict, job_type: str = "train"
    ) -> None:
        import wandb

        mode = str(logger_cfg.mode)
        if mode == "auto":
            mode = "online" if _logged_in() else "offline"
            if mode == "offline":
                log.info(
                    "wandb: not logged in, logging offline; upload later with: wandb sync %s/wandb/offline-run-*",
                    run_dir,
                )
        # A resumed run continues the same wandb run.
        id_file = run_dir / "wandb_id.txt"
        run_id = id_file.read_text().strip() if id_file.exists() else uuid.uuid4().hex[:12]
        id_file.write_text(run_id)
        kwargs = dict(
            project=logger_cfg.project,
            entity=logger_cfg.entity,
            name=run_name,
            group=group,
            tags=list(logger_cfg.tags),
            config=config,
            dir=str(run_dir),
            id=run_id,
            resume="allow",
            job_type=job_type,
        )
        try:
            self.run = wandb.init(mode=mode, settings=wandb.Settings(init_timeout=logger_cfg.init_timeout), **kwargs)
        except Exception as err:  # wandb raises its own CommError/UsageError types on a failed connection
            if mode != "online":
                raise
            log.warning(
                "wandb: could not reach the server (%s); logging offline instead. Upload later with: "
                "wandb sync %s/wandb/offline-run-*",
                err,
                run_dir,
            )
            wandb.teardown()  # release the failed attempt's claim on the run id
            self.run = wandb.init(mode="offline", **kwargs)
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")

    def log(self, metrics: dict[str, Any]) -> None:
        # No step=: wandb's own step must only grow, but a resumed run logs some steps again.
        # Curves use the "step" key as their x-axis (define_metric above).
        self.run.log(metrics)

    def close(self) -> None:
        self.run.finish()


class Loggers:
    """Fans each metrics row out to every logger."""

    def __init__(self, loggers: list) -> None:
        self.loggers = loggers

    def log(self, metrics: dict[str, Any]) -> None:
        for logger in self.loggers:
            logger.log(metrics)

    def close(self) -> None:
        for logger in self.loggers:
            logger.close()


def record_command(cfg, run_dir: Path) -> None:
    """Hydra's record of this command in ``<run dir>/.hydra/`` (config, hydra and overrides), and the log held
    since the start (configs/hydra/job_logging/normlab.yaml) into ``train.log``, which takes every line from now."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    if not HydraConfig.initialized():  # called from code rather than through train.py
        return
    hydra_cfg = HydraConfig.get()
    root = logging.getLogger()
    held = next((h for h in root.handlers if isinstance(h, logging.handlers.MemoryHandler)), None)
    # The log first: one that cannot be opened stops the command before anything else is written. (A run's log
    # that is a link was refused before anything was written: training/run_record.py check_run_directory.)
    file = logging.FileHandler(run_dir / f"{hydra_cfg.job.name}.log") if held is not None else None
    record = run_dir / ".hydra"
    record.mkdir(exist_ok=True)
    for name, node in (("config", cfg), ("hydra", {"hydra": hydra_cfg}), ("overrides", hydra_cfg.overrides.task)):
        atomic_write_text(record / f"{name}.yaml", OmegaConf.to_yaml(node))  # replaced, never written through a link
    if held is not None:
        console = next((h for h in root.handlers if h is not held and h.formatter), None)
        file.setFormatter(console.formatter if console else logging.Formatter())
        held.setTarget(file)
        held.flush()
        root.removeHandler(held)
        root.addHandler(file)


def open_loggers(cfg, run_dir: Path, run_config: dict, data, resume: dict | None) -> Loggers:
    """Record the run (or append this resume to its record), the command and its log, and open metrics.jsonl
    (and wandb when configured)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    record_command(cfg, run_dir)
    if resume is None:
        write_new_record(run_dir, run_config)
        (run_dir / "tokenizer.json").write_text(data.tokenizer.to_str())
    else:
        append_resume(run_dir, resume, run_config["runtime"])
    loggers = [MetricsFile(run_dir / "metrics.jsonl", resume_step=None if resume is None else resume["step"])]
    if cfg.logger.name == "wandb":
        group = cfg.logger.group or f"{cfg.model.name}-{cfg.variant}"
        loggers.append(WandbLogger(cfg.logger, run_dir, cfg.run_name, group, run_config))
    return Loggers(loggers)
