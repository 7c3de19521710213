"""The path every GPU run takes by default: torch.compile'd training, and the GPU configs.

CI has no GPU, so the GPU path is checked as far as a CPU can: a compiled tiny model trains and
matches eager step for step, and the GPU presets compose and build (on the meta device).
"""

from __future__ import annotations

import pytest
import torch
from tiny_runs import compose_config, read_metrics, run_tiny

from model import build_model
from model.loss import fused_linear_cross_entropy
from training.config import model_config
from training.run.runtime import should_compile
from training.run.setup import resolve_settings
from training.step.distributed import Distributed

STEPS = 4
# Every logit control compiled at once (z-loss, both soft-caps and QK-clip's max-logit tracking
# and rescaling), with the attention's output gate and learned sinks (the explicit softmax path the cap
# takes too): one compilation instead of one per switch.
LOGIT_CONTROLS = (
    "train.z_loss=1e-4",
    "model.logit_softcap=30",
    "model.attn_softcap=50",
    "train.qk_clip=0.05",
    "model.attn_gate=elementwise",
    "model.attn_sink=learned",
)  # tiny: clips


@pytest.mark.parametrize("z_loss", [0.0, 1e-4])
def test_compiled_loss_keeps_the_objective_differentiable(z_loss):
    """The crash of issue 26: with z-loss off, compile folded ``ce + 0`` into ``ce`` and returned one tensor
    as both the objective and the non-differentiable cross-entropy, which took the objective's gradient."""
    torch.manual_seed(0)
    hidden = torch.randn(24, 8, requires_grad=True)
    weight = torch.randn(30, 8, requires_grad=True)
    targets = torch.randint(0, 30, (24,))

    def loss(h, w):
        terms = fused_linear_cross_entropy(h, w, targets, z_loss, None, 8)
        return terms.objective, terms.cross_entropy

    objective, ce = torch.compile(loss, backend="aot_eager")(hidden, weight)
    assert objective.requires_grad and not ce.requires_grad
    (grad_compiled,) = torch.autograd.grad(objective, hidden)
    eager, _ = loss(hidden, weight)
    (grad_eager,) = torch.autograd.grad(eager, hidden)
    torch.testing.assert_close(grad_compiled, grad_eager)
    assert objective.item() == pytest.approx(eager.item(), rel=1e-6)


# Two compilations (each about 30 s cold on CPU) that between them compile every piece of the default model: its
# blocks, with the logit controls (through the explicit softmax), and SDPA, in HybridNorm* (a pre-norm first block
# and HybridNorm's after it, q, k and v normalized in each).
@pytest.mark.parametrize(
    "controls", [LOGIT_CONTROLS, ("norm.placement=hybrid_star",)], ids=["logit_controls", "hybrid_star"]
)
def test_compiled_training_matches_eager_at_every_step(controls, tmp_path, cache_dir):
    """Inductor reorders float reductions, so the losses agree to float tolerance, not bit for bit."""
    extra = ("norm=rmsnorm", *controls)
    run_tiny(tmp_path / "eager", cache_dir, STEPS, *extra, "train.compile=false")
    run_tiny(tmp_path / "compiled", cache_dir, STEPS, *extra, "train.compile=true")
    eager, compiled = read_metrics(tmp_path / "eager"), read_metrics(tmp_path / "compiled")
    losses = [[row["train/loss"] for row in rows if "train/loss" in row] for rows in (eager, compiled)]
    assert len(losses[0]) == STEPS
    assert losses[1] == pytest.approx(losses[0], rel=1e-4)
    # Probes run on the uncompiled module that shares the compiled one's weights: the same keys.
    assert {key for row in compiled for key in row} == {key for row in eager for key in row}
    if controls == LOGIT_CONTROLS:  # QK-clip read the compiled forward's tracked logits, and clipped the same heads
        clipped = [[row["train/qk_clipped_heads"] for row in rows if "train/loss" in row] for rows in (eager, compiled)]
        assert clipped[1] == clipped[0] and sum(clipped[0]) > 0


@pytest.mark.parametrize(
    "overrides",
    [("train=gpu", "model=gpu_125m", "data.vocab_size=32768"), ("+experiment=stability_gpu", "+variant=rmsnorm_qk")],
    ids=["gpu_125m", "stability_gpu"],
)
def test_the_gpu_recipes_compose_and_build(overrides):
    """The README's GPU commands fail here, in CI, rather than on a user's first GPU step."""
    cfg = compose_config(*overrides)
    cuda = torch.device("cuda")
    settings = resolve_settings(cfg, Distributed(), cuda)  # builds the model on the meta device
    assert settings.precision == "bf16"
    assert should_compile(cfg.train.compile, cuda, cfg.train.max_steps)
    assert settings.tokens_per_step == cfg.train.global_batch_tokens
    with torch.device("meta"):
        model = build_model(model_config(cfg, cfg.data.vocab_size))
    if cfg.model.name == "gpu_125m":  # counted by hand: tied embeddings, GQA 12/4 heads, SwiGLU hidden 2048
        d, vocab, layer = 768, 32768, 768 * (12 + 2 * 4) * 64 + 768 * 768 + 3 * 768 * 2048 + 2 * 768
        assert sum(p.numel() for p in model.parameters()) == vocab * d + 12 * layer + d
