"""The speech model (architecture "speech", Whisper's shape) on the shared core: its presets' sizes, its
input checks (too many frames, the wrong mel count, an audio mask), its loss, decoding through the same
sessions as the encoder-decoder (cached = uncached, greedy and beam search, a decoder prompt), the
key_bias switch of the one attention layer, and the suppressed tokens of the one TokenChooser."""

from __future__ import annotations

import math

import pytest
import torch

import tformer
from tformer.config import ConfigError, ModelConfig
from tformer.generation import GenerationError, StackSession, open_session
from tformer.generation.sampling import TokenChooser
from tformer.generation.settings import GenerationConfig
from tformer.models import SpeechModel
from tformer.models.base import shift_right
from tformer.nn.attention import MultiHeadAttention
from tformer.nn.losses import ctc_loss, token_cross_entropy
from tformer.nn.positions import whisper_sinusoids

PAD, START, END = 0, 1, 2
# Odd sizes: 5 heads of 6, 24 mels, an 9-position window (18 frames), 3 decoder blocks over 2 encoder ones.
TINY = ModelConfig(architecture="speech", vocab_size=23, max_seq_len=20, d_model=30, num_layers=3, num_encoder_layers=2,
                   num_heads=5, d_ff=44, activation="gelu", key_bias=False, num_mel_bins=24, max_source_positions=9,
                   initializer_range=0.3, pad_token_id=PAD, bos_token_id=START, eos_token_id=END,
                   decoder_start_token_id=START)


@pytest.fixture(scope="module")
def model() -> SpeechModel:
    torch.manual_seed(0)
    built = tformer.build_model(TINY).eval()
    with torch.no_grad():  # biases start at zero: give them values, so a bias that went missing would show
        for name, parameter in built.named_parameters():
            if name.endswith("bias"):
                parameter.normal_(0, 0.2)
    return built


def audio(batch: int = 2, frames: int = 18, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, TINY.num_mel_bins, frames, generator=torch.Generator().manual_seed(seed))


# ---- the presets and the config ---------------------------------------------------------------------------

@pytest.mark.parametrize("name, count", [("whisper-tiny", 37_760_640), ("whisper-base", 72_593_920)])
def test_presets_have_whispers_parameter_counts(name, count):
    """Hugging Face's counts of WhisperForConditionalGeneration (the frozen encoder positions included)."""
    with torch.device("meta"):
        built = tformer.build_model(name)
    assert built.num_parameters() == count
    assert not built.audio.positions.weight.requires_grad


def test_the_digits_preset_reads_a_short_window():
    config = tformer.PRESETS["whisper-digits"]
    assert (config.architecture, config.input_frames, config.vocab_size) == ("speech", 300, 32)
    assert config.input_frames < tformer.PRESETS["whisper-tiny"].input_frames == 3000


def test_a_sliding_window_is_bounded_by_the_encoders_length_not_the_decoders():
    """whisper-digits: 150 encoder positions, 32 decoder positions; a window of 100 is the encoder's to use."""
    model = tformer.build_model("whisper-digits", num_layers=1, attention_kernel="sliding_window",
                                attention_window=100).eval()
    features = torch.randn(1, model.config.num_mel_bins, model.config.input_frames)
    with torch.no_grad():
        logits = model(input_features=features, decoder_input_ids=torch.tensor([[1, 5, 6]])).logits
    assert logits.shape == (1, 3, 32) and torch.isfinite(logits).all()
    with pytest.raises(ConfigError, match=r"attention_window=151 must be an integer in \[1, 150\] \(the longest "
                                          r"sequence of architecture='speech'\)"):
        model.config.replace(attention_window=151)


@pytest.mark.parametrize("changes, message", [
    ({"attention_bias": False}, "key_bias=False takes the key projections' bias away"),
    ({"num_mel_bins": 0}, "num_mel_bins=0 must be"),
    ({"max_source_positions": -3}, "max_source_positions=-3 must be"),
    ({"suppress_tokens": (3, 23)}, r"suppress_tokens=\(3, 23\) must be a list of token ids in \[0, 23\)"),
    ({"begin_suppress_tokens": (True,)}, "begin_suppress_tokens"),
    ({"decoder_start_token_id": 40}, "decoder_start_token_id=40 must be a token id"),
    ({"d_model": 2, "num_heads": 1}, "d_model=2 must be even and >= 4"),
    ({"lm_head_bias": True}, "lm_head_bias=True is a field of the encoder_decoder family"),
    ({"feature_normalization": "global"}, "feature_normalization='global' is not one of none, utterance"),
    ({"ctc_weight": 1.0}, r"ctc_weight=1.0 must be a number in \[0, 1\)"),
    ({"ctc_weight": True}, "ctc_weight=True must be a number"),
    ({"ctc_weight": 0.3, "pad_token_id": None}, "ctc_weight=0.3 needs pad_token_id .the CTC blank."),
])
def test_config_refuses_what_the_speech_model_cannot_be(changes, message):
    with pytest.raises(ConfigError, match=message):
        TINY.replace(**changes)


def test_speech_fields_are_refused_by_the_other_families():
    with pytest.raises(ConfigError, match="num_mel_bins=128 is a field of the speech family"):
        tformer.PRESETS["gpt-nano"].replace(num_mel_bins=128)
    with pytest.raises(ConfigError, match="suppress_tokens=.* architecture='encoder' does not use it"):
        tformer.PRESETS["bert-tiny"].replace(suppress_tokens=(1,))
    with pytest.raises(ConfigError, match="feature_normalization='utterance' is a field of the speech family"):
        tformer.PRESETS["gpt-nano"].replace(feature_normalization="utterance")
    with pytest.raises(ConfigError, match="ctc_weight=0.3 is a field of the speech family"):
        tformer.PRESETS["transformer-multi30k"].replace(ctc_weight=0.3)


def test_the_config_goes_through_json_unchanged():
    config = TINY.replace(suppress_tokens=(3, 4), begin_suppress_tokens=(END,), feature_normalization="utterance",
                          ctc_weight=0.25)
    again = ModelConfig.from_json(config.to_json())
    assert again == config and again.suppress_tokens == (3, 4)
    assert tformer.build_model(again).log_mel_settings.normalization == "utterance"  # what its features go through
    assert ModelConfig.from_dict(config.to_dict()) == config


# ---- forward ------------------------------------------------------------------------------------------------

def test_too_long_audio_is_refused_never_cut(model):
    with pytest.raises(ValueError, match="19 frames; this model reads at most 18 at once"):
        model(audio(frames=19), decoder_input_ids=torch.tensor([[START], [START]]))
    with pytest.raises(GenerationError, match="19 frames"):
        tformer.generate(model, audio(frames=19), 3)


@pytest.mark.parametrize("features, message", [
    (torch.randn(1, 80, 10), "80 mel channels; this model reads num_mel_bins=24"),
    (torch.ones(1, 24, 10, dtype=torch.long), "must be float log-mel features"),
    (torch.randn(24, 10), "must be float log-mel features"),
    (torch.randn(1, 24, 0), "hold no audio"),
])
def test_input_features_are_checked(model, features, message):
    with pytest.raises(ValueError, match=message):
        model(features, decoder_input_ids=torch.tensor([[START]]))
    with pytest.raises(GenerationError, match=message):
        tformer.generate(model, features, 2)


def test_there_is_no_audio_mask(model):
    with pytest.raises(ValueError, match="no audio attention_mask"):
        model(audio(), attention_mask=torch.ones(2, 18), decoder_input_ids=torch.tensor([[START], [START]]))
    with pytest.raises(GenerationError, match="give no attention_mask"):
        tformer.generate(model, audio(), 2, attention_mask=torch.ones(2, 18))


@pytest.mark.parametrize("frames", [18, 11, 1])
def test_shorter_audio_reads_the_first_positions(model, frames):
    """F frames -> ceil(F / 2) encoder positions, each the stem's output plus its own sinusoid."""
    features = audio(frames=frames)
    encoded = model.audio(features)
    assert encoded.shape == (2, math.ceil(frames / 2), TINY.d_model)
    stem = torch.nn.functional.gelu(model.audio.conv2(torch.nn.functional.gelu(model.audio.conv1(features))))
    torch.testing.assert_close(encoded, stem.transpose(1, 2) + whisper_sinusoids(9, TINY.d_model)[: encoded.shape[1]])


def test_the_loss_is_the_one_loss_on_labels_shifted_behind_the_start_token(model):
    labels = torch.tensor([[5, 6, 7, END], [8, 9, END, -100]])
    output = model(audio(), labels=labels)
    torch.testing.assert_close(output.loss, token_cross_entropy(output.logits, labels))
    shifted = shift_right(labels, START, PAD)
    assert shifted.tolist() == [[START, 5, 6, 7], [START, 8, 9, END]]
    torch.testing.assert_close(model(audio(), decoder_input_ids=shifted).logits, output.logits)


def test_a_ctc_head_reads_the_encoder_and_mixes_its_loss_with_the_decoders():
    torch.manual_seed(1)
    hybrid = tformer.build_model(TINY.replace(ctc_weight=0.25))
    labels = torch.tensor([[5, 5, 7, END], [8, 9, END, -100]])
    output = hybrid(audio(), labels=labels)
    torch.testing.assert_close(output.ctc_logits, hybrid.ctc_head(output.encoder_output))  # (B, S, V)
    assert output.ctc_logits.shape == (2, TINY.max_source_positions, TINY.vocab_size)
    without_end = torch.tensor([[5, 5, 7, -100], [8, 9, -100, -100]])
    expected = 0.75 * token_cross_entropy(output.logits, labels) + 0.25 * ctc_loss(output.ctc_logits, without_end, PAD)
    torch.testing.assert_close(output.loss, expected)
    output.loss.backward()
    assert hybrid.ctc_head.weight.grad.abs().sum() > 0 and hybrid.audio.conv1.weight.grad.abs().sum() > 0
    plain = tformer.build_model(TINY)
    assert plain.ctc_head is None and plain(audio(), labels=labels).ctc_logits is None


def test_decoding_never_reads_the_ctc_head(tmp_path):
    torch.manual_seed(2)
    hybrid = tformer.build_model(TINY.replace(ctc_weight=0.3, initializer_range=0.5)).eval()
    greedy, beams = tformer.generate(hybrid, audio(), 6), tformer.generate(hybrid, audio(), 6, num_beams=3)
    with torch.no_grad():
        hybrid.ctc_head.weight.normal_(0, 5.0)
    assert torch.equal(tformer.generate(hybrid, audio(), 6), greedy)
    assert torch.equal(tformer.generate(hybrid, audio(), 6, num_beams=3), beams)
    hybrid.save(tmp_path / "ckpt")
    again = tformer.load(tmp_path / "ckpt")
    torch.testing.assert_close(again.ctc_head.weight, hybrid.ctc_head.weight, rtol=0, atol=0)


def test_the_positions_never_train(model):
    trained = tformer.build_model(TINY)
    before = trained.audio.positions.weight.clone()
    optimizer = torch.optim.AdamW([p for p in trained.parameters() if p.requires_grad], lr=0.1)
    trained(audio(), labels=torch.tensor([[5, END], [6, END]])).loss.backward()
    optimizer.step()
    assert torch.equal(trained.audio.positions.weight, before)
    assert trained.audio.positions.weight.grad is None


def test_a_tformer_checkpoint_round_trips(model, tmp_path):
    model.save(tmp_path / "ckpt")
    again = tformer.load(tmp_path / "ckpt").eval()
    assert isinstance(again, SpeechModel) and again.config == model.config
    target = torch.tensor([[START, 4, 5], [START, 6, 7]])
    torch.testing.assert_close(again(audio(), decoder_input_ids=target).logits,
                               model(audio(), decoder_input_ids=target).logits, rtol=0, atol=0)


# ---- key_bias: one attention layer, a switch ----------------------------------------------------------------

@pytest.mark.parametrize("cross", [False, True], ids=["self", "cross"])
def test_without_key_bias_attention_is_the_biased_layer_with_a_zero_key_bias(cross):
    """key_bias=False computes what the fully biased layer computes with its key biases zero: the query and
    value biases land on their rows of the fused projection, never on the keys'."""
    torch.manual_seed(1)
    keyless = MultiHeadAttention(12, 3, key_bias=False, cross=cross)
    biased = MultiHeadAttention(12, 3, cross=cross)
    assert sum(p.numel() for p in keyless.parameters()) == sum(p.numel() for p in biased.parameters()) - 12
    with torch.no_grad():
        keyless.keyless_bias.bias.normal_()
        state = {name: tensor for name, tensor in keyless.state_dict().items() if "keyless" not in name}
        fused = "kv_proj" if cross else "qkv_proj"
        queries = 0 if cross else 12
        state[f"{fused}.bias"] = torch.cat([keyless.keyless_bias.bias[:queries], torch.zeros(12),
                                            keyless.keyless_bias.bias[queries:]])
        biased.load_state_dict(state, strict=False)
        if cross:
            biased.q_proj.bias.copy_(keyless.q_proj.bias)
    x, context = torch.randn(2, 5, 12), torch.randn(2, 7, 12)
    got, _ = keyless(x, context=context if cross else None)
    expected, _ = biased(x, context=context if cross else None)
    torch.testing.assert_close(got, expected)


def test_the_serving_engine_honours_key_bias():
    """key_bias is in LAYOUT_FIELDS: a decoder without key biases is served (paged cache) as generate decodes."""
    from tformer.serving import Engine

    torch.manual_seed(0)
    decoder = tformer.build_model("gpt-nano", key_bias=False, initializer_range=0.3).eval()
    with torch.no_grad():
        for name, parameter in decoder.named_parameters():
            if name.endswith("bias"):
                parameter.normal_(0, 0.3)
    engine = Engine(decoder, cache_tokens=256, block_size=8)
    config = GenerationConfig(max_new_tokens=8, eos_token_id=())
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    requests = [engine.submit(prompt, config) for prompt in prompts]
    engine.run_until_idle()
    for prompt, request in zip(prompts, requests, strict=True):
        expected = tformer.generate(decoder, torch.tensor([prompt]), generation_config=config)[0, len(prompt):]
        assert request.outputs()[0] == expected.tolist()


def test_prepacked_weights_keep_the_keyless_bias(model):
    """Decoding's view puts the linear layers on prepacked weights (a weight backend); the bias beside them stays."""
    target = torch.tensor([[START, 4, 5], [START, 6, 7]])
    expected = model(audio(), decoder_input_ids=target).logits
    view = model.decoding_view("prepacked")
    with torch.no_grad(), view.stepping:  # where the prepacked copies are read
        torch.testing.assert_close(view(audio(), decoder_input_ids=target).logits, expected)


# ---- generation: the encoder-decoder's sessions ------------------------------------------------------------

@pytest.mark.parametrize("num_beams", [1, 3], ids=["greedy", "beam-3"])
@pytest.mark.parametrize("prompt", [(), (START, 7, 8)], ids=["start-token", "decoder-prompt"])
def test_cached_decoding_equals_the_uncached_reference(model, num_beams, prompt):
    features = audio(batch=3, frames=15, seed=4)
    session, state = open_session(model, features, None, 6, decoder_prompt=prompt)
    assert isinstance(session, StackSession)
    assert state.input_ids.tolist() == [list(prompt or (START,))] * 3
    options = dict(num_beams=num_beams, decoder_prompt_ids=prompt, eos_token_id=[])
    cached = tformer.generate(model, features, 6, **options)
    assert torch.equal(cached, tformer.generate(model, features, 6, use_cache=False, **options))
    assert cached[:, : len(prompt or (START,))].tolist() == [list(prompt or (START,))] * 3


def test_generation_checks_the_decoder_prompt(model):
    with pytest.raises(GenerationError, match="prompt \\(3 tokens\\) \\+ max_new_tokens \\(18\\) exceeds"):
        tformer.generate(model, audio(), 18, decoder_prompt_ids=(START, 7, 8))
    with pytest.raises(GenerationError, match="decoder_prompt_ids=.*not a token id in \\[0, 23\\)"):
        tformer.generate(model, audio(), 2, decoder_prompt_ids=(START, 30))
    decoder = tformer.build_model("gpt-nano").eval()
    with pytest.raises(GenerationError, match="a decoder's prompt is its input_ids"):
        tformer.generate(decoder, torch.tensor([[1, 2]]), 2, decoder_prompt_ids=(1,))


def test_suppressed_tokens_are_never_chosen(model):
    features = audio(batch=2, frames=18, seed=5)
    plain = tformer.generate(model, features, 8, eos_token_id=[])[:, 1:]
    common = torch.bincount(plain.flatten()).argmax().item()
    first = plain[:, 0].tolist()
    got = tformer.generate(model, features, 8, eos_token_id=[], suppress_tokens=(common,),
                           begin_suppress_tokens=tuple(first))[:, 1:]
    assert common not in got.tolist()[0] + got.tolist()[1]
    assert not set(got[:, 0].tolist()) & set(first)
    # The model config's lists are the defaults; an empty option turns them off.
    suppressing = SpeechModel(model.config.replace(suppress_tokens=(common,), begin_suppress_tokens=tuple(first)))
    suppressing.load_state_dict(model.state_dict())
    suppressing.eval()
    assert torch.equal(tformer.generate(suppressing, features, 8, eos_token_id=[])[:, 1:], got)
    assert torch.equal(tformer.generate(suppressing, features, 8, eos_token_id=[], suppress_tokens=(),
                                        begin_suppress_tokens=())[:, 1:], plain)


def test_the_token_chooser_suppresses_always_and_at_the_beginning():
    config = GenerationConfig(suppress_tokens=(1,), begin_suppress_tokens=(2, 3))
    chooser = TokenChooser.from_config(config, TINY)
    logits = torch.zeros(3, 5)
    first, later = chooser.scores(logits, 0), chooser.scores(logits, 1)
    assert torch.isinf(first[:, [1, 2, 3]]).all() and torch.isfinite(first[:, [0, 4]]).all()
    assert torch.isinf(later[:, 1]).all() and torch.isfinite(later[:, [0, 2, 3, 4]]).all()
    consecutive = chooser.scores(logits, 0, consecutive=True)  # rows: the 1st, 2nd, 3rd new token
    assert torch.isinf(consecutive[0, [2, 3]]).all() and torch.isfinite(consecutive[1:, [2, 3]]).all()
    assert chooser.alters(5)
    begin_only = TokenChooser.from_config(GenerationConfig(begin_suppress_tokens=(2,)), TINY)
    assert begin_only.alters(0) and not begin_only.alters(1)
    with pytest.raises(GenerationError, match=r"suppress_tokens=\(40,\): 40 is not a token id in \[0, 23\)"):
        TokenChooser.from_config(GenerationConfig(suppress_tokens=(40,)), TINY)


def test_text_tools_refuse_a_model_that_reads_audio(model):
    with pytest.raises(GenerationError, match="needs an encoder-decoder model that reads text; this one is 'speech'"):
        tformer.translate(model, ["seven"], tokenizer=object())
    with pytest.raises(GenerationError, match="input_features must be float log-mel features"):
        tformer.generate(model, torch.tensor([[START, 5]]), 2)


def test_int8_weights_keep_the_conv_stem_and_the_keyless_bias_in_float(tmp_path):
    """Quantization swaps the linear layers only: the stem, the positions and the biases beside the fused
    projections stay float, and the quantized model decodes and saves like any other. (whisper-digits' widths:
    the int8 kernel needs inner sizes of a multiple it does not check, so TINY's 30 would crash it.)"""
    from tformer.quantization import quantize

    torch.manual_seed(0)
    model = tformer.build_model("whisper-digits", max_source_positions=9, num_mel_bins=24).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("bias"):
                parameter.normal_(0, 0.2)
    copied = SpeechModel(model.config)
    copied.load_state_dict(model.state_dict())
    quantized = quantize(copied.eval(), "int8")
    target = torch.tensor([[START, 4, 5], [START, 6, 7]])
    expected = model(audio(), decoder_input_ids=target).logits
    got = quantized(audio(), decoder_input_ids=target).logits
    assert (got - expected).abs().max() < 0.05 * expected.abs().max()
    assert quantized.audio.conv1.weight.dtype == torch.float32
    assert quantized.decoder.blocks[0].cross_attention.keyless_bias.bias.dtype == torch.float32
    quantized.save(tmp_path / "q")
    torch.testing.assert_close(tformer.load(tmp_path / "q")(audio(), decoder_input_ids=target).logits, got,
                               rtol=0, atol=0)
    assert tformer.generate(quantized, audio(), 3).shape == (2, 4)


# ---- audio longer than the window ----------------------------------------------------------------------------

def test_long_audio_is_transcribed_in_consecutive_windows(model):
    """45 frames through an 18-frame window: three windows (18, 18, 9), each decoded alone from the prompt and
    cut at its end token, joined in order; padded to whole windows when a pad value is given."""
    from tformer.generation import audio_windows, transcribe_ids

    features = audio(batch=2, frames=45, seed=8)
    pieces = audio_windows(features, 18)
    assert [piece.shape[-1] for piece in pieces] == [18, 18, 9]
    assert torch.equal(torch.cat(pieces, dim=-1), features)
    options = dict(decoder_prompt_ids=(START, 7), num_beams=2)
    generated = [tformer.generate(model, piece, 5, **options)[:, 2:].tolist() for piece in pieces]
    ends = {END}
    expected = [[], []]
    for window in generated:
        for row, tokens in zip(expected, window, strict=True):
            row.extend(tokens[: next((i for i, t in enumerate(tokens) if t in ends), len(tokens))])
    assert transcribe_ids(model, features, 5, **options) == expected
    padded = audio_windows(features, 18, pad_value=-1.5)
    assert padded[-1].shape[-1] == 18 and bool((padded[-1][..., 9:] == -1.5).all())
    assert len(transcribe_ids(model, features, 5, pad_value=-1.5)) == 2
    with pytest.raises(GenerationError, match="needs a speech model"):
        transcribe_ids(tformer.build_model("gpt-nano"), features)
