"""The CLI's one model source: every command that loads a model takes the same option group and loads through
``tformer.cli.model_source``; no command module imports another; the group's choices come from the registries."""

import ast
from pathlib import Path

import pytest
import torch

import tformer
import tformer.cli
from tformer.cli import COMMANDS, build_parser, main
from tformer.cli.model_source import MODEL_OPTIONS, ModelSource, load_model
from tformer.nn.weights import QUANTIZED_BACKENDS
from tformer.tokenizers import CharTokenizer

CLI_FOLDER = Path(tformer.cli.__file__).parent
# The loaders of model_source; a command calling one loads a model.
LOADERS = {"load_model", "load_translator", "load_image_classifier", "load_speech_model", "load_tokenizer"}
MODEL_COMMANDS = ("attention", "classify", "convert", "embed", "evaluate", "generate", "info", "merge", "predict",
                  "quantize", "serve", "transcribe", "translate")
# The flag each option of the group adds (the first one where it adds two).
FLAGS = {"device": "--device", "quantize": "--quantize", "threads": "--threads"}


def command_tree(name: str) -> ast.Module:
    return ast.parse((CLI_FOLDER / f"{name}.py").read_text(encoding="utf-8"))


def imported_modules(tree: ast.Module) -> set[str]:
    """Every module an import statement of ``tree`` names, at any depth (``from tformer.cli import x`` names
    tformer.cli and tformer.cli.x: x may be a module)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def called_names(tree: ast.Module) -> set[str]:
    """The names ``tree`` calls: ``f(...)`` gives f, ``a.b(...)`` gives a.b."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            function = node.func
            if isinstance(function, ast.Name):
                names.add(function.id)
            elif isinstance(function, ast.Attribute) and isinstance(function.value, ast.Name):
                names.add(f"{function.value.id}.{function.attr}")
    return names


def subparsers() -> dict:
    return next(action for action in build_parser()._actions if action.dest == "command").choices


def test_the_commands_are_the_cli_modules_that_register_one():
    modules = {path.stem for path in CLI_FOLDER.glob("*.py")} - {"__init__"}
    helpers = {name for name in modules if "register" not in {node.name for node in command_tree(name).body
                                                                if isinstance(node, ast.FunctionDef)}}
    assert set(COMMANDS) == modules - helpers
    assert helpers == {"model_source", "model_inputs"}


@pytest.mark.parametrize("command", COMMANDS)
def test_no_command_module_imports_another_command_module(command):
    others = {f"tformer.cli.{other}" for other in COMMANDS if other != command}
    assert imported_modules(command_tree(command)) & others == set()


@pytest.mark.parametrize("command", COMMANDS)
def test_commands_load_models_only_through_the_model_source(command):
    calls = called_names(command_tree(command))
    assert not {"tformer.load", "hub.load", "load_hf_weights"} & calls
    assert bool(LOADERS & calls) == (command in MODEL_COMMANDS)


@pytest.mark.parametrize("command", MODEL_COMMANDS)
def test_every_model_loading_command_takes_the_shared_option_group(command):
    parser = subparsers()[command]
    options = parser.get_default("model_options")
    assert options is not None, f"{command} does not take add_model_source's group"
    assert {"--revision", "--local-only", "--threads"} <= parser._option_string_actions.keys()
    group = next(group for group in parser._action_groups if group.title == "model options")
    group_flags = {flag for action in group._group_actions for flag in action.option_strings}
    for name in MODEL_OPTIONS:  # serve's own --adapter NAME=DIR (several, served per request) is not the group's
        assert (FLAGS.get(name, f"--{name}") in group_flags) == (name in options)
    assert {"--revision", "--local-only", *(FLAGS.get(name, f"--{name}") for name in options)} <= group_flags


def test_every_command_with_device_and_quantize_is_the_set_that_had_them_or_more():
    """The group is added whole unless a command cannot honour an option; these always could."""
    commands = subparsers()
    for command in ("generate", "translate", "transcribe", "evaluate", "serve"):
        assert {"--device", "--quantize"} <= commands[command]._option_string_actions.keys()


def test_the_quantize_choices_are_the_registrys_quantized_backends():
    commands = subparsers()
    for command in MODEL_COMMANDS:
        action = commands[command]._option_string_actions.get("--quantize")
        if action is not None:
            assert tuple(action.choices) == tuple(QUANTIZED_BACKENDS)
    bits = commands["quantize"]._option_string_actions["--bits"]
    assert {f"int{choice}" for choice in bits.choices} == {name for name in QUANTIZED_BACKENDS
                                                             if name.startswith("int") and name[3:].isdigit()}


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("source") / "m"
    model = tformer.build_model("gpt-nano", vocab_size=32)
    model.tokenizer = CharTokenizer.train("to be or not to be, that is the question.\n")
    model.save(folder)
    return folder


def test_the_loader_gives_the_model_with_its_tokenizer_and_the_options(model_folder):
    from tformer.quantization import scheme_for

    loaded = load_model(ModelSource(str(model_folder)))
    assert loaded.model.training is False and loaded.tokenizer is loaded.model.tokenizer is not None
    assert loaded.tokenizer_problem is None and loaded.image_processor is None
    quantized = load_model(ModelSource(str(model_folder), quantize=scheme_for("int8"))).model
    assert quantized.quantization.method == "int8"


def test_a_source_is_read_once_from_the_command_line(model_folder, capsys, monkeypatch):
    """main reads the group into args.model_source before the command runs; the command sees it whole."""
    seen = []

    def run(args):
        seen.append(args.model_source)
        return 0

    monkeypatch.setattr("tformer.cli.generate.run", run)
    threads = torch.get_num_threads()
    try:
        assert main(["generate", str(model_folder), "--prompt", "to", "--quantize", "int4", "--group-size", "32",
                     "--threads", "1"]) == 0
        assert torch.get_num_threads() == 1  # set before the command runs
    finally:
        torch.set_num_threads(threads)
    (source,) = seen
    assert (source.path, source.device, source.threads) == (str(model_folder), torch.device("cpu"), 1)
    assert (source.quantize.method, source.quantize.group_size) == ("int4", 32)


def test_a_group_option_a_command_left_out_does_not_exist(model_folder, capsys):
    assert main(["classify", str(model_folder), "x.png", "--device", "cpu"]) == 2
    assert capsys.readouterr().err == ("tformer classify: error: unrecognized arguments: --device cpu; see tformer "
                                       "classify --help\n")
