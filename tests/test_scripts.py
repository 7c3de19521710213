"""The scripts (compare_runs.py, norm_properties.py, bench_norms.py, bench_train.py) and the analysis library behind them."""

import json
import math
import subprocess
import sys

import pytest
import torch
from tiny_runs import ROOT

from analysis import compare_runs, norm_properties
from analysis.bench_norms import bytes_moved
from analysis.stats import welch_p_value
from norms import NORM_NAMES
from training.metrics_file import Metrics, MetricsFileError, read_metrics

PLOTS = ("loss.png", "throughput.png", "activations.png", "gains.png")


def test_compare_runs_writes_every_plot_and_the_table(sweep, tmp_path):
    assert compare_runs.main([str(sweep), "--out", str(tmp_path)]) == 0
    for name in PLOTS:
        assert (tmp_path / name).stat().st_size > 10_000, name
    summary = (tmp_path / "summary.md").read_text()
    rows = {line.split("|")[1].strip(): line for line in summary.splitlines() if line.startswith("| ")}
    assert set(rows) == {"group", "layernorm", "rmsnorm"}
    assert "| 2 |" in rows["layernorm"] and "| 2 |" in rows["rmsnorm"]
    final = [
        json.loads(x)["val/loss"]
        for s in (0, 1)
        for x in (sweep / f"layernorm-s{s}" / "metrics.jsonl").read_text().splitlines()
        if "val/loss" in json.loads(x) and json.loads(x)["step"] == 4
    ]
    assert f"{sum(final) / 2:.4f}" in rows["layernorm"]  # the mean over seeds of the final val loss
    assert rows["layernorm"].split("|")[5].strip() not in ("", "–")  # a Welch p-value against rmsnorm


def test_compare_runs_groups_by_any_config_key_and_takes_globs(sweep, tmp_path):
    assert compare_runs.main([str(sweep / "*-s0"), "--group-by", "seed", "--out", str(tmp_path)]) == 0
    summary = (tmp_path / "summary.md").read_text()
    assert "| 0 | 2 |" in summary


def test_welch_p_value_by_hand():
    # a = [1, 3], b = [4, 6]: t = -3 / sqrt(2), df = 2; for df = 2, P(|T| > t) = 1 - t / sqrt(t^2 + 2).
    t = 3 / math.sqrt(2)
    assert welch_p_value([1, 3], [4, 6]) == pytest.approx(1 - t / math.sqrt(t * t + 2), rel=1e-9)
    assert welch_p_value([1.0], [2.0, 3.0]) is None


def test_compare_runs_errors(sweep, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert compare_runs.main([str(empty)]) == 1
    assert "no runs found" in capsys.readouterr().err

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.yaml").write_text((sweep / "rmsnorm-s0" / "config.yaml").read_text())
    assert compare_runs.main([str(broken)]) == 1
    assert "has no metrics" in capsys.readouterr().err

    other_tokenizer = tmp_path / "other"
    subprocess.run(["cp", "-r", str(sweep / "rmsnorm-s1"), str(other_tokenizer)], check=True)
    (other_tokenizer / "tokenizer.json").write_text("{}")
    runs = [str(sweep / "layernorm-s0"), str(other_tokenizer)]
    assert compare_runs.main([*runs, "--out", str(tmp_path / "c")]) == 1
    assert "--metric val/bpb" in capsys.readouterr().err
    assert compare_runs.main([*runs, "--metric", "val/bpb", "--out", str(tmp_path / "c")]) == 0


def test_norm_properties_values():
    inv = norm_properties.invariances()
    assert inv["rmsnorm"]["scale x10, eps x100"] < 1e-12  # exact with eps scaled by a^2
    assert 1e-12 < inv["rmsnorm"]["scale x10, fixed eps"] < 1e-4  # approximate otherwise
    assert inv["layernorm"]["shift +3"] < 1e-12 and inv["rmsnorm"]["shift +3"] > 0.1
    assert inv["layernorm"]["max abs row mean of output"] < 1e-12
    prefix = norm_properties.prefix_experiment()
    assert prefix["balanced prefix"][-1] == 0 and prefix["low-energy prefix"][-1] == 0  # k = D is RMSNorm
    assert prefix["low-energy prefix"][3] > 10 * prefix["balanced prefix"][3]


def test_prefix_rms_error_by_hand():
    # x = (3, 4, 0, 0): RMS 2.5; the first k features have RMS 3, sqrt(12.5), sqrt(25/3), 2.5.
    errors = norm_properties.prefix_rms_error(torch.tensor([[3.0, 4.0, 0.0, 0.0]]))
    expected = [3 / 2.5 - 1, math.sqrt(12.5) / 2.5 - 1, math.sqrt(25 / 3) / 2.5 - 1, 0.0]
    assert errors == pytest.approx(expected, abs=1e-12)
    rows = torch.tensor([[3.0, 4.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])  # the second row's prefix is exact
    assert norm_properties.prefix_rms_error(rows) == pytest.approx([e / 2 for e in expected], abs=1e-12)


def test_invariance_table_with_options():
    x = torch.randn(4, 16, dtype=torch.float64)
    ops = norm_properties.registered_norms(16, {"prmsnorm": {"k": 4}, "dyt": {"alpha_init": 2.0}})
    assert torch.allclose(ops["prmsnorm"](x), x / x[:, :4].pow(2).mean(-1, keepdim=True).add(1e-6).sqrt())
    assert torch.allclose(ops["dyt"](x), torch.tanh(2.0 * x))
    table = norm_properties.invariance_table(x, ops, scale=10.0, shift=3.0)
    assert table["layernorm"]["shift +3"] < 1e-12 and table["rmsnorm"]["shift +3"] > 0.1
    assert table["prmsnorm"]["scale x10, eps x100"] < 1e-12


def test_a_torn_last_metrics_line_is_left_out_and_a_torn_middle_line_refused(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 1}\n{"step": 2}\n{"step": 3, "train/lo')
    assert read_metrics(metrics) == Metrics([{"step": 1}, {"step": 2}], True)
    metrics.write_text('{"step": 1}\n{"step": 2\n{"step": 3}\n')
    with pytest.raises(MetricsFileError, match="line 2 is not JSON"):
        read_metrics(metrics)
    # Training's own checks read what a killed run left: every unreadable line, and rows without a step, skipped.
    metrics.write_text('{"step": 1}\n{"step": 2\n{"note": 1}\n{"step": 3}\n{"step": 4, "tr')
    assert read_metrics(metrics, damaged="skip") == Metrics([{"step": 1}, {"step": 3}], True)
    assert read_metrics(tmp_path / "absent.jsonl") == Metrics([], False)


def test_norm_properties_writes_its_report(tmp_path):
    result = subprocess.run(
        [sys.executable, "scripts/norm_properties.py", "--out", str(tmp_path), "--rows", "64"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    for name in ("invariances.png", "prefix.png", "offset.png"):
        assert (tmp_path / name).stat().st_size > 10_000
    report = (tmp_path / "properties.md").read_text()
    assert "## Invariances" in report and "| prmsnorm | 192 | 1728 |" in report  # 9 norms in model=small


def test_bench_norms_on_cpu_reports_rows_and_skips(tmp_path):
    compiled = [f"compiled_{name}" for name in NORM_NAMES]  # 30 s cold compiles each
    result = subprocess.run(
        [
            sys.executable,
            "scripts/bench_norms.py",
            "--dims",
            "64",
            "256",
            "--tensor-mb",
            "1",
            "--reps",
            "2",
            "--rounds",
            "2",
            "--out",
            str(tmp_path),
            "--skip",
            *compiled,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "skipped fused_rmsnorm: its backend here is triton-interpreter" in result.stdout
    data = json.loads((tmp_path / "results.json").read_text())
    impls = {r["impl"] for r in data["results"]}
    # Every registered norm is timed (the fused one needs CUDA), with torch's own norms beside them.
    assert {"copy", "torch_rmsnorm", "torch_layernorm", *NORM_NAMES} - {"fused_rmsnorm"} <= impls
    assert all(r["gbps"] > 0 and r["frac_of_copy"] > 0 for r in data["results"])
    assert (tmp_path / "bandwidth.png").stat().st_size > 10_000


def test_bytes_moved_counts_each_tensor_once():
    # 10 rows of 4 float32 features: a tensor is 160 bytes, the weight 16.
    assert bytes_moved(10, 4, 4) == {"fwd": 2 * 160 + 16, "bwd": 3 * 160 + 32, "fwd+bwd": 5 * 160 + 48}


def test_bench_train_prints_both_frameworks_and_the_ratio():
    result = subprocess.run(
        [
            sys.executable,
            "scripts/bench_train.py",
            "--model",
            "tiny",
            "--batch-size",
            "2",
            "--steps",
            "1",
            "--rounds",
            "1",
            "--warmup",
            "1",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "normlab:" in result.stdout and "hf_llama:" in result.stdout
    assert "ratio normlab / hf_llama:" in result.stdout
