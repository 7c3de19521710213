"""Training speed of norm variants inside the model, measured by interleaving them in one process.

    python scripts/bench_variants.py                                   # every registered norm, placements, QK-norm
    python scripts/bench_variants.py --variant norm=rmsnorm --variant "norm=rmsnorm norm.placement=peri"
    python scripts/bench_variants.py model=gpu_125m train=gpu          # Hydra overrides shared by all variants

This is the only source of speed claims in normlab: runs that trained one after another on a
shared machine differ by more than the norms do. Every variant is built at the same size from
the same seed (the same weights outside the norms), gets its own AdamW, and is warmed up; then
in each round every variant runs the same number of full training steps (forward, backward,
clipping, optimizer) on the same batch, in an order that rotates from round to round. Reported
per variant: median tokens/s over rounds, the spread (min-max), and the median over rounds of
its ratio to the baseline measured in the same round.

Output: a Markdown table on stdout and results.json in --out.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from lab.runs import BASELINE, default_baseline
from lab.step_timing import Variant, compose_config, measure, summarize
from model.assembly import block_placements
from norms import NORM_NAMES
from training.run.runtime import resolve_device

# The design space's switches that are not a norm type or placement, each measured on the baseline.
SWITCHES = (
    "norm.placement=mix_ln",
    "norm.depth_scaling=inverse_sqrt",
    "train.z_loss=1e-4",
    "model.logit_softcap=30",
    "model.attn_softcap=50",
    "train.qk_clip=100",
    "model.embed_scale=learned",
    "train.weight_decay_mode=independent train.weight_decay=1e-4",
    "train.optimizer=muon",
    "norm.placement=hybrid_star",
    "norm.qk=rmsnorm norm.v=rmsnorm",
    "norm.after_linear=rmsnorm",
    "model.attn_gate=headwise",
    "model.attn_gate=elementwise",
    "model.attn_sink=learned",
)


def default_variants() -> list[str]:
    """Every registered norm pre-norm, then the baseline's other placements and QK-norm."""
    base = f"norm={BASELINE}"
    variants = [f"norm={name}" for name in NORM_NAMES]
    variants += [f"{base} norm.placement={p}" for p in block_placements() if p != "pre"]
    variants += ["norm=ngpt"]  # nGPT's block, L2 norm, untied embeddings and per-step renormalization
    variants += [f"{base} norm.qk={BASELINE}", f"{base} norm.placement=reordered norm.qk={BASELINE} norm.qk_axis=all"]
    variants += [f"{base} {switch}" for switch in SWITCHES]
    return variants


def table(rows: list[dict], baseline: str, backends: dict[str, list[str]]) -> str:
    lines = [
        f"| variant | norm backend | tokens/s (median) | min – max | vs {baseline} (median) | min – max |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['variant']} | {', '.join(backends[r['variant']]) or '–'} | {r['tokens_per_sec']:,.0f} | "
            f"{r['min']:,.0f} – {r['max']:,.0f} | {r['ratio']:.3f} | {r['ratio_min']:.3f} – {r['ratio_max']:.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every variant, e.g. model=tiny")
    parser.add_argument("--variant", action="append", help="overrides of one variant (repeatable); default: all")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=5, help="training steps per variant per round")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per variant first")
    parser.add_argument("--out", type=Path, default=Path("bench_out/variants"))
    args = parser.parse_args(argv)

    specs = args.variant or default_variants()
    if not specs:
        print("bench_variants: no variants given", file=sys.stderr)
        return 1
    cfg = compose_config(args.overrides)
    device = resolve_device(cfg.device)
    try:
        variants = [Variant(args.overrides, spec, device) for spec in specs]
    except ValueError as err:
        print(f"bench_variants: {err}", file=sys.stderr)
        return 1
    labels = [v.label for v in variants]
    if len(set(labels)) != len(labels):
        print(f"bench_variants: two variants are the same ({labels})", file=sys.stderr)
        return 1
    baseline = default_baseline(labels)
    seq_len = cfg.train.seq_len or cfg.model.max_seq_len
    generator = torch.Generator().manual_seed(cfg.seed)
    tokens = torch.randint(0, cfg.data.vocab_size, (cfg.train.batch_size, seq_len + 1), generator=generator)
    tokens = tokens.to(device)

    threads = torch.get_num_threads()
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {threads} threads"
    print(f"{len(variants)} variants, model={cfg.model.name}, batch {tuple(tokens[:, 1:].shape)}, on {where}")
    rates = measure(variants, tokens, args.rounds, args.steps, args.warmup)
    rows = summarize(rates, baseline)
    backends = {v.label: v.backends for v in variants}
    report = table(rows, baseline, backends)
    print(report)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {
        "device": where,
        "torch": torch.__version__,
        "model": cfg.model.name,
        "overrides": args.overrides,
        "rounds": args.rounds,
        "steps": args.steps,
        "warmup": args.warmup,
        "baseline": baseline,
    }
    (args.out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows, "rates": rates}, indent=1))
    print(f"wrote {args.out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
