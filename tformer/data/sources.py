"""Where a language model's training tokens come from: the ``[data]`` section of a recipe.

Raw UTF-8 text (``.txt``, or gzip-compressed ``.gz``) is tokenized at load time, with a
character tokenizer trained on it or a saved ``tokenizer.json``. Token files are memory-mapped
and read only where a batch falls: those ``tformer tokenize`` writes (``data.bin`` with its
``data.bin.json`` header) and plain ``.npy`` arrays of ids.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tformer.data.files import DataFileError, read_data_text
from tformer.data.lm import Tokens, num_tokens, split_tokens
from tformer.data.parallel import corpus_file
from tformer.data.records import RECORD_FORMATS, record_format, record_lines
from tformer.data.token_file import TokenFileError, header_path, read_token_file, read_token_header
from tformer.errors import TformerError
from tformer.tokenizers import CharTokenizer
from tformer.tokenizers import load as load_tokenizer

DATA_FORMATS = ("auto", "text", "tokens", "npy", *RECORD_FORMATS, "conll", "squad", "idx", "image_folder", "npz")
# jsonl, csv, tsv, parquet, datasets: records (tformer.data.records), read by every task; conll: token
# classification's tag files; squad: SQuAD v1.1 JSON; idx, image_folder, npz: images (tformer.data.images)
# The [data] settings naming the columns of a records file, by task (docs/data.md): None = the task's default.
COLUMN_OPTIONS = ("text_column", "text_pair_column", "label_column", "tokens_column", "tags_column",
                  "question_column", "context_column", "answers_column", "translation_column", "source_column",
                  "target_column", "image_column", "audio_column")


class DataError(TformerError):
    """A data setting or file is invalid; the message names the ``data.`` key and the file."""


# data.tokenizer values that name a tokenizer learned from the data rather than a file: "char" (any text task),
# "bpe" (translation's joint BPE), "words" (speech recognition's word vocabulary); tasks declare which they learn.
LEARNED_TOKENIZERS = ("char", "bpe", "words")


@dataclass(frozen=True)
class DataConfig:
    """Training data: a ``train`` file, an optional ``eval`` file (else the last
    ``eval_fraction`` of ``train`` is held out, as nanoGPT splits), the file ``format`` and
    the ``tokenizer`` ("char" to learn one from the text, or a tokenizer file: tokenizer.json,
    BERT's vocab.txt). For the encoder's tasks: ``columns`` names the columns of a TSV/CSV file
    without a header row, and ``skip_bad`` leaves out (and counts) bad rows instead of stopping. For
    image classification ``train`` and ``eval`` are idx images files, image folders or .npz files. For
    translation they are corpus prefixes (``train`` for train.de + train.en, .gz too) read from
    ``source_language`` into ``target_language``, and ``tokenizer`` may be "bpe": a joint BPE learned
    from the training pairs. For speech recognition they are manifests (``audio_column``: WAV paths,
    ``text_column``: transcripts) or folders of NAME.wav + NAME.txt pairs, and ``tokenizer`` may be "words":
    one token a word of the training transcripts. Every task also reads records
    (``tformer.data.records``: JSONL, TSV/CSV, Parquet, a datasets save_to_disk folder), whose columns the
    ``*_column`` settings name."""

    train: str = ""
    eval: str | None = None
    eval_fraction: float = 0.1
    format: str = "auto"
    tokenizer: str = "char"
    columns: list[str] | None = None
    skip_bad: bool = False
    source_language: str | None = None
    target_language: str | None = None
    text_column: str | None = None
    text_pair_column: str | None = None
    label_column: str | None = None
    tokens_column: str | None = None
    tags_column: str | None = None
    question_column: str | None = None
    context_column: str | None = None
    answers_column: str | None = None
    translation_column: str | None = None
    source_column: str | None = None
    target_column: str | None = None
    image_column: str | None = None
    audio_column: str | None = None
    sources: list[dict] | None = None  # text-to-text sources, each with its own files (tformer.data.text_to_text)

    def __post_init__(self) -> None:
        if self.sources is not None:
            if self.train or self.eval:
                raise DataError("data.train and data.eval are not read beside data.sources: each source names its "
                                "own train (and eval) files")
        elif not isinstance(self.train, str) or not self.train:
            raise DataError("data.train is required: a text file (.txt, .txt.gz) or a token file "
                            "(tformer tokenize's .bin, or .npy)")
        if self.format not in DATA_FORMATS:
            raise DataError(f"data.format={self.format!r} is not one of {', '.join(DATA_FORMATS)}")
        fraction = self.eval_fraction
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0.0 <= fraction < 1.0:
            raise DataError(f"data.eval_fraction={fraction!r} must be a number in [0, 1)")
        for key in COLUMN_OPTIONS:
            value = getattr(self, key)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise DataError(f"data.{key}={value!r} must be a column name")

    def check_files(self) -> None:
        """Fail now, before any work, if a named file is missing (text-to-text sources: the task checks each
        source's files, ``tformer.data.text_to_text.check_source_files``)."""
        for key in ("train", "eval") if self.sources is None else ():
            path = getattr(self, key)
            if path is None:
                continue
            if (self.source_language or self.target_language) and self.record_format(path) is None:
                for language in (self.source_language, self.target_language):
                    if language:
                        try:
                            corpus_file(path, language)
                        except DataFileError as error:
                            raise DataError(f"data.{key}: {error}") from None
                continue
            folder_allowed = self.format in ("auto", "image_folder", "datasets")  # folders: images, datasets
            if not (Path(path).is_file() or (folder_allowed and Path(path).is_dir())):
                raise DataError(f"data.{key}: {path}: no such file" + (" or folder" if folder_allowed else ""))
        if self.tokenizer not in LEARNED_TOKENIZERS and not Path(self.tokenizer).exists():
            learned = ", ".join(f'"{name}"' for name in LEARNED_TOKENIZERS)
            raise DataError(f"data.tokenizer: {self.tokenizer}: no such file (use {learned} or a tokenizer.json "
                            "path)")

    def record_format(self, path: str, native_suffixes: tuple[str, ...] = ()) -> str | None:
        """The record format ``path`` is read in (``data.format``, else by the name), or None when it is the
        task's own format; with ``format = "auto"`` a name ending in one of ``native_suffixes`` stays the
        task's own (a CoNLL file named .tsv, a SQuAD file .json)."""
        if self.format in RECORD_FORMATS:
            return self.format
        if self.format != "auto" or path.lower().removesuffix(".gz").endswith(native_suffixes):
            return None
        try:
            return record_format(path)
        except DataFileError as error:
            raise DataError(f"data: {error}") from None

    def check_columns(self, task: str, path: str, kind: str | None) -> None:
        """Refuse a ``*_column`` setting where ``path`` is read in the task's own format (``kind`` None),
        which has no named columns to honour it."""
        if kind is not None:
            return
        for key in COLUMN_OPTIONS + ("columns",):
            if getattr(self, key) is not None:
                raise DataError(f"data.{key} names a column of a records file (JSONL, CSV/TSV, Parquet, a datasets "
                                f"folder); {path} is read as the {task} task's own format, which has no columns")

    def columns_of(self, **defaults: str | None) -> dict[str, str | None]:
        """The ``*_column`` settings named, each as set or its ``defaults`` value (the task's)."""
        return {key: getattr(self, key) or default for key, default in defaults.items()}

    def file_format(self, path: str) -> str:
        """text, tokens (a .bin with its .json header), npy or a record format: as set, or by the file's
        name."""
        if self.format != "auto":
            return self.format
        kind = self.record_format(path)
        if kind is not None:
            return kind
        if path.endswith(".npy"):
            return "npy"
        return "tokens" if header_path(path).is_file() else "text"


@dataclass
class LanguageModelData:
    """Loaded tokens: ``train`` and optional ``eval`` (tensors or memory-mapped arrays), the
    tokenizer (or None for token files without one) and the vocabulary size it implies."""

    train: Tokens
    eval: Tokens | None
    tokenizer: object | None
    vocab_size: int | None
    description: str

    @property
    def num_train_tokens(self) -> int:
        return num_tokens(self.train)


def load_language_model_data(config: DataConfig, tokenizer=None) -> LanguageModelData:
    """Read, tokenize and split the data a DataConfig names (with ``tokenizer`` when given: a
    pretrained model's, instead of the one ``config.tokenizer`` names)."""
    config.check_files()
    formats = {key: config.file_format(getattr(config, key)) for key in ("train", "eval") if getattr(config, key)}
    is_text = {key: kind == "text" or kind in RECORD_FORMATS for key, kind in formats.items()}
    if len(set(is_text.values())) > 1:
        raise DataError("data.train and data.eval must both be text (or records) or both be token files")
    for key, kind in formats.items():
        config.check_columns("lm", getattr(config, key), kind if kind in RECORD_FORMATS else None)
    vocab_size = None
    if is_text["train"]:
        texts = {key: read_text(getattr(config, key), key, kind, config) for key, kind in formats.items()}
        tokenizer = tokenizer or _tokenizer_for(config, "".join(texts.values()))
        tokens = {key: encode_text(tokenizer, text) for key, text in texts.items()}
    else:
        tokenizer = tokenizer or _tokenizer_for(config, None)
        tokens = {}
        for key, kind in formats.items():
            path = getattr(config, key)
            if kind == "npy":
                tokens[key] = _memory_map(path, key)
                continue
            try:
                tokens[key] = read_token_file(path, tokenizer)
                header_vocab = read_token_header(path)["vocab_size"]
            except TokenFileError as error:
                raise DataError(f"data.{key}: {error}") from None
            vocab_size = max(vocab_size or 0, header_vocab)
    train, evaluation = tokens["train"], tokens.get("eval")
    if evaluation is None and config.eval_fraction > 0:
        train, evaluation = split_tokens(train, config.eval_fraction)
    if tokenizer is not None:
        vocab_size = tokenizer.vocab_size
    described = f"{Path(config.train).name}: {num_tokens(train):,} training tokens"
    if evaluation is not None:
        described += f", {num_tokens(evaluation):,} evaluation tokens"
    return LanguageModelData(train, evaluation, tokenizer, vocab_size, described)


def read_text(path: str | Path, key: str = "train", kind: str = "text", config: DataConfig | None = None) -> str:
    """A UTF-8 text file, gzip-compressed when its name ends in .gz, or (``kind`` a record format) the text
    of a records file's ``data.text_column`` (default ``text``), a record a line; errors name the ``data.``
    key."""
    try:
        if kind in RECORD_FORMATS:
            column = (config.text_column if config is not None else None) or "text"
            columns = config.columns if config is not None else None
            return "".join(record_lines(path, column, format=kind, columns=columns))
        return read_data_text(path, encoding="utf-8")  # a byte-order mark is text a model trains on
    except DataFileError as error:
        hint = "; token files must end in .npy or set data.format" if "not UTF-8 text" in str(error) else ""
        raise DataError(f"data.{key}: {error}{hint}") from None


def encode_text(tokenizer, text: str):
    """Token ids of ``text`` as a 1-D int64 tensor. Character tokenizers take a vectorised path
    (one lookup per distinct character) that gives the same ids as ``tokenizer.encode``."""
    import torch

    if getattr(tokenizer, "kind", None) == "char":
        codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        distinct = np.unique(codes)
        ids = tokenizer.encode("".join(map(chr, distinct.tolist())))
        if len(ids) == len(distinct):
            table = np.asarray(ids, dtype=np.int64)
            return torch.from_numpy(table[np.searchsorted(distinct, codes)])
    return torch.tensor(tokenizer.encode(text), dtype=torch.long)


def _tokenizer_for(config: DataConfig, text: str | None):
    if config.tokenizer == "char":
        if text is None:
            return None  # token files carry ids already (and their vocabulary size)
        return CharTokenizer.train(text)
    return load_tokenizer(config.tokenizer)


def _memory_map(path: str, key: str) -> np.ndarray:
    try:
        array = np.load(path, mmap_mode="r")
    except (OSError, ValueError) as error:
        raise DataError(f"data.{key}: {path}: not a readable .npy token file ({error})") from None
    if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
        raise DataError(f"data.{key}: {path}: expected a 1-D array of integer token ids, "
                        f"got shape {array.shape} of {array.dtype}")
    return array
