"""train.init_from: a new run starts from another run's weights (a normlab run, or an imported model) with its
tokenizer; with another norm the matching tensors load, the others start fresh, and the record names them."""

import shutil
import subprocess
import sys

import pytest
import test_import_hf
import torch
import yaml
from import_hf import import_hf
from test_import_hf import save, tokenizer_file  # noqa: F401  (a fixture)
from tiny_runs import ROOT, read_metrics, run_tiny, train_here

from training.checkpoints.files import list_checkpoints
from training.checkpoints.load import load_checkpoint
from training.errors import NormlabError
from training.run.lock import LOCK_FILE
from training.run.resume import flatten

transformers = pytest.importorskip("transformers")

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


QWEN3_PADDED = 384  # rows past the 320 that 300 tokens padded to a multiple of 64 give: Qwen3's 151,936 for 151,669
SOURCES = {  # (transformers config, how it is saved): a sharded source among them
    "llama": (lambda: test_import_hf.MODELS["llama"](), {"max_shard_size": "100KB"}),
    "qwen3": (
        lambda: transformers.Qwen3Config(**{**test_import_hf.SHAPE, "vocab_size": QWEN3_PADDED}, head_dim=32),
        {},
    ),
    "olmo2": (lambda: test_import_hf.MODELS["olmo2"](), {}),
}
FINE_TUNE = ["train.max_steps=4", "train.log_every=1", "train.eval_every=2", "train.checkpoint_every=2",
             "data.val_windows=4", "logger=none", "train.batch_size=2"]  # fmt: skip


@pytest.fixture(scope="module")
def imported(tmp_path_factory, tokenizer_file):  # noqa: F811
    """Each kind of Hugging Face model imported as a run directory (built here from its config)."""
    runs = {}
    for kind, (config, options) in SOURCES.items():
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config()).eval()
        folder = save(model, tmp_path_factory.mktemp(kind) / "hf", tokenizer_file, **options)
        runs[kind] = tmp_path_factory.mktemp("imported") / kind
        import_hf(folder, runs[kind])
    return runs


def fine_tune(run, source, cache_dir, *extra):
    return train_here(run, f"train.init_from={source}", f"data.cache_dir={cache_dir}", *FINE_TUNE, *extra)


@pytest.mark.parametrize("kind", SOURCES)
@pytest.mark.parametrize("norm", [[], ["norm=layernorm"]], ids=["its norm", "layernorm"])
def test_init_from_alone_fine_tunes_the_imported_architecture(imported, cache_dir, tmp_path, kind, norm):
    """No model override: the shape, head layout, RoPE, placement and QK-norm are the source's (another norm
    swaps the stream's norms only), and the record says what came from the source."""
    source = imported[kind]
    run = tmp_path / "ft"
    fine_tune(run, source, cache_dir, *norm)
    assert [row["step"] for row in read_metrics(run) if "train/loss" in row] == [1, 2, 3, 4]
    theirs, ours = load_checkpoint(source), load_checkpoint(run)
    their_config, our_config = (flatten(state["model_config"]) for state in (theirs, ours))
    differs = {k: v for k, v in our_config.items() if their_config[k] != v}
    layernorm = {"norm.name": "layernorm", "norm.eps": 1e-5, "norm.bias": True, "norm.cast_before_weight": None}
    assert differs == ({} if not norm else {k: v for k, v in layernorm.items() if their_config[k] != v})
    record = init_record(run)
    assert record["step"] == 0 and record["unused"] == [] and record["source"].endswith("step_0000000.pt")
    assert record["architecture"]["model.d_model"] == 64 and record["architecture"]["train.seq_len"] == 64
    assert ("norm.name" in record["architecture"]) is not bool(norm)
    if kind == "qwen3":  # the padded table kept, and resumed with it
        assert ours["model_config"]["vocab_size"] == QWEN3_PADDED
    if norm:  # LayerNorm's biases: 2 layers x 2 norms (their place in the source's blocks), and the final norm's
        assert len(record["new"]) == 5 and all(name.endswith(".bias") for name in record["new"])
    assert (run / "tokenizer.json").read_text() == (source / "tokenizer.json").read_text()


def test_naming_the_source_s_own_norm_keeps_its_options(cache_dir, tmp_path):
    """norm=layernorm on the command line, on a LayerNorm source without biases, with a 1 + w gain and another
    eps: the run keeps the source's options, not the layernorm group's (bias, standard gain, eps 1e-5), and an
    option named beside it wins."""
    source, run = tmp_path / "source", tmp_path / "ft"
    run_tiny(source, cache_dir, 2, "norm=layernorm", "norm.bias=false", "norm.gain=one_plus", "norm.eps=1e-4")
    command = [sys.executable, "train.py", f"train.init_from={source}", f"data.cache_dir={cache_dir}", *FINE_TUNE,
               "norm=layernorm", "norm.eps=1e-3", f"hydra.run.dir={run}"]  # fmt: skip
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    their_config = flatten(load_checkpoint(source)["model_config"])
    our_config = flatten(load_checkpoint(run)["model_config"])
    assert {k: v for k, v in our_config.items() if their_config[k] != v} == {"norm.eps": 1e-3}
    taken = init_record(run)["architecture"]
    assert taken["norm.bias"] is False and taken["norm.gain"] == "one_plus" and "norm.eps" not in taken
    assert init_record(run)["new"] == []  # no LayerNorm bias appeared


@pytest.mark.parametrize("kind", ["qwen3", "olmo2"])
def test_a_killed_fine_tune_resumes_bit_for_bit(imported, cache_dir, tmp_path, kind):
    """Killed after its step-2 checkpoint (the later checkpoint gone, its metrics rows past it kept): the same
    command resumes from its own checkpoint, without the source, to the uninterrupted run's losses."""
    uninterrupted, killed = tmp_path / "a", tmp_path / "b"
    fine_tune(uninterrupted, imported[kind], cache_dir)
    fine_tune(killed, imported[kind], cache_dir)
    (killed / "checkpoints" / "step_0000004.pt").unlink()
    moved = shutil.move(imported[kind], tmp_path / "source moved away")
    try:
        fine_tune(killed, imported[kind], cache_dir)
    finally:
        shutil.move(moved, imported[kind])
    (resume,) = yaml.safe_load((killed / "config.yaml").read_text())["resumes"]
    assert resume["step"] == 2 and resume["changes"] == {}
    assert untimed(read_metrics(killed)) == untimed(read_metrics(uninterrupted))


def untimed(rows: list[dict]) -> list[dict]:
    """Metrics rows without their timings (perf/), which differ from run to run."""
    return [{k: v for k, v in row.items() if not k.startswith("perf/")} for row in rows]


def test_a_restart_before_the_first_checkpoint_reads_the_checkpoint_its_record_names(source, cache_dir, tmp_path):
    """The source trains on meanwhile (a newer checkpoint): the fine-tune, killed before it saved anything, starts
    again from the very checkpoint it started from."""
    run = tmp_path / "ft"
    run_tiny(run, cache_dir, 2, f"train.init_from={source}", "seed=1")
    first = init_record(run)
    shutil.rmtree(run / "checkpoints")
    (run / "metrics.jsonl").unlink()
    newer = tmp_path / "source"
    shutil.copytree(source, newer)
    run_tiny(newer, cache_dir, 6, "resume_with_changes=[train.max_steps]")  # its newest is now step 6
    (run / "config.yaml").write_text((run / "config.yaml").read_text().replace(str(source), str(newer)))
    run_tiny(run, cache_dir, 2, f"train.init_from={newer}", "seed=1", "resume_with_changes=[train.init_from]")
    assert init_record(run)["source"] == first["source"].replace(str(source), str(newer))
    assert init_record(run)["source"].endswith("step_0000004.pt")


@pytest.mark.parametrize(
    "case, error",
    [
        (
            "model.d_model=32",
            "none of its tensors fits this model (another size); leave the model's size unset to take",
        ),
        ("model.n_heads=8", "model.n_heads=8 where train.init_from="),  # 8 heads of 8 and 4 of 16: o_proj fits
        ("model.rope_theta=500000", "model.rope_theta=500000.0 where train.init_from="),
        ("missing", "no such run directory or checkpoint"),
        ("data.tokenizer", "is not the tokenizer of train.init_from="),
    ],
)
def test_refusals_are_one_line_and_write_nothing(source, cache_dir, tmp_path, case, error):
    init_from = tmp_path / "nowhere" if case == "missing" else source
    extra = {"missing": [], "data.tokenizer": [f"data.tokenizer={tokenizer_path(tmp_path)}"]}.get(case, [case])
    run = tmp_path / "refused"
    with pytest.raises(NormlabError) as refused:
        run_tiny(run, cache_dir, 2, f"train.init_from={init_from}", *extra)
    assert error in str(refused.value) and "\n" not in str(refused.value)
    assert sorted(p.name for p in run.iterdir()) == [LOCK_FILE] and not list_checkpoints(run)  # train.py removes it


def tokenizer_path(tmp_path) -> str:
    """A tokenizer other than the source's."""
    from tokenizers import Tokenizer, models

    path = tmp_path / "other.json"
    Tokenizer(models.BPE()).save(str(path))
    return str(path)


def test_a_key_named_on_the_command_line_wins_even_at_its_default_value(imported, cache_dir, tmp_path):
    """train.py's own command line: norm.placement=pre is the default, and naming it trains OLMo 2's weights in
    pre-norm blocks (with OLMo 2's QK-norm over all heads, which it did not name)."""
    run = tmp_path / "ft"
    command = [sys.executable, "train.py", f"train.init_from={imported['olmo2']}", "norm.placement=pre",
               f"data.cache_dir={cache_dir}", *FINE_TUNE, f"hydra.run.dir={run}"]  # fmt: skip
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    norm = load_checkpoint(run)["model_config"]["norm"]
    assert (norm["placement"], norm["qk"], norm["qk_axis"]) == ("pre", "rmsnorm", "all")
    architecture = init_record(run)["architecture"]
    assert "norm.placement" not in architecture and architecture["norm.qk_axis"] == "all"
