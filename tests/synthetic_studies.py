"""Synthetic study folders for the lab tests: run directories as train.py writes them, with chosen losses."""

import json
import math

import yaml

from lab.results import PLAN_FILE

QK = {"norm.name": "rmsnorm", "norm.placement": "pre", "norm.qk": "rmsnorm"}
PRE = {"norm.name": "rmsnorm", "norm.placement": "pre", "norm.qk": None}
CLAIMS = [
    {"claim": "QK-norm lowers LR sensitivity", "source": "Wortsman et al. 2023", "statistic": "lr_sensitivity",
     "arm": QK, "against": PRE, "expect": "lower"},
    {"claim": "QK-norm bounds the logits", "source": "Wortsman et al. 2023", "statistic": "max_attn_logit",
     "arm": QK, "against": PRE, "expect": "lower"},
    {"claim": "Peri-norm keeps the stream flat", "source": "Kim et al. 2025", "statistic": "stream_growth",
     "arm": {**PRE, "norm.placement": "peri"}, "against": PRE, "expect": "lower"},
    {"claim": "DyT matches RMSNorm", "source": "Zhu et al. 2025", "statistic": "best_loss",
     "arm": {"norm.name": "dyt"}, "against": PRE, "expect": "similar", "margin": 0.05},
    {"claim": "Post-norm is less stable", "source": "Xiong et al. 2020", "statistic": "lr_sensitivity",
     "arm": {**PRE, "norm.placement": "post"}, "against": PRE, "expect": "higher"},
]  # fmt: skip

VOCAB = 4096
L0 = math.log(VOCAB)


def write_run(
    root, label, lr, final_loss, seed=0, diverged_at=None, tokenizer="bpe-a", metrics=True, model="deep", n_layers=4
):
    run = root / f"{model}-{label}-lr{lr}-s{seed}"
    run.mkdir(parents=True)
    parts = label.split("-")
    placement = next((p for p in parts if p in ("post", "peri", "reordered")), "pre")
    config = {
        "variant": label,
        "norm": {"name": parts[0], "placement": placement, "qk": parts[0] if "qk" in parts else None},
        "seed": seed,
        "model": {"name": model, "n_layers": n_layers, "d_model": 64, "max_seq_len": 128, "tie_embeddings": True},
        "train": {"lr": lr, "max_steps": 20},
        "runtime": {"vocab_size": VOCAB, "global_batch_tokens": 2048, "params": 10240},
    }
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    (run / "tokenizer.json").write_text(tokenizer)
    if not metrics:
        return run
    rows = []
    for step in (10, 20):
        row = {"step": step, "train/loss": final_loss + 1, "attn/layers.0/max_logit": lr * 100 * step}
        # Pre-norm's stream grows with depth (2, 4, 6); peri-norm's stays flat (1.1).
        row.update({f"act/layers.{i}/stream_rms": 1.1 if "peri" in label else 2.0 * (1 + i) for i in range(3)})
        row.update({f"act/layers.{i}/stream_feature_kurtosis": 3.0 + step for i in range(3)})
        rows.append(row)
    if diverged_at is None:
        rows[-1].update({"val/loss": final_loss, "val/bpb": final_loss / 2})
    else:
        rows.append({"step": diverged_at, "diverged": True, "train/loss": "nan", "train/last_finite_loss": 6.0})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def write_study(root, grid: dict, selection=(0, 1, 2), report=(3, 4), best_lr=0.01, spread=0.03, **kwargs) -> None:
    """Every variant of ``grid`` ({variant: {lr: loss or None for diverged}}) at every rate with the selection
    seeds (seed s adds ``spread * s`` at the lowest rate only, so per-seed sensitivities differ), then the
    report seeds at ``best_lr`` (seed s adds 0.1 * (s - first report seed) there)."""
    for arm, by_lr in grid.items():
        lowest = min(by_lr)
        for seed in selection:
            for lr, loss in by_lr.items():
                value = 0.0 if loss is None else loss + (spread * seed if lr == lowest else 0.0)
                write_run(root, arm, lr, value, seed=seed, diverged_at=None if loss is not None else 15, **kwargs)
        for seed in report:
            loss = by_lr[best_lr]
            write_run(root, arm, best_lr, loss + 0.1 * (seed - report[0]), seed=seed, **kwargs)
    # What python -m lab study records in the study's folder: the grid and the spec's claims.
    rates = sorted({lr for by_lr in grid.values() for lr in by_lr})
    (root / PLAN_FILE).write_text(json.dumps({"learning_rates": rates, "variants": list(grid), "claims": CLAIMS}))
