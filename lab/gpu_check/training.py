"""Stage 4, training: model=gpu_125m train=gpu with LayerNorm, RMSNorm, the fused RMSNorm and pRMSNorm (compiled,
as the recipe runs them), RMSNorm eager and Hugging Face's LlamaForCausalLM of the same shape and weights, in
interleaved rounds of steps (lab/step_timing.py): tokens/s, MFU against the bf16 dense peak, peak memory.

MFU is tokens/s times the model's training FLOPs per token (6 N for the matrices, forward and backward, plus
12 L H d_head T for attention's scores and values; training/telemetry/throughput.py) over the device's dense bf16
peak."""

from __future__ import annotations

import functools
import time

import torch

from lab.gpu_check.stage import Stage, interleaved
from lab.step_timing import Variant, compose_config, hf_model, summarize, sync, train_step
from training.run.setup import configure_device
from training.step.optim import memory_per_rank
from training.telemetry.throughput import mfu_or_none, peak_flops, peak_memory_gb

NORMS = ("rmsnorm", "fused_rmsnorm", "layernorm", "prmsnorm")  # in order of value; the first is the baseline


class HFLlama:
    """Hugging Face's LlamaForCausalLM with a Variant's shape and weights, taking a plain step (eager, in the
    Variant's autocast); steps like a Variant."""

    label = "hf_llama, eager"
    backends = ["transformers"]

    def __init__(self, ours: Variant, device: torch.device) -> None:
        self.model = hf_model(ours.model).to(device)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4, foreach=True)
        self.autocast = ours.autocast

    def loss(self, tokens: torch.Tensor) -> torch.Tensor:  # HF shifts the labels inside: the same predictions
        return self.model(input_ids=tokens[:, :-1], labels=tokens[:, :-1], use_cache=False).loss

    def steps(self, tokens: torch.Tensor, count: int) -> None:
        for _ in range(count):
            train_step(self.loss, self.optimizer, tokens, self.autocast)
        sync(tokens.device)


def timed_steps(contender, tokens: torch.Tensor, steps: int) -> dict[str, float]:
    """Seconds of ``steps`` training steps, and the peak memory they reached: on CUDA the allocator's peak above
    what every model held before, plus what this one holds at rest (weights, optimizer moments), which is its
    peak had it been alone; on a CPU the process's peak resident set, all models together."""
    device = tokens.device
    sync(device)
    if device.type == "cuda":
        at_rest = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    started = time.perf_counter()
    contender.steps(tokens, steps)
    seconds = time.perf_counter() - started
    if device.type != "cuda":
        return {"seconds": seconds, "peak_bytes": peak_memory_gb(device) * 1e9}
    held = memory_per_rank(contender.model, contender.optimizer)
    peak = torch.cuda.max_memory_allocated(device) - at_rest + held["param_bytes"] + held["optimizer_state_bytes"]
    return {"seconds": seconds, "peak_bytes": peak}


def training(stage: Stage) -> None:
    device = stage.device
    configure_device(device)  # TF32 matmuls, as train.py sets them
    cfg = compose_config(stage.overrides)
    seq_len = cfg.train.seq_len or cfg.model.max_seq_len
    generator = torch.Generator().manual_seed(cfg.seed)
    tokens = torch.randint(0, cfg.data.vocab_size, (cfg.train.batch_size, seq_len + 1), generator=generator)
    tokens = tokens.to(device)
    warmup, steps, rounds = (1, 1, 2) if stage.dry_run else (3, 5, 5)
    baseline, *others = [Variant(stage.overrides, f"norm={norm}", device) for norm in NORMS]
    eager = Variant(stage.overrides, "norm=rmsnorm train.compile=false", device)
    eager.label = "rmsnorm, eager"
    # Warmed up in this order: the baseline, then the two that take no compiling, then the other compiled norms.
    contenders = [baseline, eager, HFLlama(baseline, device), *others]
    compiled = baseline.step_model is not baseline.model
    stage.notes["model"] = (
        f"{cfg.model.name}, {sum(p.numel() for p in baseline.model.parameters()):,} parameters, batch "
        f"{tokens.shape[0]}x{seq_len}, {baseline.precision}; the norms' models "
        f"{'compiled, as train=gpu runs them' if compiled else 'eager (train=gpu compiles on CUDA only)'}"
    )
    stage.notes["norm backends"] = "; ".join(f"{c.label}: {', '.join(c.backends)}" for c in contenders)

    warmed: dict[str, float] = {}  # the first steps compile: the slowest so far foretells the next
    for contender in list(contenders):
        slowest = max(warmed.values(), default=0.0)
        if warmed and stage.left() - slowest < 0.25 * stage.share_s:  # keep a quarter of the share for the rounds
            contenders.remove(contender)
            stage.notes[contender.label] = (
                f"left out: one more warm-up (the slowest took {slowest:.0f} s) would leave the timed rounds less "
                "than a quarter of the share"
            )
            continue
        started = time.perf_counter()
        contender.steps(tokens, warmup)
        warmed[contender.label] = time.perf_counter() - started
        stage.progress = f"{len(warmed)} of {len(NORMS) + 2} models warmed up"
    runs = interleaved({c.label: functools.partial(timed_steps, c, tokens, steps) for c in contenders}, rounds, stage)
    stage.notes["rounds"] = f"{len(runs[baseline.label])} interleaved rounds of {steps} steps after {warmup} warm-up"

    tokens_per_round = steps * tokens.shape[0] * seq_len
    rates = {label: [tokens_per_round / r["seconds"] for r in per_round] for label, per_round in runs.items()}
    peak_bytes = {label: max(r["peak_bytes"] for r in per_round) for label, per_round in runs.items()}
    peak = peak_flops(device, baseline.precision, cfg.train.peak_flops)
    flops_per_token = baseline.model.flops_per_token(seq_len)
    base = baseline.label
    for row in summarize(rates, base):
        label = row["variant"]
        stage.number(f"tokens/s, {label}", row["tokens_per_sec"], "tokens/s", f"{base}, same rounds", row["ratio"])
        stage.number(
            f"model FLOP/s, {label}",
            row["tokens_per_sec"] * flops_per_token / 1e12,
            "TFLOP/s",
            f"{baseline.precision} dense peak, {peak.source}: {peak.flops / 1e12:.1f} TFLOP/s",
            mfu_or_none(row["tokens_per_sec"], flops_per_token, peak.flops),
        )
        stage.number(
            f"peak memory, {label}", peak_bytes[label] / 1e9, "GB", f"{base}'s", peak_bytes[label] / peak_bytes[base]
        )
        stage.number(f"warm-up, {label}", warmed[label], "s", f"{base}'s ({warmup} steps each, compiling included)",
                     warmed[label] / warmed[base])  # fmt: skip
