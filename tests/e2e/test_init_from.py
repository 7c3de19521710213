"""train.init_from: a new run starts from another run's weights (a normlab run, or an imported model) with its
tokenizer; with another norm the matching tensors load, the others start fresh, and the record names them."""

import pytest
import torch
import yaml
from import_hf import import_hf
from test_import_hf import hf_model, save, tokenizer_file  # noqa: F401  (a fixture)
from tiny_runs import read_metrics, run_tiny, train_here

from training.checkpoint import list_checkpoints, load_checkpoint
from training.errors import NormlabError
from training.run_lock import LOCK_FILE

TINY_LR = "train.lr=1e-10"  # two steps that leave the weights where they started, to within 1e-8


@pytest.fixture(scope="module")
def source(tmp_path_factory, cache_dir):
    """A tiny rmsnorm run of 4 steps."""
    run = tmp_path_factory.mktemp("source") / "run"
    run_tiny(run, cache_dir, 4)
    return run


def init_record(run) -> dict:
    return yaml.safe_load((run / "config.yaml").read_text())["runtime"]["init_from"]


def test_a_new_run_starts_from_the_source_weights(source, cache_dir, tmp_path):
    run = tmp_path / "b"
    run_tiny(run, cache_dir, 2, f"train.init_from={source}", TINY_LR, "seed=1")
    theirs = load_checkpoint(source)
    ours = load_checkpoint(run)
    assert ours["step"] == 2 and theirs["step"] == 4
    for name, tensor in theirs["model"].items():
        torch.testing.assert_close(ours["model"][name], tensor, atol=1e-8, rtol=0, msg=name)
    assert [row["val/loss"] for row in read_metrics(run) if "val/loss" in row][0] == pytest.approx(
        [row["val/loss"] for row in read_metrics(source) if "val/loss" in row][-1], rel=1e-6
    )
    record = init_record(run)
    assert record["step"] == 4 and record["new"] == [] and record["unused"] == []
    assert record["loaded"] == len(theirs["model"]) and record["source"].endswith("step_0000004.pt")
    assert ours["optimizer"]["state"][0]["step"] == 2  # the optimizer started fresh
    # a run with a checkpoint resumes from its own, whatever init_from says
    run_tiny(run, cache_dir, 4, f"train.init_from={source}", TINY_LR, "seed=1", "resume_with_changes=[train.max_steps]")
    (resume,) = yaml.safe_load((run / "config.yaml").read_text())["resumes"]
    assert resume["step"] == 2 and resume["checkpoint"].endswith("step_0000002.pt")
    assert init_record(run) == record


def test_a_swapped_norm_loads_what_matches_and_names_what_is_new(source, cache_dir, tmp_path):
    run = tmp_path / "ln"
    run_tiny(run, cache_dir, 2, f"train.init_from={source}", "norm=layernorm", TINY_LR)
    record = init_record(run)
    biases = [f"layers.{i}.{role}_norm.bias" for i in range(2) for role in ("attn", "mlp")] + ["final_norm.bias"]
    assert record["new"] == sorted(biases) and record["unused"] == []
    theirs, ours = load_checkpoint(source)["model"], load_checkpoint(run)["model"]
    assert record["loaded"] == len(theirs) == len(ours) - len(biases)
    torch.testing.assert_close(ours["layers.1.mlp_norm.weight"], theirs["layers.1.mlp_norm.weight"], atol=1e-8, rtol=0)
    assert ours["final_norm.bias"].abs().max() < 1e-8  # LayerNorm's fresh bias: zeros


@pytest.fixture(scope="module")
def imported(tmp_path_factory, tokenizer_file):  # noqa: F811
    folder = save(hf_model("llama"), tmp_path_factory.mktemp("llama") / "hf", tokenizer_file)
    run = tmp_path_factory.mktemp("imported") / "run"
    overrides, problem = import_hf(folder, run)
    assert problem is None
    return run, overrides


@pytest.mark.parametrize("norm", [[], ["norm=layernorm"]], ids=["same norm", "layernorm"])
def test_an_imported_model_fine_tunes_on_the_default_corpus(imported, cache_dir, tmp_path, norm):
    source, overrides = imported
    if norm:  # Llama's rounding before the gain is an RMSNorm option that LayerNorm does not take
        overrides = [o for o in overrides if not o.startswith("norm.cast_before_weight=")]
    run = tmp_path / "ft"
    settings = ["train.max_steps=2", "train.log_every=1", "data.val_windows=4", "logger=none", "train.batch_size=2"]
    train_here(run, *overrides, *norm, f"train.init_from={source}", f"data.cache_dir={cache_dir}", *settings)
    assert [row["step"] for row in read_metrics(run) if "train/loss" in row] == [1, 2]
    record = init_record(run)
    assert record["step"] == 0 and record["unused"] == []
    assert len(record["new"]) == (5 if norm else 0)  # LayerNorm's biases: 2 layers x 2, and the final norm's
    assert (run / "tokenizer.json").read_text() == (source / "tokenizer.json").read_text()


@pytest.mark.parametrize(
    "case, error",
    [
        ("model.d_model=32", "none of its tensors fits this model (another size); build the source's: model.d_model"),
        ("missing", "no such run directory or checkpoint"),
        ("data.tokenizer", "is not the tokenizer of train.init_from="),
    ],
)
def test_refusals_are_one_line_and_write_nothing(source, cache_dir, tmp_path, case, error):
    init_from = tmp_path / "nowhere" if case == "missing" else source
    extra = {"model.d_model=32": [case], "data.tokenizer": [f"data.tokenizer={tokenizer_path(tmp_path)}"]}
    run = tmp_path / "refused"
    with pytest.raises(NormlabError) as refused:
        run_tiny(run, cache_dir, 2, f"train.init_from={init_from}", *extra.get(case, []))
    assert error in str(refused.value) and "\n" not in str(refused.value)
    assert sorted(p.name for p in run.iterdir()) == [LOCK_FILE] and not list_checkpoints(run)  # train.py removes it


def tokenizer_path(tmp_path) -> str:
    """A tokenizer other than the source's."""
    from tokenizers import Tokenizer, models

    path = tmp_path / "other.json"
    Tokenizer(models.BPE()).save(str(path))
    return str(path)
