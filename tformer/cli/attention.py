"""``tformer attention MODEL --image IMAGE...`` or ``--text TEXT``: where a model looks.

``--image`` (a Vision Transformer): for each image, the attention rollout (Abnar & Zuidema 2020) and the
class token's last-layer attention, upsampled over the image, in one PNG (a row per image, the predicted
label beside it); ``--positions`` adds the grid of learned position-embedding similarities (the ViT paper's
Figure 7).

``--text`` (a decoder or an encoder): the text in the model's tokens and a grid of heatmaps, a row per
layer and a column per head (``--layer`` / ``--head``, counted from 1, draw one), the tokens on both axes.

``--source`` (an encoder-decoder or the attention RNN): the sentence is translated (``--beam``, by default
``tformer translate``'s 5), and the
translation's attention over the source drawn as an alignment: a row per output token, a column per
source token; a transformer's cross-attention of one ``--layer`` / ``--head`` or the mean of them.

``--audio`` (a speech model): the recording is transcribed (``--beam``, by default greedy as ``tformer
transcribe``; ``--language`` for a multilingual
Whisper model) and drawn as its log-mel spectrogram with, on the same time axis, each transcript token's
cross-attention over the audio (one ``--layer`` / ``--head`` or the mean). One window of audio: a longer
recording is refused (cut it, or transcribe it with ``tformer transcribe``)."""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

from tformer.cli.model_source import add_model_source, output_beside_model
from tformer.viz.rollout import HEAD_FUSIONS

TEXT_ARCHITECTURES = ("decoder", "encoder")
DEFAULT_MAX_TOKENS = 64
# --beam's defaults: those of the commands that translate and transcribe, so that a drawn translation or transcript
# is the one those commands print (tests/cli/test_cli_attention.py checks they agree).
SOURCE_BEAMS = 5  # tformer translate's
AUDIO_BEAMS = 1  # tformer transcribe's (greedy)


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "attention", help="attention maps: rollout overlays on images (vision) or per-head heatmaps of a text (PNG)",
        description="With --image: run a vision model on PNG/JPEG images with its attention maps and draw, for each "
                    "image, the attention rollout (every layer, the residual as identity) and the last layer's "
                    "class-token attention over the image. With --text: run a decoder or an encoder on the text and "
                    "draw each layer's and head's attention weights as heatmaps, tokens on both axes.",
    )
    add_model_source(parser, "model", "a model folder (a run, a checkpoint, a Hugging Face folder)",
                     without=("device",))
    inputs = parser.add_mutually_exclusive_group(required=True)
    inputs.add_argument("--image", nargs="+", metavar="IMAGE", help="PNG or JPEG files (a vision model)")
    inputs.add_argument("--text", help="a text (a decoder or an encoder with a tokenizer)")
    inputs.add_argument("--source", help="a sentence to translate and draw the alignment of (a translation model)")
    inputs.add_argument("--audio", metavar="WAV", help="a recording to transcribe and draw the alignment of over its "
                                                       "spectrogram (a speech model)")
    parser.add_argument("--out", help="the PNG to write (default: MODEL/attention/<first image's name>.png, "
                                      "MODEL/attention/text.png for --text, MODEL/attention/alignment.png for "
                                      "--source, MODEL/attention/<recording's name>.png for --audio)")
    parser.add_argument("--head-fusion", choices=HEAD_FUSIONS,
                        help="--image: how each layer's heads combine (default: mean)")
    parser.add_argument("--positions", metavar="PNG",
                        help="--image: also draw the learned position embeddings' similarities into this PNG")
    parser.add_argument("--layer", type=int,
                        help="--text, --source, --audio: draw this layer only (counted from 1; --source and --audio "
                             "default: the mean)")
    parser.add_argument("--head", type=int,
                        help="--text, --source, --audio: draw this head only (counted from 1; --source and --audio "
                             "default: the mean)")
    parser.add_argument("--beam", type=int,
                        help=f"--source, --audio: beams of the translation or transcription (default: "
                             f"{SOURCE_BEAMS} with --source, as tformer translate; {AUDIO_BEAMS} with --audio, "
                             f"greedy, as tformer transcribe)")
    parser.add_argument("--language", help="--audio: a multilingual Whisper model's language code (en, de, ...)")
    parser.add_argument("--max-tokens", type=int,
                        help=f"--text: draw at most this many tokens; a longer text is cut, with a warning "
                             f"(default: {DEFAULT_MAX_TOKENS}, and never past the model's context)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tformer.cli import UsageError

    own = next(option for option, value in (("--text", args.text), ("--source", args.source),
                                             ("--audio", args.audio), ("--image", args.image)) if value is not None)
    options = {"--head-fusion": (args.head_fusion, ("--image",)), "--positions": (args.positions, ("--image",)),
               "--layer": (args.layer, ("--text", "--source", "--audio")),
               "--head": (args.head, ("--text", "--source", "--audio")),
               "--max-tokens": (args.max_tokens, ("--text",)), "--language": (args.language, ("--audio",)),
               "--beam": (args.beam, ("--source", "--audio"))}
    for option, (value, owners) in options.items():
        if value is not None and own not in owners:
            allowed = " or ".join(owners) if len(owners) < 3 else f"{', '.join(owners[:-1])} or {owners[-1]}"
            raise UsageError(f"{option} goes with {allowed}, not {own}")
    if own == "--source":
        return draw_alignment(args)
    if own == "--audio":
        return draw_audio_alignment(args)
    return draw_text_maps(args) if args.text is not None else draw_image_maps(args)


def check_has_weights(model_path: str, config) -> None:
    """Refuse a model whose attention kernel never forms the weights to draw (Performer estimates them)."""
    from tformer.choices import ATTENTION_KERNELS
    from tformer.cli import UsageError

    if not ATTENTION_KERNELS[config.attention_kernel].weights:
        with_weights = ", ".join(name for name, kernel in ATTENTION_KERNELS.items() if kernel.weights)
        raise UsageError(f"{model_path}: attention_kernel={config.attention_kernel!r} never forms attention weights, "
                         f"so there is nothing to draw; models with {with_weights} have them")


def draw_image_maps(args: argparse.Namespace) -> int:
    """The rollout and last-layer overlays of a vision model on images (and the position similarities)."""
    import torch

    from tformer.cli import UsageError
    from tformer.cli.model_inputs import read_model_images
    from tformer.cli.model_source import load_image_classifier
    from tformer.viz.rollout import (
        attention_rollout,
        fuse_heads,
        patch_map,
        plot_attention_maps,
        plot_position_similarity,
        position_similarity,
        upsample_map,
    )

    head_fusion = args.head_fusion or "mean"
    model = load_image_classifier(args.model_source)
    config = model.config
    check_has_weights(args.model, config)
    out = output_beside_model(args, args.model, "attention", f"{Path(args.image[0]).stem}.png")
    outputs = [out] + ([Path(args.positions)] if args.positions else [])
    for path in outputs:
        check_own_png(path)
    if args.positions and config.positional != "learned":
        raise UsageError(f"--positions draws learned position embeddings; this model's are {config.positional!r}")
    pixels = read_model_images(args.image, model.image_processor)  # uint8 (N, C, H, W) at the model's size
    with torch.inference_mode():
        output = model(model.image_processor(pixels), output_attentions=True)
    size, grid = tuple(pixels.shape[-2:]), (config.patch_grid,) * 2
    rollout = patch_map(attention_rollout(output.attentions, head_fusion), grid, config.pooling)
    last = patch_map(fuse_heads(output.attentions[-1], head_fusion), grid, config.pooling)
    names = config.label_names_or_ids
    probabilities = output.logits.float().softmax(-1)
    titles = [f"{Path(path).name}\n{names[int(row.argmax())]} ({float(row.max()):.2f})"
              for path, row in zip(args.image, probabilities, strict=True)]
    maps = {f"rollout ({head_fusion})": upsample_map(rollout, size),
            f"last layer ({head_fusion})": upsample_map(last, size)}
    out.parent.mkdir(parents=True, exist_ok=True)
    print(f"attention  {plot_attention_maps(pixels.float() / 255, maps, out, titles)}")
    if args.positions:
        table = model.embedding.position_embeddings[0, -config.num_patches:].detach()  # (N, D): the patches' rows
        similarity = position_similarity(table, grid)
        print(f"positions  {plot_position_similarity(similarity, args.positions, f'{args.model}: positions')}")
    return 0


def draw_text_maps(args: argparse.Namespace) -> int:
    """The per-layer, per-head attention heatmaps of a decoder or an encoder on one text."""
    import torch

    from tformer.cli import UsageError, check_text_option
    from tformer.cli.model_source import load_model
    from tformer.viz.heatmaps import plot_attention_heatmaps, select_maps, token_labels

    text = check_text_option(args.text, "--text")
    max_tokens = DEFAULT_MAX_TOKENS if args.max_tokens is None else args.max_tokens
    if max_tokens < 1:
        raise UsageError(f"--max-tokens {max_tokens} must be a positive integer")
    loaded = load_model(args.model_source)
    model, config = loaded.model, loaded.model.config
    if config.architecture not in TEXT_ARCHITECTURES:
        raise UsageError(f"{args.model}: --text draws the attention of a decoder or an encoder; this model is "
                         f"architecture={config.architecture!r}"
                         + (" (give it --image)" if config.architecture == "vision" else ""))
    check_has_weights(args.model, config)
    loaded.require_tokenizer(args.model, "attention --text needs one to read the text")
    check_layer_and_head(args, config.num_layers, config.num_heads)
    out = output_beside_model(args, args.model, "attention", "text.png")
    check_own_png(out)

    encoding = encode_text(model.tokenizer, text, max_tokens, config.max_seq_len)
    inputs = {"input_ids": torch.tensor([encoding.ids])}
    if config.architecture == "encoder" and config.type_vocab_size > 0:
        inputs["token_type_ids"] = torch.tensor([encoding.type_ids])
    with torch.inference_mode():
        output = model(**inputs, output_attentions=True)
    maps, layers, heads = select_maps(output.attentions, args.layer, args.head)  # (rows, columns, T, T)
    title = f"{args.model} ({config.architecture}): rows are queries, columns keys"
    out.parent.mkdir(parents=True, exist_ok=True)
    written = plot_attention_heatmaps(maps, token_labels(model.tokenizer, encoding.ids), layers, heads, out, title)
    print(f"attention  {written} ({_count(len(layers), 'layer')} x {_count(len(heads), 'head')}, "
          f"{len(encoding)} tokens)")
    return 0


def draw_alignment(args: argparse.Namespace) -> int:
    """Translate --source and draw the translation's attention over the source tokens."""
    import torch

    import tformer
    from tformer.cli import UsageError, check_text_option
    from tformer.cli.model_source import load_translator
    from tformer.generation.translation import new_token_budget
    from tformer.viz.alignment import alignment_weights, plot_alignment
    from tformer.viz.heatmaps import token_labels

    sentence = check_text_option(args.source, "--source").strip()
    beams = check_beams(args.beam, SOURCE_BEAMS)
    out = output_beside_model(args, args.model, "attention", "alignment.png")
    check_own_png(out)
    model = load_translator(args.model_source)
    config = model.config
    if config.architecture == "encoder_decoder":
        check_has_weights(args.model, config)
    layers = config.num_layers if config.architecture == "encoder_decoder" else 1
    heads = config.num_heads if config.architecture == "encoder_decoder" else 1
    check_layer_and_head(args, layers, heads, "cross-attention ")
    tokenizer = model.tokenizer
    source_ids = [*tokenizer.encode(sentence, add_special_tokens=False), tokenizer.eos_token_id]
    if not sentence or len(source_ids) < 2:
        raise UsageError("--source encodes to no tokens; give a sentence")
    limit = model.position_limit
    if limit is not None and len(source_ids) > limit:
        raise UsageError(f"--source is {len(source_ids)} tokens; the model reads at most {limit}")
    source = torch.tensor([source_ids])
    with torch.inference_mode():
        output = tformer.generate(model, source, max_new_tokens=new_token_budget(model, len(source_ids)),
                                  num_beams=beams)  # (1, T): the start token, the translation
        decoder_inputs = output[:, :-1] if output[0, -1] == tokenizer.eos_token_id else output
        result = model(source, decoder_input_ids=decoder_inputs, output_attentions=True)
    produced = output[0, 1:].tolist()  # the tokens the rows predict (the end token included when written)
    rows = len(produced)
    weights = alignment_weights(result.cross_attentions, args.layer, args.head)[:rows]
    translation = tokenizer.decode(produced, skip_special_tokens=True).strip()
    which = "" if config.architecture != "encoder_decoder" else (
        f", layer {args.layer or 'mean'}, head {args.head or 'mean'}")
    title = f"{Path(args.model).name} ({config.architecture}{which})\n{sentence}\n-> {translation}"
    out.parent.mkdir(parents=True, exist_ok=True)
    written = plot_alignment(weights, token_labels(tokenizer, source_ids), token_labels(tokenizer, produced), out,
                             title)
    print(f"translation {translation}")
    print(f"beam       {beams}")
    print(f"alignment  {written} ({rows} output x {len(source_ids)} source tokens)")
    return 0


def draw_audio_alignment(args: argparse.Namespace) -> int:
    """Transcribe --audio and draw the transcript's cross-attention over the recording's spectrogram."""
    import torch

    import tformer
    from tformer.cli import UsageError
    from tformer.cli.model_inputs import decoder_prompt, read_recordings
    from tformer.cli.model_source import load_speech_model
    from tformer.data.log_mel import LogMelSettings, recording_features
    from tformer.generation.transcription import transcript_budget
    from tformer.viz.alignment import alignment_weights, plot_audio_alignment
    from tformer.viz.heatmaps import token_labels

    beams = check_beams(args.beam, AUDIO_BEAMS)
    out = output_beside_model(args, args.model, "attention", f"{Path(args.audio).stem}.png")
    check_own_png(out)
    samples = read_recordings([args.audio], LogMelSettings.sample_rate)[0]  # (N,) mono at 16 kHz
    model = load_speech_model(args.model_source)
    config = model.config
    check_has_weights(args.model, config)
    check_layer_and_head(args, config.num_layers, config.num_heads, "cross-attention ")
    settings = model.log_mel_settings
    seconds = len(samples) / settings.sample_rate
    window_seconds = settings.window_samples / settings.sample_rate
    if len(samples) > settings.window_samples:
        raise UsageError(f"{args.audio}: {seconds:.2f} s of audio; --audio draws one window of this model's "
                         f"{window_seconds:g} s (cut the recording, or transcribe it whole with tformer transcribe)")
    prompt = decoder_prompt(model, args.language)
    features = recording_features(torch.from_numpy(samples), settings)[None]  # (1, M, F): one window
    with torch.inference_mode():  # features (1, M, F); output (1, T): the prompt, the transcript, the end token
        output = tformer.generate(model, features, max_new_tokens=transcript_budget(model, prompt),
                                  num_beams=beams, decoder_prompt_ids=prompt)
        ended = int(output[0, -1]) == config.eos_token_id
        result = model(features, decoder_input_ids=output[:, :-1] if ended else output, output_attentions=True)
    start = max(len(prompt), 1)
    produced = output[0, start:].tolist()  # the tokens the drawn rows predict (the end token included)
    weights = alignment_weights(result.cross_attentions, args.layer, args.head)[start - 1:start - 1 + len(produced)]
    transcript = " ".join(model.tokenizer.decode(produced, skip_special_tokens=True).split())
    which = f"layer {args.layer or 'mean'}, head {args.head or 'mean'}"
    title = f"{Path(args.model).name} ({which}): {Path(args.audio).name}\n-> {transcript}"
    out.parent.mkdir(parents=True, exist_ok=True)
    written = plot_audio_alignment(features[0], weights, token_labels(model.tokenizer, produced), seconds,
                                   window_seconds, out, title)
    print(f"transcript {transcript}")
    print(f"beam       {beams}")
    print(f"alignment  {written} ({len(produced)} tokens x {seconds:.2f} s of audio)")
    return 0


def check_beams(beams: int | None, default: int) -> int:
    """``--beam``, or ``default`` when it is not given; refused in one line below 1."""
    from tformer.cli import UsageError

    if beams is None:
        return default
    if beams < 1:
        raise UsageError(f"--beam {beams} must be a positive integer")
    return beams


def check_layer_and_head(args: argparse.Namespace, layers: int, heads: int, what: str = "") -> None:
    """Refuse a --layer or --head the model does not have (``what``: "cross-attention " names the kind)."""
    from tformer.cli import UsageError

    for option, value, count, noun in (("--layer", args.layer, layers, "layers"), ("--head", args.head, heads,
                                                                                   "heads")):
        if value is not None and not 1 <= value <= count:
            raise UsageError(f"{option} {value}: this model has {count} {what}{noun}, numbered 1 to {count}")


def encode_text(tokenizer, text: str, max_tokens: int, max_seq_len: int):
    """The Encoding of ``text`` with the model's special tokens, cut to ``max_tokens`` and the model's
    context with a warning naming how long it was."""
    from tformer.cli import UsageError

    encoding = tokenizer.encode_plus(text)
    if len(encoding) == 0:
        raise UsageError("--text encodes to no tokens; give some text")
    limit = min(max_tokens, max_seq_len)
    if len(encoding) > limit:
        why = f"--max-tokens {max_tokens}" if max_tokens <= max_seq_len else f"the model's {max_seq_len} positions"
        warnings.warn(f"--text is {len(encoding)} tokens; the maps show the first {limit} ({why})", stacklevel=2)
        encoding = tokenizer.encode_plus(text, truncation=True, max_length=limit)
    return encoding


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'s' if number != 1 else ''}"


def check_own_png(path: Path) -> None:
    """Refuse an output that exists and is not a figure tformer wrote, or whose folder is a file."""
    from tformer.cli import UsageError, check_replaceable
    from tformer.viz.figures import written_by_tformer

    if path.suffix.lower() != ".png":
        raise UsageError(f"{path}: the output is a PNG file (name it .png)")
    if path.parent.exists() and not path.parent.is_dir():
        raise UsageError(f"{path.parent}: exists and is not a folder")
    check_replaceable(path, None, written_by_tformer=written_by_tformer, what="a figure tformer wrote")
