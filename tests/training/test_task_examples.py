"""The one rule every task holds data out by (``data.eval_fraction``): the last round(N x fraction) items
evaluate, and a fraction that leaves either side empty is refused in one line."""

import pytest

from tformer.training.config import TrainingError
from tformer.training.tasks.examples import training_count
from tformer.training.tasks.mlm import split_documents


@pytest.mark.parametrize(("total", "fraction", "kept"), [(10, 0.25, 8), (48, 0.2, 38), (3, 0.34, 2), (2, 0.5, 1)])
def test_the_first_items_train_and_the_rounded_fraction_evaluates(total, fraction, kept):
    assert training_count(total, fraction, "items", "train.tsv") == kept


@pytest.mark.parametrize(("total", "fraction", "held"), [(10, 0.01, 0), (10, 0.96, 10), (1, 0.1, 0)])
def test_a_fraction_that_empties_a_side_is_refused_naming_the_file_and_the_count(total, fraction, held):
    with pytest.raises(TrainingError) as caught:
        training_count(total, fraction, "sentences", "train.conll")
    message = str(caught.value)
    expected = f"data.eval_fraction={fraction} of the {total} sentences of train.conll holds out {held}:"
    assert message.startswith(expected)
    assert "data.eval" in message and "\n" not in message


def test_masked_lm_documents_are_cut_where_the_count_falls_and_refused_when_nothing_is_held_out():
    train, held_out = split_documents([["a", "b", "c"], ["d", "e"]], 0.4)
    assert (train, held_out) == ([["a", "b", "c"]], [["d", "e"]])
    train, held_out = split_documents([["a", "b", "c", "d", "e"]], 0.4)
    assert (train, held_out) == ([["a", "b", "c"]], [["d", "e"]])
    with pytest.raises(TrainingError, match=r"of the 5 sentences of the training text holds out 0"):
        split_documents([["a", "b", "c", "d", "e"]], 0.05)
