"""``tformer quantize`` writes a folder every command loads quantized; ``--quantize`` quantizes as a command
loads; the options are checked before anything is loaded or written."""

import json
from contextlib import nullcontext

import pytest
import torch

import tformer
from tformer.cli import main
from tformer.quantization import quantized_weights
from tformer.tokenizers import CharTokenizer

TEXT = "to be or not to be, that is the question.\n"


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("model") / "float"
    tokenizer = CharTokenizer.train(TEXT)
    torch.manual_seed(0)
    model = tformer.build_model("gpt-nano", vocab_size=tokenizer.vocab_size, d_model=64, initializer_range=0.2)
    model.tokenizer = tokenizer
    model.save(folder)
    return folder


def greedy_text(model, prompt="to be", new=20):
    ids = torch.tensor([model.tokenizer.encode(prompt)])
    return prompt + model.tokenizer.decode(tformer.generate(model, ids, new)[0, ids.shape[1]:].tolist())


@pytest.mark.parametrize("method, options", [("int8", ["--bits", "8"]), ("int4", ["--bits", "4", "--group-size", "32"]),
                                             ("w8a8", ["--bits", "8", "--activations", "int8"])],
                         ids=["int8", "int4", "w8a8"])
def test_quantize_writes_a_folder_that_generate_loads_quantized(model_folder, tmp_path, capsys, method, options):
    out = tmp_path / method
    assert main(["quantize", str(model_folder), *options, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out} ({method}" in printed and "x the" in printed and "MB" in printed
    config = json.loads((out / "config.json").read_text())
    assert config["quantization"]["method"] == method
    assert (out / "model.safetensors").stat().st_size < (model_folder / "model.safetensors").stat().st_size
    model = tformer.load(out)
    assert main(["generate", str(out), "--prompt", "to be", "--max-new-tokens", "20"]) == 0
    assert capsys.readouterr().out == greedy_text(model) + "\n"
    assert main(["info", str(out)]) == 0
    assert f"quantized    {method}" in capsys.readouterr().out


@pytest.mark.parametrize("options", [["--bits", "8"], ["--bits", "4", "--group-size", "32"]], ids=["int8", "int4"])
def test_info_and_convert_count_the_parameters_the_quantized_model_stands_for(model_folder, tmp_path, capsys, options):
    """They counted only the parameters left in float: 'parameters 15,360' for a 2.7M-parameter model."""
    floats = tformer.load(model_folder)
    total, without = floats.num_parameters(), floats.num_parameters(exclude_embeddings=True)
    out = tmp_path / "q"
    assert main(["quantize", str(model_folder), *options, "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["info", str(out)]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("parameters"))
    integers = quantized_weights(tformer.load(out))
    assert line == (f"parameters   {total:,} ({without:,} without embeddings); stored quantized: {integers:,} as "
                    f"integers, {total - integers:,} in float")
    assert main(["convert", str(out), str(tmp_path / "copy"), "--to", "tformer"]) == 0
    scheme = tformer.load(out).quantization.describe()
    assert capsys.readouterr().out == (f"wrote {tmp_path / 'copy'} (tformer format, DecoderLM, {total:,} parameters, "
                                       f"stored quantized: {scheme})\n")


def test_keep_embeddings_keeps_the_token_table_float(model_folder, tmp_path, capsys):
    out = tmp_path / "kept"
    assert main(["quantize", str(model_folder), "--bits", "4", "--group-size", "32", "--keep-embeddings",
                 "--out", str(out)]) == 0
    assert "token tables in float" in capsys.readouterr().out
    model = tformer.load(out)
    assert isinstance(model.embedding.token, torch.nn.Embedding) and not model.quantization.embeddings
    assert torch.equal(model.embedding.token.weight, tformer.load(model_folder).embedding.token.weight)


def test_generate_quantize_option_equals_the_quantized_folder(model_folder, capsys):
    command = ["generate", str(model_folder), "--prompt", "to be", "--max-new-tokens", "20", "--quantize", "int8"]
    assert main(command) == 0
    assert capsys.readouterr().out == greedy_text(tformer.load(model_folder, quantize="int8")) + "\n"


@pytest.mark.parametrize("args, message", [
    (["generate", "FLOAT", "--prompt", "a", "--group-size", "32"], "--group-size goes with --quantize int4"),
    (["generate", "FLOAT", "--prompt", "a", "--quantize", "int4", "--group-size", "48"],
     "--group-size: int4 group_size=48 is not one of 32, 64, 128"),
    (["generate", "FLOAT", "--prompt", "a", "--quantize", "int3"], "invalid choice: 'int3'"),
    (["quantize", "FLOAT", "--bits", "8", "--group-size", "64", "--out", "OUT"], "--group-size goes with --bits 4"),
    (["quantize", "FLOAT", "--bits", "4", "--activations", "int8", "--out", "OUT"],
     "--activations int8 goes with --bits 8"),
    (["generate", "FLOAT", "--prompt", "a", "--quantize", "w8a8", "--group-size", "32"],
     "--group-size goes with --quantize int4 (w8a8 is per output channel)"),
    (["quantize", "FLOAT", "--bits", "8", "--out", "FLOAT"], "is an input of this command"),
    (["quantize", "FLOAT", "--bits", "8", "--out", "BUSY"], "is not empty; give --overwrite"),
    (["quantize", "FLOAT", "--bits", "8", "--out", "BUSY", "--overwrite"], "holds files but no model folder"),
])
def test_options_are_checked_in_one_line(model_folder, tmp_path, capsys, args, message):
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    names = {"FLOAT": str(model_folder), "OUT": str(tmp_path / "out"), "BUSY": str(busy)}
    with pytest.raises(SystemExit) if "invalid choice" in message else nullcontext():
        assert main([names.get(arg, arg) for arg in args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert (busy / "notes.txt").read_text() == "mine" and not (tmp_path / "out").exists()


def test_quantizing_a_quantized_folder_again_is_refused(model_folder, tmp_path, capsys):
    assert main(["quantize", str(model_folder), "--bits", "8", "--out", str(tmp_path / "q")]) == 0
    capsys.readouterr()
    assert main(["generate", str(tmp_path / "q"), "--prompt", "a", "--quantize", "int4"]) == 2
    assert "quantized already (int8); it cannot be quantized again as int4" in capsys.readouterr().err


@pytest.fixture(scope="module")
def narrow_folder(tmp_path_factory):
    """A float model whose 32-input layers int4 groups of 64 cannot hold (quantize keeps them in float)."""
    folder = tmp_path_factory.mktemp("narrow") / "float"
    tokenizer = CharTokenizer.train(TEXT)
    model = tformer.build_model("gpt-nano", vocab_size=tokenizer.vocab_size)
    model.tokenizer = tokenizer
    model.save(folder)
    return folder


@pytest.mark.parametrize("source, group, edit, message", [
    ("narrow", "64", {"float_layers": []}, "float_layers=[] disagrees with the weights, which hold 6 layer(s) "
                                           "in float: stack.blocks.0.attention.qkv_proj"),
    ("narrow", "32", {"group_size": 64}, "group_size=64 disagrees with the weights, which hold lm_head (32 inputs) "
                                         "in 1 group(s) of 32"),
    ("narrow", "32", {"float_layers": ["lm_head"]}, "float_layers=['lm_head'] disagrees with the weights, which hold "
                                                    "1 layer(s) quantized: lm_head"),
    ("wide", "32", {"group_size": 64}, "group_size=64 disagrees with the weights, which hold lm_head (64 inputs) "
                                       "in 2 group(s) of 32"),
], ids=["float-layers-emptied", "group-size-impossible", "float-layer-quantized", "group-size-other-shape"])
@pytest.mark.parametrize("command", [["info"], ["generate", "--prompt", "a"], ["convert", "--to", "hf", "DST"],
                                     ["serve", "--engine", "thread", "--port", "0"]],
                         ids=["info", "generate", "convert", "serve"])
def test_an_int4_config_that_disagrees_with_its_tensors_is_one_line(model_folder, narrow_folder, tmp_path, capsys,
                                                                     source, group, edit, message, command):
    out = tmp_path / "int4"
    float_folder = narrow_folder if source == "narrow" else model_folder
    assert main(["quantize", str(float_folder), "--bits", "4", "--group-size", group, "--out", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    config["quantization"].update(edit)
    (out / "config.json").write_text(json.dumps(config))
    capsys.readouterr()
    args = [command[0], str(out), *(str(tmp_path / "dst") if arg == "DST" else arg for arg in command[1:])]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"tformer {command[0]}: error: {out / 'model.safetensors'}: config.json's quantization "
                          f"{message}") and err.count("\n") == 1
    assert not (tmp_path / "dst").exists()


def train_run(folder, task: str):
    """A run of 2 steps, classification or speech recognition, and its evaluation file."""
    from speech_corpus import write_corpus

    from tformer.training.recipe import recipe_from_dict
    from tformer.training.run import train_recipe

    if task == "speech":
        write_corpus(folder, count=8, seed=0)
        data = write_corpus(folder, count=3, seed=1, name="test.tsv")
        model = {"preset": "whisper-digits", "d_model": 32, "num_layers": 1, "num_encoder_layers": 1, "num_heads": 2,
                 "d_ff": 64, "max_source_positions": 25, "max_seq_len": 16}
        settings = {"data": {"train": "train.tsv", "eval": "test.tsv"}, "task": {"name": "speech_recognition"}}
    else:
        words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good", "bad", "film"]
        (folder / "vocab.txt").write_text("\n".join(words) + "\n", encoding="utf-8")
        data = folder / "train.tsv"
        data.write_text("sentence\tlabel\n" + "".join(f"{'good' if i % 2 else 'bad'} film\t{i % 2}\n"
                                                      for i in range(12)), encoding="utf-8")
        model = {"preset": "bert-tiny", "head": "sequence_classification", "max_seq_len": 16}
        settings = {"data": {"train": "train.tsv", "eval": "train.tsv", "tokenizer": "vocab.txt"},
                    "task": {"name": "classification"}}
    recipe = recipe_from_dict({"model": model, **settings, "training": {
        "max_steps": 2, "batch_size": 4, "eval_every": 2, "eval_batches": 0, "threads": 1}}, base_dir=folder)
    train_recipe(recipe, folder / "run", progress=False, echo=lambda line: None)
    return folder / "run", data


@pytest.mark.slow  # trains, quantizes and evaluates a run (about 2 s)
@pytest.mark.parametrize("task", ["classification", "speech"])
def test_evaluate_reads_the_folder_quantize_writes_from_a_run(tmp_path, capsys, task):
    run, data = train_run(tmp_path, task)
    quantized = tmp_path / "int8"
    assert main(["quantize", str(run / "checkpoints" / "best"), "--bits", "8", "--out", str(quantized)]) == 0
    assert (quantized / "recipe.toml").read_text() == (run / "recipe.toml").read_text()
    capsys.readouterr()
    assert main(["evaluate", str(run / "checkpoints" / "best"), "--data", str(data), "--quantize", "int8"]) == 0
    metrics = [line for line in capsys.readouterr().out.splitlines() if line.startswith("eval_")]
    assert main(["evaluate", str(quantized), "--data", str(data)]) == 0
    assert [line for line in capsys.readouterr().out.splitlines() if line.startswith("eval_")] == metrics
    assert json.loads((quantized / "evaluation" / f"{data.name.split('.')[0]}.json").read_text())["quantization"][
        "method"] == "int8"


def test_quantize_replaces_no_recipe_it_has_none_for_and_takes_none_from_a_grandparent(model_folder, tmp_path,
                                                                                        capsys):
    import shutil

    nested = shutil.copytree(model_folder, tmp_path / "project" / "models" / "float")
    (tmp_path / "project" / "recipe.toml").write_text("[task]\nname = 'translation'\n")  # not a run's checkpoint
    out = tmp_path / "q"
    assert main(["quantize", str(nested), "--bits", "8", "--out", str(out)]) == 0
    assert not (out / "recipe.toml").exists()
    (out / "recipe.toml").write_text("[task]\nname = 'classification'\n")
    capsys.readouterr()
    assert main(["quantize", str(model_folder), "--bits", "8", "--out", str(out), "--overwrite"]) == 2
    assert capsys.readouterr().err == (f"tformer quantize: error: --out {out} holds a recipe.toml and {model_folder} "
                                       "has none to replace it with (it would describe another model to evaluate); "
                                       "choose an empty or new folder\n")
    assert (out / "recipe.toml").read_text() == "[task]\nname = 'classification'\n"


def test_info_takes_the_option_groups_quantize(model_folder, capsys):
    """--quantize came to info with the shared option group: it describes the model quantized as it loads."""
    assert main(["info", str(model_folder), "--quantize", "int4", "--group-size", "32"]) == 0
    out = capsys.readouterr().out
    assert "quantized    int4" in out and "stored quantized" in out
