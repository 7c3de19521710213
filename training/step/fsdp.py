"""FSDP2 (``train.parallel=fsdp``): each process keeps only its shard of every parameter, gradient and optimizer
state, so a model whose training state outgrows one GPU still trains. Imported only when chosen.

``shard`` applies ``torch.distributed.fsdp.fully_shard`` bottom-up, as torchtitan does for Llama: each block
(compiled first when compiling is on, so names and hooks stay the block's), then the root (embeddings, LM
head, whatever is left). Each ``fully_shard`` call is one group whose parameters are all-gathered for its
forward and freed after it; gradients are reduce-scattered in float32.

Norm parameters stay float32 under any mixed-precision policy. A bf16 gain of 1.0 cannot take a small update
(bf16 has 8 significant bits: 1.0 + 1e-3 rounds back to 1.0), and a norm's gain, bias and scalars multiply the
whole residual stream. FSDP2 holds one parameter dtype per group, so the parameters of every ``norms.Norm``,
and of every model module whose class sets ``keep_float32 = True`` (nGPT's ``ScaledVector``), are sharded in a
group of their own per block (and one at the root) with a float32 policy; the block's matrices get the
run's policy: on bf16 runs (CUDA) ``param_dtype=bfloat16, reduce_dtype=float32``, on float32 runs none.
The sharded parameters the optimizer updates are float32 either way.

Without torchrun there is one process and nothing to shard: the run trains as one process does and
writes its checkpoints in the sharded format all the same (training/checkpoints/sharded.py), so a later
run on any number of processes continues it.
"""

from __future__ import annotations

import logging
import warnings

import torch
import torch.distributed
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from norms import Norm
from training.config import ConfigError
from training.step.distributed import Distributed

log = logging.getLogger("normlab.train")
FULL_PRECISION = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32)
# Our blocks never modify a norm's output in place (tests/unit/training/test_fsdp.py runs them sharded), which
# is the one case where FSDP2's warning about a module returning a view matters.
warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")


def check_config(cfg) -> None:
    """Refuse what cannot run sharded, before any data loads."""
    if cfg.train.optimizer == "muon":
        raise ConfigError(
            "train.optimizer=muon orthogonalizes whole matrices, which train.parallel=fsdp splits across "
            "processes: use train.optimizer=adamw with FSDP, or train.parallel=ddp with Muon"
        )


def mixed_precision(precision: str) -> MixedPrecisionPolicy:
    """The policy of the blocks' and the root's groups: bf16 compute with float32 gradient reduction on bf16
    runs, no casting on float32 runs."""
    if precision == "bf16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def full_precision_modules(module: nn.Module) -> list[nn.Module]:
    """The modules under ``module`` whose own parameters stay float32, not yet sharded: norms, found by type,
    and model modules whose class says ``keep_float32 = True``; modules without parameters are left out."""
    return [
        m
        for m in module.modules()
        if (isinstance(m, Norm) or getattr(m, "keep_float32", False))
        and (own := list(m.parameters(recurse=False)))
        and not any(isinstance(p, DTensor) for p in own)
    ]


def shard_module(module: nn.Module, mesh, policy: MixedPrecisionPolicy) -> None:
    """``module``'s full-precision modules in a float32 group, then the rest of ``module`` under ``policy``."""
    keep = full_precision_modules(module)
    if keep:  # gathered from forward to backward (a vector per norm: one all-gather saved), so probes see whole gains
        fully_shard(keep, mesh=mesh, mp_policy=FULL_PRECISION, reshard_after_forward=False)
    fully_shard(module, mesh=mesh, mp_policy=policy)


def shard(model: nn.Module, device: torch.device, dist: Distributed, use_compile: bool, precision: str) -> nn.Module:
    """``model`` sharded in place across the processes (its blocks compiled first when ``use_compile``); the
    same module, its parameters now DTensors. Without a process group (no torchrun), ``model`` on ``device``,
    compiled whole when ``use_compile``, as one process runs it."""
    if not torch.distributed.is_initialized():
        log.info("train.parallel=fsdp without torchrun: one process, nothing to shard; checkpoints are sharded")
        model = model.to(device)
        return torch.compile(model) if use_compile else model
    mesh = init_device_mesh(device.type, (dist.world_size,))
    policy = mixed_precision(precision)
    kept = len(full_precision_modules(model))
    for block in model.layers:
        if use_compile:
            block.compile()  # in place: the block keeps its name, so parameter and metric names stay
        shard_module(block, mesh, policy)
    shard_module(model, mesh, policy)
    if dist.is_main:
        log.info(
            "FSDP: %d blocks and the root sharded across %d processes, computing in %s; %d norm modules' "
            "parameters float32 in groups of their own",
            len(model.layers), dist.world_size, policy.param_dtype or "float32", kept,
        )  # fmt: skip
    return model
