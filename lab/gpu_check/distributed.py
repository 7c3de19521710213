"""Stage 6, distributed: FSDP2 and DDP through torchrun, on NCCL, at the number of GPUs here (one is a world): a few
steps each, FSDP's sharded checkpoint resumed by the same launch to the same losses, rank 0's memory against
DDP's. The dry run makes the very same launches over gloo."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import torch
import yaml

from lab.gpu_check.stage import CheckFailed, Stage, last, launched, losses, one_batch_per_step, runtime, train_command

RESUME_RTOL = 1e-3  # a resumed run repeats the same kernels on the same data: only atomics may reorder sums


def distributed(stage: Stage) -> None:
    world = torch.cuda.device_count() if stage.device.type == "cuda" else 1
    steps = 4 if stage.dry_run else 6
    saved_at = steps // 2
    batch = one_batch_per_step(stage, world)
    # Eager: compiled training is stage 4's, and each launch would compile anew.
    overrides = ["norm=fused_rmsnorm", f"train.max_steps={steps}", "train.log_every=1", batch,
                 f"train.checkpoint_every={saved_at}", "train.compile=false", "train.dist_timeout_s=120"]  # fmt: skip
    backend = "NCCL" if stage.device.type == "cuda" else "gloo"
    stage.notes["runs"] = f"{steps} eager steps of norm=fused_rmsnorm, one micro-batch per process, on {backend}"

    def torchrun(mode: str, run_dir: Path) -> list[str]:
        return train_command(stage, [*overrides, f"train.parallel={mode}"], run_dir, processes=world)

    fsdp, ddp, resumed = (stage.scratch / f"{stage.name}-{name}" for name in ("fsdp", "ddp", "fsdp-resumed"))
    stage.progress = "FSDP and DDP training"
    outputs = launched(stage, {"fsdp": torchrun("fsdp", fsdp), "ddp": torchrun("ddp", ddp)})
    stage.notes["launches"] = f"torchrun --nproc_per_node={world}: FSDP and DDP at once, then FSDP's resume"
    policy = re.search(r"computing in (\S+); (\d+) norm modules' parameters float32", outputs["fsdp"])
    if policy is None:
        raise CheckFailed("FSDP's launch did not log its mixed-precision policy: was it sharded?")
    kept, norms = int(policy[2]), len(runtime(fsdp)["norm_roles"])
    stage.notes["FSDP policy"] = f"the blocks compute in {policy[1]}"
    stage.number("norms with float32 parameters, FSDP", kept, "modules", f"norms in the model: {norms}", kept / norms)
    expected = "torch.bfloat16" if stage.device.type == "cuda" else "float32"
    if policy[1] != expected or kept != norms:
        raise CheckFailed(f"FSDP computed in {policy[1]} with {kept} of {norms} norms float32; {expected} expected")
    for key, value in runtime(fsdp)["memory_per_rank"].items():  # param_bytes, grad_bytes, optimizer_state_bytes
        held = runtime(ddp)["memory_per_rank"][key]
        stage.number(f"{key.removesuffix('_bytes')} bytes, rank 0, FSDP", value / 2**20, "MiB",
                     f"DDP's: {held / 2**20:,.1f}", value / held)  # fmt: skip
    peak, held = last(fsdp, "perf/peak_mem_gb"), last(ddp, "perf/peak_mem_gb")
    stage.number("peak memory, rank 0, FSDP", peak, "GB", f"DDP's: {held:.3f}", peak / held)
    loss, ddp_loss = losses(fsdp)[steps], losses(ddp)[steps]
    stage.number(f"training loss at step {steps}, FSDP", loss, "nats", f"DDP's: {ddp_loss:.4f}", loss / ddp_loss)

    checkpoints = sorted((fsdp / "checkpoints").iterdir())
    if not checkpoints or any(path.suffix != ".dcp" for path in checkpoints):
        raise CheckFailed(f"FSDP's checkpoints are {[p.name for p in checkpoints]}, not sharded (step_*.dcp)")
    shutil.copytree(fsdp, resumed)  # as if stopped after its checkpoint at saved_at: the later ones removed
    for later in (resumed / "checkpoints").iterdir():
        if int(later.stem.split("_")[1]) > saved_at:
            shutil.rmtree(later)
    stage.progress = f"FSDP resuming from step {saved_at}"
    launched(stage, {"resume": torchrun("fsdp", resumed)})  # the dry run's too: the same launch, over gloo
    resumes = yaml.safe_load((resumed / "config.yaml").read_text()).get("resumes") or []
    if [entry["step"] for entry in resumes] != [saved_at]:
        raise CheckFailed(f"the rerun did not resume from step {saved_at}: its record's resumes are {resumes}")
    got, uninterrupted = losses(resumed), losses(fsdp)
    worst = max(abs(got[s] - uninterrupted[s]) / abs(uninterrupted[s]) for s in range(saved_at + 1, steps + 1))
    stage.number(f"largest relative loss difference, resumed at step {saved_at}, against uninterrupted", worst,
                 "relative", f"tolerance {RESUME_RTOL}", worst / RESUME_RTOL)  # fmt: skip
    if worst > RESUME_RTOL:
        raise CheckFailed(f"the resumed run's losses differ from the uninterrupted run's by {worst:.3g} (relative)")
