"""On a CUDA device every family, attention kernel, precision and backend computes what it computes on the
CPU, or refuses in words. Skipped on a machine without a GPU (CI has none); docs/gpu.md records where it ran.

Float32 comparisons run with TF32 off (matrix products and cuDNN convolutions), so CPU and GPU differ only by
summation order: a relative error under 1e-4 of the output's largest entry (measured: about 1e-6)."""

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import tformer
from tformer.data.lm import random_crops
from tformer.generation import GenerationConfig
from tformer.nn.weights.quantized import Plan, QuantizedLinear
from tformer.quantization import quantize
from tformer.serving.engine import Engine
from tformer.tokenizers import CharTokenizer
from tformer.training.config import TrainingConfig
from tformer.training.tasks import LanguageModelling
from tformer.training.trainer import Trainer

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not torch.cuda.is_available(),
                                                   reason="no CUDA device on this machine: the suite runs without one")]

GENERATOR = torch.Generator().manual_seed(11)


@pytest.fixture(autouse=True)
def _no_tf32():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def ids(batch: int, length: int, vocab: int) -> torch.Tensor:
    return torch.randint(4, vocab, (batch, length), generator=GENERATOR)


def padded_mask(batch: int, length: int) -> torch.Tensor:
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[0, length // 2:] = 0  # one row half padding
    return mask


def tokens_in_and_out(config, length: int = 24, padded: bool = False) -> dict:
    """A decoder's or an encoder's inputs: ids, labels over the vocabulary, a half-padded row if ``padded``."""
    inputs = dict(input_ids=ids(2, length, config.vocab_size), labels=ids(2, length, config.vocab_size))
    return inputs | (dict(attention_mask=padded_mask(2, length)) if padded else {})


# Each family: its model, and its inputs made from the model's config.
FAMILIES = {
    "gpt2": (lambda: tformer.build_model("gpt2", num_layers=2, d_model=64, num_heads=4, vocab_size=96),
             tokens_in_and_out),
    "llama": (lambda: tformer.build_model("llama-small", num_layers=2, d_model=64, num_heads=4, num_kv_heads=2,
                                          vocab_size=96),
              tokens_in_and_out),
    "bert": (lambda: tformer.build_model("bert-tiny", vocab_size=96, max_seq_len=32, head="masked_lm"),
             lambda config: tokens_in_and_out(config, padded=True)),
    "vit": (lambda: tformer.build_model("vit-mnist", num_layers=2, d_model=64),
            lambda config: dict(pixel_values=torch.randn(2, 1, 28, 28, generator=GENERATOR),
                                labels=torch.tensor([3, 7]))),
    "encoder-decoder": (lambda: tformer.build_model("transformer-base", num_layers=2, d_model=64, num_heads=4,
                                                    d_ff=128, vocab_size=96),
                        lambda config: dict(input_ids=ids(2, 12, 96), attention_mask=padded_mask(2, 12),
                                            labels=ids(2, 10, 96))),
    "speech": (lambda: tformer.build_model("whisper-digits", max_source_positions=20),
               lambda config: dict(input_features=torch.randn(2, config.num_mel_bins, 40, generator=GENERATOR),
                                   labels=ids(2, 6, config.vocab_size))),
}


def forward_and_backward(model: torch.nn.Module, inputs: dict, device: str) -> tuple[torch.Tensor, float, float]:
    """Logits, loss and the gradient's norm over every parameter, computed on ``device``."""
    model = model.to(device).eval()  # no dropout: both devices compute the same function
    model.zero_grad()
    output = model(**{name: value.to(device) for name, value in inputs.items()})
    output.loss.backward()
    norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters() if p.grad is not None]))
    return output.logits.detach().cpu(), output.loss.item(), norm.item()


def assert_near(got: torch.Tensor, expected: torch.Tensor, tolerance: float = 1e-4):
    scale = expected.abs().max().item()
    assert (got - expected).abs().max().item() <= tolerance * scale


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_trains_on_the_gpu_as_on_the_cpu(family):
    build, inputs_for = FAMILIES[family]
    torch.manual_seed(0)
    model = build()
    inputs = inputs_for(model.config)
    cpu = forward_and_backward(model, inputs, "cpu")
    gpu = forward_and_backward(model, inputs, "cuda")
    assert_near(gpu[0], cpu[0])
    assert gpu[1] == pytest.approx(cpu[1], rel=1e-5)
    assert gpu[2] == pytest.approx(cpu[2], rel=1e-4)


KERNELS = {"sdpa": {}, "reference": {}, "chunked": {}, "sliding_window": dict(attention_window=8),
           "performer": {}, "flex": {}}


@pytest.mark.parametrize("kernel", KERNELS)
def test_every_attention_kernel_decodes_on_the_gpu_as_on_the_cpu(kernel):
    """The forward over a prompt and the cached steps after it (Performer: its running state)."""
    torch.manual_seed(0)
    model = tformer.build_model("gpt-mini", num_layers=2, vocab_size=64, attention_kernel=kernel,
                                **KERNELS[kernel]).eval()
    prompt = ids(2, 20, 64)
    with torch.no_grad():
        cpu_logits = model(prompt).logits
        cpu_steps = tformer.generate(model, prompt[:1, :6], 10, eos_token_id=[], output_scores=True)
        model.cuda()
        gpu_logits = model(prompt.cuda()).logits.cpu()
        gpu_steps = tformer.generate(model, prompt[:1, :6].cuda(), 10, eos_token_id=[], output_scores=True)
    assert_near(gpu_logits, cpu_logits)
    assert_near(torch.stack(gpu_steps.scores).cpu(), torch.stack(cpu_steps.scores), 1e-3)


def test_gpt2_on_the_gpu_matches_hugging_face_on_the_gpu(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    reference = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=96,
                                                                     n_positions=64, bos_token_id=1,
                                                                     eos_token_id=1)).eval()
    reference.save_pretrained(tmp_path)
    ours = tformer.load(tmp_path).cuda().eval()
    reference.cuda()
    prompt = ids(2, 30, 96).cuda()
    with torch.no_grad():
        assert_near(ours(prompt).logits.cpu(), reference(prompt).logits.cpu(), 1e-5)
        greedy = tformer.generate(ours, prompt[:1, :8], 16, eos_token_id=[])
        expected = reference.generate(prompt[:1, :8], max_new_tokens=16, do_sample=False, min_new_tokens=16,
                                      pad_token_id=0)
    assert greedy.tolist() == expected.tolist()


TOKENS = (torch.arange(3000) * 5) % 16  # a cycle: a model that learns predicts it


def trainer(precision: str, device: str, steps: int = 12, compile: bool | str = False) -> Trainer:
    torch.manual_seed(0)
    model = tformer.build_model("gpt-nano", vocab_size=16, max_seq_len=16)
    config = TrainingConfig(max_steps=steps, batch_size=4, seq_len=16, lr=1e-2, warmup_steps=2, eval_every=6,
                            eval_batches=2, device=device, precision=precision, compile=compile)
    return Trainer(model, config, LanguageModelling(TOKENS, TOKENS[:500]), progress=False)


def test_training_on_the_gpu_defaults_to_bf16_and_a_compiled_step():
    on_gpu = trainer("auto", "cuda", steps=24, compile="auto")
    assert on_gpu.precision == ("bf16" if torch.cuda.is_bf16_supported() else "fp32")
    assert on_gpu.forward_module is not on_gpu.wrapped  # torch.compile's wrapper
    result = on_gpu.train()
    assert result.history[-1]["train_loss"] < result.history[0]["train_loss"]


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_training_runs_on_the_gpu_in_each_precision(precision):
    on_gpu = trainer(precision, "cuda")
    assert next(on_gpu.model.parameters()).device.type == "cuda"
    first = on_gpu.train_step().loss
    if precision == "fp32":
        assert first == pytest.approx(trainer("fp32", "cpu").train_step().loss, rel=1e-5)
    else:  # the step ran under autocast: its loss is the half-precision forward's, not the fp32 one
        inputs, targets = random_crops(TOKENS, 4, 16, seed=1337, step=0)
        fresh = trainer("fp32", "cuda").model
        with torch.no_grad():
            fp32 = F.cross_entropy(fresh(inputs.cuda()).logits.flatten(0, 1), targets.cuda().flatten()).item()
        assert first == pytest.approx(fp32, rel=2e-2) and first != fp32
    result = trainer(precision, "cuda", steps=24).train()
    assert result.history[-1]["train_loss"] < result.history[0]["train_loss"]


@pytest.mark.parametrize("method", ["int8", "w8a8", "int4"])
def test_a_quantized_model_on_the_gpu_multiplies_its_integers_as_a_float_weight(method):
    """Off the CPU a quantized layer multiplies the same integers and scales as a float32 weight
    (nn/weights/quantized.py): the CPU's own "product" way in float32 computes that function."""
    torch.manual_seed(0)
    model = quantize(tformer.build_model("gpt-mini", num_layers=2, vocab_size=64).eval(), method)
    prompt = ids(2, 12, 64)
    for layer in model.modules():
        if isinstance(layer, QuantizedLinear):
            layer._plan = Plan("product", torch.float32, "product", torch.float32)
    with torch.no_grad():
        expected = model(prompt).logits
        got = model.cuda()(prompt.cuda()).logits.cpu()
    assert_near(got, expected)


@pytest.mark.parametrize("mode", ["auto", "in-place"])
def test_the_engine_serves_on_the_gpu_gathering_or_in_place(mode):
    """auto gathers on the GPU (its decode-only steps captured); in-place reads the pool through FlexAttention."""
    torch.manual_seed(0)
    model = tformer.build_model("gpt-mini", num_layers=2, vocab_size=64).cuda().eval()
    engine = Engine(model, cache_tokens=256, block_size=8, paged_attention=mode)
    assert engine.in_place == (None if mode == "auto" else "flex"), engine.paged_attention_note
    prompts = [ids(1, length, 64)[0].tolist() for length in (5, 9, 3)]
    config = GenerationConfig(max_new_tokens=8, eos_token_id=())
    requests = engine.complete(prompts, config)
    for prompt, request in zip(prompts, requests, strict=True):
        alone = tformer.generate(model, torch.tensor([prompt]).cuda(), 8, eos_token_id=[])
        assert request.outputs()[0] == alone[0, len(prompt):].tolist()


def test_the_command_line_generates_on_the_gpu(tmp_path):
    tokenizer = CharTokenizer.train("to be or not to be, that is the question")
    torch.manual_seed(0)
    model = tformer.build_model("gpt-nano", vocab_size=tokenizer.vocab_size, initializer_range=0.2)
    model.tokenizer = tokenizer
    model.save(tmp_path / "model")
    command = [sys.executable, "-m", "tformer", "generate", str(tmp_path / "model"), "--prompt", "to be",
               "--max-new-tokens", "12", "--device", "cuda"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    prompt = torch.tensor([tokenizer.encode("to be")])
    expected = tokenizer.decode(tformer.generate(model, prompt, 12, eos_token_id=[])[0, prompt.shape[1]:].tolist())
    assert done.stdout.rstrip("\n") == "to be" + expected


@pytest.mark.parametrize("options", [dict(), dict(num_beams=3, num_return_sequences=2),
                                     dict(temperature=0.9, top_k=20, seed=5)], ids=["greedy", "beam", "sampling"])
def test_static_cache_decoding_captured_on_the_gpu_gives_the_dynamic_tokens(options):
    """The one-token steps compiled and captured as CUDA graphs; a left-padded batch; a second call with a prompt of
    another length re-uses the capture and gives what a dynamic cache gives."""
    torch.manual_seed(0)
    model = tformer.build_model("gpt-mini", num_layers=2, vocab_size=64, initializer_range=0.3).eval().cuda()
    for length in (12, 17):
        prompt, mask = ids(3, length, 64).cuda(), padded_mask(3, length).flip(1).cuda()  # left padding
        dynamic = tformer.generate(model, prompt, 24, attention_mask=mask, eos_token_id=[], **options)
        static = tformer.generate(model, prompt, 24, attention_mask=mask, eos_token_id=[],
                                  cache_implementation="static", **options)
        assert torch.equal(static, dynamic)


def test_static_cache_captured_on_the_gpu_decodes_speculatively_and_an_encoder_decoder():
    torch.manual_seed(0)
    target = tformer.build_model("gpt-mini", num_layers=2, vocab_size=64, initializer_range=0.3).eval().cuda()
    prompt = ids(1, 8, 64).cuda()
    options = dict(eos_token_id=[], draft_model=target, num_draft_tokens=3)
    assert torch.equal(tformer.generate(target, prompt, 20, cache_implementation="static", **options),
                       tformer.generate(target, prompt, 20, **options))
    translator = tformer.build_model("transformer-base", num_layers=2, d_model=64, num_heads=4, d_ff=128,
                                     vocab_size=96).eval().cuda()
    source, mask = ids(2, 12, 96).cuda(), padded_mask(2, 12).flip(1).cuda()
    for beams in (1, 3):
        assert torch.equal(
            tformer.generate(translator, source, 10, attention_mask=mask, eos_token_id=[], num_beams=beams,
                             cache_implementation="static"),
            tformer.generate(translator, source, 10, attention_mask=mask, eos_token_id=[], num_beams=beams))


@pytest.mark.parametrize("mode, overlap", [("auto", None), ("auto", False), ("in-place", None)])
def test_the_engine_on_the_gpu_captures_its_decode_steps_and_equals_generate(mode, overlap):
    """64 requests of mixed lengths: the decode-only steps through captured graphs (one per batch and context
    bucket), or reading the pool in place through FlexAttention; each launched before the host reads the last
    one's tokens (overlapped steps, CUDA's default) or not; the answers those of generate alone."""
    torch.manual_seed(0)
    model = tformer.build_model("gpt-mini", num_layers=2, vocab_size=64, initializer_range=0.3).cuda().eval()
    engine = Engine(model, cache_tokens=64 * 64 + 512, block_size=16, max_running=64, prefix_caching=False,
                    paged_attention=mode, overlap=overlap)
    assert (engine.captured is not None) == (mode == "auto") and (engine.in_place == "flex") == (mode == "in-place")
    assert (engine.overlapped is not None) == (overlap is None)
    lengths = torch.randint(3, 20, (64,), generator=GENERATOR).tolist()
    prompts = [ids(1, length, 64)[0].tolist() for length in lengths]
    budgets = torch.randint(4, 40, (64,), generator=GENERATOR).tolist()
    configs = [GenerationConfig(max_new_tokens=budget, eos_token_id=()) for budget in budgets]
    requests = [engine.submit(prompt, config) for prompt, config in zip(prompts, configs, strict=True)]
    engine.run_until_idle()
    for prompt, budget, request in zip(prompts, budgets, requests, strict=True):
        alone = tformer.generate(model, torch.tensor([prompt]).cuda(), budget, eos_token_id=[])
        assert request.outputs()[0] == alone[0, len(prompt):].tolist()
    assert mode != "auto" or engine.captured.steps >= 30
    assert overlap is False or engine.overlapped.steps >= 30
