"""Decoding strategies."""

from tformer.generation.generate import generate

__all__ = ["generate"]
