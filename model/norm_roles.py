"""Which norm each place in the model gets: its type, options and role.

Every norm instance has a role: ``attn_in`` and ``mlp_in`` (before a branch), ``attn_out``
and ``mlp_out`` (after a branch), ``attn_update`` and ``mlp_update`` (the stream after a branch's
update), ``final`` (before the LM head), ``embed`` (after the embeddings), ``q``, ``k`` and ``v``
(QKV-norm, inside attention), and ``q_proj`` ... ``down_proj`` (right after that linear layer). The
stream's norms take ``cfg.norm`` with ``cfg.norm_options``; q and k take ``cfg.qk_norm`` and v
``cfg.v_norm`` (the stream's type where a placement normalizes them unasked), ``embed`` and ``final``
take ``cfg.outer_norm`` when it is set, and a variant may name the type of the norms it adds; each with the
stream's options only when it is the same type. Options set
for one role (``cfg.norm_role_options[role]``) override both, e.g. DyT's initial alpha of
0.8 for ``attn_in`` and 0.2 elsewhere (the DyT paper's LLaMA 7B setup).
"""

from __future__ import annotations

from model.config import ModelConfig
from norms import Norm, build_norm

PROJECTION_ROLES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ROLES = (
    "attn_in", "mlp_in", "attn_out", "mlp_out", "attn_update", "mlp_update", "final", "embed", "q", "k", "v",
    *PROJECTION_ROLES,
)  # fmt: skip


def check_role_options(cfg: ModelConfig) -> None:
    unknown = sorted(set(cfg.norm_role_options) - set(ROLES))
    if unknown:
        raise ValueError(f"norm.roles has unknown role(s) {', '.join(unknown)}; the roles are: {', '.join(ROLES)}")


def norm_for(cfg: ModelConfig, role: str, dim: int, name: str | None = None) -> Norm:
    """The norm of ``role`` over ``dim`` features, tagged with its role; ``name``: a type a variant chooses."""
    qk = role in ("q", "k", "v")
    outer = role in ("embed", "final") and cfg.outer_norm is not None
    if name is None and qk:
        name = (cfg.v_norm if role == "v" else cfg.qk_norm) or cfg.norm
    elif name is None:
        name = cfg.outer_norm if outer else cfg.norm
    options = dict(cfg.norm_options) if name == cfg.norm else {}
    options.update(cfg.norm_role_options.get(role, {}))
    try:
        norm = build_norm(name, dim, **options)
    except ValueError as err:
        key = "norm.v" if role == "v" else "norm.qk"
        where = f"the {role} norm ({key}={name}, {dim} features per {cfg.qk_axis})" if qk else f"the {role} norm"
        raise ValueError(
            f"{where}: {err}. (norm.<option> sets an option for every norm of the residual stream, "
            f"norm.roles.{role}.<option> for this role alone{f'; or choose another {key}' if qk else ''}.)"
        ) from None
    norm.role = role
    return norm
