"""Fault injection on data values, devices and command-line options (issue 37, items 2, 9, 11 and 13):
a bad label, device, option or data file is refused with one short line naming what is wrong and what is
allowed (exit code 2 on the command line, no traceback), before any model is built, and nothing is
written."""

from __future__ import annotations

import gzip
import json
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch

import tformer
from tformer.cli import main
from tformer.data.files import DataFileError
from tformer.data.image_processing import ImageProcessing
from tformer.data.images import read_image_records, read_images
from tformer.errors import listed, quoted
from tformer.tokenizers import WordPieceTokenizer
from tformer.training import TrainingConfig
from tformer.training.config import TrainingError
from tformer.training.distributed import pick_device

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good", "bad", "movie", "a", "the", "is", "film", "who", "sat",
         "on", "mat", "cat", "?", "."]
WORDS = ("good", "bad", "movie", "a", "the", "is", "film")


# ---- helpers ----------------------------------------------------------------------------------------


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (relative path -> bytes)."""
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def refused(capsys, args: list[str], *messages: str, folder: Path | None = None) -> str:
    """Run ``tformer ARGS``: exit 2, one short line on standard error holding every message, no traceback,
    and ``folder`` (when given) left exactly as it was."""
    before = None if folder is None else snapshot(folder)
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert len(err) < 600, f"{len(err)} characters: {err[:300]}"
    for message in messages:
        assert message in err, err
    if folder is not None:
        assert snapshot(folder) == before
    return err.strip()


def write_tsv(path: Path, rows: int, seed: int, header: str | None = "sentence\tlabel", words: int = 3) -> Path:
    """``rows`` lines of ``sentence<TAB>label`` (pos/neg), after a header row unless ``header`` is None."""
    rng = random.Random(seed)
    lines = [] if header is None else [header]
    for _ in range(rows):
        lines.append(" ".join(rng.choice(WORDS) for _ in range(words)) + "\t" + rng.choice(("pos", "neg")))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write_recipe(path: Path, sections: dict) -> Path:
    """A recipe dict as a TOML file (tables of strings, numbers, booleans and lists)."""
    from tformer.training.recipe import toml_value

    lines = []
    for section, values in sections.items():
        lines.append(f"[{section}]")
        lines += [f"{key} = {toml_value(value)}" for key, value in values.items()]
        lines.append("")
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


TRAINING = {"max_steps": 1, "batch_size": 2, "warmup_steps": 0, "eval_every": 1, "eval_batches": 1, "threads": 1}


def text_recipe(tmp_path: Path, **model) -> dict:
    """A from-scratch encoder that classifies the texts of train.tsv (WordPiece vocab.txt)."""
    (tmp_path / "vocab.txt").write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    write_tsv(tmp_path / "train.tsv", rows=12, seed=0)
    return {"model": {"architecture": "encoder", "head": "sequence_classification", "max_seq_len": 16,
                      "d_model": 16, "num_layers": 1, "num_heads": 2, **model},
            "data": {"train": "train.tsv", "tokenizer": "vocab.txt", "eval_fraction": 0.25},
            "task": {"name": "classification"}, "training": TRAINING}


def image_recipe(npz: str, **model) -> dict:
    return {"model": {"architecture": "vision", "head": "image_classification", "image_size": 8, "patch_size": 4,
                      "num_channels": 1, "d_model": 16, "num_layers": 1, "num_heads": 2, **model},
            "data": {"train": npz, "eval_fraction": 0.25}, "task": {"name": "image_classification"},
            "training": TRAINING}


def write_npz(path: Path, labels: list[int]) -> Path:
    images = np.random.default_rng(0).integers(0, 255, (len(labels), 8, 8)).astype(np.uint8)
    np.savez(path, images=images, labels=np.asarray(labels, dtype=np.int64))
    return path


def train(capsys, tmp_path: Path, sections: dict, *extra: str) -> list[str]:
    """``tformer train`` on the recipe into tmp_path/run; the arguments for ``refused``."""
    recipe = write_recipe(tmp_path / "recipe.toml", sections)
    return ["train", str(recipe), "--out", str(tmp_path / "run"), "--no-progress", *extra]


# ---- 2. one bad label value costs no memory: labels are checked against the label count --------------


def test_an_npz_label_beyond_the_unnamed_label_range_is_refused_naming_the_file_and_row(tmp_path):
    for label in (5_000, 10**12):  # 10**12 once grew a training process to 21.7 GB
        path = write_npz(tmp_path / "set.npz", [0, 1, 0, 1, 0, 1, label, 1])
        with pytest.raises(DataFileError, match=rf"set\.npz: row 6 \(counting from 0\) has label {label}; labels "
                                                r"without names are ids 0\.\.999"):
            read_images(path)
    path = write_npz(tmp_path / "set.npz", [0, 1, 2, 1])
    assert read_images(path).label_names == ("0", "1", "2")  # ids within the range still name themselves


def test_a_records_image_label_beyond_the_unnamed_range_is_refused_as_an_npz_label_is(tmp_path):
    """The records reader's unnamed integer labels go through the same bound: 5,000 once built 5,001 names."""
    Image = pytest.importorskip("PIL.Image")
    Image.new("L", (4, 4), 7).save(tmp_path / "a.png")
    records = tmp_path / "images.jsonl"
    records.write_text("".join(json.dumps({"image": "a.png", "label": label}) + "\n" for label in (0, 1, 5_000, 1)))
    with pytest.raises(DataFileError, match=r"images\.jsonl: row 2 \(counting from 0\) has label 5000; labels "
                                            r"without names are ids 0\.\.999"):
        read_image_records(records)
    records.write_text("".join(json.dumps({"image": "a.png", "label": label}) + "\n" for label in (0, 2, 1)))
    assert read_image_records(records).label_names == ("0", "1", "2")


def test_a_stray_image_label_stops_the_run_before_a_model_is_built(tmp_path, capsys):
    write_npz(tmp_path / "set.npz", [0, 1, 0, 1, 0, 1, 5_000, 1])
    args = train(capsys, tmp_path, image_recipe("set.npz"))
    refused(capsys, args, "set.npz: row 6 (counting from 0) has label 5000", "ids 0..999", folder=tmp_path)
    assert not (tmp_path / "run").exists()


def test_image_labels_are_checked_against_a_declared_num_labels(tmp_path, capsys):
    write_npz(tmp_path / "set.npz", [0, 1, 2, 1, 0, 5, 2, 1])
    args = train(capsys, tmp_path, image_recipe("set.npz", num_labels=3))
    refused(capsys, args, "set.npz: row 5 (counting from 0) has label 5, outside the ids 0..2 of the 3 label names",
            folder=tmp_path)


# ---- 13. model.num_labels is never silently replaced --------------------------------------------------


def test_a_declared_num_labels_that_the_data_does_not_have_is_refused(tmp_path, capsys):
    args = train(capsys, tmp_path, text_recipe(tmp_path, type_vocab_size=2, num_labels=5))
    refused(capsys, args, "model.num_labels=5 but the data has 2 labels (neg, pos)", "model.label_names",
            folder=tmp_path)


# ---- 11. a from-scratch classifier without segment embeddings says which key to set ------------------


def test_a_classifier_without_segment_embeddings_reads_single_texts_and_names_type_vocab_size_for_pairs(
        tmp_path, capsys):
    args = train(capsys, tmp_path, text_recipe(tmp_path))  # type_vocab_size = 0: ModelConfig's default
    assert main(args) == 0  # single texts: their all-zero segment ids are not fed to a model without segments
    assert "Traceback" not in capsys.readouterr().err
    assert tformer.load(tmp_path / "run").config.type_vocab_size == 0
    rng = random.Random(0)
    rows = [f"{rng.choice(WORDS)} {rng.choice(WORDS)}\t{rng.choice(WORDS)}\t{rng.choice(('pos', 'neg'))}"
            for _ in range(12)]
    (tmp_path / "pairs.tsv").write_text("sentence1\tsentence2\tlabel\n" + "\n".join(rows) + "\n", encoding="utf-8")
    sections = text_recipe(tmp_path)
    sections["data"] = {**sections["data"], "train": "pairs.tsv"}
    args = train(capsys, tmp_path, sections)
    args[args.index("--out") + 1] = str(tmp_path / "pairs-run")
    refused(capsys, args, "the data's rows hold two segments (a text pair", "but the model has no segment embeddings "
            "(type_vocab_size=0): set [model] type_vocab_size = 2", folder=tmp_path)
    torch.manual_seed(0)  # predict on a model without segment embeddings: the tokenizer's segment ids left out
    model = tformer.build_model("bert-tiny", head="question_answering", vocab_size=len(VOCAB), max_seq_len=32,
                                d_model=16, num_layers=1, num_heads=2, d_ff=32, type_vocab_size=0)
    model.tokenizer = WordPieceTokenizer(VOCAB)
    model.save(tmp_path / "qa")
    capsys.readouterr()
    assert main(["predict", str(tmp_path / "qa"), "--question", "who sat ?", "--context", "the cat sat ."]) == 0
    assert main(["predict", str(tmp_path / "run"), "--text", "a good movie"]) == 0


# ---- 13. quoted input is capped; an evaluation file's unknown label is measured against the training file


def test_swapped_columns_give_one_short_line_naming_the_training_file(tmp_path, capsys):
    sections = text_recipe(tmp_path, type_vocab_size=2)
    write_tsv(tmp_path / "train.tsv", rows=300, seed=1, header=None, words=40)
    write_tsv(tmp_path / "dev.tsv", rows=20, seed=2, header=None, words=40)
    sections["data"] = {**sections["data"], "eval": "dev.tsv", "eval_fraction": 0.0, "columns": ["label", "sentence"]}
    err = refused(capsys, train(capsys, tmp_path, sections), "dev.tsv:1: label '", "characters)",
                  "is not one of the labels of the training file", "(300 in all)", folder=tmp_path)
    assert "declared" not in err


def test_a_tsv_read_as_conll_gives_one_short_line(tmp_path, capsys):
    sections = text_recipe(tmp_path, type_vocab_size=2, head="token_classification")
    rng = random.Random(1)  # SST-2's sentence-level layout, label<TAB>sentence: the sentence is read as the tag
    rows = [f"{rng.choice('01')}\t{' '.join(rng.choice(WORDS) for _ in range(300))}" for _ in range(20)]
    (tmp_path / "train.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    sections["task"] = {"name": "token_classification"}
    refused(capsys, train(capsys, tmp_path, sections), "train.tsv: the tags must be O or BIO/IOBES entity tags: tag '",
            "characters) is not O or B-/I-/E-/S-", folder=tmp_path)


def test_quoted_and_listed_values_are_cut():
    assert quoted("short") == "'short'"
    long = "word " * 1000
    assert len(quoted(long)) < 90 and quoted(long).endswith("(5,000 characters)")
    assert listed(["a", "b"]) == "a, b"
    assert listed(str(number) for number in range(300)).endswith(", 9, ... (300 in all)")
    assert len(listed([long] * 50)) < 300


# ---- 9. devices: one line naming the devices this machine has ---------------------------------------


@pytest.fixture
def classifier_run(tmp_path) -> Path:
    """A run folder (a model and the recipe it was trained with) classifying single texts of train.tsv."""
    sections = text_recipe(tmp_path)
    run = tmp_path / "run"
    torch.manual_seed(0)
    model = tformer.build_model("bert-tiny", head="sequence_classification", vocab_size=len(VOCAB), max_seq_len=32,
                                d_model=16, num_layers=1, num_heads=2, d_ff=32, label_names=("neg", "pos"))
    model.tokenizer = WordPieceTokenizer(VOCAB)
    model.save(run)
    sections["data"] = {**sections["data"], "train": str(tmp_path / "train.tsv"),
                        "tokenizer": str(tmp_path / "vocab.txt")}
    write_recipe(run / "recipe.toml", sections)
    return run


@pytest.mark.parametrize("device", ["banana", "cuda", "cuda:3"])
def test_evaluate_and_translate_refuse_a_missing_device_naming_the_available_ones(classifier_run, capsys, monkeypatch,
                                                                                   device):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a CPU-only machine, whatever this one is
    folder = classifier_run.parent
    data = str(folder / "train.tsv")
    err = refused(capsys, ["evaluate", str(classifier_run), "--data", data, "--device", device], "this machine has: "
                  "cpu, auto", folder=folder)
    assert err.startswith(f"tformer evaluate: error: --device {device}" if device != "banana" else
                          "tformer evaluate: error: --device 'banana' is not a device")
    refused(capsys, ["evaluate", str(classifier_run), "--source", data, "--reference", data, "--device", device],
            "this machine has: cpu, auto", folder=folder)
    refused(capsys, ["translate", str(classifier_run), "--input", data, "--device", device],
            "this machine has: cpu, auto", folder=folder)


def test_auto_gives_each_process_its_gpu_and_refuses_more_processes_than_gpus(monkeypatch):
    """torchrun --nproc_per_node=2 on a one-GPU machine: rank 1 is told why, instead of CUDA's invalid ordinal."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert pick_device("auto", local_rank=0) == torch.device("cuda", 0)
    with pytest.raises(TrainingError, match=r"local rank 1\) has no GPU of its own; this machine has 1 CUDA device"):
        pick_device("auto", local_rank=1)
    with pytest.raises(TrainingError, match="local rank 1"):
        pick_device("cuda", local_rank=1)
    assert pick_device("cpu", local_rank=1) == torch.device("cpu")


def test_training_device_takes_one_gpu_by_index():
    assert TrainingConfig(device="cuda:1").device == "cuda:1"
    with pytest.raises(TrainingError, match=r"training.device='cuda:x' is not one of auto, cpu, cuda"):
        TrainingConfig(device="cuda:x")


# ---- 11. evaluate of a translation run reads --data as the run's corpus ------------------------------


LEXICON = {"ein": "a", "hund": "dog", "mann": "man", "läuft": "runs", "sitzt": "sits", "rot": "red"}


def test_evaluate_a_translation_run_on_a_corpus_file_uses_the_model_s_tokenizer(tmp_path, capsys):
    from tformer.data.parallel import read_parallel
    from tformer.training.tasks.translation import learn_joint_bpe

    rng = random.Random(0)
    for name, count in (("train", 30), ("val", 4)):
        chosen = [[rng.choice(list(LEXICON)) for _ in range(rng.randint(1, 4))] for _ in range(count)]
        (tmp_path / f"{name}.de").write_text("".join(" ".join(words) + "\n" for words in chosen), encoding="utf-8")
        (tmp_path / f"{name}.en").write_text("".join(" ".join(LEXICON[w] for w in words) + "\n" for words in chosen),
                                             encoding="utf-8")
    (tmp_path / "test.de.gz").write_bytes(gzip.compress((tmp_path / "val.de").read_bytes()))
    (tmp_path / "test.en.gz").write_bytes(gzip.compress((tmp_path / "val.en").read_bytes()))
    tokenizer = learn_joint_bpe(read_parallel(tmp_path / "train", "de", "en"), 300)
    torch.manual_seed(0)
    model = tformer.build_model("transformer-multi30k", vocab_size=tokenizer.vocab_size, d_model=16, num_layers=1,
                                num_heads=2, d_ff=32, max_seq_len=32)
    model.tokenizer = tokenizer
    run = tmp_path / "run"
    model.save(run)
    write_recipe(run / "recipe.toml", {
        "model": {"preset": "transformer-multi30k"},
        "data": {"train": str(tmp_path / "train"), "eval": str(tmp_path / "val"), "source_language": "de",
                 "target_language": "en", "tokenizer": "bpe"},
        "task": {"name": "translation", "bpe_vocab_size": 300, "eval_bleu": False},
        "training": {"max_steps": 1, "batch_size": 4, "seq_len": 16, "threads": 1}})
    out = tmp_path / "evaluation"
    capsys.readouterr()
    assert main(["evaluate", str(run), "--data", str(tmp_path / "test.de.gz"), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "test.de.gz + test.en.gz: 4 pairs" in printed and "eval_loss" in printed
    assert json.loads((out / "test.json").read_text())["task"] == "translation"
    refused(capsys, ["evaluate", str(run), "--data", str(tmp_path / "nothing"), "--out", str(out)],
            "--data (the corpus of a de -> en translation run): ", "nothing.de: no such file", folder=tmp_path)


# ---- 13. predict and classify: each misused option is named ------------------------------------------


@pytest.fixture
def qa_model(tmp_path) -> str:
    torch.manual_seed(0)
    model = tformer.build_model("bert-tiny", head="question_answering", vocab_size=len(VOCAB), max_seq_len=32,
                                d_model=16, num_layers=1, num_heads=2, d_ff=32)
    model.tokenizer = WordPieceTokenizer(VOCAB)
    model.save(tmp_path / "qa")
    return str(tmp_path / "qa")


def test_predict_names_the_empty_question_and_refuses_a_useless_answer_length(qa_model, capsys):
    refused(capsys, ["predict", qa_model, "--question", "", "--context", ""], "--question is empty")
    refused(capsys, ["predict", qa_model, "--question", "who sat ?", "--context", " "], "--context is empty")
    err = refused(capsys, ["predict", qa_model, "--question", "who sat ?"], "takes --question and --context")
    assert "--text" not in err
    for length in ("0", "-5"):
        refused(capsys, ["predict", qa_model, "--question", "who sat ?", "--context", "the cat sat on the mat .",
                         "--max-answer-length", length], f"--max-answer-length {length} must be a positive integer")


def test_predict_says_when_a_text_is_cut_to_the_model_s_positions(classifier_run, capsys):
    capsys.readouterr()
    assert main(["predict", str(classifier_run), "--text", " ".join(["good"] * 5000)]) == 0
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == 1
    assert "warning: --text 'good good" in err and "5,002 tokens, cut to the model's 32" in err, err
    assert len(err.strip().splitlines()) == 1 and len(err) < 400
    assert main(["predict", str(classifier_run), "--text", "a good movie"]) == 0
    assert capsys.readouterr().err == ""


def test_predict_refuses_a_pair_for_a_classifier_of_single_texts(classifier_run, tmp_path, capsys):
    refused(capsys, ["predict", str(classifier_run), "--text", "a good movie", "--pair", "the film"],
            "--pair: ", "was trained on single texts (train.tsv has no second text)")
    torch.manual_seed(0)
    model = tformer.build_model("bert-tiny", head="sequence_classification", vocab_size=len(VOCAB), max_seq_len=32,
                                d_model=16, num_layers=1, num_heads=2, d_ff=32, type_vocab_size=0)
    model.tokenizer = WordPieceTokenizer(VOCAB)
    model.save(tmp_path / "no-segments")
    refused(capsys, ["predict", str(tmp_path / "no-segments"), "--text", "a good movie", "--pair", "the film"],
            "has no segment embeddings, type_vocab_size=0")
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("sentence1\tsentence2\tlabel\na good movie\tthe film\tpos\n", encoding="utf-8")
    recipe = (classifier_run / "recipe.toml").read_text(encoding="utf-8")
    (classifier_run / "recipe.toml").write_text(recipe.replace(str(tmp_path / "train.tsv"), str(pairs)), "utf-8")
    capsys.readouterr()
    assert main(["predict", str(classifier_run), "--text", "a good movie", "--pair", "the film"]) == 0


def test_classify_names_a_folder_given_as_an_image(tmp_path, capsys):
    torch.manual_seed(0)
    model = tformer.build_model("vit-mnist", image_size=8, patch_size=4, d_model=16, num_layers=1, num_heads=2,
                                num_labels=3)
    model.image_processor = ImageProcessing(8, 1, (0.5,), (0.25,))
    model.save(tmp_path / "vit")
    (tmp_path / "pictures").mkdir()
    refused(capsys, ["classify", str(tmp_path / "vit"), str(tmp_path / "pictures")],
            f"{tmp_path / 'pictures'}: is a folder; give image files (PNG or JPEG)", folder=tmp_path)
    assert os.listdir(tmp_path / "pictures") == []
