"""training/run/label.py: a variant's label from its switches, and the run name that reads the same table."""

import pytest
from tiny_runs import compose_config

from training.config import LABELLED_GROUPS, run_name_keys
from training.run.label import label_keys, switches


@pytest.mark.parametrize(
    "overrides, label",
    [
        ((), "rmsnorm"),
        (("norm.placement=peri", "norm.qk=rmsnorm"), "rmsnorm-peri-qk"),
        (("norm=dyt", "norm.qk=rmsnorm", "norm.qk_axis=all"), "dyt-qk_rmsnorm_all"),
        (("norm.placement=mix_ln", "norm.post_fraction=0.5", "train.z_loss=1e-4"), "rmsnorm-mix_ln0.5-zloss0.0001"),
        (
            ("norm.gain=one_plus", "model.logit_softcap=30", "train.qk_clip=100"),
            "rmsnorm-softcap30-gain_one_plus-qkclip100",  # the model's switches, the norm's gain, the train's
        ),
        (("train.weight_decay_mode=independent", "model.outer_norm=rmsnorm"), "rmsnorm-outer_rmsnorm-wd_independent"),
        (("+variant=rmsnorm_deepnorm",), "rmsnorm-deepnorm"),
        # the third part: q, k and v norms over all heads are another model than per head, so another label
        (("norm.qk=rmsnorm", "norm.v=rmsnorm"), "rmsnorm-qk-v"),
        (("norm.qk=rmsnorm", "norm.v=layernorm", "norm.qk_axis=all"), "rmsnorm-qk_all-v_layernorm_all"),
        (("norm.placement=hybrid",), "rmsnorm-hybrid"),
        (("norm.placement=hybrid_star", "norm.qk_axis=all"), "rmsnorm-hybrid_star_all"),
        (("norm.after_linear=rmsnorm", "model.attn_gate=headwise"), "rmsnorm-after_linear-gate_headwise"),
        (("model.attn_gate=elementwise", "model.attn_sink=learned"), "rmsnorm-gate_elementwise-sink_learned"),
    ],
)
def test_the_label_names_each_switch_away_from_its_default(overrides, label):
    cfg = compose_config(*overrides)
    assert cfg.variant == label
    assert cfg.run_name == f"{cfg.model.name}-{label}-s0"  # a switch is readable in the name: no hash


def test_every_switch_is_a_readable_run_name_key():
    keys = set(run_name_keys())
    labelled = {key for key, _, _ in switches(LABELLED_GROUPS)}
    assert {"train.qk_clip", "norm.gain", "model.attn_gate", "norm.after_linear"} <= labelled
    assert labelled <= keys and set(label_keys(LABELLED_GROUPS)) <= keys
