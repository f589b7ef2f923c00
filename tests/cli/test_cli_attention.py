"""``tformer attention``: rollout overlays of a vision model on images, the position-similarity figure,
per-layer, per-head heatmaps of a decoder's or an encoder's attention on a text, and the refusals (a
file tformer did not write, a model without learned positions, a model of the other kind, a layer or a
head that does not exist)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import tformer
from tformer.cli import main
from tformer.data.image_processing import ImageProcessing
from tformer.tokenizers import BPETokenizer, CharTokenizer, WordPieceTokenizer
from tformer.viz.figures import pyplot, written_by_tformer
from tformer.viz.heatmaps import attention_heatmap_figure, select_maps, token_labels
from tformer.viz.rollout import attention_rollout, patch_map

TEXT = "the cat sat on the mat"
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "##s", "a"]


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


def text_folder(folder: Path, architecture: str) -> Path:
    """A 3-layer model with a tokenizer: gpt-nano (4 heads) over characters, or bert-tiny (2 heads) over
    words."""
    torch.manual_seed(0)
    if architecture == "decoder":
        tokenizer = CharTokenizer.train(TEXT)
        model = tformer.build_model("gpt-nano", vocab_size=tokenizer.vocab_size, num_layers=3)
    else:
        tokenizer = WordPieceTokenizer(VOCAB)
        model = tformer.build_model("bert-tiny", head="masked_lm", vocab_size=len(VOCAB), max_seq_len=32,
                                    num_layers=3)
    model.tokenizer = tokenizer
    model.save(folder)
    return folder


@pytest.mark.parametrize(("architecture", "heads", "tokens"), [
    ("decoder", 4, list("the\u2423cat\u2423sat\u2423on\u2423the\u2423mat")),
    ("encoder", 2, ["[CLS]", "the", "cat", "sat", "on", "the", "mat", "[SEP]"]),
])
def test_text_maps_draw_every_layer_and_head(tmp_path, capsys, architecture, heads, tokens):
    folder = text_folder(tmp_path / architecture, architecture)
    assert main(["attention", str(folder), "--text", TEXT]) == 0
    out = folder / "attention" / "text.png"
    assert written_by_tformer(out)
    assert f"{out} (3 layers x {heads} heads, {len(tokens)} tokens)" in capsys.readouterr().out
    assert main(["attention", str(folder), "--text", TEXT, "--layer", "2", "--head", str(heads)]) == 0
    assert f"(1 layer x 1 head, {len(tokens)} tokens)" in capsys.readouterr().out

    # The figure the command draws: a layers x heads grid of the model's maps, the tokens on both axes.
    model = tformer.load(folder)
    with torch.inference_mode():
        attentions = model(torch.tensor([model.tokenizer.encode(TEXT)]), output_attentions=True).attentions
    maps, layers, head_numbers = select_maps(attentions)
    labels = token_labels(model.tokenizer, model.tokenizer.encode(TEXT))
    figure, axes = attention_heatmap_figure(maps, labels, layers, head_numbers)
    try:
        assert axes.shape == (3, heads) and (layers, head_numbers) == ([1, 2, 3], list(range(1, heads + 1)))
        assert [label.get_text() for label in axes[0][0].get_yticklabels()] == tokens
        assert [label.get_text() for label in axes[-1][0].get_xticklabels()] == tokens
        assert axes[0][-1].get_title() == f"head {heads}" and axes[-1][0].get_ylabel() == "layer 3"
        torch.testing.assert_close(axes[1][0].get_images()[0].get_array().data, attentions[1][0, 0].numpy())
    finally:
        pyplot().close(figure)
    # A decoder's queries never see later keys; an encoder's see both ways.
    assert bool((maps.triu(1) == 0).all()) == (architecture == "decoder")
    one, _, _ = select_maps(attentions, layer=2, head=heads)
    torch.testing.assert_close(one[0, 0], attentions[1][0, heads - 1])


def test_maps_of_a_forward_with_gradients_draw():
    """A forward outside no_grad (docs/attention.md's snippet) gives maps that require grad; drawn, they need not."""
    maps, _, _ = select_maps([torch.rand(1, 2, 3, 3, requires_grad=True)])
    assert not maps.requires_grad
    pyplot().close(attention_heatmap_figure(maps, ["a", "b", "c"], [1], [1, 2])[0])


def test_token_labels_show_spaces():
    """A byte-level BPE token is shown as its text, its leading space (GPT-2's 'Ġ') as a visible mark;
    WordPiece continuations keep their '##'."""
    bpe = BPETokenizer.train(["the cat sat on the mat, the cat sat on the hat"] * 4, vocab_size=280)
    ids = bpe.encode("the cat sat")
    assert any(token.startswith("\u0120") for token in bpe.tokenize("the cat sat"))
    assert "".join(token_labels(bpe, ids)) == "the\u2423cat\u2423sat"
    wordpiece = WordPieceTokenizer(VOCAB)
    assert token_labels(wordpiece, wordpiece.encode("the mats")) == ["[CLS]", "the", "mat", "##s", "[SEP]"]


def test_long_texts_are_cut_with_a_warning(tmp_path, capsys):
    folder = text_folder(tmp_path / "encoder", "encoder")
    assert main(["attention", str(folder), "--text", TEXT, "--max-tokens", "5"]) == 0
    printed = capsys.readouterr()
    assert "--text is 8 tokens; the maps show the first 5 (--max-tokens 5)" in printed.err
    assert "(3 layers x 2 heads, 5 tokens)" in printed.out
    long_text = " ".join([TEXT] * 6)  # 38 tokens; the model has 32 positions
    assert main(["attention", str(folder), "--text", long_text]) == 0
    assert "the maps show the first 32 (the model's 32 positions)" in capsys.readouterr().err


@pytest.mark.parametrize(("arguments", "message"), [
    (["--layer", "0"], "--layer 0: this model has 3 layers, numbered 1 to 3"),
    (["--layer", "4"], "--layer 4: this model has 3 layers, numbered 1 to 3"),
    (["--head", "3"], "--head 3: this model has 2 heads, numbered 1 to 2"),
    (["--max-tokens", "0"], "--max-tokens 0 must be a positive integer"),
    (["--positions", "p.png"], "--positions goes with --image, not --text"),
    (["--head-fusion", "max"], "--head-fusion goes with --image, not --text"),
    (["--out", "maps.jpg"], "the output is a PNG file"),
])
def test_text_refusals(tmp_path, capsys, arguments, message):
    folder = text_folder(tmp_path / "encoder", "encoder")
    assert main(["attention", str(folder), "--text", TEXT, *arguments]) == 2
    error = capsys.readouterr().err
    assert message in error and len(error.strip().splitlines()) == 1
    assert not (folder / "attention").exists()


def test_text_and_image_go_to_their_own_models(tmp_path, capsys):
    vision = vision_folder(tmp_path / "vision")
    assert main(["attention", str(vision), "--text", TEXT]) == 2
    assert ("--text draws the attention of a decoder or an encoder; this model is architecture='vision' "
            "(give it --image)") in capsys.readouterr().err
    text = text_folder(tmp_path / "decoder", "decoder")
    image = str(write_image(tmp_path / "image.png"))
    assert main(["attention", str(text), "--image", image]) == 2
    assert "a vision model with head 'image_classification' is needed" in capsys.readouterr().err
    assert main(["attention", str(vision), "--image", image, "--layer", "1"]) == 2
    assert "--layer goes with --text, --source or --audio, not --image" in capsys.readouterr().err
    assert main(["attention", str(text), "--text", TEXT, "--beam", "2"]) == 2
    assert "--beam goes with --source or --audio, not --text" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_code:
        main(["attention", str(text), "--image", image, "--text", TEXT])
    assert exit_code.value.code == 2 and "not allowed with argument" in capsys.readouterr().err
    tformer.build_model("gpt-nano").save(tmp_path / "no-tokenizer")
    assert main(["attention", str(tmp_path / "no-tokenizer"), "--text", TEXT]) == 2
    assert "attention --text needs one to read the text" in capsys.readouterr().err
    assert not (vision / "attention").exists() and not (text / "attention").exists()


@pytest.mark.slow  # draws every map three times
def test_text_maps_replace_only_figures_tformer_wrote(tmp_path, capsys):
    folder = text_folder(tmp_path / "decoder", "decoder")
    users = write_image(tmp_path / "mine.png")
    before = users.read_bytes()
    assert main(["attention", str(folder), "--text", TEXT, "--out", str(users)]) == 2
    assert "exists and is not a figure tformer wrote" in capsys.readouterr().err
    assert users.read_bytes() == before
    ours = tmp_path / "ours.png"
    assert main(["attention", str(folder), "--text", TEXT, "--out", str(ours)]) == 0
    first = ours.read_bytes()
    assert main(["attention", str(folder), "--text", "the mat", "--out", str(ours)]) == 0
    assert written_by_tformer(ours) and ours.read_bytes() != first


def test_select_maps_refuses_what_the_model_does_not_have():
    attentions = [torch.rand(1, 2, 4, 4) for _ in range(3)]
    with pytest.raises(ValueError, match="layer 4 is out of range: this model has 3 layers, numbered 1 to 3"):
        select_maps(attentions, layer=4)
    with pytest.raises(ValueError, match="head 0 is out of range: this model has 2 heads, numbered 1 to 2"):
        select_maps(attentions, head=0)


def test_a_performer_model_has_no_maps_to_draw(tmp_path, capsys):
    folder = tmp_path / "performer"
    tformer.build_model("gpt-nano", attention_kernel="performer", performer_features=16).save(folder)
    assert main(["attention", str(folder), "--text", TEXT]) == 2
    error = capsys.readouterr().err
    assert "attention_kernel='performer' never forms attention weights" in error
    assert len(error.strip().splitlines()) == 1
    vision = vision_folder(tmp_path / "vision", attention_kernel="performer", performer_features=16)
    assert main(["attention", str(vision), "--image", str(write_image(tmp_path / "image.png"))]) == 2
    assert "never forms attention weights" in capsys.readouterr().err


@pytest.fixture(scope="module")
def speech_folder(tmp_path_factory):
    """A tiny speech model of wide random weights (it writes varied text) with its character tokenizer, and a
    0.3 s tone (within its 0.5 s window) and a 0.8 s one (past it)."""
    from speech_corpus import WORDS, tiny_model, write_tone

    from tformer.training.tasks.speech_recognition import SPEECH_SPECIAL_TOKENS

    folder = tmp_path_factory.mktemp("speech")
    tokenizer = CharTokenizer.train([" ".join(WORDS)], special_tokens=SPEECH_SPECIAL_TOKENS)
    model = tiny_model(tokenizer.vocab_size, initializer_range=0.5)
    model.tokenizer = tokenizer
    model.save(folder / "model")
    return folder / "model", write_tone(folder / "short.wav", 0.3, 300), write_tone(folder / "long.wav", 0.8, 500)


def test_audio_alignment_draws_the_transcript_over_the_spectrogram(speech_folder, capsys, monkeypatch):
    """The figure holds the recording's log-mel spectrogram and, for each token the model writes (greedy, as
    ``tformer transcribe`` writes them), its cross-attention over the window's encoder frames."""
    from tformer.viz import alignment

    folder, short, _ = speech_folder
    drawn = {}

    def keep(spectrogram, weights, tokens, seconds, window_seconds, out, title):
        drawn.update(spectrogram=spectrogram, weights=weights, tokens=tokens, seconds=seconds, window=window_seconds)
        return plot(spectrogram, weights, tokens, seconds, window_seconds, out, title)

    plot = alignment.plot_audio_alignment
    monkeypatch.setattr(alignment, "plot_audio_alignment", keep)
    assert main(["transcribe", str(folder), str(short)]) == 0
    transcript = capsys.readouterr().out.split("\t")[0]
    assert main(["attention", str(folder), "--audio", str(short)]) == 0  # greedy by default, as transcribe
    out = capsys.readouterr().out
    assert f"transcript {transcript}\nbeam       1\n" in out
    png = folder / "attention" / "short.png"
    assert written_by_tformer(png) and f"alignment  {png} (" in out
    model = tformer.load(folder)
    assert drawn["spectrogram"].shape == (80, model.config.input_frames)
    rows = drawn["weights"]
    assert rows.shape == (len(drawn["tokens"]), model.config.input_frames // 2)
    assert torch.allclose(rows.sum(-1), torch.ones(len(rows)), atol=1e-5)  # each token's weights sum to 1
    assert "".join(drawn["tokens"]).replace("\u2423", " ").replace("</s>", "").strip() == transcript
    assert (drawn["seconds"], drawn["window"]) == (pytest.approx(0.3), pytest.approx(0.5))
    assert main(["attention", str(folder), "--audio", str(short), "--layer", "1", "--head", "2"]) == 0  # replaces


@pytest.mark.parametrize("arguments, message", [
    (["--audio", "{long}"], "long.wav: 0.80 s of audio; --audio draws one window of this model's 0.5 s"),
    (["--audio", "{short}", "--head", "3"], "--head 3: this model has 2 cross-attention heads, numbered 1 to 2"),
    (["--audio", "{short}", "--language", "en"], "--language en: this model's tokenizer has no language tokens"),
    (["--text", "hello", "--language", "en"], "--language goes with --audio, not --text"),
    (["--audio", "{folder}"], "is a folder; give WAV files"),
])
def test_audio_refusals(speech_folder, capsys, arguments, message):
    folder, short, long = speech_folder
    arguments = [argument.format(short=short, long=long, folder=folder) for argument in arguments]
    assert main(["attention", str(folder), *arguments]) == 2
    error = capsys.readouterr().err
    assert message in error and len(error.strip().splitlines()) == 1


def test_audio_goes_to_a_speech_model(tmp_path, speech_folder, capsys):
    _, short, _ = speech_folder
    text_model = tmp_path / "gpt"
    tformer.build_model("gpt-nano").save(text_model)
    assert main(["attention", str(text_model), "--audio", str(short)]) == 2
    assert "does not transcribe audio; give a speech model" in capsys.readouterr().err


def test_text_maps_of_a_model_quantized_as_it_loads(tmp_path, capsys):
    """--quantize came to attention with the shared option group: the maps are the quantized model's."""
    folder = text_folder(tmp_path / "decoder", "decoder")
    assert main(["attention", str(folder), "--text", TEXT, "--quantize", "int8", "--out", str(tmp_path / "q.png")]) == 0
    assert written_by_tformer(tmp_path / "q.png")
    assert "(3 layers x 4 heads" in capsys.readouterr().out


def test_beam_defaults_agree_with_translate_and_transcribe():
    """``attention --source`` / ``--audio`` decode as ``translate`` / ``transcribe`` do when --beam is left out, so
    the drawn text is the one those commands print."""
    from tformer.cli import build_parser
    from tformer.cli.attention import AUDIO_BEAMS, SOURCE_BEAMS

    parser = build_parser()
    assert parser.parse_args(["translate", "m", "--input", "x"]).beam == SOURCE_BEAMS
    assert parser.parse_args(["transcribe", "m", "x.wav"]).beam == AUDIO_BEAMS
