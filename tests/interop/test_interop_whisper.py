"""Whisper (WhisperForConditionalGeneration) in and out: the same random weights give Hugging Face's logits
(with and without a padded transcript), its greedy and beam-search transcripts token for token under the
decoder prompt and the suppressed tokens, and a folder tformer writes loads in ``from_pretrained`` with the
same logits; the Whisper tokenizer read from its tokenizer.json gives Hugging Face's ids; whisper-tiny has
Hugging Face's parameter count."""

import json

import pytest
import torch

import tformer
from tformer.checkpoint import CheckpointError
from tformer.interop import family_for_model_type
from tformer.models.speech import whisper_prompt

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.slow  # compares with transformers

VOCAB = 101
EOT, SOT, EN, DE, TRANSLATE, TRANSCRIBE, NOTIMESTAMPS = range(94, 101)
PROMPT = (SOT, EN, TRANSCRIBE, NOTIMESTAMPS)

# Odd sizes (a width of 6 heads x 7, an 11-position window, decoders deeper than encoders) and both mel counts.
SHAPES = {
    "80-mels": dict(num_mel_bins=80, d_model=42, encoder_layers=2, decoder_layers=3, encoder_attention_heads=6,
                    decoder_attention_heads=6, encoder_ffn_dim=54, decoder_ffn_dim=54, max_source_positions=11,
                    max_target_positions=40),
    "128-mels": dict(num_mel_bins=128, d_model=30, encoder_layers=1, decoder_layers=2, encoder_attention_heads=5,
                     decoder_attention_heads=5, encoder_ffn_dim=70, decoder_ffn_dim=70, max_source_positions=13,
                     max_target_positions=24),
}


def _hf_model(shape: dict, **changes):
    torch.manual_seed(0)
    config = transformers.WhisperConfig(
        vocab_size=VOCAB, pad_token_id=EOT, bos_token_id=EOT, eos_token_id=EOT, decoder_start_token_id=SOT,
        suppress_tokens=[], begin_suppress_tokens=[EOT], init_std=0.3, **{**shape, **changes})
    hf = transformers.WhisperForConditionalGeneration(config).eval()
    with torch.no_grad():  # biases start at zero; a mapping that lost one (a value or query bias) would go unseen
        for name, parameter in hf.named_parameters():
            if name.endswith("bias"):
                parameter.normal_(0, 0.2)
    generation = hf.generation_config
    generation.lang_to_id = {"<|en|>": EN, "<|de|>": DE}
    generation.task_to_id = {"transcribe": TRANSCRIBE, "translate": TRANSLATE}
    generation.no_timestamps_token_id = NOTIMESTAMPS
    generation.is_multilingual = True
    return hf


@pytest.fixture(scope="module", params=list(SHAPES))
def models(request, tmp_path_factory):
    hf = _hf_model(SHAPES[request.param])
    folder = tmp_path_factory.mktemp(f"hf-whisper-{request.param}")
    hf.save_pretrained(folder)
    return hf, tformer.load(folder).eval()


def features(hf, batch: int = 2, seed: int = 1) -> torch.Tensor:
    """Log-mel-like features filling the window exactly (Hugging Face refuses any other length)."""
    config = hf.config
    return torch.randn(batch, config.num_mel_bins, 2 * config.max_source_positions,
                       generator=torch.Generator().manual_seed(seed))


def test_the_config_reads_whispers_fields(models):
    hf, ours = models
    config = ours.config
    assert config.architecture == "speech" and type(ours).__name__ == "SpeechModel"
    expected = hf.config
    assert (config.num_mel_bins, config.max_source_positions) == (expected.num_mel_bins, expected.max_source_positions)
    assert (config.num_encoder_layers, config.num_layers) == (hf.config.encoder_layers, hf.config.decoder_layers)
    assert (config.key_bias, config.decoder_start_token_id, config.eos_token_id) == (False, SOT, EOT)
    assert (config.suppress_tokens, config.begin_suppress_tokens) == ((), (EOT,))
    assert ours.num_parameters() == sum(p.numel() for p in hf.parameters())


def test_logits_equal_hugging_face_with_and_without_a_padded_transcript(models):
    hf, ours = models
    audio = features(hf)
    target = torch.randint(0, EOT, (2, 7), generator=torch.Generator().manual_seed(2))
    target[:, :4] = torch.tensor(PROMPT)
    with torch.no_grad():
        expected = hf(input_features=audio, decoder_input_ids=target).logits
        got = ours(audio, decoder_input_ids=target).logits
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    mask = torch.ones_like(target)
    mask[1, 5:] = 0  # the second transcript is 5 tokens, right-padded
    with torch.no_grad():
        expected = hf(input_features=audio, decoder_input_ids=target, decoder_attention_mask=mask).logits
        got = ours(audio, decoder_input_ids=target, decoder_attention_mask=mask).logits
    real = mask.bool()  # padded positions are nobody's prediction
    torch.testing.assert_close(got[real], expected[real], rtol=1e-5, atol=1e-5)


def test_the_loss_is_hugging_faces(models):
    hf, ours = models
    audio = features(hf)
    labels = torch.randint(0, EOT, (2, 6), generator=torch.Generator().manual_seed(5))
    labels[0, 4:] = -100
    with torch.no_grad():
        expected = hf(input_features=audio, labels=labels)
        got = ours(audio, labels=labels)
    torch.testing.assert_close(got.logits, expected.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.loss, expected.loss, rtol=1e-5, atol=1e-5)


def _suppressions(ours, audio) -> tuple[list[int], list[int]]:
    """Tokens to suppress that the unsuppressed greedy transcript uses (so suppression changes the answer): its
    two most frequent new tokens always, its first new token at the beginning."""
    plain = tformer.generate(ours, audio, 8, decoder_prompt_ids=PROMPT, suppress_tokens=(),
                             begin_suppress_tokens=())[:, len(PROMPT):]
    counts = torch.bincount(plain.flatten(), minlength=VOCAB)
    counts[EOT] = 0
    frequent = counts.topk(2).indices.tolist()
    return frequent, [int(plain[0, 0]), EOT]


@pytest.mark.parametrize("num_beams", [1, 4], ids=["greedy", "beam-4"])
def test_transcripts_equal_hugging_face_generate(models, num_beams):
    """HF's prompt from language and task, ours from decoder_prompt_ids; the suppressed tokens through both
    generation configs; an end token these weights produce, so that a row ends early."""
    hf, ours = models
    audio = features(hf, batch=3, seed=7)
    suppress, begin_suppress = _suppressions(ours, audio)
    options = dict(suppress_tokens=tuple(suppress), begin_suppress_tokens=tuple(begin_suppress))
    ends = [EOT, int(tformer.generate(ours, audio, 5, decoder_prompt_ids=PROMPT, **options)[0, -1])]
    hf.generation_config.suppress_tokens = suppress
    hf.generation_config.begin_suppress_tokens = begin_suppress
    expected = hf.generate(audio, language="en", task="transcribe", max_new_tokens=12, num_beams=num_beams,
                           do_sample=False, eos_token_id=ends, return_dict_in_generate=True, output_scores=True)
    got = tformer.generate(ours, audio, 12, decoder_prompt_ids=PROMPT, num_beams=num_beams, eos_token_id=ends,
                           return_dict=True, output_scores=True, **options)
    assert torch.equal(got.sequences, expected.sequences)
    if num_beams == 1:  # the first row ends within its first 5 new tokens: later columns are padding (EOT)
        first_row = got.sequences[0, len(PROMPT):].tolist()
        assert ends[1] in first_row[:5] and set(first_row[first_row.index(ends[1]) + 1:]) <= {EOT}
    generated = got.sequences[:, len(PROMPT):]
    assert not torch.isin(generated, torch.tensor(suppress)).any()
    assert not torch.isin(generated[:, 0], torch.tensor(begin_suppress)).any()
    if num_beams == 1:
        torch.testing.assert_close(torch.stack(got.scores), torch.stack(expected.scores), rtol=1e-4, atol=1e-4)
    else:
        torch.testing.assert_close(got.sequences_scores, expected.sequences_scores, rtol=1e-4, atol=1e-4)


def test_the_configs_suppressions_are_generations_defaults(tmp_path):
    """suppress_tokens and begin_suppress_tokens read from config.json apply without being asked for."""
    hf = _hf_model(SHAPES["80-mels"])
    audio = features(hf, batch=2, seed=9)
    hf.save_pretrained(tmp_path / "plain")
    suppress, begin_suppress = _suppressions(tformer.load(tmp_path / "plain").eval(), audio)
    hf.config.suppress_tokens = hf.generation_config.suppress_tokens = suppress
    hf.config.begin_suppress_tokens = hf.generation_config.begin_suppress_tokens = begin_suppress
    hf.save_pretrained(tmp_path / "suppressing")
    ours = tformer.load(tmp_path / "suppressing").eval()
    assert (list(ours.config.suppress_tokens), list(ours.config.begin_suppress_tokens)) == (suppress, begin_suppress)
    expected = hf.generate(audio, language="en", task="transcribe", max_new_tokens=8)  # the new tokens alone
    assert torch.equal(tformer.generate(ours, audio, 8, decoder_prompt_ids=PROMPT)[:, len(PROMPT):], expected)


def test_whisper_suppressions_in_generation_config_decode_as_hugging_face(tmp_path):
    """suppress_tokens / begin_suppress_tokens in generation_config.json alone (config.json's are empty)."""
    hf = _hf_model(SHAPES["80-mels"])
    hf.save_pretrained(tmp_path / "plain")
    audio = features(hf)
    suppress, begin_suppress = _suppressions(tformer.load(tmp_path / "plain").eval(), audio)
    hf.generation_config.suppress_tokens = suppress
    hf.generation_config.begin_suppress_tokens = begin_suppress
    hf.save_pretrained(tmp_path / "suppressing")
    assert json.loads((tmp_path / "suppressing" / "config.json").read_text())["suppress_tokens"] == []
    ours = tformer.load(tmp_path / "suppressing").eval()
    assert ours.config.suppress_tokens == ()  # config.json's: the file's win, as in Hugging Face
    expected = hf.generate(audio, language="en", task="transcribe", max_new_tokens=8)  # the generation config saved
    got = tformer.generate(ours, audio, 8, decoder_prompt_ids=PROMPT)[:, len(PROMPT):]
    assert torch.equal(got, expected)
    assert not torch.isin(got, torch.tensor(suppress)).any()


def test_a_saved_folder_loads_in_hugging_face_with_the_same_logits(models, tmp_path):
    hf, ours = models
    ours.save(tmp_path / "out", format="hf")
    raw = json.loads((tmp_path / "out" / "config.json").read_text())
    assert raw["architectures"] == ["WhisperForConditionalGeneration"] and raw["model_type"] == "whisper"
    again = transformers.WhisperForConditionalGeneration.from_pretrained(tmp_path / "out").eval()
    audio = features(hf)
    target = torch.tensor([list(PROMPT) + [3, 4], list(PROMPT) + [5, 6]])
    with torch.no_grad():
        torch.testing.assert_close(again(input_features=audio, decoder_input_ids=target).logits,
                                   hf(input_features=audio, decoder_input_ids=target).logits, rtol=1e-5, atol=1e-5)
    reloaded = tformer.load(tmp_path / "out").eval()
    assert reloaded.config == ours.config
    for name, tensor in ours.state_dict().items():
        assert torch.equal(reloaded.state_dict()[name], tensor), name


def test_a_fresh_tformer_model_saves_as_whisper(tmp_path):
    """A model built from a preset (its fresh sinusoids included) is the same function in Hugging Face."""
    ours = tformer.build_model("whisper-digits", max_source_positions=20).eval()
    with torch.no_grad():
        for parameter in ours.parameters():
            if parameter.requires_grad:
                parameter.normal_(0, 0.1)
    ours.save(tmp_path / "out", format="hf")
    hf = transformers.WhisperForConditionalGeneration.from_pretrained(tmp_path / "out").eval()
    fresh = transformers.WhisperForConditionalGeneration(hf.config)
    assert torch.equal(fresh.model.encoder.embed_positions.weight, ours.audio.positions.weight)
    audio = torch.randn(2, 80, 40)
    target = torch.tensor([[1, 5, 6, 7], [1, 8, 9, 10]])
    with torch.no_grad():
        torch.testing.assert_close(ours(audio, decoder_input_ids=target).logits,
                                   hf(input_features=audio, decoder_input_ids=target).logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("changes, reason", [
    ({"scale_embedding": True}, "scale_embedding=True"),
    ({"decoder_attention_heads": 3}, "decoder_attention_heads=3"),
    ({"decoder_ffn_dim": 60}, "decoder_ffn_dim=60"),
    ({"activation_dropout": 0.1}, "activation_dropout=0.1"),
    ({"activation_function": "tanh"}, "activation_function='tanh'"),
])
def test_variants_tformer_cannot_run_are_refused(tmp_path, changes, reason):
    hf = _hf_model(SHAPES["80-mels"], **changes)
    hf.save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match=reason.replace("(", r"\(")):
        tformer.load(tmp_path)


def test_configs_whisper_cannot_hold_are_refused_on_save(tmp_path):
    family = family_for_model_type("whisper")
    config = tformer.PRESETS["whisper-digits"]
    assert family.mismatches(config) == []
    assert "key_bias=True (needs False)" in family.mismatches(config.replace(key_bias=True))
    assert "norm_position='post' (needs 'pre')" in family.mismatches(config.replace(norm_position="post"))
    assert ("feature_normalization='utterance' (needs 'none': not a whisper setting)"
            in family.mismatches(config.replace(feature_normalization="utterance")))
    assert "ctc_weight=0.3 (needs 0.0: not a whisper setting)" in family.mismatches(config.replace(ctc_weight=0.3))
    assert any(reason.startswith("positional='sinusoidal'")
               for reason in family.mismatches(config.replace(positional="sinusoidal")))
    with pytest.raises(CheckpointError, match="no Hugging Face equivalent"):
        tformer.build_model(config.replace(norm="rmsnorm")).save(tmp_path / "out", format="hf")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("preset, shape", [
    ("whisper-tiny", {}),  # WhisperConfig's defaults are tiny's
    ("whisper-base", dict(d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
                          decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048)),
])
def test_the_presets_have_hugging_faces_parameter_counts(preset, shape):
    with torch.device("meta"):
        hf = transformers.WhisperForConditionalGeneration(transformers.WhisperConfig(**shape))
        ours = tformer.build_model(preset)
    assert sum(p.numel() for p in hf.parameters()) == ours.num_parameters()
    if preset == "whisper-tiny":
        assert ours.num_parameters() == 37_760_640


# ---- the tokenizer ------------------------------------------------------------------------------------------

# Whisper's order (HF's prefix numbers a language <|startoftranscript|> + 1 + its index: en, zh, de, ...).
SPECIALS = ["<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|zh|>", "<|de|>", "<|translate|>", "<|transcribe|>",
            "<|startoflm|>", "<|startofprev|>", "<|nocaptions|>", "<|notimestamps|>"]
TEXTS = [
    "the cat sat<|en|> on  the mat",
    "<|startoftranscript|><|de|><|translate|> hello\nworld  ",
    "<|zh|>中文<|transcribe|>",
    "ünïcödé 日本 <|endoftext|>x",
    "  leading spaces and trailing ",
    "a<|notimestamps|>b<|nocaptions|>the<|startofprev|> other",
    "",
]


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    """Hugging Face's WhisperTokenizer over a small byte-level vocabulary with Whisper's special tokens and
    an English transcription prefix, saved as tokenizer.json, and tformer's loaded from that file."""
    from tokenizers.pre_tokenizers import ByteLevel

    vocab = {character: index for index, character in enumerate(sorted(ByteLevel.alphabet()))}
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a"), ("e", "r"), ("o", "n"), ("Ġ", "s"),
              ("a", "t"), ("Ġc", "at")]
    vocab["Ġc"] = len(vocab)
    for left, right in merges:
        vocab[left + right] = len(vocab)
    hf = transformers.WhisperTokenizer(vocab=vocab, merges=merges)
    hf.add_special_tokens({"additional_special_tokens": SPECIALS[1:]})
    hf.set_prefix_tokens(language="en", task="transcribe")
    folder = tmp_path_factory.mktemp("whisper-tokenizer")
    hf.save_pretrained(folder)
    return hf, tformer.tokenizers.load(folder / "tokenizer.json")


@pytest.mark.parametrize("text", TEXTS)
def test_tokenizer_ids_equal_hugging_faces(tokenizers, text):
    hf, ours = tokenizers
    for special in (True, False):
        assert ours.encode(text, add_special_tokens=special) == hf(text, add_special_tokens=special).input_ids
    ids = hf(text).input_ids
    for skip in (True, False):
        assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)


def test_the_decoder_prompt_is_hugging_faces_prefix(tokenizers):
    hf, ours = tokenizers
    assert list(whisper_prompt(ours, "en", "transcribe")) == hf.prefix_tokens
    hf.set_prefix_tokens(language="de", task="translate", predict_timestamps=True)
    try:
        assert list(whisper_prompt(ours, "de", "translate", timestamps=True)) == hf.prefix_tokens
    finally:
        hf.set_prefix_tokens(language="en", task="transcribe", predict_timestamps=False)
    assert whisper_prompt(ours, None, None) == (ours.token_to_id("<|startoftranscript|>"),
                                                ours.token_to_id("<|notimestamps|>"))
    with pytest.raises(ValueError, match=r"no <\|fr\|> token"):
        whisper_prompt(ours, "fr")
    with pytest.raises(ValueError, match="task='summarise'"):
        whisper_prompt(ours, "en", "summarise")
