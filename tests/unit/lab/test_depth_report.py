"""lab/depth_report.py on a synthetic depth study: two depths, per-depth best rates, layer importance, claims."""

import json

import pytest
import yaml
from synthetic_studies import PRE, write_study

from lab.depth_report import by_depth, write_depth_report
from lab.results import PLAN_FILE, load_results

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
    (root / PLAN_FILE).write_text(json.dumps({**plan, "claims": CLAIMS}))


def test_each_depth_is_a_study_of_its_own_with_the_report_seeds_layer_importance(tmp_path):
    _depth_study(tmp_path)
    rows = by_depth(load_results([str(tmp_path)], "val/loss")[0], "rmsnorm", [str(tmp_path)])
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
    rows = by_depth(load_results([str(tmp_path)], "val/loss")[0], "rmsnorm", [str(tmp_path)])
    shallow, deep = ({c["claim"]: c for c in row["claims"]} for row in rows)
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


def test_the_report_writes_its_figures_table_and_json(tmp_path):
    _depth_study(tmp_path / "runs")
    report = write_depth_report([str(tmp_path / "runs")], tmp_path / "out", "val/loss", "rmsnorm").read_text()
    assert "| rmsnorm | 0.01, 4.100" in report and "not tested: outside the paper's regime" in report
    data = json.loads((tmp_path / "out" / "study.json").read_text())
    assert [d["n_layers"] for d in data["by_depth"]] == [4, 8] and len(data["claims"]) == 6
    assert set(data["by_depth"][0]["variants"]["rmsnorm"]) >= {
        "rates",
        "best_lr",
        "best_lr_inside",
        "trained",
        "best_loss",
        "layer_importance",
    }
    for name in ("loss_vs_depth.png", "layer_importance.png"):
        assert (tmp_path / "out" / name).stat().st_size > 10_000


def test_a_report_before_the_report_seeds_ran_leaves_the_loss_blank(tmp_path):
    """A study stopped after its grid: no variant has report seeds yet, so no held-out loss to plot or print."""
    grid = {"rmsnorm": {0.001: 5.0, 0.01: 4.0, 0.1: 4.6}}
    for model, n_layers in (("d8", 8), ("d4", 4)):
        write_study(tmp_path / "runs", grid, report=(), model=model, n_layers=n_layers)
    report = write_depth_report([str(tmp_path / "runs")], tmp_path / "out", "val/loss", "rmsnorm").read_text()
    assert "| rmsnorm | 0.01, – | 0.01, – |" in report  # best rate 0.01 at both depths, no loss yet
    data = json.loads((tmp_path / "out" / "study.json").read_text())
    assert data["by_depth"][0]["variants"]["rmsnorm"]["best_loss"] == {"mean": None, "ci95": None, "seeds": 0}
