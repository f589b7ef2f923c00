"""A tiny vision recipe end to end: ``tformer train`` on an image folder (the run folder keeps the image
processor), a resumed run equal to an uninterrupted one, ``tformer evaluate`` (metrics and the confusion
PNG) and ``tformer classify`` (the model's own probabilities; its errors); the MNIST recipes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file
from shared_data import SHARED_DATA, require

import tformer
from tformer.cli import main
from tformer.data.images import FASHION_MNIST_LABELS
from tformer.training.recipe import load_recipe, recipe_from_dict
from tformer.training.run import train_recipe

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
SHAPES = ("bar", "dot", "frame")


def shape_image(kind: str, seed: int, size: int = 8) -> np.ndarray:
    """A noisy 8 x 8 greyscale picture of a horizontal bar, a dot or a frame."""
    pixels = np.random.default_rng(seed).integers(0, 60, (size, size)).astype(np.uint8)
    if kind == "bar":
        pixels[3:5, :] = 250
    elif kind == "dot":
        pixels[3:5, 3:5] = 250
    else:
        pixels[0, :] = pixels[-1, :] = pixels[:, 0] = pixels[:, -1] = 250
    return pixels


def write_folder(root: Path, per_class: int, seed: int) -> Path:
    for label, kind in enumerate(SHAPES):
        (root / kind).mkdir(parents=True)
        for index in range(per_class):
            Image.fromarray(shape_image(kind, seed * 1000 + label * 100 + index)).save(root / kind / f"{index}.png")
    return root


def recipe(tmp_path: Path, **training) -> dict:
    return {"model": {"preset": "vit-mnist", "image_size": 8, "patch_size": 4, "d_model": 16, "num_layers": 1,
                      "num_heads": 2, "num_labels": 3, "label_names": list(SHAPES)},
            "data": {"train": "train", "eval": "test"},
            "task": {"name": "image_classification", "crop_padding": 1},
            "training": {"max_steps": 6, "batch_size": 4, "lr": 3e-3, "warmup_steps": 1, "eval_every": 3,
                         "checkpoint_every": 3, "keep_last": 0, "eval_batches": 0, "threads": 1, **training}}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A run folder trained 6 steps on 3 x 8 training images, and its folder of 3 x 3 test images."""
    folder = tmp_path_factory.mktemp("shapes")
    write_folder(folder / "train", per_class=8, seed=0)
    write_folder(folder / "test", per_class=3, seed=1)
    torch.manual_seed(0)
    train_recipe(recipe_from_dict(recipe(folder), base_dir=folder), folder / "run", progress=False,
                 echo=lambda text: None)
    return folder


def test_the_run_folder_keeps_the_measured_image_processor(trained):
    model = tformer.load(trained / "run")
    processor = model.image_processor
    assert (processor.image_size, processor.num_channels) == (8, 1)
    pixels = torch.stack([torch.from_numpy(np.array(Image.open(path))) for path in sorted(
        (trained / "train").rglob("*.png"))]).double() / 255
    assert processor.mean[0] == pytest.approx(pixels.mean().item(), abs=1e-9)
    assert processor.std[0] == pytest.approx(pixels.std(correction=0).item(), abs=1e-9)
    assert model.config.label_names == SHAPES
    records = [json.loads(line) for line in (trained / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "eval_accuracy" in r] == [3, 6]


def test_a_resumed_run_equals_the_uninterrupted_one(trained):
    resumed = trained / "resumed"
    train_recipe(recipe_from_dict(recipe(trained), base_dir=trained), resumed, progress=False,
                 resume=str(trained / "run" / "checkpoints" / "step-00000003"), echo=lambda text: None)
    expected, actual = load_file(str(trained / "run" / "model.safetensors")), load_file(
        str(resumed / "model.safetensors"))
    assert expected.keys() == actual.keys() and all(torch.equal(expected[name], actual[name]) for name in expected)


def test_evaluate_writes_the_metrics_and_a_confusion_matrix_with_the_class_names(trained, capsys):
    out = trained / "evaluation"
    assert main(["evaluate", str(trained / "run"), "--data", str(trained / "test"), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    record = json.loads((out / "test.json").read_text())
    assert record["task"] == "image_classification" and 0.0 <= record["eval_accuracy"] <= 1.0
    assert f"eval_accuracy      {record['eval_accuracy']:.4f}" in printed
    assert (out / "test-confusion.png").read_bytes()[:4] == b"\x89PNG"
    assert "evaluation test: 9 images of 1 x 8 x 8" in printed


def test_classify_prints_the_models_probabilities(trained, capsys):
    model = tformer.load(trained / "run")
    paths = [trained / "test" / kind / "0.png" for kind in SHAPES]
    pixels = torch.stack([torch.from_numpy(np.array(Image.open(path)))[None] for path in paths])
    with torch.no_grad():
        probabilities = torch.softmax(model(model.image_processor(pixels)).logits, dim=-1)
    capsys.readouterr()
    assert main(["classify", str(trained / "run"), *map(str, paths), "--json", "--top-k", "2"]) == 0
    results = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [result["image"] for result in results] == list(map(str, paths))
    for result, row in zip(results, probabilities, strict=True):
        order = row.argsort(descending=True)[:2].tolist()
        assert [label["label"] for label in result["labels"]] == [SHAPES[index] for index in order]
        assert [label["probability"] for label in result["labels"]] == pytest.approx(row[order].tolist(), abs=1e-4)
    assert main(["classify", str(trained / "run"), str(paths[0])]) == 0  # lines: at most 3 labels (of 3)
    line = capsys.readouterr().out.strip()
    assert line.endswith(f"\t{paths[0]}") and line.count("(") == 3


def test_classify_converts_and_resizes_other_images_with_a_warning(trained, capsys):
    rgb = np.stack([shape_image("dot", 5, size=16)] * 3, axis=-1)
    Image.fromarray(rgb).save(trained / "big.png")
    Image.fromarray(shape_image("dot", 5, size=16)).resize((8, 8), Image.Resampling.BILINEAR).save(
        trained / "small.png")
    capsys.readouterr()
    assert main(["classify", str(trained / "run"), str(trained / "big.png"), str(trained / "small.png"), "--json"]) == 0
    captured = capsys.readouterr()
    assert f"warning: {trained / 'big.png'}: 16 x 16 resized to the model's 8 x 8" in captured.err
    big, small = (json.loads(line)["labels"] for line in captured.out.splitlines())
    assert big == small  # Pillow's grey conversion then resize equals the grey image resized


def test_classify_errors_are_one_line(trained, tmp_path, capsys):
    run = str(trained / "run")
    (tmp_path / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 20)
    for arguments, message in (
        ([run, str(tmp_path / "missing.png")], "missing.png: no such file"),
        ([run, str(tmp_path / "broken.png")], "broken.png: not a readable image"),
        ([run, str(trained / "test" / "dot" / "0.png"), "--top-k", "0"], "--top-k 0 must be a positive integer"),
    ):
        capsys.readouterr()
        assert main(["classify", *arguments]) == 2
        error = capsys.readouterr().err
        assert error.startswith("tformer classify: error: ") and message in error and error.count("\n") == 1
    decoder = tmp_path / "decoder"
    tformer.build_model("gpt-nano", vocab_size=16, max_seq_len=8).save(decoder)
    assert main(["classify", str(decoder), str(trained / "test" / "dot" / "0.png")]) == 2
    assert "a vision model with head 'image_classification' is needed" in capsys.readouterr().err
    assert main(["predict", run, "--text", "a dot"]) == 2
    assert "(tformer classify labels images)" in capsys.readouterr().err


@pytest.mark.parametrize(("name", "dataset", "label_names"), [("mnist-vit", "mnist", tuple("0123456789")),
                                                              ("fashion-mnist-vit", "fashion-mnist",
                                                               FASHION_MNIST_LABELS)])
def test_the_mnist_recipes_are_valid_and_name_the_shared_data(name, dataset, label_names):
    require(SHARED_DATA / dataset)
    loaded = load_recipe(CONFIGS / f"{name}.toml")
    assert loaded.task.name == "image_classification" and loaded.model.architecture == "vision"
    assert Path(loaded.data.train) == (SHARED_DATA / dataset / "train-images-idx3-ubyte.gz").resolve()
    assert Path(loaded.data.eval) == (SHARED_DATA / dataset / "t10k-images-idx3-ubyte.gz").resolve()
    assert loaded.model.label_names in ((), label_names) and loaded.declared_label_names in (None, label_names)
    assert (loaded.model.image_size, loaded.model.num_channels, loaded.model.num_labels) == (28, 1, 10)
    # sized by the clock inside the 30-minute budget, with room for start-up and the final evaluation
    assert loaded.training.sized_by_clock and 0 < loaded.training.max_minutes <= 28


def test_bad_images_stop_a_run_before_anything_is_written(tmp_path, capsys):
    write_folder(tmp_path / "train", per_class=2, seed=0)
    write_folder(tmp_path / "test", per_class=1, seed=1)
    (tmp_path / "train" / "dot" / "9.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 20)
    recipe_file = tmp_path / "shapes.toml"
    recipe_file.write_text('[model]\npreset = "vit-mnist"\nimage_size = 8\npatch_size = 4\nd_model = 16\n'
                           'num_layers = 1\nnum_heads = 2\n\n[data]\ntrain = "train"\neval = "test"\n\n'
                           '[task]\nname = "image_classification"\n\n[training]\nmax_steps = 2\nbatch_size = 2\n')
    assert main(["train", str(recipe_file), "--out", str(tmp_path / "run")]) == 2
    error = capsys.readouterr().err
    assert "train/dot/9.png: not a readable image" in error and error.count("\n") == 1
    assert not (tmp_path / "run").exists()
    (tmp_path / "train" / "dot" / "9.png").unlink()
    Image.fromarray(shape_image("dot", 9, size=10)).save(tmp_path / "test" / "dot" / "big.png")
    assert main(["train", str(recipe_file), "--out", str(tmp_path / "run")]) == 2
    assert "is 10 x 10 but" in capsys.readouterr().err and not (tmp_path / "run").exists()
