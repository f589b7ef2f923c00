"""Data for training: corpora (``corpus``), language-model batches (``lm``), token files (``token_file``:
a tokenized corpus on disk, memory-mapped by the training loop), records (``records``: JSONL, CSV/TSV, Parquet,
datasets save_to_disk folders, the one format layer under the readers), labelled-data readers
(``classification``: TSV/CSV/JSONL/Parquet, ``conll``: tag files, ``squad``: SQuAD v1.1 JSON), masked-LM inputs
(``masking``), encoder pretraining rows (``pretraining``: next-sentence pairs, packing), labelled images
(``images``: idx files, image folders, .npz arrays, records), a vision model's pixel normalisation
(``image_processing``), audio (``audio``: WAV files, resampling; ``log_mel``: Whisper's features), speech
recognition pairs (``speech``: manifests and folders of WAV + transcript), the FSDD connected-digit corpus
(``fsdd``), and the datasets recipes name, fetched by name and verified (``registry``, ``cache``: ``fetch``).

The names load on first use (PEP 562): a module that needs one reader (the HTTP server reading a WAV upload with
``audio``) imports without torch.
"""

from __future__ import annotations

from tformer.lazy_exports import lazy_exports

# name -> the module that defines it
EXPORTS = {
    "ClassificationData": "tformer.data.classification",
    "ClassificationExample": "tformer.data.classification",
    "ConllData": "tformer.data.conll",
    "DataFetchError": "tformer.data.cache",
    "DataFileError": "tformer.data.files",
    "FASHION_MNIST_LABELS": "tformer.data.images",
    "ImageData": "tformer.data.images",
    "SpeechData": "tformer.data.speech",
    "SquadAnswer": "tformer.data.squad",
    "SquadData": "tformer.data.squad",
    "SquadExample": "tformer.data.squad",
    "TaggedSentence": "tformer.data.conll",
    "TokenFileError": "tformer.data.token_file",
    "TokenFileWriter": "tformer.data.token_file",
    "fetch": "tformer.data.cache",
    "read_classification": "tformer.data.classification",
    "read_conll": "tformer.data.conll",
    "read_images": "tformer.data.images",
    "read_speech": "tformer.data.speech",
    "read_speech_folder": "tformer.data.speech",
    "read_speech_manifest": "tformer.data.speech",
    "read_squad": "tformer.data.squad",
    "read_token_file": "tformer.data.token_file",
    "read_token_header": "tformer.data.token_file",
    "token_dtype": "tformer.data.token_file",
    "tokenize_files": "tformer.data.token_file",
}

__all__ = ["FASHION_MNIST_LABELS", "ClassificationData", "ClassificationExample", "ConllData", "DataFetchError",
           "DataFileError", "ImageData", "SpeechData", "SquadAnswer", "SquadData", "SquadExample", "TaggedSentence",
           "TokenFileError", "TokenFileWriter", "fetch", "read_classification", "read_conll", "read_images",
           "read_speech", "read_speech_folder", "read_speech_manifest", "read_squad", "read_token_file",
           "read_token_header", "token_dtype", "tokenize_files"]

__getattr__, __dir__ = lazy_exports(__name__, EXPORTS)
