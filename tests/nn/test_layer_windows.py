"""Gemma 2's switches on the one block, stack and caches: a sliding window on some layers only
(``layer_attention_windows``), the scores scaled by ``query_pre_attn_scalar``**-0.5 and soft-capped
(``attention_softcap``), the logits soft-capped (``final_logit_softcap``). Each changes the function; cached
decoding (greedy and beam) equals the full forward with each layer on its own cache backend; training's
gradients through the blocked kernel's cap equal the written-out reference's; the in-place paged kernel, which
cannot cap, refuses such a model in one line (its parity with Hugging Face: tests/interop/test_interop.py)."""

import pytest
import torch
from serving_models import alone

import tformer
from tformer import ModelConfig, build_model
from tformer.generation import GenerationConfig, GenerationError
from tformer.nn.attention import KVCache, RollingKVCache
from tformer.serving import Engine

VOCAB = 61
GEMMA2_LIKE = dict(vocab_size=VOCAB, max_seq_len=64, d_model=36, num_layers=3, num_heads=4, num_kv_heads=2,
                   head_dim=12, d_ff=45, positional="rope", norm="rmsnorm_plus_one", norm_position="sandwich",
                   activation="geglu_tanh", bias=False, scale_embeddings=True, attention_kernel="chunked",
                   layer_attention_windows=(3, 0, 3), attention_softcap=1.0, query_pre_attn_scalar=7,
                   final_logit_softcap=2.0, initializer_range=0.2)  # wide weights: scores into the cap


def gemma2_like(**overrides) -> tformer.models.DecoderLM:
    """A seeded model of GEMMA2_LIKE (with ``overrides``), its norm weights moved off zero."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(**{**GEMMA2_LIKE, **overrides})).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.normal_(0, 0.3)
    return model


def padded_ids(length=16):
    ids = torch.randint(0, VOCAB, (2, length), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # a left-padded row
    return ids, mask


def test_each_layer_runs_its_own_kernel_and_cache():
    model = gemma2_like()
    assert model.config.attention_kernels == ("sliding_window", "chunked")
    kernels = [block.attention.kernel for block in model.stack.blocks]
    assert [kernel.name for kernel in kernels] == ["sliding_window", "chunked", "sliding_window"]
    assert [getattr(kernel, "window", None) for kernel in kernels] == [3, None, 3]
    assert all(kernel.cap == 1.0 and kernel.scale == 7 ** -0.5 for kernel in kernels)
    cache = model.new_cache(2, 40)
    assert [type(layer.self_attention) for layer in cache] == [RollingKVCache, KVCache, RollingKVCache]


@pytest.mark.parametrize("switch", [{"layer_attention_windows": ()}, {"attention_softcap": None},
                                    {"query_pre_attn_scalar": None}, {"final_logit_softcap": None}],
                         ids=lambda switch: next(iter(switch)))
def test_each_switch_changes_the_function(switch):
    ids, mask = padded_ids(20)  # longer than the window
    with torch.no_grad():
        logits = gemma2_like()(ids, attention_mask=mask).logits
        other = gemma2_like(**switch)(ids, attention_mask=mask).logits
    assert (logits - other)[mask.bool()].abs().max() > 1e-3
    assert logits.abs().max() < GEMMA2_LIKE["final_logit_softcap"]


def test_cached_decoding_with_a_window_on_some_layers_equals_the_full_forward():
    model = gemma2_like()
    ids, mask = padded_ids()
    with torch.no_grad():
        full = model(ids, attention_mask=mask).logits
        cache = model.new_cache(2, 16)
        steps = [model(ids[:, :7], attention_mask=mask[:, :7], cache=cache).logits]  # a prefill past the window
        steps.append(model(ids[:, 7:9], attention_mask=mask[:, :9], cache=cache).logits)
        for t in range(9, 16):
            steps.append(model(ids[:, t:t + 1], attention_mask=mask[:, :t + 1], cache=cache).logits)
    assert (torch.cat(steps, 1) - full)[mask.bool()].abs().max() <= 1e-5
    prompt, prompt_mask = ids[:, :6], mask[:, :6]
    for beams in (1, 4):
        assert torch.equal(tformer.generate(model, prompt, 12, attention_mask=prompt_mask, num_beams=beams),
                           tformer.generate(model, prompt, 12, attention_mask=prompt_mask, num_beams=beams,
                                            use_cache=False))


def test_training_gradients_through_the_capped_blocked_kernel_equal_the_reference():
    """With gradients on, chunked and sliding_window run their blocked kernel (the cap's slope in its backward
    pass); the reference kernel is autograd's own."""
    ids, mask = padded_ids()
    losses, gradients = [], []
    for kernel in ("chunked", "reference"):
        model = gemma2_like(attention_kernel=kernel).train()
        loss = model(ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
        loss.backward()
        losses.append(loss.item())
        gradients.append({name: parameter.grad for name, parameter in model.named_parameters()})
    assert abs(losses[0] - losses[1]) < 1e-5
    for name, gradient in gradients[0].items():
        torch.testing.assert_close(gradient, gradients[1][name], rtol=1e-4, atol=1e-6, msg=name)


def test_attention_weights_keep_each_layers_window():
    model = gemma2_like()
    ids, _ = padded_ids()
    with torch.no_grad():
        weights = model(ids, output_attentions=True).attentions  # (B, H, T, T) per layer
    distance = torch.arange(16)[:, None] - torch.arange(16)[None, :]
    outside_window = (distance > 3) | (distance < 0)
    assert weights[0][..., outside_window].abs().max() == 0 and weights[2][..., outside_window].abs().max() == 0
    assert weights[1][..., distance > 3].abs().min() > 0  # the global layer sees every earlier key
    torch.testing.assert_close(weights[1].sum(-1), torch.ones(2, 4, 16))


def test_the_config_travels_in_tformers_own_folder(tmp_path):
    model = gemma2_like()
    model.save(tmp_path / "model")
    loaded = tformer.load(tmp_path / "model")
    assert loaded.config == model.config and loaded.config.layer_attention_windows == (3, 0, 3)
    ids, mask = padded_ids()
    with torch.no_grad():
        assert torch.equal(loaded(ids, attention_mask=mask).logits, model(ids, attention_mask=mask).logits)


def test_the_in_place_paged_kernel_refuses_capped_scores_and_the_engine_gathers():
    """The engine's decode steps read the pool in place only for plain softmax at the default scale: asked for
    it, a capped model is refused in one line; on ``auto`` the engine gathers each context for the model's own
    kernels (its answers equal generate's: the next test)."""
    model = gemma2_like()
    with pytest.raises(GenerationError, match=r"^paged_attention='in-place' cannot serve this model: .*sliding"):
        Engine(model, cache_tokens=256, block_size=8, paged_attention="in-place")
    unwindowed = gemma2_like(layer_attention_windows=())
    with pytest.raises(GenerationError, match=r"cannot serve this model: its attention caps the scores "
                                               r"\(attention_softcap\) or scales them otherwise"):
        Engine(unwindowed, cache_tokens=256, block_size=8, paged_attention="in-place")
    engine = Engine(unwindowed, cache_tokens=256, block_size=8)
    assert engine.paged_attention_note.startswith("paged attention: gather (its attention caps the scores")


def test_concurrent_requests_in_the_serving_engine_equal_generate_alone():
    """Prompts shorter and longer than the window, prefilled and decoded together over the paged pool (each
    layer's kernel over the gathered context: its window or none, its cap), equal ``generate`` for each alone."""
    model = gemma2_like()
    generator = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, VOCAB, (length,), generator=generator).tolist() for length in (1, 9, 3, 20, 6, 13)]
    config = GenerationConfig(max_new_tokens=10, eos_token_id=())
    engine = Engine(model, cache_tokens=512, block_size=4)
    requests = engine.complete(prompts, config)
    for prompt, request in zip(prompts, requests, strict=True):
        assert request.outputs()[0] == alone(model, prompt, config)
    assert engine.pool.blocks_in_use == 0
