"""A T5 tokenizer folder as transformers writes one (SentencePiece Unigram, T5's ids, 100 sentinels),
trained here on a small corpus: for the span-corruption tests."""

from __future__ import annotations

import io
import random

WORDS = "the a cat dog sat ran on in park mat sun slept big small red house tree".split()


def t5_tokenizer_folder(tmp_path, transformers, spm):
    """A folder holding a T5 tokenizer (pad 0, eos 1, unk 2, 100 extra ids) trained on a small corpus."""
    words = WORDS
    rng = random.Random(0)
    sentences = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) + "." for _ in range(2000)]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_writer=model, vocab_size=80, model_type="unigram", pad_id=0,
        eos_id=1, unk_id=2, bos_id=-1, hard_vocab_limit=False, minloglevel=2)
    source = tmp_path / "spm"
    source.mkdir()
    (source / "spiece.model").write_bytes(model.getvalue())
    folder = tmp_path / "t5-tokenizer"
    transformers.T5Tokenizer.from_pretrained(source, extra_ids=100).save_pretrained(folder)
    return folder
