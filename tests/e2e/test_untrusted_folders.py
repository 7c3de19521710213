"""A model folder is input, an export target is someone's data, and nothing is read without a bound: hostile
folders and files built here (tiny models from transformers' configs, crafted safetensors, links, FIFOs), each
refused in one line that names the file, the key and the value, writing nothing; what is declared is checked
against what is held; allocations stay under an address-space cap."""

import json
import os
import resource
import shutil
import subprocess
import sys

import pytest
import torch
import yaml
from export_hf import main as export_hf
from import_hf import import_hf as import_folder
from import_hf import main as import_hf
from test_import_hf import cli, hf_model, hf_tensors, our_model, save, tokenizer_file  # noqa: F401  (fixtures)
from tiny_runs import ROOT, run_tiny

import eval as eval_script
from training.checkpoints.files import list_checkpoints
from training.checkpoints.load import load_checkpoint
from training.data.corpus import DataError
from training.input_files import InputFileError, read_text

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")
AS_CAP = 4 * 2**30  # bytes of address space: torch, transformers and a tiny model fit in 3 GiB


@pytest.fixture(scope="module")
def llama(tmp_path_factory, tokenizer_file):  # noqa: F811
    return save(hf_model("llama"), tmp_path_factory.mktemp("llama") / "hf", tokenizer_file)


def refused(result, *parts):
    """The one-line refusal of a script's main, naming every part."""
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    for part in parts:
        assert part in lines[0], lines[0]
    return lines[0]


def edit_config(folder, **changes):
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


def copy(folder, tmp_path):
    return shutil.copytree(folder, tmp_path / "hf", symlinks=True)


# --- nothing read or allocated without a bound ------------------------------------------------------------


def capped(*args: str) -> subprocess.CompletedProcess:
    """A Python command under the address-space cap: an allocation past it fails (MemoryError, or a crash)."""
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (AS_CAP, AS_CAP)),
        env={**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'scripts'}"},
    )


def test_a_context_of_two_billion_positions_builds_only_the_positions_used(llama, tmp_path):
    """RoPE's tables for every declared position would take 256 GiB: the import builds 8,192 positions, and the
    model extends its tables only when a sequence reaches past them."""
    folder = copy(llama, tmp_path)
    edit_config(folder, max_position_embeddings=2**31)
    result = capped("scripts/import_hf.py", str(folder), str(tmp_path / "run"), "--seq-len", "64")
    assert result.returncode == 0, result.stderr[-2000:]
    model = our_model(tmp_path / "run")
    assert model.rope_cos.shape[0] == 8192 and model.cfg.max_seq_len == 2**31
    short = model.rope_cos[:100].clone()
    model.rope(9000, 10)  # past the tables: extended, the rows before unchanged
    assert model.rope_cos.shape[0] == 16384 and torch.equal(model.rope_cos[:100], short)


def test_a_checkpoint_that_declares_a_huge_model_is_refused_before_any_memory_is_taken(tmp_path, cache_dir):
    run_tiny(tmp_path / "run", cache_dir, 2)
    state = load_checkpoint(tmp_path / "run")
    state["model_config"].update(d_model=2**16, n_layers=512)  # about 40 TB of weights, in a file of 1 MB
    torch.save(state, tmp_path / "huge.pt")
    result = capped("eval.py", f"checkpoint={tmp_path / 'huge.pt'}", f"hydra.run.dir={tmp_path / 'out'}")
    errors = [line for line in (result.stdout + result.stderr).splitlines() if "ERROR" in line]
    assert result.returncode == 1 and len(errors) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "huge.pt does not match the model its config describes: it has no layers.10" in errors[0]
    assert export_hf([str(tmp_path / "huge.pt"), str(tmp_path / "exported")]) == 1
    assert not (tmp_path / "exported").exists()


def _fifo(path):
    os.mkfifo(path)
    return path


def _dev_zero_link(path):
    path.symlink_to("/dev/zero")
    return path


ENDLESS = [pytest.param(_fifo, "is a FIFO", id="a FIFO"), pytest.param(_dev_zero_link, "is a device", id="/dev/zero")]


@pytest.mark.parametrize("make, kind", ENDLESS)
def test_a_file_that_never_ends_is_refused_before_it_is_opened(tmp_path, make, kind):
    path = make(tmp_path / "text.txt")
    with pytest.raises(InputFileError, match=f"^probe_text_file: {path} {kind}"):
        read_text(path, 1000, "probe_text_file")


@pytest.mark.parametrize("make, kind", ENDLESS)
def test_an_import_folder_whose_files_never_end_is_refused(llama, tmp_path, cli, make, kind):  # noqa: F811
    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        folder = copy(llama, tmp_path / name)
        (folder / name).unlink()
        make(folder / name)
        refused(cli(import_hf, folder, tmp_path / name / "run"), f"{folder / name} {kind}")
        assert not (tmp_path / name / "run").exists()


@pytest.mark.parametrize("make, kind", ENDLESS)
def test_a_training_file_that_never_ends_is_refused(tmp_path, cache_dir, make, kind):
    path = make(tmp_path / "corpus.txt")
    with pytest.raises(DataError, match=f"data.train_files: {path} {kind}"):
        run_tiny(tmp_path / "run", cache_dir, 2, "data=text_files", f"data.train_files=[{path}]")


def test_a_config_json_past_its_bound_is_refused_by_its_size(llama, tmp_path, cli):  # noqa: F811
    folder = copy(llama, tmp_path)
    edit_config(folder, padding="x" * 2**21)
    refused(cli(import_hf, folder, tmp_path / "run"), "config.json is 2.0 MiB, more than the 1.0 MiB")


def test_a_probe_text_too_long_for_the_context_is_refused_by_its_size_before_it_is_tokenized(
    tmp_path, cache_dir, monkeypatch
):
    run_tiny(tmp_path / "run", cache_dir, 2)
    (tmp_path / "long.txt").write_text("In the beginning " * 2**20)  # 17 MB
    monkeypatch.setattr("tokenizers.Tokenizer.encode", lambda *a: pytest.fail("the text was tokenized"))
    cfg = eval_config(f"checkpoint={tmp_path / 'run'}", f"probe_text_file={tmp_path / 'long.txt'}")
    with pytest.raises(eval_script.ProbeTextError, match=r"long.txt is 17.0 MiB, more than the 8.0 MiB"):
        eval_script.run_eval(cfg, tmp_path / "out")
    (tmp_path / "long.txt").write_text("In the beginning " * 2**14)  # 272 KB: under the bound, over the context
    cfg = eval_config(f"checkpoint={tmp_path / 'run'}", f"probe_text_file={tmp_path / 'long.txt'}")
    with pytest.raises(
        eval_script.ProbeTextError,
        match=r"is 278,528 bytes, more than 64 tokens of this checkpoint's tokenizer can hold",
    ):
        eval_script.run_eval(cfg, tmp_path / "out")


def eval_config(*overrides):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return eval_script.typed_eval_config(
            compose("eval", overrides=[*overrides, "max_new_tokens=2", "num_samples=1"])
        )


# --- an export target is someone's data ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def imported(llama, tmp_path_factory):
    run = tmp_path_factory.mktemp("imported") / "run"
    import_folder(llama, run)
    return run


def snapshot_of(folder, cache):
    """``folder`` laid out as a Hugging Face cache snapshot: every file a link to a blob the cache shares."""
    (cache / "blobs").mkdir(parents=True)
    snapshot = cache / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    for path in folder.iterdir():
        blob = cache / "blobs" / path.name
        shutil.copy(path, blob)
        (snapshot / path.name).symlink_to(os.path.relpath(blob, snapshot))
    return snapshot


def test_an_export_into_a_cache_snapshot_replaces_its_links_and_never_writes_through_them(
    imported,
    llama,
    tmp_path,
    cli,  # noqa: F811
):
    snapshot = snapshot_of(llama, tmp_path / "cache")
    blobs = {p.name: p.read_bytes() for p in (tmp_path / "cache" / "blobs").iterdir()}
    refused(cli(export_hf, imported, snapshot), "already holds weights (model.safetensors)", "--overwrite")
    assert cli(export_hf, imported, snapshot, "--overwrite").returncode == 0
    assert {p.name: p.read_bytes() for p in (tmp_path / "cache" / "blobs").iterdir()} == blobs  # untouched
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        assert not (snapshot / name).is_symlink() and (snapshot / name).is_file()
    assert hf_tensors(snapshot).keys() == hf_tensors(llama).keys()


def test_an_export_over_another_models_shards_leaves_none_of_them(imported, tmp_path, cli):  # noqa: F811
    other = tmp_path / "exported"
    hf_model("olmo2").save_pretrained(other, max_shard_size="100KB")
    assert (other / "model.safetensors.index.json").is_file()
    refused(cli(export_hf, imported, other), "already holds weights (model-00001-of-")
    assert cli(export_hf, imported, other, "--overwrite").returncode == 0
    assert sorted(p.name for p in other.glob("*.safetensors*")) == ["model.safetensors"]
    assert type(transformers.AutoModelForCausalLM.from_pretrained(other)).__name__ == "LlamaForCausalLM"


def test_an_export_target_that_is_a_link_is_refused(imported, tmp_path, cli):  # noqa: F811
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "exported").symlink_to(tmp_path / "elsewhere")
    refused(cli(export_hf, imported, tmp_path / "exported"), f"{tmp_path / 'exported'} is a link to")
    assert not any((tmp_path / "elsewhere").iterdir())


# --- what a folder declares must agree with what it holds -----------------------------------------------------


def _tensors(folder, change):
    tensors = hf_tensors(folder)
    change(tensors)
    for path in folder.glob("*.safetensors"):
        path.unlink()
    safetensors_torch.save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


def _nan(tensors):
    tensors["model.layers.1.mlp.up_proj.weight"][3, 5] = float("nan")


def _tied_with_its_own_head(folder):
    edit_config(folder, tie_word_embeddings=True)  # the weights keep a distinct lm_head.weight


def _index_pointing_outside(folder):
    hf_model("llama").save_pretrained(folder, max_shard_size="100KB")
    (folder / "model.safetensors").unlink(missing_ok=True)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    shard = index["weight_map"]["lm_head.weight"]
    shutil.move(folder / shard, folder.parent / "outside.safetensors")
    index["weight_map"] = {k: ("../outside.safetensors" if v == shard else v) for k, v in index["weight_map"].items()}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


def _both_layouts(folder):
    hf_model("olmo2").save_pretrained(folder.parent / "other", max_shard_size="100KB")
    for path in (folder.parent / "other").glob("model*"):
        shutil.copy(path, folder)


DECLARED_AGAINST_HELD = {
    "a NaN weight": (lambda f: _tensors(f, _nan), "model.layers.1.mlp.up_proj.weight holds non-finite values"),
    "integer weights": (
        lambda f: _tensors(f, lambda t: t.update({"model.norm.weight": t["model.norm.weight"].long()})),
        "model.norm.weight holds I64 values, not floats",
    ),
    "tied, with a head of its own": (_tied_with_its_own_head, "says tie_word_embeddings=true"),
    "a token id past the table": (lambda f: edit_config(f, vocab_size=256), "has token id 299 but config.json's"),
    "eos past the table": (lambda f: edit_config(f, eos_token_id=[2, 320]), "eos_token_id[1]=320 has no row"),
    "an index entry outside the folder": (_index_pointing_outside, "maps lm_head.weight to '../outside.safetensors'"),
    "one file and an index": (_both_layouts, "holds both model.safetensors and model.safetensors.index.json"),
    "eps a string": (
        lambda f: edit_config(f, rms_norm_eps="1e-6"),
        "config.json's rms_norm_eps='1e-6' is not a number",
    ),
    "eps zero": (lambda f: edit_config(f, rms_norm_eps=0), "config.json's rms_norm_eps=0 is not a number > 0"),
    "width a string": (lambda f: edit_config(f, hidden_size="64"), "hidden_size='64' is not a whole number >= 1"),
    "width a float": (lambda f: edit_config(f, hidden_size=64.0), "hidden_size=64.0 is not a whole number >= 1"),
    "tied a string": (lambda f: edit_config(f, tie_word_embeddings="false"), "tie_word_embeddings='false' is not"),
    "RoPE theta negative": (
        lambda f: edit_config(f, rope_parameters={"rope_type": "default", "rope_theta": -1.0}),
        "config.json's RoPE setting rope_theta=-1.0 is not a number > 0",
    ),
    "Llama 3 factors equal": (
        lambda f: edit_config(
            f,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 5e5,
                "factor": 8.0,
                "low_freq_factor": 4.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            },
        ),  # fmt: skip
        "high_freq_factor=4.0 must exceed low_freq_factor=4.0",
    ),
    "RoPE settings a list": (lambda f: edit_config(f, rope_parameters=[1]), "RoPE settings [1] are not a mapping"),
}


@pytest.mark.parametrize("case", DECLARED_AGAINST_HELD)
def test_a_folder_whose_declarations_do_not_agree_with_what_it_holds_is_refused(llama, tmp_path, cli, case):  # noqa: F811
    change, named = DECLARED_AGAINST_HELD[case]
    folder = copy(llama, tmp_path)
    change(folder)
    before = sorted(p.name for p in tmp_path.iterdir())
    refused(cli(import_hf, folder, tmp_path / "run"), named)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written, not even the run's folder


def test_a_tensor_in_two_shards_is_refused(llama, tmp_path, cli):  # noqa: F811
    folder = copy(llama, tmp_path)
    tensors = hf_tensors(folder)
    (folder / "model.safetensors").unlink()
    names = sorted(tensors)
    safetensors_torch.save_file({n: tensors[n] for n in names[:5]}, folder / "a.safetensors")
    safetensors_torch.save_file({n: tensors[n] for n in names[4:]}, folder / "b.safetensors")
    index = {"weight_map": {n: "a.safetensors" if n in names[:5] else "b.safetensors" for n in names}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    refused(cli(import_hf, folder, tmp_path / "run"), f"{names[4]} is in more than one shard")


@pytest.mark.parametrize(
    "kind, left_out, value",
    [("qwen3", "head_dim", 128), ("olmo2", "rms_norm_eps", 1e-5), ("llama", "rms_norm_eps", 1e-6)],
)
def test_a_key_left_out_takes_transformers_default_for_that_architecture(
    tmp_path,
    tokenizer_file,  # noqa: F811
    cli,  # noqa: F811
    kind,
    left_out,
    value,
):
    """Qwen3's head size is 128 whatever the width, OLMo 2's eps 1e-5: what transformers loads is what we build."""
    model = hf_model(kind if kind != "qwen3" else "qwen3, wider heads")
    config = model.config.to_dict()
    folder = tmp_path / "hf"
    if left_out == "head_dim":  # a model of transformers' default head size, so that the weights fit it
        model = transformers.AutoModelForCausalLM.from_config(
            transformers.Qwen3Config(**{**config, "head_dim": 128, "architectures": None})
        )
    save(model, folder, tokenizer_file)
    config = json.loads((folder / "config.json").read_text())
    config.pop(left_out)
    (folder / "config.json").write_text(json.dumps(config))
    assert cli(import_hf, folder, tmp_path / "run").returncode == 0
    ours, theirs = our_model(tmp_path / "run"), transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    assert getattr(theirs.config, left_out) == value
    ids = torch.randint(0, 300, (1, 12))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), theirs(ids).logits, atol=1e-5, rtol=1e-5)


# --- interrupted and repeated work ----------------------------------------------------------------------------


def test_what_a_killed_import_left_is_removed_and_a_ctrl_c_is_one_line(llama, tmp_path, cli, monkeypatch):  # noqa: F811
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    left = tmp_path / f".run.importing-{dead.pid}"  # what a SIGKILL mid-write leaves
    left.mkdir()
    (left / "config.yaml").write_text("half")
    monkeypatch.setattr("import_hf.open_weights", lambda folder: (_ for _ in ()).throw(KeyboardInterrupt))
    result = cli(import_hf, llama, tmp_path / "run")
    assert result.returncode == 130 and result.stderr.strip() == (
        f"import_hf: interrupted (Ctrl-C); nothing was imported into {tmp_path / 'run'}"
    )
    assert not left.exists() and not (tmp_path / "run").exists()


def test_pruning_after_a_fallback_keeps_the_configured_number_of_readable_checkpoints(tmp_path, cache_dir):
    run = tmp_path / "run"
    run_tiny(run, cache_dir, 6, "train.keep_checkpoints=2")  # step_4, step_6
    (run / "checkpoints" / "step_0000006.pt").write_bytes(b"damaged")
    # Resumed from step 4 with checkpoints every 3 steps: step 6 is never written again.
    run_tiny(run, cache_dir, 9, "train.keep_checkpoints=2", "train.checkpoint_every=3",
             "resume_with_changes=[train.max_steps]")  # fmt: skip
    kept = [p.name for p in list_checkpoints(run)]
    assert kept == ["step_0000006.pt", "step_0000009.pt"] and load_checkpoint(run / "checkpoints" / kept[1])
    assert (run / "checkpoints" / kept[0]).read_bytes() != b"damaged"  # step 6 rewritten by the resume
    (run / "checkpoints" / "step_0000009.pt").write_bytes(b"damaged")
    run_tiny(run, cache_dir, 10, "train.keep_checkpoints=2", "train.checkpoint_every=4",
             "resume_with_changes=[train.max_steps]")  # fmt: skip
    # Resumed from step 6 past the damaged step 9: steps 8 and 10 are the two readable ones kept.
    assert [p.name for p in list_checkpoints(run)] == ["step_0000008.pt", "step_0000009.pt", "step_0000010.pt"]


def test_every_checkpoint_given_to_eval_is_checked_before_any_is_evaluated(tmp_path, cache_dir):
    good = tmp_path / "good"
    run_tiny(good, cache_dir, 2)
    damaged = tmp_path / "damaged.pt"
    damaged.write_bytes(b"not a checkpoint")
    with pytest.raises(eval_script.CheckpointError, match=f"could not read checkpoint {damaged}: "):
        eval_script.run_eval(eval_config(f"checkpoint=[{good},{damaged}]"), tmp_path / "out")
    assert not (good / "eval.json").exists()


def test_eval_of_a_run_whose_checkpoints_are_all_damaged_is_one_line(tmp_path, cache_dir):
    run = tmp_path / "run"
    run_tiny(run, cache_dir, 4)
    for path in list_checkpoints(run):
        path.write_bytes(path.read_bytes()[:1000])  # truncated
    result = subprocess.run(
        [sys.executable, "eval.py", f"checkpoint={run}", f"hydra.run.dir={tmp_path / 'out'}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    errors = [line for line in (result.stdout + result.stderr).splitlines() if "ERROR" in line]
    assert result.returncode == 1 and len(errors) == 1, result.stdout + result.stderr
    assert "none of the 2 checkpoints in" in errors[0] and "step_0000004.pt" in errors[0]
    assert "Weights only load failed" not in result.stdout + result.stderr
    assert (result.stdout + result.stderr).count("\n") <= 2


def test_a_checkpoint_whose_tokenizer_is_damaged_is_one_line_under_eval(tmp_path, cache_dir):
    run_tiny(tmp_path / "run", cache_dir, 2)
    state = load_checkpoint(tmp_path / "run")
    state["tokenizer"] = '{"version": "1.0", "cut'
    torch.save(state, tmp_path / "bad.pt")
    with pytest.raises(eval_script.CheckpointError, match="carries a tokenizer that cannot be read") as err:
        eval_script.run_eval(eval_config(f"checkpoint={tmp_path / 'bad.pt'}"), tmp_path / "out")
    assert "\n" not in str(err.value)


def test_the_import_record_says_what_it_read(imported, llama):
    record = yaml.safe_load((imported / "config.yaml").read_text())
    assert record["runtime"]["imported_from"]["folder"] == str(llama.resolve())


@pytest.mark.parametrize(
    "arguments, named",
    [
        (["--budget-s", "0"], "--budget-s 0.0 is not a number of seconds > 0"),
        (["--budget-s", "-60"], "--budget-s -60.0 is not a number of seconds > 0"),
        (["--budget-s", "inf"], "--budget-s inf is not a number of seconds > 0"),
        (["--out", "{file}"], "is a file, not a folder"),
        (["--out", "{link}"], "is a link to"),
    ],
)
def test_the_gpu_command_refuses_what_cannot_work_before_its_first_stage(tmp_path, capsys, arguments, named):
    import gpu_check

    (tmp_path / "file").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    given = [a.format(file=tmp_path / "file", link=tmp_path / "link") for a in arguments]
    assert gpu_check.main(["--dry-run", *given]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("gpu_check: ") and named in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "link"]
