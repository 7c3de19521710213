"""Evaluate checkpoints: validation loss, perplexity and bits per byte, samples, activation statistics.

    python eval.py checkpoint=runs/small-rmsnorm-s0
    python eval.py checkpoint=[runs/small-rmsnorm-s0,runs/small-layernorm-s0] val_windows=256
    python eval.py checkpoint=runs/small-rmsnorm-s0 data=tinystories   # another corpus, same tokenizer
    python eval.py 'checkpoint=runs/outliers/*' quant=[w8a8,w8a8_tensor,w4a16,fp8]   # and quantized
    python eval.py checkpoint=runs/small-rmsnorm-s0 layer_importance=true   # each block's skip delta and angle
    python eval.py checkpoint=runs/small-rmsnorm-s0 fold_gains=true         # the loss with norm gains folded
    python eval.py checkpoint=runs/llama-3.2-1b 'probe_text="The capital of France is Paris."'  # probe a text

Each quantization scheme (model/quantize.py) evaluates a fake-quantized copy of the model; the
checkpoint on disk is only read. Its losses land under "quant" with their increase over the float
model ("delta/val/loss").

Every probe runs on the first validation batch, or on a text of one's own (``probe_text=`` or
``probe_text_file=``, tokenized by the checkpoint's tokenizer as ``prompt`` is, its special tokens included);
a table per checkpoint shows where the outliers sit, block by block: the largest activation with its
feature, position and token, the attention that queries give the first position, the outlier features.

Each run directory carries its config and tokenizer, so nothing else has to be found by hand.
Results print as a table and are written as eval.json next to each checkpoint (keyed by
checkpoint) and, for all of them together, in the eval's own output directory. eval.py writes
nowhere else and never through a link; an eval.json it cannot write (a link, not JSON, a read-only
folder) is left as it is and named in one ERROR line, the results kept in the output directory,
and the command exits 1 so that scripts notice.
"""

from __future__ import annotations

import copy
import dataclasses
import glob
import hashlib
import json
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List, Optional  # noqa: UP035  # OmegaConf reads these annotations

import hydra
import torch
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from omegaconf import MISSING, DictConfig, OmegaConf
from tokenizers import Tokenizer

from lab.keys import metric_key
from lab.runs import layer_values, read_evaluations
from lab.study_probes import STUDY_PROBES
from lab.study_probes.layer_importance import skip_deltas
from model import Transformer, build_model
from model.config import PlainValues, declared, refusal
from model.fold import fold_gains
from model.from_state import check_weights, model_config_of, model_from_state
from model.quantize import QuantizationError, check_schemes, quantized
from training.atomic import atomic_write_text
from training.checkpoints.files import CHECKPOINT_DIR
from training.checkpoints.sharded import read_checkpoint, read_header
from training.config import DataConfig, LoggerConfig, Precision, register_configs
from training.data.build import build_validation
from training.errors import CheckpointError, NormlabError
from training.input_files import InputFileError, MiB, read_text
from training.run.lock import discard_unused
from training.run.runtime import autocast_context, resolve_device, resolve_precision
from training.telemetry.evaluation import evaluate
from training.telemetry.loggers import record_command
from training.telemetry.probes import PROBES, resolve_probe, run_probes
from training.telemetry.wandb_logger import WandbLogger

log = logging.getLogger("normlab.eval")

# The table of where the outliers sit, block by block: its columns (key as the probes declare it, format)
OUTLIER_COLUMNS = {
    "max|h|/median": (metric_key("act/layers.{i}/massive_ratio"), ".1f"),  # Sun et al.'s massive activations
    "feature": (metric_key("act/layers.{i}/massive_feature"), "d"),
    "position": (metric_key("act/layers.{i}/massive_position"), "d"),
    "sink mass": (metric_key("attn/layers.{i}/sink_mass"), ".3f"),  # attention sinks
    "feature kurtosis": (metric_key("act/layers.{i}/stream_feature_kurtosis"), ".2f"),  # outlier features
}
MASSIVE_TOKEN = metric_key("act/layers.{i}/massive_token")  # the last column, as its text


# ruff: noqa: UP006, UP045
@dataclass
class EvalConfig(PlainValues):
    """eval.py: checkpoints in, metrics, samples and activation statistics out."""

    checkpoint: Any = (
        MISSING  # a run directory, .pt file or .dcp directory, a glob of them (runs/outliers/*), or a list
    )
    data: Optional[DataConfig] = None  # None: each run's own data config (choose another with data=<name>)
    val_windows: Optional[int] = declared(None, rule=">= 1")  # None: the run's data.val_windows
    batch_size: int = declared(16, rule=">= 1")
    prompt: str = "In the beginning"
    max_new_tokens: int = declared(64, rule=">= 0")
    num_samples: int = declared(2, rule=">= 1")
    temperature: float = declared(0.8, rule=">= 0")  # 0: greedy
    top_k: Optional[int] = declared(50, rule=">= 1")
    sample_seed: int = 0
    # fake-quantized evaluations beside the float one (model/quantize.py): w8a8, w8a8_tensor, w4a16, fp8
    quant: List[str] = field(default_factory=list)
    # per block: the val/loss with it replaced by the identity minus the plain loss, and its angular distance
    layer_importance: bool = False
    # the loss again with every norm gain folded into the linear layer after it (model/fold.py): equal to float
    # rounding; a model whose gains cannot fold is refused naming the norm
    fold_gains: bool = False
    # the probes' input instead of the first validation batch: this text, or the text of this file (UTF-8)
    probe_text: Optional[str] = None
    probe_text_file: Optional[str] = None
    device: str = "auto"
    precision: Precision = Precision.auto  # type: ignore[valid-type]
    logger: LoggerConfig = field(default_factory=LoggerConfig)


register_configs()
ConfigStore.instance().store(name="eval_schema", node=EvalConfig)


def checkpoint_tokenizer(state: dict, source: Path) -> Tokenizer:
    """The tokenizer a checkpoint carries, or one line saying it is damaged."""
    try:
        return Tokenizer.from_str(state["tokenizer"])
    except Exception as err:
        raise CheckpointError(
            f"{source} carries a tokenizer that cannot be read ({' '.join(str(err).split())[:120]}): the checkpoint "
            "is damaged; evaluate another one of its run"
        ) from None


def check_checkpoints(paths: list[Path]) -> None:
    """Read every checkpoint named (tensors mapped, not loaded) and refuse the first that eval.py could not use
    (damaged, not ours, a config its tensors do not fit, a damaged tokenizer), before any is evaluated."""
    for path in paths:
        source, state = read_header(path)
        checkpoint_tokenizer(state, source)
        try:
            cfg = model_config_of(state["model_config"], str(source))
            if "model" in state:  # a .pt; a .dcp's shapes are its metadata's, checked as its shards are read
                with torch.device("meta"):
                    check_weights(build_model(cfg), state["model"], str(source))
        except ValueError as err:
            raise CheckpointError(str(err)) from None


def load_model(state: dict, source: Path, device: torch.device) -> Transformer:
    """The checkpoint's model, built only once its tensors are seen to fit its config (model/from_state.py)."""
    try:
        model = model_from_state(state["model_config"], state["model"], str(source))
    except ValueError as err:
        raise CheckpointError(str(err)) from None
    return model.to(device).eval()


PROBE_TEXT_LIMIT = 8 * MiB  # past any model's context in tokens; each checkpoint bounds it again by its own


class ProbeTextError(NormlabError, ValueError):
    """A probe text that cannot be probed; the message says why and what to give instead."""


def _probe_text_option(cfg: EvalConfig) -> str:
    return "probe_text" if cfg.probe_text is not None else f"probe_text_file={cfg.probe_text_file}"


def read_probe_text(cfg: EvalConfig) -> str | None:
    """The text that ``probe_text`` or ``probe_text_file`` gives, or None (the probes read the validation batch);
    refused before any checkpoint is read when it is empty or cannot be read."""
    if cfg.probe_text is not None and cfg.probe_text_file is not None:
        raise ProbeTextError("probe_text and probe_text_file are both given: give one of them")
    text = cfg.probe_text
    if cfg.probe_text_file is not None:
        try:
            text = read_text(cfg.probe_text_file, PROBE_TEXT_LIMIT, "probe_text_file")
        except InputFileError as err:
            raise ProbeTextError(f"{err}: give a UTF-8 text file of at most the model's context") from None
    if text is not None and not text.strip():
        raise ProbeTextError(
            f"{_probe_text_option(cfg)} is empty: give the text to probe, e.g. 'probe_text=\"In the beginning\"'"
        )
    return text


def probe_batch(cfg: EvalConfig, text: str, tokenizer: Tokenizer, context: int) -> torch.Tensor:
    """``text`` as one row of the checkpoint's tokens, as the prompt is read (a BOS its tokenizer adds included),
    refused where the probes cannot read it: attention to the first position is measured from the second, and
    the model has no position beyond its context. A text longer than ``context`` tokens of the tokenizer's
    longest could be is refused by its size, before the tokenizer reads it."""
    longest = max((len(token.encode()) for token in tokenizer.get_vocab()), default=1)
    if len(text.encode()) > context * longest:
        raise ProbeTextError(
            f"{_probe_text_option(cfg)} is {len(text.encode()):,} bytes, more than {context} tokens of this "
            f"checkpoint's tokenizer can hold (its longest token is {longest} bytes): shorten it to at most the "
            f"model's context of {context} tokens"
        )
    ids = tokenizer.encode(text).ids
    if len(ids) < 2:
        raise ProbeTextError(
            f"{_probe_text_option(cfg)} is {len(ids)} token{'' if len(ids) == 1 else 's'} with this checkpoint's "
            "tokenizer; the probes need 2 or more (attention to the first position is measured from the second): "
            "give a longer text"
        )
    if len(ids) > context:
        raise ProbeTextError(
            f"{_probe_text_option(cfg)} is {len(ids)} tokens with this checkpoint's tokenizer, more than the "
            f"model's context of {context}: shorten it to at most {context} tokens"
        )
    return torch.tensor([ids])


def evaluate_checkpoint(cfg: EvalConfig, path: Path, device: torch.device, probe_text: str | None = None) -> dict:
    source, state = read_checkpoint(path)  # sharded (train.parallel=fsdp) too, read whole in this one process
    model = load_model(state, source, device)
    folded_model = None
    if cfg.fold_gains:
        folded_model = copy.deepcopy(model)
        try:
            fold_gains(folded_model)
        except ValueError as err:
            raise NormlabError(f"fold_gains=true: {source}: {err}") from None
    precision = resolve_precision(cfg.precision, device)
    autocast = autocast_context(precision, device)

    run_cfg = state["config"]
    data_cfg = dataclasses.replace(cfg.data) if cfg.data is not None else run_data_config(run_cfg["data"])
    if cfg.val_windows:
        data_cfg.val_windows = cfg.val_windows
    seq_len = run_cfg["train"]["seq_len"] or model.cfg.max_seq_len
    tokenizer = checkpoint_tokenizer(state, source)
    val, token_bytes, fingerprint = build_validation(data_cfg, seq_len, tokenizer)
    if probe_text is None:
        probed = val[: cfg.batch_size, :-1]
    else:
        probed = probe_batch(cfg, probe_text, tokenizer, model.cfg.max_seq_len)

    metrics = evaluate(model, val, token_bytes, cfg.batch_size, device, autocast)
    every_probe = [resolve_probe(name) for name in (*PROBES, *STUDY_PROBES)]
    metrics.update(run_probes(model, probed.to(device), autocast, every_probe))
    # the text of each token that carries a block's largest activation, as the tokenizer writes it alone
    token_text = {
        str(token): tokenizer.decode([token], skip_special_tokens=False)
        for token in layer_values(metrics, MASSIVE_TOKEN)
    }
    importance = {}
    if cfg.layer_importance:
        importance = {
            "skip_delta": skip_deltas(
                model, lambda m: evaluate(m, val, token_bytes, cfg.batch_size, device, autocast)["val/loss"]
            ),
            "angular_distance": [metrics[f"act/layers.{i}/angular_distance"] for i in range(len(model.layers))],
        }
    quant = {}
    for scheme in cfg.quant:
        q = evaluate(quantized(model, scheme), val, token_bytes, cfg.batch_size, device, autocast)
        quant[scheme] = {
            "val/loss": q["val/loss"],
            "val/bpb": q["val/bpb"],
            "delta/val/loss": q["val/loss"] - metrics["val/loss"],
        }
    folded = {}
    if folded_model is not None:
        loss = evaluate(folded_model, val, token_bytes, cfg.batch_size, device, autocast)["val/loss"]
        folded = {"val/loss": loss, "delta/val/loss": loss - metrics["val/loss"]}
    prompt = torch.tensor([tokenizer.encode(cfg.prompt).ids] * cfg.num_samples, device=device)
    new_tokens = min(cfg.max_new_tokens, model.cfg.max_seq_len - prompt.shape[1])
    if new_tokens < cfg.max_new_tokens:
        log.warning(
            "sampling %d new tokens, not %d: the model's context is %d tokens",
            new_tokens,
            cfg.max_new_tokens,
            model.cfg.max_seq_len,
        )
    generator = torch.Generator(device=device).manual_seed(cfg.sample_seed)
    with autocast:
        tokens = model.generate(prompt, max(new_tokens, 0), cfg.temperature, cfg.top_k, generator)
    return {
        "checkpoint": str(source),
        "step": state["step"],
        "norm": model.cfg.norm.name,
        "data": data_cfg.name,
        "data_fingerprint": fingerprint,  # the validation split's text and the tokenizer that read it
        "val_windows": int(val.shape[0]),
        **({"probe_text": probe_text} if probe_text is not None else {}),
        **metrics,
        "token_text": token_text,
        **({"quant": quant} if quant else {}),
        **({"layer_importance": importance} if importance else {}),
        **({"fold_gains": folded} if folded else {}),
        "samples": [tokenizer.decode(row.tolist()) for row in tokens],
    }


def entry_key(result: dict) -> str:
    """An evaluation's key in eval.json: what it measured (the checkpoint, the data and the windows, and the text
    the probes read when it was not the validation batch), so that evaluating on other data or probing another
    text adds an entry beside the run's own and never replaces it."""
    key = (
        f"{result['checkpoint']} | data {result['data']} {result['data_fingerprint']} | {result['val_windows']} windows"
    )
    if "probe_text" in result:
        key += f" | probes on text {hashlib.sha256(result['probe_text'].encode()).hexdigest()[:12]}"
    return key


def merged(old: dict | None, new: dict) -> dict:
    """A new evaluation of the same thing over an old one: its numbers, with the old quantized results, layer
    importance and folded loss kept where this evaluation did not measure them."""
    if old is None:
        return new
    quant = {**old.get("quant", {}), **new.get("quant", {})}
    kept = {k: old[k] for k in ("layer_importance", "fold_gains") if k in old and k not in new}
    return {**new, **kept, **({"quant": quant} if quant else {})}


class EvalWriteError(NormlabError):
    """An eval.json that eval.py would not merge into or could not write; the message says why."""


def eval_json_beside(checkpoint: Path) -> Path:
    """Where a checkpoint's eval.json goes: its run directory for one in ``<run>/checkpoints/`` (where readers
    look), else the folder that holds it (a .dcp directory is a checkpoint: beside it, not inside)."""
    folder = checkpoint.parent
    return (folder.parent if folder.name == CHECKPOINT_DIR else folder) / "eval.json"


def _existing(path: Path) -> dict[str, dict]:
    """The evaluations already in ``path``; a file eval.py would not merge into raises, saying why."""
    if path.is_symlink():
        raise EvalWriteError(f"is a link to {os.readlink(path)}; eval.py never writes through a link: remove it")
    if not path.exists():
        return {}
    try:
        return read_evaluations(path)
    except ValueError as err:
        raise EvalWriteError(f"{err}; move it away or repair it") from None


def _save(path: Path, results: dict[str, dict]) -> str | None:
    """Merge ``results`` into ``path`` in one rename (never through a link, never half a file); what stopped
    it, in words, or None when written."""
    try:
        existing = _existing(path)
        merged_results = {**existing, **{k: merged(existing.get(k), r) for k, r in results.items()}}
        atomic_write_text(path, json.dumps(merged_results, indent=2))
    except EvalWriteError as err:
        return f"{path} {err}"
    except OSError as err:
        return f"{path} could not be written ({err.strerror or err})"
    return None


def _print_table(results: dict[str, dict]) -> None:
    print(f"\n{'checkpoint':<60} {'step':>7} {'val/loss':>9} {'val/ppl':>9} {'val/bpb':>8}")
    for key, r in results.items():
        print(f"{key[-60:]:<60} {r['step']:>7} {r['val/loss']:>9.4f} {r['val/ppl']:>9.2f} {r['val/bpb']:>8.4f}")
    quantized_rows = [(key, scheme, q) for key, r in results.items() for scheme, q in r.get("quant", {}).items()]
    if quantized_rows:
        print(f"\n{'checkpoint':<60} {'scheme':>12} {'val/loss':>9} {'delta':>8} {'val/bpb':>8}")
        for key, scheme, q in quantized_rows:
            print(
                f"{key[-60:]:<60} {scheme:>12} {q['val/loss']:>9.4f} {q['delta/val/loss']:>+8.4f} {q['val/bpb']:>8.4f}"
            )
    for key, r in results.items():
        if "layer_importance" in r:
            importance = r["layer_importance"]
            print(
                f"\nlayer importance of {key[-60:]}: val/loss without the block minus with it, and the angle it turns"
            )
            print(f"{'block':>7} {'skip delta':>11} {'angular distance':>17}")
            for i, (delta, angle) in enumerate(zip(importance["skip_delta"], importance["angular_distance"])):
                print(f"{i:>7} {delta:>+11.4f} {angle:>17.4f}")
    for r in results.values():
        _print_outliers(r)
    for key, r in results.items():
        print(f"\nsamples from {key}:")
        for sample in r["samples"]:
            print(f"  {sample!r}")


def _print_outliers(result: dict) -> None:
    """Where the outliers sit, block by block (OUTLIER_COLUMNS) and the largest of them with its token."""
    columns = {name: layer_values(result, template) for name, (template, _) in OUTLIER_COLUMNS.items()}
    tokens = [repr(result["token_text"][str(token)]) for token in layer_values(result, MASSIVE_TOKEN)]
    ratios = columns["max|h|/median"]
    top = max(range(len(ratios)), key=ratios.__getitem__)
    probed = "probe_text" if "probe_text" in result else "the first validation batch"
    print(f"\noutliers of {result['checkpoint']}, probed on {probed}:")
    print(
        f"the largest activation: {ratios[top]:.1f} x the median |h|, leaving block {top}, feature "
        f"{columns['feature'][top]}, position {columns['position'][top]}, token {tokens[top]}"
    )
    print(f"{'block':>7}  " + "  ".join(columns) + "  token")
    for i, token in enumerate(tokens):
        cells = (format(columns[name][i], f">{len(name)}{spec}") for name, (_, spec) in OUTLIER_COLUMNS.items())
        print(f"{i:>7}  " + "  ".join(cells) + f"  {token}")
    print(
        "max|h|/median: massive activations (Sun et al. 2024); sink mass: the mean attention on position 0; "
        "feature kurtosis: of the stream's per-feature RMS (3: no outlier feature)"
    )


def checkpoint_paths(checkpoint) -> list[Path]:
    """The paths that ``checkpoint=`` names: one, a list, and globs among them (each must match)."""
    given = list(checkpoint) if isinstance(checkpoint, (list, tuple)) else [checkpoint]
    paths = []
    for entry in map(str, given):
        if glob.has_magic(entry):
            matched = sorted(glob.glob(entry))
            if not matched:
                raise CheckpointError(
                    f"checkpoint={entry} matches nothing; give run directories, .pt files or .dcp directories"
                )
            paths += [Path(p) for p in matched if (Path(p) / "checkpoints").is_dir() or p.endswith((".pt", ".dcp"))]
        else:
            paths.append(Path(entry))
    return paths


def typed_eval_config(composed: DictConfig) -> EvalConfig:
    """Hydra's composed eval config as one ``EvalConfig``, refusing a command that names no checkpoint."""
    if OmegaConf.is_missing(composed, "checkpoint"):
        raise CheckpointError(
            "eval.py needs checkpoint=<run directory, .pt file, glob or [list]>, e.g. checkpoint=runs/x"
        )
    return OmegaConf.to_object(composed)


def run_data_config(recorded: dict) -> DataConfig:
    """The data config a run's record holds (keys this code no longer has are refused by the schema)."""
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(DataConfig), recorded))


def run_eval(cfg: EvalConfig, out_dir: Path) -> dict[str, dict]:
    problem = refusal(cfg, "")  # every sampling and evaluation option in its range, before any work
    if problem:
        raise NormlabError(problem)
    check_schemes(cfg.quant)  # before any checkpoint is read
    probe_text = read_probe_text(cfg)
    paths = checkpoint_paths(cfg.checkpoint)
    check_checkpoints(paths)
    device = resolve_device(cfg.device)
    results, not_written = {}, []
    for path in paths:
        result = evaluate_checkpoint(cfg, path, device, probe_text)
        results[entry_key(result)] = result
        not_written.append(_save(eval_json_beside(Path(result["checkpoint"])), {entry_key(result): result}))
    _print_table(results)  # before the output directory: results that cannot be saved are at least seen
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        record_command(cfg, out_dir)
        unsaved = _save(out_dir / "eval.json", results)
    except (OSError, NormlabError) as err:
        unsaved = f"{out_dir} could not be written ({err})"
    if cfg.logger.name == "wandb":
        logger = WandbLogger(cfg.logger, out_dir, "eval", "eval", dataclasses.asdict(cfg), job_type="eval")
        for result in results.values():
            logger.log({k: v for k, v in result.items() if isinstance(v, (int, float))})
        logger.close()
    problems = [problem for problem in (*not_written, unsaved) if problem]
    if problems:
        kept = "printed above only" if unsaved else f"saved in {out_dir / 'eval.json'}"
        raise EvalWriteError(f"not written: {'; '.join(problems)}. The results are {kept}")
    return results


@hydra.main(version_base="1.3", config_path="configs", config_name="eval")
def main(cfg: DictConfig) -> None:
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        run_eval(typed_eval_config(cfg), out_dir)
    except (NormlabError, QuantizationError) as err:
        log.error("%s", err)
        discard_unused(out_dir)  # Hydra made it for this command: a refused one leaves nothing
        sys.exit(1)


if __name__ == "__main__":
    main()
