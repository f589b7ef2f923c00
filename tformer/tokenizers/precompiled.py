"""SentencePiece's precompiled character map (the ``precompiled_charsmap`` of T5's, Marian's and
ALBERT's ``tokenizer.json``): a Darts double-array trie over UTF-8 keys whose values point into a
blob of NUL-terminated replacements. ``normalizers.PrecompiledNormalizer`` applies it."""

from __future__ import annotations

import base64
import binascii
import struct

from tformer.tokenizers.errors import TokenizerError


class CharsMap:
    """The parsed charsmap: ``lookup(chunk)`` is the replacement of the shortest key that
    begins ``chunk`` (what Hugging Face takes), or None when no key does."""

    def __init__(self, charsmap_base64: str) -> None:
        try:
            blob = base64.b64decode(charsmap_base64, validate=True)
        except (binascii.Error, ValueError, TypeError):
            raise TokenizerError("precompiled_charsmap is not valid base64") from None
        if len(blob) < 4:
            raise TokenizerError("precompiled_charsmap is too short to hold its trie size")
        (trie_bytes,) = struct.unpack_from("<I", blob, 0)
        if trie_bytes % 4 or 4 + trie_bytes > len(blob):
            raise TokenizerError(f"precompiled_charsmap's trie size {trie_bytes} does not fit its {len(blob)} bytes")
        self.units = struct.unpack_from(f"<{trie_bytes // 4}I", blob, 4)
        self.replacements = blob[4 + trie_bytes:]

    def _first_value(self, key: bytes) -> int | None:
        """Value of the shortest trie key that is a prefix of ``key`` (a Darts common-prefix search)."""
        units = self.units
        position = _offset(units[0])
        for byte in key:
            position ^= byte
            if byte == 0 or position >= len(units):
                break
            unit = units[position]
            if unit & 0x800000FF != byte:  # the unit's label: this byte does not continue any key
                break
            position ^= _offset(unit)
            if (unit >> 8) & 1:  # a key ends here; its value sits in the leaf unit
                return units[position] & 0x7FFFFFFF
        return None

    def lookup(self, chunk: str) -> str | None:
        start = self._first_value(chunk.encode("utf-8"))
        if start is None:
            return None
        end = self.replacements.find(b"\0", start)
        return self.replacements[start:end if end >= 0 else len(self.replacements)].decode("utf-8", "replace")


def _offset(unit: int) -> int:
    return (unit >> 10) << ((unit & (1 << 9)) >> 6)
