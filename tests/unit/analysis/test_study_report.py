"""scripts/study_report.py on synthetic study folders: the LR-sensitivity metric, divergences, skips,
refusals, and claims declared as data."""

import json
import math

import pytest
import yaml

from analysis import compare_runs, study_report
from analysis.claims import Claim, evaluate_claim
from analysis.results import common_grid, load_results
from analysis.runs import SWEPT, RunsError, default_baseline, find_runs, group_runs, loss_ceiling, swept_keys
from analysis.size_report import by_size, write_size_report
from analysis.stats import welch_p_value
from analysis.study import Study, lr_sensitivity, summarize

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
     "arm": {"norm.name": "dyt"}, "against": PRE, "expect": "similar", "margin": 0.05,
     "not_tested": "the paper's recipe was not run"},
    {"claim": "Post-norm is less stable", "source": "Xiong et al. 2020", "statistic": "lr_sensitivity",
     "arm": {**PRE, "norm.placement": "post"}, "against": PRE, "expect": "higher"},
]  # fmt: skip

VOCAB = 4096
L0 = math.log(VOCAB)


def _write_run(root, variant, lr, final_loss, seed=0, diverged_at=None, tokenizer="bpe-a", metrics=True):
    run = root / f"deep-{variant}-lr{lr}-s{seed}"
    run.mkdir(parents=True)
    parts = variant.split("-")
    placement = next((p for p in parts if p in ("post", "peri", "reordered")), "pre")
    config = {
        "variant": variant,
        "norm": {"name": parts[0], "placement": placement, "qk": parts[0] if "qk" in parts else None},
        "seed": seed,
        "train": {"lr": lr},
        "runtime": {"vocab_size": VOCAB, "global_batch_tokens": 2048},
        "claims": CLAIMS,
    }
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    (run / "tokenizer.json").write_text(tokenizer)
    if not metrics:
        return run
    rows = []
    for step in (10, 20):
        row = {"step": step, "train/loss": final_loss + 1, "attn/layers.0/max_logit": lr * 100 * step}
        # Pre-norm's stream grows with depth (2, 4, 6); peri-norm's stays flat (1.1).
        row.update({f"act/layers.{i}/stream_rms": 1.1 if "peri" in variant else 2.0 * (1 + i) for i in range(3)})
        row.update({f"act/layers.{i}/stream_feature_kurtosis": 3.0 + step for i in range(3)})
        rows.append(row)
    if diverged_at is None:
        rows[-1].update({"val/loss": final_loss, "val/bpb": final_loss / 2})
    else:
        rows.append({"step": diverged_at, "diverged": True, "train/loss": "nan", "train/last_finite_loss": 6.0})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


@pytest.fixture
def study(tmp_path):
    root = tmp_path / "stability"
    grid = {
        "rmsnorm": {0.001: 5.0, 0.01: 4.0, 0.1: None},
        "rmsnorm-qk": {0.001: 5.1, 0.01: 4.1, 0.1: 4.5},
        "rmsnorm-peri": {0.001: 5.2, 0.01: 4.2, 0.1: 4.6},
        "dyt": {0.001: 5.5, 0.01: 4.9, 0.1: None},
    }
    for variant, by_lr in grid.items():
        for lr, loss in by_lr.items():
            _write_run(root, variant, lr, loss if loss is not None else 0.0, diverged_at=None if loss else 15)
    _write_run(root, "identity", 0.001, 6.0, metrics=False)  # a run that never logged: named and skipped
    return root


def test_lr_sensitivity_against_a_hand_calculation():
    # Losses 5.0, 4.0 and a divergence (counted as the initial loss L0): best 4.0.
    expected = ((5.0 - 4.0) + 0.0 + (L0 - 4.0)) / 3
    assert lr_sensitivity({0.001: 5.0, 0.01: 4.0, 0.1: L0}) == pytest.approx(expected)
    assert lr_sensitivity({0.001: 4.0, 0.01: 4.0}) == 0.0


def test_report_on_a_study_with_a_diverged_and_a_missing_run(study, tmp_path):
    out = tmp_path / "report"
    assert study_report.main([str(study), "--out", str(out)]) == 0
    report = (out / "report.md").read_text()
    for figure in ("loss_vs_lr.png", "attention_logits.png", "depth.png", "feature_kurtosis.png"):
        assert (out / figure).stat().st_size > 5_000, figure
    rows = {line.split("|")[1].strip(): line for line in report.splitlines() if line.startswith("| ")}
    rms = rows["rmsnorm"].split("|")
    assert rms[2].strip() == "0.01 (0.001–0.1)" and rms[3].strip() == "4.000 (1)"  # one seed: no interval
    assert float(rms[5]) == pytest.approx(((5.0 - 4.0) + (L0 - 4.0)) / 3, abs=1e-3)
    assert rms[6].strip() == "yes" and rms[7].strip() == "0.1"  # diverged at lr 0.1
    assert float(rows["rmsnorm-qk"].split("|")[5]) == pytest.approx((1.0 + 0.4) / 3, abs=1e-3)
    assert rows["dyt"].split("|")[4].strip() == "+0.900"  # paired over its one seed: no interval
    assert rows["dyt"].split("|")[6].strip() == "**no**"
    assert "identity" not in rows and "## Skipped" in report and "deep-identity-lr0.001-s0" in report
    results = json.loads((out / "study.json").read_text())
    assert results["learning_rates"] == [0.001, 0.01, 0.1] and results["unigram_loss"] is None
    assert len(results["cells"]) == 12 and {
        "variant": "rmsnorm",
        "lr": 0.1,
        "seed": 0,
        "loss": None,
        "diverged": True,
    } in [{k: c[k] for k in ("variant", "lr", "seed", "loss", "diverged")} for c in results["cells"]]
    rms = results["variants"]["rmsnorm"]
    assert rms["best_lr"] == 0.01 and rms["best_lr_inside"] and rms["trained"] and rms["rates"] == [0.001, 0.01, 0.1]
    assert rms["best_loss"]["mean"] == 4.0 and rms["best_loss"]["ci95"] is None  # one seed: no interval
    assert rms["lr_sensitivity"]["value"] == pytest.approx(((5.0 - 4.0) + (L0 - 4.0)) / 3)
    dyt = results["variants"]["dyt"]  # 0.9 nats behind the baseline (runs without a unigram line: the fallback)
    assert not dyt["trained"] and dyt["explanation"].startswith("best loss 4.900 at lr 0.01, more than 0.5 nats above")
    assert {c["verdict"] for c in results["claims"]} == {"inconclusive", "not tested"}
    # The attention panels: the baseline survives 0.01 and diverges at 0.1.
    assert "at lr 0.01 (the highest the baseline survives) and 0.1 (the next one up)" in report
    assert "over 1 paired seeds (one seed: no interval)" in report
    # Claims, each evaluated from the arms its config fields pick: one seed gives numbers, no interval.
    claims = {line.split("|")[1].strip(): line for line in report.splitlines() if "(expect " in line}
    assert (
        "0.467 vs 1.77 | -1.31 | – | **inconclusive** (one seed: no interval)"
        in claims["QK-norm lowers LR sensitivity (expect lower)"]
    )
    assert "20 vs 20 | +0 |" in claims["QK-norm bounds the logits (expect lower)"]
    assert "1 vs 3 | -2 |" in claims["Peri-norm keeps the stream flat (expect lower)"]
    assert "**not tested** (the paper's recipe was not run)" in claims["DyT matches RMSNorm (expect similar)"]
    assert "**not tested** (no variant in these runs has" in claims["Post-norm is less stable (expect higher)"]


def test_seeds_give_welch_p_values(tmp_path):
    root = tmp_path / "s"
    for seed, (a, b) in enumerate([(4.0, 4.5), (4.1, 4.6), (4.05, 4.55)]):
        _write_run(root, "rmsnorm", 0.01, a, seed=seed)
        _write_run(root, "layernorm", 0.01, b, seed=seed)
    results = load_results([str(root)], "val/loss")[0]
    summaries = summarize(results, common_grid(results))
    assert summaries["layernorm"].best_mean - summaries["rmsnorm"].best_mean == pytest.approx(0.5)
    assert welch_p_value(summaries["layernorm"].best_values, summaries["rmsnorm"].best_values) < 0.01


def test_mixed_tokenizers_are_refused_for_loss_but_not_for_bits_per_byte(tmp_path):
    root = tmp_path / "mixed"
    _write_run(root, "rmsnorm", 0.01, 4.0, tokenizer="bpe-a")
    _write_run(root, "layernorm", 0.01, 4.2, tokenizer="bpe-b")
    with pytest.raises(RunsError, match="different tokenizers"):
        load_results([str(root)], "val/loss")
    assert study_report.main([str(root), "--out", str(tmp_path / "o"), "--metric", "val/bpb"]) == 0


def test_no_runs_or_no_baseline_is_a_clear_error(tmp_path):
    (tmp_path / "empty").mkdir()
    assert study_report.main([str(tmp_path / "empty"), "--out", str(tmp_path / "o")]) == 1
    root = tmp_path / "nobase"
    _write_run(root, "dyt", 0.01, 4.0)
    with pytest.raises(RunsError, match="baseline 'rmsnorm' is not among the variants: dyt"):
        study_report.write_report([str(root)], tmp_path / "o2", "val/loss", None, "rmsnorm")


def test_a_claim_with_seeds_gets_a_paired_interval_and_a_verdict(tmp_path):
    """Three seeds: QK-norm's loss is lower at every rate in each seed (a seed-specific offset shared
    by both arms), so its paired difference in best loss has an interval below zero."""
    root = tmp_path / "seeds"
    for seed, offset in enumerate([0.0, 0.3, -0.2]):
        for lr, (base, qk) in {0.001: (5.0, 4.9), 0.01: (4.0, 3.8), 0.1: (4.6, 4.5)}.items():
            _write_run(root, "rmsnorm", lr, base + offset, seed=seed)
            _write_run(root, "rmsnorm-qk", lr, qk + offset + 0.01 * seed, seed=seed)
    results, _ = load_results([str(root)], "val/loss")
    study = Study(results, "rmsnorm")
    claim = Claim("QK-norm lowers the loss", "test", "best_loss", QK, PRE, "lower")
    evaluated = evaluate_claim(claim, study)
    assert (evaluated["arm"], evaluated["against"], evaluated["seeds"]) == ("rmsnorm-qk", "rmsnorm", 3)
    assert evaluated["difference"] == pytest.approx(-0.19)
    low, high = evaluated["ci95"]
    assert -0.2 - 1e-9 <= low <= high < 0 and evaluated["p"] < 0.01 and evaluated["verdict"] == "agrees"
    flipped = evaluate_claim(Claim("x", "test", "best_loss", QK, PRE, "higher"), study)
    assert flipped["verdict"] == "disagrees"
    # Without the highest rate both arms' best sits at the edge of the rates run: no verdict on a best loss.
    edge = Study([r for r in results if r.lr < 0.1], "rmsnorm")
    at_edge = evaluate_claim(claim, edge)
    assert at_edge["verdict"] == "not tested" and "best rate at an edge" in at_edge["why"]


def test_grouping_by_swept_keys_pools_only_seeds(tmp_path):
    """compare_runs' and the explorer's default: runs of different learning rates are never pooled."""
    root = tmp_path / "grid"
    for seed in (0, 1):
        for lr in (0.001, 0.01):
            _write_run(root, "rmsnorm", lr, 4.0 + lr, seed=seed)
            _write_run(root, "rmsnorm-qk", lr, 4.1 + lr, seed=seed)
    runs = find_runs([str(root)])
    assert swept_keys(runs) == ["train.lr"]
    groups = group_runs(runs, SWEPT)
    assert list(groups) == [
        "rmsnorm, train.lr=0.001", "rmsnorm, train.lr=0.01", "rmsnorm-qk, train.lr=0.001", "rmsnorm-qk, train.lr=0.01"
    ]  # fmt: skip
    assert all(sorted(r.config["seed"] for r in g) == [0, 1] for g in groups.values())
    assert default_baseline(groups) == "rmsnorm, train.lr=0.001"
    assert list(group_runs(runs, "variant")) == ["rmsnorm", "rmsnorm-qk"]  # an explicit key still pools rates


def test_the_unigram_line_decides_who_trained_and_the_probes_explain_why(tmp_path):
    root = tmp_path / "u"
    for seed in (0, 1, 2):
        for lr, (base, flat) in {0.001: (5.0, 6.1), 0.01: (4.0, 6.0), 0.1: (4.5, 6.05)}.items():
            for variant, loss in (("rmsnorm", base + 0.01 * seed), ("dyt", flat)):
                run = _write_run(root, variant, lr, loss, seed=seed)
                config = yaml.safe_load((run / "config.yaml").read_text())
                config["runtime"]["unigram_val_loss"] = 6.1
                (run / "config.yaml").write_text(yaml.safe_dump(config))
                with (run / "metrics.jsonl").open("a") as metrics:
                    grads = {f"grad/layers.{i}": 0.0 if variant == "dyt" else 0.1 for i in range(3)}
                    metrics.write(json.dumps({"step": 30, **grads, "heldout/loss": loss + 0.02}) + "\n")
    study = Study(load_results([str(root)], "val/loss")[0], "rmsnorm")
    assert study.untrained == {"dyt"}  # 6.0 is not 0.3 below 6.1; rmsnorm's 4.0 is
    results = study_report.study_json(study, "val/loss", [])
    rms = results["variants"]["rmsnorm"]
    assert rms["best_loss"]["measured_on"] == "heldout/loss" and rms["best_loss"]["seeds"] == 3
    assert rms["best_loss"]["mean"] == pytest.approx(4.03)  # chosen on val/loss at lr 0.01, reported held out
    low, high = rms["best_loss"]["ci95"]
    assert 4.02 <= low <= 4.03 <= high <= 4.04
    low, high = rms["lr_sensitivity"]["ci95"]
    assert low <= rms["lr_sensitivity"]["value"] <= high
    why = results["variants"]["dyt"]["explanation"]
    assert "not 0.3 nats below the unigram loss 6.100" in why and "gradient norm by layer 0, 0, 0" in why


def test_a_blown_up_run_does_not_set_the_loss_axis(tmp_path):
    run = _write_run(tmp_path / "b", "rmsnorm", 0.1, 4.0)
    with (run / "metrics.jsonl").open("a") as metrics:
        metrics.write(json.dumps({"step": 30, "train/loss": 1e30}) + "\n")
    runs = find_runs([str(tmp_path / "b")])
    assert loss_ceiling(runs) == pytest.approx(1.25 * math.log(VOCAB))
    assert compare_runs.main([str(tmp_path / "b"), "--out", str(tmp_path / "c")]) == 0


def test_the_size_report_compares_lr_sensitivity_across_models(tmp_path):
    """Two widths, each a study of its own: by_size holds each model's sensitivity with its seeds' interval."""
    root = tmp_path / "size"
    # At d = 64 QK-norm is flat over the rates; at d = 32 both variants lose 1 nat at the edges.
    losses = {
        32: {"rmsnorm": (5.0, 4.0, 5.0), "rmsnorm-qk": (5.0, 4.0, 5.0)},
        64: {"rmsnorm": (5.0, 4.0, 6.0), "rmsnorm-qk": (4.0, 4.0, 4.0)},
    }
    for d, by_variant in losses.items():
        for variant, values in by_variant.items():
            for seed in (0, 1):
                for lr, loss in zip((0.001, 0.01, 0.1), values):
                    run = _write_run(root / f"d{d}", variant, lr, loss + 0.01 * seed, seed=seed)
                    config = yaml.safe_load((run / "config.yaml").read_text())
                    config["model"] = {"name": f"study_d{d}", "d_model": d, "tie_embeddings": True}
                    config["runtime"]["params"] = 1000 * d + VOCAB * d
                    (run / "config.yaml").write_text(yaml.safe_dump(config))
    results, _ = load_results([str(root)], "val/loss")
    rows = by_size(results, "rmsnorm", [str(root)])
    assert [r["model"] for r in rows] == ["study_d32", "study_d64"]
    assert [r["non_embedding_params"] for r in rows] == [32_000, 64_000]
    assert rows[1]["variants"]["rmsnorm"]["lr_sensitivity"]["value"] == pytest.approx((1.0 + 0 + 2.0) / 3)
    assert rows[1]["variants"]["rmsnorm-qk"]["lr_sensitivity"]["value"] == pytest.approx(0.0)
    assert rows[0]["variants"]["rmsnorm"]["lr_sensitivity"]["ci95"] is not None  # two seeds: an interval
    write_size_report([str(root)], tmp_path / "out", "val/loss", "rmsnorm")
    data = json.loads((tmp_path / "out" / "study.json").read_text())
    assert [r["model"] for r in data["by_size"]] == ["study_d32", "study_d64"]
    assert (tmp_path / "out" / "lr_sensitivity_vs_size.png").stat().st_size > 5_000
    with pytest.raises(RunsError, match="one model"):
        write_size_report([str(root / "d32")], tmp_path / "one", "val/loss", "rmsnorm")
