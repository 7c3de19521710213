"""Where a run's metrics rows go: metrics.jsonl always (training/telemetry/metrics_file.py), and wandb when configured
(training/telemetry/wandb_logger.py, imported only then); and, once a run is accepted, its log (train.log) and Hydra's
record of the command (.hydra/).
"""

from __future__ import annotations

import logging
import logging.handlers
from pathlib import Path
from typing import Any

from training.atomic import atomic_write_text
from training.run.record import write_new_record
from training.telemetry.metrics_file import MetricsFile

WANDB_MODES = ("auto", "online", "offline", "disabled")


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
    # that is a link was refused before anything was written: training/run/record.py check_run_directory.)
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
        from training.run.resume import append_resume

        append_resume(run_dir, resume, run_config["runtime"])
    loggers = [MetricsFile(run_dir / "metrics.jsonl", resume_step=None if resume is None else resume["step"])]
    if cfg.logger.name == "wandb":
        from training.telemetry.wandb_logger import WandbLogger

        group = cfg.logger.group or f"{cfg.model.name}-{cfg.variant}"
        loggers.append(WandbLogger(cfg.logger, run_dir, cfg.run_name, group, run_config))
    return Loggers(loggers)
