"""Where the shared datasets live (``../shared/data`` beside the repository) and a skip with a
clear reason when they are absent, as in a user's fresh clone."""

from __future__ import annotations

import gzip
from functools import cache
from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
GPT2_DIR = SHARED_DATA / "tokenizers" / "gpt2"
BERT_DIR = SHARED_DATA / "tokenizers" / "bert-base-uncased"
TINYSHAKESPEARE = SHARED_DATA / "tinyshakespeare" / "input.txt.gz"


def require(*paths: Path) -> None:
    """Skip the calling test unless every path exists."""
    missing = [str(path) for path in paths if not path.exists()]
    if missing:
        pytest.skip(f"shared dataset not found: {', '.join(missing)} (it lives in ../shared/data beside the repo)")


@cache
def tinyshakespeare() -> str:
    require(TINYSHAKESPEARE)
    with gzip.open(TINYSHAKESPEARE, "rt", encoding="utf-8") as handle:
        return handle.read()


def unicode_sample() -> str:
    """Text that exercises Unicode: many scripts, accents precomposed and combining, emoji with
    joiners and modifiers, unusual spaces, non-ASCII digits, controls, contractions."""
    parts = [
        "Héllo wörld, ça va? Ñandú, Ångström, naïve café. Ελληνικά ΟΔΟΣ, русский язык!",
        "עברית and العربية ١٢٣٤٥, हिन्दी ०१२३, ไทย ภาษา, 中文字符 和 日本語のテキスト、한국어 문장.",
        "Emoji: 😀😃 👍🏽 👨‍👩‍👧‍👦 🇫🇷🇯🇵 ❤️ 🥰 — e\u0301 a\u0308 n\u0303 Z\u0335\u0321a\u0328",
        "Spaces:\u00a0nbsp\u2003em\u3000ideographic\u2028line\u2029para \t\ttabs \r\n crlf \x0b\x0c end",
        "Digits: ０１２ full-width, ² ½ Ⅻ, $3.50 €12 ¥7, 1,234,567.89 and 3.14159e-10",
        "Contractions: it's they're we've I'm you'll he'd DON'T 'quoted' \"double\" «guillemets» „low“",
        "Controls: \x00\x01\x1b[31m\x7f\x85 soft\u00adhyphen zero\u200bwidth \ufeffbom \ufffd replacement",
        "Math ∑∫√∞ ≠ ≤ ≥, arrows →⇒, box ┌─┐, ⅓ cup, 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟙𝟚𝟛, ꙮ, ǅ İstanbul ß ﬁne",
        "   leading spaces, trailing spaces   ",
        "\n\n\nnewlines\n\n",
    ]
    return "\n".join(parts)
