"""The LM head and cross-entropy fused, chunk by chunk, so the full logits never exist.

For each chunk of rows the logits are computed, turned into the loss and into their own
gradient (softmax minus one-hot) while still in cache, and multiplied back into the
gradients of the hidden states and the head weight. The (tokens x vocab) logits tensor
(32 MB for a 2048-token batch and a 4096 vocabulary, gigabytes for large vocabularies) is
never materialized, and the softmax runs in one cache-resident pass instead of several over
memory. This is the idea behind Liger-Kernel's fused linear cross-entropy.

Gradients are computed during the forward pass (only when autograd needs them), so the
backward pass just scales them. Under autocast the matmuls run in the autocast dtype; the
softmax and the loss are always float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK_ROWS = 512  # measured best on CPU for a 4096 vocabulary: the chunk's logits stay in cache


def _matmul_dtype(t: torch.Tensor) -> torch.dtype:
    if torch.is_autocast_enabled(t.device.type):
        return torch.get_autocast_dtype(t.device.type)
    return t.dtype


class _FusedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk_rows):
        rows = hidden.shape[0]
        dtype = _matmul_dtype(hidden)
        with torch.autocast(hidden.device.type, enabled=False):
            w = weight.to(dtype)
            grad_hidden = torch.empty_like(hidden)
            grad_weight = torch.zeros_like(weight, dtype=torch.float32)
            loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
            for start in range(0, rows, chunk_rows):
                h = hidden[start : start + chunk_rows].to(dtype)
                t = targets[start : start + chunk_rows]
                logits = (h @ w.t()).float()
                target_logit = logits.gather(1, t[:, None]).squeeze(1)
                row_max = logits.amax(dim=-1, keepdim=True)
                # One exponentiation serves the loss (its row sums) and the gradient (softmax).
                exp = logits.sub_(row_max).exp_()
                sums = exp.sum(dim=-1, keepdim=True)
                loss += (sums.log() + row_max).squeeze(1).sub(target_logit).sum()
                # d(mean loss)/d(logits) = (softmax - onehot) / rows, computed in place.
                grad = exp.div_(sums)
                grad[torch.arange(len(t), device=t.device), t] -= 1.0
                grad = grad.div_(rows).to(dtype)
                grad_hidden[start : start + chunk_rows] = grad @ w
                if grad.dtype == torch.float32:
                    grad_weight.addmm_(grad.t(), h)
                else:
                    grad_weight += (grad.t() @ h).float()
        ctx.save_for_backward(grad_hidden, grad_weight.to(weight.dtype))
        return loss / rows

    @staticmethod
    def backward(ctx, grad_loss):
        grad_hidden, grad_weight = ctx.saved_tensors
        return grad_hidden * grad_loss, grad_weight * grad_loss, None, None


def fused_linear_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk_rows: int = CHUNK_ROWS
) -> torch.Tensor:
    """Mean cross-entropy of ``hidden @ weight.T`` against ``targets``; hidden is (..., d), targets (...)."""
    hidden, targets = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        return _FusedLinearCrossEntropy.apply(hidden, weight, targets, chunk_rows)
    return F.cross_entropy(F.linear(hidden, weight).float(), targets)
