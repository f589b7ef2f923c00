"""Structured outputs in ``generate``: a ``Constraint`` (JSON object, JSON schema, regex, choice, Lark grammar) makes
random-weight models write text that parses and validates (``jsonschema`` is the reference), the text ends with the
end id once complete, batched rows equal each alone, the vocabulary is read as llguidance's own reader reads a
tokenizer.json, and what cannot apply a constraint refuses it by name."""

import json
import re
import sys

import pytest
import torch

import tformer
from tformer.generation import GenerationConfig, GenerationError
from tformer.generation.constraints import Constraint, grammar_tokenizer, token_bytes_table
from tformer.generation.rules import RULES, Constrained, MinNewTokens, Temperature
from tformer.generation.sampling import TokenChooser
from tformer.tokenizers import CharTokenizer

llguidance = pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

END = 1  # the character models' end id ("<eos>")
GPT2 = "/work/shared/data/tokenizers/gpt2"


def char_model(seed=0):
    """A random gpt-nano over printable ASCII (and a newline), ending at <eos>."""
    tokenizer = CharTokenizer([chr(code) for code in range(32, 127)] + ["\n"], special_tokens=["<unk>", "<eos>"])
    torch.manual_seed(seed)
    model = tformer.build_model("gpt-nano", vocab_size=tokenizer.vocab_size, max_seq_len=512, eos_token_id=END)
    model.tokenizer = tokenizer
    return model.eval()


def new_text(model, prompts, config):
    """Each prompt's new text (the end id dropped) and whether it ended with the end id."""
    tokenizer = model.tokenizer
    ids = [tokenizer.encode(prompt) for prompt in prompts]
    width = max(len(row) for row in ids)
    input_ids = torch.tensor([[END] * (width - len(row)) + row for row in ids])
    mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in ids])
    out = tformer.generate(model, input_ids, attention_mask=mask, generation_config=config)
    texts, ended = [], []
    for row in out[:, width:].tolist():
        stop = row.index(END) if END in row else len(row)
        texts.append(tokenizer.decode(row[:stop]))
        ended.append(stop < len(row))
    return texts, ended


SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                      "age": {"type": "integer", "minimum": 0, "maximum": 120}},
     "required": ["name", "age"], "additionalProperties": False},  # else any other property, any number long
    {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]},
                                      "sizes": {"type": "array", "items": {"type": "integer", "minimum": 1,
                                                                           "maximum": 9},
                                                "minItems": 1, "maxItems": 3}},
     "required": ["colour", "sizes"], "additionalProperties": False},
    {"type": "object", "properties": {"point": {"type": "object", "properties": {
        "x": {"type": "number", "minimum": -1, "maximum": 1, "multipleOf": 0.25}, "y": {"type": "boolean"}},
        "required": ["x", "y"], "additionalProperties": False}, "note": {"type": "string", "maxLength": 3}},
     "required": ["point"], "additionalProperties": False},
    {"type": "array", "items": {"enum": [1, "two", None]}, "minItems": 2, "maxItems": 4},
]


@pytest.mark.parametrize("schema", SCHEMAS)
def test_generate_writes_json_that_validates_under_the_schema(schema):
    model = char_model()
    config = GenerationConfig(max_new_tokens=160, constraint=Constraint.json_schema(schema))
    prompts = ["answer:", "x", "a longer prompt here"]
    for options in ({}, {"do_sample": True, "seed": 5}):
        texts, ended = new_text(model, prompts, config.replace(**options))
        for text in texts:
            jsonschema.validate(json.loads(text), schema)
        assert all(ended)  # the end id follows the complete structure


def test_a_json_object_constraint_writes_an_object_and_unconstrained_decoding_does_not():
    model = char_model()
    (free,), _ = new_text(model, ["{"], GenerationConfig(max_new_tokens=40))
    with pytest.raises(json.JSONDecodeError):
        json.loads(free)
    texts, ended = new_text(model, ["{", "hi"], GenerationConfig(max_new_tokens=200, do_sample=True, seed=1,
                                                                   constraint=Constraint.json_object()))
    assert all(isinstance(json.loads(text), dict) for text in texts) and all(ended)


def test_regex_choice_and_grammar_constraints_hold_and_end_the_text():
    model = char_model()
    pattern = r"[a-c]{2,4}-\d\d"
    texts, ended = new_text(model, ["p", "q"], GenerationConfig(max_new_tokens=20, do_sample=True, seed=0,
                                                                constraint=Constraint.regex(pattern)))
    assert all(re.fullmatch(pattern, text) for text in texts) and all(ended)
    options = ["yes", "no", "maybe so"]
    for seed in range(3):
        (text,), (end,) = new_text(model, ["?"], GenerationConfig(max_new_tokens=20, do_sample=True, seed=seed,
                                                                  constraint=Constraint.choice(options)))
        assert text in options and end
    grammar = 'start: greeting " " name\ngreeting: "hello" | "bye"\nname: /[A-Z][a-z]{1,3}/'
    config = GenerationConfig(max_new_tokens=20, constraint=Constraint.grammar(grammar))
    (text,), (end,) = new_text(model, ["!"], config)
    assert re.fullmatch(r"(hello|bye) [A-Z][a-z]{1,3}", text) and end


def test_one_allowed_text_is_written_whatever_the_model_prefers():
    model = char_model()
    for seed in range(2):
        texts, ended = new_text(char_model(seed), ["a", "bb"], GenerationConfig(
            max_new_tokens=11, constraint=Constraint.choice(['{"k": [1]}'])))
        assert texts == ['{"k": [1]}'] * 2 and all(ended)
    # The length limit cuts a structure short, as it cuts any text.
    (text,), (end,) = new_text(model, ["a"], GenerationConfig(max_new_tokens=4,
                                                              constraint=Constraint.choice(["abcdefgh"])))
    assert text == "abcd" and not end


def test_a_batched_row_decodes_as_it_does_alone():
    model = char_model()
    config = GenerationConfig(max_new_tokens=120, constraint=Constraint.json_schema(SCHEMAS[1]))
    prompts = ["one", "a much longer second prompt", "3"]
    together, _ = new_text(model, prompts, config)
    assert together == [new_text(model, [prompt], config)[0][0] for prompt in prompts]


def test_the_rule_masks_each_row_to_the_grammar_from_its_new_tokens():
    model = char_model()
    tokenizer = model.tokenizer
    config = GenerationConfig(constraint=Constraint.regex("ab+c"))
    chooser = TokenChooser.from_config(config, model.config, tokenizer=tokenizer)
    assert [type(rule) for rule in chooser.rules] == [Constrained] and chooser.reads_history and chooser.alters(0)
    a, b, c = (tokenizer.encode(ch)[0] for ch in "abc")
    prompt = tokenizer.encode("zz")
    history = torch.tensor([prompt + [a], prompt + [a]])  # two rows one token in
    scores = chooser.scores(torch.zeros(2, model.config.vocab_size), 1, history=history)
    assert [set(torch.nonzero(row > float("-inf")).flatten().tolist()) for row in scores] == [{b}, {b}]
    history = torch.tensor([prompt + [a, b], prompt + [a, b]])
    allowed = (chooser.scores(torch.zeros(2, model.config.vocab_size), 2, history=history)[0] > float("-inf"))
    assert set(torch.nonzero(allowed).flatten().tolist()) == {b, c}
    history = torch.tensor([prompt + [a, b, c]])  # complete: only the end id
    allowed = chooser.scores(torch.zeros(1, model.config.vocab_size), 3, history=history)[0] > float("-inf")
    assert torch.nonzero(allowed).flatten().tolist() == [END]
    # It sits after the rules that forbid tokens and before the sampling warpers.
    assert RULES.index(MinNewTokens) < RULES.index(Constrained) < RULES.index(Temperature)


def test_the_vocabulary_is_read_as_llguidance_reads_the_tokenizer_json():
    tokenizer = tformer.tokenizers.load(GPT2)
    table = token_bytes_table(tokenizer, tokenizer.vocab_size)
    reference = llguidance.LLTokenizer(json.dumps(tokenizer.to_dict()), n_vocab=tokenizer.vocab_size, eos_token=50256)
    differ = [token for token in range(tokenizer.vocab_size) if table[token] != reference.decode_bytes([token])]
    # llguidance shows a special token without its 0xFF mark, and the byte 0xFF (never in UTF-8 text) as nothing
    assert differ == [187, 50256] and table[187] == b"\xff" and table[50256] == b"\xff<|endoftext|>"
    assert table[220] == b" "  # "Ġ" stands for a space


def test_a_gpt2_vocabulary_model_writes_valid_json():
    tokenizer = tformer.tokenizers.load(GPT2)
    torch.manual_seed(0)
    model = tformer.build_model("gpt-nano", vocab_size=50257, max_seq_len=256, eos_token_id=50256).eval()
    schema = SCHEMAS[0]
    config = GenerationConfig(max_new_tokens=60, do_sample=True, seed=2, constraint=Constraint.json_schema(schema))
    prompt = torch.tensor([tokenizer.encode("The person:")])
    out = tformer.generate(model, prompt, generation_config=config, tokenizer=tokenizer)[0, prompt.shape[1]:].tolist()
    assert out[-1] == 50256
    jsonschema.validate(json.loads(tokenizer.decode(out[:-1])), schema)


@pytest.mark.parametrize(("make", "message"), [
    (lambda: Constraint.json_schema({"type": "frog"}), r"^json_schema cannot be compiled: Invalid type: frog$"),
    (lambda: Constraint.json_schema("{}"), "json_schema must be a JSON Schema object"),
    (lambda: Constraint.json_schema({"type": "string", "pattern": "(?=a)"}), "json_schema cannot be compiled: .*look-"),
    (lambda: Constraint.regex("(a"), r"regex '\(a' cannot be compiled: .*unclosed group"),
    (lambda: Constraint.regex(""), "regex must be a non-empty string"),
    (lambda: Constraint.choice([]), "choice must be a non-empty list of non-empty strings"),
    (lambda: Constraint.choice("yes"), "choice must be a non-empty list"),
    (lambda: Constraint.grammar("start: undefined_rule"), "grammar 'start: undefined_rule' cannot be compiled: .*"
                                                          "unknown name"),
    (lambda: Constraint("xml"), "constraint kind 'xml' is unknown; known: json_object, json_schema, regex, choice, "
                                "grammar"),
])
def test_bad_constraints_are_refused_in_one_line_naming_them(make, message):
    with pytest.raises(GenerationError, match=message) as caught:
        make()
    assert "\n" not in str(caught.value)


def test_what_cannot_apply_a_constraint_refuses_it_by_name():
    model, constraint = char_model(), Constraint.json_object()
    prompt = torch.tensor([model.tokenizer.encode("x")])
    with pytest.raises(GenerationError, match="constraint=.* is not supported by beam search"):
        GenerationConfig(num_beams=2, constraint=constraint)
    with pytest.raises(GenerationError, match="constraint=.* is not supported by speculative decoding"):
        tformer.generate(model, prompt, 4, draft_model=char_model(1), constraint=constraint)
    with pytest.raises(GenerationError, match="min_new_tokens=2 cannot be combined with a constraint"):
        GenerationConfig(min_new_tokens=2, constraint=constraint)
    with pytest.raises(GenerationError, match="must be a tformer.generation.constraints.Constraint"):
        GenerationConfig(constraint={"type": "json_object"})
    with pytest.raises(GenerationError, match="needs an end-of-sequence id"):
        tformer.generate(model, prompt, 4, constraint=constraint, eos_token_id=())
    bare = tformer.build_model("gpt-nano", vocab_size=98, eos_token_id=END).eval()
    with pytest.raises(GenerationError, match="needs the model's tokenizer"):
        tformer.generate(bare, prompt, 4, constraint=constraint)
    with pytest.raises(GenerationError, match="needs each row's tokens so far"):
        Constrained.from_config(GenerationConfig(constraint=constraint), model.config, None, model.tokenizer)(
            torch.zeros(2, 98), 0, True, None)


def test_without_llguidance_a_constraint_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "llguidance", None)  # import llguidance fails
    with pytest.raises(GenerationError, match=r"^structured outputs need the llguidance package: pip install "
                                              r"'tformer\[structured\]'"):
        Constraint.regex("a+")


def test_the_grammar_tokenizer_is_built_once_per_tokenizer_and_ends():
    model = char_model()
    first = grammar_tokenizer(model.tokenizer, 98, (END,))
    assert grammar_tokenizer(model.tokenizer, 98, (END,)) is first
    assert grammar_tokenizer(model.tokenizer, 98, (0, END)) is not first


def test_an_objects_properties_come_in_its_schemas_order():
    schema = {"type": "object", "properties": {"zeta": {"type": "boolean"}, "alpha": {"enum": [1, 2]},
                                               "mid": {"type": "boolean"}},
              "required": ["zeta", "alpha", "mid"], "additionalProperties": False}
    (text,), (end,) = new_text(char_model(), ["o"], GenerationConfig(max_new_tokens=60,
                                                                     constraint=Constraint.json_schema(schema)))
    assert list(json.loads(text)) == ["zeta", "alpha", "mid"] and end
