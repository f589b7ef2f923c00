"""``tformer generate --json-schema FILE`` (and --json-object, --regex, --choice, --grammar): the constrained new text
alone on standard output, equal to ``tformer.generate`` with the same constraint, valid under the schema; bad files,
schemas, regexes and grammars refused in one line with exit code 2 before any text."""

import json
import re

import pytest
import torch

import tformer
from tformer.cli import main
from tformer.generation.constraints import Constraint
from tformer.tokenizers import CharTokenizer

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("llguidance")

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99},
                                           "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}},
          "required": ["n", "tags"], "additionalProperties": False}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("constrained") / "model"
    tokenizer = CharTokenizer([chr(code) for code in range(32, 127)], special_tokens=["<unk>", "<eos>"])
    torch.manual_seed(0)
    model = tformer.build_model("gpt-nano", vocab_size=tokenizer.vocab_size, max_seq_len=256, eos_token_id=1)
    model.tokenizer = tokenizer
    model.save(path)
    (path.parent / "schema.json").write_text(json.dumps(SCHEMA))
    (path.parent / "grammar.lark").write_text('start: "go " DIR\nDIR: "left" | "right"\n')
    return path


def expected(folder, prompt, constraint, **options):
    model = tformer.load(folder)
    ids = torch.tensor([model.tokenizer.encode(prompt)])
    new = tformer.generate(model, ids, 200, constraint=constraint, **options)[0, ids.shape[1]:].tolist()
    return model.tokenizer.decode(new, skip_special_tokens=True)


def test_generate_json_schema_prints_the_json_alone_as_generate_writes_it(folder, capsys):
    for options, flags in (({}, []), ({"temperature": 0.9, "seed": 3}, ["--temperature", "0.9", "--seed", "3"])):
        assert main(["generate", str(folder), "--prompt", "data:", "--max-new-tokens", "200", "--json-schema",
                     str(folder.parent / "schema.json"), *flags]) == 0
        out = capsys.readouterr().out
        assert out == expected(folder, "data:", Constraint.json_schema(SCHEMA), **options) + "\n"
        jsonschema.validate(json.loads(out), SCHEMA)
    assert main(["generate", str(folder), "--prompt", "data:", "--max-new-tokens", "200", "--json-schema",
                 str(folder.parent / "schema.json"), "--stream"]) == 0
    streamed = capsys.readouterr().out  # greedy, as the first run: alike, without the end token's text
    assert streamed == expected(folder, "data:", Constraint.json_schema(SCHEMA)) + "\n"


def test_generate_regex_choice_grammar_and_json_object(folder, capsys):
    base = ["generate", str(folder), "--prompt", "q", "--max-new-tokens", "200"]
    assert main([*base, "--regex", r"[0-9]{2}:[0-9]{2}"]) == 0
    assert re.fullmatch(r"[0-9]{2}:[0-9]{2}\n", capsys.readouterr().out)
    assert main([*base, "--choice", "red", "--choice", "blue"]) == 0
    assert capsys.readouterr().out in ("red\n", "blue\n")
    assert main([*base, "--grammar", str(folder.parent / "grammar.lark")]) == 0
    assert capsys.readouterr().out in ("go left\n", "go right\n")
    # an object with no schema may run to the length limit on a random model: the text is generate's, an object's
    assert main([*base, "--json-object"]) == 0
    out = capsys.readouterr().out
    assert out == expected(folder, "q", Constraint.json_object()) + "\n" and out.startswith("{")


@pytest.mark.parametrize(("flags", "message"), [
    (["--json-schema", "MISSING"], r"--json-schema .*missing.json: not a readable text file"),
    (["--json-schema", "GRAMMAR"], r"--json-schema .*grammar.lark: not JSON"),
    (["--regex", "(a"], r"--regex: regex '\(a' cannot be compiled: .*unclosed group"),
    (["--grammar", "SCHEMA"], r"--grammar .*schema.json: grammar .* cannot be"),
    (["--choice", "a", "--regex", "b"], "not allowed with argument"),
    (["--json-object", "--num-beams", "2"], "is not supported by beam search"),
])
def test_bad_constraints_are_one_line_errors_with_exit_code_2(folder, capsys, flags, message):
    files = {"MISSING": folder.parent / "missing.json", "GRAMMAR": folder.parent / "grammar.lark",
             "SCHEMA": folder.parent / "schema.json"}
    flags = [str(files.get(flag, flag)) for flag in flags]
    try:
        code = main(["generate", str(folder), "--prompt", "q", *flags])
    except SystemExit as exited:  # argparse's own refusals (two options of one group)
        code = exited.code
    assert code == 2
    out, err = capsys.readouterr()
    assert out == "" and re.search(message, err) and len(err.strip().splitlines()) == 1
