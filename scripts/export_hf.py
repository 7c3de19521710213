"""Export a trained checkpoint as a Hugging Face model folder (Llama, Qwen3 or OLMo 2).

    python scripts/export_hf.py runs/small-rmsnorm-s0 exported/
    python scripts/export_hf.py runs/small-rmsnorm-s0 exported/ --fold-gains   # gains in the linear layers
    python -c "from transformers import AutoModelForCausalLM, AutoTokenizer; \
               m = AutoModelForCausalLM.from_pretrained('exported'); t = AutoTokenizer.from_pretrained('exported')"

The variant picks the class (model/hf.py): pre-norm RMSNorm -> LlamaForCausalLM; with per-head
QK-norm -> Qwen3ForCausalLM; reordered with QK-norm over all heads -> Olmo2ForCausalLM. Any
other variant is refused before anything is written, naming what has no equivalent. Our default
RMSNorm rounds once after the gain; Hugging Face rounds before it, so half-precision outputs can
differ in the last bit (float32 is identical). ``--fold-gains`` folds every norm gain into the linear
layer that reads it (model/fold.py): the norms' weights are then ones and the LM head untied, the logits
the same to float rounding; a model whose gains cannot fold is refused naming the norm.

The target is someone's folder: a link as the target, or a folder that already holds weights (another model's
shards would be left beside the new file), is refused (``--overwrite`` replaces the weights), and every file is
written beside its place and renamed onto it, so a link inside (a Hugging Face cache snapshot) is replaced,
never written through.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from model.fold import fold_gains
from model.from_state import model_from_state
from model.hf import hf_config, hf_state_dict
from training.atomic import atomic_write, atomic_write_text
from training.checkpoints.sharded import read_checkpoint
from training.data.tokenizer import EOS
from training.errors import NormlabError

# What a model folder's weights are called: transformers and every other reader take these for the model.
WEIGHT_PATTERNS = ("*.safetensors", "*.safetensors.index.json", "pytorch_model*.bin", "pytorch_model*.bin.index.json")


def held_weights(out_dir: Path) -> list[Path]:
    """The weight files already in ``out_dir`` (links included), which readers would take for the model."""
    return sorted({path for pattern in WEIGHT_PATTERNS for path in out_dir.glob(pattern)})


def check_target(out_dir: Path, overwrite: bool) -> None:
    """Refuse, before the checkpoint is read, a target that is a file or a link (the export would land wherever it
    leads), and one that holds another model's weights unless ``overwrite``."""
    if out_dir.is_symlink():
        raise NormlabError(f"{out_dir} is a link to {os.readlink(out_dir)}: give the folder itself, or a new one")
    if out_dir.exists() and not out_dir.is_dir():
        raise NormlabError(f"{out_dir} is a file, not a folder: give a new or existing folder to export into")
    held = held_weights(out_dir) if out_dir.is_dir() else []
    if held and not overwrite:
        raise NormlabError(
            f"{out_dir} already holds weights ({', '.join(p.name for p in held[:3])}{', ...' if len(held) > 3 else ''}), "
            "which a reader would take for the model: export into a new folder, or add --overwrite to replace them"
        )


def export(checkpoint: Path, out_dir: Path, fold: bool = False, overwrite: bool = False) -> Path:
    """Write the checkpoint's model into ``out_dir`` as a Hugging Face folder. Each file is written beside its
    place and renamed onto it, so a link there (a Hugging Face cache's snapshot is made of links to shared blobs)
    is replaced, never written through; with ``overwrite`` the weights already there are removed first (links
    as links), so no shard of another model is left beside the new one."""
    from safetensors.torch import save_file

    check_target(out_dir, overwrite)  # before the checkpoint is read: nothing to do if it cannot land
    source, state = read_checkpoint(checkpoint)  # whole or sharded (train.parallel=fsdp), without a process group
    model = model_from_state(state["model_config"], state["model"], str(source))  # checked before it takes memory
    if fold:
        fold_gains(model)  # raises naming the norm that cannot fold, before anything is written
    config = hf_config(model)  # raises for variants Hugging Face lacks, before anything is written
    tokenizer = state.get("tokenizer")
    if tokenizer and EOS in tokenizer:
        config["eos_token_id"] = config["bos_token_id"] = json.loads(tokenizer)["added_tokens"][0]["id"]
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in held_weights(out_dir):
        old.unlink()  # a link is removed, not what it leads to
    weights = hf_state_dict(model)
    atomic_write(out_dir / "model.safetensors", lambda tmp: save_file(weights, tmp, metadata={"format": "pt"}))
    atomic_write_text(out_dir / "config.json", json.dumps(config, indent=2))
    if tokenizer:
        atomic_write_text(out_dir / "tokenizer.json", tokenizer)
        tokenizer_config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOS, "bos_token": EOS}
        atomic_write_text(out_dir / "tokenizer_config.json", json.dumps(tokenizer_config, indent=2))
    return out_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "checkpoint", type=Path, help="a checkpoint (.pt file or .dcp directory) or a run directory (its newest)"
    )
    parser.add_argument("out_dir", type=Path, help="folder to write config.json, model.safetensors, tokenizer")
    parser.add_argument("--fold-gains", action="store_true", help="fold every norm gain into the next linear layer")
    parser.add_argument(
        "--overwrite", action="store_true", help="replace the weights a non-empty target folder already holds"
    )
    args = parser.parse_args(argv)
    try:
        out = export(args.checkpoint, args.out_dir, fold=args.fold_gains, overwrite=args.overwrite)
    except (NormlabError, ValueError) as err:
        print(f"export_hf: {err}", file=sys.stderr)
        return 1
    except OSError as err:  # a folder that cannot be written: read-only, a full disk
        print(
            f"export_hf: {err.strerror or err}: {err.filename}; the files already there are as they were",
            file=sys.stderr,
        )
        return 1
    except KeyboardInterrupt:
        print(f"export_hf: interrupted (Ctrl-C); each file in {args.out_dir} is whole, old or new", file=sys.stderr)
        return 130
    print(f"wrote {out}: load it with transformers.AutoModelForCausalLM.from_pretrained({str(out)!r})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
