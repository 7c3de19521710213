"""Mix-LN (Li et al. 2024, arXiv 2412.13795): post-norm in the first floor(post_fraction * L) layers, pre-norm
after them, so that both the early and the deep layers get gradients (``norm.post_fraction``, 0.25 by default)."""

from __future__ import annotations

import math

from model.config import ModelConfig


def mix_ln(cfg: ModelConfig) -> list[str]:
    post = math.floor(cfg.norm.post_fraction * cfg.n_layers)
    return ["post"] * post + ["pre"] * (cfg.n_layers - post)


def label(placement: str, get) -> str:
    return f"mix_ln{get('norm.post_fraction'):g}"
