"""python -m lab report on synthetic study folders: the LR-sensitivity metric, divergences, skips,
refusals, and claims declared as data."""

import json
import math

import pytest
import yaml
from synthetic_studies import L0, VOCAB, write_run, write_study

from lab import study_report
from lab.__main__ import main as lab
from lab.results import load_results
from lab.runs import SWEPT, Run, RunsError, default_baseline, find_runs, group_runs, loss_ceiling, swept_keys
from lab.study import Study, lr_sensitivity

GRID = {
    "rmsnorm": {0.001: 5.0, 0.01: 4.0, 0.1: None},  # diverges at 0.1
    "rmsnorm-qk": {0.001: 5.1, 0.01: 4.1, 0.1: 4.5},
    "rmsnorm-peri": {0.001: 5.2, 0.01: 4.2, 0.1: 4.6},
    "dyt": {0.001: 5.5, 0.01: 4.9, 0.1: None},  # 0.9 nats behind the baseline: did not train
}


@pytest.fixture
def study(tmp_path):
    """Selection seeds 0-2 at every rate, report seeds 3-4 at the best rate (0.01 for every variant)."""
    root = tmp_path / "stability"
    write_study(root, GRID)
    write_run(root, "identity", 0.001, 6.0, metrics=False)  # a run that never logged: named and skipped
    return root


def test_lr_sensitivity_against_a_hand_calculation():
    # Losses 5.0, 4.0 and a divergence (counted as the initial loss L0): best 4.0.
    expected = ((5.0 - 4.0) + 0.0 + (L0 - 4.0)) / 3
    assert lr_sensitivity({0.001: 5.0, 0.01: 4.0, 0.1: L0}) == pytest.approx(expected)
    assert lr_sensitivity({0.001: 4.0, 0.01: 4.0}) == 0.0


def test_report_on_a_study_with_a_diverged_and_a_missing_run(study, tmp_path):
    out = tmp_path / "report"
    assert lab(["report", str(study), "--out", str(out)]) == 0
    report = (out / "report.md").read_text()
    for figure in ("loss_vs_lr.png", "loss_vs_step.png", "attention_logits.png", "depth.png", "feature_kurtosis.png"):
        assert (out / figure).stat().st_size > 5_000, figure
    data = json.loads((out / "study.json").read_text())
    assert data["learning_rates"] == [0.001, 0.01, 0.1] and data["unigram_loss"] is None
    assert len(data["cells"]) == 4 * (3 * 3 + 2)
    # The scale every verdict holds at, from the baseline's record: 20 steps of 2,048 tokens over 10,240 parameters.
    scale = {"params": 10240, "steps": 20, "seq_len": 128, "tokens": 40960, "tokens_per_param": 4.0}
    assert data["scale"] == scale
    for claim in data["claims"]:  # each claim also names its own arms' parameters (every fake run has 10,240)
        arms = {f"params_{side}": 10240 for side in ("arm", "against") if claim[side] is not None}
        assert claim["scale"] == {**scale, **arms}
    assert set(data["variants"]["rmsnorm"]["max_attn_logit_by_report_seed"]) == {"3", "4"}
    assert "Every verdict holds at this study's scale: 0.01M parameters, 20 steps" in report
    diverged = next(c for c in data["cells"] if (c["variant"], c["lr"], c["seed"]) == ("rmsnorm", 0.1, 0))
    assert diverged == {**diverged, "loss": None, "diverged": True, "heldout_loss": L0} and diverged["steps"] > 0
    rms = data["variants"]["rmsnorm"]
    assert (rms["selection_seeds"], rms["report_seeds"]) == ([0, 1, 2], [3, 4])
    assert rms["best_lr"] == 0.01 and rms["best_lr_inside"] and rms["trained"] and rms["diverged_at_lr"] == [0.1]
    # The report seeds' losses at the best rate, 4.0 and 4.1 (no held-out windows logged: the selection loss).
    assert rms["best_loss"]["mean"] == pytest.approx(4.05) and rms["best_loss"]["seeds"] == 2
    assert rms["best_loss"]["ci95"] == pytest.approx((4.05 - 12.706 * 0.05, 4.05 + 12.706 * 0.05), abs=1e-3)
    # Each selection seed's own sensitivity: ((5.0 + 0.03 s - 4.0) + 0 + (L0 - 4.0)) / 3; the value is their mean.
    per_seed = [((1.0 + 0.03 * s) + (L0 - 4.0)) / 3 for s in range(3)]
    assert rms["lr_sensitivity"]["value"] == pytest.approx(sum(per_seed) / 3)
    assert rms["lr_sensitivity"]["ci95"][0] < rms["lr_sensitivity"]["value"] < rms["lr_sensitivity"]["ci95"][1]
    qk = data["variants"]["rmsnorm-qk"]
    assert qk["against_baseline"]["difference"] == pytest.approx(0.1)  # paired by report seed: 4.1-4.0, 4.2-4.1
    assert qk["against_baseline"]["seeds"] == [3, 4]
    dyt = data["variants"]["dyt"]  # runs without a unigram line: the fallback of 0.5 nats above the baseline
    assert not dyt["trained"] and dyt["symptoms"].startswith("best loss 4.900 at lr 0.01, more than 0.5 nats above")
    first_table = report[: report.index("## Attention logits")]  # the logit table below has a row per variant too
    rows = {line.split("|")[1].strip(): line for line in first_table.splitlines() if line.startswith("| ")}
    assert rows["rmsnorm"].split("|")[2].strip() == "0.01 (0.001–0.1)" and "4.050 [" in rows["rmsnorm"]
    assert rows["dyt"].split("|")[6].strip() == "**no**" and "identity" not in rows
    assert "## Skipped" in report and "deep-identity-lr0.001-s0" in report
    assert "selection 0-2, report 3-4 (4 variants)" in report
    # The attention panels: the highest rate at which the baseline trained (0.01), and the next one up.
    assert (
        "at lr 0.01 (the highest shared rate at which every selection seed of the baseline trained) and 0.1" in report
    )
    claims = {c["claim"]: c for c in data["claims"]}
    sensitivity = claims["QK-norm lowers LR sensitivity"]
    qk_per_seed = [((1.0 + 0.03 * s) + 0.0 + 0.4) / 3 for s in range(3)]
    assert sensitivity["difference"] == pytest.approx(sum(qk_per_seed) / 3 - sum(per_seed) / 3)
    assert sensitivity["seeds"] == [0, 1, 2] and sensitivity["verdict"] == "agrees" and sensitivity["p"] < 0.05
    logits = claims["QK-norm bounds the logits"]  # 20 in both arms at lr 0.01: no difference, no finding
    assert (logits["value_arm"], logits["value_against"], logits["verdict"]) == (20, 20, "inconclusive")
    assert claims["Peri-norm keeps the stream flat"]["verdict"] == "agrees"  # 1.1 / 1.1 against 6 / 2
    assert claims["DyT matches RMSNorm"]["reason"] == "dyt did not train at any rate here"
    assert claims["Post-norm is less stable"]["reason"].startswith("no variant in these runs has")
    for c in data["claims"]:
        assert (c["verdict"] in ("agrees", "disagrees")) == (c.get("p") is not None and c["p"] < 0.05)


def test_a_claim_whose_arms_are_larger_than_the_study_model_names_their_own_scale():
    """The budget study's nGPT claim: 3,072,000 tokens over 727,424 and 721,472 parameters are 4.2 and 4.3
    tokens per parameter, not the tied model's 6.7; a claim on the study model's own size adds nothing."""
    scale = {"params": 459328, "steps": 3000, "seq_len": 128, "tokens": 3072000, "tokens_per_param": 6.69}
    larger = {"scale": {**scale, "params_arm": 727424, "params_against": 721472}}
    assert study_report.arm_scale_words(larger) == (
        "; at its arms' own scale: 0.73M parameters (4.2 tokens per parameter) against 0.72M parameters "
        "(4.3 tokens per parameter)"
    )
    layernorm = {"scale": {**scale, "params_arm": 459328, "params_against": 459904}}  # its biases: 0.1% more
    assert study_report.arm_scale_words(layernorm) == ""
    one_armed = {"scale": {**scale, "tokens": None, "params_arm": 727424}}  # no token count recorded, no ratio
    assert study_report.arm_scale_words(one_armed) == "; at its arms' own scale: 0.73M parameters"


def test_mixed_tokenizers_are_refused_for_loss_but_not_for_bits_per_byte(tmp_path):
    root = tmp_path / "mixed"
    write_run(root, "rmsnorm", 0.01, 4.0, tokenizer="bpe-a")
    write_run(root, "layernorm", 0.01, 4.2, tokenizer="bpe-b")
    with pytest.raises(RunsError, match="different tokenizers"):
        load_results([str(root)], "val/loss")
    assert lab(["report", str(root), "--out", str(tmp_path / "o"), "--metric", "val/bpb"]) == 0


def test_no_runs_or_no_baseline_is_a_clear_error(tmp_path):
    (tmp_path / "empty").mkdir()
    assert lab(["report", str(tmp_path / "empty"), "--out", str(tmp_path / "o")]) == 1
    root = tmp_path / "nobase"
    write_run(root, "dyt", 0.01, 4.0)
    with pytest.raises(RunsError, match="baseline 'rmsnorm' is not among the variants: dyt"):
        study_report.write_report([str(root)], tmp_path / "o2", "val/loss", None, "rmsnorm")


def test_grouping_by_swept_keys_pools_only_seeds(tmp_path):
    """compare_runs' and the explorer's default: runs of different learning rates are never pooled."""
    root = tmp_path / "grid"
    for seed in (0, 1):
        for lr in (0.001, 0.01):
            write_run(root, "rmsnorm", lr, 4.0 + lr, seed=seed)
            write_run(root, "rmsnorm-qk", lr, 4.1 + lr, seed=seed)
    runs = find_runs([str(root)])
    assert swept_keys(runs) == ["train.lr"]
    groups = group_runs(runs, SWEPT)
    assert list(groups) == [
        "rmsnorm, train.lr=0.001", "rmsnorm, train.lr=0.01", "rmsnorm-qk, train.lr=0.001", "rmsnorm-qk, train.lr=0.01"
    ]  # fmt: skip
    assert all(sorted(r.config["seed"] for r in g) == [0, 1] for g in groups.values())
    assert default_baseline(groups) == "rmsnorm, train.lr=0.001"
    assert list(group_runs(runs, "variant")) == ["rmsnorm", "rmsnorm-qk"]  # an explicit key still pools rates


def test_an_imported_model_beside_its_fine_tunes_is_a_group_of_its_own(tmp_path):
    """The imported model differs from the runs fine-tuned from it in every training key (it never trained here):
    the swept keys are read from the runs that trained, and it is grouped by itself, not with a norm's seeds."""
    root = tmp_path / "fine-tuned"
    for seed in (0, 1):
        for lr in (0.001, 0.01):
            write_run(root, "rmsnorm", lr, 4.0 + lr, seed=seed)
    folder = write_run(tmp_path, "rmsnorm", 0.003, 5.0, metrics=False)
    config = yaml.safe_load((folder / "config.yaml").read_text())
    config["runtime"]["imported_from"] = {"architecture": "LlamaForCausalLM"}
    config["train"]["max_steps"] = 600
    imported = Run(folder, config, [{"step": 0, "val/loss": 5.0}], "bpe-a")
    runs = [*find_runs([str(root)]), imported]
    assert imported.evaluated_only and swept_keys(runs) == ["train.lr"]
    groups = group_runs(runs, SWEPT)
    assert list(groups) == [f"imported: {folder.name}", "rmsnorm, train.lr=0.001", "rmsnorm, train.lr=0.01"]
    assert groups[f"imported: {folder.name}"] == [imported]
    for run in runs[:-1]:  # the fine-tunes relabelled: no rmsnorm group is left to be the baseline
        run.config["variant"] = "layernorm"
    assert default_baseline(group_runs(runs, SWEPT)) == "layernorm, train.lr=0.001"  # never the import


def test_the_unigram_line_decides_who_trained_and_the_probes_explain_why(tmp_path):
    root = tmp_path / "u"
    for seed in (0, 1, 2, 3, 4):  # 3 and 4: the report seeds, at the best rate only
        for lr, (base, flat) in {0.001: (5.0, 6.1), 0.01: (4.0, 6.0), 0.1: (4.5, 6.05)}.items():
            if seed > 2 and lr != 0.01:
                continue
            for arm, loss in (("rmsnorm", base + 0.01 * seed), ("dyt", flat)):
                run = write_run(root, arm, lr, loss, seed=seed)
                config = yaml.safe_load((run / "config.yaml").read_text())
                config["runtime"]["unigram_val_loss"] = 6.1
                (run / "config.yaml").write_text(yaml.safe_dump(config))
                with (run / "metrics.jsonl").open("a") as metrics:
                    grads = {f"grad/layers.{i}": 0.0 if arm == "dyt" else 0.1 for i in range(3)}
                    metrics.write(json.dumps({"step": 30, **grads, "heldout/loss": loss + 0.02}) + "\n")
    study = Study(load_results([str(root)], "val/loss")[0], "rmsnorm")
    assert study.untrained == {"dyt"}  # 6.0 is not 0.3 below 6.1; rmsnorm's 4.0 is
    results = study_report.study_json(study, "val/loss", [])
    rms = results["variants"]["rmsnorm"]
    assert rms["best_loss"]["measured_on"] == "heldout/loss of the report seeds" and rms["best_loss"]["seeds"] == 2
    assert rms["best_loss"]["mean"] == pytest.approx(4.055)  # seeds 3, 4 at lr 0.01, held out: 4.05 and 4.06
    low, high = rms["lr_sensitivity"]["ci95"]
    assert low <= rms["lr_sensitivity"]["value"] <= high
    why = results["variants"]["dyt"]["symptoms"]
    assert "not 0.3 nats below the unigram loss 6.100" in why and "gradient norm by layer 0, 0, 0" in why


def test_a_blown_up_run_does_not_set_the_loss_axis(tmp_path):
    run = write_run(tmp_path / "b", "rmsnorm", 0.1, 4.0)
    with (run / "metrics.jsonl").open("a") as metrics:
        metrics.write(json.dumps({"step": 30, "train/loss": 1e30}) + "\n")
    runs = find_runs([str(tmp_path / "b")])
    assert loss_ceiling(runs) == pytest.approx(1.25 * math.log(VOCAB))
    assert lab(["compare", str(tmp_path / "b"), "--out", str(tmp_path / "c")]) == 0


def test_arms_that_share_no_rate_have_their_logits_read_each_at_its_own_best_rate(tmp_path):
    root = tmp_path / "runs"
    write_study(root, {"rmsnorm": {0.001: 5.0, 0.01: 4.0, 0.1: 4.6}}, best_lr=0.01)
    write_study(root, {"rmsnorm-qk": {0.002: 5.0, 0.02: 3.9, 0.2: 4.5}}, best_lr=0.02)
    out = tmp_path / "report"
    assert lab(["report", str(root), "--out", str(out)]) == 0
    report = (out / "report.md").read_text()
    assert "they share none" in report and "each variant at its own best rate" in report
    assert (out / "attention_logits.png").stat().st_size > 5_000
    data = json.loads((out / "study.json").read_text())
    # the fake runs log a logit of lr * 100 * step: 0.02 * 100 * 20 at rmsnorm-qk's best rate, 0.01 * ... at rmsnorm's
    assert data["variants"]["rmsnorm-qk"]["max_attn_logit_by_report_seed"] == {"3": 40.0, "4": 40.0}
    assert data["variants"]["rmsnorm"]["max_attn_logit_by_report_seed"] == {"3": 20.0, "4": 20.0}
