"""Training throughput of our decoder against Hugging Face's LlamaForCausalLM, same process.

    python scripts/bench_train.py                       # the default CPU model (configs/model/small.yaml)
    python scripts/bench_train.py --model gpu_125m --batch-size 16 --steps 30   # on a GPU

Both models get the same dimensions (norm=rmsnorm, tied embeddings), the same weights, the same
batches and the same AdamW. Each computes its loss as its users would: ours with
``model(inputs, targets)`` (LM head fused with the cross-entropy), Hugging Face's with
``labels=``. Full training steps (forward, backward, optimizer) are timed after warm-up,
alternating between the two so that machine noise hits both. Prints tokens/s, MFU from the
same FLOPs-per-token count, and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import yaml

from lab.step_timing import hf_model, sync, train_step
from model import ModelConfig, NormConfig, Transformer
from training.run.runtime import autocast_context, resolve_device
from training.telemetry.throughput import mfu_or_none, peak_flops

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "model"


def load_preset(name: str, vocab_size: int) -> ModelConfig:
    preset = yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())
    preset.pop("name")
    return ModelConfig(**preset, vocab_size=vocab_size, norm=NormConfig(name="rmsnorm"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="small", help="a preset in configs/model")
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=None, help="default: the preset's max_seq_len")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--precision", default=None, help="fp32 or bf16 (default: bf16 on CUDA, fp32 elsewhere)")
    parser.add_argument("--compile", action="store_true", help="also time normlab under torch.compile")
    args = parser.parse_args()

    device = resolve_device(args.device)
    precision = args.precision or ("bf16" if device.type == "cuda" else "fp32")
    autocast = autocast_context(precision, device)
    cfg = load_preset(args.model, args.vocab_size)
    seq_len = args.seq_len or cfg.max_seq_len
    torch.manual_seed(0)
    ours = Transformer(cfg).to(device)
    theirs = hf_model(ours).to(device)
    # Same tokens predicted by both: HF shifts labels inside, so it gets the full window as labels.
    models = {
        "normlab": (ours, lambda t: ours(t[:, :-1], t[:, 1:]).objective),
        "hf_llama": (theirs, lambda t: theirs(input_ids=t[:, :-1], labels=t[:, :-1], use_cache=False).loss),
    }
    if args.compile:  # a second copy with the same weights, so the optimizers stay apart
        torch.manual_seed(0)
        twin = Transformer(cfg).to(device)
        compiled = torch.compile(twin)
        models["normlab_compiled"] = (twin, lambda t: compiled(t[:, :-1], t[:, 1:]).objective)
    optimizers = {name: torch.optim.AdamW(m.parameters(), lr=1e-4, foreach=True) for name, (m, _) in models.items()}
    tokens = torch.randint(0, cfg.vocab_size, (args.batch_size, seq_len + 1), device=device)

    warmup_seconds = {}
    for name, (_, forward) in models.items():
        sync(device)
        started = time.perf_counter()
        for _ in range(args.warmup):
            train_step(forward, optimizers[name], tokens, autocast)
        sync(device)
        warmup_seconds[name] = time.perf_counter() - started
    seconds = {name: [] for name in models}
    for _ in range(args.rounds):
        for name, (_, forward) in models.items():
            sync(device)
            started = time.perf_counter()
            for _ in range(args.steps):
                train_step(forward, optimizers[name], tokens, autocast)
            sync(device)
            seconds[name].append((time.perf_counter() - started) / args.steps)

    flops_per_token = ours.flops_per_token(seq_len)
    peak, peak_source = peak_flops(device, precision, None)  # best of several trials on CPU
    print(
        f"model={args.model} params={sum(p.numel() for p in ours.parameters()):,} batch={args.batch_size}x{seq_len} "
        f"device={device} precision={precision} torch={torch.__version__}"
    )
    print(f"peak {peak / 1e12:.3f} TFLOP/s ({peak_source}); {flops_per_token / 1e6:.2f} MFLOP per token")
    tokens_per_step = args.batch_size * seq_len
    rates = {}
    for name, times in seconds.items():
        step = statistics.median(times)
        rates[name] = tokens_per_step / step
        mfu = mfu_or_none(rates[name], flops_per_token, peak)
        print(
            f"{name:>16}: {rates[name]:>10,.0f} tokens/s  step {1000 * step:7.1f} ms  "
            f"MFU {'n/a (peak mis-measured)' if mfu is None else f'{mfu:6.1%}'}  "
            f"warm-up {warmup_seconds[name]:.1f} s for {args.warmup} steps"
        )
    for name in rates:
        if name != "hf_llama":
            print(f"ratio {name} / hf_llama: {rates[name] / rates['hf_llama']:.2f}x")


if __name__ == "__main__":
    main()
