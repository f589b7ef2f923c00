"""The attention RNN that the transformer replaced: a bidirectional GRU/LSTM encoder and a GRU/LSTM
decoder that attends over the encoder's states at every step, with Bahdanau's additive attention
(Bahdanau et al. 2015) or Luong's multiplicative ones, dot and general (Luong et al. 2015).

Bahdanau: the decoder's previous state s(t-1) scores each source state h(j) as v . tanh(W s + U h(j));
the context c(t) (the weighted sum of the h(j)) is read with the previous token to give s(t), and the
output is predicted from [s(t); c(t); y(t-1)].
Luong: s(t) comes first (from the previous token, and with ``input_feeding`` the previous attentional
vector); it scores h(j) as s . h(j) (dot) or s . W h(j) (general); the attentional vector
tanh(W_c [c(t); s(t)]) predicts the output.

Source and target share one token table (a joint vocabulary, as the transformer recipe's), tied to the
output by default. The encoder's two directions have ``rnn_hidden_size / 2`` units each, so a source
state is as wide as the decoder's (Luong's dot score needs that). The decoder starts from tanh(W [last
forward state; first backward state]) of each layer. Generation follows the Session protocol: the source
is encoded once, the recurrent state and the projected source states (the attention's keys) are the cache.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from tformer.config import (
    TOKEN_FIELDS,
    ConfigError,
    ModelConfig,
    field_default,
    require_positive_int,
    require_token_ids,
)
from tformer.models.base import Seq2SeqModel
from tformer.models.output import Seq2SeqOutput
from tformer.models.registry import register
from tformer.nn.heads import LMHead
from tformer.nn.inputs import check_token_ids
from tformer.nn.losses import token_cross_entropy


@dataclass
class RecurrentCache:
    """A decoding state: the decoder's recurrent state (L, B, H) (and an LSTM's cell), the attentional
    vector fed to the next step (Luong's input feeding), the attention's keys over the source (B, S, H),
    and how many tokens it has read."""

    hidden: Tensor | None = None
    cell: Tensor | None = None
    feed: Tensor | None = None
    keys: Tensor | None = None
    length: int = 0

    def reorder(self, rows: Tensor) -> None:
        """Keep the rows named by ``rows`` (beam search)."""
        for name in ("hidden", "cell"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, value.index_select(1, rows))
        for name in ("feed", "keys"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, value.index_select(0, rows))


class SourceAttention(nn.Module):
    """Scores of each source state against a decoder state, softmaxed over the real source positions,
    and the context they weigh. ``kind``: bahdanau, luong_dot or luong_general."""

    def __init__(self, kind: str, size: int) -> None:
        super().__init__()
        self.kind = kind
        if kind == "bahdanau":
            self.query_proj = nn.Linear(size, size, bias=False)  # W s
            self.key_proj = nn.Linear(size, size, bias=True)  # U h(j) (+ the bias inside the tanh)
            self.score_proj = nn.Linear(size, 1, bias=False)  # v
        elif kind == "luong_general":
            self.key_proj = nn.Linear(size, size, bias=False)  # W h(j)

    def keys(self, memory: Tensor) -> Tensor:
        """What the scores read of the source states (B, S, H), computed once per sentence."""
        return memory if self.kind == "luong_dot" else self.key_proj(memory)

    def scores(self, query: Tensor, keys: Tensor) -> Tensor:
        """Unnormalised scores (B, S) of a decoder state ``query`` (B, H) against ``keys`` (B, S, H)."""
        if self.kind == "bahdanau":
            return self.score_proj(torch.tanh(self.query_proj(query)[:, None, :] + keys)).squeeze(-1)
        return torch.einsum("bh,bsh->bs", query, keys)

    def forward(self, query: Tensor, keys: Tensor, memory: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """(context (B, H), weights (B, S)); ``mask`` (B, S) is True on real source tokens."""
        scores = self.scores(query, keys).masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        return torch.einsum("bs,bsh->bh", weights, memory), weights


RNN_CELLS = ("gru", "lstm")
# The attention-RNN's attention: Bahdanau's additive score (on the decoder's previous state), or Luong's
# multiplicative ones on its new state: dot (s . h) or general (s . W h).
RNN_ATTENTIONS = ("bahdanau", "luong_dot", "luong_general")
RNN_SEQ2SEQ_FIELDS = ("decoder_start_token_id", "rnn_cell", "rnn_attention", "rnn_hidden_size", "input_feeding",
                      "teacher_forcing_ratio")
# The only fields the attention-RNN reads: every other one (heads, norms, positions, kernels, ...) is a
# transformer's and must keep its default in an rnn_seq2seq config.
RNN_FIELDS = ("architecture", "vocab_size", "max_seq_len", "d_model", "num_layers", "dropout", "tie_embeddings",
              "initializer_range", "pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id",
              "forced_eos_token_id", "rnn_cell", "rnn_attention", "rnn_hidden_size", "input_feeding",
              "teacher_forcing_ratio", "extra")


def check_rnn_config(config: ModelConfig) -> None:
    """The attention-RNN baseline reads ``RNN_FIELDS`` only; its hidden size defaults to ``d_model``."""
    for name in (field.name for field in dataclasses.fields(config)):
        if name not in RNN_FIELDS and getattr(config, name) != field_default(type(config), name):
            raise ConfigError(f"{name}={getattr(config, name)!r} is a transformer's field; "
                              f"architecture='rnn_seq2seq' reads {', '.join(RNN_FIELDS[1:-1])}")
    for name, allowed in (("rnn_cell", RNN_CELLS), ("rnn_attention", RNN_ATTENTIONS)):
        if getattr(config, name) not in allowed:
            raise ConfigError(f"{name}={getattr(config, name)!r} is not one of {', '.join(allowed)}")
    for name in ("vocab_size", "max_seq_len", "d_model", "num_layers"):
        require_positive_int(name, getattr(config, name))
    if config.rnn_hidden_size is None:
        object.__setattr__(config, "rnn_hidden_size", config.d_model)
    require_positive_int("rnn_hidden_size", config.rnn_hidden_size)
    if not isinstance(config.dropout, (int, float)) or not 0.0 <= config.dropout < 1.0:
        raise ConfigError(f"dropout={config.dropout!r} must be a number in [0, 1)")
    ratio = config.teacher_forcing_ratio
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0.0 <= ratio <= 1.0:
        raise ConfigError(f"teacher_forcing_ratio={ratio!r} must be a number in [0, 1] (the share of decoder "
                          "steps that read the true previous token while training)")
    if config.input_feeding and config.rnn_attention == "bahdanau":
        raise ConfigError("input_feeding=True is Luong's (rnn_attention='luong_dot' or 'luong_general'); "
                          "Bahdanau's decoder already reads the context at every step")
    require_token_ids(config, ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id",
                               "forced_eos_token_id"))


RNN_PRESETS = {
    # The attention-RNN baseline of the Multi30k recipe: about the transformer-multi30k's size (one joint
    # vocabulary, 6.0M parameters at 8,000 tokens), a bidirectional GRU encoder and Bahdanau's attention.
    "rnn-multi30k": dict(
        vocab_size=8000, max_seq_len=256, d_model=256, rnn_hidden_size=512, num_layers=1, rnn_cell="gru",
        rnn_attention="bahdanau", dropout=0.3, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        decoder_start_token_id=1,
    ),
}


@register("rnn_seq2seq", fields=(*TOKEN_FIELDS, *RNN_SEQ2SEQ_FIELDS), check=check_rnn_config, transformer=False,
          presets=RNN_PRESETS)
class RNNSeq2Seq(Seq2SeqModel):
    """Token embedding -> bidirectional RNN encoder; token embedding -> RNN decoder with attention over
    the encoder's states -> output layer (tied to the embedding by default)."""

    @classmethod
    def estimated_parameters(cls, config: ModelConfig) -> int:
        """The token table (and untied output), the encoder's and decoder's gates x hidden x (input + hidden)
        a layer, and the attention and output projections."""
        embeddings = config.vocab_size * config.d_model * (1 if config.tie_embeddings else 2)
        gates, hidden = (3 if config.rnn_cell == "gru" else 4), config.rnn_hidden_size
        recurrent = 2 * config.num_layers * gates * hidden * (config.d_model + 2 * hidden)
        return embeddings + recurrent + 4 * hidden * (hidden + config.d_model)

    @classmethod
    def describe_inputs(cls, config: ModelConfig) -> str:
        return f"{config.rnn_cell.upper()} of {config.rnn_hidden_size} units, {config.rnn_attention} attention"

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        size, embedding, layers = config.rnn_hidden_size, config.d_model, config.num_layers
        if size % 2:
            raise ValueError(f"rnn_hidden_size={size} must be even: the encoder's two directions take half each")
        recurrent = nn.GRU if config.rnn_cell == "gru" else nn.LSTM
        between = config.dropout if layers > 1 else 0.0
        self.embedding = nn.Embedding(config.vocab_size, embedding)
        self.dropout = nn.Dropout(config.dropout)
        self.encoder = recurrent(embedding, size // 2, num_layers=layers, batch_first=True, bidirectional=True,
                                 dropout=between)
        self.bridge = nn.Linear(size, size)  # each layer's initial decoder state from the encoder's final ones
        self.cell_bridge = nn.Linear(size, size) if config.rnn_cell == "lstm" else None
        self.attention = SourceAttention(config.rnn_attention, size)
        luong = config.rnn_attention != "bahdanau"
        reads = embedding + (size if not luong or config.input_feeding else 0)
        self.decoder = recurrent(reads, size, num_layers=layers, batch_first=True, dropout=between)
        if luong:
            self.combine = nn.Linear(2 * size, size, bias=False)  # W_c [c; s]
            self.output_proj = nn.Linear(size, embedding)
        else:
            self.output_proj = nn.Linear(2 * size + embedding, embedding)  # [s; c; y(t-1)]
        self.lm_head = LMHead(embedding, config.vocab_size)
        self.init_weights()
        if config.tie_embeddings:
            self.lm_head.weight = self.embedding.weight

    def tied_parameters(self) -> dict[str, str]:
        return {"lm_head.weight": "embedding.weight"} if self.config.tie_embeddings else {}

    def init_weights(self) -> None:
        """Embeddings and linear layers as the transformers' (normal(0, initializer_range), zero biases); the
        recurrent layers keep PyTorch's uniform initialisation."""
        std = self.config.initializer_range
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, 0.0, std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, 0.0, std)

    # ---- the two halves ------------------------------------------------------------------------

    @property
    def position_limit(self) -> int:
        """The longest source or target it reads: ``max_seq_len``. A recurrence has no position table;
        the limit is the configuration's promise, kept as the transformer keeps it (sources longer are
        cut by translate, refused by forward)."""
        return self.config.max_seq_len

    def _check_length(self, ids: Tensor, name: str) -> None:
        if ids.dim() == 2 and ids.shape[1] > self.config.max_seq_len:
            raise ValueError(f"{name} has {ids.shape[1]} tokens; this model reads at most max_seq_len="
                             f"{self.config.max_seq_len}")

    def encode(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """Source states (B, S, H) of ``input_ids`` (B, S); padding (0 in ``attention_mask``, on either
        side) is skipped by both directions and its states are zero."""
        check_token_ids(input_ids, self.config.vocab_size)
        self._check_length(input_ids, "the source (input_ids)")
        mask = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        lengths = mask.sum(dim=1)
        if bool((lengths == 0).any()):
            raise ValueError("a source has no tokens (its attention_mask is all 0)")
        # left padding moved to the right: each row's tokens first, so packing reads only them
        order = torch.sort((~mask).long(), dim=1, stable=True).indices  # (B, S) real positions first
        packed_ids = input_ids.gather(1, order)
        embedded = self.dropout(self.embedding(packed_ids))
        packed = nn.utils.rnn.pack_padded_sequence(embedded, lengths.cpu(), batch_first=True, enforce_sorted=False)
        states, _ = self.encoder(packed)
        states, _ = nn.utils.rnn.pad_packed_sequence(states, batch_first=True, total_length=input_ids.shape[1])
        memory = torch.zeros_like(states).scatter(1, order[:, :, None].expand_as(states), states)
        return memory * mask[:, :, None]

    def initial_state(self, memory: Tensor, mask: Tensor) -> tuple[Tensor, Tensor | None]:
        """The decoder's first recurrent state (L, B, H) (and cell) from the source states: tanh(W [last
        forward state; first backward state]), the same for every layer."""
        half = memory.shape[-1] // 2
        rows = torch.arange(memory.shape[0], device=memory.device)
        positions = torch.arange(mask.shape[1], device=mask.device)
        last = torch.where(mask, positions, -1).max(dim=1).values
        first = torch.where(mask, positions, mask.shape[1]).min(dim=1).values
        summary = torch.cat([memory[rows, last, :half], memory[rows, first, half:]], dim=-1)  # (B, H)
        layers = self.config.num_layers
        hidden = torch.tanh(self.bridge(summary))[None].repeat(layers, 1, 1).contiguous()
        cell = None
        if self.cell_bridge is not None:
            cell = torch.tanh(self.cell_bridge(summary))[None].repeat(layers, 1, 1).contiguous()
        return hidden, cell

    def decode(self, decoder_input_ids: Tensor, memory: Tensor, mask: Tensor, cache: RecurrentCache,
               teacher_forcing_ratio: float = 1.0) -> tuple[Tensor, Tensor]:
        """Logits (B, T, V) and attention weights (B, T, S) of the decoder's tokens after ``cache``'s; the
        cache is updated. With ``teacher_forcing_ratio`` < 1 a row reads its own previous prediction
        instead of the given token with probability 1 - ratio (from step 2 of the call on)."""
        check_token_ids(decoder_input_ids, self.config.vocab_size)
        if cache.hidden is None:
            cache.hidden, cache.cell = self.initial_state(memory, mask)
            cache.keys = self.attention.keys(memory)
        luong = self.config.rnn_attention != "bahdanau"
        if luong and self.config.input_feeding and cache.feed is None:
            cache.feed = memory.new_zeros(memory.shape[0], memory.shape[-1])
        features, weights = [], []
        token = decoder_input_ids[:, 0]
        for step in range(decoder_input_ids.shape[1]):
            if step > 0:
                token = decoder_input_ids[:, step]
                if teacher_forcing_ratio < 1.0:
                    own = self.lm_head(features[-1]).argmax(dim=-1)
                    keep = torch.rand(token.shape[0], device=token.device) < teacher_forcing_ratio
                    token = torch.where(keep, token, own)
            step_features, step_weights = self._step(token, memory, mask, cache, luong)
            features.append(step_features)
            weights.append(step_weights)
        cache.length += decoder_input_ids.shape[1]
        return self.lm_head(torch.stack(features, dim=1)), torch.stack(weights, dim=1)  # one output product

    def _step(self, token: Tensor, memory: Tensor, mask: Tensor, cache: RecurrentCache,
              luong: bool) -> tuple[Tensor, Tensor]:
        """One decoder step for tokens (B,): the output layer's input (B, E) and attention weights (B, S)."""
        embedded = self.dropout(self.embedding(token))  # (B, E)
        state = (cache.hidden, cache.cell) if cache.cell is not None else cache.hidden
        if luong:
            reads = embedded if cache.feed is None else torch.cat([embedded, cache.feed], dim=-1)
            output, state = self.decoder(reads[:, None, :], state)
            query = output[:, 0]  # s(t), the top layer's new state
            context, weights = self.attention(query, cache.keys, memory, mask)
            attentional = torch.tanh(self.combine(torch.cat([context, query], dim=-1)))
            if cache.feed is not None:
                cache.feed = attentional
            features = self.output_proj(self.dropout(attentional))
        else:
            context, weights = self.attention(cache.hidden[-1], cache.keys, memory, mask)  # on s(t-1)
            output, state = self.decoder(torch.cat([embedded, context], dim=-1)[:, None, :], state)
            features = self.output_proj(self.dropout(torch.cat([output[:, 0], context, embedded], dim=-1)))
        cache.hidden, cache.cell = (state[0], state[1]) if isinstance(state, tuple) else (state, None)
        return self.dropout(features), weights

    # ---- forward ---------------------------------------------------------------------------------

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        decoder_input_ids: Tensor | None = None,
        decoder_attention_mask: Tensor | None = None,
        labels: Tensor | None = None,
        cache: RecurrentCache | None = None,
        encoder_output: Tensor | None = None,
        encoder_attention_mask: Tensor | None = None,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
    ) -> Seq2SeqOutput:
        """As ``EncoderDecoderLM.forward``: the source as ``input_ids`` (B, S), the target as
        ``decoder_input_ids`` or as ``labels`` read shifted right; a generation step takes the decoder's
        tokens as ``input_ids`` with ``encoder_output`` and ``encoder_attention_mask``. The decoder's
        padding needs no mask (a recurrent step never reads later tokens), so ``decoder_attention_mask``
        is accepted and unused. ``cross_attentions`` holds the attention weights as one layer of one
        head, (B, 1, T, S)."""
        if output_hidden_states:
            raise ValueError("output_hidden_states: the attention RNN does not return per-layer states")
        generation_step = encoder_output is not None
        decoder_input_ids = self.decoder_tokens(input_ids, decoder_input_ids, labels, generation_step)
        if not generation_step:
            self._check_length(decoder_input_ids, "the target")
            mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
            encoder_output, encoder_attention_mask = self.encode(input_ids, mask), mask
        elif encoder_attention_mask is None:
            encoder_attention_mask = torch.ones(encoder_output.shape[:2], dtype=torch.long,
                                                device=encoder_output.device)
        state = cache if cache is not None else RecurrentCache()
        ratio = self.config.teacher_forcing_ratio if self.training else 1.0
        logits, weights = self.decode(decoder_input_ids, encoder_output, encoder_attention_mask.bool(), state, ratio)
        loss = None if labels is None else token_cross_entropy(logits, labels)
        return Seq2SeqOutput(logits=logits, loss=loss, cache=cache, encoder_output=encoder_output,
                             cross_attentions=[weights[:, None]] if output_attentions else None)

    # ---- generation hooks (the Session protocol: tformer/generation/session.py) -------------------

    def encoded_source(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        return self.encode(input_ids, attention_mask)

    def cache_bytes_per_token(self, dtype: torch.dtype | None = None) -> int:
        """A decoding state does not grow with the tokens it reads (generation's memory estimate)."""
        return 0

    def new_cache(self, batch_size: int, max_len: int, dtype: torch.dtype | None = None,
                  device: torch.device | None = None) -> RecurrentCache:
        """An empty recurrent state; the first step starts it from the source."""
        return RecurrentCache()
