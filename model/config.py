"""The decoder's shape, as one typed dataclass that checkpoints store and compare.

Annotations use ``typing`` forms because Hydra's structured configs (OmegaConf) read them.
"""

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Optional  # noqa: UP035 (OmegaConf reads these annotations on Python 3.10)


@dataclass
class ModelConfig:
    vocab_size: int = 4096
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 8
    n_kv_heads: int = 4  # grouped-query attention: n_heads must be a multiple of it
    mlp_hidden: Optional[int] = None  # noqa: UP045  # None: LLaMA's rule, 2/3 * 4 * d_model rounded up to mlp_multiple_of
    mlp_multiple_of: int = 64
    max_seq_len: int = 256
    rope_theta: float = 10000.0
    norm: str = "rmsnorm"
    norm_options: Dict[str, Any] = field(default_factory=dict)  # noqa: UP006
    placement: str = "pre"  # pre | post | peri | reordered (model/blocks.py)
    qk_norm: Optional[str] = None  # noqa: UP045  # a norm type on q and k before RoPE, or None
    qk_axis: str = "head"  # head: over each head's features (Qwen3); all: over all heads at once (OLMo 2)
    norm_role_options: Dict[str, Dict[str, Any]] = field(default_factory=dict)  # noqa: UP006  # role -> options
    tie_embeddings: bool = True
    dropout: float = 0.0
    init_std: float = 0.02

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"model.d_model={self.d_model} must be divisible by model.n_heads={self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"model.n_heads={self.n_heads} must be a multiple of model.n_kv_heads={self.n_kv_heads}")
        if (self.d_model // self.n_heads) % 2:
            raise ValueError(f"the head size d_model/n_heads={self.d_model // self.n_heads} must be even for RoPE")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def hidden_dim(self) -> int:
        if self.mlp_hidden is not None:
            return self.mlp_hidden
        hidden = int(2 * 4 * self.d_model / 3)
        return self.mlp_multiple_of * -(-hidden // self.mlp_multiple_of)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
