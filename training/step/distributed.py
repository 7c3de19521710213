"""Process-group setup for torchrun: DDP (or FSDP2, training/step/fsdp.py) on NCCL for GPUs, gloo for CPUs.

torchrun sets RANK, LOCAL_RANK and WORLD_SIZE; without them this is a single process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass
class Distributed:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def mean(self, value: float, device: torch.device) -> float:
        """The average of a scalar across processes."""
        if not self.enabled:
            return value
        tensor = torch.tensor([value], dtype=torch.float64, device=device)
        dist.all_reduce(tensor)
        return tensor.item() / self.world_size

    def max_(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` replaced, in place, by its elementwise maximum across processes."""
        if self.enabled:
            dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return tensor

    def all_true(self, flag: bool, device: torch.device) -> bool:
        """Whether ``flag`` holds on every process (a collective: every process must call it)."""
        return self.mean(float(flag), device) == 1.0

    def check_in_sync(self, model: torch.nn.Module, device: torch.device) -> float:
        """Raise if the processes' weights differ; returns this process's weight checksum."""
        checksum = sum(p.detach().double().pow(2).sum().item() for p in model.parameters())
        if self.enabled:
            gathered = [None] * self.world_size
            dist.all_gather_object(gathered, checksum)
            if len(set(gathered)) != 1:
                raise RuntimeError(f"DDP processes hold different weights (checksums {gathered})")
        return checksum

    def close(self) -> None:
        if self.enabled and dist.is_initialized():
            dist.destroy_process_group()


def launched_by_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def init_distributed(device_type: str, timeout_s: float = 600) -> Distributed:
    if not launched_by_torchrun():
        return Distributed()
    rank, local_rank, world = (int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
    backend = "nccl" if device_type == "cuda" else "gloo"
    if device_type == "cuda":
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s))
    return Distributed(rank, local_rank, world)
