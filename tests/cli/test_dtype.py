"""``--dtype {fp32,bf16,fp16}`` of the model option group: the loaded model's floating-point parameters and
buffers cast once it has loaded, on every model command; a quantized model whose layers cannot take that type
on this host refused in one line, never run in another type silently."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import tformer
import tformer.cli.model_source as model_source
from tformer.checkpoint import CheckpointError
from tformer.cli import main
from tformer.cli.model_source import ModelSource, load_model
from tformer.nn.weights import Int8Linear
from tformer.tokenizers import CharTokenizer

TEXT = "to be or not to be, that is the question.\n"
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("dtype") / "m"
    tokenizer = CharTokenizer.train(TEXT)
    torch.manual_seed(0)
    model = tformer.build_model("gpt-nano", vocab_size=tokenizer.vocab_size, positional="rope",
                                initializer_range=0.2)
    model.tokenizer = tokenizer
    model.save(folder)
    return folder


@pytest.fixture
def loaded_models(monkeypatch) -> list:
    """The models the commands load in this test, as load_model returns them."""
    models = []

    def recording_load(source):
        loaded = load(source)
        models.append(loaded.model)
        return loaded

    load = model_source.load_model
    monkeypatch.setattr(model_source, "load_model", recording_load)
    return models


def floating_dtypes(model) -> set:
    return {tensor.dtype for tensor in (*model.parameters(), *model.buffers()) if tensor.is_floating_point()}


@pytest.mark.parametrize("name", ["bf16", "fp16", "fp32"])
def test_the_loader_casts_every_floating_parameter_and_buffer(folder, name):
    model = load_model(ModelSource(str(folder), dtype=DTYPES[name])).model
    assert floating_dtypes(model) == {DTYPES[name]}
    assert model.tokenizer is not None and not model.training
    assert floating_dtypes(load_model(ModelSource(str(folder))).model) == {torch.float32}  # without: as it loads


@pytest.mark.parametrize("name", ["bf16", "fp16"])
def test_generate_runs_the_model_in_the_dtype_asked_for(folder, capsys, loaded_models, name):
    assert main(["generate", str(folder), "--prompt", "to be", "--max-new-tokens", "12", "--dtype", name]) == 0
    (model,) = loaded_models
    assert floating_dtypes(model) == {DTYPES[name]}
    reference = tformer.load(folder).to(DTYPES[name])
    ids = torch.tensor([reference.tokenizer.encode("to be")])
    new = tformer.generate(reference, ids, 12)[0, ids.shape[1]:].tolist()
    assert capsys.readouterr().out == "to be" + reference.tokenizer.decode(new) + "\n"


def test_a_draft_model_loads_in_the_same_dtype(folder, capsys, loaded_models):
    assert main(["generate", str(folder), "--prompt", "to be", "--max-new-tokens", "6", "--draft", str(folder),
                 "--dtype", "bf16"]) == 0
    assert [floating_dtypes(model) for model in loaded_models] == [{torch.bfloat16}] * 2


def test_serve_builds_its_engine_over_the_model_in_the_dtype(folder):
    from tformer.cli.serve import build_engine
    from tformer.generation import GenerationConfig

    engine = build_engine(ModelSource(str(folder), dtype=torch.bfloat16, threads=1),
                          options={"cache_tokens": 256, "block_size": 4})
    request = engine.submit([3, 4, 5], GenerationConfig(max_new_tokens=4, eos_token_id=()))
    engine.run_until_idle()
    assert len(request.outputs()[0]) == 4


def test_an_unknown_dtype_is_refused_naming_the_choices(folder, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["translate", str(folder), "--input", "x", "--dtype", "fp8"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == ("tformer translate: error: argument --dtype: invalid choice: 'fp8' (choose "
                                       "from 'fp32', 'bf16', 'fp16'); see tformer translate --help\n")


@pytest.mark.parametrize("method", ["int8", "int4", "w8a8"])
def test_a_quantized_model_runs_in_the_dtype_or_is_refused_in_one_line(folder, capsys, loaded_models, method):
    """Whether a quantized layer takes bf16 depends on the kernel this host measured fastest: each outcome is
    checked for what it must be."""
    options = ["--quantize", method, *(["--group-size", "32"] if method == "int4" else [])]
    code = main(["generate", str(folder), "--prompt", "to be", "--max-new-tokens", "4", "--dtype", "bf16",
                 *options])
    out, err = capsys.readouterr()
    if code == 0:
        (model,) = loaded_models
        assert model.quantization.method == method
        assert model(torch.tensor([[3, 4, 5]])).logits.dtype == torch.bfloat16
    else:
        assert code == 2 and out == ""
        assert err.startswith(f"tformer generate: error: --dtype bf16: {folder} is quantized ({method}") and \
            "cannot take bfloat16 inputs on this host" in err and err.count("\n") == 1


def test_a_quantized_layer_that_fails_in_the_dtype_is_refused(folder, capsys, monkeypatch):
    def no_bfloat16(self, way, dtype, rows):
        raise RuntimeError("int8 kernel: float32 inputs only\nat kernel.cpp:12")

    monkeypatch.setattr(Int8Linear, "_multiply", no_bfloat16)
    assert main(["info", str(folder), "--quantize", "int8", "--dtype", "bf16"]) == 2
    assert capsys.readouterr().err == (
        f"tformer info: error: --dtype bf16: {folder} is quantized (int8) and its Int8Linear layers cannot take "
        "bfloat16 inputs on this host (int8 kernel: float32 inputs only); leave out --dtype (its float parts stay "
        "float32), or use another --quantize\n")


def test_a_quantized_layer_that_answers_in_another_dtype_is_refused(folder, capsys, monkeypatch):
    def in_float32(self, way, dtype, rows):
        return F.linear(rows.float(), self.dequantized_weight().float())

    monkeypatch.setattr(Int8Linear, "_multiply", in_float32)
    assert main(["generate", str(folder), "--prompt", "to", "--quantize", "int8", "--dtype", "fp16"]) == 2
    assert "its Int8Linear layers answer in torch.float32, not torch.float16" in capsys.readouterr().err


def test_a_quantized_layer_that_takes_the_dtype_runs(folder, capsys, monkeypatch, loaded_models):
    def in_its_inputs_dtype(self, way, dtype, rows):
        return F.linear(rows, self.dequantized_weight().to(rows.dtype), self.bias)

    monkeypatch.setattr(Int8Linear, "_multiply", in_its_inputs_dtype)
    assert main(["generate", str(folder), "--prompt", "to", "--max-new-tokens", "3", "--quantize", "int8",
                 "--dtype", "bf16"]) == 0
    assert torch.bfloat16 in floating_dtypes(loaded_models[0])


def test_convert_writes_the_weights_in_the_dtype(folder, tmp_path, capsys):
    from safetensors.torch import load_file

    assert main(["convert", str(folder), str(tmp_path / "half"), "--to", "tformer", "--dtype", "bf16"]) == 0
    assert {tensor.dtype for tensor in load_file(tmp_path / "half" / "model.safetensors").values()} == \
        {torch.bfloat16}


def test_a_dtype_this_pytorch_cannot_compute_in_on_the_device_is_refused(folder, capsys, monkeypatch):
    """float16 on the CPU came late to PyTorch: where a matrix product in it fails, the command says so."""
    def no_half(input, weight, bias=None):
        if input.dtype == torch.float16:
            raise RuntimeError('"addmm_impl_cpu_" not implemented for \'Half\'')
        return linear(input, weight, bias)

    linear = F.linear
    monkeypatch.setattr(F, "linear", no_half)
    assert main(["generate", str(folder), "--prompt", "to", "--dtype", "fp16"]) == 2
    assert capsys.readouterr().err == (
        f"tformer generate: error: --dtype fp16: PyTorch {torch.__version__} cannot compute in float16 on cpu "
        "(\"addmm_impl_cpu_\" not implemented for 'Half'); leave out --dtype, or give another\n")


def test_a_model_that_fits_only_in_the_dtype_loads_in_it(folder, monkeypatch):
    """--dtype builds the model in the type: no float32 copy, so a model whose float32 load would not fit does."""
    import tformer.memory as memory
    from tformer.models.registry import model_bytes

    config = tformer.load(folder).config
    # float32: its model and the weights read (2x); bfloat16: half a model more than the weights (1.5x)
    monkeypatch.setattr(memory, "available_memory", lambda device: int(1.75 * model_bytes(config)))
    model = load_model(ModelSource(str(folder), dtype=torch.bfloat16)).model
    assert floating_dtypes(model) == {torch.bfloat16}
    with pytest.raises(CheckpointError, match="needs about"):  # float32: refused in one line
        load_model(ModelSource(str(folder)))
