"""Translation scores with ``sacrebleu`` (an optional dependency): corpus BLEU and chrF of detokenized
hypotheses against raw references, with the signatures that say how they were computed, and
per-sentence scores on request. Reading a hypothesis and a reference file checks they align line
for line, naming both counts when they do not."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

from tformer.data.parallel import read_aligned
from tformer.errors import TformerError


@dataclass
class TranslationScores:
    """Corpus BLEU and chrF (0-100) and their sacreBLEU signatures; ``sentence_bleu`` per line when asked."""

    bleu: float
    chrf: float
    bleu_signature: str
    chrf_signature: str
    sentences: int
    sentence_bleu: list[float] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {"bleu": self.bleu, "chrf": self.chrf, "bleu_signature": self.bleu_signature,
                "chrf_signature": self.chrf_signature, "sentences": self.sentences}


def translation_scores(hypotheses: list[str], references: list[str], *, tokenize: str = "13a",
                       lowercase: bool = False, per_sentence: bool = False) -> TranslationScores:
    """sacreBLEU's corpus BLEU (``tokenize``: 13a by default, cased unless ``lowercase``) and chrF of
    ``hypotheses`` against one reference each."""
    try:
        from sacrebleu.metrics import BLEU, CHRF
    except ImportError:
        raise TformerError("translation scores need sacrebleu: pip install 'tformer[translation]'") from None
    if len(hypotheses) != len(references):
        raise TformerError(f"{len(hypotheses)} hypotheses but {len(references)} references; they must align")
    if not hypotheses:
        raise TformerError("no sentences to score")
    bleu, chrf = BLEU(tokenize=tokenize, lowercase=lowercase), CHRF()
    bleu_score = bleu.corpus_score(hypotheses, [references])
    chrf_score = chrf.corpus_score(hypotheses, [references])
    sentence = [bleu.sentence_score(h, [r]).score for h, r in zip(hypotheses, references, strict=True)] \
        if per_sentence else []
    return TranslationScores(bleu_score.score, chrf_score.score, str(bleu.get_signature()), str(chrf.get_signature()),
                             len(hypotheses), sentence)


BLEU_ORDER = 4
BLEU_STATISTICS = 2 + 2 * BLEU_ORDER  # hypothesis length, reference length, matches and totals per n-gram order


def sacrebleu_installed() -> bool:
    """Whether sacreBLEU, which BLEU is computed with, can be imported (the ``translation`` extra)."""
    return importlib.util.find_spec("sacrebleu") is not None


def _bleu_metric(tokenize: str = "13a", lowercase: bool = False):
    try:
        from sacrebleu.metrics import BLEU
    except ImportError:
        raise TformerError("BLEU needs sacrebleu: pip install 'tformer[translation]'") from None
    return BLEU(tokenize=tokenize, lowercase=lowercase)


def bleu_statistics(hypotheses: list[str], references: list[str], *, tokenize: str = "13a",
                    lowercase: bool = False) -> list[int]:
    """BLEU's sufficient statistics (``BLEU_STATISTICS`` counts: hypothesis and reference lengths, then
    clipped n-gram matches and hypothesis n-grams for n = 1..4) over sentence pairs, tokenized as sacreBLEU
    tokenizes them. They add up over batches and processes; ``bleu_from_statistics`` turns the totals into
    the corpus BLEU that ``sacrebleu.corpus_bleu`` gives for all the sentences at once."""
    tokenizer = _bleu_metric(tokenize, lowercase).tokenizer
    totals = [0] * BLEU_STATISTICS
    for hypothesis, reference in zip(hypotheses, references, strict=True):
        if lowercase:
            hypothesis, reference = hypothesis.lower(), reference.lower()
        hypothesis_words = tokenizer(hypothesis.rstrip()).split()
        reference_words = tokenizer(reference.rstrip()).split()
        totals[0] += len(hypothesis_words)
        totals[1] += len(reference_words)
        for order in range(1, BLEU_ORDER + 1):
            found = _ngrams(hypothesis_words, order)
            wanted = _ngrams(reference_words, order)
            totals[1 + order] += sum(min(count, wanted.get(gram, 0)) for gram, count in found.items())
            totals[1 + BLEU_ORDER + order] += max(len(hypothesis_words) - order + 1, 0)
    return totals


def bleu_from_statistics(statistics: list[float]) -> float:
    """Corpus BLEU (0-100, sacreBLEU's default exponential smoothing) from summed ``bleu_statistics``."""
    counts = [round(value) for value in statistics]
    correct, total = counts[2 : 2 + BLEU_ORDER], counts[2 + BLEU_ORDER :]
    return _bleu_metric().compute_bleu(correct, total, counts[0], counts[1], smooth_method="exp").score


def _ngrams(words: list[str], order: int) -> dict[tuple[str, ...], int]:
    grams: dict[tuple[str, ...], int] = {}
    for start in range(len(words) - order + 1):
        gram = tuple(words[start : start + order])
        grams[gram] = grams.get(gram, 0) + 1
    return grams


def read_aligned_lines(hypotheses: str | Path, references: str | Path) -> tuple[list[str], list[str]]:
    """The lines of a hypothesis file and a reference file (.gz read too), which must have as many."""
    return read_aligned(hypotheses, references, what="hypothesis per reference")
