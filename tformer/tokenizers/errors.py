"""The error every tokenizer mistake raises: a bad file, argument, vocabulary or corpus."""

from tformer.errors import TformerError


class TokenizerError(TformerError):
    """A tokenizer file is missing, unreadable or of an unknown kind, or an argument is invalid."""
