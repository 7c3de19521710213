"""training/step/optim.py: the bytes per process that a run record reports (runtime.memory_per_rank)."""

from types import SimpleNamespace

import torch

from model import ModelConfig, Transformer
from training.step.optim import build_optimizer, memory_per_rank
from variants.muon import block_matrices


def _train_cfg(optimizer: str = "muon") -> SimpleNamespace:
    muon = SimpleNamespace(momentum=0.95, nesterov=True, ns_steps=5, adjust_lr_fn="match_rms_adamw", weight_decay=None)
    return SimpleNamespace(
        optimizer=optimizer, muon=muon, lr=0.02, weight_decay=0.1, weight_decay_mode="coupled", beta1=0.9, beta2=0.95,
        decay_norms_and_embeddings=False,
    )  # fmt: skip


def _model() -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=16))


def test_adamw_keeps_two_moments_per_parameter():
    model = _model()
    memory = memory_per_rank(model, build_optimizer(model, _train_cfg(optimizer="adamw"), torch.device("cpu")))
    params = sum(p.numel() * 4 for p in model.parameters())  # float32, the tied embedding once
    assert memory == {"param_bytes": params, "grad_bytes": params, "optimizer_state_bytes": 2 * params}


def test_muon_keeps_one_momentum_per_matrix_and_adamw_two_moments_for_the_rest():
    model = _model()
    memory = memory_per_rank(model, build_optimizer(model, _train_cfg(), torch.device("cpu")))
    params = sum(p.numel() * 4 for p in model.parameters())
    matrices = sum(param[rows].numel() * 4 for _, param, rows in block_matrices(model))
    assert memory["optimizer_state_bytes"] == matrices + 2 * (params - matrices)
