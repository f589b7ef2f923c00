"""Translation scores: BLEU and chrF equal to sacrebleu called directly on the same lines (the
Multi30k test references against lightly damaged copies), signatures, and misaligned files."""

import gzip
import random

import pytest
from shared_data import SHARED_DATA, require

from tformer.cli import main
from tformer.data.files import DataFileError
from tformer.evaluation.translation import (
    bleu_from_statistics,
    bleu_statistics,
    read_aligned_lines,
    translation_scores,
)

sacrebleu = pytest.importorskip("sacrebleu")

pytestmark = pytest.mark.slow  # compares with sacrebleu


def damaged(lines, seed=0):
    """Each line with some words dropped or swapped: hypotheses of every quality."""
    rng = random.Random(seed)
    out = []
    for line in lines:
        words = line.split()
        words = [w for w in words if rng.random() > 0.2] or words[:1]
        if len(words) > 2 and rng.random() < 0.5:
            i = rng.randrange(len(words) - 1)
            words[i], words[i + 1] = words[i + 1], words[i]
        out.append(" ".join(words))
    return out


def references():
    path = SHARED_DATA / "multi30k" / "test_2016_flickr.en.gz"
    require(path)
    return gzip.decompress(path.read_bytes()).decode("utf-8").splitlines()


def test_scores_equal_sacrebleu_called_directly():
    refs = references()
    hyps = damaged(refs)
    scores = translation_scores(hyps, refs, per_sentence=True)
    assert scores.bleu == sacrebleu.corpus_bleu(hyps, [refs]).score
    assert scores.chrf == sacrebleu.corpus_chrf(hyps, [refs]).score
    assert 0 < scores.bleu < 100 and scores.sentences == 1000
    assert "tok:13a" in scores.bleu_signature and "case:mixed" in scores.bleu_signature
    assert scores.sentence_bleu[7] == sacrebleu.sentence_bleu(hyps[7], [refs[7]]).score
    lowered = translation_scores(hyps, refs, lowercase=True)
    assert lowered.bleu == sacrebleu.corpus_bleu(hyps, [refs], lowercase=True).score
    assert "case:lc" in lowered.bleu_signature
    assert translation_scores(refs, refs).bleu == pytest.approx(100.0)


@pytest.mark.parametrize("lowercase", [False, True])
def test_bleu_statistics_summed_over_batches_give_sacrebleus_corpus_bleu(lowercase):
    refs = references()
    hyps = damaged(refs, seed=3)
    hyps[5] = ""  # an empty translation counts too
    totals = [0] * 10
    for start in range(0, len(refs), 97):  # batches of any size add up
        part = bleu_statistics(hyps[start : start + 97], refs[start : start + 97], lowercase=lowercase)
        totals = [a + b for a, b in zip(totals, part, strict=True)]
    expected = sacrebleu.corpus_bleu(hyps, [refs], lowercase=lowercase).score
    assert bleu_from_statistics(totals) == pytest.approx(expected, abs=1e-9)
    assert bleu_from_statistics(bleu_statistics(refs[:50], refs[:50])) == pytest.approx(100.0)


def test_misaligned_files_name_both_counts(tmp_path):
    (tmp_path / "hyp.txt").write_text("a b c\nd e\n")
    (tmp_path / "ref.txt").write_text("a b c\nd e\nf\n")
    with pytest.raises(DataFileError, match=r"hyp.txt has 2 lines but .*ref.txt has 3"):
        read_aligned_lines(tmp_path / "hyp.txt", tmp_path / "ref.txt")
    (tmp_path / "hyp.txt").write_text("a b c\nd e\ng\n")
    assert read_aligned_lines(tmp_path / "hyp.txt", tmp_path / "ref.txt")[0][2] == "g"


def test_the_evaluate_command_scores_translation_files(tmp_path, capsys):
    refs = references()[:200]
    hyps = damaged(refs, seed=1)
    (tmp_path / "hyp.txt").write_text("\n".join(hyps) + "\n")
    (tmp_path / "ref.txt").write_text("\n".join(refs) + "\n")
    assert main(["evaluate", "--hypotheses", str(tmp_path / "hyp.txt"), "--reference", str(tmp_path / "ref.txt"),
                 "--per-sentence"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].split()[1] == f"{sacrebleu.corpus_bleu(hyps, [refs]).score:.2f}" and "tok:13a" in out[1]
    assert out[2].split()[1] == f"{sacrebleu.corpus_chrf(hyps, [refs]).score:.2f}"
    assert out[3 + 4] == f"5\t{sacrebleu.sentence_bleu(hyps[4], [refs[4]]).score:.2f}"
    (tmp_path / "short.txt").write_text("\n".join(hyps[:150]) + "\n")
    short = ["evaluate", "--hypotheses", str(tmp_path / "short.txt"), "--reference", str(tmp_path / "ref.txt")]
    assert main(short) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "short.txt has 150 lines but" in err and "has 200" in err
    assert main(["evaluate", "--hypotheses", str(tmp_path / "hyp.txt")]) == 2
    assert "--hypotheses FILE and --reference FILE" in capsys.readouterr().err
    assert main(["evaluate", "--data", str(tmp_path / "ref.txt")]) == 2
    assert "give RUN and --data FILE" in capsys.readouterr().err
