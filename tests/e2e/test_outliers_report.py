"""The outliers report on tiny runs evaluated under every scheme, and its statistics by hand."""

import json

import pytest
import yaml
from hydra import compose, initialize_config_dir
from tiny_runs import CONFIG_DIR, run_tiny

import eval as eval_script
from lab import outliers_report as outliers
from lab.runs import RunsError


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    cache = str(tmp_path_factory.mktemp("cache"))
    runs = tmp_path_factory.mktemp("outliers")
    for norm in ("rmsnorm", "prmsnorm"):
        for seed in (0, 1):
            run_tiny(runs / f"{norm}-s{seed}", cache, 4, f"norm={norm}", f"seed={seed}")
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = eval_script.typed_eval_config(
            compose("eval", overrides=[f"checkpoint={runs}/*", "quant=[w8a8,w8a8_tensor,w4a16,fp8]", "num_samples=1"])
        )
    eval_script.run_eval(cfg, tmp_path_factory.mktemp("eval"))
    return runs


def _trained_line(runs, unigram: float) -> None:
    """Move the 'trained' line (unigram loss - 0.3) of every run: 4 steps cannot reach the real one."""
    for config_path in runs.glob("*/config.yaml"):
        config = yaml.safe_load(config_path.read_text())
        config["runtime"]["unigram_val_loss"] = unigram
        config_path.write_text(yaml.safe_dump(config))


def test_runs_that_did_not_train_are_left_out_of_the_statements(evaluated, tmp_path):
    _trained_line(evaluated, 6.0)  # 4 steps of a tiny model are far above 5.7
    report = outliers.write_report([str(evaluated)], tmp_path).read_text()
    assert "prmsnorm, rmsnorm did not train" in report and "meant as the positive control" not in report
    assert "Too few variants that trained (0)" in report


def test_the_report_pairs_each_arms_cost_with_the_baselines_and_plots_it(evaluated, tmp_path):
    _trained_line(evaluated, 99.0)
    path = outliers.write_report([str(evaluated)], tmp_path)
    data = json.loads((tmp_path / "outliers.json").read_text())
    assert set(data["variants"]) == {"rmsnorm", "prmsnorm"} and len(data["runs"]) == 4
    runs = {(r["variant"], r["seed"]): r for r in data["runs"]}
    paired = data["variants"]["prmsnorm"]["vs_baseline"]
    by_hand = [
        runs[("prmsnorm", s)]["delta"]["w8a8_tensor"] - runs[("rmsnorm", s)]["delta"]["w8a8_tensor"] for s in (0, 1)
    ]
    assert paired["difference"] == pytest.approx(sum(by_hand) / 2) and paired["seeds"] == 2
    assert data["variants"]["rmsnorm"]["vs_baseline"] is None
    for run in data["runs"]:
        assert run["kurtosis"] > 0 and run["massive_ratio"] >= 1 and 0 <= run["sink_mass"] <= 1
    premise = data["control_kurtosis"]  # the positive control's premise, paired by seed like its cost
    kurtosis = {(r["variant"], r["seed"]): r["kurtosis"] for r in data["runs"]}
    assert premise["difference"] == pytest.approx(
        sum(kurtosis[("prmsnorm", s)] - kurtosis[("rmsnorm", s)] for s in (0, 1)) / 2
    )
    assert data["learning_rates"] == [0.003] and data["rank_correlation"]["variants"] == 2
    report = path.read_text()
    assert "prmsnorm, meant as the positive control" in report and "untuned" in report
    assert "Too few variants that trained (2)" in report  # two variants: no correlation at the variant level
    assert (tmp_path / "quant_vs_outliers.png").stat().st_size > 0 and (tmp_path / "depth.png").stat().st_size > 0


def test_runs_without_a_quantized_evaluation_are_named_with_the_command(evaluated, tmp_path):
    bare = tmp_path / "bare"
    (bare / "run").mkdir(parents=True)
    for name in ("config.yaml", "metrics.jsonl", "tokenizer.json"):
        (bare / "run" / name).write_bytes((evaluated / "rmsnorm-s0" / name).read_bytes())
    with pytest.raises(
        RunsError, match=r"has a quantized evaluation; run python eval.py.*quant=\[w8a8,w8a8_tensor,w4a16,fp8\]"
    ):
        outliers.write_report([str(bare)], tmp_path / "out")
