"""A load builds its model without initialising the weights it writes next (``nn/uninitialised.py``), and only
there: outside the block, in another thread, and for a new head the weights are initialised as always."""

import threading

import pytest
import torch
from torch import nn

import tformer
from tformer.checkpoint import NonFiniteWeightsWarning
from tformer.nn.uninitialised import without_initialisation


def test_initialisers_leave_their_tensor_inside_the_block_and_fill_it_outside():
    with without_initialisation():
        kept = nn.init.normal_(torch.zeros(64))
        layer = nn.Linear(8, 4)  # its own reset_parameters runs through torch.nn.init too
        layer.weight.data.zero_()
        layer.reset_parameters()
    assert torch.equal(kept, torch.zeros(64)) and torch.equal(layer.weight, torch.zeros(4, 8))
    assert nn.init.normal_(torch.zeros(64)).abs().sum() > 0
    layer.reset_parameters()
    assert layer.weight.abs().sum() > 0


def test_another_thread_initialises_meanwhile():
    filled = {}

    def build() -> None:
        filled["tensor"] = nn.init.uniform_(torch.zeros(64))

    with without_initialisation():
        thread = threading.Thread(target=build)
        thread.start()
        thread.join()
    assert filled["tensor"].abs().sum() > 0


@pytest.mark.filterwarnings("ignore:.*hold NaN or infinite values")  # the file's NaN head, dropped for the new one
def test_a_load_with_a_new_head_initialises_the_head(tmp_path):
    model = tformer.build_model("bert-tiny", vocab_size=64, head="sequence_classification", num_labels=2)
    with torch.no_grad():
        model.classifier.weight.fill_(float("nan"))  # what uninitialised memory may hold
    model.save(tmp_path / "two")
    with pytest.warns(UserWarning, match="newly initialised: classifier.bias, classifier.weight"):
        three = tformer.load(tmp_path / "two", num_labels=3)  # a new head: the file's does not fit
    weight = three.classifier.weight
    assert weight.shape[0] == 3 and torch.isfinite(weight).all()
    assert abs(weight.std().item() - three.config.initializer_range) < 0.5 * three.config.initializer_range
    with pytest.warns(NonFiniteWeightsWarning):
        two = tformer.load(tmp_path / "two")  # no new head: every weight the file's, NaN included
    assert torch.isnan(two.classifier.weight).all()
    for name, tensor in two.state_dict().items():
        assert torch.equal(tensor, model.state_dict()[name]) or torch.isnan(tensor).all(), name
