"""``losses.head_loss``: the next-token loss a few positions at a time, never the (N, V) logits whole, equal in value
and gradients to PyTorch's cross-entropy over the whole logits; and the decoder's and the encoder-decoder's
``return_logits=False`` on it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tformer import build_model
from tformer.adapters import add_lora
from tformer.nn import losses
from tformer.nn.weights import Int8Linear
from tformer.nn.weights.backend import reused_weights
from tformer.nn.weights.lora import LoraLinear
from tformer.quantization import quantize

VOCAB, WIDTH, POSITIONS = 37, 8, 23


@pytest.fixture
def small_pieces(monkeypatch):
    """Pieces of 5 positions (23 make 5 pieces, the last short), and a trained head held whole never."""
    monkeypatch.setattr(losses, "HEAD_LOSS_CHUNK_FLOATS", 5 * VOCAB)
    monkeypatch.setattr(losses, "HEAD_LOSS_MIN_ROWS", 1)
    monkeypatch.setattr(losses, "HEAD_LOSS_WHOLE_FLOATS", 0)


class CountingHead(torch.nn.Linear):
    """A linear head that records the most positions it was given at once."""

    most_rows = 0

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        self.most_rows = max(self.most_rows, hidden.reshape(-1, self.in_features).shape[0])
        return super().forward(hidden)


def inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(POSITIONS, WIDTH, generator=generator)
    targets = torch.randint(0, VOCAB, (POSITIONS,), generator=generator)
    targets[[2, 11]] = losses.IGNORE_INDEX
    return hidden, targets


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("train_head", [False, True])
def test_piecewise_loss_and_gradients_equal_torch_cross_entropy_over_the_whole_logits(small_pieces, reduction,
                                                                                       smoothing, train_head):
    torch.manual_seed(0)
    head = CountingHead(WIDTH, VOCAB)
    head.requires_grad_(train_head)
    hidden, targets = inputs()
    whole_hidden, piece_hidden = hidden.clone().requires_grad_(), hidden.clone().requires_grad_()
    whole = F.cross_entropy(F.linear(whole_hidden, head.weight, head.bias), targets, ignore_index=-100,
                            label_smoothing=smoothing, reduction=reduction)
    whole_grads = torch.autograd.grad(whole * 3.0, [whole_hidden, *head.parameters()] if train_head else [whole_hidden])
    piece = losses.head_loss(head, head.parameters(), piece_hidden, targets, VOCAB, smoothing, reduction)
    (piece * 3.0).backward()  # the gradient arriving from above scales the kept ones
    assert head.most_rows == 5
    torch.testing.assert_close(piece, whole, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(piece_hidden.grad, whole_grads[0], rtol=1e-5, atol=1e-7)
    if train_head:
        torch.testing.assert_close(head.weight.grad, whole_grads[1], rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(head.bias.grad, whole_grads[2], rtol=1e-5, atol=1e-7)


def test_without_gradients_the_pieces_add_up_to_the_whole_loss(small_pieces):
    head = CountingHead(WIDTH, VOCAB)
    hidden, targets = inputs(1)
    with torch.no_grad():
        piece = losses.head_loss(head, head.parameters(), hidden, targets, VOCAB)
        assert head.most_rows == 5
        whole = F.cross_entropy(head(hidden), targets)
    torch.testing.assert_close(piece, whole, rtol=1e-6, atol=1e-6)


def test_a_trained_head_runs_whole_below_the_limit_and_in_pieces_above_it(monkeypatch):
    monkeypatch.setattr(losses, "HEAD_LOSS_CHUNK_FLOATS", 5 * VOCAB)
    monkeypatch.setattr(losses, "HEAD_LOSS_MIN_ROWS", 1)
    hidden, targets = inputs(2)
    for limit, rows in ((POSITIONS * VOCAB, POSITIONS), (POSITIONS * VOCAB - 1, 5)):
        monkeypatch.setattr(losses, "HEAD_LOSS_WHOLE_FLOATS", limit)
        head = CountingHead(WIDTH, VOCAB)
        losses.head_loss(head, head.parameters(), hidden.clone().requires_grad_(), targets, VOCAB).backward()
        assert head.most_rows == rows


def test_the_gradient_is_taken_once(small_pieces):
    head = CountingHead(WIDTH, VOCAB)
    hidden, targets = inputs()
    loss = losses.head_loss(head, head.parameters(), hidden.requires_grad_(), targets, VOCAB)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="taken once already"):
        loss.backward()


def test_head_loss_refuses_reduction_none():
    head = CountingHead(WIDTH, VOCAB)
    hidden, targets = inputs()
    with pytest.raises(ValueError, match="mean or a sum"):
        losses.head_loss(head, head.parameters(), hidden, targets, VOCAB, reduction="none")


def decoder_gradients(model, ids, labels, return_logits: bool, smoothing: float = 0.0):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(1)  # the same dropout masks both ways
    output = model(ids, labels=labels, label_smoothing=smoothing, return_logits=return_logits)
    output.loss.backward()
    return output, {name: parameter.grad.clone() for name, parameter in model.named_parameters()
                    if parameter.grad is not None}


@pytest.mark.parametrize("kind", ["full", "lora", "qlora"])
def test_the_decoders_loss_without_logits_equals_its_loss_from_the_logits(small_pieces, kind):
    torch.manual_seed(0)
    model = build_model("gpt-nano", vocab_size=VOCAB, final_logit_softcap=30.0)
    if kind == "qlora":
        model = quantize(model, "int4", group_size=32)
    if kind != "full":
        add_lora(model, rank=4, alpha=8, targets=["attention", "feedforward"])
    model.train()
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(3))
    labels = ids.clone()
    labels[0, :4] = -100  # a prompt not trained on
    with_logits, expected = decoder_gradients(model, ids, labels, True, smoothing=0.1)
    without, grads = decoder_gradients(model, ids, labels, False, smoothing=0.1)
    assert without.logits is None and with_logits.logits.shape == (2, 12, VOCAB)
    torch.testing.assert_close(without.loss, with_logits.loss, rtol=1e-6, atol=1e-6)
    assert grads.keys() == expected.keys() and grads  # the tied table's gradient too (full)
    for name in expected:
        torch.testing.assert_close(grads[name], expected[name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("kind", ["full", "lora"])
def test_the_encoder_decoders_loss_without_logits_equals_its_loss_from_the_logits(small_pieces, kind):
    torch.manual_seed(0)
    model = build_model("transformer-multi30k", vocab_size=VOCAB, d_model=16, num_layers=1, num_heads=2, d_ff=32,
                        max_seq_len=32, lm_head_bias=True, scale_decoder_output=True)
    if kind == "lora":
        add_lora(model, rank=4, alpha=8, targets=["attention", "feedforward"])
    model.train()
    generator = torch.Generator().manual_seed(5)
    source, labels = torch.randint(3, VOCAB, (2, 9), generator=generator), torch.randint(3, VOCAB, (2, 12),
                                                                                         generator=generator)
    labels[1, 8:] = -100  # a shorter target, padded

    def gradients(return_logits):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(1)
        output = model(source, labels=labels, label_smoothing=0.1, return_logits=return_logits)
        output.loss.backward()
        return output, {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    with_logits, expected = gradients(True)
    without, grads = gradients(False)
    assert without.logits is None and with_logits.logits.shape == (2, 12, VOCAB)
    torch.testing.assert_close(without.loss, with_logits.loss, rtol=1e-6, atol=1e-6)
    assert grads.keys() == expected.keys() and grads
    for name in expected:
        torch.testing.assert_close(grads[name], expected[name], rtol=1e-4, atol=1e-6, msg=name)
    with pytest.raises(ValueError, match="needs labels"):
        model(source, decoder_input_ids=labels.clamp(min=0), return_logits=False)


def test_a_quantized_head_is_dequantized_once_for_all_the_pieces(small_pieces, monkeypatch):
    model = quantize(build_model("gpt-nano", vocab_size=VOCAB), "int8")
    add_lora(model, rank=4, alpha=8, targets=["attention"])
    assert isinstance(model.lm_head, Int8Linear)
    made = []
    original = Int8Linear.dequantized_weight
    monkeypatch.setattr(Int8Linear, "dequantized_weight",
                        lambda layer: made.append(layer is model.lm_head) or original(layer))
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(4))
    model(ids, labels=ids, return_logits=False).loss.backward()  # 24 positions: 5 pieces through the head
    assert made.count(True) == 1  # the head's input gradient, every piece's from one float weight
    assert not reused_weights.kept  # and let go once the loss is taken


def test_the_decoder_refuses_to_return_neither_logits_nor_a_loss():
    model = build_model("gpt-nano")
    with pytest.raises(ValueError, match="needs labels"):
        model(torch.zeros(1, 4, dtype=torch.long), return_logits=False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_int8_layer_keeps_its_integers_and_its_weight_apart_within_reused_weights(dtype):
    torch.manual_seed(0)
    layer = Int8Linear.from_linear(torch.nn.Linear(16, 8))
    rows = torch.randn(4, 16).to(dtype)
    with reused_weights:
        product = layer._product(rows)  # the integers as floats, kept
        weight = layer.float_weight(dtype)  # the dequantized weight: not the integers kept above
    torch.testing.assert_close(weight, layer.dequantized_weight().to(dtype))
    torch.testing.assert_close(product, F.linear(rows, weight), rtol=2e-2 if dtype == torch.bfloat16 else 1e-5,
                               atol=1e-2 if dtype == torch.bfloat16 else 1e-6)


def test_adapters_over_a_frozen_head_train_in_pieces_with_the_whole_heads_loss_and_gradients(monkeypatch):
    """Below the limit only a head whose weight trains runs whole: a LoRA adapter's gradients are small to sum."""
    monkeypatch.setattr(losses, "HEAD_LOSS_CHUNK_FLOATS", 5 * VOCAB)
    monkeypatch.setattr(losses, "HEAD_LOSS_MIN_ROWS", 1)
    monkeypatch.setattr(losses, "HEAD_LOSS_WHOLE_FLOATS", POSITIONS * VOCAB)  # a trained head's weight: whole
    torch.manual_seed(0)
    head = LoraLinear(CountingHead(WIDTH, VOCAB), rank=2, alpha=4)
    with torch.no_grad():
        head.lora_B[0].normal_()  # B starts at zero, which would hide a wrong gradient of A
    hidden, targets = inputs()
    loss = losses.head_loss(head, head.parameters(), hidden.clone().requires_grad_(), targets, VOCAB)
    grads = torch.autograd.grad(loss, [head.lora_A[0], head.lora_B[0]])
    assert head.base.most_rows == 5
    whole = F.cross_entropy(head(hidden), targets, ignore_index=-100)
    torch.testing.assert_close(loss, whole, rtol=1e-6, atol=1e-6)
    for got, want in zip(grads, torch.autograd.grad(whole, [head.lora_A[0], head.lora_B[0]]), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
