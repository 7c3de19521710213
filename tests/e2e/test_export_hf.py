"""scripts/export_hf.py on real checkpoints: transformers loads the folder and agrees with us."""

import dataclasses
import re
import subprocess

import pytest
import torch
from export_hf import main as export_hf
from tiny_runs import run_tiny

from model import Transformer
from model.from_state import model_config_of
from training.checkpoints.load import load_checkpoint

transformers = pytest.importorskip("transformers")


@pytest.fixture
def export_cli(capsys):
    """scripts/export_hf.py's main, in this process (its command line is argparse's, nothing more): the exit
    status and what it wrote to stderr."""

    def run(run_dir, out_dir, *options) -> subprocess.CompletedProcess:
        capsys.readouterr()
        code = export_hf([str(run_dir), str(out_dir), *options])
        return subprocess.CompletedProcess([], code, "", capsys.readouterr().err)

    return run


VARIANTS = {
    "llama": ("norm=rmsnorm",),
    "llama from fused_rmsnorm": ("norm=fused_rmsnorm",),
    "qwen3": ("norm=rmsnorm", "norm.qk=rmsnorm"),
    "olmo2": ("norm=rmsnorm", "norm.placement=reordered", "norm.qk=rmsnorm", "norm.qk_axis=all"),
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_exported_checkpoint_loads_in_transformers_with_same_logits(tmp_path, cache_dir, export_cli, variant):
    run_tiny(tmp_path / "run", cache_dir, 2, *VARIANTS[variant])
    result = export_cli(tmp_path / "run", tmp_path / "hf")
    assert result.returncode == 0, result.stderr

    state = load_checkpoint(tmp_path / "run")
    saved = model_config_of(state["model_config"], "the test's")
    ours = Transformer(dataclasses.replace(saved, norm=dataclasses.replace(saved.norm, name="rmsnorm"))).eval()
    ours.load_state_dict(state["model"])
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert type(theirs).__name__.lower().startswith(variant.split()[0])
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    ids = torch.tensor([tokenizer("In the beginning God created the heaven")["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(theirs(ids).logits, ours(ids), atol=1e-5, rtol=1e-5)
    assert tokenizer.decode(ids[0]) == "In the beginning God created the heaven"


@pytest.mark.parametrize(
    "overrides, reason",
    [
        (("norm=layernorm",), "LayerNorm.*no equivalent in Hugging Face's Llama, Qwen3 or OLMo 2"),
        (("norm.placement=peri",), "placement 'peri' with QK-norm none has no Hugging Face equivalent"),
        (("norm=ngpt",), r"nGPT \(norm=ngpt\) has no equivalent in Hugging Face's"),
    ],
)
def test_export_of_a_variant_without_a_twin_stops_with_the_reason(tmp_path, cache_dir, export_cli, overrides, reason):
    run_tiny(tmp_path / "run", cache_dir, 2, *overrides)
    result = export_cli(tmp_path / "run", tmp_path / "hf")
    assert result.returncode == 1
    assert re.search(reason, result.stderr), result.stderr
    assert not (tmp_path / "hf").exists()  # refused before anything was written


def test_folded_gains_export_as_ones_with_the_same_logits(tmp_path, cache_dir, export_cli):
    run_tiny(tmp_path / "run", cache_dir, 2, "norm=rmsnorm", "train.lr=0.03")  # gains that moved from one
    assert export_cli(tmp_path / "run", tmp_path / "hf", "--fold-gains").returncode == 0
    state = load_checkpoint(tmp_path / "run")
    ours = Transformer(model_config_of(state["model_config"], "the test's")).eval()
    ours.load_state_dict(state["model"])
    assert any((norm.weight - 1).abs().max() > 1e-3 for norm in ours.norm_modules().values())
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert not theirs.config.tie_word_embeddings  # the head took the final norm's gain
    norms = {name: p for name, p in theirs.named_parameters() if "norm" in name}
    assert norms and all(torch.equal(p, torch.ones_like(p)) for p in norms.values())
    ids = torch.randint(0, 97, (1, 16))
    with torch.no_grad():
        assert (theirs(ids).logits - ours(ids)).abs().max().item() < 1e-4


def test_a_model_whose_gains_cannot_fold_is_refused_naming_the_norm(tmp_path, cache_dir, export_cli):
    run_tiny(tmp_path / "run", cache_dir, 2, "norm.placement=post")
    result = export_cli(tmp_path / "run", tmp_path / "hf", "--fold-gains")
    assert result.returncode == 1
    assert "cannot fold layers.0.attn_out_norm's gain: its output joins the residual stream" in result.stderr
    assert not (tmp_path / "hf").exists()
