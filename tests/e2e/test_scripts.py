"""The lab's commands (compare, norm-properties, bench-norms), scripts/bench_train.py, and the library behind them."""

import json
import math
import statistics
import subprocess
import sys

import pytest
from scipy import stats
from tiny_runs import ROOT

from lab.__main__ import main as lab
from norms import NORM_NAMES

PLOTS = ("loss.png", "throughput.png", "activations.png", "gains.png")


def final_val_loss(run_dir) -> float:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["val/loss"] for r in rows if "val/loss" in r][-1]


def summary_rows(out) -> dict[str, list[str]]:
    """summary.md's table: the cells of each row, by group."""
    lines = [line for line in (out / "summary.md").read_text().splitlines() if line.startswith("| ")]
    return {cells[0]: cells for cells in ([c.strip() for c in line.strip("|").split("|")] for line in lines)}


def test_compare_runs_writes_every_plot_and_the_table(sweep, tmp_path):
    assert lab(["compare", str(sweep), "--out", str(tmp_path)]) == 0
    for name in PLOTS:
        assert (tmp_path / name).stat().st_size > 10_000, name
    rows = summary_rows(tmp_path)
    assert set(rows) == {"group", "layernorm", "rmsnorm"}
    assert rows["layernorm"][1:3] == ["2", "0, 1"] and rows["rmsnorm"][1:3] == ["2", "0, 1"]
    final = [final_val_loss(sweep / f"layernorm-s{s}") for s in (0, 1)]
    assert rows["layernorm"][3].startswith(f"{sum(final) / 2:.4f}")  # the mean over seeds of the final val loss
    assert rows["rmsnorm"][4:8] == ["–"] * 4  # the baseline is not compared with itself


def test_compare_runs_pairs_by_seed_as_a_hand_computation_does(sweep, tmp_path):
    """Two seeds a side: the per-seed differences d0, d1; mean, sd |d0 - d1| / sqrt 2, and with 1 degree of
    freedom the 95% t quantile 12.706 and p = 1 - (2/pi) atan|t|."""
    assert lab(["compare", str(sweep), "--out", str(tmp_path)]) == 0
    d = [final_val_loss(sweep / f"layernorm-s{s}") - final_val_loss(sweep / f"rmsnorm-s{s}") for s in (0, 1)]
    mean, se = (d[0] + d[1]) / 2, abs(d[0] - d[1]) / 2  # sd / sqrt(2) = |d0 - d1| / sqrt(2) / sqrt(2)
    t = mean / se
    p = 1 - 2 / math.pi * math.atan(abs(t))
    row = summary_rows(tmp_path)["layernorm"]
    assert row[4] == f"{mean:+.4f} [{mean - 12.7062 * se:+.4f}, {mean + 12.7062 * se:+.4f}]"
    assert float(row[5]) == pytest.approx(p, rel=1e-2)
    assert row[6] == "not read: 2 seeds"  # an interval and p, but no reading below the studies' three seeds
    assert row[7] == "paired t, seeds 0, 1"
    # summary.json holds the same comparison, unrounded
    data = json.loads((tmp_path / "summary.json").read_text())
    versus = {g["group"]: g for g in data["groups"]}["layernorm"]["vs_baseline"]
    assert versus["difference"] == pytest.approx(mean) and versus["p"] == pytest.approx(p, rel=1e-2)
    assert versus["ci95"] == pytest.approx([mean - 12.7062 * se, mean + 12.7062 * se], rel=1e-4)
    assert (versus["seeds"], versus["reading"], data["baseline"]) == (2, "not read: 2 seeds", "rmsnorm")


def test_compare_runs_names_the_fallback_where_seeds_do_not_pair(sweep, tmp_path):
    one_a_side = tmp_path / "one"
    # seed 1 of layernorm against seed 0 of rmsnorm, one run a side: no test, nothing called lower or higher
    assert lab(["compare", str(sweep / "rmsnorm-s0"), str(sweep / "layernorm-s1"), "--out", str(one_a_side)]) == 0
    row = summary_rows(one_a_side)["layernorm"]
    assert row[4:8] == ["–", "–", "–", "no test: one run on a side"]
    # Grouped by the seed, each group holds both norms at one seed: no seed pairs across groups.
    by_seed = tmp_path / "by_seed"
    assert lab(["compare", str(sweep), "--group-by", "seed", "--baseline", "0", "--out", str(by_seed)]) == 0
    row = summary_rows(by_seed)["1"]
    assert row[7] == "Welch's t, unpaired: fewer than two seeds pair"
    a = [final_val_loss(sweep / f"{n}-s1") for n in ("rmsnorm", "layernorm")]
    b = [final_val_loss(sweep / f"{n}-s0") for n in ("rmsnorm", "layernorm")]
    assert row[4].startswith(f"{statistics.fmean(a) - statistics.fmean(b):+.4f} [")
    assert float(row[5]) == pytest.approx(stats.ttest_ind(a, b, equal_var=False).pvalue, rel=1e-2)


def test_compare_runs_groups_by_any_config_key_and_takes_globs(sweep, tmp_path):
    assert lab(["compare", str(sweep / "*-s0"), "--group-by", "seed", "--out", str(tmp_path)]) == 0
    assert summary_rows(tmp_path)["0"][1] == "2"


def test_compare_runs_errors(sweep, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert lab(["compare", str(empty)]) == 1
    assert "no runs found" in capsys.readouterr().err

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.yaml").write_text((sweep / "rmsnorm-s0" / "config.yaml").read_text())
    assert lab(["compare", str(broken)]) == 1
    assert "has no metrics" in capsys.readouterr().err

    other_tokenizer = tmp_path / "other"
    subprocess.run(["cp", "-r", str(sweep / "rmsnorm-s1"), str(other_tokenizer)], check=True)
    (other_tokenizer / "tokenizer.json").write_text("{}")
    runs = [str(sweep / "layernorm-s0"), str(other_tokenizer)]
    assert lab(["compare", *runs, "--out", str(tmp_path / "c")]) == 1
    assert "--metric val/bpb" in capsys.readouterr().err
    assert lab(["compare", *runs, "--metric", "val/bpb", "--out", str(tmp_path / "c")]) == 0


def test_norm_properties_writes_its_report(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "lab", "norm-properties", "--out", str(tmp_path), "--rows", "64"],
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
            "-m",
            "lab",
            "bench-norms",
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


def test_bench_loss_memory_shows_the_chunked_losses_agree_and_hold_less():
    """Each chunked loss equals the plain one to float32 rounding and adds less peak memory than the plain loss's
    whole-batch logits (256 MiB of them here; validation's chunks are 64 MiB, training's 512 rows)."""
    command = [sys.executable, "scripts/bench_loss_memory.py", "--rows", "16384", "--vocab", "4096", "--dim", "64"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = {line[:22].strip(): line[22:].split() for line in result.stdout.splitlines()[2:6]}
    losses = {way: float(values[-1]) for way, values in rows.items()}
    assert set(losses) == {"train, plain", "train, fused", "validation, plain", "validation, summed"}
    assert max(losses.values()) - min(losses.values()) < 1e-5 * max(losses.values())
    ratios = [float(line.split(": ")[1].split("x")[0]) for line in result.stdout.splitlines()[6:8]]
    assert len(ratios) == 2 and all(0 < ratio < 0.6 for ratio in ratios), result.stdout
