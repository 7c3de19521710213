"""Training batches as random windows, and the fixed validation windows.

Every step's global batch is drawn by a generator seeded from (seed, step) alone; a process
takes its slice of it by rank and micro-step. So a resumed run sees exactly the batches an
uninterrupted run would have, and N processes together see exactly what one process with the
same global batch sees.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import torch

from training.config import ConfigError
from training.data.corpus import DataError


def derive_seed(*parts: object) -> int:
    """A well-mixed 63-bit seed from any tuple of values."""
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little") >> 1


class TrainBatches:
    def __init__(self, tokens: np.ndarray, seq_len: int, global_batch: int, seed: int) -> None:
        if len(tokens) < seq_len + 2:
            raise DataError(
                f"the training split has {len(tokens)} tokens, too few for windows of train.seq_len={seq_len}"
            )
        self.tokens, self.seq_len, self.global_batch, self.seed = tokens, seq_len, global_batch, seed

    def starts(self, step: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(derive_seed("train", self.seed, step))
        return torch.randint(0, len(self.tokens) - self.seq_len - 1, (self.global_batch,), generator=generator)

    def get(self, step: int, first: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Samples [first, first + count) of step ``step``'s global batch as (inputs, targets)."""
        starts = self.starts(step)[first : first + count].tolist()
        windows = torch.from_numpy(np.stack([self.tokens[s : s + self.seq_len + 1] for s in starts]).astype(np.int64))
        return windows[:, :-1], windows[:, 1:]


def split_global_batch(train_cfg, seq_len: int, world_size: int) -> tuple[int, int]:
    """(sequences per global batch, gradient-accumulation steps) from the configured global batch; unset, one
    micro-batch per process (no accumulation), so the global batch grows with the process count."""
    per_pass = train_cfg.batch_size * world_size
    global_tokens = train_cfg.global_batch_tokens or per_pass * seq_len
    if global_tokens % (per_pass * seq_len):
        raise ConfigError(_batch_fixes(global_tokens, seq_len, train_cfg.batch_size, world_size))
    global_batch = global_tokens // seq_len
    return global_batch, global_batch // per_pass


def _batch_fixes(global_tokens: int, seq_len: int, batch_size: int, world_size: int) -> str:
    """Why the global batch does not split into micro-batches, and the values that would: the batch sizes that
    divide each process's sequences (where they are whole), the nearest global batches that split, or null."""
    step = seq_len * batch_size * world_size
    below, above = global_tokens // step * step, (global_tokens // step + 1) * step
    nearest = f"{below} or {above}" if below else str(above)
    multiples = f"a multiple of {step} = {seq_len} tokens x {batch_size} x {world_size} process(es), e.g. {nearest}"
    share, rest = divmod(global_tokens, seq_len * world_size)  # each process's sequences
    if rest:
        return (
            f"train.global_batch_tokens={global_tokens} is not a whole number of {seq_len}-token sequences for each "
            f"of {world_size} process(es), so no train.batch_size splits it: set train.global_batch_tokens to "
            f"{multiples}, or to null (one micro-batch per process)"
        )
    divisors = {d for i in range(1, math.isqrt(share) + 1) if share % i == 0 for d in (i, share // i)}
    near = sorted(sorted(divisors, key=lambda d: abs(d - batch_size))[:6])  # the batch sizes closest to this one
    return (
        f"train.global_batch_tokens={global_tokens} is {share} sequences of {seq_len} tokens for each of "
        f"{world_size} process(es), which micro-batches of train.batch_size={batch_size} do not split: set "
        f"train.batch_size to a divisor of {share} ({', '.join(map(str, near))}), or train.global_batch_tokens to "
        f"{multiples}, or to null (one micro-batch per process)"
    )


def validation_windows(tokens: np.ndarray, seq_len: int, count: int) -> torch.Tensor:
    """``count`` evenly spaced windows of seq_len + 1 tokens: the same tokens for every run."""
    span = len(tokens) - seq_len - 1
    if span < 0:
        raise DataError(
            f"the validation split has {len(tokens)} tokens, fewer than train.seq_len + 1 = {seq_len + 1}. "
            "Lower train.seq_len (or model.max_seq_len), or hold out more text for validation "
            "(data.kjv_val_books, data.val_files or data.val_fraction)."
        )
    if count < 1:
        raise DataError(f"data.val_windows must be >= 1, got {count}")
    starts = np.linspace(0, span, num=count).round().astype(np.int64)
    return _windows(tokens, starts, seq_len)


def heldout_windows(tokens: np.ndarray, seq_len: int, count: int, selection: int) -> torch.Tensor:
    """``count`` windows disjoint from the ``selection`` validation windows, each starting midway between two.

    A study chooses each variant's best rate on the selection windows (``val/``) and reports its
    loss on these (``heldout/``), so the reported best is not biased down by the choice.
    """
    span = len(tokens) - seq_len - 1
    starts = np.linspace(0, span, num=selection) if selection > 1 else np.array([0.0])
    gap = (starts[1] - starts[0]) if selection > 1 else 0.0
    if count > selection - 1 or gap / 2 < seq_len + 2:  # a window of seq_len + 1 tokens, and rounding
        raise DataError(
            f"the validation split ({len(tokens)} tokens) cannot hold data.heldout_windows={count} windows of "
            f"{seq_len + 1} tokens between data.val_windows={selection} without overlapping them: lower "
            "data.heldout_windows (at most val_windows - 1) or data.val_windows, or hold out more text"
        )
    midpoints = (starts[:-1] + starts[1:]) / 2
    chosen = midpoints[np.linspace(0, len(midpoints) - 1, num=count).round().astype(np.int64)]
    return _windows(tokens, chosen.round().astype(np.int64), seq_len)


def _windows(tokens: np.ndarray, starts: np.ndarray, seq_len: int) -> torch.Tensor:
    return torch.from_numpy(np.stack([tokens[s : s + seq_len + 1] for s in starts]).astype(np.int64))
