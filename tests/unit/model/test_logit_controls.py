"""z-loss, the final and attention soft-caps, and QK-clip, each against a hand-written reference."""

import math

import pytest
import torch
import torch.nn.functional as F

from model import ModelConfig, Transformer
from model.attention import Attention, allowed_positions, attention_scores
from model.loss import _FusedLinearCrossEntropy, fused_linear_cross_entropy, softcap
from model.rope import rope_tables
from training.step.distributed import Distributed
from variants.qk_clip import qk_clip, track_max_logits
from variants.score_softcap import SoftCappedAttention


def tiny(**overrides) -> ModelConfig:
    base = dict(vocab_size=97, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=32, mlp_multiple_of=16)
    return ModelConfig(**{**base, **overrides})


def reference_loss(hidden, weight, targets, z_loss, cap):
    logits = hidden @ weight.t()
    if cap is not None:
        logits = cap * torch.tanh(logits / cap)
    lse = torch.logsumexp(logits, dim=-1)
    return F.cross_entropy(logits, targets), z_loss * (lse**2).mean()


@pytest.mark.parametrize("z_loss, cap", [(0.0, None), (1e-2, None), (0.0, 3.0), (0.5, 2.0)])
def test_fused_loss_matches_the_reference_in_value_and_gradient(z_loss, cap):
    torch.manual_seed(0)
    hidden = torch.randn(7, 5, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(11, 5, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 11, (7,))
    terms = fused_linear_cross_entropy(hidden, weight, targets, z_loss, cap, chunk_rows=3)  # three chunks
    ce, z = reference_loss(hidden, weight, targets, z_loss, cap)
    torch.testing.assert_close(terms.cross_entropy, ce.float(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(terms.z_loss, z.float(), rtol=1e-6, atol=1e-7)
    fused = torch.autograd.grad(terms.objective, (hidden, weight))
    expected = torch.autograd.grad(ce + z, (hidden, weight))
    for got, want in zip(fused, expected):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)


def test_fused_loss_passes_gradcheck_with_both_controls():
    torch.manual_seed(1)
    hidden = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(6, 4, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 6, (5,))

    def objective(h, w):
        # The loss and softmax run in float32 by design; gradcheck the float64 reference path's twin instead.
        return _FusedLinearCrossEntropy.apply(h, w, targets, 2, 0.1, 2.5)[0].double()

    # Numerical vs analytic at float32 accuracy: the loss itself is computed in float32.
    assert torch.autograd.gradcheck(objective, (hidden, weight), eps=1e-3, atol=2e-3, rtol=1e-2)


def test_without_gradients_the_loss_is_the_same():
    torch.manual_seed(0)
    hidden, weight, targets = torch.randn(6, 4), torch.randn(9, 4), torch.randint(0, 9, (6,))
    trained = fused_linear_cross_entropy(hidden.requires_grad_(), weight, targets, 1e-3, 4.0)
    with torch.no_grad():
        plain = fused_linear_cross_entropy(hidden, weight, targets, 1e-3, 4.0)
    for a, b in zip(trained, plain):
        torch.testing.assert_close(a.detach(), b, rtol=1e-5, atol=1e-6)


def test_the_model_reports_cross_entropy_apart_from_the_z_loss_term():
    torch.manual_seed(0)
    model = Transformer(tiny())
    tokens = torch.randint(0, 97, (2, 9))
    plain = model(tokens[:, :-1], tokens[:, 1:])
    with_z = model(tokens[:, :-1], tokens[:, 1:], z_loss=1e-3)
    torch.testing.assert_close(plain.cross_entropy, with_z.cross_entropy)  # train/loss compares across runs
    assert plain.z_loss == 0 and with_z.z_loss > 0
    torch.testing.assert_close(with_z.objective, with_z.cross_entropy + with_z.z_loss)


def test_final_soft_cap_bounds_the_logits_in_forward_and_generate():
    torch.manual_seed(0)
    model = Transformer(tiny(logit_softcap=2.0)).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(100)
    tokens = torch.randint(0, 97, (1, 8))
    logits = model(tokens)
    assert logits.abs().max() <= 2.0 and logits.abs().max() > 1.9
    uncapped = Transformer(tiny()).eval()
    uncapped.load_state_dict(model.state_dict())
    torch.testing.assert_close(logits, softcap(uncapped(tokens), 2.0))
    cached = model.generate(tokens[:, :3], 5, temperature=0)
    assert torch.equal(cached, model.generate(tokens[:, :3], 5, temperature=0, use_cache=False))


def _attention_by_hand(attn: Attention, x, cos, sin, cap):
    """Softmax of the capped scores, from the module's own q, k, v."""
    captured = {}
    handle = attn.scores_tap.register_forward_hook(lambda m, args, out: captured.update(q=args[0], k=args[1]))
    attn(x, cos, sin)
    handle.remove()
    q, k = captured["q"], captured["k"]
    v = attn.qkv_proj(x)[..., -attn.n_kv_heads * attn.head_dim :].view(*x.shape[:2], attn.n_kv_heads, -1)
    v = v.transpose(1, 2).repeat_interleave(attn.n_heads // attn.n_kv_heads, dim=1)
    scores = cap * torch.tanh(attention_scores(q, k) / cap)
    scores = scores.masked_fill(~allowed_positions(x.shape[1], 0, x.device), float("-inf"))
    out = scores.softmax(-1) @ v
    return attn.o_proj(out.transpose(1, 2).reshape(*x.shape[:2], -1))


def test_attention_soft_cap_is_applied_to_the_scores():
    torch.manual_seed(0)
    model = Transformer(tiny(attn_softcap=1.5)).double()
    attn = model.layers[0].attn
    assert isinstance(attn, SoftCappedAttention) and attn.softcap == 1.5
    x = torch.randn(2, 6, 32, dtype=torch.float64)
    cos, sin = model.rope_cos[:6].double(), model.rope_sin[:6].double()
    torch.testing.assert_close(attn(x, cos, sin), _attention_by_hand(attn, x, cos, sin, 1.5))
    # An uncapped attention (SDPA) differs from the capped one: the cap is not silently dropped.
    torch.manual_seed(0)
    plain = Transformer(tiny()).double().layers[0].attn
    assert not torch.allclose(plain(x, cos, sin), attn(x, cos, sin))
    assert torch.autograd.gradcheck(lambda t: attn(t, cos[:4], sin[:4]), (x[:1, :4].clone().requires_grad_(),))


def test_a_huge_attention_cap_equals_sdpa():
    torch.manual_seed(0)
    capped = Transformer(tiny(attn_softcap=1e9)).eval()
    torch.manual_seed(0)
    plain = Transformer(tiny()).eval()
    tokens = torch.randint(0, 97, (2, 10))
    torch.testing.assert_close(capped(tokens), plain(tokens), rtol=1e-5, atol=1e-5)
    cached = capped.generate(tokens[:, :4], 4, temperature=0)
    assert torch.equal(cached, capped.generate(tokens[:, :4], 4, temperature=0, use_cache=False))


def _attention(n_kv_heads: int = 2, scale: float = 1.0):
    """One attention layer (in a container, as qk_clip finds it in a model) and a fixed input."""
    torch.manual_seed(0)
    cfg = tiny(n_kv_heads=n_kv_heads)
    attn = Attention(cfg)
    with torch.no_grad():
        attn.qkv_proj.weight.normal_(0, 0.02 * scale)
    model = torch.nn.ModuleList([attn])
    track_max_logits(model)
    cos, sin = rope_tables(cfg.head_dim, 12, cfg.rope_theta)
    return model, attn, (torch.randn(2, 12, 32), cos, sin)


def _head_max_logits(attn: Attention, inputs) -> torch.Tensor:
    """Each query head's largest allowed pre-softmax logit on ``inputs``, by hand from the module's q and k."""
    seen = []
    hook = attn.scores_tap.register_forward_hook(
        lambda m, args, out: seen.append(
            attention_scores(args[0], args[1])
            .masked_fill(~allowed_positions(args[0].shape[2], 0, args[0].device), float("-inf"))
            .amax(dim=(0, 2, 3))
        )
    )
    was_training = attn.training
    with torch.no_grad():
        attn.eval()(*inputs)  # an eval forward: not tracked
    attn.train(was_training)
    hook.remove()
    return seen[0]


def test_qk_clip_bounds_each_clipped_heads_logit_on_the_batch_that_triggered_it():
    model, attn, inputs = _attention(scale=40)
    attn.train()
    attn(*inputs)  # the training forward records each head's largest logit
    before = _head_max_logits(attn, inputs)
    torch.testing.assert_close(attn.max_logits, before)
    tau = float(before.min()) * 0.5  # every head is over it
    assert qk_clip(model, tau, Distributed()) == 4
    after = _head_max_logits(attn, inputs)
    assert (after <= tau * (1 + 1e-4)).all()
    # Two query heads share each key head: the larger of each pair lands exactly on tau.
    group_max = before.view(2, 2).argmax(dim=1) + torch.tensor([0, 2])
    torch.testing.assert_close(after[group_max], torch.full((2,), tau), rtol=1e-4, atol=1e-4)
    assert torch.isinf(attn.max_logits).all()  # reset for the next step
    assert qk_clip(model, tau, Distributed()) == 0  # nothing tracked since: nothing clipped


def test_qk_clip_leaves_heads_under_tau_alone_without_shared_keys():
    model, attn, inputs = _attention(n_kv_heads=4, scale=20)
    attn(*inputs)
    before = _head_max_logits(attn, inputs)
    tau = float(before.median())
    weight = attn.qkv_proj.weight.detach().clone()
    assert qk_clip(model, tau, Distributed()) == int((before > tau).sum()) > 0
    after = _head_max_logits(attn, inputs)
    under = before <= tau
    torch.testing.assert_close(after[under], before[under])
    torch.testing.assert_close(after[~under], torch.full_like(after[~under], tau), rtol=1e-4, atol=1e-4)
    v_rows = slice(2 * 4 * attn.head_dim, None)
    assert torch.equal(attn.qkv_proj.weight[v_rows], weight[v_rows])  # values are never touched


def test_max_logits_are_tracked_only_in_training_forwards():
    model, attn, inputs = _attention()
    attn.eval()
    attn(*inputs)
    assert torch.isinf(attn.max_logits).all()


def test_z_loss_gradient_is_two_coef_lse_softmax():
    """By hand for one row: d(coef * lse^2)/d logits = 2 coef lse softmax."""
    logits = torch.tensor([[1.0, 2.0, 0.5]], dtype=torch.float64, requires_grad=True)
    lse = torch.logsumexp(logits, -1)
    (0.1 * lse**2).sum().backward()
    expected = 2 * 0.1 * lse.detach() * logits.detach().softmax(-1)
    torch.testing.assert_close(logits.grad, expected)
    assert math.isclose(softcap(torch.tensor(100.0, dtype=torch.float64), 30.0).item(), 30 * math.tanh(100 / 30))
