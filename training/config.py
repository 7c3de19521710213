"""Typed schemas for the Hydra configs, so a misspelled key or a wrong type fails at start.

``configs/config.yaml`` lists ``normlab_schema`` first in its defaults; every group's yaml
then merges onto these dataclasses, and OmegaConf rejects keys they do not declare.
Annotations use ``typing`` forms because OmegaConf reads them (PEP 604 unions are not
understood by every version we support).
"""

import dataclasses
import enum
import logging
import math
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, NamedTuple, Optional  # noqa: UP035

from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import configure_log
from hydra.experimental.callback import Callback
from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf

from model.config import ModelConfig, config_key, rule_refusal
from model.norm_roles import ROLES
from norms import GAINS
from training.errors import NormlabError
from training.loggers import WANDB_MODES
from training.nonfinite import NAN_POLICIES
from training.optim import OPTIMIZERS, WEIGHT_DECAY_MODES
from training.run_record import register_run_name_resolvers
from training.runtime import PRECISIONS
from training.variant import label_keys, variant_label

# ruff: noqa: UP006, UP045


class ConfigError(NormlabError, ValueError):
    """A config value that cannot work; the message names the key to change."""


class Choice(str, enum.Enum):
    """A config key with a fixed set of values, refused at composition with the allowed ones
    (``Invalid value 'x', expected one of [...]``, with the key). Compares and prints as its value."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


def _choice(name: str, values) -> type[Choice]:
    return Choice(name, {value: value for value in values}, module=__name__)  # picklable by name (joblib sweeps)


Gain = _choice("Gain", GAINS)
NanPolicy = _choice("NanPolicy", NAN_POLICIES)
Precision = _choice("Precision", PRECISIONS)
WandbMode = _choice("WandbMode", WANDB_MODES)
WeightDecayMode = _choice("WeightDecayMode", WEIGHT_DECAY_MODES)
OptimizerName = _choice("OptimizerName", OPTIMIZERS)
MuonLRAdjustment = _choice("MuonLRAdjustment", ("match_rms_adamw", "original"))
Parallel = _choice("Parallel", ("ddp", "fsdp"))  # train.parallel: training/fsdp.py says what fsdp does


def checked(default, rule: str = "", label: str = ""):
    """A schema field whose value (when not null) must meet ``rule`` (one of model.config's ``RULES``), and whose
    part of the run's label away from its default is ``label`` (training/variant.py)."""
    return field(default=default, metadata={"rule": rule, "label": label})


def check_values(node, schema, prefix: str = "") -> None:
    """Refuse the first value of ``node`` (a composed config) that breaks its field's rule in ``schema``, with
    a one-line ConfigError naming the key, the value and what is allowed; nested dataclasses are walked."""
    for f in dataclasses.fields(schema):
        value = node.get(f.name) if hasattr(node, "get") else None
        if isinstance(value, DictConfig):
            nested = type(f.default_factory()) if f.default_factory is not dataclasses.MISSING else None
            if nested is not None and dataclasses.is_dataclass(nested):
                check_values(value, nested, f"{prefix}{f.name}.")
            continue
        refusal = rule_refusal(f"{prefix}{f.name}", value, f.metadata.get("rule"), _nullable(f))
        if refusal:
            raise ConfigError(refusal)


def _nullable(f) -> bool:
    return f.default is None or "Optional" in str(f.type)


def plain(value):
    """A Choice as its plain string (what checkpoints and records store), anything else as it is."""
    return value.value if isinstance(value, Choice) else value


@dataclass
class NormOptions:
    """Every option some registered norm takes (norms/: each class's keyword arguments), None meaning the
    norm type's own default. An option the chosen type does not take is refused before any data loads;
    tests/unit/training/test_config.py checks that these are exactly the registered norms' options."""

    eps: Optional[float] = checked(None, "> 0")
    p: Optional[float] = checked(None, "in (0, 1]")  # pRMSNorm: the share of features its statistic reads
    k: Optional[int] = checked(None, ">= 1")  # pRMSNorm: or their count
    bias: Optional[bool] = None
    cast_before_weight: Optional[bool] = None
    # standard | one_plus | none; the label names any but the standard gain
    gain: Optional[Gain] = field(default=None, metadata={"label": "gain_{value}", "quiet": ("standard",)})  # type: ignore[valid-type]
    alpha_init: Optional[float] = checked(None, "> 0")  # DyT, Derf
    shift_init: Optional[float] = None  # Derf

    def options(self) -> Dict[str, Any]:
        """The options given a value (the others keep the norm type's default)."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(NormOptions)}  # not a subclass' fields
        return {name: plain(value) for name, value in values.items() if value is not None}


# Options for one role alone, e.g. norm.roles.attn_in.alpha_init=0.8 (typed: a misspelled role or
# option is refused at composition).
NormRoles = dataclasses.make_dataclass(
    "NormRoles", [(role, NormOptions, field(default_factory=NormOptions)) for role in ROLES]
)


def role_options(roles) -> Dict[str, Dict[str, Any]]:
    """The options set for single roles (norm.roles), e.g. {"attn_in": {"alpha_init": 0.8}}."""
    return {role: options for role in ROLES if (options := NormOptions.options(getattr(roles, role)))}


# ModelConfig (model/config.py) is the schema of the norm and model groups: each of its fields becomes the key it
# declares, typed, with its allowed values (a Choice), its rule and its default. The norm's name, options and
# roles are the norm group's own keys (norm.name, norm.<option>, norm.roles.<role>.<option>).
_STRUCTURED = {"norm": "name", "norm_options": None, "norm_role_options": None}


def _schema_field(f, group: str):
    """(name in the group, type, field) for the ModelConfig field ``f``."""
    name = config_key(f).removeprefix(f"{group}.")
    if f.metadata.get("choices"):
        choice = _choice("".join(part.title() for part in name.split("_")), f.metadata["choices"])
        globals()[choice.__name__] = choice  # found by name when a sweep's configs are unpickled
        return name, choice, field(default=choice(f.default))
    metadata = {"rule": f.metadata["rule"]} if f.metadata.get("rule") else {}
    if f.default is not dataclasses.MISSING:
        return name, f.type, field(default=f.default, metadata=metadata)
    return name, f.type, field(default_factory=f.default_factory, metadata=metadata)


def _group_fields(group: str) -> list:
    return [
        _schema_field(f, group)
        for f in dataclasses.fields(ModelConfig)
        if f.name not in _STRUCTURED and config_key(f).split(".")[0] == group
    ]


# The norm group: the norm type and its options, plus structure that is not a module option (placement, qk, ...),
# which shapes the model and is never passed to a norm.
NormConfig = dataclasses.make_dataclass(
    "NormConfig",
    [("name", str, field(default=MISSING)), ("roles", NormRoles, field(default_factory=NormRoles))]
    + _group_fields("norm"),
    bases=(NormOptions,),
)
# The model group holds the decoder's shape and its switches, plus a preset name used in run names.
ModelPreset = dataclasses.make_dataclass(
    "ModelPreset", [("name", str, field(default="custom"))] + _group_fields("model")
)


@dataclass
class DataConfig:
    source: str = "kjv"  # kjv | text_files | hf
    name: str = "kjv"  # a label for run names and cache keys
    # text_files: local .txt / .jsonl files or globs
    train_files: List[str] = field(default_factory=list)
    val_files: List[str] = field(default_factory=list)
    val_fraction: float = checked(0.05, "in (0, 1)")  # held-out share of documents when val_files is empty
    text_sample_by: str = "paragraph"  # .txt documents: line | paragraph | document
    # hf: a Hugging Face hub dataset
    hf_path: Optional[str] = None
    hf_name: Optional[str] = None
    hf_train_split: str = "train"
    hf_val_split: Optional[str] = "validation"
    streaming: bool = False
    max_documents: Optional[int] = checked(None, ">= 1")  # cap on training documents (required for a streamed split)
    text_field: str = "text"
    # kjv: the books held out for validation (whole books, so validation text is unseen)
    kjv_val_books: List[str] = field(default_factory=lambda: ["Ruth", "Ecclesiastes", "Mark", "Philippians", "Jude"])
    # tokenizer: "bpe" trains a byte-level BPE; else a tokenizer.json path or a local HF tokenizer name
    tokenizer: str = "bpe"
    vocab_size: int = checked(4096, ">= 1")
    cache_dir: Optional[str] = None  # default: $XDG_CACHE_HOME/normlab or ~/.cache/normlab
    val_windows: int = checked(64, ">= 1")  # fixed validation windows (all runs evaluate the same tokens): val/ keys
    # windows disjoint from those, midway between them, logged as heldout/ keys: a study selects
    # each variant's best rate on val/ and reports heldout/ (0: none)
    heldout_windows: int = checked(0, ">= 0")


@dataclass
class MuonConfig:
    """train.muon: torch.optim.Muon's options (the blocks' matrices under train.optimizer=muon)."""

    momentum: float = checked(0.95, "in [0, 1)")
    nesterov: bool = True
    ns_steps: int = checked(5, ">= 1")  # Newton-Schulz iterations
    # match_rms_adamw (Moonlight): the update's RMS matches AdamW's, so AdamW's lr and decay carry over;
    # original (Keller Jordan's): scaled by sqrt(max(1, rows / cols)), which wants its own, larger lr
    adjust_lr_fn: MuonLRAdjustment = MuonLRAdjustment.match_rms_adamw  # type: ignore[valid-type]
    weight_decay: Optional[float] = checked(None, ">= 0")  # None: train.weight_decay, in train.weight_decay_mode


@dataclass
class TrainConfig:
    seq_len: Optional[int] = checked(None, ">= 1")  # None: model.max_seq_len
    batch_size: int = checked(16, ">= 1")  # sequences per micro-batch per process
    global_batch_tokens: Optional[int] = checked(
        None, ">= 1"
    )  # None: batch_size * seq_len * processes (no accumulation)
    max_steps: int = checked(1000, ">= 1")
    lr: float = checked(3e-3, "> 0")  # the peak learning rate
    min_lr_ratio: float = checked(0.1, "in [0, 1]")  # cosine decays to lr * min_lr_ratio
    warmup_steps: int = checked(50, ">= 0")
    weight_decay: float = checked(0.1, ">= 0")
    z_loss: float = checked(
        0.0, ">= 0", "zloss{value:g}"
    )  # coef * mean(logsumexp(logits)^2) (PaLM: 1e-4): train/z_loss
    # tau: after each step, heads whose largest logit exceeded it are rescaled (variants/qk_clip.py)
    qk_clip: Optional[float] = checked(None, "> 0", "qkclip{value:g}")
    # coupled: AdamW's decay, lr * weight_decay per step. independent: weight_decay is the per-step
    # shrink at the schedule's peak, scaled by the schedule only (Wortsman et al. use 1e-4; 0.1
    # would shrink every matrix by 10% a step there), so sweeping the rate does not sweep the decay.
    weight_decay_mode: WeightDecayMode = checked(WeightDecayMode.coupled, label="wd_{value}")  # type: ignore[valid-type]
    decay_norms_and_embeddings: bool = False
    # adamw | muon: torch.optim.Muon for the blocks' matrices, AdamW for the rest (variants/muon.py)
    optimizer: OptimizerName = checked(OptimizerName.adamw, label="{value}")  # type: ignore[valid-type]
    muon: MuonConfig = field(default_factory=MuonConfig)
    beta1: float = checked(0.9, "in [0, 1)")
    beta2: float = checked(0.95, "in [0, 1)")
    grad_clip: Optional[float] = checked(1.0, "> 0")  # the largest gradient norm; null: no clipping
    precision: Precision = Precision.auto  # type: ignore[valid-type]  # auto (bf16 autocast on CUDA, fp32 elsewhere) | fp32 | bf16
    compile: Optional[bool] = None  # None: on for CUDA, and on CPU from training/runtime.py CPU_COMPILE_MIN_STEPS steps
    log_every: int = checked(10, ">= 1")
    eval_every: int = checked(100, ">= 1")
    stats_every: int = checked(50, ">= 1")
    # the probe pass's probes: the core's by name (norm_io, stream, attention, logits: training/probes/), any
    # other as package.module:Class. By default what each norm sees and emits, and the residual stream.
    probes: List[str] = field(default_factory=lambda: ["norm_io", "stream"])
    checkpoint_every: int = checked(200, ">= 1")
    keep_checkpoints: int = checked(2, ">= 1")
    nan_policy: NanPolicy = NanPolicy.stop  # type: ignore[valid-type]  # stop (error) | skip (up to max_skipped_steps) | record (end the run, diverged: true)
    max_skipped_steps: int = checked(5, ">= 0")
    perf_warmup_steps: int = checked(3, ">= 0")  # steps left out of tokens/s and MFU (compilation, allocator warm-up)
    peak_flops: Optional[float] = checked(None, "> 0")  # override the device's peak FLOP/s used for MFU
    dist_timeout_s: float = checked(
        600.0, "> 0"
    )  # a collective (or the rendezvous) waiting longer than this fails the run
    parallel: Parallel = Parallel.ddp  # type: ignore[valid-type]  # ddp (whole copies) | fsdp (FSDP2: each process holds a shard)
    # a run directory or checkpoint whose weights (those of matching name and shape) and tokenizer a new run starts
    # from: a fine-tune, or a norm swap (training/init_from.py)
    init_from: Optional[str] = None


@dataclass
class LoggerConfig:
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
    seed: int = checked(0, ">= 0")
    device: str = "auto"  # auto: cuda, else mps, else cpu
    cpu_threads: Optional[int] = checked(
        None, ">= 1"
    )  # None: this process's share of the cores (training/cpu_threads.py)
    # The norm variant, e.g. rmsnorm-peri-qk: what runs of one design choice share (wandb groups them by it).
    variant: str = "${norm_variant:}"  # the label of the schema's switches (training/variant.py)
    run_name: str = "${model.name}-${variant}-s${seed}${overrides_tag:}"
    # Keys that may differ from the run's record when resuming it (recorded under resumes: in config.yaml).
    resume_with_changes: List[str] = field(default_factory=list)


class Contradiction(NamedTuple):
    """Two settings that are each allowed but together train something other than the run's label says."""

    holds: Callable[[DictConfig, Mapping[str, Any]], bool]  # of the composed config and Hydra's group choices
    refusal: Callable[[DictConfig], str]  # one line that names the fix


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


def check_config(cfg: DictConfig, choices: Optional[Mapping[str, Any]] = None) -> None:
    """Refuse a composed run config before anything is written, in one line naming the key and the fix: a value
    out of its range, a run_name that is no folder name, a contradiction. ``choices``: the config groups Hydra
    composed, by default this Hydra job's (none outside one)."""
    check_values(cfg, Config)
    check_run_name(cfg.run_name)
    if choices is None:
        choices = HydraConfig.get().runtime.choices if HydraConfig.initialized() else {}
    for contradiction in CONTRADICTIONS:
        if contradiction.holds(cfg, choices):
            raise ConfigError(contradiction.refusal(cfg))


class ConfigCheck(Callback):
    """Runs check_config before Hydra makes the run's folder (hydra.callbacks in configs/config.yaml): a refused
    command then leaves no folder, and a run_name that is no folder name is refused before Hydra would make the
    folders of ../x outside runs/, or fail with a traceback on a name past 255 bytes. The refusal is train.py's: one
    logged line, and exit 1. A sweep's run names are checked before Hydra makes any job's folder (each value of a
    swept run_name, else the one name); the rest of each job's config is checked by train.py, in its folder."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        HydraConfig.instance().set_config(config)  # as Hydra's job does next: run_name's ${overrides_tag:} reads it
        self._refuse_unless(lambda: check_config(config, config.hydra.runtime.choices), config)

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


def build_model_config(cfg, vocab_size: int, rows: int | None = None) -> ModelConfig:
    """The model config that a composed run config (and a tokenizer's vocabulary size) describe: each field read
    from the key it declares. The embedding table has the vocabulary's rows rounded up to a multiple of 64, or
    ``rows`` where that is more: a checkpoint padded further (Qwen3's 151,936 rows for 151,669 tokens) keeps its
    table when a run starts from it or resumes it."""
    values = {}
    for f in dataclasses.fields(ModelConfig):
        value = OmegaConf.select(cfg, config_key(f)) if f.name not in _STRUCTURED else None
        if isinstance(value, (DictConfig, ListConfig)):
            value = OmegaConf.to_container(value, resolve=True)
        values[f.name] = plain(value)
    norm = OmegaConf.to_object(cfg.norm)
    values.update(norm=norm.name, norm_options=norm.options(), norm_role_options=role_options(norm.roles))
    values["vocab_size"] = max(VOCAB_MULTIPLE * math.ceil(vocab_size / VOCAB_MULTIPLE), rows or 0)
    return ModelConfig(**values)


CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"


def default_config() -> DictConfig:
    """The config train.py composes from no override (inside a Hydra app, from the app's own config folder)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        return compose("config")
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose("config")


# The labelled fields beside ModelConfig's (training/variant.py): the norm's options and the train group's.
LABELLED_GROUPS = (("norm", NormOptions), ("train", TrainConfig))


# Overrides of these keys show in the readable part of a run name (the variant label holds them);
# others add a short hash.
def run_name_keys() -> tuple[str, ...]:
    return ("norm", "model", "seed", "run_name", *label_keys(LABELLED_GROUPS))


def register_configs() -> None:
    register_run_name_resolvers(run_name_keys(), lambda get: variant_label(get, LABELLED_GROUPS))
    store = ConfigStore.instance()
    store.store(name="normlab_schema", node=Config)
