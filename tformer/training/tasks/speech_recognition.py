"""Speech recognition: a speech model (Whisper's shape, ``architecture = "speech"``) trained on (audio,
transcript) pairs, scored by its loss and by the word and character error rates of its transcripts of the
evaluation audio.

Each recording is read at 16 kHz, padded with silence to the model's window (``config.input_frames`` frames of
10 ms) and turned into log-mel features once, when the task is prepared (``tformer.data.speech.window_features``:
kept as float32 without the padding's columns, rebuilt exactly for each batch); a recording longer than the
window is refused, never cut. The transcript is its tokens then the end token; the decoder reads it shifted
right behind the start token. A transcript longer than the decoder's positions (``training.seq_len``) is
refused too. The tokenizer is a model folder's or a file's, or learned from the training transcripts: their
characters (``data.tokenizer = "char"``), or their words (``"words"``: one token a word, for a small closed
vocabulary such as spoken digits or commands, where the decoder then writes one token per spoken word).

Training batches are drawn as the encoder tasks draw examples (a seeded permutation an epoch); SpecAugment
(Park et al. 2019) masks ``time_masks`` spans of up to ``time_mask_frames`` frames inside each recording's
audio and ``frequency_masks`` bands of up to ``frequency_mask_bins`` mels, set to 0 as Hugging Face's Whisper
masks them; vocal tract length perturbation (``frequency_warp``, ``tformer.data.log_mel.warp_frequencies``)
first moves each recording's spectrum up or down by a factor drawn from 1 +- frequency_warp, a voice the
training speakers do not have. The draws are made for the global batch from generators seeded by (seed,
position): a batch is a pure function of both, so resume stays bitwise and N processes see what one sees.

WER and CER are summed as ``tformer.evaluation.speech.EditCounts`` (substitutions, deletions, insertions,
reference length) of the normalised transcripts (``normalise_transcript``), which add up over batches and
processes and finalise into the corpus rates, reported in percent.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from tformer.data.audio import AudioError
from tformer.data.files import DataFileError
from tformer.data.log_mel import warp_frequencies
from tformer.data.sources import DataConfig
from tformer.data.speech import (
    AUDIO_COLUMN,
    TEXT_COLUMN,
    LongerThanWindow,
    SpeechData,
    WindowFeatures,
    read_speech_folder,
    read_speech_manifest,
    window_features,
)
from tformer.evaluation.speech import EDIT_STATISTICS, EditCounts, error_counts
from tformer.generation.transcription import transcribe_ids
from tformer.models.base import Seq2SeqModel, shift_right
from tformer.nn.losses import IGNORE_INDEX, ctc_frames_needed, token_cross_entropy
from tformer.tokenizers import CharTokenizer, WordPieceTokenizer
from tformer.tokenizers.pre_tokenizers import WhitespaceSplitPreTokenizer
from tformer.training.config import TrainingConfig, TrainingError
from tformer.training.distributed import ProcessContext
from tformer.training.tasks.base import Batch, TaskData
from tformer.training.tasks.examples import (
    EVAL_WEIGHTS,
    ExampleTask,
    Rows,
    check_special_tokens_agree,
    data_tokenizer,
    model_inputs,
    pad_rows,
    read_splits,
    seeded_generator,
)

ROW_INDEX = "row_index"  # (B,) evaluation batches: each row's utterance, for its reference transcript
UTTERANCE = "utterance"  # a Rows field: the row's recording in its split's features
# A learned vocabulary's special tokens, ids 0-3 (the whisper-digits preset's pad 0, start 1, end 2).
SPEECH_SPECIAL_TOKENS = {"pad": "<pad>", "bos": "<s>", "eos": "</s>", "unk": "<unk>"}
SPEC_AUGMENT_STREAM = 4  # seeded_generator streams: 1 is the epoch permutations
WARP_STREAM = 5
MAX_FREQUENCY_WARP = 0.5
FEATURE_DTYPE = torch.float32  # the cached features: float16 halves memory (FSDD train: 250 -> 125 MB) but
# moves them by up to 5e-4; float32 keeps evaluation's features bit-equal to ``tformer transcribe``'s


@dataclass(frozen=True)
class SpeechRecognitionOptions:
    """The speech_recognition task's [task] settings."""

    time_masks: int = 0  # SpecAugment: time spans masked in each training recording (0: none)
    time_mask_frames: int = 0  # the longest such span, in 10 ms frames
    frequency_masks: int = 0  # SpecAugment: mel bands masked in each training recording (0: none)
    frequency_mask_bins: int = 0  # the widest such band, in mel bins
    frequency_warp: float = 0.0  # vocal tract length perturbation: factors drawn from 1 +- this (0: none)
    eval_wer: bool = True  # transcribe the evaluation audio and report WER and CER
    eval_beams: int = 1  # beams of those evaluation transcripts (1: greedy)

    def __post_init__(self) -> None:
        for key in ("time_masks", "time_mask_frames", "frequency_masks", "frequency_mask_bins"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise TrainingError(f"task.{key}={value!r} must be an integer >= 0")
        for count, width in (("time_masks", "time_mask_frames"), ("frequency_masks", "frequency_mask_bins")):
            if (getattr(self, count) > 0) != (getattr(self, width) > 0):
                raise TrainingError(f"task.{count}={getattr(self, count)} and task.{width}={getattr(self, width)}: "
                                    "SpecAugment needs both (how many masks, and how wide at most), or neither")
        warp = self.frequency_warp
        if isinstance(warp, bool) or not isinstance(warp, int | float) or not 0 <= warp < MAX_FREQUENCY_WARP:
            raise TrainingError(f"task.frequency_warp={warp!r} must be a number from 0 (no warp) to below "
                                f"{MAX_FREQUENCY_WARP} (factors drawn from 1 - it to 1 + it; 0.1 is usual)")
        if isinstance(self.eval_beams, bool) or not isinstance(self.eval_beams, int) or self.eval_beams < 1:
            raise TrainingError(f"task.eval_beams={self.eval_beams!r} must be a positive integer")


class SpeechRecognition(ExampleTask):
    """(audio, transcript) pairs ``train`` (and ``evaluation``) for a speech model, transcripts encoded by
    ``tokenizer`` (with pad, start and end tokens: a model folder's, or a character or word vocabulary learned
    from the training transcripts); WER and CER of ``eval_beams``-beam transcripts reported with the loss when
    ``eval_wer``."""

    name = "speech_recognition"
    unit = "utterances"
    higher_is_better = frozenset()  # eval_wer and eval_cer improve downwards, as the loss
    metric_places = {"eval_wer": 2, "eval_cer": 2}  # percent
    Options = SpeechRecognitionOptions
    data_settings = frozenset({"tokenizer", "columns", "skip_bad", "audio_column", "text_column"})
    learned_tokenizers = ("words",)

    def __init__(self, train: SpeechData, evaluation: SpeechData | None, tokenizer, *, seq_len: int | None = None,
                 time_masks: int = 0, time_mask_frames: int = 0, frequency_masks: int = 0,
                 frequency_mask_bins: int = 0, frequency_warp: float = 0.0, eval_wer: bool = True,
                 eval_beams: int = 1) -> None:
        super().__init__()
        SpeechRecognitionOptions(time_masks, time_mask_frames, frequency_masks, frequency_mask_bins, frequency_warp,
                                 eval_wer, eval_beams)  # checks them
        for role in ("pad", "bos", "eos"):
            if getattr(tokenizer, f"{role}_token_id") is None:
                raise TrainingError(f"the speech_recognition task needs a {role} token; {type(tokenizer).__name__} "
                                    "has none (the learned character vocabulary, data.tokenizer = \"char\", has <pad>, "
                                    "<s>, </s> and <unk>)")
        self.tokenizer = tokenizer
        self.seq_len = seq_len
        self.time_masks, self.time_mask_frames = time_masks, time_mask_frames
        self.frequency_masks, self.frequency_mask_bins = frequency_masks, frequency_mask_bins
        self.frequency_warp = float(frequency_warp)
        self.eval_wer, self.eval_beams = eval_wer, eval_beams
        self.train, self.evaluation = train, evaluation
        self.train_rows = self._encode(train)
        self.eval_rows = None if evaluation is None else self._encode(evaluation)
        self.train_features: WindowFeatures | None = None
        self.eval_features: WindowFeatures | None = None

    def _encode(self, data: SpeechData) -> Rows:
        """The transcripts' token ids and the end token as labels (padded with -100), and each row's recording."""
        ids = self.tokenizer.encode_batch(data.transcripts, add_special_tokens=False)["input_ids"]
        labels = [[*row, self.tokenizer.eos_token_id] for row in ids]
        if self.seq_len is not None:
            for row, tokens in enumerate(labels):
                if len(tokens) > self.seq_len:
                    raise TrainingError(f"{data.origins[row]}: the transcript is {len(tokens)} tokens with its end "
                                        f"token, past training.seq_len={self.seq_len} (the decoder's positions: "
                                        "[model] max_seq_len); a transcript is never cut")
        return pad_rows({"labels": labels}, per_row={UTTERANCE: list(range(len(labels)))},
                        padding={"labels": IGNORE_INDEX})

    # ---- from a recipe --------------------------------------------------------------------------------

    @classmethod
    def from_recipe(cls, data: DataConfig, *, seq_len: int | None, tokenizer=None, label_names=None,
                    time_masks: int = 0, time_mask_frames: int = 0, frequency_masks: int = 0,
                    frequency_mask_bins: int = 0, frequency_warp: float = 0.0, eval_wer: bool = True,
                    eval_beams: int = 1):
        """The task on the manifests (or folders of pairs) a recipe's [data] names; the tokenizer is the model
        folder's, else the file ``data.tokenizer`` names, else the characters ("char") or the words ("words")
        of the training transcripts with <pad>, <s>, </s> and <unk> at ids 0-3."""
        if label_names:
            raise TrainingError("label_names: the speech_recognition task has no labels")
        train, evaluation = read_splits(data, read_pairs, hold_out, "recordings")
        if tokenizer is None and data.tokenizer == "char":
            tokenizer = CharTokenizer.train(train.transcripts, special_tokens=SPEECH_SPECIAL_TOKENS)
        elif tokenizer is None and data.tokenizer == "words":
            tokenizer = learn_word_vocabulary(train.transcripts)
        tokenizer = data_tokenizer(data, cls.name, tokenizer)
        task = cls(train, evaluation, tokenizer, seq_len=seq_len, time_masks=time_masks,
                   time_mask_frames=time_mask_frames, frequency_masks=frequency_masks,
                   frequency_mask_bins=frequency_mask_bins, frequency_warp=frequency_warp, eval_wer=eval_wer,
                   eval_beams=eval_beams)
        return task, TaskData(tokenizer, tokenizer.vocab_size, task.describe())

    def describe(self) -> str:
        """One line: recordings per split."""
        line = f"training {self.train.describe()}"
        return line if self.evaluation is None else f"{line}; evaluation {self.evaluation.describe()}"

    # ---- preparing for a model ----------------------------------------------------------------------------

    def prepare(self, config: TrainingConfig, context: ProcessContext, model: nn.Module) -> None:
        """Check the model reads audio and agrees with the tokenizer, then compute every recording's features
        for its window (once: the batches read them from memory)."""
        super().prepare(config, context, model)
        model_config = model.config
        if not (isinstance(model, Seq2SeqModel) and model.inputs == "audio"):
            raise TrainingError(f"the speech_recognition task trains a speech model (architecture 'speech'), not "
                                f"architecture={model_config.architecture!r}")
        self.check_model_fits(model, self.tokenizer, self.seq_len)
        limit = model.position_limit
        longest = max(int(rows.lengths.max()) for rows in (self.train_rows, self.eval_rows) if rows is not None)
        if limit is not None and longest > limit:
            raise TrainingError(f"a transcript is {longest} tokens with its end token, past the model's "
                                f"max_seq_len={limit} decoder positions")
        check_special_tokens_agree(self.tokenizer, model_config, ("pad", "eos"))
        if model_config.ctc_weight:
            needed = max(int(ctc_frames_needed(model.ctc_targets(rows.fields["labels"])).max())
                         for rows in (self.train_rows, self.eval_rows) if rows is not None)
            if needed > model_config.max_source_positions:
                raise TrainingError(f"a transcript needs {needed} encoder positions for CTC (a token each, a blank "
                                    f"between repeats); the model has max_source_positions="
                                    f"{model_config.max_source_positions} (set ctc_weight = 0, or a longer window)")
        if model.start_token_id != self.tokenizer.bos_token_id:
            raise TrainingError(f"the model starts decoding at id {model.start_token_id} but the tokenizer's start "
                                f"token is id {self.tokenizer.bos_token_id}; set decoder_start_token_id to it (a "
                                "Whisper checkpoint, which starts from its <|startoftranscript|> prompt, is not "
                                "fine-tuned by this task yet)")
        settings = model.log_mel_settings
        known: dict[Path, tuple[Tensor, Tensor]] = {}  # a recording both splits list is computed once
        try:
            self.train_features = window_features(self.train, settings, dtype=FEATURE_DTYPE, known=known)
            if self.evaluation is not None:
                self.eval_features = window_features(self.evaluation, settings, dtype=FEATURE_DTYPE, known=known)
        except LongerThanWindow as error:
            positions = model_config.max_source_positions
            raise TrainingError(f"{error} (the window is 2 x [model] max_source_positions={positions} frames of "
                                "10 ms)") from None
        except AudioError as error:  # a recording tformer cannot read: the file says why
            raise TrainingError(str(error)) from None
        self.frames, self.mels = settings.window_frames, settings.num_mel_bins
        self.model = model  # the plain module transcribes the evaluation audio (not a DDP wrapper)

    @property
    def metrics(self) -> tuple[str, ...]:
        return ("eval_loss", "eval_wer", "eval_cer") if self.eval_wer else ("eval_loss",)

    # ---- training batches -----------------------------------------------------------------------------------

    def train_batch(self, position: int) -> Batch:
        index = self.global_indices(position, len(self.train_rows))  # (G,): every process's rows
        mine = self.local({"index": index, **self._masks(position, index)})
        rows = self.train_rows.select(mine["index"])
        features = self.train_features.batch(rows[UTTERANCE])  # (B, M, F)
        if self.frequency_warp:
            features = warp_frequencies(features, mine["warp"], self.model.log_mel_settings)
        if self.time_masks:
            features = features.masked_fill(mine["time"][:, None, :], 0.0)
        if self.frequency_masks:
            features = features.masked_fill(mine["frequency"][:, :, None], 0.0)
        return self._batch(features, rows["labels"])

    def _masks(self, position: int, index: Tensor) -> dict[str, Tensor]:
        """The augmentations' draws for the global batch at ``position`` (rows ``index`` (G,)): SpecAugment's
        ``time`` (G, F) true on the masked frames, each span inside the recording's own frames (its audio, not
        the padding), and ``frequency`` (G, M) on the masked mel bins; ``warp`` (G,), each row's factor."""
        generator = seeded_generator(self.config.seed, SPEC_AUGMENT_STREAM, position)
        size = index.numel()
        masks = {}
        if self.time_masks:
            lengths = torch.tensor([self.train_features.heads[int(row)].shape[1] for row in index])  # (G,)
            masks["time"] = spans(lengths, self.frames, self.time_masks, self.time_mask_frames, generator)
        if self.frequency_masks:
            masks["frequency"] = spans(torch.full((size,), self.mels), self.mels, self.frequency_masks,
                                       self.frequency_mask_bins, generator)
        if self.frequency_warp:
            draws = torch.rand(size, generator=seeded_generator(self.config.seed, WARP_STREAM, position))
            masks["warp"] = 1.0 + self.frequency_warp * (2.0 * draws - 1.0)
        return masks

    def _batch(self, features: Tensor, labels: Tensor) -> Batch:
        """The model's inputs: features (B, M, F), the labels (B, T) (-100 past each transcript's end) and the
        decoder's inputs, the labels shifted right behind the start token as the model shifts them."""
        start, pad = self.tokenizer.bos_token_id, self.tokenizer.pad_token_id
        return {"input_features": features, "decoder_input_ids": shift_right(labels, start, pad), "labels": labels}

    def loss(self, model: nn.Module, batch: Batch) -> Tensor:
        """The speech model's ``transcript_loss``: the decoder's cross-entropy (smoothed while training, as
        ``training.label_smoothing`` says), mixed with its CTC head's loss when it has one (``ctc_weight``)."""
        smoothing = self.config.label_smoothing if model.training else 0.0
        output = model(**model_inputs(batch, "labels"))
        return self.model.transcript_loss(output.logits, output.ctc_logits, batch["labels"], smoothing)

    # ---- evaluation -------------------------------------------------------------------------------------------

    def eval_batches(self) -> Iterator[Batch]:
        for index, weights in self.eval_row_batches():
            rows = self.eval_rows.select(index)
            batch = self._batch(self.eval_features.batch(rows[UTTERANCE]), rows["labels"])
            yield {**batch, EVAL_WEIGHTS: weights, ROW_INDEX: rows[UTTERANCE]}

    def eval_sums(self, model: nn.Module, batch: Batch) -> dict[str, Tensor | float]:
        weights = batch[EVAL_WEIGHTS]
        labels = batch["labels"]
        output = model(**model_inputs(batch, ROW_INDEX, "labels"))
        losses = token_cross_entropy(output.logits, labels, reduction="none")  # (B, T), the decoder's loss per token
        tokens = (labels != IGNORE_INDEX).float()
        sums: dict[str, Tensor | float] = {"loss": (losses.sum(dim=1) * weights).sum().double(),
                                           "tokens": (tokens.sum(dim=1) * weights).sum()}
        if output.ctc_logits is not None:  # the CTC head's loss, per row (each over its tokens)
            rows = self.model.ctc_loss(output.ctc_logits, labels, reduction="none")  # (B,)
            sums.update({"ctc": (rows * weights).sum().double(), "rows": weights.sum()})
        if self.eval_wer:
            real = weights > 0
            hypotheses = self.transcribe(batch["input_features"][real])
            references = [self.evaluation.transcripts[int(row)] for row in batch[ROW_INDEX][real]]
            for unit, prefix in (("word", "wer"), ("character", "cer")):
                counts = error_counts(hypotheses, references, unit, normalise=True)
                sums.update({f"{prefix}/{number}": float(value) for number, value in enumerate(counts.statistics())})
        return sums

    @torch.no_grad()
    def transcribe(self, features: Tensor) -> list[str]:
        """Transcripts of features (B, M, F) through the shared generation path (greedy or beam search up to
        the decoder's positions), decoded by the tokenizer, special tokens left out."""
        if not len(features):
            return []
        budget = max(1, (self.model.position_limit or 448) - 1)  # every position after the start token
        ids = transcribe_ids(self.model, features, budget, num_beams=self.eval_beams)
        return [self.tokenizer.decode(row, skip_special_tokens=True) for row in ids]

    def finalise(self, totals: dict[str, float]) -> dict[str, float]:
        loss = totals["loss"] / max(totals["tokens"], 1.0)
        if "ctc" in totals:  # the objective the model trains on: the decoder's loss mixed with its CTC head's
            loss = self.model.mix_ctc(loss, totals["ctc"] / max(totals["rows"], 1.0))
        metrics = {"eval_loss": float(loss)}
        if self.eval_wer:
            for prefix in ("wer", "cer"):
                counts = EditCounts.from_statistics([totals[f"{prefix}/{number}"] for number in range(EDIT_STATISTICS)])
                metrics[f"eval_{prefix}"] = 100.0 * counts.rate
        return metrics


def spans(lengths: Tensor, size: int, count: int, widest: int, generator: torch.Generator) -> Tensor:
    """``count`` spans a row, each of a width drawn from 0..``widest`` (capped at the row's length) placed
    uniformly inside the row's first ``lengths`` (G,) places, as a mask (G, ``size``) true inside them."""
    rows = lengths.numel()
    widths = torch.randint(0, widest + 1, (rows, count), generator=generator)  # (G, count)
    widths = torch.minimum(widths, lengths[:, None])
    starts = (torch.rand(rows, count, generator=generator) * (lengths[:, None] - widths + 1)).long()  # (G, count)
    places = torch.arange(size)[None, None, :]  # (1, 1, size)
    inside = (places >= starts[..., None]) & (places < (starts + widths)[..., None])  # (G, count, size)
    return inside.any(dim=1)


def learn_word_vocabulary(transcripts: list[str]) -> WordPieceTokenizer:
    """A tokenizer with every distinct word of ``transcripts`` (split at whitespace, punctuation and case kept)
    as one token, in code point order after <pad>, <s>, </s> and <unk> at ids 0-3. A word it never saw reads
    as <unk>."""
    split = WhitespaceSplitPreTokenizer()
    specials = SPEECH_SPECIAL_TOKENS.values()
    words = sorted({word for transcript in transcripts for word in split(transcript)} - set(specials))
    tokenizer = WordPieceTokenizer([*specials, *words], unk_token=SPEECH_SPECIAL_TOKENS["unk"], lowercase=False,
                                   pre_tokenizer=split, roles=SPEECH_SPECIAL_TOKENS)
    tokenizer.add_special_tokens(SPEECH_SPECIAL_TOKENS)
    return tokenizer


def read_pairs(data: DataConfig, path: str) -> SpeechData:
    """The (audio, transcript) pairs of ``path``: a manifest (records: ``data.audio_column`` holds WAV paths,
    ``data.text_column`` the transcripts) or a folder of NAME.wav + NAME.txt pairs."""
    kind = data.record_format(path)
    data.check_columns(SpeechRecognition.name, path, kind)
    if kind is None:
        if not Path(path).is_dir():
            raise DataFileError(f"{path}: a speech recognition manifest is a .tsv, .csv, .jsonl or .parquet file (or "
                                "a datasets folder) with audio and text columns, or give a folder of NAME.wav + "
                                "NAME.txt pairs")
        return read_speech_folder(path, skip_bad=data.skip_bad)
    return read_speech_manifest(path, format=kind, audio_column=data.audio_column or AUDIO_COLUMN,
                                text_column=data.text_column or TEXT_COLUMN, columns=data.columns,
                                skip_bad=data.skip_bad)


def hold_out(data: SpeechData, keep: int) -> tuple[SpeechData, SpeechData]:
    """The first ``keep`` recordings, and the rest (held out for evaluation)."""
    return data.subset(slice(None, keep)), data.subset(slice(keep, None))
