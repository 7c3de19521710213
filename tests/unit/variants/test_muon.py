"""variants/muon.py: Muon for the blocks' matrices beside AdamW, as training/step/optim.py builds it."""

import copy
from types import SimpleNamespace

import pytest
import torch

from model import ModelConfig, NormConfig, Transformer
from training.step.optim import build_optimizer, optimizer_groups
from variants.muon import MuonWithAdamW, block_matrices

CPU = torch.device("cpu")


def _train_cfg(**changes):
    muon = SimpleNamespace(momentum=0.95, nesterov=True, ns_steps=5, adjust_lr_fn="match_rms_adamw", weight_decay=None)
    cfg = dict(
        optimizer="muon", muon=muon, lr=0.02, weight_decay=0.1, weight_decay_mode="coupled", beta1=0.9, beta2=0.95,
        decay_norms_and_embeddings=False,
    )  # fmt: skip
    cfg.update(changes)
    return SimpleNamespace(**cfg)


def _model(**changes) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=16, norm=NormConfig(name="dyt")
    )
    cfg.mlp_multiple_of = 16
    for key, value in changes.items():
        setattr(cfg, key, value)
    return Transformer(cfg)


def _loss(model: Transformer, seed: int = 1) -> torch.Tensor:
    tokens = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(seed))
    return model(tokens[:, :-1], tokens[:, 1:]).objective


def test_muon_gets_the_blocks_matrices_per_logical_matrix_and_adamw_the_rest():
    model = _model()
    groups = optimizer_groups(build_optimizer(model, _train_cfg(), CPU), model)
    assert groups["muon"][:7] == [
        "layers.0.attn.qkv_proj.weight[q]", "layers.0.attn.qkv_proj.weight[k]", "layers.0.attn.qkv_proj.weight[v]",
        "layers.0.attn.o_proj.weight", "layers.0.mlp.gate_up_proj.weight[gate]", "layers.0.mlp.gate_up_proj.weight[up]",
        "layers.0.mlp.down_proj.weight",
    ]  # fmt: skip
    # Embeddings (tied to the head), norm gains and DyT's scalars: AdamW. Every parameter exactly once.
    assert "tok_embeddings.weight" in groups["adamw"] and "layers.0.attn_norm.alpha" in groups["adamw"]
    whole = {name.split("[")[0] for name in groups["muon"]} | set(groups["adamw"])
    assert whole == {name for name, _ in model.named_parameters()} and not set(groups["muon"]) & set(groups["adamw"])
    rows = {name: piece for name, _, piece in block_matrices(model)}
    assert rows["layers.0.attn.qkv_proj.weight[k]"] == slice(4 * 8, 4 * 8 + 2 * 8)  # q: 4 heads x 8, then 2 kv heads


def test_a_fused_weight_moves_as_muon_moves_its_matrices_one_by_one():
    """The oracle: torch.optim.Muon on separate q, k, v (and gate, up) matrices with the same gradients."""
    model = _model()
    _loss(model).backward()
    separate = {}
    for name, param, rows in block_matrices(model):
        matrix = torch.nn.Parameter(param.detach()[rows].clone())
        matrix.grad = param.grad[rows].clone()
        separate[name] = matrix
    reference = torch.optim.Muon(list(separate.values()), lr=0.02, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")
    reference.step()
    fused_weight_before = model.layers[0].attn.qkv_proj.weight.detach().clone()
    build_optimizer(model, _train_cfg(), CPU).step()
    for name, param, rows in block_matrices(model):
        torch.testing.assert_close(param.detach()[rows], separate[name].detach(), rtol=0, atol=0)
    # Orthogonalizing the fused q|k|v as one matrix would have moved it differently.
    whole = torch.nn.Parameter(fused_weight_before)
    whole.grad = torch.cat([separate[f"layers.0.attn.qkv_proj.weight[{p}]"].grad for p in "qkv"])
    torch.optim.Muon([whole], lr=0.02, weight_decay=0.1, adjust_lr_fn="match_rms_adamw").step()
    assert not torch.allclose(whole.detach(), model.layers[0].attn.qkv_proj.weight.detach())


@pytest.mark.parametrize("mode, expected", [("coupled", 0.1), ("independent", 0.1 / 0.02)])
def test_muon_decays_in_the_configured_mode(mode, expected):
    optimizer = build_optimizer(_model(), _train_cfg(weight_decay_mode=mode), CPU)
    assert optimizer.muon.param_groups[0]["weight_decay"] == pytest.approx(expected)
    own = _train_cfg(muon=SimpleNamespace(**{**vars(_train_cfg().muon), "weight_decay": 0.0}))
    assert build_optimizer(_model(), own, CPU).muon.param_groups[0]["weight_decay"] == 0.0


def test_both_optimizers_states_round_trip_and_the_run_continues_bit_for_bit():
    def steps(model, optimizer, seeds):
        for seed in seeds:
            _loss(model, seed).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    model = _model()
    optimizer = build_optimizer(model, _train_cfg(), CPU)
    steps(model, optimizer, [1, 2])
    saved_model, saved_optimizer = copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict())
    assert set(saved_optimizer) == {"muon", "adamw"} and saved_optimizer["muon"]["state"]  # momentum buffers
    steps(model, optimizer, [3, 4])
    resumed = _model()
    resumed.load_state_dict(saved_model)
    again = build_optimizer(resumed, _train_cfg(), CPU)
    again.load_state_dict(saved_optimizer)
    steps(resumed, again, [3, 4])
    for (name, a), (_, b) in zip(model.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(a, b), name


def test_the_schedule_reaches_both_optimizers():
    optimizer = build_optimizer(_model(), _train_cfg(), CPU)
    assert isinstance(optimizer, MuonWithAdamW) and len(optimizer.param_groups) == 1 + 2
    for group in optimizer.param_groups:
        group["lr"] = 0.5
    assert optimizer.muon.param_groups[0]["lr"] == optimizer.adamw.param_groups[1]["lr"] == 0.5


def test_adamw_stays_the_default_with_its_checkpoint_format():
    model = _model()
    optimizer = build_optimizer(model, _train_cfg(optimizer="adamw"), CPU)
    assert isinstance(optimizer, torch.optim.AdamW) and set(optimizer.state_dict()) == {"state", "param_groups"}
    assert optimizer_groups(optimizer, model) == {"adamw": [name for name, _ in model.named_parameters()]}


def test_zero_grad_clears_the_models_own_gradients_not_only_muons_views():
    """Muon's parameters are views; the loop's zero_grad must still clear the fused weights' gradients, or
    every step would add the previous steps' gradients to its own."""
    model = _model()
    optimizer = build_optimizer(model, _train_cfg(), CPU)
    _loss(model).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    assert all(param.grad is None for param in model.parameters())
