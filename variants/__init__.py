"""The papers' variants of the core, one file per paper, each imported only when a config chooses it.

    hybridnorm.py         HybridNorm and HybridNorm* (Zhuo et al. 2025): QKV-norm blocks, post-norm FFN
    deepnorm.py           DeepNorm (Wang et al. 2022): post-norm with an up-weighted residual, DeepNet's init
    mix_ln.py             Mix-LN (Li et al. 2024): post-norm in the first layers, pre-norm after
    layernorm_scaling.py  LayerNorm Scaling (Sun et al. 2025): layer l's norms scaled by 1/sqrt(l)
    simplenorm.py         SimpleNorm (SimpleGPT): a norm after every linear layer
    gated_attention.py    gated attention (Qiu et al. 2025): a sigmoid gate on each head's output
    attention_sinks.py    learned sinks (gpt-oss): one logit per head in the softmax's denominator
    score_softcap.py      the attention scores' soft-cap (Gemma 2)
    op_block.py           the OP block's down-weighted residual branches (He et al. 2024)
    ngpt.py               nGPT (Loshchilov et al. 2025): the normalized Transformer, a model of its own
    qk_clip.py            QK-clip (Kimi K2): a post-step hook that rescales q and k where logits grew
    muon.py               Muon (Jordan et al. 2024; Moonlight): an optimizer for the blocks' matrices

model/registry.py maps each placement and model switch to its file; training/step/optim.py and
training/step/post_step.py map the training switches (train.optimizer, train.qk_clip). A variant plugs into
the core's slots by subclassing (model/attention.py, model/mlp.py, model/blocks.py), refuses what it cannot
combine with in its own file (``refusal(cfg)`` for a config, or its classes' constructors for what only the
built model shows), and a placement may word its part of the run's label.
"""
