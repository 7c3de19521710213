"""Typed schemas for the Hydra configs, so a misspelled key or a wrong type fails at start.

``configs/config.yaml`` lists ``normlab_schema`` first in its defaults; every group's yaml
then merges onto these dataclasses, and OmegaConf rejects keys they do not declare.
Annotations use ``typing`` forms because OmegaConf reads them (PEP 604 unions are not
understood by every version we support).
"""

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional  # noqa: UP035

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from model.config import ModelConfig
from training.run_record import register_run_name_resolver

# ruff: noqa: UP006, UP045


@dataclass
class NormConfig:
    """The norm group: a registered name and the options its module takes (None = its default)."""

    name: str = MISSING
    eps: Optional[float] = None
    p: Optional[float] = None
    k: Optional[int] = None
    bias: Optional[bool] = None
    cast_before_weight: Optional[bool] = None

    def options(self) -> Dict[str, Any]:
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name != "name" and getattr(self, f.name) is not None
        }


# The model group holds the decoder's shape: every ModelConfig field except the norm (chosen by
# the norm group), plus a preset name used in run names.
ModelPreset = dataclasses.make_dataclass(
    "ModelPreset",
    [("name", str, field(default="custom"))]
    + [
        (f.name, f.type, field(default=f.default) if f.default is not dataclasses.MISSING else field())
        for f in dataclasses.fields(ModelConfig)
        if f.name not in ("norm", "norm_options")
    ],
)


@dataclass
class DataConfig:
    source: str = "kjv"  # kjv | text_files | hf
    name: str = "kjv"  # a label for run names and cache keys
    # text_files: local .txt / .jsonl files or globs
    train_files: List[str] = field(default_factory=list)
    val_files: List[str] = field(default_factory=list)
    val_fraction: float = 0.05  # held-out share of documents when val_files is empty
    text_sample_by: str = "paragraph"  # .txt documents: line | paragraph | document
    # hf: a Hugging Face hub dataset
    hf_path: Optional[str] = None
    hf_name: Optional[str] = None
    hf_train_split: str = "train"
    hf_val_split: Optional[str] = "validation"
    streaming: bool = False
    max_documents: Optional[int] = None  # cap on training documents (required for a streamed split)
    text_field: str = "text"
    # kjv: the books held out for validation (whole books, so validation text is unseen)
    kjv_val_books: List[str] = field(default_factory=lambda: ["Ruth", "Ecclesiastes", "Mark", "Philippians", "Jude"])
    # tokenizer: "bpe" trains a byte-level BPE; else a tokenizer.json path or a local HF tokenizer name
    tokenizer: str = "bpe"
    vocab_size: int = 4096
    cache_dir: Optional[str] = None  # default: $XDG_CACHE_HOME/normlab or ~/.cache/normlab
    val_windows: int = 64  # fixed validation windows (all runs evaluate the same tokens)


@dataclass
class TrainConfig:
    seq_len: Optional[int] = None  # None: model.max_seq_len
    batch_size: int = 16  # sequences per micro-batch per process
    global_batch_tokens: Optional[int] = None  # None: batch_size * seq_len * processes (no accumulation)
    max_steps: int = 1000
    lr: float = 3e-3
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
    warmup_steps: int = 50
    weight_decay: float = 0.1
    decay_norms_and_embeddings: bool = False
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    precision: str = "auto"  # auto (bf16 autocast on CUDA, fp32 elsewhere) | fp32 | bf16
    compile: Optional[bool] = None  # None: on for CUDA, off elsewhere
    log_every: int = 10
    eval_every: int = 100
    stats_every: int = 50
    checkpoint_every: int = 200
    keep_checkpoints: int = 2
    nan_policy: str = "stop"  # stop | skip
    max_skipped_steps: int = 5
    perf_warmup_steps: int = 3  # steps left out of tokens/s and MFU (compilation, allocator warm-up)
    peak_flops: Optional[float] = None  # override the device's peak FLOP/s used for MFU
    dist_timeout_s: float = 600.0  # a collective (or the rendezvous) waiting longer than this fails the run


@dataclass
class LoggerConfig:
    name: str = "none"  # wandb | none
    project: str = "normlab"
    entity: Optional[str] = None
    mode: str = "auto"  # auto | online | offline | disabled
    group: Optional[str] = None  # None: <model>-<norm>, so seeds of one setting sit together
    tags: List[str] = field(default_factory=list)
    init_timeout: float = 30.0  # seconds to wait for wandb online before falling back to offline


@dataclass
class Config:
    norm: NormConfig = field(default_factory=NormConfig)
    model: ModelPreset = field(default_factory=ModelPreset)  # type: ignore[valid-type]
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    seed: int = 0
    device: str = "auto"  # auto: cuda, else mps, else cpu
    run_name: str = "${model.name}-${norm.name}-s${seed}${overrides_tag:}"
    # Keys that may differ from the run's record when resuming it (recorded under resumes: in config.yaml).
    resume_with_changes: List[str] = field(default_factory=list)


@dataclass
class EvalConfig:
    """eval.py: checkpoints in, metrics, samples and activation statistics out."""

    checkpoint: Any = MISSING  # a run directory or .pt file, or a list of them
    data: Optional[DataConfig] = None  # None: each run's own data config (choose another with data=<name>)
    val_windows: Optional[int] = None  # None: the run's data.val_windows
    batch_size: int = 16
    prompt: str = "In the beginning"
    max_new_tokens: int = 64
    num_samples: int = 2
    temperature: float = 0.8
    top_k: Optional[int] = 50
    sample_seed: int = 0
    device: str = "auto"
    precision: str = "auto"
    logger: LoggerConfig = field(default_factory=LoggerConfig)


# Overrides of these keys show in the readable part of a run name; others add a short hash.
RUN_NAME_KEYS = ("norm", "model", "seed", "run_name")


def register_configs() -> None:
    register_run_name_resolver(RUN_NAME_KEYS)
    store = ConfigStore.instance()
    store.store(name="normlab_schema", node=Config)
    store.store(name="eval_schema", node=EvalConfig)
