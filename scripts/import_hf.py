"""Import a Hugging Face model folder (Llama, Qwen3 or OLMo 2) as a normlab run directory: export_hf.py's inverse.

    python scripts/import_hf.py ~/models/Llama-3.2-1B runs/llama-3.2-1b
    python eval.py checkpoint=runs/llama-3.2-1b                      # loss and bits per byte, its own tokenizer
    python scripts/export_hf.py runs/llama-3.2-1b exported/          # and back: the same tensors

The folder needs config.json, tokenizer.json and its weights: model.safetensors, shards with their
model.safetensors.index.json, or a pickled pytorch_model.bin (read with ``weights_only=True``, so nothing in it
runs). config.json picks the variant (model/hf.py): Llama is pre-norm RMSNorm, Qwen3 adds QK-norm per head,
OLMo 2 is reordered (a norm after each branch) with QK-norm over all heads. Another architecture, a setting
without an equivalent (biases, sliding windows, RoPE scaling other than Llama 3's), a missing or unexpected
tensor and a target folder that holds anything are refused in one line before anything is written.

Tensors are read one at a time (safetensors memory-mapped) into the model's float32 parameters, so the import
holds the model once. The run directory is what train.py writes at step 0: config.yaml (the config that
train.py composes from the overrides printed at the end), tokenizer.json and checkpoints/step_0000000.pt with a
fresh optimizer state; it is written beside the target and renamed into place once complete.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import shlex
import shutil
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from tokenizers import Tokenizer

from model import ModelConfig, build_model
from model.hf import HF_CLASSES, hf_model_config, hf_model_type, hf_tensor_shapes, load_hf_tensors
from training.batches import split_global_batch
from training.checkpoint import rng_states, save_checkpoint
from training.config import build_model_config, register_configs
from training.errors import NormlabError
from training.optim import build_optimizer
from training.run_record import write_new_record
from training.runtime import resolve_device, resolve_precision, seed_everything
from training.tokenizer import read_tokenizer_file

register_configs()
CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
DEFAULT_SEQ_LEN = 2048  # train.seq_len (eval.py's windows) when the model's context is longer


class ImportRefused(NormlabError, ValueError):
    """A folder that cannot become a run directory; the message names what and how to go on."""


def read_config(folder: Path) -> tuple[dict, ModelConfig]:
    """config.json and the model config it describes."""
    path = folder / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ImportRefused(f"cannot read {path} ({err}): give a Hugging Face model folder") from None
    if not isinstance(config, dict):
        raise ImportRefused(
            f"{path} holds a JSON {type(config).__name__}, not a model config: give a Hugging Face model folder"
        )
    try:
        return config, hf_model_config(config)
    except ValueError as err:
        raise ImportRefused(f"{folder}: {err}") from None


def read_tokenizer(folder: Path, vocab_size: int) -> Tokenizer:
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise ImportRefused(
            f"{folder} has no tokenizer.json, which eval.py and train.py read: save the fast tokenizer there with "
            "transformers.AutoTokenizer.from_pretrained(folder).save_pretrained(folder)"
        )
    tokenizer = read_tokenizer_file(path, str(folder), "save the fast tokenizer there again")
    if tokenizer.get_vocab_size() > vocab_size:
        raise ImportRefused(
            f"{path} has {tokenizer.get_vocab_size()} tokens but config.json's vocab_size is {vocab_size}: "
            "they are not one model's"
        )
    return tokenizer


def open_weights(folder: Path) -> dict[str, tuple[tuple[int, ...], Callable[[], torch.Tensor]]]:
    """Every tensor of the folder's weights by name: its shape, and a function that reads it. Safetensors (preferred
    where both are there) are opened for each read, so a shard's pages are mapped only while one of its tensors is
    copied; a pytorch_model.bin is memory-mapped whole."""
    for stem in ("model.safetensors", "pytorch_model.bin"):
        index = folder / f"{stem}.index.json"
        if index.is_file():
            try:
                files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            except (OSError, ValueError, KeyError) as err:
                raise ImportRefused(f"cannot read {index} ({err}): it should map tensor names to shards") from None
        elif (folder / stem).is_file():
            files = [stem]
        else:
            continue
        missing = [name for name in files if not (folder / name).is_file()]
        if missing:
            raise ImportRefused(f"{folder} has no {missing[0]}, a shard its {index.name} names")
        tensors = {}
        for name in files:
            tensors.update(_safetensors(folder / name) if stem.endswith("safetensors") else _pickled(folder / name))
        return tensors
    raise ImportRefused(
        f"{folder} has no weights: expected model.safetensors, model.safetensors.index.json with its shards, "
        "or pytorch_model.bin"
    )


def _safetensors(path: Path) -> dict:
    from safetensors import safe_open

    def read(name: str) -> torch.Tensor:
        with safe_open(str(path), framework="pt") as handle:
            return handle.get_tensor(name)

    try:
        with safe_open(str(path), framework="pt") as handle:
            shapes = {name: tuple(handle.get_slice(name).get_shape()) for name in handle.keys()}  # noqa: SIM118
    except Exception as err:
        raise ImportRefused(f"cannot read {path}: {err}") from None
    return {name: (shape, functools.partial(read, name)) for name, shape in shapes.items()}


def _pickled(path: Path) -> dict:
    try:  # memory-mapped where the file is torch's zip format (any file since torch 1.6)
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path))
    except Exception as err:
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        named = [line for line in lines if "GLOBAL" in line]  # the safe unpickler names what it refused
        raise ImportRefused(
            f"cannot read {path} as tensors only ({(named or lines or [type(err).__name__])[0]}); unpickling "
            "more could run code: convert the model to safetensors where you trust it"
        ) from None
    if not isinstance(state, dict) or not all(isinstance(tensor, torch.Tensor) for tensor in state.values()):
        raise ImportRefused(f"{path} holds no state dict (names to tensors): give the model's weights")
    return {name: (tuple(tensor.shape), lambda tensor=tensor: tensor) for name, tensor in state.items()}


def check_tensors(tensors: dict, expected: dict[str, tuple[int, ...]], cfg: ModelConfig, architecture: str) -> None:
    """Refuse a missing tensor, one of another shape, and one that has no place in our model."""
    missing = [name for name in expected if name not in tensors]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ImportRefused(f"the weights have no {missing[0]}{more}, which {architecture} needs")
    wrong = [name for name, shape in expected.items() if tensors[name][0] != shape]
    if wrong:
        name = wrong[0]
        raise ImportRefused(
            f"{name} has shape {list(tensors[name][0])} where config.json implies {list(expected[name])}"
        )
    # Tensors that carry nothing: RoPE's frequencies (older Llama files) and a tied head's copy of the embeddings
    ignored = re.compile(r".*rotary_emb\.inv_freq" + (r"|lm_head\.weight" if cfg.tie_embeddings else ""))
    extra = sorted(name for name in tensors if name not in expected and not ignored.fullmatch(name))
    if extra:
        raise ImportRefused(f"{extra[0]} has no equivalent in normlab's {architecture} (config.json does not say why)")


def hydra_value(value) -> str:
    """``value`` as a Hydra override writes it (strings quoted unless they are plain words)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, dict):
        return "{" + ",".join(f"{key}:{hydra_value(item)}" for key, item in value.items()) + "}"
    if isinstance(value, str):
        plain = re.fullmatch(r"[A-Za-z_]\w*", value) and value.lower() not in ("true", "false", "null", "nan", "inf")
        return value if plain else '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(value)


def train_overrides(cfg: ModelConfig, model_type: str, tokenizer: Path, seq_len: int) -> list[str]:
    """The train.py overrides whose config builds this model and reads its tokenizer: keys that differ from the
    default config, so the command that resumes the run stays short."""
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        defaults = compose("config")
    wanted = {
        "model.name": model_type,
        **{f"model.{key}": getattr(cfg, key) for key in defaults.model if key != "name"},
        "norm.name": cfg.norm,
        **{f"norm.{key}": value for key, value in cfg.norm_options.items()},
        "norm.placement": cfg.placement,
        "norm.qk": cfg.qk_norm,
        "norm.qk_axis": cfg.qk_axis,
        "data.tokenizer": str(tokenizer),
        "train.seq_len": seq_len,
    }
    # A dict's keys are new to the schema's empty one (model.rope_scaling): Hydra adds them with ++
    return [
        f"{'++' if isinstance(value, dict) else ''}{key}={hydra_value(value)}"
        for key, value in wanted.items()
        if OmegaConf.select(defaults, key) != value
    ]


def run_record(overrides: list[str], model: torch.nn.Module, folder: Path, config: dict) -> tuple[dict, object]:
    """The run's config.yaml (what train.py records at the start of a run) and the composed config; ``model`` may be
    on the meta device."""
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    seq_len = cfg.train.seq_len
    runtime = {
        "precision": resolve_precision(cfg.train.precision, resolve_device(cfg.device)),
        "global_batch_tokens": split_global_batch(cfg.train, seq_len, 1)[0] * seq_len,
        "vocab_size": model.cfg.vocab_size,
        "params": sum(p.numel() for p in model.parameters()),
        "norm_roles": {name: norm.role for name, norm in model.norm_modules().items()},
        "torch": str(torch.__version__),
        "imported_from": {
            "folder": str(folder.resolve()),
            "architecture": HF_CLASSES[hf_model_type(model)],
            "dtype": config.get("dtype") or config.get("torch_dtype"),
            "transformers": config.get("transformers_version"),
        },
    }
    return {**OmegaConf.to_container(cfg, resolve=True, enum_to_str=True), "runtime": runtime}, cfg


def resume_problem(cfg, model_cfg: ModelConfig, tokenizer: Tokenizer) -> str | None:
    """Why train.py could not resume the run, or None: it builds the model from the config and the tokenizer,
    whose vocabulary it pads to a multiple of 64, and a checkpoint of another model config is refused."""
    rebuilt = build_model_config(cfg, tokenizer.get_vocab_size()).to_dict()
    differs = [key for key, value in model_cfg.to_dict().items() if rebuilt[key] != value]
    if not differs:
        return None
    return (
        f"train.py cannot resume it: from its config and tokenizer ({tokenizer.get_vocab_size()} tokens) it builds "
        + ", ".join(f"model.{key}={rebuilt[key]} where the checkpoint has {getattr(model_cfg, key)}" for key in differs)
    )


def import_hf(folder: Path, run_dir: Path, seq_len: int | None = None) -> tuple[list[str], str | None]:
    """Write ``folder``'s model as the run directory ``run_dir``. Returns the train.py overrides that resume it,
    and why train.py cannot (None when it can)."""
    config, model_cfg = read_config(folder)
    tokenizer = read_tokenizer(folder, model_cfg.vocab_size)
    if run_dir.exists() and (not run_dir.is_dir() or any(run_dir.iterdir())):
        raise ImportRefused(f"{run_dir} already holds files: import into a new or empty folder")
    seq_len = seq_len or min(model_cfg.max_seq_len, DEFAULT_SEQ_LEN)
    if not 0 < seq_len <= model_cfg.max_seq_len:
        raise ImportRefused(f"--seq-len {seq_len} must be in [1, {model_cfg.max_seq_len}], the model's context")
    with torch.device("meta"):  # names and shapes, without memory
        shaped = build_model(model_cfg)
    model_type = hf_model_type(shaped)
    overrides = train_overrides(model_cfg, model_type, run_dir.resolve() / "tokenizer.json", seq_len)
    record, cfg = run_record(overrides, shaped, folder, config)
    tensors = open_weights(folder)
    check_tensors(tensors, hf_tensor_shapes(shaped), model_cfg, HF_CLASSES[model_type])
    seed_everything(cfg.seed)  # its draws are overwritten, but the RNG state saved is then a fresh run's
    model = build_model(model_cfg)
    load_hf_tensors(model, lambda name: tensors[name][1]())
    state = {
        "step": 0,
        "rng": rng_states(),
        "model_config": model_cfg.to_dict(),
        "config": record,
        "tokenizer": tokenizer.to_str(),
        "elapsed_s": 0.0,
        "model": model.state_dict(),
        "optimizer": build_optimizer(model, cfg.train, resolve_device(cfg.device)).state_dict(),
    }
    partial = run_dir.with_name(f".{run_dir.name}.importing-{os.getpid()}")  # renamed into place once complete
    try:
        partial.mkdir(parents=True)
        (partial / "tokenizer.json").write_text(tokenizer.to_str())
        write_new_record(partial, record)
        save_checkpoint(partial, state, cfg.train.keep_checkpoints)
        partial.replace(run_dir)  # an empty target folder is replaced
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return overrides, resume_problem(cfg, model_cfg, tokenizer)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="a Hugging Face model folder: config.json, tokenizer.json, weights")
    parser.add_argument("run_dir", type=Path, help="the run directory to write (new, or an empty folder)")
    parser.add_argument(
        "--seq-len",
        type=int,
        help=f"train.seq_len, eval.py's window (default: the model's context, at most {DEFAULT_SEQ_LEN})",
    )
    args = parser.parse_args(argv)
    try:
        overrides, problem = import_hf(args.folder, args.run_dir, args.seq_len)
    except NormlabError as err:
        print(f"import_hf: {err}", file=sys.stderr)
        return 1
    except OSError as err:  # a target that cannot be written: a link, a read-only folder, a full disk
        print(f"import_hf: {err.strerror or err}: {err.filename}; nothing was imported", file=sys.stderr)
        return 1
    print(f"wrote {args.run_dir}: python eval.py checkpoint={shlex.quote(str(args.run_dir))}")
    command = shlex.join(["python", "train.py", f"hydra.run.dir={args.run_dir}", *overrides])
    print(problem or f"fine-tune it from step 0 (other training settings: add resume_with_changes=[...]): {command}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
