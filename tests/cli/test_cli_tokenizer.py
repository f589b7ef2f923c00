"""``tformer tokenizer train|encode`` and ``tformer tokenize`` end to end, and their one-line
errors with exit status 2."""

from __future__ import annotations

import json

import pytest

from tformer.cli import main
from tformer.data import read_token_file
from tformer.tokenizers import load

CORPUS = "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n" * 30


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text(CORPUS, encoding="utf-8")
    return path


@pytest.mark.parametrize(("kind", "size"), [("bpe", 300), ("wordpiece", 70), ("char", None)])
def test_train_then_encode_then_tokenize(kind, size, corpus, tmp_path, capsys):
    arguments = ["tokenizer", "train", "--kind", kind, str(corpus), "--out", str(tmp_path / "tok.json"), "--quiet"]
    if size:
        arguments += ["--vocab-size", str(size)]
    assert main(arguments) == 0
    printed = capsys.readouterr().out
    assert "bytes per token" in printed and "trained on  1 file(s)" in printed and " s\n" in printed
    tokenizer = load(tmp_path / "tok.json")
    if size:
        assert tokenizer.vocab_size == size

    assert main(["tokenizer", "encode", str(tmp_path / "tok.json"), "To be, or not\tto be"]) == 0
    printed = capsys.readouterr().out
    ids = tokenizer.encode("To be, or not\tto be")
    assert printed.splitlines()[-1] == "ids " + " ".join(map(str, ids))
    assert f"{len(ids)} tokens" in printed

    assert main(["tokenize", "--tokenizer", str(tmp_path / "tok.json"), str(corpus), "--out",
                 str(tmp_path / "data.bin"), "--quiet"]) == 0
    assert "tokens, uint16" in capsys.readouterr().out
    ids = read_token_file(tmp_path / "data.bin", tokenizer=tokenizer)
    separator = [] if tokenizer.eos_token_id is None and tokenizer.sep_token_id is None else [
        tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id]
    assert ids.tolist() == tokenizer.encode(CORPUS, add_special_tokens=False) + separator


def test_encode_shows_special_tokens_and_pairs(corpus, tmp_path, capsys):
    main(["tokenizer", "train", "--kind", "wordpiece", "--vocab-size", "70", str(corpus), "--out", str(tmp_path),
          "--quiet", "--special-tokens", "[PAD],[UNK],[CLS],[SEP],[MASK]"])
    capsys.readouterr()
    assert main(["tokenizer", "encode", str(tmp_path / "tokenizer.json"), "to be", "--pair", "or not"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("(special)") == 3 and "[CLS]" in printed
    assert main(["tokenizer", "encode", str(tmp_path), "to be", "--no-special-tokens"]) == 0
    assert "(special)" not in capsys.readouterr().out


def test_tokenize_separator_option(corpus, tmp_path, capsys):
    main(["tokenizer", "train", "--kind", "bpe", "--vocab-size", "300", str(corpus), "--out", str(tmp_path / "t.json"),
          "--quiet"])
    main(["tokenize", "--tokenizer", str(tmp_path / "t.json"), str(corpus), str(corpus), "--out",
          str(tmp_path / "d.bin"), "--no-separator", "--quiet"])
    header = json.loads((tmp_path / "d.bin.json").read_text())
    assert header["separator_id"] is None and header["sources"] == [str(corpus), str(corpus)]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["tokenizer", "train", "--kind", "bpe", "--vocab-size", "100", "{corpus}", "--out", "{tmp}/t.json"],
         "vocab_size=100 is too small"),
        (["tokenizer", "train", "--kind", "bpe", "{tmp}/missing.txt", "--vocab-size", "300", "--out", "{tmp}/t.json"],
         "missing.txt: no such training file"),
        (["tokenizer", "train", "--kind", "wordpiece", "{corpus}", "--out", "{tmp}/t.json"],
         "--vocab-size is required for --kind wordpiece"),
        (["tokenizer", "train", "--kind", "bpe", "{empty}", "--vocab-size", "300", "--out", "{tmp}/t.json"],
         "empty corpus"),
        (["tokenizer", "encode", "{tmp}/missing.json", "text"], "no such tokenizer file or folder"),
        (["tokenizer", "encode", "{corpus}", "text"], "not a WordPiece vocabulary"),
        (["tokenize", "--tokenizer", "{tmp}/missing.json", "{corpus}", "--out", "{tmp}/d.bin"],
         "no such tokenizer file or folder"),
    ],
)
def test_errors_are_one_line_with_status_2(arguments, message, corpus, tmp_path, capsys):
    (tmp_path / "empty.txt").write_text("")
    filled = [argument.format(corpus=corpus, tmp=tmp_path, empty=tmp_path / "empty.txt") for argument in arguments]
    assert main([*filled, "--quiet"] if filled[0] == "tokenizer" and filled[1] == "train" else filled) == 2
    error = capsys.readouterr().err.strip()
    assert message in error and error.startswith("tformer ") and "\n" not in error
    assert not (tmp_path / "t.json").exists() and not (tmp_path / "d.bin").exists()


def test_tokenize_missing_input_file(corpus, tmp_path, capsys):
    main(["tokenizer", "train", "--kind", "char", str(corpus), "--out", str(tmp_path / "t.json"), "--quiet"])
    assert main(["tokenize", "--tokenizer", str(tmp_path / "t.json"), str(tmp_path / "nope.txt"), "--out",
                 str(tmp_path / "d.bin"), "--quiet"]) == 2
    assert "nope.txt: no such file" in capsys.readouterr().err
    assert not (tmp_path / "d.bin").exists() and not (tmp_path / "d.bin.tmp").exists()
