"""training/step/fsdp.py: what runs sharded, what stays float32 under a bf16 policy, and what is refused.

A one-process gloo group is enough to shard for real (one shard each): the mixed-precision groups, their
dtypes in the forward pass and the optimizer's steps behave as at any world size. Runs at two ranks
against one process are in tests/e2e/test_fsdp.py.
"""

import pytest
import torch
import torch.distributed as dist
from hydra.errors import ConfigCompositionException
from tiny_runs import compose_config, run_tiny
from torch import nn
from torch.distributed.tensor import DTensor

from model import ModelConfig, NormConfig, build_model
from norms import Norm
from training.config import ConfigError
from training.step.distributed import Distributed
from training.step.fsdp import full_precision_modules, shard

CPU = torch.device("cpu")


# Our blocks never modify a norm's output in place, the one case in which FSDP2's warning matters.
pytestmark = pytest.mark.filterwarnings("ignore:FSDP2-wrapped module .* returned a view tensor")


@pytest.fixture
def process_group(tmp_path):
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield Distributed(0, 0, 1)
    dist.destroy_process_group()


def _model(norm: NormConfig | str = "rmsnorm", **changes) -> nn.Module:
    torch.manual_seed(0)
    norm = NormConfig(name=norm) if isinstance(norm, str) else norm
    shape = dict(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=16)
    return build_model(ModelConfig(**{**shape, **changes}, norm=norm))


def _tokens(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(seed))


def _kept_float32(model: nn.Module) -> dict[str, nn.Module]:
    return {name: m for name, m in model.named_modules() if m in full_precision_modules(model)}


def _forward_dtypes(model: nn.Module) -> dict[str, dict[str, torch.dtype]]:
    """Each module's own parameters' dtypes as its forward sees them (hooks after FSDP's all-gather)."""
    seen = {}

    def record(name):
        def hook(module, args) -> None:  # a pre-hook's return value would replace the arguments
            seen.setdefault(name, {p: t.dtype for p, t in module.named_parameters(recurse=False)})

        return hook

    handles = [m.register_forward_pre_hook(record(n)) for n, m in model.named_modules() if n]
    tokens = _tokens()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(tokens[:, :-1], tokens[:, 1:]).objective.backward()
    for handle in handles:
        handle.remove()
    return seen


def test_norms_and_marked_modules_are_found_by_type_and_class_attribute():
    kept = _kept_float32(_model(NormConfig(qk="rmsnorm")))
    assert set(kept) == {
        f"layers.{i}.{n}" for i in (0, 1) for n in ("attn_norm", "mlp_norm", "attn.q_norm", "attn.k_norm")
    } | {"final_norm"}
    ngpt = _kept_float32(_model(NormConfig(name="l2norm", placement="ngpt"), tie_embeddings=False))
    assert "logit_scale" in ngpt and "layers.0.attn.s_q" in ngpt and "layers.1.mlp_alpha" in ngpt
    assert all(isinstance(m, Norm) or type(m).keep_float32 for m in ngpt.values())
    assert not _kept_float32(_model(NormConfig(gain="none")))  # norms without parameters


@pytest.mark.parametrize(
    "norm, changes",
    [
        (NormConfig(qk="rmsnorm"), {}),
        (NormConfig(name="dyt", placement="peri"), {}),
        (NormConfig(name="l2norm", placement="ngpt"), {"tie_embeddings": False}),
    ],
)
def test_norm_parameters_stay_float32_under_a_bf16_policy(process_group, norm, changes):
    model = _model(norm, **changes)
    kept = set(_kept_float32(model))
    shard(model, CPU, process_group, use_compile=False, precision="bf16")
    assert all(isinstance(p, DTensor) and p.dtype == torch.float32 for p in model.parameters())  # what AdamW steps
    seen = _forward_dtypes(model)
    for name in kept:
        assert set(seen[name].values()) == {torch.float32}, name
    assert seen["layers.0.attn.qkv_proj"]["weight"] == torch.bfloat16  # the policy did apply to the matrices
    assert seen["tok_embeddings"]["weight"] == torch.bfloat16


def test_a_gain_that_freezes_in_bf16_moves_in_float32(process_group):
    # bf16 keeps 8 significant bits: a gain of 1.0 plus an update of 1e-3 (an AdamW step at lr 1e-3) is 1.0 again.
    one = torch.ones((), dtype=torch.bfloat16)
    assert one + 1e-3 == one and one - 1e-3 == one
    gains = {}
    for kept in (True, False):
        model = _model("rmsnorm")
        if kept:
            shard(model, CPU, process_group, use_compile=False, precision="bf16")
        else:  # what one bf16 group per block would do: the gains all-gathered in bf16 like the matrices
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

            policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            for block in model.layers:
                fully_shard(block, mp_policy=policy)
            fully_shard(model, mp_policy=policy)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
        tokens = _tokens()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(tokens[:, :-1], tokens[:, 1:]).objective.backward()
        optimizer.step()
        master = model.layers[0].mlp_norm.weight.full_tensor()
        assert (master - 1).abs().min() > 5e-4  # every element moved by about lr, in the float32 the optimizer keeps
        seen = {}

        def keep_gain(module, args, seen=seen) -> None:
            seen["gain"] = module.weight.detach().clone()

        handle = model.layers[0].mlp_norm.register_forward_pre_hook(keep_gain)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            model(tokens[:, :-1])
        handle.remove()
        gains[kept] = seen["gain"]
    assert gains[True].dtype == torch.float32 and (gains[True] != 1).all()  # the forward sees the update
    assert gains[False].dtype == torch.bfloat16 and (gains[False] == 1).all()  # frozen at 1.0 in bf16


def test_without_torchrun_fsdp_is_one_process():
    model = _model()
    assert shard(model, CPU, Distributed(), use_compile=False, precision="fp32") is model
    assert not any(isinstance(p, DTensor) for p in model.parameters())


def test_muon_is_refused_with_fsdp_before_any_data_loads(tmp_path):
    with pytest.raises(ConfigError, match=r"train.optimizer=muon .* train.parallel=fsdp.*use train.optimizer=adamw"):
        run_tiny(tmp_path, str(tmp_path / "no-cache"), 2, "train.optimizer=muon", "train.parallel=fsdp")
    assert not (tmp_path / "no-cache").exists()


def test_an_unknown_parallel_mode_is_refused_at_composition():
    with pytest.raises(ConfigCompositionException, match=r"train.parallel"):
        compose_config("train.parallel=zero3")
