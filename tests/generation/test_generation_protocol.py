"""The generation protocol: a model joins ``generate`` by declaring it (subclassing ``GenerationProtocol``) and
offering its hooks (prepare_generation, new_cache, forward with a cache, position_limit, config). A toy
encoder–decoder built from the shared blocks decodes greedily and by beam search exactly as uncached brute-force
references do, on a padded batch of two different sources; a decoder seen only through its hooks decodes as the
DecoderLM itself does; and no strategy reads anything of a model but the protocol's names."""

import pytest
import torch
from torch import nn

import tformer
from tformer import ModelConfig
from tformer.generation import GenerationConfig, GenerationError, GenerationState, stream_generate
from tformer.models import ModelOutput
from tformer.models.generation_protocol import GenerationProtocol
from tformer.nn.attention import AttentionMask, CrossAttentionCache, KVCache
from tformer.nn.block import AttentionContext, LayerCache, TransformerBlock
from tformer.nn.positions import positions_from_mask

CONFIG = ModelConfig(vocab_size=11, max_seq_len=16, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2)
START = 1  # the decoder's first token
HOOKS = {name for name in dir(GenerationProtocol) if not name.startswith("_")} | {"config", "forward"}
MODULE_API = {name for name in dir(nn.Module) if not name.startswith("_")} | {"training"}  # eval, parameters, ...


class RecordsTouches(nn.Module):
    """Records every public attribute that code outside the model reads. The model keeps its
    parts under private names, so only outside reads (and nn.Module's own) are recorded."""

    def __init__(self) -> None:
        super().__init__()
        self._touched: set[str] = set()

    def __getattribute__(self, name: str):
        if not name.startswith("_"):
            touched = object.__getattribute__(self, "__dict__").get("_touched")
            if touched is not None:
                touched.add(name)
        return super().__getattribute__(name)

    def foreign_touches(self) -> set[str]:
        return self._touched - HOOKS - MODULE_API - {"tokenizer", "foreign_touches"}


class ToyTranslator(RecordsTouches, GenerationProtocol):
    """A tiny encoder–decoder: a bidirectional encoder stack, a causal decoder stack whose blocks
    cross-attend to the encoder output, learned positions, one shared token embedding."""

    generates = encodes_prompt = True

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self._config = config
        self._embedding = nn.Embedding(config.vocab_size, config.d_model)
        self._positions = nn.Embedding(config.max_seq_len, config.d_model)
        self._encoder = nn.ModuleList(TransformerBlock(config) for _ in range(config.num_layers))
        self._decoder = nn.ModuleList(TransformerBlock(config, cross_attention=True) for _ in range(config.num_layers))
        self._norm = nn.LayerNorm(config.d_model)
        self._head = nn.Linear(config.d_model, config.vocab_size, bias=False)

    def _encode(self, source: torch.Tensor, source_mask: torch.Tensor) -> torch.Tensor:
        """(B, S) left-padded source -> (B, S, D); each token at its true position."""
        x = self._embedding(source) + self._positions(positions_from_mask(source_mask))
        context = AttentionContext(mask=AttentionMask(key_padding=source_mask.bool()))
        for block in self._encoder:
            x, _, _ = block(x, context)
        return x

    # ---- the hooks --------------------------------------------------------------------------

    @property
    def config(self) -> ModelConfig:
        return self._config

    @property
    def position_limit(self) -> int:
        return self._config.max_seq_len

    def prepare_generation(self, input_ids, attention_mask=None) -> GenerationState:
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        start = torch.full((input_ids.shape[0], 1), START, dtype=torch.long, device=input_ids.device)
        state = {"encoder_output": self._encode(input_ids, mask), "encoder_attention_mask": mask}
        return GenerationState(input_ids=start, step_inputs=state)

    def new_cache(self, batch_size: int, max_len: int) -> list[LayerCache]:
        config = self._config
        return [LayerCache(KVCache(batch_size, config.num_kv_heads, max_len, config.head_dim), CrossAttentionCache())
                for _ in self._decoder]

    def forward(self, input_ids, attention_mask=None, cache=None, *, encoder_output, encoder_attention_mask):
        """Decoder tokens (B, T) after the cached ones -> logits (B, T, V)."""
        batch, length = input_ids.shape
        past = 0 if cache is None else cache[0].self_attention.length
        x = self._embedding(input_ids) + self._positions(torch.arange(past, past + length))
        context = AttentionContext(
            mask=AttentionMask(causal=True, key_padding=None if attention_mask is None else attention_mask.bool()),
            encoder_output=encoder_output, encoder_mask=AttentionMask(key_padding=encoder_attention_mask.bool()),
        )
        for index, block in enumerate(self._decoder):
            x, _, _ = block(x, context, None if cache is None else cache[index])
        return ModelOutput(logits=self._head(self._norm(x)))


class DecoderThroughHooks(RecordsTouches, GenerationProtocol):
    """A DecoderLM seen only through the generation hooks: its parts are out of reach."""

    generates = True

    def __init__(self, decoder) -> None:
        super().__init__()
        self._decoder = decoder

    @property
    def config(self) -> ModelConfig:
        return self._decoder.config

    @property
    def position_limit(self) -> int | None:
        return self._decoder.position_limit

    def prepare_generation(self, input_ids, attention_mask=None):
        return self._decoder.prepare_generation(input_ids, attention_mask)

    def new_cache(self, batch_size: int, max_len: int):
        return self._decoder.new_cache(batch_size, max_len)

    def forward(self, *args, **kwargs):
        return self._decoder(*args, **kwargs)


def translator():
    torch.manual_seed(0)
    return ToyTranslator(CONFIG).eval()


def sources():
    """Two different sources, the second shorter (left-padded)."""
    ids = torch.tensor([[4, 9, 2, 7, 5, 3], [0, 0, 8, 6, 10, 2]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]])
    return ids, mask


@torch.no_grad()
def decoder_log_probs(model, source, source_mask, decoded):
    """Next-token log-probabilities after each decoder sequence (N, T), recomputed from scratch:
    the source encoded again, the whole decoder sequence run without a cache."""
    count = decoded.shape[0]
    encoded = model._encode(source.expand(count, -1), source_mask.expand(count, -1))
    logits = model(decoded, encoder_output=encoded, encoder_attention_mask=source_mask.expand(count, -1)).logits
    return logits[:, -1].log_softmax(-1)


def greedy_reference(model, source, source_mask, steps):
    decoded = torch.tensor([[START]])
    for _ in range(steps):
        decoded = torch.cat([decoded, decoder_log_probs(model, source, source_mask, decoded).argmax(-1, True)], 1)
    return decoded[0]


def beam_reference(model, source, source_mask, steps, num_beams):
    """Plain beam search (no end ids): every continuation of every beam scored by an uncached
    forward, the best ``num_beams`` kept by summed log-probability."""
    beams, scores = torch.tensor([[START]]), torch.zeros(1)
    for _ in range(steps):
        totals = scores[:, None] + decoder_log_probs(model, source, source_mask, beams)  # (N, V)
        best = totals.flatten().topk(num_beams)
        parents, tokens = best.indices // CONFIG.vocab_size, best.indices % CONFIG.vocab_size
        beams, scores = torch.cat([beams[parents], tokens[:, None]], 1), best.values
    return beams, scores


# ---- an encoder–decoder through the hooks ------------------------------------------------------


@pytest.mark.parametrize("use_cache", [True, False], ids=["cached", "uncached"])
def test_encoder_decoder_greedy_equals_an_uncached_argmax_loop(use_cache):
    model = translator()
    ids, mask = sources()
    out = tformer.generate(model, ids, 9, attention_mask=mask, eos_token_id=[], use_cache=use_cache)
    assert out.shape == (2, 10)
    for row in range(2):
        assert torch.equal(out[row], greedy_reference(model, ids[row : row + 1], mask[row : row + 1], 9))
    assert not torch.equal(out[0], out[1])  # the sources really differ
    assert model.foreign_touches() == set()


def test_encoder_decoder_beam_search_equals_brute_force_beams():
    """Beam search reorders the self-attention caches, the cross-attention caches and the encoder
    state together; a reorder that skipped any of them would pair a beam with another source."""
    model = translator()
    ids, mask = sources()
    out = tformer.generate(model, ids, 6, attention_mask=mask, num_beams=3, num_return_sequences=3,
                           eos_token_id=[], return_dict=True)
    assert out.sequences.shape == (6, 7)
    for row in range(2):
        beams, scores = beam_reference(model, ids[row : row + 1], mask[row : row + 1], 6, num_beams=3)
        assert torch.equal(out.sequences[3 * row : 3 * row + 3], beams)
        torch.testing.assert_close(out.sequences_scores[3 * row : 3 * row + 3], scores / 6, rtol=1e-5, atol=1e-5)
    assert model.foreign_touches() == set()


def test_encoder_decoder_streams_and_decodes_speculatively():
    model = translator()
    ids, mask = sources()
    greedy = tformer.generate(model, ids, 8, attention_mask=mask, eos_token_id=[])
    chunks = list(stream_generate(model, ids, 8, attention_mask=mask, eos_token_id=[]))
    assert torch.equal(torch.cat([greedy[:, :1], *chunks], 1), greedy)
    out = tformer.generate(model, ids[1:], 8, attention_mask=mask[1:], eos_token_id=[], draft_model=model,
                           num_draft_tokens=3, return_dict=True)  # its own draft: truncation keeps the cross caches
    assert torch.equal(out.sequences, greedy[1:]) and out.acceptance_rate == 1.0
    assert model.foreign_touches() == set()


def test_the_decoder_position_limit_is_checked_before_any_step():
    with pytest.raises(GenerationError, match="exceeds max_seq_len=16"):
        tformer.generate(translator(), sources()[0], 16)


# ---- a decoder through the hooks ---------------------------------------------------------------


@pytest.mark.parametrize("options", [
    dict(), dict(num_beams=3, num_return_sequences=2), dict(temperature=0.8, top_k=5, seed=3),
], ids=["greedy", "beam", "sampling"])
def test_a_decoder_seen_only_through_its_hooks_decodes_as_itself(options):
    decoder = tformer.build_model("gpt-nano").eval()
    hooks_only = DecoderThroughHooks(decoder)
    ids = torch.tensor([[0, 5, 9, 3], [7, 1, 2, 8]])
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    expected = tformer.generate(decoder, ids, 8, attention_mask=mask, eos_token_id=[], **options)  # its step hook
    got = tformer.generate(hooks_only, ids, 8, attention_mask=mask, eos_token_id=[], **options)
    assert torch.equal(got, expected)
    assert {"prepare_generation", "new_cache", "position_limit", "config"} <= hooks_only._touched  # it records
    assert hooks_only.foreign_touches() == set()


def test_a_module_that_does_not_declare_the_protocol_is_refused():
    with pytest.raises(GenerationError, match="one offering tformer.models.GenerationProtocol.; got Linear"):
        tformer.generate(nn.Linear(2, 2), torch.tensor([[1]]), 2)


# ---- one config -------------------------------------------------------------------------------


def test_one_generation_config_carries_every_option():
    model = tformer.build_model("gpt-nano").eval()
    prompt = torch.randint(0, 64, (2, 3))
    config = GenerationConfig(max_new_tokens=6, num_beams=3, eos_token_id=[5, 9], return_dict=True)
    assert config.eos_token_id == (5, 9)  # normalised: hashable, comparable
    by_config = tformer.generate(model, prompt, generation_config=config)
    by_keywords = tformer.generate(model, prompt, 6, num_beams=3, eos_token_id=[5, 9], return_dict=True)
    assert torch.equal(by_config.sequences, by_keywords.sequences)
    overridden = tformer.generate(model, prompt, 4, generation_config=config, num_beams=1)  # keywords win
    assert torch.equal(overridden.sequences, tformer.generate(model, prompt, 4, eos_token_id=[5, 9]))
    with pytest.raises(GenerationError, match="top_p=2 must be a number in"):
        config.replace(top_p=2)
    with pytest.raises(TypeError, match="unknown generation option.s. beams; known: "):
        tformer.generate(model, prompt, 4, beams=3)
    with pytest.raises(GenerationError, match="generation_config must be a GenerationConfig, got dict"):
        tformer.generate(model, prompt, generation_config={"num_beams": 3})
