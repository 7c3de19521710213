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
import dataclasses
import functools
import glob
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
from tokenizers import Tokenizer

from model import ModelConfig, build_model
from model.config import ModelShape
from model.hf import hf_model_type, hf_tensor_shapes, load_hf_tensors
from model.hf_settings import HF_CLASSES, hf_model_config, special_token_ids
from training.checkpoints.files import rng_states, save_checkpoint
from training.config import model_config, register_configs, typed_config
from training.data.batches import split_global_batch
from training.errors import NormlabError
from training.input_files import InputFileError, MiB, read_json, read_text, regular_file
from training.run.record import write_new_record
from training.run.runtime import resolve_device, resolve_precision, seed_everything
from training.step.optim import build_optimizer

register_configs()
CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
DEFAULT_SEQ_LEN = 2048  # train.seq_len (eval.py's windows) when the model's context is longer


class ImportRefused(NormlabError, ValueError):
    """A folder that cannot become a run directory; the message names what and how to go on."""


CONFIG_LIMIT = MiB  # a config.json is a few kilobytes
INDEX_LIMIT = 64 * MiB  # a shard index names every tensor once: a few hundred kilobytes for the largest models
TOKENIZER_LIMIT = 256 * MiB  # Llama 3's tokenizer.json is 9 MB, Gemma 3's 33 MB
FLOAT_DTYPES = {"F16", "BF16", "F32", "F64"}  # safetensors' names of the dtypes a weight may have


def read_config(folder: Path) -> tuple[dict, ModelConfig]:
    """config.json and the model config it describes."""
    path = folder / "config.json"
    try:
        config = read_json(path, CONFIG_LIMIT, "config.json")
    except InputFileError as err:
        raise ImportRefused(f"{err}: give a Hugging Face model folder") from None
    if not isinstance(config, dict):
        raise ImportRefused(
            f"{path} holds a JSON {type(config).__name__}, not a model config: give a Hugging Face model folder"
        )
    try:
        return config, hf_model_config(config)
    except ValueError as err:
        raise ImportRefused(f"{path}: {err}") from None


def read_tokenizer(folder: Path, vocab_size: int, config: dict) -> Tokenizer:
    """tokenizer.json, refused unless every token id it can produce, and every special token id config.json names,
    has a row in the embedding table."""
    path = folder / "tokenizer.json"
    if not path.exists():
        raise ImportRefused(
            f"{folder} has no tokenizer.json, which eval.py and train.py read: save the fast tokenizer there with "
            "transformers.AutoTokenizer.from_pretrained(folder).save_pretrained(folder)"
        )
    try:
        text = read_text(path, TOKENIZER_LIMIT, "tokenizer.json")
        tokenizer = Tokenizer.from_str(text)
    except InputFileError as err:
        raise ImportRefused(str(err)) from None
    except Exception as err:
        raise ImportRefused(f"{path} is not a tokenizer file ({' '.join(str(err).split())[:200]})") from None
    largest = max(tokenizer.get_vocab(with_added_tokens=True).values(), default=-1)
    if largest >= vocab_size:
        raise ImportRefused(
            f"{path} has token id {largest} but config.json's vocab_size is {vocab_size} (ids 0-{vocab_size - 1}): "
            "they are not one model's"
        )
    try:
        past = [(key, token) for key, token in special_token_ids(config).items() if token >= vocab_size]
    except ValueError as err:
        raise ImportRefused(f"{folder / 'config.json'}: {err}") from None
    if past:
        key, token = past[0]
        raise ImportRefused(
            f"{folder / 'config.json'}: {key}={token} has no row in the embedding table of vocab_size={vocab_size}"
        )
    return tokenizer


Tensors = dict[str, tuple[tuple[int, ...], str, Callable[[], torch.Tensor]]]  # name -> (shape, dtype, reader)


def weight_files(folder: Path) -> tuple[str, list[str], dict[str, str] | None]:
    """The kind of the folder's weights, their files, and the index's tensor -> file map (None for one file).
    Safetensors come first, as transformers reads them; a folder with both one file and an index is refused,
    because which one holds the model is a guess."""
    for stem in ("model.safetensors", "pytorch_model.bin"):
        index = folder / f"{stem}.index.json"
        single = folder / stem
        if index.exists() and single.exists():
            raise ImportRefused(
                f"{folder} holds both {stem} and {index.name}, which may be two models: remove the one that is not "
                "the model's weights"
            )
        if single.exists():
            return stem, [stem], None
        if index.exists():
            weight_map = _weight_map(index)
            return stem, sorted(set(weight_map.values())), weight_map
    raise ImportRefused(
        f"{folder} has no weights: expected model.safetensors, model.safetensors.index.json with its shards, "
        "or pytorch_model.bin"
    )


def _weight_map(index: Path) -> dict[str, str]:
    """An index's tensor -> shard map, each shard a plain file name in the folder (a name with a folder in it, or
    .., would read a file outside the model's folder)."""
    try:
        weight_map = read_json(index, INDEX_LIMIT, index.name).get("weight_map")
    except (InputFileError, AttributeError) as err:
        raise ImportRefused(f"cannot read {index} ({err}): it should map tensor names to shards") from None
    if not isinstance(weight_map, dict) or not weight_map:
        raise ImportRefused(f"{index} has no weight_map of tensor names to shards")
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or Path(shard).name != shard or shard in ("", ".", ".."):
            raise ImportRefused(
                f"{index} maps {name} to {shard!r}, which is not a file name in {index.parent}: an index names "
                "shards beside it"
            )
    return weight_map


def open_weights(folder: Path) -> Tensors:
    """Every tensor of the folder's weights by name: its shape, its dtype, and a function that reads it.
    Safetensors are opened for each read, so a shard's pages are mapped only while one of its tensors is copied;
    a pytorch_model.bin is memory-mapped whole. A tensor in two shards, or where the index does not say it is,
    is refused: readers that trust the index and readers that trust the shards would read different models."""
    stem, files, weight_map = weight_files(folder)
    tensors: Tensors = {}
    for name in files:
        path = folder / name
        try:
            regular_file(path, "a weights file")
        except InputFileError as err:
            raise ImportRefused(f"{err} (a shard its index names)" if weight_map else str(err)) from None
        for tensor, found in (_safetensors(path) if stem.endswith("safetensors") else _pickled(path)).items():
            if tensor in tensors:
                raise ImportRefused(f"{tensor} is in more than one shard of {folder}, one of them {name}")
            if weight_map is not None and weight_map.get(tensor) != name:
                raise ImportRefused(
                    f"{path} holds {tensor}, which {stem}.index.json places in {weight_map.get(tensor, 'no shard')}"
                )
            tensors[tensor] = found
    return tensors


def _safetensors(path: Path) -> Tensors:
    from safetensors import safe_open

    def read(name: str) -> torch.Tensor:
        with safe_open(str(path), framework="pt") as handle:
            return handle.get_tensor(name)

    try:
        with safe_open(str(path), framework="pt") as handle:
            slices = {name: handle.get_slice(name) for name in handle.keys()}  # noqa: SIM118
            found = {name: (tuple(s.get_shape()), s.get_dtype()) for name, s in slices.items()}
    except Exception as err:
        raise ImportRefused(f"cannot read {path}: {' '.join(str(err).split())[:300]}") from None
    return {name: (shape, dtype, functools.partial(read, name)) for name, (shape, dtype) in found.items()}


def _pickled(path: Path) -> Tensors:
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
    return {
        name: (tuple(tensor.shape), "F32" if tensor.is_floating_point() else str(tensor.dtype), lambda t=tensor: t)
        for name, tensor in state.items()
    }


def check_tensors(tensors: Tensors, expected: dict[str, tuple[int, ...]], cfg: ModelConfig, architecture: str) -> None:
    """Refuse a missing tensor, one of another shape or a non-float dtype, one that has no place in our model, and
    a distinct LM head where config.json says the head is the embedding table."""
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
    not_float = [name for name in expected if tensors[name][1] not in FLOAT_DTYPES]
    if not_float:
        raise ImportRefused(f"{not_float[0]} holds {tensors[not_float[0]][1]} values, not floats: it is no weight")
    if cfg.tie_embeddings and "lm_head.weight" in tensors:
        head, embeddings = tensors["lm_head.weight"], tensors["model.embed_tokens.weight"]
        if head[0] != embeddings[0] or not torch.equal(head[2](), embeddings[2]()):
            raise ImportRefused(
                "config.json says tie_word_embeddings=true (the LM head is the embedding table), but the weights "
                "hold an lm_head.weight that differs from it: set tie_word_embeddings to false if the head is its "
                "own, or remove lm_head.weight"
            )
    # Tensors that carry nothing: RoPE's frequencies (older Llama files) and a tied head's copy of the embeddings
    ignored = re.compile(r".*rotary_emb\.inv_freq" + (r"|lm_head\.weight" if cfg.tie_embeddings else ""))
    extra = sorted(name for name in tensors if name not in expected and not ignored.fullmatch(name))
    if extra:
        raise ImportRefused(f"{extra[0]} has no equivalent in normlab's {architecture} (config.json does not say why)")


def finite(name: str, tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``, refused when it holds a NaN or an infinity: a model that computes NaN is no model to fine-tune."""
    if not torch.isfinite(tensor).all():
        raise ImportRefused(f"{name} holds non-finite values (NaN or infinity): the weights are damaged")
    return tensor


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
        defaults = typed_config(compose("config"))
    wanted = {
        "model.name": model_type,
        **{f"model.{f.name}": getattr(cfg, f.name) for f in dataclasses.fields(ModelShape)},
        "norm.name": cfg.norm.name,
        **{f"norm.{key}": value for key, value in cfg.norm.options().items()},
        "norm.placement": cfg.norm.placement,
        "norm.qk": cfg.norm.qk,
        "norm.qk_axis": cfg.norm.qk_axis,
        "data.tokenizer": str(tokenizer),
        "train.seq_len": seq_len,
    }
    # A dict's keys are new to the schema's empty one (model.rope_scaling): Hydra adds them with ++
    return [
        f"{'++' if isinstance(value, dict) else ''}{key}={hydra_value(value)}"
        for key, value in wanted.items()
        if functools.reduce(getattr, key.split("."), defaults) != value
    ]


def run_record(overrides: list[str], model: torch.nn.Module, folder: Path, config: dict) -> tuple[dict, object]:
    """The run's config.yaml (what train.py records at the start of a run) and the composed config; ``model`` may be
    on the meta device."""
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = typed_config(compose("config", overrides=overrides))
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
    return {**dataclasses.asdict(cfg), "runtime": runtime}, cfg


def resume_problem(cfg, model_cfg: ModelConfig, tokenizer: Tokenizer) -> str | None:
    """Why train.py could not resume the run, or None: it builds the model from the config and the tokenizer (the
    embedding rows the record's, as padded as the folder's), and a checkpoint of another model config is refused."""
    rebuilt = model_config(cfg, tokenizer.get_vocab_size(), rows=model_cfg.vocab_size).to_dict()
    differs = [key for key, value in model_cfg.to_dict().items() if rebuilt[key] != value]
    if not differs:
        return None
    return (
        f"train.py cannot resume it: from its config and tokenizer ({tokenizer.get_vocab_size()} tokens) it builds "
        + ", ".join(f"model.{key}={rebuilt[key]} where the checkpoint has {getattr(model_cfg, key)}" for key in differs)
    )


def check_target(run_dir: Path) -> None:
    """Refuse a target that is a link (the run would be written wherever it leads) or a folder that holds files;
    remove what an import killed midway left beside it (``.<name>.importing-<pid>`` of a process that is gone)."""
    if run_dir.is_symlink():
        raise ImportRefused(f"{run_dir} is a link to {os.readlink(run_dir)}: import into a new or empty folder")
    if run_dir.exists() and (not run_dir.is_dir() or any(run_dir.iterdir())):
        raise ImportRefused(f"{run_dir} already holds files: import into a new or empty folder")
    for partial in run_dir.parent.glob(f".{glob.escape(run_dir.name)}.importing-*"):
        pid = partial.name.rpartition("-")[2]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(partial, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def import_hf(folder: Path, run_dir: Path, seq_len: int | None = None) -> tuple[list[str], str | None]:
    """Write ``folder``'s model as the run directory ``run_dir``. Returns the train.py overrides that resume it,
    and why train.py cannot (None when it can)."""
    config, model_cfg = read_config(folder)
    tokenizer = read_tokenizer(folder, model_cfg.vocab_size, config)
    check_target(run_dir)
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
    model = build_model(model_cfg)  # as large as the tensors just checked: the files' own size bounds it
    load_hf_tensors(model, lambda name: finite(name, tensors[name][2]()))
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
    except OSError as err:  # a target that cannot be written: a read-only folder, a full disk
        print(f"import_hf: {err.strerror or err}: {err.filename}; nothing was imported", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"import_hf: interrupted (Ctrl-C); nothing was imported into {args.run_dir}", file=sys.stderr)
        return 130
    print(f"wrote {args.run_dir}: python eval.py checkpoint={shlex.quote(str(args.run_dir))}")
    command = shlex.join(["python", "train.py", f"hydra.run.dir={args.run_dir}", *overrides])
    print(problem or f"fine-tune it from step 0 (other training settings: add resume_with_changes=[...]): {command}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
