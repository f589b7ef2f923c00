"""Fault injection on the command line, loading and generation (issue 16, cases 4, 6, 7, 8, 9):
every bad input is refused with one line naming what is wrong (exit code 2 on the command line,
a tformer error class in the library), and every file that was there before is still there, byte
for byte. Quietly degraded results warn once."""

import json
import math
import os
import shutil
import sys
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import tformer
from tformer.checkpoint import CheckpointError, NonFiniteWeightsWarning, TokenizerNotAttachedWarning
from tformer.cli import main
from tformer.config import ConfigError
from tformer.generation import GenerationError
from tformer.nn.attention import KVCache
from tformer.tokenizers import CharTokenizer

TEXT = "to be or not to be, that is the question.\n"


# ---- fixtures and helpers -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory) -> Path:
    """A tiny rotary (no position table) character-level model with its tokenizer."""
    folder = tmp_path_factory.mktemp("model") / "m"
    tokenizer = CharTokenizer.train(TEXT)
    torch.manual_seed(0)
    model = tformer.build_model("gpt-nano", vocab_size=tokenizer.vocab_size, positional="rope")
    model.tokenizer = tokenizer
    model.save(folder)
    return folder


@pytest.fixture
def work(tmp_path, model_folder, monkeypatch) -> Path:
    """A scratch folder (the working directory) holding a copy of the model as ``m`` and a corpus."""
    shutil.copytree(model_folder, tmp_path / "m")
    (tmp_path / "corpus.txt").write_text(TEXT * 3)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (links as where they point), by relative path."""
    return {str(p.relative_to(folder)): (f"-> {os.readlink(p)}".encode() if p.is_symlink() else p.read_bytes())
            for p in sorted(folder.rglob("*")) if p.is_file() or p.is_symlink()}


def refused(capsys, args: list[str], message: str) -> str:
    """Run ``tformer ARGS``: it must exit 2 with one line on standard error that contains ``message``."""
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert message in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


def refused_leaving(folder: Path, capsys, args: list[str], message: str) -> str:
    """``refused``, and the folder is left exactly as it was: nothing changed, nothing added."""
    before = snapshot(folder)
    err = refused(capsys, args, message)
    assert snapshot(folder) == before
    return err


# ---- 4. no command overwrites its own input ----------------------------------------------------------


def _alias(work: Path, how: str) -> str:
    """Another spelling of corpus.txt: itself, through ./, a symbolic link or a hard link."""
    if how == "symlink":
        (work / "link.txt").symlink_to("corpus.txt")
        return "link.txt"
    if how == "hardlink":
        os.link(work / "corpus.txt", work / "hard.txt")
        return "hard.txt"
    return {"same": "corpus.txt", "dot": "./corpus.txt"}[how]


@pytest.mark.parametrize("how", ["same", "dot", "symlink", "hardlink"])
def test_tokenizer_train_refuses_to_write_over_its_corpus(work, capsys, how):
    out = _alias(work, how)
    refused_leaving(work, capsys, ["tokenizer", "train", "--kind", "char", "corpus.txt", "--out", out, "--quiet"],
                    f"--out {Path(out)} is an input of this command")


def test_tokenizer_train_into_a_folder_refuses_a_corpus_named_tokenizer_json(work, capsys):
    (work / "data").mkdir()
    (work / "data" / "tokenizer.json").write_text(TEXT)
    refused_leaving(work, capsys, ["tokenizer", "train", "--kind", "char", "data/tokenizer.json", "--out", "data",
                                   "--quiet"], "data/tokenizer.json is an input of this command")


@pytest.mark.parametrize("out", ["corpus.txt", "./corpus.txt", "m/tokenizer.json", "corpus"])
def test_tokenize_refuses_to_write_over_its_inputs(work, capsys, out):
    if out == "corpus":  # the header goes to OUT.json: that must not be an input either
        shutil.copy(work / "corpus.txt", work / "corpus.json")
        args = ["tokenize", "--tokenizer", "m/tokenizer.json", "corpus.json", "--out", "corpus", "--quiet"]
    else:
        args = ["tokenize", "--tokenizer", "m/tokenizer.json", "corpus.txt", "--out", out, "--quiet"]
    refused_leaving(work, capsys, args, "is an input of this command")


def test_convert_refuses_to_write_over_its_source(work, capsys):
    refused_leaving(work, capsys, ["convert", "m", "./m", "--to", "tformer", "--overwrite"],
                    "DST m is an input of this command")


def test_demo_refuses_data_inside_its_output_folder(work, capsys):
    (work / "run").mkdir()
    (work / "run" / "metrics.jsonl").write_text(TEXT * 20)  # the demo would train on it, then delete it
    refused_leaving(work, capsys, ["demo", "--data", "run/metrics.jsonl", "--out", "run", "--model", "gpt-nano"],
                    "--out run holds the input run/metrics.jsonl")


def test_plot_refuses_to_draw_over_its_metrics(work, capsys):
    (work / "curve.png").write_text('{"step": 1, "train_loss": 2.0}\n')  # a metrics file, whatever its name
    refused_leaving(work, capsys, ["plot", "curve.png", "--out", "curve.png"], "--out curve.png is an input")


# ---- 6. bounded generation memory ----------------------------------------------------------------------


def test_an_impossible_generation_is_refused_before_allocating(work):
    model = tformer.load("m")
    ids = torch.tensor([model.tokenizer.encode("to be")])
    with pytest.raises(GenerationError, match=r"max_new_tokens=1000000000 for 1 sequence\(s\) after a 5-token prompt "
                                              r"\(key/value caches .* GiB, output .* GiB\) needs about .* GiB of "
                                              r"memory; .* is available on cpu"):
        tformer.generate(model, ids, max_new_tokens=10**9)


def test_an_impossible_generation_on_the_command_line_is_one_line(work, capsys):
    refused_leaving(work, capsys, ["generate", "m", "--prompt", "to be", "--max-new-tokens", str(10**9)],
                    "max_new_tokens=1000000000 for 1 sequence(s)")


@pytest.mark.parametrize("options", [{}, {"num_beams": 3}, {"padded": True}, {"use_cache": False}],
                         ids=["greedy", "beams", "padded", "no-cache"])
def test_a_run_that_may_stop_early_grows_its_cache_and_decodes_the_same(monkeypatch, options):
    """With a stop condition and more new tokens than the first chunk, the session starts small and
    grows: the tokens are those of a session allocated whole (no end id, so no growth)."""
    generate_module = sys.modules["tformer.generation.generate"]  # the package's name "generate" is the function
    session_module = sys.modules["tformer.generation.session"]

    torch.manual_seed(0)
    model = tformer.build_model("gpt-nano", positional="rope", initializer_range=0.2).eval()
    ids = torch.randint(1, 64, (2, 6))
    options = dict(options)
    mask = None
    if options.pop("padded", False):
        mask = torch.ones_like(ids)
        mask[0, :3] = 0
    whole = tformer.generate(model, ids, 40, attention_mask=mask, eos_token_id=[], **options)
    growths = []
    real_grow = KVCache.grow
    monkeypatch.setattr(KVCache, "grow", lambda cache, length: growths.append(length) or real_grow(cache, length))
    monkeypatch.setattr(session_module, "GROWTH_CHUNK", 4)
    monkeypatch.setattr(generate_module, "GROWTH_CHUNK", 4)
    never = 0 if not bool((whole == 0).any()) else None  # an end id the run never produces
    assert never is not None
    grown = tformer.generate(model, ids, 40, attention_mask=mask, eos_token_id=never, **options)
    assert torch.equal(grown, whole)
    if options.get("use_cache", True):
        assert growths and max(growths) == 6 + 40  # doubled from 6 + 4 up to the whole length
    else:
        assert not growths  # without a cache there is nothing to grow


# ---- 7. one-line errors for broken files and values ------------------------------------------------------


def _break_weights(folder: Path, how: str) -> None:
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    broken = {"empty": b"", "truncated": data[: len(data) // 2], "header-only": data[:8],
              "random": os.urandom(4096)}[how]
    weights.write_bytes(broken)


@pytest.mark.parametrize("how", ["empty", "truncated", "header-only", "random"])
@pytest.mark.parametrize("command", ["info", "generate", "convert"])
def test_a_broken_weights_file_is_named_in_one_line(work, capsys, how, command):
    _break_weights(work / "m", how)
    args = {"info": ["info", "m"], "generate": ["generate", "m", "--prompt", "to be"],
            "convert": ["convert", "m", "out", "--to", "hf"]}[command]
    refused_leaving(work, capsys, args, "m/model.safetensors: not a readable safetensors file")


@pytest.mark.parametrize("how", ["empty", "truncated", "random"])
def test_loading_a_broken_weights_file_raises_a_checkpoint_error(work, how):
    _break_weights(work / "m", how)
    with pytest.raises(CheckpointError, match="m/model.safetensors: not a readable safetensors file"):
        tformer.load("m")


def test_a_config_that_is_a_json_list_is_named(work, capsys):
    (work / "m" / "config.json").write_text("[1, 2]\n")
    refused_leaving(work, capsys, ["info", "m"], "m/config.json: holds a JSON list, not an object of config fields")
    with pytest.raises(CheckpointError, match="m/config.json: holds a JSON list"):
        tformer.load("m")


@pytest.mark.parametrize("preset, overrides", [("gpt-nano", {}), ("gpt-mini", {}),
                                               ("gpt-nano", {"num_kv_heads": 1, "tie_embeddings": False,
                                                             "activation": "swiglu"})])
def test_the_model_memory_estimate_is_within_ten_percent(preset, overrides):
    from tformer.models.registry import model_bytes

    model = tformer.build_model(preset, **overrides)
    actual = sum(t.numel() * t.element_size() for t in {id(p): p for p in model.parameters()}.values())
    assert 0.9 * actual <= model_bytes(model.config) <= actual


def test_a_huge_vocabulary_is_refused_before_allocating(work, capsys):
    config = json.loads((work / "m" / "config.json").read_text())
    config["vocab_size"] = 10**11  # 3.2e12 parameters at width 32: about 12 TB of float32
    (work / "m" / "config.json").write_text(json.dumps(config))
    message = "m/config.json: loading its model (vocab_size=100000000000, d_model=32, num_layers=2) needs about"
    refused_leaving(work, capsys, ["info", "m"], message)
    with pytest.raises(CheckpointError, match=r"needs about [\d,.]+ TiB of memory; .* is available on cpu"):
        tformer.load("m")


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_temperature_nan_is_refused(work, capsys, value):
    refused_leaving(work, capsys, ["generate", "m", "--prompt", "to be", "--temperature", value],
                    f"--temperature: temperature={value} must be a number >= 0")


def test_a_prompt_that_is_not_utf8_is_refused(work, capsys):
    """Bytes that are not UTF-8 reach Python's argv as lone surrogates (``os.fsdecode``'s
    surrogateescape); echoing them back would fail, and the tokenizer cannot read them."""
    prompt = os.fsdecode(b"to \xff be")
    err = refused_leaving(work, capsys, ["generate", "m", "--prompt", prompt],
                          "--prompt is not UTF-8 text (byte ff at character 3)")
    assert err.startswith("tformer generate: error:")


@pytest.mark.parametrize("content, message", [
    (b"\x89PNG\r\n\x1a\n\xff\xfe garbage", "not a metrics.jsonl file (not UTF-8 text"),
    (b'[1, 2]\n"text"\n', "metrics.jsonl:1: not a metrics record"),
    (b'{"step": 1, "train_loss": 2.5}\n{"loss": 3}\n', "metrics.jsonl:2: not a metrics record"),
    (b'{"step": 1, "train_loss": "high"}\n{"step": 2, "train_loss": 2.0}\n', "train_loss='high' is not a number"),
], ids=["binary", "not-objects", "no-step", "text-loss"])
def test_plot_names_a_garbage_metrics_file(work, capsys, content, message):
    (work / "run").mkdir()
    (work / "run" / "metrics.jsonl").write_bytes(content)
    refused_leaving(work, capsys, ["plot", "run"], message)


def test_plot_draws_a_diverged_run(work, capsys):
    """A run that diverged logs its non-finite losses as null: they are gaps in the curve, not a crash."""
    (work / "run").mkdir()
    records = [{"step": 1, "train_loss": 3.0, "lr": 1e-3, "eval_loss": 3.1}, {"step": 2, "train_loss": None,
                                                                               "lr": 1e-3, "eval_loss": None}]
    (work / "run" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main(["plot", "run"]) == 0
    assert "2 records, step 2, last eval loss not finite" in capsys.readouterr().out
    assert (work / "run" / "loss_curve.png").read_bytes()[:4] == b"\x89PNG"


# ---- 8. values that cannot work, and warnings where a result is quietly degraded ----------------------------


@pytest.mark.parametrize("theta", [0.0, -1.0, float("nan"), float("inf")])
def test_rope_theta_must_be_positive(theta):
    with pytest.raises(ConfigError, match=f"rope_theta={theta!r} must be a finite number > 0"):
        tformer.ModelConfig(positional="rope", rope_theta=theta)


@pytest.mark.parametrize("args, message", [
    (["generate", "m", "--prompt", "to be", "--num-beams", "0"], "--num-beams: num_beams=0 must be an integer >= 1"),
    (["generate", "m", "--prompt", "to be", "--max-new-tokens", "-1"], "--max-new-tokens: max_new_tokens=-1"),
    (["tokenizer", "train", "--kind", "bpe", "--vocab-size", "300", "corpus.txt", "--out", "t.json",
      "--min-frequency", "-1", "--quiet"], "--min-frequency -1: must be an integer >= 0"),
    (["tokenizer", "train", "--kind", "bpe", "--vocab-size", "300", "corpus.txt", "--out", "t.json",
      "--special-tokens", " , ,", "--quiet"], "--special-tokens ' , ,' names no token"),
    (["generate", "m", "--prompt", "to be", "--seed", str(2**64)],
     "--seed: seed=18446744073709551616 must be below 2**64"),
], ids=["num-beams-0", "max-new-tokens-negative", "min-frequency-negative", "special-tokens-empty",
        "seed-beyond-64-bits"])
def test_options_that_cannot_work_are_refused_naming_the_option(work, capsys, args, message):
    refused_leaving(work, capsys, args, message)


def test_threads_sets_the_threads_a_command_computes_with(work, capsys, monkeypatch):
    before = torch.get_num_threads()
    monkeypatch.setattr("tformer.cli.model_source.available_cpus", lambda: before + 1)  # a machine with a core to spare
    try:
        threads = before + 1  # not what it had
        assert main(["generate", "m", "--prompt", "to be", "--max-new-tokens", "2", "--threads", str(threads)]) == 0
        assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(before)
    capsys.readouterr()
    refused_leaving(work, capsys, ["generate", "m", "--prompt", "to be", "--threads", "0"], "--threads 0 must be >= 1")


def test_gathering_sources_is_refused_where_there_is_no_encoder_to_batch(work, capsys):
    """--gather-sources holds requests back so that an encoder's sources start together: a decoder has none, and is
    refused rather than served as if it were honoured."""
    serve = ["serve", "m", "--port", "0", "--engine", "thread"]
    refused_leaving(work, capsys, [*serve, "--gather-sources", "0"], "--gather-sources 0 must be >= 1")
    refused_leaving(work, capsys, [*serve, "--gather-sources", "4"],
                    "gather_sources=4 batches an encoder-decoder's sources (its encoder's work); this model has none")


@pytest.mark.parametrize("command", [["generate", "m", "--prompt", "to be"], ["serve", "m", "--port", "0"]],
                         ids=["generate", "serve"])
def test_threads_beyond_the_cpus_this_process_may_use_are_refused(work, capsys, command):
    """Threads past the cores only wait for each other (9999 on 2 cores: a 0.0 s transcription took 19 s)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    before = torch.get_num_threads()
    for threads in (cpus + 1, 9999):
        refused_leaving(work, capsys, [*command, "--threads", str(threads)],
                        f"--threads {threads} is more than the {cpus} CPU(s) this process may run on; give 1 to {cpus}")
    assert torch.get_num_threads() == before


ENCODER = ("encoder", "an encoder, which reads text and answers with its head: tformer predict and tformer evaluate "
           "run it")
VISION = ("vision", "a vision model, which labels images: tformer classify runs it")
GENERATE = ["generate", "RUN", "--prompt", "to be"]
SERVE = ["serve", "RUN", "--port", "0", "--engine", "thread"]
DRAFT = ["generate", "m", "--prompt", "to be", "--draft", "RUN"]


@pytest.mark.parametrize("architecture, what, command", [
    (*ENCODER, GENERATE), (*VISION, GENERATE), (*VISION, SERVE), (*ENCODER, DRAFT), (*VISION, DRAFT)],
    ids=["generate-encoder", "generate-vision", "serve-vision", "draft-encoder", "draft-vision"])
def test_a_model_that_writes_no_text_is_refused_in_a_users_words(work, capsys, architecture, what, command):
    """serve said 'model must be a tformer model with the generation hooks ...; EncoderModel lacks ...'. (An encoder
    is served: its /v1/embeddings, tests/serving/test_serve_embeddings.py.)"""
    options = {"vocab_size": 64} if architecture == "encoder" else {"image_size": 32, "patch_size": 16}
    model = tformer.build_model("bert-tiny" if architecture == "encoder" else "vit-mnist", **options)
    model.tokenizer = CharTokenizer.train(TEXT)
    model.save(work / "run")
    option = "--draft" if "--draft" in command else command[0]
    refused_leaving(work, capsys, [("run" if arg == "RUN" else arg) for arg in command],
                    f"tformer {command[0]}: error: run: {option} needs a decoder (a text generator); this run is "
                    f"{what}\n")


@pytest.mark.parametrize("command", ["quantize", "transcribe", "generate"])
def test_ctrl_c_says_interrupted_in_one_line_with_exit_status_130(work, capsys, monkeypatch, command):
    """A KeyboardInterrupt carries no message: the line said only 'tformer quantize: '."""
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(f"tformer.cli.{command}.run", interrupted)
    arguments = {"quantize": ["m", "--bits", "8", "--out", "q"], "transcribe": ["m", "a.wav"],
                 "generate": ["m", "--prompt", "to be"]}[command]
    assert main([command, *arguments]) == 130
    assert capsys.readouterr().err == f"tformer {command}: interrupted\n"


@pytest.mark.parametrize("command", ["generate", "translate", "evaluate", "transcribe", "classify", "predict",
                                     "attention", "serve"])
def test_every_inference_command_takes_threads(command):
    from tformer.cli import build_parser

    subcommands = next(action for action in build_parser()._actions if action.dest == "command").choices
    assert "--threads" in subcommands[command]._option_string_actions


@pytest.mark.parametrize("value", [2, -1])
def test_attention_mask_values_other_than_0_and_1_are_refused(value):
    model = tformer.build_model("gpt-nano").eval()
    mask = torch.ones(1, 5, dtype=torch.long)
    mask[0, 2] = value
    with pytest.raises(ValueError, match=f"attention_mask holds {value}; it must hold only 0 .padding. and 1"):
        model(torch.randint(0, 64, (1, 5)), attention_mask=mask)


def test_prompt_characters_unknown_to_the_tokenizer_warn(work, capsys):
    assert main(["generate", "m", "--prompt", "to bé", "--max-new-tokens", "3"]) == 0
    err = capsys.readouterr().err
    assert "tformer generate: warning: --prompt: 1 token(s) became <unk>: text the tokenizer does not know ('é')" in err


def test_non_finite_weights_load_with_a_warning(work, capsys):
    weights = load_file(str(work / "m" / "model.safetensors"))
    weights["stack.blocks.1.feedforward.in_proj.weight"][0, 0] = float("nan")
    save_file(weights, str(work / "m" / "model.safetensors"))
    with pytest.warns(NonFiniteWeightsWarning, match=r"m/model.safetensors: stack.blocks.1.feedforward.in_proj.weight "
                                                     r"hold NaN or infinite values"):
        tformer.load("m")
    assert main(["info", "m"]) == 0
    err = capsys.readouterr().err
    assert err.count("warning: m/model.safetensors: stack.blocks.1.feedforward.in_proj.weight hold NaN") == 1


def test_a_demo_sample_cut_by_the_context_warns(work, capsys):
    (work / "corpus.txt").write_text(TEXT * 20)
    assert main(["demo", "--steps", "1", "--out", "run", "--data", "corpus.txt", "--model", "gpt-nano",
                 "--prompt", "to be", "--sample-tokens", "100"]) == 0
    out, err = capsys.readouterr()
    assert ("tformer demo: warning: --sample-tokens 100: the sample has 59 characters, what the model's context "
            "of 64 leaves after the 5-character prompt") in err
    assert "sample (59 characters" in out


def test_a_demo_sample_by_default_fills_the_context_without_a_warning(work, capsys):
    (work / "corpus.txt").write_text(TEXT * 20)
    assert main(["demo", "--steps", "1", "--out", "run", "--data", "corpus.txt", "--model", "gpt-nano",
                 "--prompt", "to be"]) == 0
    out, err = capsys.readouterr()
    assert "warning" not in err
    assert "sample (59 characters" in out


def test_a_loss_with_every_label_ignored_warns_once():
    model = tformer.build_model("gpt-nano")
    ids = torch.randint(0, 64, (2, 1))  # one token per row: nothing to predict
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for _ in range(3):
            loss = model(ids, labels=ids).loss
    assert math.isnan(loss.item())
    messages = [str(w.message) for w in caught]
    assert messages == ["every label is ignored (-100), so the loss is NaN: there is no token to predict "
                        "(a one-token sequence, or labels masked out entirely)"]


# ---- 9. consistency ------------------------------------------------------------------------------------------


def test_an_unsupported_tokenizer_in_a_tformer_folder_warns_and_generate_says_why(work, capsys):
    (work / "m" / "tokenizer.json").write_text(json.dumps({"model": {"type": "WordLevelish", "vocab": []}}))
    with pytest.warns(TokenizerNotAttachedWarning, match="m: tokenizer not attached: .*unknown tokenizer model type "
                                                         "'WordLevelish'"):
        model = tformer.load("m")
    assert model.tokenizer is None and model.num_parameters() > 0
    refused_leaving(work, capsys, ["generate", "m", "--prompt", "to be"],
                    "m: tokenizer not attached: m/tokenizer.json: unknown tokenizer model type 'WordLevelish'")


@pytest.mark.parametrize("format", ["tformer", "hf"])
def test_saving_onto_an_existing_file_is_refused(work, format):
    (work / "notes.txt").write_text("keep me\n")
    before = snapshot(work)
    with pytest.raises(CheckpointError, match="notes.txt: exists and is not a folder"):
        tformer.build_model("gpt-nano").save(work / "notes.txt", format=format)
    assert snapshot(work) == before


def test_convert_overwrite_onto_an_existing_file_is_refused(work, capsys):
    (work / "notes.txt").write_text("keep me\n")
    refused_leaving(work, capsys, ["convert", "m", "notes.txt", "--to", "tformer", "--overwrite"],
                    "notes.txt: exists and is not a folder")


def test_perplexity_after_divergence_is_inf():
    from tformer.training.tasks import Task
    from tformer.training.tasks.base import perplexity

    assert perplexity(800.0) == math.inf and Task.format_metric("eval_ppl", perplexity(800.0)) == "inf"
    assert Task.format_metric("eval_ppl", perplexity(100.0)) == "2.69e+43"
    assert Task.format_metric("eval_ppl", perplexity(2.0)) == "7.39"


# ---- issue 37: refuse what would give a wrong result; replace only what tformer wrote ------------------------


def test_average_refuses_checkpoints_whose_tokenizers_differ(work, capsys):
    shutil.copytree(work / "m", work / "m2")
    other = CharTokenizer.train(TEXT.upper())  # as many characters, other ones: the same config, other tokens
    assert other.vocab_size == tformer.load("m").tokenizer.vocab_size
    other.save(work / "m2" / "tokenizer.json")
    err = refused_leaving(work, capsys, ["average", "m", "m2", "--out", "avg"], "m2: its tokenizer (")
    assert "token ids) differs from m's" in err and not (work / "avg").exists()


def test_plot_keeps_a_png_it_did_not_draw_unless_overwrite(work, capsys):
    (work / "run").mkdir()
    (work / "run" / "metrics.jsonl").write_text('{"step": 1, "train_loss": 2.0}\n{"step": 2, "train_loss": 1.5}\n')
    (work / "run" / "loss_curve.png").write_bytes(b"\x89PNG\r\n\x1a\n the user's own figure")
    refused_leaving(work, capsys, ["plot", "run"], "run/loss_curve.png exists and is not a figure tformer wrote; "
                                                   "choose another --out, or pass --overwrite to replace it")
    assert main(["plot", "run", "--overwrite"]) == 0
    assert main(["plot", "run"]) == 0  # its own figure is redrawn without --overwrite
    assert b"the user's own figure" not in (work / "run" / "loss_curve.png").read_bytes()


def test_tokenize_and_tokenizer_train_replace_an_existing_output_only_with_overwrite(work, capsys):
    tokenize = ["tokenize", "--tokenizer", "m/tokenizer.json", "corpus.txt", "--out", "data.bin", "--quiet"]
    for existing in ("data.bin", "data.bin.json"):
        (work / existing).write_text("mine\n")
        refused_leaving(work, capsys, tokenize, f"{existing} exists; choose another --out, or pass --overwrite")
        (work / existing).unlink()
    (work / "data.bin").write_text("mine\n")
    assert main([*tokenize, "--overwrite"]) == 0 and (work / "data.bin").read_bytes() != b"mine\n"

    train = ["tokenizer", "train", "--kind", "char", "corpus.txt", "--quiet", "--out"]
    (work / "tok.json").write_text("mine\n")
    refused_leaving(work, capsys, [*train, "tok.json"], "tok.json exists; choose another --out, or pass --overwrite")
    refused_leaving(work, capsys, [*train, "m"], "m/tokenizer.json exists; choose another --out, or pass --overwrite")
    assert main([*train, "tok.json", "--overwrite"]) == 0 and tformer.tokenizers.load("tok.json").vocab_size > 1


@pytest.mark.slow  # imports sacrebleu
def test_evaluate_keeps_hand_edited_translations_beside_its_metrics_unless_overwrite(work, capsys):
    pytest.importorskip("sacrebleu")
    from tformer.training.tasks.translation import learn_joint_bpe

    (work / "s.de").write_text("ein hund.\nein mann.\n")
    (work / "s.en").write_text("a dog.\na man.\n")
    from tformer.data.parallel import read_parallel

    tokenizer = learn_joint_bpe(read_parallel(work / "s", "de", "en"), 270)
    torch.manual_seed(0)
    model = tformer.build_model("transformer-multi30k", vocab_size=tokenizer.vocab_size, d_model=16, num_layers=1,
                                num_heads=2, d_ff=32, max_seq_len=32)
    model.tokenizer = tokenizer
    model.save(work / "mt")
    evaluate = ["evaluate", "mt", "--source", "s.de", "--reference", "s.en", "--beam", "1"]
    assert main(evaluate) == 0
    assert main(evaluate) == 0  # its own translations are replaced
    hypotheses = work / "mt" / "evaluation" / "s.beam1.txt"
    hypotheses.write_text("a dog.\na man.\n")  # corrected by hand; s.json still sits beside it
    capsys.readouterr()
    refused_leaving(work, capsys, evaluate, "s.beam1.txt exists and is not the translation s.json records (edited")
    assert main([*evaluate, "--overwrite"]) == 0 and hypotheses.read_text() != "a dog.\na man.\n"


def test_convert_overwrite_leaves_no_stale_file_of_the_old_checkpoint(work, capsys):
    from tformer.tokenizers.chat_template import ChatTemplate

    assert main(["convert", "m", "out", "--to", "tformer"]) == 0
    (work / "out" / "tokenizer_config.json").write_text('{"chat_template": "STALE {{ messages }}"}\n')
    before = snapshot(work / "out")
    (work / "out" / "notes.txt").write_text("mine\n")
    assert main(["convert", "m", "out", "--to", "tformer", "--overwrite"]) == 0
    assert "moved the checkpoint files in out (config.json, model.safetensors, tokenizer.json, " \
           f"tokenizer_config.json) to {work / 'out.replaced-1'}" in capsys.readouterr().out
    assert snapshot(work / "out.replaced-1") == before  # moved aside, not deleted
    assert not (work / "out" / "tokenizer_config.json").exists() and ChatTemplate.from_folder(work / "out") is None
    assert (work / "out" / "notes.txt").read_text() == "mine\n"  # not a checkpoint file: it stays
    assert tformer.load(work / "out").num_parameters() == tformer.load("m").num_parameters()
