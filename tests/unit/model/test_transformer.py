"""The decoder: shapes, causality, GQA, cached generation, learning, FLOPs, Hugging Face parity."""

import pytest
import torch
import torch.nn.functional as F

from model import ModelConfig, NormConfig, Transformer
from model.hf import hf_config, hf_state_dict
from norms import NORM_NAMES


def tiny(**overrides) -> ModelConfig:
    base = dict(vocab_size=97, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=32, mlp_multiple_of=16)
    return ModelConfig(**{**base, **overrides})


@pytest.mark.parametrize("norm", NORM_NAMES)
def test_forward_backward_for_each_norm(norm):
    torch.manual_seed(0)
    model = Transformer(tiny(norm=NormConfig(name=norm)))
    tokens = torch.randint(0, 97, (2, 16))
    logits = model(tokens)
    assert logits.shape == (2, 16, 97) and logits.dtype == torch.float32
    F.cross_entropy(logits.flatten(0, 1), tokens.flatten()).backward()
    for name, norm_module in model.norm_modules().items():
        assert all(p.grad is not None for p in norm_module.parameters()), name
    assert torch.isfinite(model.tok_embeddings.weight.grad).all()


def test_bfloat16_forward():
    model = Transformer(tiny()).to(torch.bfloat16)
    assert model(torch.randint(0, 97, (1, 8))).dtype == torch.bfloat16


def test_norms_have_stable_names():
    model = Transformer(tiny(n_layers=3))
    names = list(model.norm_modules())
    assert names[:2] == ["layers.0.attn_norm", "layers.0.mlp_norm"] and names[-1] == "final_norm"
    assert len(names) == 7


def test_same_seed_same_weights_whatever_the_norm():
    weights = {}
    for norm in NORM_NAMES:
        torch.manual_seed(3)
        state = Transformer(tiny(norm=NormConfig(name=norm))).state_dict()
        weights[norm] = {k: v for k, v in state.items() if "norm" not in k}
    first = weights["rmsnorm"]
    for state in weights.values():
        assert state.keys() == first.keys() and all(torch.equal(state[k], first[k]) for k in first)


def test_output_projections_are_scaled_down_with_depth():
    torch.manual_seed(0)
    model = Transformer(tiny(d_model=256, n_heads=8, n_kv_heads=4, n_layers=8, init_std=0.02))
    q_std = model.layers[0].attn.qkv_proj.weight.std().item()
    o_std = model.layers[0].attn.o_proj.weight.std().item()
    assert q_std == pytest.approx(0.02, rel=0.05) and o_std == pytest.approx(0.02 / 4, rel=0.05)


def test_llama_hidden_size_rule():
    assert ModelConfig(d_model=256, mlp_multiple_of=64).hidden_dim == 704  # 2/3 * 1024 = 682 -> 704
    assert ModelConfig(d_model=256, mlp_hidden=300).hidden_dim == 300


def test_causality():
    torch.manual_seed(0)
    model = Transformer(tiny()).eval()
    tokens = torch.randint(0, 97, (1, 20))
    changed = tokens.clone()
    changed[0, 12] = (tokens[0, 12] + 1) % 97
    a, b = model(tokens), model(changed)
    assert torch.equal(a[:, :12], b[:, :12])
    assert not torch.allclose(a[:, 12:], b[:, 12:])


def test_grouped_query_attention_equals_repeated_heads():
    """A GQA model equals a full multi-head model whose k/v weights repeat each kv head."""
    torch.manual_seed(0)
    gqa = Transformer(tiny(n_heads=4, n_kv_heads=2)).eval()
    mha = Transformer(tiny(n_heads=4, n_kv_heads=4)).eval()
    state = gqa.state_dict()
    head_dim = 32 // 4
    for i in range(2):
        # qkv_proj rows are [q heads | k heads | v heads]; repeat each k and v head twice.
        q, k, v = state[f"layers.{i}.attn.qkv_proj.weight"].split([4 * head_dim, 2 * head_dim, 2 * head_dim])
        repeat = [t.view(2, head_dim, 32).repeat_interleave(2, dim=0).reshape(4 * head_dim, 32) for t in (k, v)]
        state[f"layers.{i}.attn.qkv_proj.weight"] = torch.cat([q, *repeat])
    mha.load_state_dict(state)
    tokens = torch.randint(0, 97, (2, 12))
    torch.testing.assert_close(gqa(tokens), mha(tokens))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("options", [{}, {"k": 8}], ids=["rmsnorm", "prmsnorm"])
def test_the_fused_norms_model_matches_the_pytorch_norms_model(device, options, request):
    """Same weights, same tokens: the Triton kernel gives the logits and gradients of PyTorch's norm, through every
    block's fused residual add (on a CPU in Triton's interpreter; on a GPU in float32 and in bf16 autocast)."""
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 means float32 here (training turns TF32 on)
    request.addfinalizer(lambda: setattr(torch.backends.cuda.matmul, "allow_tf32", tf32))
    size = {} if device == "cpu" else dict(vocab_size=4096, d_model=512, n_layers=4, n_heads=8, max_seq_len=256)
    torch.manual_seed(0)
    fused = Transformer(tiny(**size, norm=NormConfig(name="fused_rmsnorm", **options))).to(device)
    plain = Transformer(tiny(**size, norm=NormConfig(name="prmsnorm" if options else "rmsnorm", **options))).to(device)
    plain.load_state_dict(fused.state_dict())
    tokens = torch.randint(0, fused.cfg.vocab_size, (4, fused.cfg.max_seq_len + 1), device=device)
    # bf16 rounds the norms' float32 outputs before each matmul: a last-bit difference there can flip a rounding.
    for dtype, tolerance in [(torch.float32, 1e-5), *([(torch.bfloat16, 2e-2)] if device == "cuda" else [])]:
        results = []
        for model in (fused, plain):
            model.zero_grad()
            with torch.autocast(device, dtype=dtype, enabled=dtype != torch.float32):
                logits = model(tokens[:, :-1]).float()
            F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
            results.append({"logits": logits.detach(), **{n: p.grad.clone() for n, p in model.named_parameters()}})
        for name, expected in results[1].items():
            error = (results[0][name] - expected).norm() / expected.norm()
            assert error < tolerance, f"{name} in {dtype}: relative error {error:.2e}"


@pytest.mark.parametrize("norm", ["rmsnorm", "fused_rmsnorm"])
def test_cached_generation_equals_recomputation(norm):
    torch.manual_seed(0)
    model = Transformer(tiny(norm=NormConfig(name=norm))).eval()
    prompt = torch.randint(0, 97, (2, 5))
    cached = model.generate(prompt, 20, temperature=0)
    recomputed = model.generate(prompt, 20, temperature=0, use_cache=False)
    assert cached.shape == (2, 25) and torch.equal(cached, recomputed)


def test_cached_chunk_after_prefix_matches_full_forward():
    """A multi-token chunk after cached tokens (causal inside, full to the past) equals one forward."""
    from model.attention import KVCache

    torch.manual_seed(0)
    model = Transformer(tiny()).eval()
    tokens = torch.randint(0, 97, (1, 12))
    like = model.tok_embeddings.weight
    caches = [KVCache(1, 2, 12, 8, like) for _ in range(2)]
    model(tokens[:, :5], caches=caches, start_pos=0)
    torch.testing.assert_close(model(tokens[:, 5:], caches=caches, start_pos=5), model(tokens)[:, 5:])


def test_sampling_is_seeded_and_respects_top_k():
    torch.manual_seed(0)
    model = Transformer(tiny()).eval()
    prompt = torch.randint(0, 97, (1, 3))
    a = model.generate(prompt, 10, temperature=1.0, top_k=5, generator=torch.Generator().manual_seed(1))
    b = model.generate(prompt, 10, temperature=1.0, top_k=5, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, b)
    top1 = model.generate(prompt, 10, temperature=1.0, top_k=1)
    assert torch.equal(top1, model.generate(prompt, 10, temperature=0))


def test_generation_past_max_seq_len_is_refused():
    with pytest.raises(ValueError, match="max_seq_len"):
        Transformer(tiny()).generate(torch.zeros(1, 30, dtype=torch.long), 5)


def test_overfits_one_batch():
    torch.manual_seed(0)
    model = Transformer(tiny(d_model=64, n_heads=4, n_kv_heads=2))
    tokens = torch.randint(0, 97, (4, 17))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(150):
        loss = model(tokens[:, :-1], tokens[:, 1:]).objective
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.1


HF_VARIANTS = {
    "llama": dict(),
    "llama-one_plus": dict(norm=NormConfig(**{"gain": "one_plus"})),
    "llama-untied": dict(tie_embeddings=False),
    "qwen3": dict(norm=NormConfig(qk="rmsnorm")),
    "olmo2": dict(norm=NormConfig(placement="reordered", qk="rmsnorm", qk_axis="all")),
    "llama-layernorm-scaling": dict(norm=NormConfig(depth_scaling="inverse_sqrt")),  # 1/sqrt(l) folded into the gains
}


@pytest.mark.parametrize("variant", HF_VARIANTS)
def test_hugging_face_twin_gives_the_same_logits(variant):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    ours = Transformer(tiny(rope_theta=500000.0, **HF_VARIANTS[variant])).eval()
    for norm in ours.norm_modules().values():  # non-trivial gains, so the norm mapping is checked
        torch.nn.init.normal_(norm.weight, 1.0, 0.2)
    config = hf_config(ours)
    assert config["model_type"] == variant.split("-")[0]
    theirs = getattr(transformers, config["architectures"][0])(transformers.AutoConfig.for_model(**config)).eval()
    missing, unexpected = theirs.load_state_dict(hf_state_dict(ours), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    tokens = torch.randint(0, 97, (2, 20))
    with torch.no_grad():
        torch.testing.assert_close(theirs(tokens).logits, ours(tokens), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "overrides, reason",
    [
        (dict(norm=NormConfig(name="layernorm")), "LayerNorm.*only have RMSNorm"),
        (dict(norm=NormConfig(name="prmsnorm")), "PartialRMSNorm"),
        (dict(norm=NormConfig(name="fused_rmsnorm", **{"k": 4})), "FusedRMSNorm"),
        (dict(norm=NormConfig(name="dyt")), "DyT"),
        (dict(norm=NormConfig(qk="dyt")), "attn.q_norm \\(DyT"),
        (dict(norm=NormConfig(placement="peri")), "placement 'peri' with QK-norm none has no Hugging Face equivalent"),
        (dict(norm=NormConfig(placement="reordered")), "OLMo 2 reordered with QK-norm over all heads"),
        (dict(norm=NormConfig(qk="rmsnorm", qk_axis="all")), "Qwen3 pre-norm with per-head QK-norm"),
        (dict(norm=NormConfig(**{"eps": 1e-5}, qk="rmsnorm", roles={"q": {"eps": 1e-6}})), "eps"),
        (dict(logit_softcap=30.0), "model.logit_softcap has no equivalent"),
        (dict(attn_softcap=50.0), "model.attn_softcap has no equivalent"),
        (dict(embed_scale="learned"), "model.embed_scale=learned has no equivalent"),
        (dict(norm=NormConfig(layer_placements=["post", "pre"])), "norm.layer_placements has no equivalent"),
        (
            dict(norm=NormConfig(placement="deepnorm")),
            "placement 'deepnorm' with QK-norm none has no Hugging Face equivalent",
        ),
        (
            dict(norm=NormConfig(placement="mix_ln")),
            "placement 'mix_ln' with QK-norm none has no Hugging Face equivalent",
        ),
    ],
)
def test_export_refuses_variants_hugging_face_lacks(overrides, reason):
    with pytest.raises(ValueError, match=reason):
        hf_config(Transformer(tiny(**overrides)))


@pytest.mark.gpu
@pytest.mark.parametrize("n_kv_heads", [4, 12], ids=["gqa", "mha"])
def test_training_attention_runs_on_sdpa_flash_backend_under_bf16_autocast(n_kv_heads):
    """gpu_125m's attention (head_dim 64, 12 query heads, GQA or not), forward and backward under bf16 autocast, with
    every SDPA backend but flash attention switched off: SDPA raises where flash cannot take the call, so a mask, a
    dtype or a layout that sent training to the math kernel (GQA runs only on flash or math on CUDA) fails here."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    cfg = tiny(vocab_size=4096, d_model=768, n_layers=2, n_heads=12, n_kv_heads=n_kv_heads, max_seq_len=512)
    model = Transformer(cfg).cuda()
    tokens = torch.randint(0, cfg.vocab_size, (2, cfg.max_seq_len + 1), device="cuda")
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION), torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(tokens[:, :-1], tokens[:, 1:]).objective
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
