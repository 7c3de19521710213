"""model/loss.py: validation's summed cross-entropy, whole or chunk by chunk, is the plain loss's sum (training's
fused loss against the plain loss, value and gradients: tests/unit/model/test_logit_controls.py)."""

import pytest
import torch
import torch.nn.functional as F

from model import loss
from model.loss import softcap, summed_cross_entropy


def plain(hidden, weight, targets, cap=None):
    return F.cross_entropy(softcap(hidden @ weight.t(), cap).float().flatten(0, 1), targets.flatten(), reduction="sum")


@pytest.mark.parametrize("cap", [None, 5.0])
def test_the_summed_loss_is_the_plain_sum_whole_and_chunked(monkeypatch, cap):
    torch.manual_seed(0)
    hidden, weight = torch.randn(3, 50, 16), torch.randn(96, 16)
    targets = torch.randint(0, 96, (3, 50))
    whole = summed_cross_entropy(hidden, weight, targets, cap)
    assert torch.equal(whole, plain(hidden, weight, targets, cap))  # one chunk: the plain loss's very operations
    monkeypatch.setattr(loss, "WHOLE_LOGITS_BYTES", 7 * 96 * 4)  # 7 rows a chunk: 22 chunks, the last of 3 rows
    torch.testing.assert_close(summed_cross_entropy(hidden, weight, targets, cap), whole, rtol=1e-6, atol=0)
