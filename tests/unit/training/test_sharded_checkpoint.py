"""training/checkpoints/sharded.py: .dcp checkpoints written atomically, read whole without a process group,
restored exactly, and read as data only."""

import os
import pickle

import pytest
import torch
import torch.distributed.checkpoint as dcp

from model import ModelConfig, NormConfig, build_model
from training.checkpoints.files import list_checkpoints, remove_partial_checkpoints
from training.checkpoints.load import load_newest_readable
from training.checkpoints.sharded import HEADER, read_checkpoint, restore_into, save_sharded
from training.errors import CheckpointError, UnsafeCheckpointError
from training.step.distributed import Distributed

# One process writing and reading every shard is what these tests mean (training/checkpoints/sharded.py says so too).
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is .*uninitialized, assuming the intent is to")


def _model_and_optimizer(seed: int = 0):
    torch.manual_seed(seed)
    cfg = ModelConfig(
        vocab_size=64,
        d_model=32,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        max_seq_len=16,
        norm=NormConfig(name="layernorm"),
    )
    model = build_model(cfg)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _step(model, optimizer, seed: int = 1) -> None:
    tokens = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(seed))
    model(tokens[:, :-1], tokens[:, 1:]).objective.backward()
    optimizer.step()
    optimizer.zero_grad()


def _save(run_dir, model, optimizer, step: int, keep: int = 2):
    header = {
        "step": step,
        "rng": {},
        "model_config": model.cfg.to_dict(),
        "config": {},
        "tokenizer": "",
        "elapsed_s": 1.0,
    }
    return save_sharded(run_dir, header, model, optimizer, keep, Distributed())


def test_one_process_writes_keeps_the_newest_and_reads_back_exactly(tmp_path):
    model, optimizer = _model_and_optimizer()
    for step in (1, 2, 3):
        _step(model, optimizer, step)
        _save(tmp_path, model, optimizer, step)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_0000002.dcp", "step_0000003.dcp"]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_0000002.dcp", "step_0000003.dcp"]

    _, whole = read_checkpoint(tmp_path)  # the newest, whole, as eval.py and the export read it
    assert whole["step"] == 3 and whole["model_config"] == model.cfg.to_dict()
    assert whole["model"].keys() == model.state_dict().keys()
    assert all(torch.equal(whole["model"][k], v) for k, v in model.state_dict().items())

    source, header = load_newest_readable(tmp_path)
    fresh, fresh_optimizer = _model_and_optimizer(seed=1)
    restore_into(source, header, fresh, fresh_optimizer)
    assert all(torch.equal(a, b) for a, b in zip(fresh.parameters(), model.parameters()))
    _step(model, optimizer, 4)  # the moments came back too: the next step is the same step
    _step(fresh, fresh_optimizer, 4)
    assert all(torch.equal(a, b) for a, b in zip(fresh.parameters(), model.parameters()))


def test_a_killed_save_leaves_a_temp_directory_that_is_no_checkpoint_and_is_cleaned(tmp_path):
    model, optimizer = _model_and_optimizer()
    _step(model, optimizer)
    _save(tmp_path, model, optimizer, 1)
    partial = tmp_path / "checkpoints" / ".step_0000002.dcp.tmp"
    partial.mkdir()
    (partial / "__0_0.distcp").write_bytes(b"half")
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_0000001.dcp"]
    remove_partial_checkpoints(tmp_path)
    assert not partial.exists()


class _RunsCode:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_metadata_that_would_run_code_is_refused_and_never_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model, optimizer = _model_and_optimizer()
    _step(model, optimizer)
    path = _save(tmp_path, model, optimizer, 1)
    (path / ".metadata").write_bytes(pickle.dumps(_RunsCode()))
    with pytest.raises(UnsafeCheckpointError, match="names posix.system"):
        read_checkpoint(path)
    assert not (tmp_path / "pwned").exists()


def test_non_tensor_entries_are_refused(tmp_path):
    path = tmp_path / "step_0000001.dcp"
    dcp.save({"model": {"w": torch.ones(2)}, "note": "a string DCP would unpickle"}, checkpoint_id=path)
    torch.save({"step": 1}, path / HEADER)
    with pytest.raises(UnsafeCheckpointError, match="non-tensor entries \\(note\\)"):
        read_checkpoint(path)


def test_a_directory_without_its_header_is_not_read(tmp_path):
    (tmp_path / "checkpoints" / "step_0000001.dcp").mkdir(parents=True)
    with pytest.raises(CheckpointError, match="none of the 1 checkpoints in .* can be read .*header.pt does not exist"):
        read_checkpoint(tmp_path)


def test_a_shard_damaged_inside_is_one_line_not_torchs_traceback_of_every_rank(tmp_path):
    """Its length is intact, so only reading it finds the damage: DCP raises a CheckpointException, a
    BaseException, which becomes one CheckpointError naming the checkpoint."""
    model, optimizer = _model_and_optimizer()
    _step(model, optimizer)
    path = _save(tmp_path, model, optimizer, 1)
    (shard,) = path.glob("*.distcp")
    shard.write_bytes(bytes(shard.stat().st_size))  # zeros where the tensors were
    with pytest.raises(CheckpointError) as refused:
        read_checkpoint(path)
    assert str(refused.value).startswith(f"could not read checkpoint {path} (") and "\n" not in str(refused.value)
