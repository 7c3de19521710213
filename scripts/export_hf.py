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
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from model import ModelConfig, build_model
from model.fold import fold_gains
from model.hf import hf_config, hf_state_dict
from training.errors import NormlabError
from training.sharded_checkpoint import read_checkpoint
from training.tokenizer import EOS


def export(checkpoint: Path, out_dir: Path, fold: bool = False) -> Path:
    from safetensors.torch import save_file

    if out_dir.exists() and not out_dir.is_dir():  # before the checkpoint is read: nothing to do if it cannot land
        raise NormlabError(f"{out_dir} is a file, not a folder: give a new or existing folder to export into")
    _, state = read_checkpoint(checkpoint)  # whole or sharded (train.parallel=fsdp), without a process group
    model = build_model(ModelConfig(**state["model_config"]))
    model.load_state_dict(state["model"])
    if fold:
        fold_gains(model)  # raises naming the norm that cannot fold, before anything is written
    config = hf_config(model)  # raises for variants Hugging Face lacks, before anything is written
    tokenizer = state.get("tokenizer")
    if tokenizer and EOS in tokenizer:
        config["eos_token_id"] = config["bos_token_id"] = json.loads(tokenizer)["added_tokens"][0]["id"]
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(hf_state_dict(model), out_dir / "model.safetensors", metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    if tokenizer:
        (out_dir / "tokenizer.json").write_text(tokenizer)
        tokenizer_config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOS, "bos_token": EOS}
        (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    return out_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "checkpoint", type=Path, help="a checkpoint (.pt file or .dcp directory) or a run directory (its newest)"
    )
    parser.add_argument("out_dir", type=Path, help="folder to write config.json, model.safetensors, tokenizer")
    parser.add_argument("--fold-gains", action="store_true", help="fold every norm gain into the next linear layer")
    args = parser.parse_args(argv)
    try:
        out = export(args.checkpoint, args.out_dir, fold=args.fold_gains)
    except (NormlabError, ValueError) as err:
        print(f"export_hf: {err}", file=sys.stderr)
        return 1
    print(f"wrote {out}: load it with transformers.AutoModelForCausalLM.from_pretrained({str(out)!r})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
