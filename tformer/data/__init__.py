"""Data for training: language-model token files (and, later, datasets and collators)."""

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
