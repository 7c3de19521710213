"""Files are untrusted input: crafted pickles in a sharded checkpoint's .metadata or a whole checkpoint's data.pkl
never run, whichever allowed module they reach a builtin through, and each is refused in one line naming the file.

Each payload runs a command that would create a marker file. From protocol 4 on, a pickle may name
``os.system`` as an attribute path of any module that imports ``os``; a stealth payload runs its call, drops the
result and goes on to unpickle the real data, so nothing would look wrong if it ran."""

import io
import pickle
import zipfile

import export_hf
import pytest
import torch
import torch.distributed.checkpoint as dcp

from training.checkpoints.dcp_metadata import METADATA
from training.checkpoints.load import load_checkpoint, load_newest_readable
from training.checkpoints.sharded import HEADER, read_checkpoint
from training.errors import CheckpointError, UnsafeCheckpointError

pytestmark = [
    pytest.mark.filterwarnings("ignore:torch.distributed is .*uninitialized, assuming the intent is to"),
    pytest.mark.filterwarnings("ignore:Detected pickle protocol 4 in the checkpoint"),
]


def _call(module: str, name: str, argument: str) -> bytes:
    """Opcodes that import ``module``'s attribute path ``name`` (GLOBAL), call it with ``argument`` (BINUNICODE,
    TUPLE1, REDUCE) and drop the result (POP): opcodes both Python's unpickler and torch's weights-only one read."""
    text = argument.encode()
    return f"c{module}\n{name}\n".encode() + b"X" + len(text).to_bytes(4, "little") + text + b"\x85R0"


def _shell(marker) -> str:
    return f"touch {marker}"


def _python(marker) -> str:
    return f"open({str(marker)!r}, 'w')"


# (module, attribute path, how the argument makes the marker): each reaches code through a module that a
# checkpoint's unpickler might admit (DCP's metadata classes, torch, pathlib, torch's own helpers).
PAYLOADS = [
    ("torch.distributed.checkpoint.metadata", "os.system", _shell),
    ("torch.distributed.checkpoint.filesystem", "os.system", _shell),
    ("torch.serialization", "os.system", _shell),
    ("torch", "os.system", _shell),
    ("pathlib", "os.system", _shell),
    ("torch._utils", "os.system", _shell),
    ("torch", "builtins.eval", _python),
    ("torch", "builtins.exec", _python),
    ("builtins", "eval", _python),
    ("os", "system", _shell),
    ("posix", "system", _shell),
    ("subprocess", "getoutput", _shell),
]
IDS = [f"{module}:{name}" for module, name, _ in PAYLOADS]


def _payload(module, name, argument, real: bytes, stealth: bool) -> bytes:
    """A protocol-4 pickle (dotted names resolve as attribute paths) that runs the call; a stealth one then goes
    on into ``real``'s opcodes (protocol 2, whose body has no frames), so that its result is the real object."""
    body = real[2:] if stealth else b"N."  # the real pickle without its PROTO header, or None
    return b"\x80\x04" + _call(module, name, argument) + body


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """A run directory with two sharded checkpoints of tensors, as train.parallel=fsdp writes them."""
    run = tmp_path_factory.mktemp("run")
    for step in (1, 2):
        path = run / "checkpoints" / f"step_{step:07d}.dcp"
        dcp.save({"model": {"w": torch.full((3,), float(step))}}, checkpoint_id=path, no_dist=True)
        torch.save({"step": step, "model_config": {}}, path / HEADER)
    return run


def _restore(path, original: bytes):
    path.write_bytes(original)


@pytest.mark.parametrize("stealth", [False, True], ids=["plain", "stealth"])
@pytest.mark.parametrize("module, name, argument", PAYLOADS, ids=IDS)
def test_a_crafted_dcp_metadata_never_runs_and_is_refused_naming_the_file(
    sharded, tmp_path, module, name, argument, stealth
):
    marker = tmp_path / "ran"
    metadata = sharded / "checkpoints" / "step_0000002.dcp" / METADATA
    original = metadata.read_bytes()
    real = pickle.dumps(pickle.loads(original), protocol=2)
    metadata.write_bytes(_payload(module, name, argument(marker), real, stealth))
    try:
        with pytest.raises(UnsafeCheckpointError) as refused:  # what eval.py and the export read it with
            read_checkpoint(metadata.parent)
        message = str(refused.value)
        assert "\n" not in message and str(metadata) in message and f"{module}.{name}" in message
        # A resume passes over it, naming it, to the intact checkpoint before it.
        source, state = load_newest_readable(sharded)
        assert source.name == "step_0000001.dcp" and state["step"] == 1
        assert export_hf.main([str(metadata.parent), str(tmp_path / "exported")]) == 1
        assert not (tmp_path / "exported").exists()
    finally:
        _restore(metadata, original)
    assert not marker.exists()


def _rewrite_data_pkl(path, data: bytes) -> None:
    """Replace the pickle inside a torch.save zip file, keeping its other records."""
    records = {}
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            records[info.filename] = archive.read(info)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        for filename, content in records.items():
            archive.writestr(filename, data if filename.endswith("/data.pkl") else content)


@pytest.mark.parametrize("stealth", [False, True], ids=["plain", "stealth"])
@pytest.mark.parametrize("module, name, argument", PAYLOADS, ids=IDS)
def test_a_crafted_whole_checkpoint_never_runs_and_is_refused_naming_the_file(
    tmp_path, module, name, argument, stealth
):
    marker = tmp_path / "ran"
    state = {"step": 1, "model_config": {}, "model": {}}
    path = tmp_path / "run" / "checkpoints" / "step_0000001.pt"
    path.parent.mkdir(parents=True)
    torch.save(state, path)
    buffer = io.BytesIO()
    pickle.dump(state, buffer, protocol=2)
    _rewrite_data_pkl(path, _payload(module, name, argument(marker), buffer.getvalue(), stealth))
    with pytest.raises(UnsafeCheckpointError) as refused:
        load_checkpoint(path)
    assert "\n" not in str(refused.value) and str(path) in str(refused.value)
    assert export_hf.main([str(path), str(tmp_path / "exported")]) == 1
    assert not marker.exists()


def test_the_stealth_payload_is_real_a_plain_unpickler_runs_it_and_returns_the_data(tmp_path):
    """The oracle for the tests above: without our unpickler the same bytes run the command and read back as
    intact metadata, which is why a resume that ran one looked normal."""
    path = tmp_path / "step_0000001.dcp"
    dcp.save({"model": {"w": torch.ones(3)}}, checkpoint_id=path, no_dist=True)
    real = pickle.dumps(pickle.loads((path / METADATA).read_bytes()), protocol=2)
    marker = tmp_path / "ran"
    crafted = _payload("torch.distributed.checkpoint.metadata", "os.system", _shell(marker), real, stealth=True)
    metadata = pickle.loads(crafted)
    assert marker.exists() and "model.w" in metadata.state_dict_metadata


def test_metadata_pointing_outside_its_checkpoint_is_refused(tmp_path):
    path = tmp_path / "step_0000001.dcp"
    dcp.save({"model": {"w": torch.ones(3)}}, checkpoint_id=path, no_dist=True)
    torch.save({"step": 1}, path / HEADER)
    metadata = pickle.loads((path / METADATA).read_bytes())
    for info in metadata.storage_data.values():
        info.relative_path = "../../elsewhere.distcp"
    (path / METADATA).write_bytes(pickle.dumps(metadata))
    with pytest.raises(UnsafeCheckpointError, match="points outside it"):
        read_checkpoint(path)


@pytest.mark.parametrize(
    "arrange",
    [
        lambda metadata: setattr(metadata, "storage_data", {k: torch.Size([1]) for k in metadata.storage_data}),
        lambda metadata: setattr(metadata, "storage_data", [1]),
        lambda metadata: setattr(metadata, "state_dict_metadata", None),
    ],
    ids=["a size for a shard entry", "a list for the shard map", "no entries"],
)
def test_metadata_of_allowed_classes_in_another_arrangement_is_damaged_and_passed_over(sharded, arrange):
    """Only allowed classes, so the unpickler admits it: its shape is wrong, and the resume falls back."""
    file = sharded / "checkpoints" / "step_0000002.dcp" / METADATA
    original = file.read_bytes()
    metadata = pickle.loads(original)
    arrange(metadata)
    file.write_bytes(pickle.dumps(metadata))
    try:
        with pytest.raises(CheckpointError, match=f"could not read checkpoint .*: {METADATA} is damaged"):
            read_checkpoint(file.parent)
        source, _ = load_newest_readable(sharded)
        assert source.name == "step_0000001.dcp"
    finally:
        _restore(file, original)
