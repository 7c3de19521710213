"""The decoder's shape and its norms' design, typed once: the run config's ``model`` and ``norm`` groups, and the
``ModelConfig`` the model reads and checkpoints store.

``ModelShape`` holds the model group's keys (``model.<field>``) and ``NormConfig`` the norm group's
(``norm.<field>``): a key is its field's name. ``ModelConfig`` is a model's shape with its norms and the rows of
its embedding table. Each field declares the rule a number must meet or its choices (a ``Choice``, which Hydra's
composition refuses naming the allowed values), and its part of the run's label away from its default (``label``:
a format of ``value``, ``type`` and ``over_all``, training/run/label.py). A check that needs two fields, or a
variant's refusal, sits in ``ModelConfig.__post_init__`` or with the variant (variants/). Annotations use
``typing`` forms because OmegaConf reads them.
"""

import enum
import math
import typing
from dataclasses import asdict, dataclass, field, fields, is_dataclass, make_dataclass
from typing import Any, Dict, List, Optional  # noqa: UP035 (OmegaConf reads these annotations on Python 3.10)

from model.registry import PLACEMENTS
from norms import GAINS

# ruff: noqa: UP006, UP045

# What a numeric key may hold, checked before a run writes anything; a refusal names the key and the rule.
RULES = {
    "> 0": lambda v: math.isfinite(v) and v > 0,
    ">= 0": lambda v: math.isfinite(v) and v >= 0,
    ">= 1": lambda v: v >= 1,
    "in [0, 1]": lambda v: 0 <= v <= 1,
    "in [0, 1)": lambda v: 0 <= v < 1,
    "in (0, 1)": lambda v: 0 < v < 1,
    "in (0, 1]": lambda v: 0 < v <= 1,
}


class Choice(str, enum.Enum):
    """A config key with a fixed set of values, refused at composition with the allowed ones (``Invalid value
    'x', expected one of [...]``, with the key). Compares and prints as its value; the dataclasses below hold the
    plain value once built, so that what checkpoints and records store is a string."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


def choice(name: str, values) -> type[Choice]:
    return Choice(name, {value: value for value in values}, module=__name__)  # picklable by name (joblib sweeps)


def declared(default, *, rule: str = "", label: str = "", quiet: tuple = (), factory=None):
    """A field whose value (when not null) must meet ``rule`` (one of RULES), and whose part of the run's label away
    from its default is ``label``; ``quiet``: values that add no label part."""
    metadata = {"rule": rule, "label": label, "quiet": quiet}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def rule_refusal(key: str, value, rule: str, nullable: bool) -> str | None:
    """Why ``value`` breaks ``rule`` (one of RULES), in one line naming the key; None when it meets it."""
    if not rule or value is None or (isinstance(value, (int, float)) and RULES[rule](value)):
        return None
    return f"{key}={value} is not allowed: it must be {rule}{' or null' if nullable else ''}"


def refusal(config, prefix: str) -> str | None:
    """The first field of the dataclass ``config`` (nested ones walked, their keys under ``prefix``) whose value is
    outside its choices or breaks its rule, as one line naming the key; None when every value is allowed."""
    for f in fields(config):
        value, key = getattr(config, f.name), f"{prefix}{f.name}"
        allowed = choices_of(f)
        if is_dataclass(value):
            found = refusal(value, f"{key}.")
        elif allowed:
            found = (
                None
                if value in allowed or value is None
                else f"{key} must be one of {', '.join(allowed)}, got {value!r}"
            )
        else:
            found = rule_refusal(key, value, f.metadata.get("rule"), type(None) in typing.get_args(f.type))
        if found:
            return found
    return None


def choices_of(f) -> list[str]:
    """The values a field typed as a Choice (or an optional one) may hold; none for any other field."""
    for kind in typing.get_args(f.type) or (f.type,):
        if isinstance(kind, type) and issubclass(kind, Choice):
            return [member.value for member in kind]
    return []


def plain_values(config) -> None:
    """Replace each Choice member in the dataclass ``config`` by its value (OmegaConf builds them as members)."""
    for f in fields(config):
        value = getattr(config, f.name)
        if isinstance(value, Choice):
            setattr(config, f.name, value.value)


class PlainValues:
    """A config dataclass that holds each Choice as its plain value once built (OmegaConf builds them as members):
    what records and checkpoints store are strings."""

    def __post_init__(self) -> None:
        plain_values(self)


Gain = choice("Gain", GAINS)
Placement = choice("Placement", PLACEMENTS)  # model/registry.py: a block, a mix of blocks, or a model of its own
QkAxis = choice("QkAxis", ("head", "all"))
DepthScaling = choice("DepthScaling", ("none", "inverse_sqrt"))
EmbedScale = choice("EmbedScale", ("none", "sqrt_d", "learned"))
InitOutScale = choice("InitOutScale", ("inverse_sqrt_2l", "none"))
AttnGate = choice("AttnGate", ("none", "headwise", "elementwise"))
AttnSink = choice("AttnSink", ("none", "learned"))


@dataclass
class NormOptions(PlainValues):
    """Every option some registered norm takes (norms/: each class's keyword arguments), None meaning the norm
    type's own default. An option the chosen type does not take is refused before any data loads;
    tests/unit/training/test_config.py checks that these are exactly the registered norms' options."""

    eps: Optional[float] = declared(None, rule="> 0")
    p: Optional[float] = declared(None, rule="in (0, 1]")  # pRMSNorm: the share of features its statistic reads
    k: Optional[int] = declared(None, rule=">= 1")  # pRMSNorm: or their count
    bias: Optional[bool] = None
    cast_before_weight: Optional[bool] = None
    gain: Optional[Gain] = declared(None, label="gain_{value}", quiet=("standard",))  # type: ignore[valid-type]
    alpha_init: Optional[float] = declared(None, rule="> 0")  # DyT, Derf
    shift_init: Optional[float] = None  # Derf

    def options(self) -> Dict[str, Any]:
        """The options given a value (the others keep the norm type's default)."""
        values = {f.name: getattr(self, f.name) for f in fields(NormOptions)}  # not a subclass' fields
        return {name: value for name, value in values.items() if value is not None}


# Every norm's role (model/norm_roles.py): before and after each branch, the stream after a branch's update,
# before the head, after the embeddings, q, k and v, and right after each linear layer of the blocks.
PROJECTION_ROLES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ROLES = (
    "attn_in", "mlp_in", "attn_out", "mlp_out", "attn_update", "mlp_update", "final", "embed", "q", "k", "v",
    *PROJECTION_ROLES,
)  # fmt: skip


# Options for one role alone, e.g. norm.roles.attn_in.alpha_init=0.8: one NormOptions per role of
# model/norm_roles.py, so that a misspelled role or option is refused at composition.
NormRoles = make_dataclass("NormRoles", [(role, NormOptions, field(default_factory=NormOptions)) for role in ROLES])
NormRoles.__module__ = __name__  # pickled by name, as the parallel sweeps' workers unpickle their configs


@dataclass
class NormConfig(NormOptions):
    """The norm group: the stream's norm type and its options, and the norms' structure in the model (where they
    sit, which of q, k and v are normalized), which shapes the model and is never passed to a norm."""

    name: str = "rmsnorm"  # the stream's norm type, a registered name (norms/registry.py)
    # model/registry.py PLACEMENTS: a block for every layer, a mix of blocks by layer, or a model of its own
    placement: Placement = Placement("pre")  # type: ignore[valid-type]
    # one placement per layer (a layer's block, e.g. [post, post, pre, pre]); overrides placement
    layer_placements: Optional[List[str]] = None
    # mix_ln: post-norm in the first floor(post_fraction * n_layers) layers, pre-norm after them
    post_fraction: float = declared(0.25, rule="in [0, 1]")
    qk: Optional[str] = declared(None, label="qk{type}{over_all}")  # a norm type on q and k before RoPE
    # head: over each head's features (Qwen3); all: over all heads at once (OLMo 2); v too
    qk_axis: QkAxis = QkAxis("head")  # type: ignore[valid-type]
    v: Optional[str] = declared(None, label="v{type}{over_all}")  # a norm type on v (QKV-norm with qk), over qk_axis
    # a norm type after every linear layer of the blocks (q, k, v, o, gate, up, down): variants/simplenorm.py
    after_linear: Optional[str] = declared(None, label="after_linear{type}")
    # inverse_sqrt: the norms of layer l (1-based) scaled by 1/sqrt(l) (variants/layernorm_scaling.py)
    depth_scaling: DepthScaling = declared(DepthScaling("none"), label="lns")  # type: ignore[valid-type]
    roles: NormRoles = field(default_factory=NormRoles)  # type: ignore[valid-type]

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.roles, dict):  # from a checkpoint: the roles that are set
            unknown = sorted(set(self.roles) - set(ROLES))
            if unknown:
                raise ValueError(
                    f"norm.roles has unknown role(s) {', '.join(unknown)}; the roles are: {', '.join(ROLES)}"
                )
            self.roles = NormRoles(**{role: NormOptions(**options) for role, options in self.roles.items()})

    def role_options(self) -> Dict[str, Dict[str, Any]]:
        """The options set for single roles (norm.roles), e.g. {"attn_in": {"alpha_init": 0.8}}."""
        return {role: options for role in ROLES if (options := NormOptions.options(getattr(self.roles, role)))}


@dataclass
class ModelShape(PlainValues):
    """The model group: the decoder's shape and its switches."""

    # the embedding table's rows; null: the tokenizer's vocabulary rounded up to a multiple of 64, or the rows of
    # the checkpoint a run resumes or starts from where those are more (training/run/config.py)
    vocab_size: Optional[int] = declared(None, rule=">= 1")
    d_model: int = declared(256, rule=">= 1")
    n_layers: int = declared(4, rule=">= 1")
    n_heads: int = declared(8, rule=">= 1")
    n_kv_heads: int = declared(4, rule=">= 1")  # grouped-query attention: n_heads must be a multiple of it
    # features per attention head; None: d_model // n_heads (Qwen3's are wider)
    head_size: Optional[int] = declared(None, rule=">= 1")
    # None: LLaMA's rule, 2/3 * 4 * d_model rounded up to mlp_multiple_of
    mlp_hidden: Optional[int] = declared(None, rule=">= 1")
    mlp_multiple_of: int = declared(64, rule=">= 1")
    max_seq_len: int = declared(256, rule=">= 1")
    rope_theta: float = declared(10000.0, rule="> 0")
    # Llama 3's stretch of RoPE's low frequencies (model/rope.py): {rope_type: llama3, factor, low_freq_factor,
    # high_freq_factor, original_max_position_embeddings}; empty for plain RoPE (a dict, which Hydra can fill)
    rope_scaling: Dict[str, Any] = declared(None, factory=dict)
    tie_embeddings: bool = True
    dropout: float = declared(0.0, rule="in [0, 1)")
    init_std: float = declared(0.02, rule="> 0")
    # the embeddings times nothing, sqrt(d_model) (Gemma), or a learned scalar from sqrt(d_model) (DyT)
    embed_scale: EmbedScale = declared(EmbedScale("none"), label="embed_{value}")  # type: ignore[valid-type]
    # the output projections' init std divided by sqrt(2 n_layers), or not (see Transformer.reset_parameters)
    init_out_scale: InitOutScale = declared(InitOutScale("inverse_sqrt_2l"), label="init_out_{value}")  # type: ignore[valid-type]
    # final logits c * tanh(logits / c) (Gemma 2: 30)
    logit_softcap: Optional[float] = declared(None, rule="> 0", label="softcap{value:g}")
    # pre-softmax attention scores c * tanh(s / c) (Gemma 2: 50; variants/score_softcap.py)
    attn_softcap: Optional[float] = declared(None, rule="> 0", label="attncap{value:g}")
    # a sigmoid gate on attention's output, per head or per feature (variants/gated_attention.py)
    attn_gate: AttnGate = declared(AttnGate("none"), label="gate_{value}")  # type: ignore[valid-type]
    # one learned logit per head in the softmax's denominator (variants/attention_sinks.py)
    attn_sink: AttnSink = declared(AttnSink("none"), label="sink_{value}")  # type: ignore[valid-type]
    # each residual branch's output times this constant (variants/op_block.py: 0.2, O(1/sqrt(depth)))
    residual_scale: Optional[float] = declared(None, rule="> 0", label="resid{value:g}")
    # a norm type on the embeddings and before the LM head, whatever the blocks use (a stack without norms
    # normalized at both ends); None: no embedding norm, the final norm is the stream's
    outer_norm: Optional[str] = declared(None, label="outer_{value}")


@dataclass
class ModelConfig(ModelShape):
    """A model: its shape, its norms and the rows of its embedding table. What ``Transformer`` is built from and
    every checkpoint stores (``to_dict``; model/from_state.py reads any checkpoint's, older ones' layout too)."""

    vocab_size: int = declared(4096, rule=">= 1")
    norm: NormConfig = field(default_factory=NormConfig)

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.norm, dict):
            self.norm = NormConfig(**self.norm)
        problem = refusal(self, "model.")
        if problem:
            raise ValueError(problem.replace("model.norm.", "norm."))
        if self.head_size is None and self.d_model % self.n_heads:
            raise ValueError(f"model.d_model={self.d_model} must be divisible by model.n_heads={self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"model.n_heads={self.n_heads} must be a multiple of model.n_kv_heads={self.n_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(
                f"the head size {self.head_dim} (model.head_size or d_model/n_heads) must be even for RoPE"
            )
        layers = self.norm.layer_placements
        if layers is not None and len(layers) != self.n_layers:
            raise ValueError(
                f"norm.layer_placements has {len(layers)} entries for model.n_layers={self.n_layers}: give one "
                "placement per layer"
            )

    @classmethod
    def of(cls, shape: ModelShape, norm: NormConfig, vocab_size: int) -> "ModelConfig":
        """The model of a run's ``model`` and ``norm`` groups, with ``vocab_size`` embedding rows."""
        values = {f.name: getattr(shape, f.name) for f in fields(ModelShape)}
        return cls(**{**values, "vocab_size": vocab_size, "norm": NormConfig(**asdict(norm))})

    @property
    def head_dim(self) -> int:
        return self.head_size or self.d_model // self.n_heads

    @property
    def hidden_dim(self) -> int:
        if self.mlp_hidden is not None:
            return self.mlp_hidden
        hidden = int(2 * 4 * self.d_model / 3)
        return self.mlp_multiple_of * -(-hidden // self.mlp_multiple_of)

    def to_dict(self) -> dict[str, Any]:
        """Plain values, the norm's per-role options only for the roles that have some."""
        values = asdict(self)
        values["norm"]["roles"] = self.norm.role_options()
        return values
