"""Data for training: corpora (``corpus``), language-model batches (``lm``), token files (``token_file``:
a tokenized corpus on disk, memory-mapped by the training loop), records (``records``: JSONL, CSV/TSV, Parquet,
datasets save_to_disk folders, the one format layer under the readers), labelled-data readers
(``classification``: TSV/CSV/JSONL/Parquet, ``conll``: tag files, ``squad``: SQuAD v1.1 JSON), masked-LM inputs
(``masking``), encoder pretraining rows (``pretraining``: next-sentence pairs, packing), labelled images
(``images``: idx files, image folders, .npz arrays, records), a vision model's pixel normalisation
(``image_processing``), audio (``audio``: WAV files, resampling; ``log_mel``: Whisper's features), speech
recognition pairs (``speech``: manifests and folders of WAV + transcript), the FSDD connected-digit corpus
(``fsdd``), and the datasets recipes name, fetched by name and verified (``registry``, ``cache``: ``fetch``)."""

from tformer.data.cache import DataFetchError, fetch
from tformer.data.classification import ClassificationData, ClassificationExample, read_classification
from tformer.data.conll import ConllData, TaggedSentence, read_conll
from tformer.data.files import DataFileError
from tformer.data.images import FASHION_MNIST_LABELS, ImageData, read_images
from tformer.data.speech import SpeechData, read_speech, read_speech_folder, read_speech_manifest
from tformer.data.squad import SquadAnswer, SquadData, SquadExample, read_squad
from tformer.data.token_file import (
    TokenFileError,
    TokenFileWriter,
    read_token_file,
    read_token_header,
    token_dtype,
    tokenize_files,
)

__all__ = ["FASHION_MNIST_LABELS", "ClassificationData", "ClassificationExample", "ConllData", "DataFetchError",
           "DataFileError", "ImageData", "SpeechData", "SquadAnswer", "SquadData", "SquadExample", "TaggedSentence",
           "TokenFileError", "TokenFileWriter", "fetch", "read_classification", "read_conll", "read_images",
           "read_speech", "read_speech_folder", "read_speech_manifest", "read_squad", "read_token_file",
           "read_token_header", "token_dtype", "tokenize_files"]
