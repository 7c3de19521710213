"""The run config, typed once: Hydra composes the groups onto these dataclasses, and the entry points turn the
composed config into one ``Config`` object (``typed_config``) that every reader below them takes.

``configs/config.yaml`` lists ``normlab_schema`` first in its defaults; every group's yaml then merges onto these
dataclasses, and OmegaConf rejects keys they do not declare and choices they do not hold. The model and norm
groups are model/config.py's ``ModelShape`` (as ``ModelPreset``, with its name) and ``NormConfig``: a key is its
field's name, as in the ``ModelConfig`` the model is built from (``model_config``). A value out of its range or
settings that contradict each other are refused by ``check_config`` in one line naming the key and the fix.
Annotations use ``typing`` forms because OmegaConf reads them (not every version reads PEP 604 unions).
"""

import logging
import math
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, List, NamedTuple, Optional  # noqa: UP035

from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import configure_log
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict

from model.config import ModelConfig, ModelShape, NormConfig, NormOptions, PlainValues, choice, declared, refusal
from training.errors import NormlabError
from training.run.label import label_keys, variant_label
from training.run.record import register_run_name_resolvers
from training.run.runtime import PRECISIONS
from training.step.nonfinite import NAN_POLICIES
from training.step.optim import OPTIMIZERS, WEIGHT_DECAY_MODES
from training.telemetry.loggers import WANDB_MODES

# ruff: noqa: UP006, UP045


class ConfigError(NormlabError, ValueError):
    """A config value that cannot work; the message names the key to change."""


NanPolicy = choice("NanPolicy", NAN_POLICIES)
Precision = choice("Precision", PRECISIONS)
WandbMode = choice("WandbMode", WANDB_MODES)
WeightDecayMode = choice("WeightDecayMode", WEIGHT_DECAY_MODES)
OptimizerName = choice("OptimizerName", OPTIMIZERS)
MuonLRAdjustment = choice("MuonLRAdjustment", ("match_rms_adamw", "original"))
Parallel = choice("Parallel", ("ddp", "fsdp"))  # train.parallel: training/step/fsdp.py says what fsdp does


@dataclass
class ModelPreset(ModelShape):
    """The model group: the decoder's shape and switches, and the preset's name (used in run names)."""

    name: str = "custom"


@dataclass
class DataConfig:
    source: str = "kjv"  # kjv | text_files | hf
    name: str = "kjv"  # a label for run names and cache keys
    # text_files: local .txt / .jsonl files or globs
    train_files: List[str] = field(default_factory=list)
    val_files: List[str] = field(default_factory=list)
    val_fraction: float = declared(0.05, rule="in (0, 1)")  # held-out share of documents when val_files is empty
    text_sample_by: str = "paragraph"  # .txt documents: line | paragraph | document
    # hf: a Hugging Face hub dataset
    hf_path: Optional[str] = None
    hf_name: Optional[str] = None
    hf_train_split: str = "train"
    hf_val_split: Optional[str] = "validation"
    streaming: bool = False
    max_documents: Optional[int] = declared(
        None, rule=">= 1"
    )  # cap on training documents (required for a streamed split)
    text_field: str = "text"
    # kjv: the books held out for validation (whole books, so validation text is unseen)
    kjv_val_books: List[str] = field(default_factory=lambda: ["Ruth", "Ecclesiastes", "Mark", "Philippians", "Jude"])
    # tokenizer: "bpe" trains a byte-level BPE; else a tokenizer.json path or a local HF tokenizer name
    tokenizer: str = "bpe"
    vocab_size: int = declared(4096, rule=">= 1")
    cache_dir: Optional[str] = None  # default: $XDG_CACHE_HOME/normlab or ~/.cache/normlab
    val_windows: int = declared(
        64, rule=">= 1"
    )  # fixed validation windows (all runs evaluate the same tokens): val/ keys
    # windows disjoint from those, midway between them, logged as heldout/ keys: a study selects
    # each variant's best rate on val/ and reports heldout/ (0: none)
    heldout_windows: int = declared(0, rule=">= 0")


@dataclass
class MuonConfig(PlainValues):
    """train.muon: torch.optim.Muon's options (the blocks' matrices under train.optimizer=muon)."""

    momentum: float = declared(0.95, rule="in [0, 1)")
    nesterov: bool = True
    ns_steps: int = declared(5, rule=">= 1")  # Newton-Schulz iterations
    # match_rms_adamw (Moonlight): the update's RMS matches AdamW's, so AdamW's lr and decay carry over;
    # original (Keller Jordan's): scaled by sqrt(max(1, rows / cols)), which wants its own, larger lr
    adjust_lr_fn: MuonLRAdjustment = MuonLRAdjustment.match_rms_adamw  # type: ignore[valid-type]
    weight_decay: Optional[float] = declared(None, rule=">= 0")  # None: train.weight_decay, in train.weight_decay_mode


@dataclass
class TrainConfig(PlainValues):
    seq_len: Optional[int] = declared(None, rule=">= 1")  # None: model.max_seq_len
    batch_size: int = declared(16, rule=">= 1")  # sequences per micro-batch per process
    # None: batch_size * seq_len * processes (no accumulation)
    global_batch_tokens: Optional[int] = declared(None, rule=">= 1")
    max_steps: int = declared(1000, rule=">= 1")
    lr: float = declared(3e-3, rule="> 0")  # the peak learning rate
    min_lr_ratio: float = declared(0.1, rule="in [0, 1]")  # cosine decays to lr * min_lr_ratio
    warmup_steps: int = declared(50, rule=">= 0")
    weight_decay: float = declared(0.1, rule=">= 0")
    # coef * mean(logsumexp(logits)^2) (PaLM: 1e-4): train/z_loss
    z_loss: float = declared(0.0, rule=">= 0", label="zloss{value:g}")
    # tau: after each step, heads whose largest logit exceeded it are rescaled (variants/qk_clip.py)
    qk_clip: Optional[float] = declared(None, rule="> 0", label="qkclip{value:g}")
    # coupled: AdamW's decay, lr * weight_decay per step. independent: weight_decay is the per-step
    # shrink at the schedule's peak, scaled by the schedule only (Wortsman et al. use 1e-4; 0.1
    # would shrink every matrix by 10% a step there), so sweeping the rate does not sweep the decay.
    weight_decay_mode: WeightDecayMode = declared(WeightDecayMode.coupled, label="wd_{value}")  # type: ignore[valid-type]
    decay_norms_and_embeddings: bool = False
    # adamw | muon: torch.optim.Muon for the blocks' matrices, AdamW for the rest (variants/muon.py)
    optimizer: OptimizerName = declared(OptimizerName.adamw, label="{value}")  # type: ignore[valid-type]
    muon: MuonConfig = field(default_factory=MuonConfig)
    beta1: float = declared(0.9, rule="in [0, 1)")
    beta2: float = declared(0.95, rule="in [0, 1)")
    grad_clip: Optional[float] = declared(1.0, rule="> 0")  # the largest gradient norm; null: no clipping
    precision: Precision = Precision.auto  # type: ignore[valid-type]  # auto (bf16 autocast on CUDA, fp32 elsewhere) | fp32 | bf16
    compile: Optional[bool] = (
        None  # None: on for CUDA, and on CPU from training/run/runtime.py CPU_COMPILE_MIN_STEPS steps
    )
    log_every: int = declared(10, rule=">= 1")
    eval_every: int = declared(100, rule=">= 1")
    stats_every: int = declared(50, rule=">= 1")
    # the probe pass's probes: the core's by name (norm_io, stream, attention, logits: training/telemetry/probes/), any
    # other as package.module:Class. By default what each norm sees and emits, and the residual stream.
    probes: List[str] = field(default_factory=lambda: ["norm_io", "stream"])
    checkpoint_every: int = declared(200, rule=">= 1")
    keep_checkpoints: int = declared(2, rule=">= 1")
    nan_policy: NanPolicy = NanPolicy.stop  # type: ignore[valid-type]  # stop (error) | skip (up to max_skipped_steps) | record (end the run, diverged: true)
    max_skipped_steps: int = declared(5, rule=">= 0")
    perf_warmup_steps: int = declared(
        3, rule=">= 0"
    )  # steps left out of tokens/s and MFU (compilation, allocator warm-up)
    peak_flops: Optional[float] = declared(None, rule="> 0")  # override the device's peak FLOP/s used for MFU
    # a collective (or the rendezvous) waiting longer than this fails the run
    dist_timeout_s: float = declared(600.0, rule="> 0")
    parallel: Parallel = Parallel.ddp  # type: ignore[valid-type]  # ddp (whole copies) | fsdp (FSDP2: each process holds a shard)
    # a run directory or checkpoint whose weights (those of matching name and shape) and tokenizer a new run starts
    # from: a fine-tune, or a norm swap (training/run/init_from.py)
    init_from: Optional[str] = None


@dataclass
class LoggerConfig(PlainValues):
    name: str = "none"  # wandb | none
    project: str = "normlab"
    entity: Optional[str] = None
    mode: WandbMode = WandbMode.auto  # type: ignore[valid-type]  # auto | online | offline | disabled
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
    seed: int = declared(0, rule=">= 0")
    device: str = "auto"  # auto: cuda, else mps, else cpu
    # None: this process's share of the cores (training/run/cpu_threads.py)
    cpu_threads: Optional[int] = declared(None, rule=">= 1")
    # The norm variant, e.g. rmsnorm-peri-qk: what runs of one design choice share (wandb groups them by it).
    variant: str = "${norm_variant:}"  # the label of the schema's switches (training/run/label.py)
    run_name: str = "${model.name}-${variant}-s${seed}${overrides_tag:}"
    # Keys that may differ from the run's record when resuming it (recorded under resumes: in config.yaml).
    resume_with_changes: List[str] = field(default_factory=list)


class Contradiction(NamedTuple):
    """Two settings that are each allowed but together train something other than the run's label says."""

    holds: Callable[["Config", Mapping[str, Any]], bool]  # of the run config and Hydra's group choices
    refusal: Callable[["Config"], str]  # one line that names the fix


# What does not combine, in one table, checked with the values before anything is written (check_config). The
# group choices matter where a group sets plain keys: norm=ngpt sets norm.name=l2norm and norm.placement=ngpt.
CONTRADICTIONS = (
    Contradiction(
        lambda cfg, choices: choices.get("norm") == "ngpt" and cfg.norm.placement != "ngpt",
        lambda cfg: (
            f"norm=ngpt is nGPT's own model (norm.placement=ngpt), so norm.placement={cfg.norm.placement} would "
            f"train {cfg.norm.name} in {cfg.norm.placement} blocks with nGPT's training settings: drop "
            f"norm.placement, or choose norm={cfg.norm.name} for the L2 norm in other blocks"
        ),
    ),
    Contradiction(
        lambda cfg, choices: cfg.norm.layer_placements is not None and cfg.norm.placement != "pre",
        lambda cfg: (
            f"norm.layer_placements={list(cfg.norm.layer_placements)} sets each layer's block, so "
            f"norm.placement={cfg.norm.placement} would label the run with blocks it does not build: drop one of "
            "the two (a per-layer list stands beside norm.placement=pre)"
        ),
    ),
)

NAME_MAX = 255  # bytes in one folder name (a path component) on Linux, macOS and Windows file systems


def check_run_name(name: str) -> None:
    """Refuse a run_name that is not one folder name: the run's folder is runs/<run_name> (configs/config.yaml)."""
    if name in ("", ".", "..") or any(separator in name for separator in {"/", os.sep}):
        raise ConfigError(
            f"run_name={name!r} is not one folder name inside runs/ (the run's folder is runs/<run_name>): choose a "
            "run_name without '/' that is not '.' or '..', e.g. run_name=my-run"
        )
    size = len(os.fsencode(name))
    if size > NAME_MAX:
        raise ConfigError(
            f"run_name={name[:24]!r}... is {size} bytes, past the {NAME_MAX} bytes a folder name may have (the run's "
            f"folder is runs/<run_name>): choose a run_name of at most {NAME_MAX} bytes"
        )


def check_config(cfg: "Config", choices: Optional[Mapping[str, Any]] = None) -> None:
    """Refuse a run config before anything is written, in one line naming the key and the fix: a value out of its
    range, a run_name that is no folder name, a contradiction. ``choices``: the config groups Hydra composed, by
    default this Hydra job's (none outside one)."""
    problem = refusal(cfg, "")
    if problem:
        raise ConfigError(problem)
    check_run_name(cfg.run_name)
    if choices is None:
        choices = HydraConfig.get().runtime.choices if HydraConfig.initialized() else {}
    for contradiction in CONTRADICTIONS:
        if contradiction.holds(cfg, choices):
            raise ConfigError(contradiction.refusal(cfg))


def typed_config(composed: DictConfig) -> "Config":
    """Hydra's composed config as one ``Config`` (interpolations resolved, choices plain strings): the entry points
    call this once, and every reader below them takes the object."""
    node = composed.copy()
    with open_dict(node):
        node.pop("hydra", None)
    return OmegaConf.to_object(node)


class ConfigCheck(Callback):
    """check_config before Hydra makes the run's folder (configs/config.yaml's hydra.callbacks), so a refused command
    leaves none (a run_name of ../x, or past 255 bytes, among them): one logged line, and exit 1. A sweep's run names
    are checked before any job's folder is made; the rest of each job's config by train.py, in its folder."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        HydraConfig.instance().set_config(config)  # as Hydra's job does next: run_name's ${overrides_tag:} reads it
        self._refuse_unless(lambda: check_config(typed_config(config), config.hydra.runtime.choices), config)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from hydra.core.override_parser.overrides_parser import OverridesParser

        overrides = OverridesParser.create().parse_overrides(list(config.hydra.overrides.task))
        swept = [o for o in overrides if o.key_or_group == "run_name" and o.is_sweep_override()]
        names = [str(name) for o in swept for name in o.sweep_string_iterator()]
        if not swept:
            HydraConfig.instance().set_config(config)
            names = [config.run_name]
        self._refuse_unless(lambda: [check_run_name(name) for name in names], config)

    @staticmethod
    def _refuse_unless(check: Callable[[], Any], config: DictConfig) -> None:
        try:
            check()
        except ConfigError as err:
            configure_log(config.hydra.job_logging)
            logging.getLogger("normlab.train").error("%s", err)
            sys.exit(1)


VOCAB_MULTIPLE = 64  # embedding rows are padded to a multiple of this for faster matmuls


def model_config(cfg: "Config", vocab_size: int, rows: Optional[int] = None) -> ModelConfig:
    """The model a run config describes for a tokenizer of ``vocab_size`` tokens. The embedding table has the
    vocabulary's rows rounded up to a multiple of 64, or ``model.vocab_size`` or ``rows`` where either is more: a
    checkpoint padded further (Qwen3's 151,936 rows for 151,669 tokens) keeps its table when a run starts from it
    or resumes it."""
    padded = VOCAB_MULTIPLE * math.ceil(vocab_size / VOCAB_MULTIPLE)
    return ModelConfig.of(cfg.model, cfg.norm, max(padded, cfg.model.vocab_size or 0, rows or 0))


# The labelled fields beside the norm group's and the model group's (training/run/label.py): the norm's options and
# the train group's.
LABELLED_GROUPS = (("norm", NormOptions), ("train", TrainConfig))


# Overrides of these keys show in the readable part of a run name (the variant label holds them);
# others add a short hash.
def run_name_keys() -> tuple[str, ...]:
    return ("norm", "model", "seed", "run_name", *label_keys(LABELLED_GROUPS))


def register_configs() -> None:
    register_run_name_resolvers(run_name_keys(), lambda get: variant_label(get, LABELLED_GROUPS))
    store = ConfigStore.instance()
    store.store(name="normlab_schema", node=Config)
