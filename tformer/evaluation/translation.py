"""Translation scores with ``sacrebleu`` (an optional dependency): corpus BLEU and chrF of detokenized
hypotheses against raw references, with the signatures that say how they were computed, and
per-sentence scores on request. Reading a hypothesis and a reference file checks they align line
for line, naming both counts when they do not."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tformer.data.files import DataFileError, read_data_text
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


def read_aligned_lines(hypotheses: str | Path, references: str | Path) -> tuple[list[str], list[str]]:
    """The lines of a hypothesis file and a reference file (.gz read too), which must have as many."""
    hypothesis_lines = read_data_text(hypotheses).splitlines()
    reference_lines = read_data_text(references).splitlines()
    if len(hypothesis_lines) != len(reference_lines):
        raise DataFileError(f"{hypotheses} has {len(hypothesis_lines):,} lines but {references} has "
                            f"{len(reference_lines):,}; a hypothesis file must have one line per reference")
    return hypothesis_lines, reference_lines
