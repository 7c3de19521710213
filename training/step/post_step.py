"""Post-step hooks: what runs after every optimizer step, registered by the model or by a training option.

The loop calls each hook after the optimizer step and logs the metrics it returns; it names no feature.
A model registers its own (``Transformer.post_step_hooks``: a model that keeps its matrices normalized); a
training option registers one from ``OPTION_HOOKS`` when it is set, its module (variants/) imported only then.
Hooks are built before the model is compiled, so one may set the model up.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from model.registry import resolve
from training.step.distributed import Distributed

PostStepHook = Callable[[], dict[str, float]]

# A train key whose value, when not null, registers a hook: key -> the hook's class, built as cls(model, value, dist).
OPTION_HOOKS = {"qk_clip": "variants.qk_clip:QKClip"}


def post_step_hooks(model: nn.Module, train_cfg, dist: Distributed) -> list[PostStepHook]:
    """The model's hooks, then each set option's, in that order."""
    hooks = list(model.post_step_hooks())
    for key, path in OPTION_HOOKS.items():
        value = getattr(train_cfg, key)
        if value is not None:
            hooks.append(resolve(path)(model, value, dist))
    return hooks
