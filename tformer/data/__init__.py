"""Data for training: corpora (``corpus``), language-model batches (``lm``) and token files
(``token_file``: a tokenized corpus on disk, memory-mapped by the training loop)."""

from tformer.data.token_file import (
    TokenFileError,
    TokenFileWriter,
    read_token_file,
    read_token_header,
    token_dtype,
    tokenize_files,
)

__all__ = ["TokenFileError", "TokenFileWriter", "read_token_file", "read_token_header", "token_dtype",
           "tokenize_files"]
