"""lab/across_models.py on synthetic studies of several models: two depths (per-depth best rates, layer
importance, claims) and two widths (LR sensitivity against size), each model a study of its own."""

import json

import pytest
import yaml
from synthetic_studies import PRE, VOCAB, write_run, write_study

from lab.__main__ import main as lab
from lab.across_models import by_model_along, write_report
from lab.results import PLAN_FILE, load_results
from lab.runs import RunsError

PERI = {**PRE, "norm.placement": "peri"}
CLAIMS = [
    {"claim": "deeper half turns less", "source": "t", "statistic": "deep_half_angular_distance", "arm": PRE,
     "against": None, "expect": "lower", "regime": {"model.n_layers": {"min": 8}}},
    {"claim": "deeper half costs less", "source": "t", "statistic": "deep_half_skip_delta", "arm": PRE,
     "against": None, "expect": "lower"},
    {"claim": "peri-norm loses less", "source": "t", "statistic": "best_loss", "arm": PERI, "against": PRE,
     "expect": "lower"},
]  # fmt: skip


def _blocks(n_layers: int, seed: int, arm: str) -> tuple[list[float], list[float]]:
    """Pre-norm's blocks matter less with depth (angle 0.4 down to 0.1, skip delta 1.0 down to 0.1); peri-norm's
    stay level. Seed s adds 0.01 * s to the last block."""
    if "peri" in arm:
        return [0.3] * n_layers, [0.5] * n_layers
    step = lambda top, bottom: [top - (top - bottom) * i / (n_layers - 1) for i in range(n_layers)]  # noqa: E731
    angles, deltas = step(0.4, 0.1), step(1.0, 0.1)
    angles[-1] += 0.01 * seed
    return angles, deltas


def _depth_study(root):
    grid = {"rmsnorm": {0.001: 5.0, 0.01: 4.0, 0.1: 4.6}, "rmsnorm-peri": {0.001: 4.9, 0.01: 3.8, 0.1: 4.5}}
    for model, n_layers in (("d8", 8), ("d4", 4)):
        write_study(root, grid, report=(3, 4, 5), model=model, n_layers=n_layers)
    for run in root.iterdir():
        if not (run / "config.yaml").exists():
            continue
        config = yaml.safe_load((run / "config.yaml").read_text())
        angles, deltas = _blocks(config["model"]["n_layers"], config["seed"], config["variant"])
        row = {"step": 20, **{f"act/layers.{i}/angular_distance": a for i, a in enumerate(angles)}}
        (run / "metrics.jsonl").write_text((run / "metrics.jsonl").read_text() + json.dumps(row) + "\n")
        entry = {"step": 20, "layer_importance": {"skip_delta": deltas, "angular_distance": angles}}
        (run / "eval.json").write_text(json.dumps({str(run / "checkpoints"): entry}))
    plan = json.loads((root / PLAN_FILE).read_text())
    (root / PLAN_FILE).write_text(json.dumps({**plan, "claims": CLAIMS, "plan": {"axis": "n_layers"}}))


def _by_depth(root):
    return by_model_along(load_results([str(root)], "val/loss")[0], "rmsnorm", [str(root)], "n_layers")


def test_each_depth_is_a_study_of_its_own_with_the_report_seeds_layer_importance(tmp_path):
    _depth_study(tmp_path)
    rows, _ = _by_depth(tmp_path)
    assert [row["n_layers"] for row in rows] == [4, 8]  # shallowest first, whatever order the runs came in
    pre = rows[0]["variants"]["rmsnorm"]
    assert (pre["best_lr"], pre["best_lr_inside"], pre["report_seeds"]) == (0.01, True, [3, 4, 5])
    # report seeds 3, 4, 5 at the best rate: 4.0 + 0.1 * (seed - 3) -> mean 4.1, sd 0.1, t(2) = 4.303
    assert pre["best_loss"]["mean"] == pytest.approx(4.1) and pre["best_loss"]["seeds"] == 3
    assert pre["best_loss"]["ci95"] == pytest.approx(
        (4.1 - 4.3027 * 0.1 / 3**0.5, 4.1 + 4.3027 * 0.1 / 3**0.5), abs=1e-3
    )
    importance = rows[1]["variants"]["rmsnorm"]["layer_importance"]
    assert importance["skip_delta"] == pytest.approx([1.0 - 0.9 * i / 7 for i in range(8)])
    assert importance["angular_distance"][-1] == pytest.approx(0.1 + 0.04)  # seeds 3-5 add 0.03-0.05
    assert len(rows[0]["variants"]["rmsnorm-peri"]["layer_importance"]["angular_distance"]) == 4
    # the stream's RMS after each block, as synthetic_studies.write_run logs it: 2, 4, 6 pre-norm, 1.1 peri-norm
    assert pre["stream_rms"] == pytest.approx([2.0, 4.0, 6.0])
    assert rows[0]["variants"]["rmsnorm-peri"]["stream_rms"] == pytest.approx([1.1] * 3)


def test_the_claims_are_evaluated_at_every_depth_by_the_one_rule(tmp_path):
    _depth_study(tmp_path)
    _, claims = _by_depth(tmp_path)
    shallow, deep = ({c["claim"]: c for c in claims if c["model"] == model} for model in ("d4", "d8"))
    assert shallow["deeper half turns less"]["verdict"] == "not tested"  # 4 layers, the paper's from 8
    assert "model.n_layers = 4" in shallow["deeper half turns less"]["reason"]
    turns = deep["deeper half turns less"]  # the last 4 of 8 blocks minus the first 4
    by_hand = sum(0.4 - 0.3 * i / 7 for i in range(4, 8)) / 4 - sum(0.4 - 0.3 * i / 7 for i in range(4)) / 4 + 0.04 / 4
    assert turns["value_arm"] == pytest.approx(by_hand) and turns["verdict"] == "agrees" and turns["against"] is None
    assert deep["deeper half costs less"]["verdict"] == "agrees"  # a constant difference: the point interval
    assert (
        deep["peri-norm loses less"]["difference"] == pytest.approx(-0.2)
        and deep["peri-norm loses less"]["n_layers"] == 8
    )


def test_the_report_writes_its_figures_table_and_json_along_the_plans_axis(tmp_path):
    _depth_study(tmp_path / "runs")
    assert lab(["across-models", str(tmp_path / "runs"), "--out", str(tmp_path / "out")]) == 0  # axis: the plan's
    report = (tmp_path / "out" / "report.md").read_text()
    assert "| rmsnorm | 0.01, 4.100" in report and "not tested: outside the paper's regime" in report
    assert "d4 (4 layers)" in report
    data = json.loads((tmp_path / "out" / "study.json").read_text())
    assert data["axis"] == "n_layers" and [d["n_layers"] for d in data["by_model"]] == [4, 8]
    assert len(data["claims"]) == 6 and [c["n_layers"] for c in data["claims"]] == [4] * 3 + [8] * 3
    assert set(data["by_model"][0]["variants"]["rmsnorm"]) >= {
        "rates",
        "best_lr",
        "best_lr_inside",
        "trained",
        "best_loss",
        "layer_importance",
    }
    for name in ("against_n_layers.png", "layer_importance.png"):
        assert (tmp_path / "out" / name).stat().st_size > 10_000


def test_a_report_before_the_report_seeds_ran_leaves_the_loss_blank(tmp_path):
    """A study stopped after its grid: no variant has report seeds yet, so no held-out loss to plot or print."""
    grid = {"rmsnorm": {0.001: 5.0, 0.01: 4.0, 0.1: 4.6}}
    for model, n_layers in (("d8", 8), ("d4", 4)):
        write_study(tmp_path / "runs", grid, report=(), model=model, n_layers=n_layers)
    report = write_report([str(tmp_path / "runs")], tmp_path / "out", "val/loss", "rmsnorm", "n_layers").read_text()
    assert "| rmsnorm | 0.01, –, " in report  # best rate 0.01 at both depths, no loss yet
    data = json.loads((tmp_path / "out" / "study.json").read_text())
    best_loss = data["by_model"][0]["variants"]["rmsnorm"]["best_loss"]
    assert best_loss == {"mean": None, "ci95": None, "seeds": 0, "measured_on": "no report seeds yet"}


def test_the_claims_regrade_from_the_reports_json_as_they_were_judged(tmp_path):
    """A study across models' study.json holds what `python -m lab regrade` reads: each claim at its model."""
    _depth_study(tmp_path / "runs")
    write_report([str(tmp_path / "runs")], tmp_path / "out", "val/loss", "rmsnorm", "n_layers")
    before = json.loads((tmp_path / "out" / "study.json").read_text())["claims"]
    assert lab(["regrade", str(tmp_path / "out" / "study.json")]) == 0
    after = json.loads((tmp_path / "out" / "study.json").read_text())["claims"]
    assert [(c["model"], c["verdict"], c.get("p_holm")) for c in after] == [
        (c["model"], c["verdict"], c.get("p_holm")) for c in before
    ]
    assert "| deeper half costs less | 8 layers |" in (tmp_path / "out" / "report.md").read_text()


def test_the_size_study_reads_lr_sensitivity_against_non_embedding_parameters(tmp_path):
    """Two widths, each a study of its own: each model's sensitivity with its seeds' interval."""
    root = tmp_path / "size"
    # At d = 64 QK-norm is flat over the rates; at d = 32 both arms lose 1 nat at the edges.
    losses = {
        32: {"rmsnorm": (5.0, 4.0, 5.0), "rmsnorm-qk": (5.0, 4.0, 5.0)},
        64: {"rmsnorm": (5.0, 4.0, 6.0), "rmsnorm-qk": (4.0, 4.0, 4.0)},
    }
    for d, by_arm in losses.items():
        for arm, values in by_arm.items():
            for seed in (0, 1, 2):  # seed 2 reports at the best rate, 0.01 for every model and arm
                for lr, loss in zip((0.001, 0.01, 0.1), values):
                    if seed == 2 and lr != 0.01:
                        continue
                    run = write_run(root / f"d{d}", arm, lr, loss + 0.01 * seed, seed=seed)
                    config = yaml.safe_load((run / "config.yaml").read_text())
                    config["model"] = {"name": f"study_d{d}", "n_layers": 4, "d_model": d, "tie_embeddings": True}
                    config["runtime"]["params"] = 1000 * d + VOCAB * d
                    (run / "config.yaml").write_text(yaml.safe_dump(config))
    results, _ = load_results([str(root)], "val/loss")
    rows, _ = by_model_along(results, "rmsnorm", [str(root)], "non_embedding_params")
    assert [r["model"] for r in rows] == ["study_d32", "study_d64"]
    assert [r["non_embedding_params"] for r in rows] == [32_000, 64_000]
    assert rows[1]["variants"]["rmsnorm"]["lr_sensitivity"]["value"] == pytest.approx((1.0 + 0 + 2.0) / 3)
    assert rows[1]["variants"]["rmsnorm-qk"]["lr_sensitivity"]["value"] == pytest.approx(0.0)
    assert rows[0]["variants"]["rmsnorm"]["lr_sensitivity"]["ci95"] is not None  # two seeds: an interval
    best = rows[0]["variants"]["rmsnorm"]
    assert best["report_seeds"] == [2] and best["best_loss"]["mean"] == pytest.approx(4.02)
    write_report([str(root)], tmp_path / "out", "val/loss", "rmsnorm", "non_embedding_params")
    data = json.loads((tmp_path / "out" / "study.json").read_text())
    assert [r["model"] for r in data["by_model"]] == ["study_d32", "study_d64"]
    assert (tmp_path / "out" / "against_non_embedding_params.png").stat().st_size > 5_000
    with pytest.raises(RunsError, match="one model"):
        write_report([str(root / "d32")], tmp_path / "one", "val/loss", "rmsnorm", "non_embedding_params")
    # without a plan that names it, the axis is asked for by name
    assert lab(["across-models", str(root), "--out", str(tmp_path / "asked")]) == 1
