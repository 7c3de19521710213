"""Choosing a switch imports its variant's file alone, and the core imports none by name.

Each config below is composed and its model, hooks and optimizer built in one child interpreter, which forgets
every variants module between configs; the variants' modules each config loaded must be exactly its own. The default path's closure is
test_core_size.py's, which also refuses any module of variants/.
"""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

BUILD = """
import json, sys, torch
from hydra import compose, initialize_config_dir
from model import build_model
from training.config import model_config, register_configs, typed_config
from training.step.distributed import Distributed
from training.step.optim import build_optimizer
from training.step.post_step import post_step_hooks
register_configs()
loaded = {}
with initialize_config_dir(config_dir=sys.argv[1], version_base=None):
    for override in sys.argv[2:]:
        for name in [m for m in sys.modules if m == "variants" or m.startswith("variants.")]:
            del sys.modules[name]
        cfg = typed_config(compose("config", overrides=[override, "model=tiny", "logger=none"]))
        model = build_model(model_config(cfg, 512))
        post_step_hooks(model, cfg.train, Distributed())
        build_optimizer(model, cfg.train, torch.device("cpu"))
        loaded[override] = sorted(m for m in sys.modules if m.startswith("variants."))
print("VARIANTS=" + json.dumps(loaded))
"""

CHOICES = {
    "norm.placement=hybrid_star": ["variants.hybridnorm"],
    "norm.placement=deepnorm": ["variants.deepnorm"],
    "norm.placement=mix_ln": ["variants.mix_ln"],
    "norm.depth_scaling=inverse_sqrt": ["variants.layernorm_scaling"],
    "norm.after_linear=rmsnorm": ["variants.simplenorm"],
    "model.attn_gate=headwise": ["variants.gated_attention"],
    "model.attn_sink=learned": ["variants.attention_sinks"],
    "model.attn_softcap=30": ["variants.score_softcap"],
    "model.residual_scale=0.2": ["variants.op_block"],
    "norm=ngpt": ["variants.ngpt"],
    "train.qk_clip=50": ["variants.qk_clip"],
    "train.optimizer=muon": ["variants.muon"],
    "norm=rmsnorm": [],
}


@pytest.fixture(scope="module")
def loaded_variants() -> dict[str, list[str]]:
    command = [sys.executable, "-c", BUILD, str(ROOT / "configs"), *CHOICES]
    out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    line = next((x for x in out.stdout.splitlines() if x.startswith("VARIANTS=")), None)
    assert line is not None, out.stderr[-2000:]
    return json.loads(line.removeprefix("VARIANTS="))


@pytest.mark.parametrize("override", list(CHOICES))
def test_a_switch_imports_its_own_file_and_no_other(override, loaded_variants):
    assert loaded_variants[override] == CHOICES[override]


def test_the_core_names_variants_only_as_import_paths():
    """No module of norms/, model/ or training/ imports variants/ (a string "variants.x:Name" is no import)."""
    importers = []
    for layer in ("norms", "model", "training"):
        for path in (ROOT / layer).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                names += [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
                importers += [str(path.relative_to(ROOT)) for name in names if name.split(".")[0] == "variants"]
    assert not importers
