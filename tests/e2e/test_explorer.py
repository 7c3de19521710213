"""The marimo explorer (notebooks/explore.py): headless, on real tiny runs, bad inputs, and in a browser."""

import html
import importlib.util
import json
import re
import shutil
import subprocess
import sys

import pytest
import yaml
from screenshot_explorer import find_chromium, open_page, serve_explorer, wait_for_plots
from tiny_runs import ROOT, read_metrics

NOTEBOOK = ROOT / "notebooks" / "explore.py"


def run_notebook(monkeypatch, *args):
    """Every cell of the explorer, in this process, as ``python notebooks/explore.py *args`` runs them."""
    monkeypatch.setattr(sys, "argv", [str(NOTEBOOK), *map(str, args)])
    spec = importlib.util.spec_from_file_location("explore_under_test", NOTEBOOK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    outputs, defs = module.app.run()
    page = html.unescape(" ".join(getattr(o, "text", "") for o in outputs if o is not None))
    page = re.sub(r"<[^>]+>", "", page.replace("\\u003c", "<").replace("\\u003e", ">"))
    return " ".join(page.split()), defs  # the page's text, as a reader sees it


def test_the_script_runs_every_cell(sweep):
    result = subprocess.run(
        [sys.executable, str(NOTEBOOK), "--runs", str(sweep), "--bench", "--bench-mb", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]


def test_the_runs_section_shows_what_the_runs_logged(sweep, monkeypatch):
    page, defs = run_notebook(monkeypatch, "--runs", sweep)
    assert sorted(r.path.name for r in defs["runs"]) == ["layernorm-s0", "layernorm-s1", "rmsnorm-s0", "rmsnorm-s1"]
    assert list(defs["run_groups"]) == ["layernorm", "rmsnorm"]
    assert "Loaded 4 runs" in page and "still training" not in page

    curves = {t.name: t for t in defs["curves_figure"].data}
    rows = read_metrics(sweep / "rmsnorm-s0")
    assert list(curves["rmsnorm-s0"].y) == [r["train/loss"] for r in rows]

    # The step slider starts at the last statistics; each layer's point is what that step logged.
    last = [r for r in rows if "act/layers.0/stream_rms" in r][-1]
    assert defs["step_slider"].value == last["step"]
    rms_trace = next(t for t in defs["layers_figure"].data if t.name == "rmsnorm-s0")
    assert list(rms_trace.y) == [last[f"act/layers.{i}/stream_rms"] for i in range(len(rms_trace.y))]
    assert len(rms_trace.y) == 2  # the tiny model's layers

    # The summary is compare_runs' table: layernorm against rmsnorm paired over their two seeds.
    assert (
        "layernorm 2 0, 1" in page and "paired t, seeds 0, 1" in page and "Welch" not in page.split("Final metric")[0]
    )


def test_panels_the_default_probes_leave_empty_name_the_probe_that_logs_them(sweep, monkeypatch):
    page, defs = run_notebook(monkeypatch, "--runs", sweep)
    assert defs["panel_gaps"] == {
        "largest attention logit": "**largest attention logit** (`attn/layers.{i}/max_logit`): no selected run "
        "logged it; train with `attention` in `train.probes`.",
        "massive-activation ratio": "**massive-activation ratio** (`act/layers.{i}/massive_ratio`): no selected run "
        "logged it; train with `lab.study_probes.massive:MassiveActivations` in `train.probes`.",
        "attention-sink mass": "**attention-sink mass** (`attn/layers.{i}/sink_mass`): no selected run logged it; "
        "train with `lab.study_probes.attention_sinks:AttentionSinks` in `train.probes`.",
    }
    assert "no selected run logged it; train with lab.study_probes.massive:MassiveActivations in train.probes" in page
    notes = [a.text for a in defs["layers_figure"].layout.annotations if a.text == "not logged: see below"]
    assert len(notes) == 3  # in each empty panel itself


def test_a_panel_some_runs_lack_names_them_and_an_imported_model_is_sent_to_eval(sweep, monkeypatch, tmp_path):
    shutil.copytree(sweep / "rmsnorm-s0", tmp_path / "rmsnorm-s0")
    imported = shutil.copytree(sweep / "layernorm-s0", tmp_path / "imported")
    config = yaml.safe_load((imported / "config.yaml").read_text())
    config["runtime"]["imported_from"] = {"architecture": "LlamaForCausalLM"}
    (imported / "config.yaml").write_text(yaml.safe_dump(config))
    last = [r for r in read_metrics(imported) if "act/layers.0/stream_rms" in r][-1]
    (imported / "metrics.jsonl").unlink()
    evaluation = {**last, "step": 0, "data": config["data"]["name"], "attn/layers.0/max_logit": 2.0}
    (imported / "eval.json").write_text(json.dumps({"step 0": evaluation}))  # written before the study probes

    page, defs = run_notebook(monkeypatch, "--runs", tmp_path)
    gaps = defs["panel_gaps"]
    assert set(gaps) == {"largest attention logit", "massive-activation ratio", "attention-sink mass"}
    assert "not logged by `rmsnorm-s0`; train with `attention` in `train.probes`." in gaps["largest attention logit"]
    assert gaps["attention-sink mass"].endswith(
        "no selected run logged it; train with `lab.study_probes.attention_sinks:AttentionSinks` in `train.probes` "
        "or evaluate an imported model with `python eval.py checkpoint=<run>`."
    )


def test_the_norms_section_uses_the_library_and_shows_invariances(monkeypatch, tmp_path):
    page, defs = run_notebook(monkeypatch, "--runs", tmp_path)
    x, outputs = defs["activation"], defs["live_outputs"]
    assert set(outputs) >= {"layernorm", "rmsnorm", "prmsnorm", "dyt", "derf", "identity"}
    rms = x.pow(2).mean().sqrt()
    assert outputs["rmsnorm"].tolist() == pytest.approx((x / (rms**2 + 1e-6).sqrt()).tolist(), rel=1e-12)
    k = defs["k_slider"].value
    assert outputs["prmsnorm"].tolist() == pytest.approx((x / x[:k].pow(2).mean().sqrt()).tolist(), rel=1e-5)
    assert outputs["dyt"].tolist() == pytest.approx(x.mul(defs["alpha_slider"].value).tanh().tolist(), rel=1e-12)
    assert "Invariances, measured on this vector" in page
    assert len(defs["prefix_figure"].data) == 3


def test_the_benchmark_runs_on_request_only(sweep, monkeypatch):
    page, defs = run_notebook(monkeypatch, "--runs", sweep)
    assert "bench_results" not in defs and "Press run the benchmark" in page
    _, defs = run_notebook(monkeypatch, "--runs", sweep, "--bench", "--bench-mb", "1", "--bench-dim", "512")
    measured = {(r["impl"], r["pass"]) for r in defs["bench_results"]}
    assert {("rmsnorm", "fwd+bwd"), ("layernorm", "fwd"), ("copy", "copy")} <= measured
    assert all(r["dim"] == 512 for r in defs["bench_results"])
    assert not any(name.startswith("compiled_") for name, _ in measured)  # compiling is opt-in


def test_a_folder_with_no_runs_says_so(monkeypatch, tmp_path):
    page, defs = run_notebook(monkeypatch, "--runs", tmp_path)
    assert "runs" not in defs
    assert "No runs to show" in page and "no runs found under" in page


def test_torn_unfinished_and_damaged_runs_are_read_or_named(sweep, monkeypatch, tmp_path):
    for name in ("rmsnorm-s0", "rmsnorm-s1", "layernorm-s0"):
        shutil.copytree(sweep / name, tmp_path / name)
    torn = tmp_path / "rmsnorm-s0" / "metrics.jsonl"
    torn.write_text(torn.read_text() + '{"step": 5, "train/lo')  # a writer cut off mid-line
    unfinished = tmp_path / "rmsnorm-s1" / "metrics.jsonl"
    unfinished.write_text("".join(unfinished.read_text().splitlines(keepends=True)[:2]))
    damaged = tmp_path / "layernorm-s0" / "metrics.jsonl"
    lines = damaged.read_text().splitlines(keepends=True)
    damaged.write_text("".join([lines[0], "{oops\n", *lines[1:]]))

    page, defs = run_notebook(monkeypatch, "--runs", tmp_path)
    assert sorted(r.path.name for r in defs["runs"]) == ["rmsnorm-s0", "rmsnorm-s1"]
    assert "rmsnorm-s0: its last metrics line was cut off and is left out" in page
    assert "rmsnorm-s1: step 2 of 4 (still training, or stopped)" in page
    assert "skipped layernorm-s0: " in page and "line 2 is not JSON" in page


def test_runs_of_different_tokenizers_show_bits_per_byte_only(sweep, monkeypatch, tmp_path):
    for name in ("rmsnorm-s0", "layernorm-s0"):
        shutil.copytree(sweep / name, tmp_path / name)
    (tmp_path / "layernorm-s0" / "tokenizer.json").write_text(json.dumps({"another": "tokenizer"}))
    page, defs = run_notebook(monkeypatch, "--runs", tmp_path)
    assert "Loss curves are off" in page and "different tokenizers" in page
    assert defs["metric"].value == "val/bpb" and list(defs["metric"].options) == ["val/bpb"]
    assert "final val/bpb" in page


@pytest.mark.browser
def test_the_app_in_a_real_browser(sweep):
    if find_chromium() is None or importlib.util.find_spec("playwright") is None:
        pytest.skip("needs Chromium (apt-get install chromium) and Playwright (the dev extra)")
    with serve_explorer("--runs", str(sweep)) as served, open_page(served.url) as page:
        wait_for_plots(page, 5)
        assert "Loaded 4 runs" in page.inner_text("body")
        for run in ("rmsnorm-s0", "layernorm-s1"):  # in the figures' legends
            assert page.locator(".legendtext", has_text=run).count() > 0
        assert page.locator(".js-plotly-plot").count() >= 5
        # marimo run hides a failing cell from the page and prints its traceback in the server's log.
        assert "Traceback" not in served.log() and "error_id" not in served.log()
