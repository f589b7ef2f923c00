"""KV-cached decoding computes the same logits as a full forward pass, at every step, for every
attention and position variant, with and without left padding, through the model's step hook (a
StackSession) and through its forward (a ModelSession); rewinding and reordering the cache keep it
exact; the prepacked weight backend follows the weights and the thread count."""


import pytest
import torch

import tformer
from tformer import ModelConfig, build_model
from tformer.generation import ModelSession, StackSession, StaticSession
from tformer.nn import compiled
from tformer.nn.weights import PrepackedLinear, use_weights, weights_in_use
from tformer.nn.weights import prepacked as prepacked_backend
from tformer.nn.weights.backend import decoding_step

BASE = ModelConfig(vocab_size=61, max_seq_len=48, d_model=32, num_layers=2, num_heads=4)
VARIANTS = {
    "mha-learned": dict(positional="learned"),
    "gqa-rope-llama": dict(positional="rope", norm="rmsnorm", activation="swiglu", num_kv_heads=2, bias=False,
                           tie_embeddings=False),
    "mqa-rope": dict(positional="rope", num_kv_heads=1),
    "alibi": dict(positional="alibi"),
    "relative": dict(positional="relative"),
    "sinusoidal-post-norm": dict(positional="sinusoidal", norm_position="post"),
    "sinusoidal-split": dict(positional="sinusoidal", sinusoidal_layout="split"),
    "geglu-tanh-relative": dict(positional="relative", activation="geglu_tanh", norm="rmsnorm", bias=False),
    "no-positions-geglu-scaled": dict(positional="none", activation="geglu", scale_embeddings=True),
}
# Prefill 5 tokens, then a block of 3 (how speculative decoding verifies drafts), then one at a time.
CHUNKS = [(0, 5), (5, 8)] + [(t, t + 1) for t in range(8, 14)]


def left_padded_batch():
    ids = torch.randint(0, 61, (3, 14))
    mask = torch.ones(3, 14, dtype=torch.long)
    mask[0, :4] = 0  # 4 padding tokens before row 0's prompt
    mask[2, :1] = 0
    return ids, mask


@pytest.mark.parametrize("session_type", [StackSession, ModelSession, StaticSession],
                         ids=["step-hook", "model-forward", "static"])
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left-padded"])
@pytest.mark.parametrize("variant", list(VARIANTS))
@torch.inference_mode()
def test_cached_logits_equal_full_forward_at_every_step(variant, padded, session_type):
    model = build_model(BASE, **VARIANTS[variant]).eval().decoding_view()
    ids, mask = left_padded_batch()
    mask = mask if padded else None
    session = session_type(model, 3, 14, None if mask is None else mask[:, :5])
    for start, end in CHUNKS:
        cached = session.extend(ids[:, start:end])
        full = model(ids[:, :end], attention_mask=None if mask is None else mask[:, :end]).logits[:, start:end]
        real = torch.ones_like(ids[:, start:end], dtype=torch.bool) if mask is None else mask[:, start:end].bool()
        torch.testing.assert_close(cached[real], full[real], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("variant", ["mha-learned", "gqa-rope-llama", "sinusoidal-post-norm"])
def test_projections_split_across_threads_stay_exact(variant, monkeypatch):
    threads = torch.get_num_threads()
    monkeypatch.setattr(prepacked_backend, "few_row_ways", lambda threads, dtype: ("split", "whole"))  # as measured
    torch.set_num_threads(2)  # the prepacked backend then cuts each projection in two (one slice per thread)
    try:
        model = build_model(BASE.replace(d_model=256, vocab_size=600), **VARIANTS[variant]).decoding_view()  # big
        assert model.stack.blocks[0].attention.qkv_proj.packed().parts == model.lm_head.packed().parts == 2
        ids, mask = left_padded_batch()
        with torch.inference_mode():
            session = StackSession(model, 3, 14, mask[:, :5])
            for start, end in CHUNKS:
                cached = session.extend(ids[:, start:end])
                full = model(ids[:, :end], attention_mask=mask[:, :end]).logits[:, start:end]
                real = mask[:, start:end].bool()
                torch.testing.assert_close(cached[real], full[real], rtol=1e-5, atol=1e-5)
        prompts = torch.randint(0, 61, (3, 6))  # a batch: the prefill's last positions are strided rows
        assert torch.equal(tformer.generate(model, prompts, 8), tformer.generate(model, prompts, 8, use_cache=False))
    finally:
        torch.set_num_threads(threads)
    assert model.stack.blocks[0].attention.qkv_proj.packed().parts == 1  # rebuilt for the new thread count


@pytest.mark.parametrize("way", ["split", "compiled", "whole"])
@pytest.mark.parametrize("size_out", [768, 601], ids=["outputs-split", "inputs-split"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_a_large_projection_equals_nn_linear_at_every_row_count(way, size_out, bias, monkeypatch):
    if way == "compiled" and compiled.load_or_none() is None:
        pytest.skip("the compiled kernels do not build here")
    threads = torch.get_num_threads()
    monkeypatch.setattr(prepacked_backend, "few_row_ways", lambda threads, dtype: (way, "whole"))  # as if measured so
    torch.set_num_threads(2)  # split: two blocks, of outputs when they divide (768), of inputs when they do not (601)
    try:
        linear = torch.nn.Linear(256, size_out, bias=bias)  # over 512 KB: split across threads
        prepacked = PrepackedLinear.from_linear(linear)
        with torch.no_grad(), decoding_step:
            packed = prepacked.packed()
            assert (packed.kernels is not None) == (way == "compiled")
            assert packed.parts == (2 if way == "split" else 1)
            assert (packed.row_parts is not None) == (way == "split" and size_out % 2 == 0)
            for rows in (1, 3, 7):  # a few rows
                x = torch.randn(rows, 256)
                torch.testing.assert_close(prepacked(x), linear(x), rtol=1e-5, atol=1e-5)
            # Only the whole way (and splitting the inputs) reads the (in, out) copy: the others make none
            assert (packed._in_out is not None) == (way == "whole" or (way == "split" and size_out % 2 == 1))
            for rows in (8, 16, 64, 65, 100):  # W @ x.T, the (in, out) copy
                x = torch.randn(rows, 256)
                torch.testing.assert_close(prepacked(x), linear(x), rtol=1e-5, atol=1e-5)
            x = torch.randn(2, 3, 256)  # (B, T, in) as a head gets it
            torch.testing.assert_close(prepacked(x), linear(x), rtol=1e-5, atol=1e-5)
    finally:
        torch.set_num_threads(threads)


def test_the_few_row_ways_are_ranked_by_their_measured_times(monkeypatch):
    measured = {"compiled": 3.0, "split": 1.0, "whole": 2.0}
    monkeypatch.setattr(prepacked_backend, "fastest_of_rounds", lambda calls: {way: measured[way] for way in calls})
    monkeypatch.setattr(prepacked_backend, "_FEW_ROW_WAYS", {})
    builds = compiled.load_or_none() is not None
    assert prepacked_backend.few_row_ways(2) == ("split", "whole") + ("compiled",) * builds
    assert prepacked_backend.few_row_ways(1) == ("whole",) + ("compiled",) * builds  # one thread: nothing to split
    assert prepacked_backend.few_row_ways(2, torch.bfloat16) == ("split", "whole") + ("compiled",) * builds
    assert prepacked_backend.few_row_ways(2, torch.float16) == ("split", "whole")  # no kernel for the type to race


def test_a_layer_takes_the_first_way_its_weight_allows(monkeypatch):
    monkeypatch.setattr(prepacked_backend, "few_row_ways", lambda threads, dtype: ("compiled", "whole"))
    cases = [(torch.float32, True), (torch.bfloat16, True), (torch.float16, True), (torch.float16, False)]
    for dtype, bias in cases:  # the kernel takes float32 and bfloat16
        linear = torch.nn.Linear(64, 96, bias=bias).to(dtype)
        prepacked = PrepackedLinear.from_linear(linear)
        with torch.no_grad(), decoding_step:
            packed = prepacked.packed()
            takes = dtype in (torch.float32, torch.bfloat16) and compiled.load_or_none() is not None
            assert (packed.kernels is not None) == takes
            x = torch.randn(3, 64, dtype=dtype)
            torch.testing.assert_close(prepacked(x), linear(x))


@pytest.mark.parametrize("size_out", [99, 601], ids=["in-cache", "large"])  # shares of rows with leftovers
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_a_bfloat16_layer_in_the_compiled_kernel_sums_in_float32_and_rounds_once(size_out, bias, monkeypatch):
    """bfloat16 decoding reads its weights through tformer's kernel (PyTorch's bfloat16 product costs a few times
    as much at decoding sizes): each output the float32 sum of the exact products plus the bias, rounded to
    bfloat16 once, as PyTorch's product gives it, to one rounding step (the order of the float32 additions)."""
    if compiled.load_or_none() is None:
        pytest.skip("the compiled kernels do not build here")
    monkeypatch.setattr(prepacked_backend, "few_row_ways", lambda threads, dtype: ("compiled", "whole"))
    linear = torch.nn.Linear(256, size_out, bias=bias).to(torch.bfloat16)
    prepacked = PrepackedLinear.from_linear(linear)
    weight = linear.weight.float()
    shift = linear.bias.float() if bias else None
    with torch.no_grad(), decoding_step:
        packed = prepacked.packed()
        kernel_rows = 17 if size_out == 99 else 8  # a weight in cache meets up to 16 rows in the kernel
        assert packed.kernel_rows == kernel_rows
        for rows in (1, 3, 4, 7, 8, 16, 17, 40):
            x = torch.randn(rows, 256).to(torch.bfloat16)
            exact = torch.nn.functional.linear(x.float(), weight, shift)  # every product of two bfloat16s is exact
            got = prepacked(x)
            assert got.dtype == torch.bfloat16
            # one bfloat16 step (2^-8 of a value's binade, relative): the last bit may round the other way
            torch.testing.assert_close(got.float(), exact.bfloat16().float(), rtol=2 ** -7, atol=1e-6)
            if rows < kernel_rows:  # the kernel's own rounding: the float32 sums rounded to nearest, ties to even
                assert (got.float() - exact).abs().le(exact.abs() * 2 ** -8 + 1e-6).all()


@torch.inference_mode()
def test_truncate_and_reorder_keep_the_cache_exact():
    model = build_model(BASE, positional="rope", num_kv_heads=2).eval()
    ids = torch.randint(0, 61, (2, 10))
    session = StackSession(model, 2, 10)
    session.extend(ids[:, :6])
    session.extend(torch.randint(0, 61, (2, 3)))  # three drafts, all rejected
    session.truncate(6)
    torch.testing.assert_close(session.extend(ids[:, 6:8]), model(ids[:, :8]).logits[:, 6:8], rtol=1e-5, atol=1e-5)
    session.reorder(torch.tensor([1, 1, 0]))  # beams: row 1 twice, then row 0
    step = session.extend(ids[[1, 1, 0], 8:9])
    torch.testing.assert_close(step, model(ids[[1, 1, 0], :9]).logits[:, 8:9], rtol=1e-5, atol=1e-5)


@torch.inference_mode()
def test_beams_share_their_sources_encoder_rows_and_stay_exact():
    """Beams of a source read one copy of its encoder output and cross-attention keys (a reorder that repeats
    each source, then one that drops a source, keep them grouped; rows that are not grouped get copies), and
    every step's logits equal the model's forward over the same decoder tokens and sources."""
    torch.manual_seed(0)
    model = build_model("transformer-multi30k", vocab_size=61, num_layers=2, d_model=32, num_heads=4, d_ff=64).eval()
    for block in model.decoder.blocks:  # peaked cross-attention: at the initial scale every query's is near uniform
        block.cross_attention.q_proj.weight.data.mul_(50)
    sources = torch.randint(4, 61, (3, 7))
    source_mask = torch.ones_like(sources)
    source_mask[1, 5:] = 0
    session, state = tformer.generation.open_session(model, sources, source_mask, max_new_tokens=6)
    decoded = state.input_ids  # (3, 1) the start tokens
    source_rows = torch.arange(3)  # which source each decoder row translates

    def step(rows: torch.Tensor, same_source: bool) -> None:
        nonlocal decoded, source_rows
        session.reorder(rows, same_source)
        decoded, source_rows = decoded[rows], source_rows[rows]
        new = torch.randint(4, 61, (rows.shape[0], 1))
        logits = session.extend(new)[:, -1]
        decoded = torch.cat([decoded, new], dim=1)
        full = model(sources[source_rows], attention_mask=source_mask[source_rows],
                     decoder_input_ids=decoded).logits[:, -1]
        torch.testing.assert_close(logits, full, rtol=1e-5, atol=1e-5)

    session.extend(decoded)
    step(torch.arange(3).repeat_interleave(4), False)  # 4 beams a source
    held = [layer.cross_attention.keys.shape[0] for layer in session.cache]
    assert held == [3, 3] and session.step_inputs["encoder_output"].shape[0] == 3  # one copy per source
    step(torch.tensor([1, 1, 0, 2, 5, 4, 4, 7, 8, 8, 9, 11]), True)  # beams continue beams of their source
    step(torch.tensor([0, 1, 2, 3, 8, 9, 10, 11]), False)  # source 1 is done: two sources, still grouped
    assert [layer.cross_attention.keys.shape[0] for layer in session.cache] == [2, 2]
    step(torch.tensor([6, 0, 1]), False)  # rows in no groups: a copy of its source each
    assert session.step_inputs["encoder_output"].shape[0] == 3


def test_cache_bytes_per_token_counts_only_key_value_heads():
    mha = build_model(BASE)
    gqa = build_model(BASE, num_kv_heads=2)
    mqa = build_model(BASE, num_kv_heads=1)
    assert mha.cache_bytes_per_token() == 2 * 2 * 4 * 8 * 4  # K and V x layers x heads x head_dim x fp32
    assert gqa.cache_bytes_per_token() * 2 == mha.cache_bytes_per_token()
    assert mqa.cache_bytes_per_token() * 4 == mha.cache_bytes_per_token()
    assert mha.cache_bytes_per_token(torch.bfloat16) * 2 == mha.cache_bytes_per_token()
    session = StackSession(gqa, batch_size=3, max_len=20)
    allocated = sum(layer.self_attention.nbytes() for layer in session.cache)
    assert allocated == 3 * 20 * gqa.cache_bytes_per_token()


def test_prepacked_weights_follow_the_weights_and_leave_the_model_as_it_was():
    model = build_model("gpt-nano").eval()
    prompt = torch.randint(0, 64, (1, 4))
    names = list(model.state_dict())
    tformer.generate(model, prompt, 5)  # generation decodes through a view on the CPU's decoding backend
    assert weights_in_use(model) == {"plain"} and list(model.state_dict()) == names
    assert weights_in_use(model.decoding_view()) == {"prepacked"}
    layer = model.decoding_view().stack.blocks[0].feedforward.in_proj
    first = layer.packed()
    assert model.decoding_view().stack.blocks[0].feedforward.in_proj.packed() is first  # made once per layer
    with torch.no_grad():
        layer.weight.mul_(3.0)  # in place: same storage, new version
    assert layer.packed() is not first
    assert torch.equal(tformer.generate(model, prompt, 12), tformer.generate(model, prompt, 12, use_cache=False))
    view = model.decoding_view()
    assert view.lm_head.weight is view.embedding.token.weight is model.lm_head.weight  # tied, and shared


def test_weights_made_in_inference_mode_are_read_as_they_are():
    with torch.inference_mode():  # such weights keep no version counter: a change could not be seen
        model = build_model("gpt-nano").eval().decoding_view()
        assert model.lm_head.packed() is None
        prompt = torch.randint(0, 64, (1, 4))
        before = model(prompt).logits
        model.stack.blocks[0].feedforward.in_proj.weight.mul_(3.0)  # in place, in inference mode
        after = model(prompt).logits
        assert (after - before).abs().max() > 1e-3
        session = StackSession(model, 1, 4)
        torch.testing.assert_close(session.extend(prompt), after, rtol=1e-5, atol=1e-5)


def test_training_multiplies_by_the_parameters_themselves():
    model = use_weights(build_model("gpt-nano"), "prepacked")  # a backend a user swapped in for good
    assert isinstance(model.lm_head, PrepackedLinear)
    model.train()
    ids = torch.randint(0, 64, (2, 9))
    model(ids, labels=ids).loss.backward()
    assert all(parameter.grad is not None for parameter in model.parameters())


def test_a_fused_optimiser_step_never_leaves_a_stale_layout(monkeypatch):
    monkeypatch.setattr(prepacked_backend, "few_row_ways", lambda threads, dtype: ("whole",))  # the (in, out) copy
    model = build_model("gpt-nano").eval()
    prompt = torch.randint(0, 64, (1, 4))
    tformer.generate(model, prompt, 4)  # the layout is made
    layer = model.stack.blocks[0].attention.qkv_proj
    version = layer.weight._version
    packed = model.decoding_view().stack.blocks[0].attention.qkv_proj
    optimiser = torch.optim.AdamW(model.parameters(), lr=0.5, fused=True)
    model.train()
    model(prompt, labels=prompt).loss.backward()
    model.eval()
    assert packed._packed is not None  # the layout generate made
    optimiser.step()  # fused: the weights change, their version does not
    assert layer.weight._version == version
    with torch.no_grad(), decoding_step:
        prepacked = StackSession(model.decoding_view(), 1, 4).extend(prompt)  # verify() dropped the stale layout
        plain = StackSession(model.decoding_view("plain"), 1, 4).extend(prompt)  # nn.Linear over the same weights
    torch.testing.assert_close(prepacked, plain, rtol=1e-5, atol=1e-5)
