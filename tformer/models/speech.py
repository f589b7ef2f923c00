"""SpeechModel: Whisper (Radford et al. 2022) on the shared core: log-mel frames through a two-convolution
stem and fixed sinusoids into a bidirectional encoder stack; the encoder-decoder's causal decoder stack,
cross-attending to it, writes the transcript's tokens through an output tied to its token table.

Speech fields (``architecture="speech"``, Whisper's shape): log-mel features of ``num_mel_bins`` channels
pass a two-convolution stem (the second of stride 2) and fixed sinusoids over ``max_source_positions``
positions into an encoder of ``num_encoder_layers`` blocks; so the model reads at most ``input_frames`` =
2 x ``max_source_positions`` frames at once (Whisper's 30 s window: 1500 positions, 3000 frames of 10 ms; a
model for short utterances sets a shorter window). ``feature_normalization="utterance"`` normalises each
window of a recording (``tformer.data.log_mel.normalize_windows``) for a model trained that way from scratch;
Whisper's checkpoints read the features as they are (``"none"``). ``ctc_weight`` in (0, 1) gives the encoder
a CTC head trained beside the decoder (loss: ``(1 - ctc_weight)`` x the decoder's + ``ctc_weight`` x CTC's),
which makes a model trained from scratch align its audio sooner; decoding never reads it. Its decoder is an
encoder-decoder's (``num_layers`` blocks, ``max_seq_len`` positions, ``decoder_start_token_id``), with the
output tied to its token table.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor, nn

from tformer.config import (
    GENERATION_DEFAULT_FIELDS,
    TOKEN_FIELDS,
    ConfigError,
    ModelConfig,
    require_positive_int,
    require_token_ids,
)
from tformer.data.log_mel import NORMALIZATIONS, LogMelSettings
from tformer.models.base import Seq2SeqModel
from tformer.models.encoder_decoder import EncoderDecoderLM
from tformer.models.output import GenerationState, Seq2SeqOutput
from tformer.models.registry import register
from tformer.nn.audio import AudioEmbedding
from tformer.nn.block import LayerCache
from tformer.nn.embeddings import TokenEmbedding
from tformer.nn.heads import LMHead
from tformer.nn.losses import IGNORE_INDEX, ctc_loss, token_cross_entropy
from tformer.nn.stack import TransformerStack

# num_mel_bins: log-mel channels of the audio input; max_source_positions: encoder positions (the input window
# is twice as many frames).
SPEECH_FIELDS = ("num_encoder_layers", "decoder_start_token_id", "num_mel_bins", "max_source_positions",
                 "feature_normalization", "ctc_weight")


def check_speech_config(config: ModelConfig) -> None:
    """The audio input: ``num_mel_bins`` channels, at most ``2 * max_source_positions`` frames (the stem's
    second convolution halves them); the fixed sinusoids need an even width of at least 4."""
    for name in ("num_mel_bins", "max_source_positions", "num_encoder_layers"):
        require_positive_int(name, getattr(config, name))
    if config.d_model % 2 or config.d_model < 4:
        raise ConfigError(f"d_model={config.d_model} must be even and >= 4 for architecture='speech' (the "
                          "encoder's fixed sinusoids: a sine and a cosine half, at least two frequencies each)")
    require_token_ids(config, ("decoder_start_token_id", "forced_eos_token_id"))
    if config.feature_normalization not in NORMALIZATIONS:
        raise ConfigError(f"feature_normalization={config.feature_normalization!r} is not one of "
                          f"{', '.join(NORMALIZATIONS)}")
    weight = config.ctc_weight
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not 0.0 <= weight < 1.0:
        raise ConfigError(f"ctc_weight={weight!r} must be a number in [0, 1) (0: no CTC head; 0.3 is usual)")
    if weight and (config.pad_token_id is None or config.eos_token_id is None):
        raise ConfigError(f"ctc_weight={weight!r} needs pad_token_id (the CTC blank) and eos_token_id (left out of "
                          "CTC's targets)")


def _whisper(d_model: int, num_layers: int, num_heads: int, **fields: Any) -> dict[str, Any]:
    """A Whisper-shaped speech model with ``num_layers`` blocks on each side (Hugging Face's WhisperConfig)."""
    return {
        "vocab_size": 51865, "max_seq_len": 448, "d_model": d_model, "num_layers": num_layers,
        "num_encoder_layers": num_layers, "num_heads": num_heads, "activation": "gelu", "norm": "layernorm",
        "norm_position": "pre", "positional": "learned", "key_bias": False, "num_mel_bins": 80,
        "max_source_positions": 1500, "pad_token_id": 50257, "bos_token_id": 50257, "eos_token_id": 50257,
        "decoder_start_token_id": 50258, "begin_suppress_tokens": (220, 50257), **fields,
    }


SPEECH_PRESETS = {
    # Whisper (Radford et al. 2022) as Hugging Face's WhisperForConditionalGeneration holds it: pre-norm, exact
    # GELU, no key bias, the multilingual vocabulary (<|endoftext|> 50257, <|startoftranscript|> 50258), 80 mels,
    # a 30 s window (1500 positions), 448 decoder positions. whisper-tiny has 37,760,640 parameters as Hugging
    # Face counts them (the encoder's fixed sinusoids included). The Hub folders also carry the suppress_tokens
    # lists, read on load; these shapes carry only begin_suppress_tokens (" " and <|endoftext|>).
    "whisper-tiny": _whisper(384, 4, 6),
    "whisper-base": _whisper(512, 6, 8),
    # A from-scratch recipe on spoken digits (FSDD: single words, under 2 s): Whisper's layout at 3.3M
    # parameters, a 3 s window (150 positions, 300 frames) instead of 30 s, so a batch of short utterances
    # costs a tenth of the attention, and a character vocabulary of 32 (0 pad, 1 start, 2 end, then characters)
    # with 32 decoder positions (a prompt and a spoken number's letters).
    "whisper-digits": _whisper(192, 3, 4, vocab_size=32, max_seq_len=32, max_source_positions=150, pad_token_id=0,
                               bos_token_id=1, eos_token_id=2, decoder_start_token_id=1, begin_suppress_tokens=()),
}


@register("speech", fields=(*TOKEN_FIELDS, *GENERATION_DEFAULT_FIELDS, *SPEECH_FIELDS), check=check_speech_config,
          presets=SPEECH_PRESETS,  # the encoder over the audio window, the decoder over the transcript
          longest_sequence=lambda config: max(config.max_source_positions, config.max_seq_len))
class SpeechModel(EncoderDecoderLM):
    """``audio`` (``AudioEmbedding``: conv stem + sinusoids) -> ``encoder`` stack (its final norm) over
    (B, S, D); ``embedding`` (tokens; the decoder's positions are its stack's) -> ``decoder`` stack (causal,
    cross-attending) -> ``lm_head`` tied to the token table.

    The encoder has no padding mask, as Whisper: short audio is read as it is (or padded with the log-mel of
    silence, as the feature extractor pads to the window); audio longer than the window
    (``config.input_frames``) is refused, to be transcribed in consecutive windows. The decoding hooks are the
    encoder-decoder's (its ``step``, ``new_cache`` and ``decode``): generation encodes the audio once and
    decodes with self-attention and cross-attention caches like any encoder-decoder.
    """

    inputs = "audio"

    @classmethod
    def describe_inputs(cls, config: ModelConfig) -> str:
        frames = config.input_frames
        normalised = ", each window normalised" if config.feature_normalization == "utterance" else ""
        return (f"audio in windows of {frames / 100:g} s ({config.num_mel_bins} mels x {frames} frames{normalised}), "
                f"{config.max_seq_len} decoder positions")

    @property
    def log_mel_settings(self) -> LogMelSettings:
        """The features this model reads: ``num_mel_bins`` mels of 16 kHz audio every 10 ms, its window
        ``config.input_frames`` frames of audio (``window_samples``), each window normalised as
        ``config.feature_normalization`` says."""
        hop = LogMelSettings.hop_length
        return LogMelSettings(num_mel_bins=self.config.num_mel_bins, window_samples=self.config.input_frames * hop,
                              normalization=self.config.feature_normalization)

    def __init__(self, config: ModelConfig) -> None:
        Seq2SeqModel.__init__(self, config)  # the base's, not the encoder-decoder's: this front end is audio
        self.audio = AudioEmbedding(config.num_mel_bins, config.d_model, config.max_source_positions)
        self.encoder = TransformerStack(config.replace(num_layers=config.num_encoder_layers), causal=False,
                                        add_positions=False)
        self.embedding = TokenEmbedding.from_config(config)
        self.decoder = TransformerStack(config, causal=True, cross_attention=True)
        self.lm_head = LMHead(config.d_model, config.vocab_size)
        # CTC over the encoder's positions, its blank the pad token (never a transcript's)
        self.ctc_head = nn.Linear(config.d_model, config.vocab_size) if config.ctc_weight else None
        self.init_weights()
        if config.tie_embeddings:
            self.lm_head.weight = self.embedding.token.weight

    def init_weights(self) -> None:
        """The base's, the convolutions He-initialised (zero bias), and the position table Whisper's sinusoids.

        Hugging Face draws the convolutions like the linear layers, normal(0, 0.02): a fresh stem then writes
        vectors of standard deviation about 0.02 under sinusoids of 0.65, so a model trained from scratch
        starts out reading positions and little of the audio (its loss sat at the transcripts' prior for a
        thousand steps on spoken digits). He's normal keeps the stem's output near the sinusoids' scale.
        (A checkpoint's weights replace these.)"""
        super().init_weights()
        for conv in (self.audio.conv1, self.audio.conv2):
            nn.init.kaiming_normal_(conv.weight, nonlinearity="relu")
            nn.init.zeros_(conv.bias)
        self.audio.reset_positions()

    # ---- the encoder ---------------------------------------------------------------------------------

    def encode(self, input_features: Tensor, output_attentions: bool = False, output_hidden_states: bool = False):
        """Log-mel features (B, M, F), F <= ``config.input_frames`` -> the encoder's StackOutput, hidden
        (B, ceil(F / 2), D)."""
        return self.encoder(self.audio(input_features), output_attentions=output_attentions,
                            output_hidden_states=output_hidden_states)

    # ---- forward -------------------------------------------------------------------------------------------

    def forward(
        self,
        input_features: Tensor,
        decoder_input_ids: Tensor | None = None,
        decoder_attention_mask: Tensor | None = None,
        labels: Tensor | None = None,
        cache: list[LayerCache] | None = None,
        encoder_output: Tensor | None = None,
        attention_mask: Tensor | None = None,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
    ) -> Seq2SeqOutput:
        """Training and scoring: ``input_features`` (B, M, F) log-mel frames; the transcript as
        ``decoder_input_ids`` (B, T) (``decoder_attention_mask`` 1 = token), or as ``labels`` (B, T) that the
        decoder reads shifted right behind the start token (-100: ignored by the loss, read as padding).
        Logits (B, T, V).

        A generation step (the Session protocol): given ``encoder_output`` (B, S, D), the first argument holds
        the decoder's tokens after the cached ones and ``attention_mask`` covers the cached ones too."""
        encoder_attentions = None
        generation_step = encoder_output is not None
        if generation_step:
            decoder_input_ids = self.decoder_tokens(input_features, decoder_input_ids, labels, True)
            decoder_attention_mask = attention_mask
        else:
            if attention_mask is not None:
                raise ValueError("a speech model's encoder reads every frame (Whisper has no audio attention_mask); "
                                 "give the transcript's padding as decoder_attention_mask")
            decoder_input_ids = self.decoder_tokens(None, decoder_input_ids, labels, False)
            encoded = self.encode(input_features, output_attentions)
            encoder_output, encoder_attentions = encoded.hidden, encoded.attentions
        decoded = self.decode(decoder_input_ids, encoder_output, None, decoder_attention_mask, cache,
                              output_attentions, output_hidden_states)
        logits = self.lm_head(decoded.hidden)  # (B, T, V)
        ctc_logits = None if generation_step or self.ctc_head is None else self.ctc_head(encoder_output)  # (B, S, V)
        loss = None if labels is None else self.transcript_loss(logits, ctc_logits, labels)
        return Seq2SeqOutput(
            logits=logits, loss=loss, attentions=decoded.attentions, hidden_states=decoded.hidden_states,
            cache=cache, encoder_output=encoder_output, cross_attentions=decoded.cross_attentions,
            encoder_attentions=encoder_attentions, ctc_logits=ctc_logits,
        )

    def transcript_loss(self, logits: Tensor, ctc_logits: Tensor | None, labels: Tensor,
                        label_smoothing: float = 0.0) -> Tensor:
        """The training objective for ``labels`` (B, T) (the transcript, its end token, -100 past it): the
        decoder's token cross-entropy of logits (B, T, V); with a CTC head, mixed (``mix_ctc``) with the CTC
        loss of ``ctc_logits`` (B, S, V) against the transcript without its end token (Watanabe et al. 2017's
        hybrid objective; label smoothing is the decoder's only)."""
        loss = token_cross_entropy(logits, labels, label_smoothing)
        if self.ctc_head is None:
            return loss
        if ctc_logits is None:
            raise ValueError("this model has a CTC head (ctc_weight > 0): its loss needs the forward's ctc_logits")
        return self.mix_ctc(loss, self.ctc_loss(ctc_logits, labels))

    def ctc_loss(self, ctc_logits: Tensor, labels: Tensor, reduction: str = "mean") -> Tensor:
        """The CTC head's loss of ``ctc_logits`` (B, S, V) against ``labels`` (B, T): the transcript without its
        end token (``ctc_targets``), the pad token as the blank; ``reduction`` as ``nn.losses.ctc_loss``."""
        return ctc_loss(ctc_logits, self.ctc_targets(labels), blank=self.config.pad_token_id, reduction=reduction)

    def mix_ctc(self, decoder_loss: Tensor, ctc: Tensor) -> Tensor:
        """``(1 - ctc_weight)`` x the decoder's loss + ``ctc_weight`` x the CTC head's."""
        weight = self.config.ctc_weight
        return (1.0 - weight) * decoder_loss + weight * ctc

    def ctc_targets(self, labels: Tensor) -> Tensor:
        """CTC's targets (B, T): the transcript's tokens of ``labels``, the end token left out (-100)."""
        return labels.masked_fill(labels == self.config.eos_token_id, IGNORE_INDEX)

    # ---- generation hooks (the Session protocol: tformer/generation/session.py) ----------------------------

    prompt_is_tokens = False  # its prompt is log-mel features

    def check_generation_input(self, inputs: object, attention_mask: object) -> str | None:
        """Why ``generate`` cannot take ``inputs`` as this model's prompt (log-mel features (B, M, F) within
        the window, no attention_mask), or None."""
        if attention_mask is not None:
            return "a speech model reads every frame of its input_features: give no attention_mask"
        return self.audio.problem(inputs)

    def prepare_generation(self, input_features: Tensor, attention_mask: Tensor | None = None,
                           decoder_prompt: Sequence[int] | None = None) -> GenerationState:
        """Encode the audio once; the decoder starts from ``decoder_prompt`` (Whisper's <|startoftranscript|>,
        language, task, <|notimestamps|>: ``whisper_prompt``), else the start token, and every step reads the
        encoder's output (reordered with the rows by beam search)."""
        if attention_mask is not None:
            raise ValueError("a speech model reads every frame of its input_features: give no attention_mask")
        start = self.decoder_start(input_features.shape[0], input_features.device, decoder_prompt)
        return GenerationState(input_ids=start, step_inputs={"encoder_output": self.encode(input_features).hidden})

    def encoded_source(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        raise TypeError("a speech model encodes input_features (prepare_generation), not token ids")



WHISPER_TASKS = ("transcribe", "translate")


def whisper_prompt(tokenizer, language: str | None = None, task: str | None = "transcribe",
                   timestamps: bool = False) -> tuple[int, ...]:
    """Whisper's decoder prompt as token ids of ``tokenizer``: <|startoftranscript|>, then <|language|> (a code
    such as "en", or the token itself) when given, <|task|> (``WHISPER_TASKS``) when given, and
    <|notimestamps|> unless ``timestamps``. A multilingual model is prompted with a language (tformer does no
    language detection); an English-only one with none and no task. Give it to ``generate`` as
    ``decoder_prompt_ids``. A token the tokenizer lacks is a ValueError naming it."""
    if task is not None and task not in WHISPER_TASKS:
        raise ValueError(f"task={task!r} is not one of {', '.join(WHISPER_TASKS)} (or None)")
    tokens = ["<|startoftranscript|>"]
    if language is not None:
        tokens.append(language if language.startswith("<|") else f"<|{language.lower()}|>")
    if task is not None:
        tokens.append(f"<|{task}|>")
    if not timestamps:
        tokens.append("<|notimestamps|>")
    ids = [tokenizer.token_to_id(token) for token in tokens]
    missing = [token for token, token_id in zip(tokens, ids, strict=True) if token_id is None]
    if missing:
        raise ValueError(f"the tokenizer has no {', '.join(missing)} token (not a Whisper tokenizer, or a language "
                         "this model does not know)")
    return tuple(ids)
