"""eval.py on tiny trained checkpoints."""

import json

import pytest
import torch
from hydra import compose, initialize_config_dir
from tiny_runs import CONFIG_DIR, read_metrics, run_tiny

import eval as eval_script
from model.quantize import QuantizationError
from training.checkpoints.files import list_checkpoints
from training.checkpoints.load import load_checkpoint
from training.errors import CheckpointError, NormlabError


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    cache = str(tmp_path_factory.mktemp("cache"))
    runs = tmp_path_factory.mktemp("runs")
    for norm in ("rmsnorm", "prmsnorm"):
        run_tiny(runs / norm, cache, 4, f"norm={norm}")
    return runs


def eval_config(*overrides):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return eval_script.typed_eval_config(
            compose("eval", overrides=["max_new_tokens=8", "num_samples=2", "batch_size=4", *overrides])
        )


def test_eval_reproduces_the_training_validation_loss(trained, tmp_path):
    run = trained / "rmsnorm"
    results = eval_script.run_eval(eval_config(f"checkpoint={run}"), tmp_path)
    (result,) = results.values()
    assert result["val/loss"] == pytest.approx(read_metrics(run)[-1]["val/loss"], rel=1e-6)  # same windows
    assert result["val/ppl"] == pytest.approx(torch.tensor(result["val/loss"]).exp().item(), rel=1e-6)
    assert 0 < result["val/bpb"] < result["val/loss"]
    assert "act/layers.0.attn_norm/in_rms" in result and "act/final_norm/in_kurtosis" in result
    assert len(result["samples"]) == 2 and all(s.startswith("In the beginning") for s in result["samples"])

    written = json.loads((run / "eval.json").read_text())
    (key,) = written  # keyed by what it measured: the checkpoint, the data and the windows
    assert key.startswith(str(list_checkpoints(run)[-1])) and key.endswith("| 4 windows")
    assert written[key]["data"] == "kjv" and {"val/loss", "val/ppl", "val/bpb"} <= set(written[key])


def test_several_checkpoints_and_more_windows(trained, tmp_path):
    cfg = eval_config(
        f"checkpoint=[{trained / 'rmsnorm'},{trained / 'prmsnorm' / 'checkpoints' / 'step_0000002.pt'}]",
        "val_windows=8",
    )
    results = eval_script.run_eval(cfg, tmp_path)
    combined = json.loads((tmp_path / "eval.json").read_text())
    assert set(combined) == set(results) and len(results) == 2
    assert {r["norm"] for r in results.values()} == {"rmsnorm", "prmsnorm"}
    assert all(r["val_windows"] == 8 for r in results.values())
    assert [r["step"] for r in results.values()] == [4, 2]


def test_sampling_is_seeded(trained, tmp_path):
    first = eval_script.run_eval(eval_config(f"checkpoint={trained / 'rmsnorm'}", "sample_seed=3"), tmp_path)
    again = eval_script.run_eval(eval_config(f"checkpoint={trained / 'rmsnorm'}", "sample_seed=3"), tmp_path)
    assert [r["samples"] for r in first.values()] == [r["samples"] for r in again.values()]


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint at"):
        eval_script.run_eval(eval_config(f"checkpoint={tmp_path / 'nothing'}"), tmp_path)


def test_checkpoint_that_does_not_match_the_code_is_refused(trained, tmp_path):
    state = load_checkpoint(trained / "rmsnorm")
    state["model_config"]["d_model"] = 32  # weights of a 64-wide model under a 32-wide config
    torch.save(state, tmp_path / "wrong.pt")
    with pytest.raises(
        CheckpointError, match="does not match the model its config describes: it holds final_norm.weight of shape"
    ):
        eval_script.run_eval(eval_config(f"checkpoint={tmp_path / 'wrong.pt'}"), tmp_path)
    state["model_config"]["d_model"] = 64
    state["model_config"]["future_option"] = True
    torch.save(state, tmp_path / "newer.pt")
    with pytest.raises(CheckpointError, match="fields this code does not know \\(future_option\\)"):
        eval_script.run_eval(eval_config(f"checkpoint={tmp_path / 'newer.pt'}"), tmp_path)


def test_eval_tokenizes_only_the_validation_split(trained, tmp_path, monkeypatch):
    import training.data.build as data_module

    labels = []
    real = data_module.token_array

    def recording(split, tokenizer, cache_dir, label):
        labels.append(label)
        return real(split, tokenizer, cache_dir, label)

    monkeypatch.setattr(data_module, "token_array", recording)
    eval_script.run_eval(eval_config(f"checkpoint={trained / 'rmsnorm'}"), tmp_path)
    assert labels == ["kjv-val"]


def test_quantized_evaluation_sits_beside_the_float_one_and_never_touches_the_checkpoint(trained, tmp_path, capsys):
    run = trained / "prmsnorm"
    checkpoint = list_checkpoints(run)[-1]
    on_disk = checkpoint.read_bytes()
    cfg = eval_config(f"checkpoint={trained}/*", "quant=[w8a8,w8a8_tensor,w4a16,fp8]")  # a glob of run folders
    results = eval_script.run_eval(cfg, tmp_path)
    assert len(results) == 2
    (result,) = [r for r in results.values() if r["checkpoint"] == str(checkpoint)]
    assert set(result["quant"]) == {"w8a8", "w8a8_tensor", "w4a16", "fp8"}
    for q in result["quant"].values():
        assert q["delta/val/loss"] == pytest.approx(q["val/loss"] - result["val/loss"], abs=1e-12)
        assert q["val/loss"] != result["val/loss"] and 0 < q["val/bpb"]
    key = eval_script.entry_key(result)
    assert json.loads((run / "eval.json").read_text())[key]["quant"] == result["quant"]
    # a second evaluation of the same thing, another scheme: the earlier schemes' results stay beside it
    eval_script.run_eval(eval_config(f"checkpoint={run}", "quant=[w8a8]"), tmp_path)
    assert set(json.loads((run / "eval.json").read_text())[key]["quant"]) == {"w8a8", "w8a8_tensor", "w4a16", "fp8"}
    assert checkpoint.read_bytes() == on_disk
    table = capsys.readouterr().out
    assert "w8a8_tensor" in table and "delta" in table


def test_an_unknown_scheme_is_refused_before_any_checkpoint_is_read(trained, tmp_path):
    with pytest.raises(QuantizationError, match="unknown quantization scheme 'int2'.*w8a8, w8a8_tensor, w4a16, fp8"):
        eval_script.run_eval(eval_config(f"checkpoint={trained / 'rmsnorm'}", "quant=[w8a8,int2]"), tmp_path)
    assert not (tmp_path / "eval.json").exists()


def test_a_glob_that_matches_nothing_says_so(tmp_path):
    with pytest.raises(CheckpointError, match="matches nothing"):
        eval_script.run_eval(eval_config(f"checkpoint={tmp_path}/nope*"), tmp_path)


def test_layer_importance_equals_skipping_each_block_by_hand(trained, tmp_path, capsys):
    run = trained / "rmsnorm"
    (result,) = eval_script.run_eval(eval_config(f"checkpoint={run}", "layer_importance=true"), tmp_path).values()
    importance = result["layer_importance"]
    state = load_checkpoint(list_checkpoints(run)[-1])
    model = eval_script.load_model(state, run, torch.device("cpu"))
    val = _validation(state, run)
    plain = _loss_by_hand(model, val, skip=None)
    assert importance["skip_delta"] == pytest.approx([_loss_by_hand(model, val, skip=i) - plain for i in range(2)])
    assert len(importance["angular_distance"]) == 2 and all(0 <= a <= 1 for a in importance["angular_distance"])
    assert "skip delta" in capsys.readouterr().out


def _validation(state, run):
    from omegaconf import OmegaConf
    from tokenizers import Tokenizer

    from training.config import DataConfig
    from training.data.build import build_validation

    data_cfg = OmegaConf.merge(OmegaConf.structured(DataConfig), state["config"]["data"])
    seq_len = state["config"]["train"]["seq_len"]
    return build_validation(data_cfg, seq_len, Tokenizer.from_str(state["tokenizer"]))[0]


@torch.no_grad()
def _loss_by_hand(model, windows, skip):
    """The decoder's forward written out, without block ``skip``: the loss the skip delta compares."""
    inputs, targets = windows[:, :-1], windows[:, 1:]
    seq = inputs.shape[1]
    x = model.embed(inputs)
    for i, layer in enumerate(model.layers):
        if i != skip:
            x = layer(x, model.rope_cos[:seq], model.rope_sin[:seq], None, 0)
    logits = model.lm_head(model.final_norm(x))
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten()).item()


def test_folded_gains_evaluate_to_the_same_loss_and_a_model_that_cannot_fold_is_refused(trained, tmp_path, cache_dir):
    (result,) = eval_script.run_eval(
        eval_config(f"checkpoint={trained / 'rmsnorm'}", "fold_gains=true"), tmp_path
    ).values()
    assert abs(result["fold_gains"]["delta/val/loss"]) < 1e-5
    assert result["fold_gains"]["val/loss"] == pytest.approx(result["val/loss"], abs=1e-5)
    run_tiny(tmp_path / "post", cache_dir, 2, "norm.placement=post")
    with pytest.raises(NormlabError, match="fold_gains=true: .*cannot fold layers.0.attn_out_norm's gain"):
        eval_script.run_eval(eval_config(f"checkpoint={tmp_path / 'post'}", "fold_gains=true"), tmp_path)
