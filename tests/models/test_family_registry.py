"""Families declare themselves: a new family is its own class (a front end, the shared stack, a head) and
its register line; training, checkpoints, loading and the command line then serve it unchanged."""

import pytest
import torch
from torch import nn

import tformer
from tformer.cli import main
from tformer.config import GENERATION_DEFAULT_FIELDS, TOKEN_FIELDS, TOKEN_POSITION_FIELDS, ConfigError, ModelConfig
from tformer.families import FAMILIES
from tformer.models.decoder import DecoderLM
from tformer.models.registry import MODEL_CLASSES, register
from tformer.nn.embeddings import TokenEmbedding
from tformer.nn.heads import LMHead
from tformer.nn.stack import TransformerStack


class GainedTokens(nn.Module):
    """The toy family's front end: token embeddings times a learned gain per dimension."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.tokens = TokenEmbedding.from_config(config)
        self.gain = nn.Parameter(torch.ones(config.d_model))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.tokens(input_ids) * self.gain  # (B, T, D)


@pytest.fixture
def toy_family():
    """Register the toy family for one test, and take it away after."""

    @register("toy", fields=(*TOKEN_FIELDS, *TOKEN_POSITION_FIELDS, *GENERATION_DEFAULT_FIELDS))
    class ToyLM(DecoderLM):  # the decoder's decoding hooks; its own front end and head
        def __init__(self, config: ModelConfig) -> None:
            tformer.models.base.Model.__init__(self, config)
            self.embedding = GainedTokens(config)
            self.stack = TransformerStack(config, causal=True)
            self.lm_head = LMHead(config.d_model, config.vocab_size, bias=True)
            self.init_weights()

        def tied_parameters(self) -> dict[str, str]:
            return {}

    yield ToyLM
    MODEL_CLASSES.pop("toy")
    FAMILIES.pop("toy")


@pytest.mark.slow  # trains and generates: over 2 s
def test_a_new_family_trains_saves_loads_and_generates_through_the_cli(toy_family, tmp_path, capsys):
    (tmp_path / "text.txt").write_text("the quick brown fox jumps over the lazy dog\n" * 40, encoding="utf-8")
    (tmp_path / "toy.toml").write_text("""
[model]
architecture = "toy"
d_model = 32
num_layers = 2
num_heads = 4
max_seq_len = 32
tie_embeddings = false

[data]
train = "text.txt"
tokenizer = "char"

[training]
max_steps = 2
batch_size = 4
seq_len = 16
eval_every = 2
threads = 1
""", encoding="utf-8")
    run = tmp_path / "run"
    assert main(["train", str(tmp_path / "toy.toml"), "--out", str(run), "--no-progress"]) == 0
    assert "model      toy: " in capsys.readouterr().out
    model = tformer.load(run)
    assert type(model) is toy_family and model.config.architecture == "toy"
    assert model.embedding.gain.shape == (32,) and model.lm_head.bias is not None
    assert main(["generate", str(run), "--prompt", "the", "--max-new-tokens", "8", "--seed", "0"]) == 0
    generated = capsys.readouterr().out
    assert generated.startswith("the") and len(generated.strip()) > len("the")
    # the family's declared fields are its own: another family's field is refused, naming who reads it
    with pytest.raises(ConfigError, match=r"type_vocab_size=2 is a field of the encoder family; "
                                          r"architecture='toy' does not use it"):
        model.config.replace(type_vocab_size=2)


def test_a_family_that_is_not_declared_is_refused():
    with pytest.raises(ConfigError, match=r"architecture='toy' is not one of decoder, encoder"):
        ModelConfig(architecture="toy")
