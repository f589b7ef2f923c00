"""``cache_implementation="static"``: the same tokens as the dynamic cache for every strategy and family; a
compiled step is one graph, traced once and re-used by later calls whose prompts differ; layers whose cache
cannot be static are refused by name. (The CUDA-graph capture itself is checked in tests/test_cuda.py.)"""

import pytest
import torch
from torch._dynamo.utils import counters

import tformer
from tformer.generation import GenerationConfig, GenerationError, StaticSession, stream_generate
from tformer.generation import session as sessions


def decoder(**fields):
    torch.manual_seed(0)
    return tformer.build_model("gpt-nano", initializer_range=0.3, **fields).eval()


def left_padded():
    ids = torch.tensor([[0, 0, 5, 9, 3, 11], [7, 1, 2, 8, 4, 6], [0, 13, 12, 10, 2, 1]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1]])
    return ids, mask


def both(model, ids, max_new_tokens, **options):
    """The dynamic and the static cache's outputs of one call."""
    return [tformer.generate(model, ids, max_new_tokens, cache_implementation=kind, **options)
            for kind in ("dynamic", "static")]


@pytest.mark.parametrize("options", [
    dict(eos_token_id=[]),
    dict(eos_token_id=[3, 17], min_new_tokens=2),
    dict(temperature=0.9, top_k=20, seed=5, num_return_sequences=2, eos_token_id=[]),
    dict(num_beams=3, num_return_sequences=2, eos_token_id=[3]),
    dict(repetition_penalty=1.3, eos_token_id=[]),
], ids=["greedy", "greedy-ending", "sampling", "beam", "repetition-penalty"])
@pytest.mark.parametrize("positional", ["learned", "rope", "alibi", "relative"])
def test_static_decoding_gives_the_dynamic_tokens(options, positional):
    fields = dict(positional=positional, num_kv_heads=2) if positional == "rope" else dict(positional=positional)
    ids, mask = left_padded()
    dynamic, static = both(decoder(**fields), ids, 24, attention_mask=mask, **options)
    assert torch.equal(static, dynamic)


def test_static_decoding_streams_and_decodes_speculatively_as_the_dynamic_cache():
    target = decoder()
    draft = tformer.build_model("gpt-nano", num_layers=1, initializer_range=0.3).eval()
    prompt = torch.tensor([[4, 9, 2, 7]])
    dynamic, static = both(target, prompt, 30, eos_token_id=[], draft_model=draft, num_draft_tokens=3,
                           return_dict=True)
    assert torch.equal(static.sequences, dynamic.sequences)
    assert static.accepted_draft_tokens == dynamic.accepted_draft_tokens < static.draft_tokens  # some rejected
    chunks = list(stream_generate(target, prompt, 12, eos_token_id=[], cache_implementation="static"))
    assert torch.equal(torch.cat([prompt, *chunks], 1), dynamic.sequences[:, :16])


@pytest.mark.parametrize("options", [dict(), dict(num_beams=3, num_return_sequences=3)], ids=["greedy", "beam"])
def test_an_encoder_decoder_decodes_statically_as_dynamically(options):
    torch.manual_seed(0)
    model = tformer.build_model("transformer-multi30k", vocab_size=40, num_layers=2, d_model=32, num_heads=4, d_ff=64,
                                max_seq_len=32).eval()
    ids, mask = left_padded()
    dynamic, static = both(model, ids, 10, attention_mask=mask, eos_token_id=[], **options)
    assert torch.equal(static, dynamic)


@pytest.mark.parametrize("kernel", ["reference", "chunked", "flex"])
def test_every_kernel_over_a_full_cache_decodes_statically_as_dynamically(kernel):
    ids, mask = left_padded()
    dynamic, static = both(decoder(attention_kernel=kernel, positional="alibi"), ids, 16, attention_mask=mask,
                           eos_token_id=[])
    assert torch.equal(static, dynamic)


def test_layers_whose_cache_cannot_be_static_are_refused_by_name():
    model = decoder(attention_kernel="sliding_window", attention_window=4)
    with pytest.raises(GenerationError, match="cache_implementation='static' needs a full key/value cache in every "
                                              "layer, and a layer keeps a RollingKVCache"):
        tformer.generate(model, torch.tensor([[1, 2, 3]]), 4, cache_implementation="static")
    with pytest.raises(GenerationError, match="cache_implementation='bogus' must be one of 'dynamic', 'static'"):
        GenerationConfig(cache_implementation="bogus")
    with pytest.raises(GenerationError, match="cache_implementation='static' needs use_cache=True"):
        GenerationConfig(cache_implementation="static", use_cache=False)


def test_a_compiled_step_is_one_graph_traced_once_for_prompts_of_other_lengths(traced_on_the_cpu):
    model = decoder(positional="rope", num_kv_heads=2)
    expected = {}
    for length in (6, 9):  # 6 + 20 and 9 + 20 positions: both held in 32
        ids = torch.randint(0, 64, (2, length), generator=torch.Generator().manual_seed(length))
        static = tformer.generate(model, ids, 20, eos_token_id=[], cache_implementation="static")
        expected[length] = static
        assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
    torch._dynamo.reset()
    sessions._WRAPPED_STEPS.clear()
    for length, static in expected.items():  # the same outputs as a fresh compile, and as the dynamic cache
        ids = torch.randint(0, 64, (2, length), generator=torch.Generator().manual_seed(length))
        assert torch.equal(tformer.generate(model, ids, 20, eos_token_id=[], cache_implementation="static"), static)
        assert torch.equal(tformer.generate(model, ids, 20, eos_token_id=[]), static)


def test_a_compiled_session_reuses_the_buffers_of_an_ended_one(traced_on_the_cpu):
    """A CUDA graph is captured over its caches' addresses: the next call of that shape gets the same buffers."""
    model = decoder()
    ids = torch.tensor([[4, 9, 2, 7]])
    first = StaticSession(model.decoding_view(), 1, 32)
    addresses = [layer.self_attention.keys.data_ptr() for layer in first.cache]
    del first
    second = StaticSession(model.decoding_view(), 1, 32)
    assert [layer.self_attention.keys.data_ptr() for layer in second.cache] == addresses
    third = StaticSession(model.decoding_view(), 1, 32)  # while the second lives: buffers of its own
    assert [layer.self_attention.keys.data_ptr() for layer in third.cache] != addresses
    logits = second.extend(ids)
    assert torch.isfinite(logits).all() and torch.isfinite(second.extend(ids[:, :1])).all()


FAMILIES = {
    "llama": lambda: (tformer.build_model("llama-small", num_layers=2, d_model=64, num_heads=4, num_kv_heads=2,
                                          vocab_size=96), torch.randint(4, 96, (2, 7))),
    "encoder-decoder": lambda: (tformer.build_model("transformer-base", num_layers=2, d_model=64, num_heads=4,
                                                    d_ff=128, vocab_size=96), torch.randint(4, 96, (2, 12))),
    "speech": lambda: (tformer.build_model("whisper-digits", max_source_positions=20), torch.randn(2, 80, 40)),
}


@pytest.mark.parametrize("family", FAMILIES)
def test_every_familys_compiled_step_is_one_graph(traced_on_the_cpu, family):
    torch.manual_seed(0)
    model, inputs = FAMILIES[family]()
    options = dict(eos_token_id=[])
    if family != "speech":  # the second prompt left-padded
        options["attention_mask"] = torch.ones(inputs.shape, dtype=torch.long)
        options["attention_mask"][1, :3] = 0
    static = tformer.generate(model.eval(), inputs, 8, cache_implementation="static", **options)
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
    assert torch.equal(static, tformer.generate(model, inputs, 8, **options))
