"""``tformer embed``: JSON lines (or a .npy file with --out) equal to ``tformer.embed``, texts from --text and
--file, the checkpoint's pooling or --pooling/--normalize; bad input in one line with exit code 2. And ``tformer
serve``'s pooling options: an encoder served with --pooling none serves nothing and is refused."""

import json
import re

import numpy as np
import pytest
import torch
from embedding_models import TEXTS, bert_folder

import tformer
from tformer.cli import main

TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    return bert_folder(tmp_path_factory.mktemp("embed") / "bert")


def printed(capsys) -> np.ndarray:
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["index"] for line in lines] == list(range(len(lines)))
    return np.array([line["embedding"] for line in lines], dtype=np.float32)


def test_embed_prints_a_json_line_a_text(bert, capsys):
    assert main(["embed", str(bert), "--text", TEXTS[0], "--text", TEXTS[1]]) == 0
    expected = tformer.embed(bert, TEXTS[:2]).numpy()  # the encoder's config: [CLS]
    assert np.abs(printed(capsys) - expected).max() < TOLERANCE


def test_embed_reads_a_file_pools_as_asked_and_writes_npy(bert, tmp_path, capsys):
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS[1:]) + "\n", encoding="utf-8")
    out = tmp_path / "vectors.npy"
    assert main(["embed", str(bert), "--text", TEXTS[0], "--file", str(texts), "--pooling", "mean", "--normalize",
                 "--batch-size", "2", "--out", str(out)]) == 0
    assert "4 x 32 float32 (mean pooling, normalized)" in capsys.readouterr().err
    saved = np.load(out)
    expected = tformer.embed(bert, TEXTS, pooling="mean", normalize=True)
    assert saved.dtype == np.float32 and np.abs(saved - expected.numpy()).max() < TOLERANCE
    assert torch.allclose(torch.from_numpy(saved).norm(dim=1), torch.ones(4))


@pytest.mark.parametrize("arguments, message", [
    ([], "give texts to embed with --text or --file"),
    (["--text", "  "], "--text 1 is empty"),
    (["--text", "arms", "--out", "vectors.txt"], "give a name ending in .npy"),
    (["--text", " ".join(["to be"] * 40)], "input 0 has .* tokens; the model reads at most 32"),
    (["--text", "arms", "--batch-size", "0"], "--batch-size 0 must be >= 1"),
])
def test_bad_input_is_one_line_and_exit_code_2(bert, capsys, arguments, message):
    assert main(["embed", str(bert), *arguments]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.search(message, err), err


def test_an_empty_line_of_the_file_is_refused_by_its_number(bert, tmp_path, capsys):
    texts = tmp_path / "texts.txt"
    texts.write_text("arms\n\nthe question\n", encoding="utf-8")
    assert main(["embed", str(bert), "--file", str(texts)]) == 2
    assert f"{texts} line 2 is empty" in capsys.readouterr().err


def test_serve_refuses_an_encoder_without_pooling(bert, capsys):
    assert main(["serve", str(bert), "--pooling", "none", "--port", "0", "--engine", "thread"]) == 2
    assert "serve needs a decoder" in capsys.readouterr().err
