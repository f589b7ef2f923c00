"""Property-based checks (hypothesis) of the evaluation metrics against the references they promise to equal,
on random text where hand-picked cases miss corners: punctuation inside words (don't, U.S., e-mail,
a-the), articles glued to punctuation or other words, Unicode letters, case and spaces, empty answers.
SQuAD v1.1 normalisation, exact match, F1 and the corpus totals follow the official evaluate-v1.1
script, whose steps are written out here; entity scores equal seqeval's default mode; summed BLEU
statistics equal sacreBLEU's corpus BLEU. Every search is derandomized, so CI sees the same examples."""

import re
import string
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tformer.evaluation import entity_scores, exact_match, normalize_answer, squad_scores, token_f1
from tformer.evaluation.translation import BLEU_ORDER, bleu_from_statistics, bleu_statistics

PROPERTY = settings(max_examples=200, deadline=None, derandomize=True)

# Pieces of text glued together with no separator, so punctuation and articles land inside words as often
# as at their edges: ASCII punctuation (removed by SQuAD), other punctuation (kept), letters that change
# length or meaning when lowercased (İ, ß, Σ), a combining accent (not a word character: it ends a word),
# kinds of space, and BLEU tokenizers' special cases (escaped entities, <skipped>, a hyphen at a line end).
PIECES = ["a", "an", "the", "A", "An", "The", "THE", "cat", "x", "7", "3.5", "1,000", "U.S.", "don't", "e-mail",
          "é", "İ", "ß", "Σ", "\u0301", "_", "'", '"', ".", ",", "-", "!", "?", "(", ")", "$", "%", "&", "/", ":",
          ";", "@", "[", "\\", "]", "^", "`", "{", "|", "}", "~", "«", "»", "—", "“", "”", "¿", "·", "…",
          " ", "  ", "\t", "\n", "\u00a0", "\u2003", "&amp;", "&quot;", "<skipped>", "-\n"]
texts = st.lists(st.sampled_from(PIECES), max_size=14).map("".join)


# ---- SQuAD v1.1: the official script's rules, written out -----------------------------------------------------


def official_normalize_answer(text: str) -> str:
    """evaluate-v1.1.py's normalize_answer: lower case, then drop every character of string.punctuation,
    then replace the words a, an, the (regex word boundaries) by a space, then join the whitespace-split words."""
    lowered = text.lower()
    without_punctuation = "".join(character for character in lowered if character not in set(string.punctuation))
    without_articles = re.sub(r"\b(a|an|the)\b", " ", without_punctuation)
    return " ".join(without_articles.split())


def official_f1(prediction: str, gold: str) -> float:
    """evaluate-v1.1.py's f1_score: the bags of normalised words; 0 when they share none."""
    predicted_words, gold_words = official_normalize_answer(prediction).split(), official_normalize_answer(gold).split()
    shared = sum((Counter(predicted_words) & Counter(gold_words)).values())
    if shared == 0:
        return 0
    precision, recall = 1.0 * shared / len(predicted_words), 1.0 * shared / len(gold_words)
    return (2 * precision * recall) / (precision + recall)


def official_evaluate(questions: list[tuple[str, list[str]]], predictions: dict[str, str]) -> tuple[float, float]:
    """evaluate-v1.1.py's evaluate: per question the best score over its gold answers, an unanswered
    question counts 0, both totals in percent of all questions."""
    exact = f1 = 0.0
    for question_id, golds in questions:
        if question_id not in predictions:
            continue
        prediction = predictions[question_id]
        exact += max(official_normalize_answer(prediction) == official_normalize_answer(gold) for gold in golds)
        f1 += max(official_f1(prediction, gold) for gold in golds)
    return 100.0 * exact / len(questions), 100.0 * f1 / len(questions)


@PROPERTY
@given(texts)
def test_squad_normalisation_follows_the_official_rules(text):
    assert normalize_answer(text) == official_normalize_answer(text)


@PROPERTY
@given(texts, texts)
def test_squad_exact_match_and_f1_follow_the_official_rules(prediction, gold):
    assert exact_match(prediction, gold) == float(official_normalize_answer(prediction)
                                                  == official_normalize_answer(gold))
    assert token_f1(prediction, gold) == pytest.approx(official_f1(prediction, gold), abs=1e-12)


@settings(PROPERTY, max_examples=100)
@given(st.lists(st.tuples(st.lists(texts, min_size=1, max_size=3), st.none() | texts), min_size=1, max_size=6))
def test_squad_totals_follow_the_official_evaluate(questions):
    """Questions with one to three gold answers, each answered (a random text) or not."""
    gold = {f"q{index}": golds for index, (golds, _) in enumerate(questions)}
    predictions = {f"q{index}": answer for index, (_, answer) in enumerate(questions) if answer is not None}
    scores = squad_scores(predictions, gold)
    exact, f1 = official_evaluate(list(gold.items()), predictions)
    assert scores.exact_match == pytest.approx(exact, abs=1e-9) and scores.f1 == pytest.approx(f1, abs=1e-9)
    assert (scores.total, scores.missing) == (len(gold), len(gold) - len(predictions))


# ---- entities: seqeval's default mode -------------------------------------------------------------------------


TAGS = ["O", *(f"{prefix}-{kind}" for prefix in "BIES" for kind in ("PER", "LOC", "creative-work"))]
sentences = st.lists(st.sampled_from(TAGS), min_size=1, max_size=8)


@st.composite
def tagged_corpora(draw):
    """True and predicted tag sequences of equal lengths (IOB2 and IOBES tags, mixed and broken)."""
    truth = draw(st.lists(sentences, min_size=1, max_size=6))
    predicted = [draw(st.lists(st.sampled_from(TAGS), min_size=len(tags), max_size=len(tags))) for tags in truth]
    return truth, predicted


@pytest.mark.slow  # imports seqeval (and scikit-learn with it)
@pytest.mark.filterwarnings("ignore::UserWarning")
@PROPERTY
@given(tagged_corpora())
def test_entity_scores_equal_seqeval_on_any_tags(corpus):
    seqeval = pytest.importorskip("seqeval.metrics.sequence_labeling")
    truth, predicted = corpus
    ours = entity_scores(truth, predicted)
    micro = seqeval.precision_recall_fscore_support(truth, predicted, average="micro", zero_division=0)
    assert (ours.micro.precision, ours.micro.recall, ours.micro.f1) == pytest.approx(micro[:3], abs=1e-12)
    kinds = sorted({kind for tags in truth + predicted for kind, *_ in seqeval.get_entities(tags)})
    assert list(ours.per_type) == kinds
    if kinds:
        precision, recall, f1, support = seqeval.precision_recall_fscore_support(truth, predicted, zero_division=0)
        for index, kind in enumerate(kinds):
            got = ours.per_type[kind]
            assert (got.precision, got.recall, got.f1) == pytest.approx((precision[index], recall[index], f1[index]),
                                                                       abs=1e-12)
            assert got.support == support[index]


# ---- BLEU: sacreBLEU's corpus statistics ----------------------------------------------------------------------


@pytest.mark.slow  # imports sacrebleu
@PROPERTY
@given(pairs=st.lists(st.tuples(texts, texts), min_size=1, max_size=8), cut=st.integers(0, 8),
       tokenize=st.sampled_from(["13a", "intl", "char", "none"]), lowercase=st.booleans())
def test_bleu_statistics_of_any_batches_equal_sacrebleus_corpus_bleu(pairs, cut, tokenize, lowercase):
    """Statistics of two batches (split at ``cut``) add up to sacreBLEU's counts of the whole corpus, and
    their BLEU is its corpus BLEU (the same formula over the same integers: equal to rounding)."""
    sacrebleu = pytest.importorskip("sacrebleu")
    hypotheses, references = [hypothesis for hypothesis, _ in pairs], [reference for _, reference in pairs]
    first = bleu_statistics(hypotheses[:cut], references[:cut], tokenize=tokenize, lowercase=lowercase)
    second = bleu_statistics(hypotheses[cut:], references[cut:], tokenize=tokenize, lowercase=lowercase)
    totals = [a + b for a, b in zip(first, second, strict=True)]
    expected = sacrebleu.metrics.BLEU(tokenize=tokenize, lowercase=lowercase).corpus_score(hypotheses, [references])
    assert totals[:2] == [expected.sys_len, expected.ref_len]
    assert totals[2:2 + BLEU_ORDER] == list(expected.counts) and totals[2 + BLEU_ORDER:] == list(expected.totals)
    assert bleu_from_statistics(totals) == pytest.approx(expected.score, abs=1e-9)
