"""The text configs/t5-span-pretrain.toml pretrains on, built into data/t5-corpus (a minute):

    python benchmarks/t5_corpus.py            # data/t5-corpus/corpus.txt, tokenizer.json, sources.json

corpus.txt: benchmarks/pretraining_helps.py's corpus (every English dataset text, data_file, that no
evaluation reads: tinyshakespeare, WikiText-2 valid + test, Multi30k's English training captions, the
contexts of SQuAD's first 38 articles, SST-2's training phrases but those equal to a dev or test sentence,
WNUT-17's training sentences) and Multi30k's German training captions (T5's mixture translates German),
its documents in one seeded shuffle so that the held-out tail the recipe evaluates on (data.eval_fraction)
samples every source. tokenizer.json: a lowercased WordPiece of 16,384 pieces learned on it (BERT's special
tokens; span corruption adds </s> and the sentinels after them). The multitask recipe's evaluation text
(SST-2 dev, Multi30k val and test, SQuAD's last 10 articles) is in neither.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from data_roots import data_file  # noqa: E402
from pretraining_helps import build_corpus, chunks, read_lines  # noqa: E402

from tformer.tokenizers import train as train_tokenizer  # noqa: E402

VOCAB_SIZE = 16384  # English and German: twice pretraining_helps.py's English-only 8,192
OUT = ROOT / "data" / "t5-corpus"
OUTPUTS = ("corpus.txt", "tokenizer.json", "sources.json")  # sources.json last: its presence marks a whole build


def documents(path: Path) -> list[str]:
    """The documents of a corpus file (blocks between blank lines)."""
    return [block for block in path.read_text(encoding="utf-8").split("\n\n") if block.strip()]


def build(out: Path, seed: int = 0) -> dict:
    """Write OUT/corpus.txt and OUT/tokenizer.json; return what each source gave and the vocabulary's size."""
    with tempfile.TemporaryDirectory() as english:
        counts = build_corpus(Path(english))
        blocks = documents(Path(english) / "corpus.txt")
    german = chunks([line for line in read_lines(data_file("multi30k/train.de.gz")) if line], 50)
    counts["multi30k train.de"] = {"documents": len(german), "lines": sum(map(len, german)),
                                   "characters": sum(len(line) for document in german for line in document)}
    blocks += ["\n".join(document) for document in german]
    random.Random(seed).shuffle(blocks)
    out.mkdir(parents=True, exist_ok=True)
    (out / "corpus.txt").write_text("\n\n".join(blocks) + "\n", encoding="utf-8")
    tokenizer = train_tokenizer("wordpiece", [out / "corpus.txt"], vocab_size=VOCAB_SIZE)
    tokenizer.save(out / "tokenizer.json")
    return {"sources": counts, "documents": len(blocks), "vocab_size": tokenizer.vocab_size,
            "pad_token_id": tokenizer.pad_token_id}


def refusal(out: Path) -> str | None:
    """Why OUT may not be written, or None: it is new, empty, or this script's previous build (its three files,
    sources.json among them with the keys this script writes, and nothing else)."""
    if not out.exists():
        return None
    if not out.is_dir():
        return f"--out {out} is a file, not a folder"
    names = {path.name for path in out.iterdir()}
    if not names:
        return None
    try:
        ours = names <= set(OUTPUTS) and set(json.loads((out / "sources.json").read_text(encoding="utf-8"))) == {
            "sources", "documents", "vocab_size", "pad_token_id"}
    except (OSError, ValueError, TypeError):
        ours = False
    if ours:
        return None
    return (f"--out {out} holds files this script did not write ({', '.join(sorted(names))}); it writes only into "
            "a new or empty folder or over its own previous build")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=lambda text: Path(text).resolve(), default=OUT)
    args = parser.parse_args()
    problem = refusal(args.out)
    if problem is not None:
        parser.error(problem)
    figures = build(args.out)
    (args.out / "sources.json").write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
