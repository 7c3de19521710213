"""The LM head and cross-entropy fused, chunk by chunk, so the full logits never exist.

For each chunk of rows the logits are computed, turned into the loss and into their own
gradient (softmax minus one-hot) while still in cache, and multiplied back into the
gradients of the hidden states and the head weight. The (tokens x vocab) logits tensor
(32 MB for a 2048-token batch and a 4096 vocabulary, gigabytes for large vocabularies) is
never materialized, and the softmax runs in one cache-resident pass instead of several over
memory. This is the idea behind Liger-Kernel's fused linear cross-entropy.

Two logit controls live here too, in the same pass:

- a soft-cap (Gemma 2): the logits become ``c * tanh(logits / c)``; their gradient is
  multiplied by ``1 - (capped / c)^2``;
- z-loss (PaLM; Wortsman et al. 2023, arXiv 2309.14322): ``coef * mean(lse^2)`` with lse the
  log-partition ``logsumexp(logits)``, which pulls lse towards 0; its gradient with respect to
  the logits is ``2 coef lse softmax``, added to the cross-entropy's.

Gradients are computed during the forward pass (only when autograd needs them), so the
backward pass just scales them. Under autocast the matmuls run in the autocast dtype; the
softmax and the loss are always float32.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

CHUNK_ROWS = 512  # measured best on CPU for a 4096 vocabulary: the chunk's logits stay in cache
# The float32 logits a summed cross-entropy computes whole (a CPU model's validation batch holds a few MB); past
# this, in chunks of this size (gpu_125m's batch of 32 x 1024 tokens over 32,768 rows would hold 4 GiB).
WHOLE_LOGITS_BYTES = 64 * 2**20


class LossTerms(NamedTuple):
    """What the model returns with targets: ``objective`` (what backward runs on), and its parts."""

    objective: torch.Tensor  # cross_entropy + z_loss, differentiable
    cross_entropy: torch.Tensor  # the mean cross-entropy (nats/token): train/loss, comparable with or without z-loss
    z_loss: torch.Tensor  # coef * mean(lse^2), coefficient included (0 when off)


def softcap(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    """``cap * tanh(logits / cap)``: bounded by ``cap``, the identity near 0; ``None`` leaves them as they are."""
    return logits if cap is None else cap * torch.tanh(logits / cap)


class _FusedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk_rows, z_loss, cap):
        rows = hidden.shape[0]
        device = hidden.device.type  # the matmuls run in the autocast dtype, the softmax in float32
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
        with torch.autocast(device, enabled=False):
            w = weight.to(dtype)
            grad_hidden = torch.empty_like(hidden)
            grad_weight = torch.zeros_like(weight, dtype=torch.float32)
            ce_sum = torch.zeros((), dtype=torch.float32, device=hidden.device)
            z_sum = torch.zeros((), dtype=torch.float32, device=hidden.device)
            for start in range(0, rows, chunk_rows):
                h = hidden[start : start + chunk_rows].to(dtype)
                t = targets[start : start + chunk_rows]
                logits = (h @ w.t()).float()
                if cap is not None:
                    logits = softcap(logits, cap)
                    cap_slope = 1 - (logits / cap).square()  # d capped / d raw
                target_logit = logits.gather(1, t[:, None]).squeeze(1)
                row_max = logits.amax(dim=-1, keepdim=True)
                # One exponentiation serves the loss (its row sums) and the gradient (softmax).
                exp = logits.sub_(row_max).exp_()
                sums = exp.sum(dim=-1, keepdim=True)
                lse = sums.log() + row_max
                ce_sum += lse.squeeze(1).sub(target_logit).sum()
                # d(mean loss)/d(logits) = (softmax (1 + 2 coef lse) - onehot) / rows, computed in place.
                grad = exp.div_(sums)
                if z_loss:
                    z_sum += lse.square().sum()
                    grad.mul_(1 + 2 * z_loss * lse)
                grad[torch.arange(len(t), device=t.device), t] -= 1.0
                if cap is not None:
                    grad.mul_(cap_slope)
                grad = grad.div_(rows).to(dtype)
                grad_hidden[start : start + chunk_rows] = grad @ w
                if grad.dtype == torch.float32:
                    grad_weight.addmm_(grad.t(), h)
                else:
                    grad_weight += (grad.t() @ h).float()
        ctx.save_for_backward(grad_hidden, grad_weight.to(weight.dtype))
        parts = torch.stack((ce_sum, z_loss * z_sum)) / rows
        # One (2,) tensor of parts, not scalars: with z-loss off torch.compile folds ``ce + 0`` into ``ce``, and
        # marking that one tensor non-differentiable as a part would take the objective's gradient with it.
        ctx.mark_non_differentiable(parts)
        return parts.sum(), parts

    @staticmethod
    def backward(ctx, grad_objective, grad_parts):
        grad_hidden, grad_weight = ctx.saved_tensors
        return grad_hidden * grad_objective, grad_weight * grad_objective, None, None, None, None


def fused_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    z_loss: float = 0.0,
    softcap_value: float | None = None,
    chunk_rows: int = CHUNK_ROWS,
) -> LossTerms:
    """Mean cross-entropy of ``softcap(hidden @ weight.T)`` against ``targets``, plus ``z_loss * mean(lse^2)``.

    hidden is (..., d), targets (...).
    """
    hidden, targets = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        objective, parts = _FusedLinearCrossEntropy.apply(hidden, weight, targets, chunk_rows, z_loss, softcap_value)
        return LossTerms(objective, parts[0], parts[1])
    logits = softcap(F.linear(hidden, weight).float(), softcap_value)
    ce = F.cross_entropy(logits, targets)
    z = z_loss * torch.logsumexp(logits, dim=-1).square().mean()
    return LossTerms(ce + z, ce, z)


@torch.no_grad()
def summed_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, softcap_value: float | None = None
) -> torch.Tensor:
    """The cross-entropy of ``softcap(hidden @ weight.T)`` against ``targets``, summed over every token, in float32:
    what validation adds up. Computed whole where the float32 logits stay under WHOLE_LOGITS_BYTES, else in
    chunks of that many bytes of logits, so the logits of the whole batch never exist."""
    hidden, targets = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
    rows = max(1, WHOLE_LOGITS_BYTES // (4 * weight.shape[0]))
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    for start in range(0, hidden.shape[0], rows):
        logits = softcap(F.linear(hidden[start : start + rows], weight), softcap_value).float()
        total += F.cross_entropy(logits, targets[start : start + rows], reduction="sum")
    return total
