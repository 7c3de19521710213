"""The norm base class: the residual-add contract, the gain parametrizations, and what a norm can say of itself.

Every norm accepts an optional ``residual``: ``norm(x, residual)`` returns
``(norm(x + residual), x + residual)``. A pre-norm block adds its branch output to the
residual stream and normalizes the sum in one call, which the fused kernel does in a single
pass and the reference norms do in two; the block code is the same for all of them.

What a norm can do beyond computing (its gain, an equivalent plain RMSNorm for export, the
backend that runs it) is asked of the class, so code elsewhere never lists norm names.
"""

from __future__ import annotations

import torch
from torch import nn

GAINS = ("standard", "one_plus", "none")


class Norm(nn.Module):
    """Base class: subclasses implement ``normalize``; the residual-add contract lives here.

    ``role`` is a free-form tag that whoever places the norm may set (a model sets
    ``"attn_in"``, ``"q"``, ...), so that statistics can say what the norm sees.
    ``output_scale`` multiplies the normalized output by a constant (a depth-scaled norm sets
    1/sqrt(layer)); at 1 it costs nothing.
    """

    role: str | None = None
    output_scale: float = 1.0
    unit_sphere = False  # whether every output vector has L2 norm 1 (what a model on the unit sphere needs)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def scaled(self, y: torch.Tensor) -> torch.Tensor:
        return y if self.output_scale == 1.0 else y * self.output_scale

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            return self.scaled(self.normalize(x))
        total = x + residual
        return self.scaled(self.normalize(total)), total

    def effective_gain(self) -> torch.Tensor | None:
        """The per-feature gain the output is multiplied by, in float32 at least, or None without one.

        Always a copy: a view of a float32 weight would change with it, and ``fold_gain`` resets the weight
        after reading the gain (DyT and Derf keep a weight of ones, which their kernels need).
        """
        weight = getattr(self, "weight", None)
        if weight is None:
            return None
        return weight.detach().to(torch.promote_types(weight.dtype, torch.float32), copy=True)

    @torch.no_grad()
    def fold_gain(self) -> torch.Tensor | None:
        """Take out the per-feature scale this norm's output ends with and return it (float32 at least), for the
        linear layer that reads the output to take in: W (g * n) = (W diag g) n (FlashNorm, arXiv 2407.09577).
        None where there is nothing to fold; a ValueError where something follows the gain (a bias)."""
        if getattr(self, "bias", None) is not None:
            raise ValueError(
                f"{type(self).__name__} adds a bias after its gain, which a linear layer without bias cannot take "
                "in (train with norm.bias=false)"
            )
        gain = self.effective_gain()
        if gain is None and self.output_scale == 1.0:
            return None
        if gain is None:  # a constant output scale alone (a depth-scaled norm without a gain) folds as a vector
            folded = torch.full((self.dim,), self.output_scale, dtype=torch.float64)  # cast to the reader's dtype
        else:
            self.drop_gain()
            folded = gain * self.output_scale
        self.output_scale = 1.0
        return folded

    @torch.no_grad()
    def drop_gain(self) -> None:
        """Make the gain the identity (what ``fold_gain`` leaves)."""
        self.weight.fill_(1.0)

    def plain_rms_norm_weight(self) -> torch.Tensor | None:
        """The weight ``w`` of an equivalent ``x * rsqrt(mean(x**2) + eps) * w`` over all features, or None.

        What exporting to a Hugging Face class with an RMSNorm (Llama, Qwen3, OLMo 2) needs.
        """
        return None

    def backend(self, device: torch.device | str) -> str:
        """The implementation that runs this norm on ``device`` (recorded in a run's config)."""
        return "pytorch"


def check_dim(dim: int) -> None:
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
        raise ValueError(f"dim must be a positive int (the feature size), got {dim!r}")


def gain_parameter(dim: int, gain: str) -> nn.Parameter | None:
    """The learned gain: ones (standard), zeros applied as 1 + w (one_plus, Gemma), or none."""
    if gain not in GAINS:
        raise ValueError(f"gain must be one of {', '.join(GAINS)}, got {gain!r}")
    if gain == "none":
        return None
    return nn.Parameter(torch.zeros(dim) if gain == "one_plus" else torch.ones(dim))


class GainedNorm(Norm):
    """A norm with a gain parametrization (``standard``, ``one_plus`` or ``none``)."""

    def __init__(self, dim: int, eps: float, gain: str) -> None:
        super().__init__()
        check_dim(dim)
        self.dim, self.eps, self.gain = dim, eps, gain
        self.register_parameter("weight", gain_parameter(dim, gain))

    @property
    def zero_centered(self) -> bool:
        return self.gain == "one_plus"

    def effective_gain(self) -> torch.Tensor | None:
        gain = super().effective_gain()
        return gain + 1.0 if gain is not None and self.zero_centered else gain

    def drop_gain(self) -> None:
        """No gain parameter left: the multiply is gone too (``gain="none"``)."""
        del self.weight
        self.register_parameter("weight", None)
        self.gain = "none"

    def gain_or_ones(self) -> torch.Tensor:
        gain = self.effective_gain()
        return torch.ones(self.dim) if gain is None else gain
