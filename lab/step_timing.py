"""Timing training steps of several models in one process, in interleaved rounds: what bench_variants.py,
bench_train.py and the GPU check's training stage share.

A ``Variant`` is a model of the run config its overrides compose, built from the run's seed (the same weights
outside the norms), with its own optimizer and the post-step hooks training runs; ``measure`` warms each up and
then gives each, round after round in an order that rotates, the same number of full steps on the same batch,
so that machine noise falls on all alike.
"""

from __future__ import annotations

import math
import shlex
import statistics
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

from model import build_model
from model.hf import hf_config, hf_state_dict
from training.config import model_config, register_configs, typed_config
from training.run.runtime import autocast_context, resolve_precision, seed_everything
from training.step.distributed import Distributed
from training.step.optim import build_optimizer
from training.step.post_step import post_step_hooks

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
register_configs()


def compose_config(overrides: list[str]):
    """The typed run config ``overrides`` compose, as train.py passes it on."""
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return typed_config(compose("config", overrides=overrides))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Variant:
    """One model and its optimizer, ready to take training steps."""

    def __init__(self, overrides: list[str], variant: str, device: torch.device) -> None:
        cfg = compose_config([*overrides, *shlex.split(variant)])
        self.label = cfg.variant
        self.precision = resolve_precision(cfg.train.precision, device)
        seed_everything(cfg.seed)
        self.model = build_model(model_config(cfg, cfg.data.vocab_size)).to(device)
        self.optimizer = build_optimizer(self.model, cfg.train, device)
        self.grad_clip = math.inf if cfg.train.grad_clip is None else cfg.train.grad_clip  # inf: no clipping
        self.z_loss = cfg.train.z_loss
        self.post_step_hooks = post_step_hooks(self.model, cfg.train, Distributed())  # as training runs them
        compile_model = cfg.train.compile if cfg.train.compile is not None else device.type == "cuda"
        self.step_model = torch.compile(self.model) if compile_model else self.model
        self.autocast = autocast_context(self.precision, device)
        self.backends = sorted({norm.backend(device) for norm in self.model.norm_modules().values()})

    def steps(self, tokens: torch.Tensor, count: int) -> None:
        for _ in range(count):
            with self.autocast:
                loss = self.step_model(tokens[:, :-1], tokens[:, 1:], z_loss=self.z_loss).objective
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            for hook in self.post_step_hooks:  # nGPT's renormalization, QK-clip
                hook()
        sync(tokens.device)


def hf_model(ours):
    """Hugging Face's LlamaForCausalLM with the shape and weights of our ``ours`` (pre-norm RMSNorm), on SDPA."""
    import transformers

    hf_cfg = transformers.LlamaConfig(**hf_config(ours))
    hf_cfg._attn_implementation = "sdpa"
    model = transformers.LlamaForCausalLM(hf_cfg)
    model.load_state_dict(hf_state_dict(ours), strict=False)
    return model


def train_step(loss_fn, optimizer, tokens, autocast) -> None:
    """One full step: forward under ``autocast``, backward, the optimizer's step."""
    with autocast:
        loss = loss_fn(tokens)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def measure(variants: list[Variant], tokens: torch.Tensor, rounds: int, steps: int, warmup: int) -> dict[str, list]:
    """tokens/s of each variant in each round, the order rotating so that none always goes first."""
    for variant in variants:
        variant.steps(tokens, warmup)
    rates: dict[str, list[float]] = {v.label: [] for v in variants}
    per_step = tokens.shape[0] * (tokens.shape[1] - 1)
    for round_index in range(rounds):
        shift = round_index % len(variants)
        for variant in variants[shift:] + variants[:shift]:
            started = time.perf_counter()
            variant.steps(tokens, steps)
            rates[variant.label].append(steps * per_step / (time.perf_counter() - started))
    return rates


def summarize(rates: dict[str, list[float]], baseline: str) -> list[dict]:
    """Each label's median tokens/s and spread, and its ratio to the baseline's in the same rounds."""
    rows = []
    for label, values in rates.items():
        ratios = [value / base for value, base in zip(values, rates[baseline])]
        rows.append(
            {
                "variant": label,
                "tokens_per_sec": statistics.median(values),
                "min": min(values),
                "max": max(values),
                "ratio": statistics.median(ratios),
                "ratio_min": min(ratios),
                "ratio_max": max(ratios),
            }
        )
    return rows
