"""Data for training: corpora (``corpus``), language-model batches (``lm``), token files (``token_file``:
a tokenized corpus on disk, memory-mapped by the training loop), labelled-data readers (``classification``:
TSV/CSV/JSONL, ``conll``: tag files, ``squad``: SQuAD v1.1 JSON), masked-LM inputs (``masking``) and
encoder pretraining rows (``pretraining``: next-sentence pairs, packing)."""

from tformer.data.classification import ClassificationData, ClassificationExample, read_classification
from tformer.data.conll import ConllData, TaggedSentence, read_conll
from tformer.data.files import DataFileError
from tformer.data.squad import SquadAnswer, SquadData, SquadExample, read_squad
from tformer.data.token_file import (
    TokenFileError,
    TokenFileWriter,
    read_token_file,
    read_token_header,
    token_dtype,
    tokenize_files,
)

__all__ = ["ClassificationData", "ClassificationExample", "ConllData", "DataFileError", "SquadAnswer",
           "SquadData", "SquadExample", "TaggedSentence", "TokenFileError", "TokenFileWriter",
           "read_classification", "read_conll", "read_squad", "read_token_file", "read_token_header", "token_dtype",
           "tokenize_files"]
