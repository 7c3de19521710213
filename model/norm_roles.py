"""Which norm each place in the model gets: its type, options and role.

Every norm instance has a role: ``attn_in`` and ``mlp_in`` (before a branch), ``attn_out``
and ``mlp_out`` (after a branch), ``attn_update`` and ``mlp_update`` (the stream after a branch's
update), ``final`` (before the LM head), ``embed`` (after the embeddings), ``q``, ``k`` and ``v``
(QKV-norm, inside attention), and ``q_proj`` ... ``down_proj`` (right after that linear layer). The
stream's norms take ``cfg.norm.name`` with the norm group's options; q and k take ``cfg.norm.qk`` and v
``cfg.norm.v`` (the stream's type where a placement normalizes them unasked), ``embed`` and ``final``
take ``cfg.outer_norm`` when it is set, and a variant may name the type of the norms it adds; each with the
stream's options only when it is the same type. Options set for one role (``norm.roles.<role>``) override
both, e.g. DyT's initial alpha of 0.8 for ``attn_in`` and 0.2 elsewhere (the DyT paper's LLaMA 7B setup).
"""

from __future__ import annotations

from model.config import ModelConfig
from norms import Norm, build_norm


def norm_for(cfg: ModelConfig, role: str, dim: int, name: str | None = None) -> Norm:
    """The norm of ``role`` over ``dim`` features, tagged with its role; ``name``: a type a variant chooses."""
    qk = role in ("q", "k", "v")
    outer = role in ("embed", "final") and cfg.outer_norm is not None
    norms = cfg.norm
    if name is None and qk:
        name = (norms.v if role == "v" else norms.qk) or norms.name
    elif name is None:
        name = cfg.outer_norm if outer else norms.name
    options = norms.options() if name == norms.name else {}
    options.update(getattr(norms.roles, role).options())
    try:
        norm = build_norm(name, dim, **options)
    except ValueError as err:
        key = "norm.v" if role == "v" else "norm.qk"
        where = f"the {role} norm ({key}={name}, {dim} features per {norms.qk_axis})" if qk else f"the {role} norm"
        raise ValueError(
            f"{where}: {err}. (norm.<option> sets an option for every norm of the residual stream, "
            f"norm.roles.{role}.<option> for this role alone{f'; or choose another {key}' if qk else ''}.)"
        ) from None
    norm.role = role
    return norm
