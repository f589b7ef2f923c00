"""Quantized weights: the int8 and int4 backends against a plain dequantized reference, in both compute
dtypes; every transformer family's quantized logits near its float logits; cached greedy decoding of a
quantized model equal to its own uncached forward; quantized folders that save, load, refuse what they
cannot be, and are refused for training."""

import json
import warnings

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

import tformer
from tformer.checkpoint import CheckpointError
from tformer.nn import compiled
from tformer.nn.weights import (
    Int4Linear,
    Int8Linear,
    QuantizedLinear,
    W8A8Linear,
    quantized,
    use_weights,
    weights_in_use,
)
from tformer.nn.weights.backend import reused_weights
from tformer.nn.weights.int4 import pack_nibbles, quantize_int4, unpack_nibbles
from tformer.nn.weights.int8 import quantize_int8, round_rows
from tformer.nn.weights.quantized import Plan
from tformer.nn.weights.table import QuantizedTable
from tformer.quantization import (
    QuantizationError,
    QuantizationScheme,
    dequantized,
    quantize,
    quantized_weights,
    represented_parameters,
)
from tformer.training.tasks import LanguageModelling
from tformer.training.trainer import Trainer, TrainingConfig, TrainingError


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


def linear(in_features=256, out_features=96, bias=True, seed=0) -> nn.Linear:
    torch.manual_seed(seed)
    layer = nn.Linear(in_features, out_features, bias=bias)
    with torch.no_grad():
        layer.weight.mul_(torch.linspace(0.2, 3.0, out_features)[:, None])  # rows of different ranges
    return layer


# ---- the schemes' arithmetic ----------------------------------------------------------------------------


def test_int8_round_trip_is_within_half_a_step_per_row():
    weight = linear().weight
    integers, scales = quantize_int8(weight)
    assert integers.dtype == torch.int8 and scales.shape == (96,)
    assert integers.abs().max() <= 127 and (integers.abs().amax(1) == 127).all()  # each row's max uses the range
    error = (integers.float() * scales[:, None] - weight).abs()
    assert (error <= scales[:, None] / 2 * (1 + 1e-5)).all()


@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_int4_round_trip_is_within_half_a_step_per_group(group_size):
    weight = linear().weight
    integers, scales, zeros = quantize_int4(weight, group_size)
    assert integers.min() >= 0 and integers.max() <= 15
    groups = weight.reshape(96, -1, group_size)
    restored = ((integers.reshape(96, -1, group_size) - 8) * scales[..., None] + zeros[..., None])
    assert ((restored - groups).abs() <= scales[..., None] / 2 * (1 + 1e-4)).all()
    assert torch.equal(unpack_nibbles(pack_nibbles(integers)), integers)


def test_constant_and_zero_weights_quantize_exactly():
    weight = torch.zeros(4, 64)
    weight[1] = 0.5
    integers, scales = quantize_int8(weight)
    assert torch.equal(integers.float() * scales[:, None], weight)
    integers, scales, zeros = quantize_int4(weight, 32)
    restored = ((integers.reshape(4, 2, 32) - 8) * scales[..., None] + zeros[..., None]).reshape(4, 64)
    assert torch.equal(restored, weight)


# ---- the kernels against the reference x @ (q * scale).T ------------------------------------------------


def layers():
    return [Int8Linear.from_linear(linear()), *[Int4Linear.from_linear(linear(), group_size=g) for g in (32, 64, 128)]]


@pytest.mark.parametrize("way", ["kernel", "product"])
@pytest.mark.parametrize("compute", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("layer", layers(), ids=lambda layer: f"{layer.name}-{getattr(layer, 'group_size', '')}")
@pytest.mark.parametrize("rows", [1, 5, 33, 70])
def test_kernels_and_products_equal_the_dequantized_reference(layer, compute, way, rows):
    layer._prepare(compute)
    layer._plan = Plan("kernel", compute, way, compute)  # these ways, whatever this host's measurement chose
    x = torch.randn(rows, 256)
    reference = x @ layer.dequantized_weight().t() + layer.bias
    with torch.no_grad():
        got = layer(x)
    assert got.dtype == torch.float32
    # bfloat16 keeps 8 bits of mantissa: the inputs and the product each lose up to 2**-9 relative
    assert relative_error(got, reference) <= (1e-5 if compute == torch.float32 else 1e-2)
    assert relative_error(layer(x.view(rows, 1, 256)).view(rows, 96), reference) <= 1e-2  # (B, T, D) inputs


@pytest.mark.parametrize("compute", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("layer", layers(), ids=lambda layer: f"{layer.name}-{getattr(layer, 'group_size', '')}")
def test_many_rows_meet_the_float_weight_a_block_of_output_rows_at_a_time(layer, compute, monkeypatch):
    """The product over many rows (a prompt, a batch of beams) makes the float weight a block of output rows at a
    time, each multiplied while it is in cache: 96 outputs in blocks of 40, 40 and 16 give what the whole
    dequantized weight gives; within ``reused_weights`` (the output head's pieces) the whole weight is made once."""
    monkeypatch.setattr(quantized, "PRODUCT_BLOCK_VALUES", 40 * 256)
    layer._plan = Plan("kernel", compute, "product", compute)
    x = torch.randn(quantized.MANY_ROWS + 8, 256)
    reference = x @ layer.dequantized_weight().t() + layer.bias
    with torch.no_grad():
        got = layer(x)
        with reused_weights:
            kept = layer(x)
            assert len(reused_weights.kept) == 1  # the whole float weight, kept for the stretch
    for out in (got, kept):
        assert relative_error(out, reference) <= (1e-5 if compute == torch.float32 else 1e-2)


@pytest.mark.parametrize("in_features", [8, 24, 30, 40])
def test_int8_widths_the_bfloat16_kernel_cannot_take_run_by_the_product(in_features):
    # aten._weight_int8pack_mm ends the process in bfloat16 for widths that are not a multiple of 16
    layer = Int8Linear.from_linear(nn.Linear(in_features, 48))
    layer._prepare(torch.bfloat16)
    layer._plan = Plan("kernel", torch.bfloat16, "kernel", torch.bfloat16)
    x = torch.randn(5, in_features)
    with torch.no_grad():
        got = layer(x)
    assert relative_error(got, x @ layer.dequantized_weight().t() + layer.bias) <= 1e-2


def test_the_compiled_way_runs_a_model_cast_to_bfloat16():
    """``--quantize int8 --dtype bf16``: the cast rounds the scales to bfloat16; the compiled kernel reads them as
    float32 and answers in the activations' type."""
    if compiled.load_or_none() is None:
        pytest.skip("the compiled kernels do not build here")
    layer = Int8Linear.from_linear(linear()).to(torch.bfloat16)
    assert layer.scales.dtype == torch.bfloat16
    layer._plan = Plan("compiled", torch.float32, "product", torch.float32)
    x = torch.randn(3, 256).to(torch.bfloat16)
    with torch.no_grad():
        got = layer(x)
    assert got.dtype == torch.bfloat16
    reference = x.float() @ layer.dequantized_weight().t() + layer.bias.float()
    assert relative_error(got.float(), reference) <= 1e-2  # the output's bfloat16 rounding


@pytest.mark.parametrize("in_features", [256, 45, 8, 3])  # 16 at a time; 16, 8 and one at a time; 8; one
@pytest.mark.parametrize("rows", [1, 2, 3, 5])
def test_the_compiled_way_equals_the_dequantized_reference(in_features, rows):
    layer = Int8Linear.from_linear(linear(in_features=in_features, out_features=70))  # 70: blocks of 4 and a rest
    layer._plan = Plan("compiled", torch.float32, "product", torch.float32)
    x = torch.randn(rows, in_features)
    with torch.no_grad():
        got = layer(x)
    assert got.dtype == torch.float32
    assert relative_error(got, x @ layer.dequantized_weight().t() + layer.bias) <= 1e-5


def dynamic_reference(layer, x):
    """x's rows rounded to int8 (one step per row: max |x| / 127), times the dequantized weight, plus the bias."""
    steps = x.abs().amax(dim=1, keepdim=True) / 127
    return torch.round(x / steps) * steps @ layer.dequantized_weight().t() + layer.bias


@pytest.mark.parametrize("rows", [1, 5, 33, 70])
def test_the_dynamic_way_equals_its_integer_reference(rows):
    layer = W8A8Linear.from_linear(linear())
    layer._plan = Plan("dynamic", None, "dynamic", None)
    x = torch.randn(rows, 256) * torch.linspace(0.1, 10, rows)[:, None]  # rows of different ranges
    with torch.no_grad():
        got = layer(x)
    assert got.dtype == torch.float32
    assert relative_error(got, dynamic_reference(layer, x)) <= 1e-5  # integer sums are exact
    # each input rounded by at most half a step (max |x| / 254): about 1% of a Gaussian row's output
    assert relative_error(got, x @ layer.dequantized_weight().t() + layer.bias) <= 2e-2
    with torch.no_grad():
        assert torch.equal(layer(torch.zeros(1, 256))[0], layer.bias)  # a zero row: the bias exactly


@pytest.mark.parametrize("shape", [(1, 256), (5, 45), (33, 16), (70, 3)])  # 16 at a time, a rest, one at a time
def test_the_compiled_rounding_and_rescaling_are_the_tensor_operations_bit_for_bit(shape):
    kernels = compiled.load_or_none()
    if kernels is None:
        pytest.skip("the compiled kernels do not build here")
    rows, width = shape
    x = torch.randn(rows, width) * torch.linspace(0.01, 100, rows)[:, None]
    x[-1] = 0  # a row of zeros: the smallest step, integers 0
    integers, steps = kernels.int8_round_rows(x)
    want_integers, want_steps = round_rows(x)
    assert torch.equal(integers, want_integers) and torch.equal(steps, want_steps)
    sums = torch.randint(-2**24, 2**24, (rows, 37), dtype=torch.int32)
    scales, bias = torch.rand(37), torch.randn(37)
    assert torch.equal(kernels.int8_scale_sums(sums, steps, scales, bias), sums.float() * steps * scales + bias)
    assert torch.equal(kernels.int8_scale_sums(sums, steps, scales, torch.empty(0)), sums.float() * steps * scales)


@pytest.mark.parametrize("bias", [True, False])
def test_the_dynamic_way_gives_the_same_with_and_without_the_compiled_kernels(monkeypatch, bias):
    layer = W8A8Linear.from_linear(linear(bias=bias))
    layer._plan = Plan("dynamic", None, "dynamic", None)
    x = torch.randn(40, 256)
    with torch.no_grad():
        got = layer(x)
        monkeypatch.setattr(compiled, "load_or_none", lambda: None)
        assert torch.equal(got, layer(x))


@pytest.mark.parametrize("backend", [Int8Linear, W8A8Linear])
def test_the_plan_is_measured_once_per_backend(backend):
    layer = backend.from_linear(linear())
    layer(torch.randn(2, 256))
    plan = layer._plan
    assert plan.few_way in backend.ways and plan.many_way in backend.ways
    assert plan.kernel_dtype in (None, torch.float32, torch.bfloat16)
    other = backend.from_linear(linear(seed=1))
    other(torch.randn(1, 256))
    assert other._plan is plan


def test_quantized_layers_stay_when_other_backends_are_asked_for():
    model = quantize(tformer.build_model("gpt-nano"), "int8")
    assert weights_in_use(model.decoding_view()) == {"int8"}  # prepacked on the CPU: for float layers only
    use_weights(model, "plain")
    assert weights_in_use(model) == {"int8"}


# ---- every family: quantized logits near the float logits ----------------------------------------------

FAMILIES = {
    "decoder": lambda: tformer.build_model("gpt-nano", d_model=64, num_heads=4),
    "llama-decoder": lambda: tformer.build_model("llama-small", vocab_size=96, d_model=64, num_layers=2, num_heads=4),
    "encoder": lambda: tformer.build_model("bert-tiny", vocab_size=96, head="masked_lm"),
    "encoder-classifier": lambda: tformer.build_model("bert-tiny", vocab_size=96, head="sequence_classification",
                                                      num_labels=3),
    "encoder-decoder": lambda: tformer.build_model("transformer-multi30k", vocab_size=96, num_layers=2, d_model=64,
                                                   num_heads=4, d_ff=128),
    "vision": lambda: tformer.build_model("vit-mnist", num_layers=2, d_model=64),
}
# Relative error of the logits (norm of the difference over the norm) on random weights, whose logits are
# small sums of many terms; int4's step is 17 times int8's (15 levels per group against 255 per row).
# w8a8 (its dynamic way forced) adds each activation's rounding to int8's.
TOLERANCE = {"int8": 0.03, "w8a8": 0.05, "int4": 0.25}


def family_inputs(name: str, model) -> dict:
    generator = torch.Generator().manual_seed(3)
    if name == "vision":
        return {"pixel_values": torch.randn(2, 1, 28, 28, generator=generator)}
    ids = torch.randint(0, 96 if name != "decoder" else 64, (2, 12), generator=generator)
    if name == "encoder-decoder":
        return {"input_ids": ids, "decoder_input_ids": ids[:, :7]}
    return {"input_ids": ids}


def force_dynamic(model):
    """Every w8a8 layer of ``model`` multiplies by its dynamic way, whatever this host's measurement chose."""
    for module in model.modules():
        if isinstance(module, W8A8Linear):
            module._plan = Plan("dynamic", None, "dynamic", None)
    return model


@pytest.mark.parametrize("method", ["int8", "w8a8", "int4"])
@pytest.mark.parametrize("family", list(FAMILIES))
@torch.no_grad()
def test_every_family_quantizes_within_tolerance(family, method):
    torch.manual_seed(0)
    model = FAMILIES[family]().eval()
    inputs = family_inputs(family, model)
    want = model(**inputs).logits
    force_dynamic(quantize(model, method, group_size=32 if method == "int4" else None))
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert all(isinstance(m, QuantizedLinear) for m in linears), "every linear layer quantized, heads included"
    got = model(**inputs).logits
    assert 0 < relative_error(got, want) <= TOLERANCE[method]


@pytest.mark.parametrize("method", ["int8", "w8a8", "int4"])
def test_token_tables_look_up_their_int8_rows_within_half_a_step(method):
    torch.manual_seed(0)
    model = tformer.build_model("bert-tiny", vocab_size=96, head="sequence_classification", num_labels=3)
    table = model.embedding.token.weight.detach().clone()
    quantize(model, method, group_size=32 if method == "int4" else None)
    quantized = model.embedding.token
    assert isinstance(quantized, QuantizedTable) and quantized.owned  # an untied table: its own rows
    integers, scales = quantize_int8(table)
    ids = torch.tensor([[0, 5, 95], [95, 5, 7]])
    got = quantized(ids)
    assert got.shape == (2, 3, table.shape[1]) and got.dtype == torch.float32
    assert torch.equal(got, integers[ids].float() * scales[ids][..., None])
    assert ((got - table[ids]).abs() <= scales[ids][..., None] / 2 * (1 + 1e-5)).all()


def test_a_tied_table_reads_its_int8_heads_rows_and_a_float_head_keeps_it_float():
    torch.manual_seed(0)
    model = tformer.build_model("gpt-nano")
    table = model.embedding.token.weight.detach().clone()
    quantize(model, "int8")
    assert isinstance(model.lm_head, Int8Linear) and not model.embedding.token.owned
    assert not any(name.startswith("embedding.token") for name in model.state_dict())  # one copy: the head's
    assert quantized_weights(model) == sum(m.weight.numel() for m in tformer.build_model("gpt-nano").modules()
                                           if isinstance(m, nn.Linear))
    ids = torch.arange(model.config.vocab_size)
    torch.testing.assert_close(model.embedding.token(ids), model.lm_head.dequantized_weight(), rtol=0, atol=0)
    assert torch.equal(model.lm_head.qweight, quantize_int8(table)[0])
    int4 = quantize(tformer.build_model("gpt-nano"), "int4", group_size=32)  # int4 groups are not rows: own table
    assert isinstance(int4.embedding.token, QuantizedTable) and int4.embedding.token.owned
    kept = quantize(tformer.build_model("gpt-nano"), "int8", head=False)
    assert type(kept.lm_head).__name__ == "LMHead" and kept.lm_head.weight is kept.embedding.token.weight
    floats = quantize(tformer.build_model("gpt-nano"), "int8", embeddings=False)
    assert isinstance(floats.embedding.token, nn.Embedding) and isinstance(floats.lm_head, Int8Linear)
    assert "token tables in float" in floats.quantization.describe()


@pytest.mark.parametrize("preset, options", [("gpt-nano", {}), ("gpt-nano", {"tie_embeddings": False}),
                                             ("bert-tiny", {"vocab_size": 96, "head": "sequence_classification"})],
                         ids=["tied", "untied", "encoder"])
@pytest.mark.parametrize("scheme", [{"method": "int8"}, {"method": "int4", "group_size": 32},
                                    {"method": "int8", "head": False}, {"method": "int8", "embeddings": False},
                                    {"method": "int4", "group_size": 32, "embeddings": False}],
                         ids=["int8", "int4", "float-head", "float-tables", "int4-float-tables"])
def test_a_quantized_model_counts_the_parameters_of_the_float_model_it_stands_for(preset, options, scheme):
    """num_parameters counts only what stayed float (896 of gpt-nano's 28,800 under int8)."""
    float_model = tformer.build_model(preset, **options)
    model = quantize(tformer.build_model(preset, **options), **scheme)
    for exclude in (False, True):
        assert represented_parameters(model, exclude) == float_model.num_parameters(exclude)
    assert represented_parameters(float_model) == float_model.num_parameters()


def test_int4_keeps_layers_whose_inputs_do_not_group_in_float_and_says_so():
    model = quantize(tformer.build_model("gpt-nano", d_model=48, num_heads=4), "int4", group_size=32)
    assert len(model.quantization.float_layers) > 0  # 48 inputs: not a multiple of 32
    assert all(not isinstance(model.get_submodule(name), QuantizedLinear) for name in model.quantization.float_layers)
    assert "feedforward.out_proj" not in " ".join(model.quantization.float_layers)  # 192 inputs group


# ---- decoding ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["int8", "w8a8", "int4"])
@torch.no_grad()
def test_greedy_decoding_of_a_quantized_model_follows_its_own_forward(method):
    torch.manual_seed(0)
    model = force_dynamic(quantize(tformer.build_model("gpt-nano", d_model=64, num_heads=4).eval(), method,
                                   group_size=32 if method == "int4" else None))
    prompt = torch.randint(0, 64, (2, 5))
    generated = tformer.generate(model, prompt, 12, eos_token_id=[])
    for step in range(5, generated.shape[1]):
        logits = model(generated[:, :step]).logits[:, -1]
        assert torch.equal(logits.argmax(-1), generated[:, step])


# ---- checkpoints -------------------------------------------------------------------------------------


def quantized_folder(tmp_path, method="int8", **options):
    torch.manual_seed(0)
    model = quantize(tformer.build_model("gpt-nano", d_model=64, num_heads=4).eval(), method, **options)
    model.save(tmp_path / method)
    return model, tmp_path / method


@pytest.mark.parametrize("method", ["int8", "w8a8", "int4"])
@torch.no_grad()
def test_a_quantized_folder_loads_back_the_same_model(tmp_path, method):
    model, folder = quantized_folder(tmp_path, method, group_size=32 if method == "int4" else None)
    config = json.loads((folder / "config.json").read_text())
    assert config["quantization"]["method"] == method
    tensors = load_file(folder / "model.safetensors")
    assert tensors["stack.blocks.0.attention.qkv_proj.qweight"].dtype == (torch.uint8 if method == "int4"
                                                                          else torch.int8)
    assert not any(name.endswith("proj.weight") for name in tensors)  # no float copy of a quantized weight
    loaded = tformer.load(folder)
    assert loaded.quantization == model.quantization and weights_in_use(loaded) == {method}
    ids = torch.randint(0, 64, (2, 9))
    assert torch.equal(loaded(ids).logits, model(ids).logits)


@torch.no_grad()
def test_an_untied_table_saves_its_rows_and_a_folder_from_before_tables_keeps_them_float(tmp_path):
    torch.manual_seed(0)
    model = quantize(tformer.build_model("bert-tiny", vocab_size=96, head="sequence_classification", num_labels=3)
                     .eval(), "int8")
    model.save(tmp_path / "tables")
    tensors = load_file(tmp_path / "tables" / "model.safetensors")
    assert tensors["embedding.token.qweight"].dtype == torch.int8 and "embedding.token.weight" not in tensors
    ids = torch.randint(0, 96, (2, 9))
    assert torch.equal(tformer.load(tmp_path / "tables")(ids).logits, model(ids).logits)
    older = quantize(tformer.build_model("bert-tiny", vocab_size=96, head="sequence_classification", num_labels=3)
                     .eval(), "int8", embeddings=False)
    older.save(tmp_path / "older")
    config = json.loads((tmp_path / "older" / "config.json").read_text())
    del config["quantization"]["embeddings"]  # what a folder written before token tables were quantized records
    (tmp_path / "older" / "config.json").write_text(json.dumps(config))
    loaded = tformer.load(tmp_path / "older")
    assert not loaded.quantization.embeddings and isinstance(loaded.embedding.token, nn.Embedding)
    assert torch.equal(loaded(ids).logits, older(ids).logits)


def test_load_quantizes_a_float_folder_and_refuses_to_requantize(tmp_path):
    torch.manual_seed(0)
    tformer.build_model("gpt-nano").save(tmp_path / "float")
    model = tformer.load(tmp_path / "float", quantize="int4")
    assert model.quantization.method == "int4" and model.quantization.group_size == 64
    _, folder = quantized_folder(tmp_path)
    assert tformer.load(folder, quantize="int8").quantization.method == "int8"  # what it is already
    with pytest.raises(CheckpointError, match="quantized already \\(int8\\); it cannot be quantized again as int4"):
        tformer.load(folder, quantize="int4")


def test_a_corrupted_scale_tensor_or_an_unknown_scheme_is_refused_at_load(tmp_path):
    _, folder = quantized_folder(tmp_path)
    tensors = load_file(folder / "model.safetensors")
    tensors["stack.blocks.0.attention.qkv_proj.scales"] = tensors["stack.blocks.0.attention.qkv_proj.scales"][:-1]
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(CheckpointError, match="scales"):
        tformer.load(folder)
    _, folder = quantized_folder(tmp_path / "other")
    config = json.loads((folder / "config.json").read_text())
    config["quantization"]["method"] = "int3"
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="quantization method 'int3' is not one of int8, int4, w8a8"):
        tformer.load(folder)


@pytest.mark.parametrize("method", ["int8", "int4"])
def test_a_float_layer_the_model_lacks_or_a_float_qweight_is_refused_at_load(tmp_path, capsys, method):
    """Both loaded without a word: the float_layers entry was ignored, the float32 integers cast to int8."""
    from tformer.cli import main

    _, folder = quantized_folder(tmp_path, method, group_size=32 if method == "int4" else None)
    config_file = folder / "config.json"
    config = json.loads(config_file.read_text())
    config["quantization"]["float_layers"] = ["stack.blocks.7.attention.qkv_proj"]
    config_file.write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"model.safetensors: config.json's quantization float_layers names "
                                              r"stack.blocks.7.attention.qkv_proj, which the model has no linear "
                                              r"layer of \(float_layers lists linear layers of the model, such as "
                                              r"stack.blocks.0.attention.qkv_proj\)$"):
        tformer.load(folder)
    config["quantization"]["float_layers"] = []
    config_file.write_text(json.dumps(config))
    tensors = load_file(folder / "model.safetensors")
    name = "stack.blocks.0.attention.qkv_proj.qweight"
    integers = "uint8" if method == "int4" else "int8"
    tensors[name] = tensors[name].float()
    save_file(tensors, folder / "model.safetensors")
    message = (f"{folder / 'model.safetensors'}: {name} holds float32 values where this {method} checkpoint holds "
               f"{integers} integers; the weights are not what tformer quantize writes")
    with pytest.raises(CheckpointError) as caught:
        tformer.load(folder)
    assert str(caught.value) == message
    assert main(["info", str(folder)]) == 2
    assert capsys.readouterr().err == f"tformer info: error: {message}\n"


@pytest.mark.parametrize("method, tensor, value", [("int8", "scales", 1e38), ("int4", "scales", 3e20),
                                                   ("int4", "zeros", -1e6)])
def test_absurd_scales_warn_as_nan_scales_do(tmp_path, method, tensor, value):
    """Scales of 1e38 gave only <unk> tokens without the warning a NaN scale gets."""
    from tformer.checkpoint import NonFiniteWeightsWarning

    _, folder = quantized_folder(tmp_path, method, group_size=32 if method == "int4" else None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tformer.load(folder)  # a folder as tformer quantize writes it: no warning
    tensors = load_file(folder / "model.safetensors")
    name = f"stack.blocks.1.feedforward.out_proj.{tensor}"
    tensors[name][0] = value
    save_file(tensors, folder / "model.safetensors")
    with pytest.warns(NonFiniteWeightsWarning) as caught:
        model = tformer.load(folder)
    assert [str(w.message) for w in caught] == [
        f"{folder / 'model.safetensors'}: {name} hold values up to {abs(value):.3g}, where quantization scales stay "
        "below 10000 (a trained layer's are far below 1); the model's outputs will be infinite or meaningless (is "
        "the file corrupt?)"]
    if method == "int8":
        assert not torch.isfinite(model(torch.tensor([[1, 2, 3]])).logits).all()


def test_schemes_are_checked():
    with pytest.raises(QuantizationError, match="int4 group_size=48 is not one of 32, 64, 128"):
        QuantizationScheme("int4", 48)
    for method in ("int8", "w8a8"):
        with pytest.raises(QuantizationError, match=f"{method} is per output channel: it takes no group_size"):
            QuantizationScheme(method, 64)
    with pytest.raises(QuantizationError, match="quantized already"):
        quantize(quantize(tformer.build_model("gpt-nano"), "int8"), "int8")
    with pytest.raises(QuantizationError, match="RNN baseline"):
        quantize(tformer.build_model("rnn-multi30k", vocab_size=50), "int8")


def test_training_a_quantized_model_is_refused_and_evaluating_it_is_not(tmp_path):
    tokens = torch.arange(64).repeat(20)
    model, _ = quantized_folder(tmp_path)
    trainer = Trainer(model, TrainingConfig(max_steps=1, batch_size=2, seq_len=8, eval_batches=1),
                      LanguageModelling(tokens, tokens), out_dir=tmp_path / "run", progress=False)
    assert trainer.evaluate() > 0
    with pytest.raises(TrainingError, match="quantized \\(int8\\).*cannot be trained"):
        trainer.train()
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_hugging_face_export_writes_the_dequantized_weights_with_a_warning(tmp_path):
    model, _ = quantized_folder(tmp_path)
    with pytest.warns(UserWarning, match="dequantized"):
        model.save(tmp_path / "hf", format="hf")
    assert model.quantization is not None  # the model itself stays quantized
    back = tformer.load(tmp_path / "hf")
    assert back.quantization is None
    torch.testing.assert_close(back.stack.blocks[0].attention.qkv_proj.weight,
                               model.stack.blocks[0].attention.qkv_proj.dequantized_weight())


def test_dequantized_gives_float_layers_and_ties_the_head_again():
    model = dequantized(quantize(tformer.build_model("gpt-nano"), "int8"))
    assert weights_in_use(model) == {"plain"} and model.quantization is None
    assert model.lm_head.weight is model.embedding.token.weight


@pytest.mark.parametrize("method", ["int8", "w8a8", "int4"])
def test_a_loaded_quantized_folder_serves_what_it_generates_alone(tmp_path, method):
    from tformer.generation import GenerationConfig
    from tformer.serving.engine import Engine

    _, folder = quantized_folder(tmp_path, method, group_size=32 if method == "int4" else None)
    model = force_dynamic(tformer.load(folder))
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 64, (length,), generator=generator).tolist() for length in (3, 9, 5, 17, 1, 12)]
    config = GenerationConfig(max_new_tokens=12, eos_token_id=())
    requests = Engine(model, cache_tokens=1024, block_size=8, max_running=16).complete(prompts, config)
    assert weights_in_use(model) == {method}
    for prompt, request in zip(prompts, requests, strict=True):
        alone = tformer.generate(model, torch.tensor([prompt]), 12, eos_token_id=[])[0, len(prompt):].tolist()
        assert request.outputs()[0] == alone
