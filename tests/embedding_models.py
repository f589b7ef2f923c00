"""The small folders the embedding tests embed with: a tformer BERT-shaped encoder with a WordPiece tokenizer, and a
sentence-transformers folder (a transformers ``BertModel`` written by ``save_pretrained``, its ``modules.json`` and
``1_Pooling/config.json``), with the vectors sentence-transformers computes for it, worked out by hand from
transformers' ``AutoModel`` (the library itself is not installed)."""

import json
from pathlib import Path

import torch

import tformer
from tformer.tokenizers import WordPieceTokenizer

TEXT = ("to be or not to be, that is the question. whether tis nobler in the mind to suffer the slings and arrows "
        "of outrageous fortune, or to take arms against a sea of troubles.\n")
TEXTS = ["to be or not to be", "the question", "whether tis nobler in the mind to suffer the slings", "arms"]
MODES = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens", "last": "pooling_mode_lasttoken",
         "max": "pooling_mode_max_tokens"}


def wordpiece() -> WordPieceTokenizer:
    return WordPieceTokenizer.train(TEXT, vocab_size=120, min_frequency=1)


def bert_folder(folder: Path, **overrides) -> Path:
    """A tformer BERT-shaped encoder (bare, 2 layers, context 32) with its WordPiece tokenizer, saved to ``folder``."""
    tokenizer = wordpiece()
    settings = dict(vocab_size=tokenizer.vocab_size, max_seq_len=32, d_model=32, num_layers=2, num_heads=4,
                    dropout=0.0, attention_dropout=0.0, initializer_range=0.2)
    settings.update(overrides)
    torch.manual_seed(0)
    model = tformer.build_model("bert-tiny", **settings)
    model.tokenizer = tokenizer
    model.save(folder)
    return folder


def sentence_transformers_folder(folder: Path, mode: str = "mean", normalize: bool = True,
                                 extra_modules: tuple[str, ...] = ()) -> Path:
    """A sentence-transformers folder: a random tiny transformers BertModel at the root (with the WordPiece
    tokenizer), a Pooling module of ``mode`` and, when ``normalize``, a Normalize module."""
    import transformers

    tokenizer = wordpiece()
    config = transformers.BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=48, max_position_embeddings=32)
    torch.manual_seed(0)
    transformers.BertModel(config).eval().save_pretrained(folder)
    tokenizer.save(folder / "tokenizer.json")
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    modules += [{"idx": len(modules), "name": str(len(modules)), "path": f"{len(modules)}_{kind}",
                 "type": f"sentence_transformers.models.{kind}"} for kind in extra_modules]
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir()
    pooling = {name: name == MODES[mode] for name in MODES.values()}
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32, **pooling,
                                                                  "include_prompt": True}))
    return folder


@torch.no_grad()
def sentence_transformers_vectors(folder: Path, sequences: list[list[int]], mode: str, normalize: bool) -> torch.Tensor:
    """What sentence-transformers gives for ``sequences`` (token ids, one at a time): transformers' AutoModel's
    last hidden state, pooled by ``mode`` over the tokens, then scaled to unit length when ``normalize``."""
    import transformers

    model = transformers.AutoModel.from_pretrained(folder, attn_implementation="eager").eval()
    vectors = []
    for ids in sequences:
        hidden = model(input_ids=torch.tensor([ids])).last_hidden_state[0]  # (T, D)
        vectors.append({"cls": hidden[0], "mean": hidden.mean(dim=0), "last": hidden[-1]}[mode])
    stacked = torch.stack(vectors)
    return torch.nn.functional.normalize(stacked, dim=-1) if normalize else stacked
