"""The wandb logger: a run's metrics rows on wandb, beside metrics.jsonl (training/telemetry/loggers.py).

wandb must never hang a run: with mode ``auto`` it goes online only when the user is logged
in, waits at most ``logger.init_timeout`` seconds for the server, and otherwise runs offline
inside the run directory and says how to upload it later.
"""

from __future__ import annotations

import logging
import os
import uuid
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


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
