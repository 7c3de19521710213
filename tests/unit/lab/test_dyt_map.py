"""lab/dyt_map.py: which settings of the DyT map train, and the smallest model at which one does."""

import json

import pytest
import torch
import yaml
from synthetic_studies import write_run

from lab.__main__ import main as lab
from lab.dyt_map import final_alphas, summarize, write_report
from lab.runs import RunsError, load_runs

UNIGRAM = 6.0  # the line is 5.7


def _run(root, model, d_model, params, alpha, loss, seed=0, norm="dyt", unigram=UNIGRAM, diverged_at=None, lr=0.003):
    run = write_run(root / f"{norm}-a{alpha}", model, lr, loss, seed=seed, model=model, diverged_at=diverged_at)
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["norm"] = {"name": norm, "alpha_init": alpha}
    config["model"].update(d_model=d_model, embed_scale="none")
    config["train"].update(warmup_steps=40, batch_size=8)
    config["runtime"].update(params=params, unigram_val_loss=unigram)
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    if alpha is not None:  # the last row's stats: one norm saturated by alpha, one not at all
        metrics = run / "metrics.jsonl"
        rows = [json.loads(line) for line in metrics.read_text().splitlines()]
        rows[-1].update({"act/layers.0.attn_norm/saturated": min(1.0, alpha), "act/final_norm/saturated": 0.0})
        metrics.write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_the_smallest_model_that_trains_is_named_with_its_best_setting(tmp_path):
    _run(tmp_path, "d64", 64, 400_000, 0.5, 6.05)  # at the unigram: no
    _run(tmp_path, "d64", 64, 400_000, 0.01, 5.75)  # 0.25 below: not the 0.3 the line asks
    _run(tmp_path, "d128", 128, 1_000_000, 0.5, 6.0)
    _run(tmp_path, "d128", 128, 1_000_000, 0.01, 5.5)  # trains
    _run(tmp_path, "d128", 128, 1_000_000, 0.003, 5.4)  # trains, and better
    _run(tmp_path, "d128", 128, 1_000_001, 0.001, 5.3)  # one parameter more (a learned embedding scale): same model
    _run(tmp_path, "d256", 256, 4_000_000, 0.5, 5.0)
    summary = summarize(load_runs([str(tmp_path)])[0])
    assert summary["line"] == pytest.approx(5.7)
    found = summary["smallest_trained"]["dyt"]
    assert (found["model"], found["params"], found["settings"], found["best"]["alpha"]) == ("d128", 1_000_000, 3, 0.001)
    assert [s["trained"] for s in summary["settings"]] == [False, False, True, True, True, False, True]
    assert [s["saturated"] for s in summary["settings"][:2]] == [0.005, 0.25]  # mean of (alpha, 0) over the norms


def test_with_several_seeds_every_seed_must_train_and_the_mean_gets_an_interval(tmp_path):
    for seed, loss in enumerate((5.5, 5.6, 5.8)):  # the third seed is above the line
        _run(tmp_path, "d64", 64, 400_000, 0.01, loss, seed=seed)
    for seed, loss in enumerate((5.4, 5.5, 5.6)):
        _run(tmp_path, "d64", 64, 400_000, 0.003, loss, seed=seed)
    _run(tmp_path, "d64", 64, 400_000, 2.0, 5.0, diverged_at=12)  # a diverged run did not train
    _run(tmp_path, "d64", 64, 400_000, 0.001, 5.45)  # one seed, below 0.003's mean but above its map seed
    summary = summarize(load_runs([str(tmp_path)])[0])
    assert summary["smallest_trained"]["dyt"]["best"]["alpha"] == 0.003  # chosen on seed 0: 5.4 against 5.45
    settings = {s["alpha"]: s for s in summary["settings"]}
    report = summary["smallest_trained"]["dyt"]["report"]  # on the seeds that did not choose it
    assert report["seeds"] == [1, 2] and report["mean"] == pytest.approx(5.55)
    assert settings[0.01]["trained"] is False and settings[0.003]["trained"] is True
    assert settings[0.003]["loss"]["mean"] == pytest.approx(5.5)
    low, high = settings[0.003]["loss"]["ci95"]
    assert (low, high) == pytest.approx((5.5 - 4.302653 * 0.1 / 3**0.5, 5.5 + 4.302653 * 0.1 / 3**0.5), abs=1e-5)
    assert settings[2.0]["loss"] is None and settings[2.0]["trained"] is False


def test_no_setting_that_trains_is_said_so_and_the_report_is_written(tmp_path):
    runs = tmp_path / "runs"
    _run(runs, "d64", 64, 400_000, 0.5, 6.05)
    _run(runs, "d64", 64, 400_000, 0.5, 6.1, norm="derf")
    report = write_report([str(runs)], tmp_path / "out").read_text()
    assert "dyt: none of its 1 settings trains" in report and "derf: none" in report
    data = json.loads((tmp_path / "out" / "map.json").read_text())
    assert data["smallest_trained"] == {"derf": None, "dyt": None} and (tmp_path / "out" / "map.png").exists()


def test_runs_on_different_validation_windows_are_refused(tmp_path):
    _run(tmp_path, "d64", 64, 400_000, 0.5, 6.05)
    _run(tmp_path, "d64", 64, 400_000, 0.01, 5.0, unigram=6.2)
    with pytest.raises(RunsError, match="one unigram loss"):
        summarize(load_runs([str(tmp_path)])[0])


def test_the_command_without_finished_runs_says_what_to_train(tmp_path, capsys):
    _run(tmp_path, "d64", 64, 400_000, 0.5, 6.05)
    metrics = next(tmp_path.rglob("metrics.jsonl"))
    metrics.write_text(metrics.read_text().splitlines()[0] + "\n")  # stopped at step 10 of 20
    assert lab(["dyt-map", str(tmp_path), "--out", str(tmp_path / "out")]) == 1
    assert "no finished run" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_alpha_at_the_end_is_read_from_the_last_checkpoint(tmp_path):
    _run(tmp_path, "d64", 64, 400_000, 0.5, 6.05)
    run_dir = next(p.parent for p in tmp_path.rglob("config.yaml"))
    (run_dir / "checkpoints").mkdir()
    alphas = {"layers.0.attn_norm.alpha": torch.tensor(0.1), "final_norm.alpha": torch.tensor(-0.2)}
    rest = {"model_config": {}, "config": {}, "tokenizer": ""}  # what every checkpoint holds besides its weights
    for step, model in (
        (10, {**alphas, "tok_embeddings.weight": torch.zeros(2, 2)}),
        (20, {k: v * 3 for k, v in alphas.items()}),
    ):
        torch.save({"step": step, "model": model, **rest}, run_dir / "checkpoints" / f"step_{step:07d}.pt")
    (run,) = load_runs([str(tmp_path)])[0]
    assert final_alphas(run) == pytest.approx([0.3, -0.6])  # the newest checkpoint's
    (setting,) = summarize([run])["settings"]
    assert setting["alpha_end"] == pytest.approx([-0.6, 0.3]) and setting["saturated_max"] == 0.5


def test_dyt_and_no_norm_are_compared_at_their_own_tuned_rates_on_seeds_that_chose_neither(tmp_path):
    """Each rate is chosen on the map's seed 0 over three rates or more, inside them; the difference is
    paired over seeds 1-2 only: DyT at 0.003 (5.5, 5.6) against no norm at 0.01 (5.2, 5.1): +0.4."""

    def add(norm, alpha, losses_by_lr, seeds=(0,)):
        for lr, losses in losses_by_lr.items():
            for seed, loss in zip(seeds, losses):
                _run(tmp_path, "d64", 64, 400_000, alpha, loss, seed=seed, norm=norm, lr=lr)

    add("dyt", 0.003, {0.001: [5.6], 0.003: [5.4], 0.01: [5.5]})
    add("dyt", 0.003, {0.003: [5.5, 5.6]}, seeds=(1, 2))
    add("dyt", 0.003, {0.03: [4.0]}, seeds=(1,))  # lower, but seed 0 did not run it: neither chosen nor a rate

    def versus():
        return summarize(load_runs([str(tmp_path)])[0])["smallest_trained"]["dyt"]["vs_no_norm"]

    assert versus() == {
        "reason": "the no-norm control's rate is not tuned: 0 rate(s) run on seed 0, fewer than the 3 a tuned rate needs"
    }
    add("identity", None, {0.001: [5.3], 0.003: [5.1], 0.01: [5.0]})
    assert "best rate 0.01 at an edge of the rates run (0.001 to 0.01)" in versus()["reason"]
    add("identity", None, {0.03: [5.2]})
    assert "0 seed(s)" in versus()["reason"]  # seeds 1-2 have not run at no norm's best rate yet
    add("identity", None, {0.01: [5.2, 5.1]}, seeds=(1, 2))
    found = versus()
    assert (found["lr"], found["control_lr"], found["seeds"]) == (0.003, 0.01, [1, 2])
    assert found["values_control"] == [5.2, 5.1] and found["difference"] == pytest.approx(0.4)
    assert found["rates"] == [0.001, 0.003, 0.01] and found["control_rates"] == [0.001, 0.003, 0.01, 0.03]
