"""``tformer attention``: rollout overlays of a vision model on images, the position-similarity figure,
and the refusals (a file tformer did not write, a model without learned positions, a text model)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import tformer
from tformer.cli import main
from tformer.data.image_processing import ImageProcessing
from tformer.viz.figures import written_by_tformer
from tformer.viz.rollout import attention_rollout, patch_map


def vision_folder(folder: Path, **overrides) -> Path:
    torch.manual_seed(0)
    model = tformer.build_model("vit-mnist", image_size=8, patch_size=4, d_model=16, num_layers=2, num_heads=2,
                                num_labels=3, label_names=("bar", "dot", "frame"), **overrides)
    model.image_processor = ImageProcessing(image_size=8, num_channels=1, mean=(0.2,), std=(0.3,))
    model.save(folder)
    return folder


def write_image(path: Path, size: int = 8) -> Path:
    Image.fromarray(np.random.default_rng(len(path.name)).integers(0, 255, (size, size)).astype(np.uint8)).save(path)
    return path


def test_attention_writes_the_overlays_and_replaces_its_own(tmp_path, capsys):
    model = vision_folder(tmp_path / "model")
    images = [str(write_image(tmp_path / "seven.png")), str(write_image(tmp_path / "two.png", size=12))]
    assert main(["attention", str(model), "--image", *images, "--positions", str(tmp_path / "positions.png")]) == 0
    out = model / "attention" / "seven.png"
    assert written_by_tformer(out) and written_by_tformer(tmp_path / "positions.png")
    printed = capsys.readouterr()
    assert str(out) in printed.out and "12 x 12 resized to the model's 8 x 8" in printed.err
    assert main(["attention", str(model), "--image", images[0], "--head-fusion", "max"]) == 0


def test_attention_refuses_to_replace_a_users_file(tmp_path, capsys):
    model = vision_folder(tmp_path / "model")
    users = write_image(tmp_path / "mine.png")
    before = users.read_bytes()
    assert main(["attention", str(model), "--image", str(users), "--out", str(users)]) == 2
    assert "exists and is not a figure tformer wrote" in capsys.readouterr().err
    assert users.read_bytes() == before
    assert main(["attention", str(model), "--image", str(users), "--out", str(tmp_path / "maps.jpg")]) == 2
    assert "the output is a PNG file" in capsys.readouterr().err


def test_attention_refusals(tmp_path, capsys):
    sinusoidal = vision_folder(tmp_path / "sinusoidal", positional="sinusoidal")
    image = str(write_image(tmp_path / "image.png"))
    assert main(["attention", str(sinusoidal), "--image", image, "--positions", str(tmp_path / "p.png")]) == 2
    assert "learned position embeddings; this model's are 'sinusoidal'" in capsys.readouterr().err
    assert not (tmp_path / "p.png").exists() and not (sinusoidal / "attention").exists()
    text = tmp_path / "text"
    tformer.build_model("gpt-nano").save(text)
    assert main(["attention", str(text), "--image", image]) == 2
    assert "a vision model with head 'image_classification' is needed" in capsys.readouterr().err
    assert main(["attention", str(sinusoidal), "--image", str(tmp_path / "missing.png")]) == 2
    assert "missing.png: no such file" in capsys.readouterr().err


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_rollout_of_a_vision_model(tmp_path, pooling):
    """The model's attentions (one (B, H, 1 + N, 1 + N) map per layer, the class token kept by a
    mean-pooled model too) roll out to row-stochastic matrices that cover the patch grid."""
    model = tformer.build_model("vit-mnist", image_size=8, patch_size=4, d_model=16, num_layers=3, num_heads=2,
                                pooling=pooling)
    with torch.inference_mode():
        attentions = model(torch.randn(2, 1, 8, 8), output_attentions=True).attentions
    rollout = attention_rollout(attentions)
    tokens = 1 + model.config.num_patches
    assert len(attentions) == 3 and rollout.shape == (2, tokens, tokens)
    torch.testing.assert_close(rollout.sum(-1), torch.ones(2, tokens))
    assert patch_map(rollout, (model.config.patch_grid,) * 2, pooling).shape == (2, 2, 2)
