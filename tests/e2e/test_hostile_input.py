"""Nothing lost, nothing misstated: bad values, foreign folders, lost records, edited corpora, other-data
evaluations and readers given nothing, each refused with one line that names the key, leaving files as they were;
and nothing written where it does not belong: not through a link, not above a loose checkpoint."""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import export_hf
import pytest
import torch
import yaml
from tiny_runs import ROOT, compose_config, read_metrics, run_tiny, tiny_overrides
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

import eval as eval_script
from lab.__main__ import main as lab
from lab.runs import latest_eval, load_run
from training.checkpoints.sharded import read_checkpoint
from training.config import ConfigError, check_config
from training.data.corpus import DataError
from training.data.corpus_files import check_text
from training.errors import CheckpointError
from training.run.lock import discard_unused
from training.run.record import RunIdentityError

# One process reading every shard is what these tests mean (training/checkpoints/sharded.py says so too).
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is .*uninitialized, assuming the intent is to")


def _hashes(folder):
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()
    }


def _cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


# (override, the key and the rule the one-line refusal names)
BAD_VALUES = [
    ("train.grad_clip=-1", "train.grad_clip=-1.0 is not allowed: it must be > 0 or null"),
    ("train.grad_clip=0", "train.grad_clip=0.0 is not allowed: it must be > 0 or null"),
    ("train.lr=-1", "train.lr=-1.0 is not allowed: it must be > 0"),
    ("train.lr=nan", "train.lr=nan is not allowed: it must be > 0"),
    ("train.batch_size=0", "train.batch_size=0 is not allowed: it must be >= 1"),
    ("model.n_layers=0", "model.n_layers=0 is not allowed: it must be >= 1"),
    ("norm.eps=0", "norm.eps=0.0 is not allowed: it must be > 0 or null"),
    ("train.max_steps=0", "train.max_steps=0 is not allowed: it must be >= 1"),
    ("train.min_lr_ratio=5", "train.min_lr_ratio=5.0 is not allowed: it must be in [0, 1]"),
    ("norm.roles.attn_in.alpha_init=-0.5", "norm.roles.attn_in.alpha_init=-0.5 is not allowed: it must be > 0 or null"),
]


@pytest.mark.parametrize("override, message", BAD_VALUES)
def test_a_value_out_of_its_range_is_refused_naming_the_key_and_the_rule(override, message):
    with pytest.raises(ConfigError) as refused:
        check_config(compose_config("model=tiny", override))
    assert str(refused.value) == message


def test_a_refused_command_exits_1_with_one_line_and_creates_no_run_directory(tmp_path):
    result = _cli("train.py", "model=tiny", "train.grad_clip=-1", "logger=none", f"hydra.run.dir={tmp_path / 'run'}")
    errors = [line for line in (result.stdout + result.stderr).splitlines() if "ERROR" in line]
    assert result.returncode == 1 and errors == [errors[0]] and "train.grad_clip=-1.0" in errors[0]
    assert "Traceback" not in result.stderr and not (tmp_path / "run").exists()


def test_null_turns_clipping_off(tmp_path, cache_dir):
    run_tiny(tmp_path, cache_dir, 2, "train.grad_clip=null")
    assert all(row["train/grad_norm"] > 0 for row in read_metrics(tmp_path) if "train/grad_norm" in row)


def test_a_foreign_folder_is_refused_and_left_as_it_was(tmp_path, cache_dir):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "train/loss": 1.0}\n')
    (tmp_path / "tokenizer.json").write_text("not ours")
    before = _hashes(tmp_path)
    with pytest.raises(
        RunIdentityError, match="is not a normlab run directory: it holds metrics.jsonl, tokenizer.json"
    ):
        run_tiny(tmp_path, cache_dir, 2)
    assert _hashes(tmp_path) == before and sorted(p.name for p in tmp_path.iterdir()) == [
        "metrics.jsonl",
        "tokenizer.json",
    ]


def test_a_refused_rerun_through_the_cli_leaves_every_file_byte_for_byte(tmp_path, cache_dir):
    run_dir = tmp_path / "run"
    command = ["train.py", *tiny_overrides(cache_dir, 2), f"hydra.run.dir={run_dir}"]
    assert _cli(*command).returncode == 0
    assert (run_dir / ".hydra" / "overrides.yaml").is_file() and (run_dir / "train.log").is_file()
    before = _hashes(run_dir)
    for refused in ("train.lr=0.1", "train.lr=-1"):  # another run's config; a value out of range
        assert _cli(*command, refused).returncode == 1
        assert _hashes(run_dir) == before


def test_without_its_config_yaml_the_checkpoint_is_the_record_a_rerun_is_checked_against(tmp_path, cache_dir):
    run_tiny(tmp_path, cache_dir, 4)
    (tmp_path / "checkpoints" / "step_0000004.pt").unlink()  # killed after its step-2 checkpoint, as it were
    (tmp_path / "config.yaml").unlink()
    with pytest.raises(RunIdentityError, match=r"train.lr: 0.003 in .*step_0000002.pt vs 0.1 now"):
        run_tiny(tmp_path, cache_dir, 4, "train.lr=0.1")
    assert not (tmp_path / "config.yaml").exists()
    run_tiny(tmp_path, cache_dir, 4)  # the same command resumes, and the record comes back from the checkpoint
    record = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert record["train"]["lr"] == 0.003 and record["resumes"][-1]["record_restored_from"].endswith("step_0000002.pt")
    assert [r["step"] for r in read_metrics(tmp_path) if "train/loss" in r] == [1, 2, 3, 4]


def test_a_corpus_edited_before_a_resume_is_refused_even_with_a_fixed_tokenizer(tmp_path, cache_dir):
    run_tiny(tmp_path / "source", cache_dir, 2)  # a tokenizer file to fix the tokenizer with
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(
        "\n\n".join(f"In the beginning {i} the words were many and the days were long." for i in range(300))
    )
    data = [
        "data=text_files",
        f"data.train_files=[{corpus}]",
        f"data.tokenizer={tmp_path / 'source' / 'tokenizer.json'}",
    ]
    run_dir = tmp_path / "run"
    run_tiny(run_dir, cache_dir, 4, *data)
    (run_dir / "checkpoints" / "step_0000004.pt").unlink()  # killed after its step-2 checkpoint, as it were
    corpus.write_text(corpus.read_text().replace("many", "few"))
    before = _hashes(run_dir)
    with pytest.raises(RunIdentityError, match="the data of .* changed since the run started \\(train, val split"):
        run_tiny(run_dir, cache_dir, 4, *data)
    assert _hashes(run_dir) == before


def test_evaluating_on_other_data_adds_an_entry_and_readers_keep_the_runs_own(tmp_path, cache_dir):
    run_dir = tmp_path / "run"
    run_tiny(run_dir, cache_dir, 2)
    other = tmp_path / "other.txt"
    other.write_text(
        "\n\n".join(f"A different text {i}, with words of its own and no verse numbers." for i in range(400))
    )
    base = [f"checkpoint={run_dir}", "max_new_tokens=2", "num_samples=1"]
    other_data = [
        "data=text_files",
        f"data.train_files=[{other}]",
        "data.val_fraction=0.5",
        f"data.cache_dir={cache_dir}",
    ]
    for extra in ([], other_data):
        cfg = compose_eval(*base, *extra)
        eval_script.run_eval(cfg, tmp_path / "out")
    entries = json.loads((run_dir / "eval.json").read_text())
    assert len(entries) == 2 and {e["data"] for e in entries.values()} == {"kjv", "text_files"}
    own = latest_eval(load_run(run_dir))
    assert (
        own["data"] == "kjv" and own["val/loss"] == next(e for e in entries.values() if e["data"] == "kjv")["val/loss"]
    )


def compose_eval(*overrides):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return eval_script.typed_eval_config(compose("eval", overrides=list(overrides)))


def test_readers_refuse_to_succeed_on_nothing(tmp_path, sweep, capsys):
    assert lab(["compare", str(sweep), "--metric", "no/such_key", "--out", str(tmp_path / "c")]) == 1
    assert "no run logged the metric 'no/such_key'; they logged: " in capsys.readouterr().err
    assert lab(["compare", str(sweep), "--group-by", "train.nope", "--out", str(tmp_path / "c")]) == 1
    assert "has no key 'train.nope' to group by; its keys: " in capsys.readouterr().err
    (tmp_path / "file").write_text("x")
    assert lab(["compare", str(sweep), "--out", str(tmp_path / "file")]) == 1
    assert "is a file" in capsys.readouterr().err
    result = _cli("notebooks/explore.py", "--runs", str(tmp_path / "missing"))
    assert result.returncode == 1 and "no such folder" in result.stdout


def test_a_damaged_run_record_is_named_and_the_other_runs_compared(tmp_path, sweep, capsys):
    shutil.copytree(sweep, tmp_path / "sweep")
    damaged = sorted(p for p in (tmp_path / "sweep").iterdir() if p.is_dir())[0]
    (damaged / "config.yaml").write_text("{not yaml: [")
    assert lab(["compare", str(tmp_path / "sweep"), "--out", str(tmp_path / "c")]) == 0
    assert f"left out: {damaged}/config.yaml cannot be read" in capsys.readouterr().err


def test_a_text_file_that_is_not_text_is_refused_naming_it_and_why(tmp_path):
    binary, latin = tmp_path / "a.txt", tmp_path / "b.txt"
    binary.write_bytes(b"words\x00\x01\x02")
    latin.write_bytes("caf\u00e9".encode("latin-1"))
    with pytest.raises(DataError, match=f"data.train_files: {binary} is binary, not text \\(a NUL byte at offset 5\\)"):
        check_text(str(binary), "data.train_files")
    with pytest.raises(DataError, match=f"{latin} is not UTF-8 text \\(byte 3 cannot be decoded\\)"):
        check_text(str(latin), "data.train_files")


QUICK = ["max_new_tokens=2", "num_samples=1"]  # an evaluation's samples cost most of its time


@pytest.fixture(scope="module")
def sharded_run(tmp_path_factory, cache_dir):
    """One tiny run with sharded checkpoints (.dcp at steps 2 and 4); read-only: tests change copies of it."""
    run = tmp_path_factory.mktemp("sharded") / "run"
    run_tiny(run, cache_dir, 4, "train.parallel=fsdp")
    return run


# (what checkpoint= names, in a folder of copies; the checkpoint it reads; the eval.json its entry lands in)
EVAL_JSON_BESIDE = [
    ("run", "run/checkpoints/step_0000004.dcp", "run/eval.json"),  # a run's newest: its run directory
    ("run/checkpoints/step_0000002.dcp", "run/checkpoints/step_0000002.dcp", "run/eval.json"),
    ("loose/step_0000004.dcp", "loose/step_0000004.dcp", "loose/eval.json"),  # beside a loose one, not inside it
    ("loose/model.pt", "loose/model.pt", "loose/eval.json"),  # and not in the folder above it
]


def test_eval_writes_each_eval_json_beside_its_checkpoint_and_nowhere_else(sharded_run, tmp_path):
    shutil.copytree(sharded_run, tmp_path / "run")
    shutil.copytree(sharded_run / "checkpoints" / "step_0000004.dcp", tmp_path / "loose" / "step_0000004.dcp")
    torch.save(read_checkpoint(sharded_run)[1], tmp_path / "loose" / "model.pt")  # whole, as eval.py reads it
    given = ",".join(str(tmp_path / name) for name, _, _ in EVAL_JSON_BESIDE)
    eval_script.run_eval(compose_eval(f"checkpoint=[{given}]", *QUICK), tmp_path / "out")
    expected: dict[str, set[str]] = {}
    for _, read, beside in EVAL_JSON_BESIDE:
        expected.setdefault(beside, set()).add(str(tmp_path / read))
    for beside, checkpoints in expected.items():
        assert {e["checkpoint"] for e in json.loads((tmp_path / beside).read_text()).values()} == checkpoints
    assert sorted(tmp_path.rglob("eval.json")) == sorted(tmp_path / p for p in [*expected, "out/eval.json"])


def _read_only(path):
    path.parent.chmod(0o555)


# (how <run>/eval.json is made hostile, what the one line says of it)
UNWRITABLE_EVAL_JSON = [
    pytest.param(lambda p: p.symlink_to(p.parent.parent / "outside.json"), "is a link to", id="a link out of the run"),
    pytest.param(lambda p: p.write_text('{"cut off'), "is not JSON (Unterminated string", id="not JSON"),
    pytest.param(lambda p: p.write_text("[1, 2]"), "holds no evaluations", id="JSON of another shape"),
    pytest.param(lambda p: p.mkdir(), "could not be written (Is a directory)", id="a folder"),
    pytest.param(
        _read_only,
        "could not be written (Permission denied)",
        id="a read-only run",
        marks=pytest.mark.skipif(os.geteuid() == 0, reason="root writes to read-only folders"),
    ),
]


@pytest.mark.parametrize("make, problem", UNWRITABLE_EVAL_JSON)
def test_an_eval_json_not_written_is_named_and_left_as_it_was_and_the_results_are_kept(
    sharded_run, tmp_path, capsys, make, problem
):
    run = tmp_path / "run"
    shutil.copytree(sharded_run, run)
    (tmp_path / "outside.json").write_text("{}")
    make(run / "eval.json")
    before = _hashes(tmp_path)
    try:
        with pytest.raises(eval_script.EvalWriteError) as refused:
            eval_script.run_eval(compose_eval(f"checkpoint={run}", *QUICK), tmp_path / "out")
    finally:
        run.chmod(0o755)
    message, out = str(refused.value), tmp_path / "out" / "eval.json"
    assert "\n" not in message and f"{run / 'eval.json'} {problem}" in message and f"saved in {out}" in message
    (kept,) = json.loads(out.read_text()).values()
    assert kept["step"] == 4 and f"{kept['val/loss']:.4f}" in capsys.readouterr().out  # saved, and printed
    assert {k: v for k, v in _hashes(tmp_path).items() if k != "out/eval.json"} == before


def test_eval_through_the_cli_exits_1_with_one_line_naming_the_file_it_did_not_write(sharded_run, tmp_path):
    run, out = tmp_path / "run", tmp_path / "out"
    shutil.copytree(sharded_run, run)
    (run / "eval.json").write_text("{cut off")
    result = _cli("eval.py", f"checkpoint={run}", *QUICK, f"hydra.run.dir={out}")
    errors = [line for line in (result.stdout + result.stderr).splitlines() if "ERROR" in line]
    assert result.returncode == 1 and errors == [errors[0]] and f"{run / 'eval.json'} is not JSON" in errors[0]
    assert "Traceback" not in result.stderr and "val/loss" in result.stdout
    assert (run / "eval.json").read_text() == "{cut off" and len(json.loads((out / "eval.json").read_text())) == 1


def test_a_checkpoint_converted_by_torchs_dcp_to_torch_save_is_refused_naming_what_it_lacks(
    sharded_run, tmp_path, capsys
):
    converted = tmp_path / "converted.pt"
    dcp_to_torch_save(sharded_run / "checkpoints" / "step_0000004.dcp", converted)
    lacks = f"{converted} is not a normlab checkpoint: it lacks step, model_config, config, tokenizer (it holds model, "
    with pytest.raises(CheckpointError, match=re.escape(lacks)):  # eval.py
        eval_script.run_eval(compose_eval(f"checkpoint={converted}", *QUICK), tmp_path / "out")
    assert export_hf.main([str(converted), str(tmp_path / "exported")]) == 1
    assert lacks in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["converted.pt"]


def test_an_export_target_that_is_a_file_is_refused_and_left_as_it_was(sharded_run, tmp_path, capsys):
    target = tmp_path / "exported"
    target.write_text("not a folder")
    assert export_hf.main([str(sharded_run), str(target)]) == 1
    assert f"{target} is a file, not a folder" in capsys.readouterr().err and target.read_text() == "not a folder"


def _data_path_a_folder(tmp_path, cache_dir):
    (tmp_path / "texts").mkdir()
    overrides = ["data=text_files", f"data.train_files=[{tmp_path / 'texts'}]"]
    return overrides, re.escape(f"data.train_files: {tmp_path / 'texts'} is a folder, not a file; name its files")


def _damaged_cached_tokenizer(tmp_path, cache_dir):
    cache = tmp_path / "cache"
    shutil.copytree(Path(cache_dir) / "tokenizers", cache / "tokenizers")
    for tokenizer in (cache / "tokenizers").iterdir():
        tokenizer.write_text('{"version": "1.0", "cut off')
    return [], f"the data cache: {cache}/tokenizers/bpe-.*json is not a tokenizer file"


def _tokenizer_a_folder(tmp_path, cache_dir):
    (tmp_path / "tokenizer.json").mkdir()
    return [f"data.tokenizer={tmp_path / 'tokenizer.json'}"], "tokenizer.json is a folder, not a regular file"


# How a new run's data is hostile: each makes it in a test's folder, and gives the overrides and the line expected.
HOSTILE_DATA = [
    pytest.param(_data_path_a_folder, id="a data path that is a folder"),
    pytest.param(_damaged_cached_tokenizer, id="a damaged tokenizer in the data cache"),
    pytest.param(_tokenizer_a_folder, id="a tokenizer path that is a folder"),
]


@pytest.mark.parametrize("make", HOSTILE_DATA)
def test_hostile_data_refuses_a_new_run_in_one_line_and_leaves_no_run_directory(sharded_run, cache_dir, tmp_path, make):
    overrides, message = make(tmp_path, cache_dir)  # sharded_run has put its tokenizer in cache_dir
    run_dir = tmp_path / "run"
    with pytest.raises(DataError) as refused:
        run_tiny(run_dir, str(tmp_path / "cache"), 2, *overrides)
    assert "\n" not in str(refused.value) and re.search(message, str(refused.value))
    discard_unused(run_dir)  # what train.py's main does for a refused new run: only an empty lock was left
    assert not run_dir.exists()


def test_a_train_log_that_links_out_of_the_run_refuses_the_resume_and_nothing_is_written(
    sharded_run, tmp_path, cache_dir
):
    run, outside = tmp_path / "run", tmp_path / "outside.log"
    shutil.copytree(sharded_run, run)
    shutil.rmtree(run / "checkpoints" / "step_0000004.dcp")  # killed after its step-2 checkpoint, as it were
    outside.write_text("another program's log\n")
    (run / "train.log").symlink_to(outside)
    before = _hashes(tmp_path)
    result = _cli("train.py", *tiny_overrides(cache_dir, 4, "train.parallel=fsdp"), f"hydra.run.dir={run}")
    errors = [line for line in (result.stdout + result.stderr).splitlines() if "ERROR" in line]
    assert result.returncode == 1 and errors == [errors[0]]
    assert f"{run / 'train.log'} is a link to {outside}" in errors[0] and "Traceback" not in result.stderr
    assert _hashes(tmp_path) == before  # the other file, and every file of the run


@pytest.mark.parametrize(
    "override, named",
    [
        ("run_name=../escape", "run_name='../escape' is not one folder name inside runs/"),
        ("run_name=" + "a" * 300, "is 300 bytes, past the 255 bytes a folder name may have"),
        ("-m run_name=ok," + "b" * 300, "is 300 bytes, past the 255 bytes a folder name may have"),
        ("norm=ngpt norm.placement=hybrid", "norm=ngpt is nGPT's own model (norm.placement=ngpt)"),
    ],
    ids=["run_name leaving runs", "run_name too long", "a sweep's run_name too long", "a contradiction"],
)
def test_a_config_refused_before_hydra_makes_the_run_folder_leaves_no_folder_at_all(override, named, tmp_path):
    """Run from an empty folder with the default hydra.run.dir (runs/<run_name>): neither runs/, nor ../escape, nor
    a traceback on a name too long for a folder."""
    work = tmp_path / "work"
    work.mkdir()
    flags = [arg for arg in override.split() if arg.startswith("-")]  # Hydra's own flags come first
    keys = [arg for arg in override.split() if not arg.startswith("-")]
    result = _cli(str(ROOT / "train.py"), *flags, "model=tiny", "logger=none", *keys, cwd=work)
    errors = [line for line in (result.stdout + result.stderr).splitlines() if "ERROR" in line]
    assert result.returncode == 1 and len(errors) == 1 and named in errors[0], result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["work"] and not any(work.iterdir())
