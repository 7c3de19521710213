"""scripts/import_hf.py: Hugging Face Llama, Qwen3 and OLMo 2 models, built here from configs with random weights,
become run directories that compute transformers' logits and that eval.py (its probes on a text of one's own too),
export_hf.py, train.py and the readers (lab.runs, the explorer, the outliers report) read."""

import contextlib
import hashlib
import io
import json
import re
import shutil
import subprocess

import pytest
import torch
import yaml
from export_hf import main as export_hf
from hydra import compose, initialize_config_dir
from import_hf import import_hf as import_folder
from import_hf import main as import_hf
from test_explorer import run_notebook
from tiny_runs import CONFIG_DIR, read_metrics, train_here
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

import eval as eval_script
from lab.outliers_report import MASSIVE
from lab.outliers_report import write_report as write_outliers_report
from lab.runs import RunsError, load_run
from lab.study_probes import STUDY_PROBES
from model import Transformer
from model.from_state import model_config_of
from training.checkpoints.files import list_checkpoints
from training.checkpoints.load import load_checkpoint
from training.data.build import build_validation
from training.data.tokenizer import token_byte_lengths
from training.telemetry.probes import PROBES, resolve_probe, run_probes

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

VOCAB = 320  # a multiple of 64, so train.py's padded vocabulary is the model's
SHAPE = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)
LLAMA3 = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,  # under the 64 positions compared: every band of frequencies is used
}
MODELS = {
    "llama": lambda: transformers.LlamaConfig(**SHAPE, tie_word_embeddings=False, rms_norm_eps=1e-5),
    "llama tied, llama3 rope": lambda: transformers.LlamaConfig(
        **SHAPE, tie_word_embeddings=True, rope_parameters=LLAMA3
    ),
    "qwen3, wider heads": lambda: transformers.Qwen3Config(**SHAPE, head_dim=32, tie_word_embeddings=True),
    "olmo2": lambda: transformers.Olmo2Config(**SHAPE, rms_norm_eps=1e-5, pad_token_id=0, eos_token_id=1),
}
TEXT = "In the beginning God created the heaven and the earth. Über café naïve, 東京 — “quoted”."


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory) -> str:
    """A byte-level BPE laid out like Llama 3's and Qwen's: a regex split, then bytes (a Sequence pre-tokenizer)."""
    tokenizer = Tokenizer(models.BPE())
    split = pre_tokenizers.Split(Regex(r"\s?\w+|\s?[^\w\s]+|\s+"), behavior="isolated")
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([split, pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|end_of_text|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([TEXT] * 20, trainer)
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    tokenizer.save(str(path))
    return str(path)


def hf_model(kind: str):
    """A transformers model of ``kind`` with random weights, its norm gains away from one."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(MODELS[kind]()).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.copy_(
                1 + 0.2 * torch.randn_like(parameter) if "norm" in name else 0.1 * torch.randn_like(parameter)
            )
    return model


def save(model, folder, tokenizer_file, **options):
    model.save_pretrained(folder, **options)
    shutil.copy(tokenizer_file, folder / "tokenizer.json")
    return folder


def hf_tensors(folder) -> dict[str, torch.Tensor]:
    return {k: v for path in sorted(folder.glob("*.safetensors")) for k, v in safetensors_torch.load_file(path).items()}


def our_model(run_dir) -> Transformer:
    state = load_checkpoint(run_dir)
    model = Transformer(model_config_of(state["model_config"], "the test's")).eval()
    model.load_state_dict(state["model"])
    return model


@pytest.fixture
def cli(capsys):
    """A script's main in this process: its exit status and what it printed."""

    def run(main, *args) -> subprocess.CompletedProcess:
        capsys.readouterr()
        code = main([str(arg) for arg in args])
        out = capsys.readouterr()
        return subprocess.CompletedProcess([], code, out.out, out.err)

    return run


@pytest.mark.parametrize("kind", MODELS)
def test_imported_model_computes_transformers_logits_and_exports_the_same_tensors(tmp_path, tokenizer_file, cli, kind):
    theirs = hf_model(kind)
    folder = save(theirs, tmp_path / "hf", tokenizer_file, max_shard_size="100KB")  # shards and their index
    assert (folder / "model.safetensors.index.json").is_file()
    if "llama3" in kind:  # in the layout Llama 3.x checkpoints ship with: rope_theta beside rope_scaling
        config = json.loads((folder / "config.json").read_text())
        rope = config.pop("rope_parameters")
        config.update(rope_theta=rope.pop("rope_theta"), rope_scaling=rope)
        (folder / "config.json").write_text(json.dumps(config))
    result = cli(import_hf, folder, tmp_path / "run")
    assert result.returncode == 0, result.stderr
    assert "python train.py hydra.run.dir=" in result.stdout  # train.py can resume it: the vocabularies agree
    assert [p.name for p in list_checkpoints(tmp_path / "run")] == ["step_0000000.pt"]
    record = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert record["runtime"]["imported_from"]["architecture"] == type(theirs).__name__

    ours = our_model(tmp_path / "run")
    ids = torch.randint(0, VOCAB, (2, 64))
    with torch.no_grad():
        expected = theirs(ids).logits
        torch.testing.assert_close(ours(ids), expected, atol=1e-5, rtol=1e-5)

    assert cli(export_hf, tmp_path / "run", tmp_path / "back").returncode == 0
    original, exported = hf_tensors(folder), hf_tensors(tmp_path / "back")
    assert exported.keys() == original.keys()  # a tied head is left to the tying both times
    assert all(torch.equal(exported[name], original[name]) for name in original)
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "back").eval()
    assert type(again) is type(theirs)
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, expected, atol=1e-5, rtol=1e-5)


def test_a_pickled_checkpoint_imports_and_one_that_would_run_code_is_refused(tmp_path, tokenizer_file, cli):
    theirs = hf_model("llama")
    folder = tmp_path / "hf"
    theirs.config.save_pretrained(folder)
    shutil.copy(tokenizer_file, folder / "tokenizer.json")
    torch.save(theirs.state_dict(), folder / "pytorch_model.bin")
    assert cli(import_hf, folder, tmp_path / "run").returncode == 0
    ids = torch.randint(0, VOCAB, (1, 16))
    with torch.no_grad():
        torch.testing.assert_close(our_model(tmp_path / "run")(ids), theirs(ids).logits, atol=1e-5, rtol=1e-5)

    class Payload:
        def __reduce__(self):
            return (shutil.rmtree, (str(folder / "victim"),))

    (folder / "victim").mkdir()
    torch.save({"model.embed_tokens.weight": Payload()}, folder / "pytorch_model.bin")
    result = cli(import_hf, folder, tmp_path / "run2")
    assert result.returncode == 1
    assert "pytorch_model.bin as tensors only" in result.stderr and "shutil.rmtree" in result.stderr
    assert (folder / "victim").is_dir() and not (tmp_path / "run2").exists()


def _edit_config(**changes):
    def edit(folder):
        config = json.loads((folder / "config.json").read_text())
        config.update(changes)
        (folder / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}))

    return edit


def _edit_tensors(drop=(), add=()):
    def edit(folder):
        tensors = {k: v for k, v in hf_tensors(folder).items() if k not in drop}
        tensors.update({name: torch.zeros(3) for name in add})
        safetensors_torch.save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})

    return edit


REFUSALS = {
    "mistral": (
        _edit_config(architectures=["MistralForCausalLM"], model_type="mistral"),
        "architecture MistralForCausalLM has no equivalent here: normlab imports LlamaForCausalLM, Qwen3ForCausalLM",
    ),
    "gpt2": (_edit_config(architectures=["GPT2LMHeadModel"], model_type="gpt2"), "GPT2LMHeadModel has no equivalent"),
    "yarn": (
        _edit_config(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}),
        "LlamaForCausalLM with RoPE scaling 'yarn' .*has no equivalent",
    ),
    "linear, older key": (
        _edit_config(rope_parameters=None, rope_scaling={"type": "linear", "factor": 2.0}),
        "RoPE scaling 'linear'",
    ),
    "bias": (_edit_config(attention_bias=True), "LlamaForCausalLM with attention_bias=true has no equivalent"),
    "missing tensor": (
        _edit_tensors(drop=["model.layers.1.mlp.up_proj.weight"]),
        "the weights have no model.layers.1.mlp.up_proj.weight, which LlamaForCausalLM needs",
    ),
    "unexpected tensor": (
        _edit_tensors(add=["model.layers.0.self_attn.q_proj.bias"]),
        "model.layers.0.self_attn.q_proj.bias has no equivalent in normlab's LlamaForCausalLM",
    ),
    "wrong shape": (
        _edit_config(intermediate_size=128),
        r"model.layers.0.mlp.down_proj.weight has shape \[64, 96\] where config.json implies \[64, 128\]",
    ),
    "no tokenizer": (lambda folder: (folder / "tokenizer.json").unlink(), "has no tokenizer.json"),
    "config.json a list": (lambda folder: (folder / "config.json").write_text("[1, 2]"), "holds a JSON list"),
    "target not empty": (None, "already holds files: import into a new or empty folder"),
}


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory, tokenizer_file):
    return save(hf_model("llama"), tmp_path_factory.mktemp("llama") / "hf", tokenizer_file)


@pytest.mark.parametrize("case", REFUSALS)
def test_what_has_no_equivalent_is_refused_by_name_before_anything_is_written(tmp_path, llama_folder, cli, case):
    edit, reason = REFUSALS[case]
    folder = shutil.copytree(llama_folder, tmp_path / "hf")
    target = tmp_path / "runs" / "run"
    if edit is None:
        target.mkdir(parents=True)
        (target / "notes.txt").write_text("mine")
    else:
        edit(folder)
    result = cli(import_hf, folder, target)
    assert result.returncode == 1
    assert result.stderr.startswith("import_hf: ") and len(result.stderr.strip().splitlines()) == 1
    assert re.search(reason, result.stderr), result.stderr
    written = sorted(p.relative_to(tmp_path).as_posix() for p in (tmp_path / "runs").rglob("*"))
    assert written == ([] if edit else ["runs/run", "runs/run/notes.txt"])


def test_a_target_that_is_a_link_is_refused_in_one_line_and_nothing_is_imported(tmp_path, llama_folder, cli):
    """A dangling link where the run directory should go: the run would be written wherever it leads."""
    target = tmp_path / "runs" / "run"
    target.parent.mkdir()
    target.symlink_to(tmp_path / "nowhere")
    result = cli(import_hf, llama_folder, target)
    assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stderr.startswith("import_hf: ") and f"{target} is a link to {tmp_path / 'nowhere'}" in result.stderr
    assert sorted(p.name for p in target.parent.iterdir()) == ["run"] and not (tmp_path / "nowhere").exists()


@pytest.fixture(scope="module")
def imported_llama(tmp_path_factory, llama_folder):
    """The run directory, and the train.py overrides that the import prints as the command that resumes it."""
    run = tmp_path_factory.mktemp("imported") / "run"
    overrides, problem = import_folder(llama_folder, run)
    assert problem is None
    return run, overrides


def test_eval_reads_the_imported_model_with_its_own_tokenizer(imported_llama, llama_folder, cache_dir, tmp_path):
    """eval.py's loss is transformers' on the same windows, bits per byte count the text's UTF-8 bytes, and the
    quantized and folded evaluations run."""
    run, _ = imported_llama
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = eval_script.typed_eval_config(
            compose(
                "eval",
                overrides=[
                    f"checkpoint={run}",
                    "data=kjv",
                    f"data.cache_dir={cache_dir}",
                    "data.val_windows=4",
                    "batch_size=4",
                    "max_new_tokens=4",
                    "quant=[w8a8]",
                    "fold_gains=true",
                ],
            )
        )
    (result,) = eval_script.run_eval(cfg, tmp_path).values()

    tokenizer = Tokenizer.from_file(str(run / "tokenizer.json"))
    windows, _, _ = build_validation(cfg.data, 64, tokenizer)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(llama_folder).eval()
    with torch.no_grad():
        logits = theirs(windows[:, :-1]).logits
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten()).item()
    assert result["val/loss"] == pytest.approx(loss, rel=1e-5)
    lengths = token_byte_lengths(tokenizer)
    assert sum(lengths[i] for i in tokenizer.encode(TEXT).ids) == len(TEXT.encode())  # multi-byte pieces too
    assert abs(result["fold_gains"]["delta/val/loss"]) < 1e-4
    assert result["quant"]["w8a8"]["val/loss"] > 0


def test_train_resumes_the_imported_run_as_a_fine_tune(imported_llama, cache_dir, tmp_path):
    """The overrides the import prints compose the config that train.py compares with the record: it resumes
    from the imported checkpoint at step 0 (a changed schedule named in resume_with_changes, as for any run)."""
    imported, overrides = imported_llama
    run = shutil.copytree(imported, tmp_path / "run")
    train_here(
        run,
        *overrides,
        f"data.cache_dir={cache_dir}",
        "logger=none",
        "train.max_steps=2",
        "train.log_every=1",
        "data.val_windows=4",
        "resume_with_changes=[train.max_steps,data.val_windows]",
    )
    (resume,) = yaml.safe_load((run / "config.yaml").read_text())["resumes"]
    assert resume["step"] == 0 and resume["checkpoint"].endswith("checkpoints/step_0000000.pt")
    assert [row["step"] for row in read_metrics(run) if "train/loss" in row] == [1, 2]


PROBE_TEXT = "In the beginning God created the heaven and the earth."


def eval_run(run, cache_dir, out_dir, *overrides) -> dict:
    """eval.py on ``run``'s own validation windows (kjv's, with the test's token cache); its one result."""
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = eval_script.typed_eval_config(
            compose(
                "eval",
                overrides=[f"checkpoint={run}", "data=kjv", f"data.cache_dir={cache_dir}", "num_samples=1", *overrides],
            )
        )
    (result,) = eval_script.run_eval(cfg, out_dir).values()
    return result


@pytest.fixture(scope="module")
def probed_llama(imported_llama, cache_dir, tmp_path_factory):
    """A copy of the imported run, evaluated with every probe on PROBE_TEXT (and quantized): the run, the result
    and what eval.py printed."""
    run = tmp_path_factory.mktemp("probed") / "run"
    shutil.copytree(imported_llama[0], run, ignore=shutil.ignore_patterns("eval.json"))  # another test's evaluation
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        result = eval_run(run, cache_dir, tmp_path_factory.mktemp("eval"), f"probe_text='{PROBE_TEXT}'", "quant=[w8a8]")
    return run, result, printed.getvalue()


def test_eval_probes_a_chosen_text_and_prints_where_the_outliers_sit(probed_llama):
    run, result, printed = probed_llama
    tokenizer = Tokenizer.from_file(str(run / "tokenizer.json"))
    ids = tokenizer.encode(PROBE_TEXT).ids
    every_probe = [resolve_probe(name) for name in (*PROBES, *STUDY_PROBES)]
    by_hand = run_probes(our_model(run), torch.tensor([ids]), contextlib.nullcontext(), every_probe)
    probed = {key: value for key, value in result.items() if key in by_hand and not key.startswith("perf/")}
    assert probed == pytest.approx({key: by_hand[key] for key in probed})  # the text's tokens, not the val batch's
    assert result["probe_text"] == PROBE_TEXT

    layers = range(SHAPE["num_hidden_layers"])
    ratios = [result[f"act/layers.{i}/massive_ratio"] for i in layers]
    top = max(layers, key=ratios.__getitem__)
    position = result[f"act/layers.{top}/massive_position"]
    token = tokenizer.decode([ids[position]])  # the text's token where the largest activation sits
    assert result["token_text"][str(result[f"act/layers.{top}/massive_token"])] == token
    assert (
        f"the largest activation: {ratios[top]:.1f} x the median |h|, leaving block {top}, feature "
        f"{result[f'act/layers.{top}/massive_feature']}, position {position}, token {token!r}" in printed
    )
    table = printed.split("  block  max|h|/median  feature  position  sink mass  feature kurtosis  token\n")[1]
    for i, line in zip(layers, table.splitlines()):
        assert line.split()[:6] == [
            str(i),
            f"{ratios[i]:.1f}",
            str(result[f"act/layers.{i}/massive_feature"]),
            str(result[f"act/layers.{i}/massive_position"]),
            f"{result[f'attn/layers.{i}/sink_mass']:.3f}",
            f"{result[f'act/layers.{i}/stream_feature_kurtosis']:.2f}",
        ]
    (key,) = json.loads((run / "eval.json").read_text())
    assert key.endswith("| 64 windows | probes on text " + hashlib.sha256(PROBE_TEXT.encode()).hexdigest()[:12])


PROBE_TEXT_REFUSALS = {
    "empty": (["probe_text=' '"], r"^probe_text is empty: give the text to probe"),
    "one token": (["probe_text=In"], r"^probe_text is 1 token with this checkpoint's tokenizer; the probes need 2"),
    "past the context": (
        ["probe_text_file={long}"],
        r"^probe_text_file=.*long.txt is \d+ tokens with this checkpoint's tokenizer, more than the model's context "
        r"of 64: shorten it to at most 64 tokens$",
    ),
    "both": (["probe_text=In", "probe_text_file={long}"], "^probe_text and probe_text_file are both given"),
}


@pytest.mark.parametrize("case", PROBE_TEXT_REFUSALS)
def test_a_text_the_probes_cannot_read_is_refused_in_one_line(imported_llama, cache_dir, tmp_path, case):
    overrides, message = PROBE_TEXT_REFUSALS[case]
    (tmp_path / "long.txt").write_text(PROBE_TEXT * 10)
    with pytest.raises(eval_script.ProbeTextError, match=message) as refused:
        eval_run(
            imported_llama[0], cache_dir, tmp_path / "out", *(o.format(long=tmp_path / "long.txt") for o in overrides)
        )
    assert "\n" not in str(refused.value) and not (tmp_path / "out").exists()


def test_readers_show_an_imported_run_from_its_evaluation(probed_llama, cache_dir, tmp_path, monkeypatch):
    """load_run reads an imported run (no metrics.jsonl) from eval.json, the entry whose probes read the validation
    batch where there is one; the explorer shows it and the outliers report says why it leaves it out."""
    run = shutil.copytree(probed_llama[0], tmp_path / "runs" / "llama")
    loaded = load_run(run)
    assert loaded.status() == "imported (LlamaForCausalLM), not trained here"
    (row,) = loaded.rows
    assert row["step"] == 0 and row["val/loss"] == probed_llama[1]["val/loss"]
    assert loaded.by_layer(MASSIVE) == [probed_llama[1][MASSIVE.format(i=i)] for i in range(2)]

    with contextlib.redirect_stdout(io.StringIO()):
        plain = eval_run(run, cache_dir, tmp_path / "eval")  # the validation batch's probes, beside the text's
    assert len(json.loads((run / "eval.json").read_text())) == 2
    assert load_run(run).by_layer(MASSIVE) == [plain[MASSIVE.format(i=i)] for i in range(2)] != loaded.by_layer(MASSIVE)

    page, defs = run_notebook(monkeypatch, "--runs", tmp_path / "runs")
    assert [r.path for r in defs["runs"]] == [run] and "llama: imported (LlamaForCausalLM), not trained here" in page
    panels = [list(trace.y) for trace in defs["layers_figure"].data]  # one trace a panel: the run's
    assert panels == [load_run(run).by_layer(key) for key in defs["LAYER_PANELS"].values()]

    with pytest.raises(RunsError, match=r"^every run under .* was imported, not trained from scratch here"):
        write_outliers_report([str(tmp_path / "runs")], tmp_path / "report")
