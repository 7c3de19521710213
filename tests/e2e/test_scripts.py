"""The scripts (compare_runs.py, norm_properties.py, bench_norms.py, bench_train.py) and the analysis library behind them."""

import json
import subprocess
import sys

from tiny_runs import ROOT

from analysis import compare_runs
from norms import NORM_NAMES

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
