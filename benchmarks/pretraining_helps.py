"""Does pretraining help? bert-mini pretrained with masked LM for about 30 minutes on this machine,
then fine-tuned, against the same model fine-tuned from random initialisation with the same recipe
and seed, on SST-2 (sentence level: train -> dev accuracy, and the test split's beside it), WNUT-17
(train -> test entity F1) and SQuAD v1.1 (the dev file's first 38 articles train, the last 10
evaluate: exact match and F1).

    python benchmarks/pretraining_helps.py corpus      # build OUT/corpus.txt and report its sources
    python benchmarks/pretraining_helps.py tokenizer   # OUT/tokenizer.json: WordPiece, 8,192 pieces, learned on it
    python benchmarks/pretraining_helps.py pretrain    # bert-mini-mlm.toml + PRETRAIN_SETTINGS -> OUT/pretrain
    python benchmarks/pretraining_helps.py baseline    # what word frequencies alone score on its held-out text
    python benchmarks/pretraining_helps.py finetune    # the six fine-tuning runs -> OUT/<task>-<start>
    python benchmarks/pretraining_helps.py finetune --starts scratch --threads 1   # one side (run both at once)
    python benchmarks/pretraining_helps.py all
    python benchmarks/pretraining_helps.py report      # the table of OUT/results.json

OUT is runs/pretraining-helps. The pretraining text is every English dataset text (data_file) that no
evaluation here reads: tinyshakespeare, WikiText-2 valid + test, Multi30k's English training
captions, the contexts of the SQuAD articles that train (the first 38), the texts of GLUE SST-2's
training phrases (none of which is a sentence of the sentence-level dev set: checked and printed) and
WNUT-17's training sentences. Both starts read it through a WordPiece vocabulary of VOCAB_SIZE pieces
learned on that corpus (OUT/tokenizer.json; `--set data.tokenizer=FILE` pretrains with another, BERT's
vocab.txt for one). Nothing is downloaded. Each stage's figures go to OUT/results.json;
each run folder keeps its metrics.jsonl.
"""

from __future__ import annotations

import argparse
import fcntl
import gzip
import json
import random
import re
import shutil
import sys
import time
import tomllib
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from data_roots import data_file  # noqa: E402

from tformer.cli import main as tformer_main  # noqa: E402
from tformer.data.classification import read_classification  # noqa: E402
from tformer.data.conll import read_conll  # noqa: E402
from tformer.data.lm import unigram_cross_entropy  # noqa: E402
from tformer.data.squad import read_squad  # noqa: E402
from tformer.tokenizers import load as load_tokenizer  # noqa: E402
from tformer.tokenizers import train as train_tokenizer  # noqa: E402
from tformer.training.recipe import HEAD_KEYS, INIT_FROM_KEYS, load_recipe, recipe_from_dict  # noqa: E402
from tformer.training.run import train_recipe  # noqa: E402
from tformer.training.tasks.mlm import split_documents, text_documents  # noqa: E402

SQUAD_TRAIN_ARTICLES = 38


def read_lines(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as file:
        return file.read().splitlines()


def wikitext_documents(path: Path) -> list[list[str]]:
    """Articles (a `` = Title = `` line starts one) of paragraphs, WikiText's tokenization undone
    where it split words (`` @-@ ``) and its ``<unk>`` placeholders dropped."""
    documents: list[list[str]] = []
    for line in read_lines(path):
        text = line.strip()
        if not text:
            continue
        if re.fullmatch(r"= [^=].* =", text):
            documents.append([])
            continue
        text = re.sub(r" @(.)@ ", r"\1", text).replace("<unk>", "").strip()
        if text and not text.startswith("="):
            if not documents:
                documents.append([])
            documents[-1].append(re.sub(r"\s+", " ", text))
    return [document for document in documents if document]


def chunks(lines: list[str], size: int) -> list[list[str]]:
    return [lines[start : start + size] for start in range(0, len(lines), size)]


def build_corpus(out: Path, sst2_passes: int = 1) -> dict:
    """Write OUT/corpus.txt (documents between blank lines); return each source's line count.

    ``sst2_passes`` > 1 writes the SST-2 training phrases that many times (each further pass in a new
    shuffled order, so the packed rows differ) and moves Multi30k after them, so that the pretraining's
    held-out tail (its last 5% of lines) holds none of the repeated phrases. Three passes (with
    whole-word masking) left SST-2 dev accuracy lower, not higher: see docs/encoders.md."""
    sources: dict[str, list[list[str]]] = {}
    shakespeare = "\n".join(read_lines(data_file("tinyshakespeare/input.txt.gz")))
    sources["tinyshakespeare"] = [block.splitlines() for block in shakespeare.split("\n\n") if block.strip()]
    sources["wikitext-2 valid+test"] = (wikitext_documents(data_file("wikitext-2/valid.txt.gz"))
                                        + wikitext_documents(data_file("wikitext-2/test.txt.gz")))
    multi30k = chunks([line for line in read_lines(data_file("multi30k/train.en.gz")) if line], 50)
    if sst2_passes == 1:  # the corpus of the documented runs: Multi30k after WikiText
        sources["multi30k train.en"] = multi30k
    squad_train, _ = read_squad(data_file("squad-v1.1/dev-v1.1.json.gz")).split_articles(SQUAD_TRAIN_ARTICLES)
    contexts: dict[int, list[str]] = {}
    for example in squad_train.examples:
        article = contexts.setdefault(example.article, [])
        if not article or article[-1] != example.context:
            article.append(example.context)
    sources[f"squad contexts (articles 1-{SQUAD_TRAIN_ARTICLES})"] = list(contexts.values())
    held_out = {example.text.strip().lower() for split in ("dev.tsv", "test.tsv") for example in
                read_classification(data_file("sst2/sentence-level") / split, columns=["label", "sentence"]).examples}
    phrases = [example.text.strip() for example in read_classification(data_file("sst2/train.tsv.gz")).examples]
    overlap = sum(phrase.lower() in held_out for phrase in phrases)
    kept = [phrase for phrase in phrases if phrase.lower() not in held_out]
    shuffler = random.Random(0)
    passes = [kept] + [shuffler.sample(kept, len(kept)) for _ in range(sst2_passes - 1)]
    sources["sst-2 train phrases" + (f" ({sst2_passes} passes)" if sst2_passes > 1 else "")] = [
        document for order in passes for document in chunks(order, 50)]
    if sst2_passes > 1:
        sources["multi30k train.en"] = multi30k
    wnut = read_conll(data_file("wnut17/wnut17train.conll"))
    sources["wnut-17 train"] = chunks([" ".join(sentence.tokens) for sentence in wnut.sentences], 50)

    out.mkdir(parents=True, exist_ok=True)
    counts = {}
    with open(out / "corpus.txt", "w", encoding="utf-8") as file:
        for name, documents in sources.items():
            for document in documents:
                file.write("\n".join(document) + "\n\n")
            counts[name] = {"documents": len(documents), "lines": sum(map(len, documents)),
                            "characters": sum(len(line) for document in documents for line in document)}
    counts["sst-2 phrases equal to a dev/test sentence (left out)"] = overlap
    return counts


# What the pretraining run changes in configs/bert-mini-mlm.toml (BERT's own recipe: learned positions,
# post-norm, dropout 0.1), and why: with learned positions the masked LM sits on its word-frequency
# plateau for the whole half hour (400 steps: held-out loss 7.30 against 7.95 for unigram frequencies;
# benchmarks/mlm_plateau.py shows the same in Hugging Face's BertForMaskedLM), while rotary positions
# leave it within a hundred steps. Pre-norm and no dropout are the short-budget choices of Geiping &
# Goldstein's "Cramming" (2022). Both threads: the machine is kept quiet for the half hour. Steps: what
# fits in 30 minutes at the ~5,900 tokens/s this machine ran on 2026-11-24 with the corpus's vocabulary
# (2,400 steps in 1,709 s; BERT's vocabulary: ~4,100 tokens/s, 1,650 steps); the same machine ran 1,740
# tokens/s a day earlier. training.max_minutes=30 stops a slower machine's run at the half hour (after
# that step, evaluated and saved), its schedule cut short.
PRETRAIN_SETTINGS = ["model.positional=rope", "model.norm_position=pre", "model.dropout=0.0",
                     "model.attention_dropout=0.0", "training.threads=2", "training.max_steps=2400",
                     "training.max_minutes=30"]
# The corpus's own WordPiece vocabulary instead of BERT's 30,522 tokens: the step runs about 1.4x as
# fast (the embedding matrix, its gradient and its optimizer state are a quarter the size).
VOCAB_SIZE = 8192


def build_tokenizer(out: Path) -> dict:
    """Learn OUT/tokenizer.json, a WordPiece vocabulary of VOCAB_SIZE pieces (BERT's special tokens,
    lowercased) on OUT/corpus.txt; report its size and how many tokens the corpus becomes."""
    started = time.perf_counter()
    tokenizer = train_tokenizer("wordpiece", [out / "corpus.txt"], vocab_size=VOCAB_SIZE)
    seconds = time.perf_counter() - started
    tokenizer.save(out / "tokenizer.json")
    lines = [line for line in (out / "corpus.txt").read_text(encoding="utf-8").splitlines() if line]
    tokens = sum(map(len, tokenizer.encode_batch(lines, add_special_tokens=False,
                                                 return_attention_mask=False)["input_ids"]))
    return {"vocab_size": tokenizer.vocab_size, "corpus_tokens": tokens, "seconds": round(seconds, 1)}


def pretrain(out: Path, steps: int | None, resume: bool, settings: list[str]) -> dict:
    overrides = ([f"data.train={out / 'corpus.txt'}", f"data.tokenizer={out / 'tokenizer.json'}",
                  *PRETRAIN_SETTINGS, *settings] + ([f"training.max_steps={steps}"] if steps else []))
    recipe = load_recipe(ROOT / "configs" / "bert-mini-mlm.toml", overrides)
    started = time.perf_counter()
    result = train_recipe(recipe, out / "pretrain", resume="auto" if resume else None, progress=False)
    seconds = time.perf_counter() - started
    return {"steps": result.steps, "seconds": round(seconds, 1), "train_loss": result.final_train_loss,
            **last_evaluation(result), "settings": overrides[1:]}


def frequency_baseline(out: Path) -> dict:
    """What word frequencies alone give on the pretraining run's held-out text, in its tokens: their
    cross-entropy under the training tokens' unigram distribution, and the accuracy of always guessing
    the most frequent token (the masked-LM evaluation's loss and accuracy, without context)."""
    if not (out / "pretrain" / "recipe.toml").is_file():
        raise SystemExit(f"{out / 'pretrain'}: no pretraining run yet (run the pretrain stage)")
    recipe = load_recipe(out / "pretrain" / "recipe.toml")
    tokenizer = load_tokenizer(recipe.data.tokenizer)
    train, held_out = split_documents(text_documents((out / "corpus.txt").read_text(encoding="utf-8")),
                                      recipe.data.eval_fraction)

    def token_ids(documents) -> torch.Tensor:
        lines = [line for document in documents for line in document]
        rows = tokenizer.encode_batch(lines, add_special_tokens=False, return_attention_mask=False)["input_ids"]
        return torch.tensor([token for row in rows for token in row])

    train_ids, held_out_ids = token_ids(train), token_ids(held_out)
    most_frequent = int(torch.bincount(train_ids, minlength=tokenizer.vocab_size).argmax())
    return {"unigram_cross_entropy": unigram_cross_entropy(train_ids, held_out_ids, tokenizer.vocab_size),
            "most_frequent_token": tokenizer.id_to_token(most_frequent),
            "most_frequent_accuracy": float((held_out_ids == most_frequent).float().mean())}


def last_evaluation(result) -> dict:
    """The metrics of the run's last evaluation (the model it ends with, not its best)."""
    evaluated = [record for record in result.history if "eval_loss" in record]
    return {name: value for name, value in evaluated[-1].items() if name.startswith("eval_")} if evaluated else {}


# task -> (recipe, the metrics reported)
FINE_TUNING = {
    "sst2": ("sst2.toml", ("eval_accuracy",)),
    "wnut17": ("wnut17.toml", ("eval_f1", "eval_precision", "eval_recall")),
    "squad": ("squad.toml", ("eval_exact_match", "eval_f1")),
}
# task -> a second labelled split no recipe reads, evaluated beside the recipe's own (SST-2's 872 dev
# sentences rank runs a point apart differently from its 1,821 test sentences)
SECOND_SPLIT = {"sst2": "sst2/sentence-level/test.tsv"}  # a dataset file (data_file)


def evaluate_second_split(run_folder: Path, task: str) -> dict:
    """``tformer evaluate RUN --data SPLIT`` for the task's second split: its metrics as test_*."""
    if task not in SECOND_SPLIT:
        return {}
    split = data_file(SECOND_SPLIT[task])
    if tformer_main(["evaluate", str(run_folder), "--data", str(split)]) != 0:
        raise SystemExit(f"tformer evaluate {run_folder} --data {split} failed")
    record = json.loads((run_folder / "evaluation" / f"{split.stem}.json").read_text())
    return {name.replace("eval_", "test_", 1): value for name, value in record.items() if name.startswith("eval_")}


def from_scratch(raw: dict, pretrained_run: Path) -> None:
    """Turn a parsed fine-tuning recipe into its from-scratch twin, in place: the pretrained run's
    architecture (every [model] setting of its resolved recipe but the head) with the fine-tuning
    recipe's head and regularisation settings, and the run's tokenizer, from random weights."""
    pretrained = tomllib.loads((pretrained_run / "recipe.toml").read_text(encoding="utf-8"))
    raw["model"] = {**{key: value for key, value in pretrained["model"].items() if key not in HEAD_KEYS},
                    **{key: value for key, value in raw["model"].items() if key in INIT_FROM_KEYS}}
    raw["data"]["tokenizer"] = pretrained["data"]["tokenizer"]


def fine_tune(out: Path, task: str, start: str, steps: int | None = None, threads: int | None = None,
              settings: tuple[str, ...] = ()) -> dict:
    """One fine-tuning run: ``start`` is "pretrained" (init_from OUT/pretrain) or "scratch" (the
    pretrained run's architecture, every [model] setting of its resolved recipe with the fine-tuning
    recipe's head and dropout settings, from random initialisation with the same tokenizer, recipe and
    seed). ``steps``: fewer steps than the recipe's (the warmup and the evaluations scaled alike), for a
    shorter run. ``threads``: the run's CPU threads instead of the recipe's (two one-thread runs side by
    side share two cores with less waiting than one two-thread run beside other work). ``settings``:
    ``--set``-style overrides of the fine-tuning recipe, the same for both starts."""
    recipe_file = ROOT / "configs" / FINE_TUNING[task][0]
    raw = tomllib.loads(recipe_file.read_text(encoding="utf-8"))
    recipe_steps = raw["training"]["max_steps"]
    if steps:
        training = raw["training"]
        scale = steps / training["max_steps"]
        training.update(max_steps=steps, warmup_steps=round(training.get("warmup_steps", 0) * scale))
        if training.get("eval_every", 0) >= steps or training.get("eval_every", 0) == 0:
            training["eval_every"] = steps
    if threads:
        raw["training"]["threads"] = threads
    if start == "pretrained":
        raw["model"]["init_from"] = str(out / "pretrain")
    else:
        from_scratch(raw, out / "pretrain")
    recipe = recipe_from_dict(raw, source=str(recipe_file), base_dir=recipe_file.parent, overrides=settings)
    run_folder = out / f"{task}-{start}"
    if run_folder.exists():
        shutil.rmtree(run_folder)  # this script's own earlier run of the same recipe
    started = time.perf_counter()
    result = train_recipe(recipe, run_folder, progress=False)
    evaluation = last_evaluation(result)
    seconds = round(time.perf_counter() - started, 1)
    return {"steps": result.steps, "recipe_steps": recipe_steps, "seconds": seconds,
            **{name: evaluation.get(name) for name in ("eval_loss", *FINE_TUNING[task][1])},
            **evaluate_second_split(run_folder, task)}


def report(results: dict) -> None:
    """The six figures side by side."""
    print("\n| task | metric | pretrained | scratch | difference | seconds (pretrained / scratch) |")
    print("|---|---|---|---|---|---|")
    for task, (_, metrics) in FINE_TUNING.items():
        runs = {start: results.get(f"{task}-{start}") for start in ("pretrained", "scratch")}
        if not all(runs.values()):
            continue
        shown = list(metrics[:2] if task == "squad" else metrics[:1])
        shown += [name for name in ("test_accuracy",) if all(name in run for run in runs.values())]
        for metric in shown:
            pretrained, scratch = runs["pretrained"][metric], runs["scratch"][metric]
            print(f"| {task} | {metric} | {pretrained:.4f} | {scratch:.4f} | {pretrained - scratch:+.4f} | "
                  f"{runs['pretrained']['seconds']:.0f} / {runs['scratch']['seconds']:.0f} |")


def save_results(out: Path, stage: str, figures: dict) -> None:
    """Add one stage's figures to OUT/results.json (locked: two stages may finish side by side)."""
    path = out / "results.json"
    with open(out / "results.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        results = json.loads(path.read_text()) if path.is_file() else {}
        results[stage] = figures
        path.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps({stage: figures}, indent=2), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stage", choices=["corpus", "tokenizer", "pretrain", "baseline", "finetune", "report", "all"])
    parser.add_argument("--out", type=lambda text: Path(text).resolve(), default=ROOT / "runs" / "pretraining-helps")
    parser.add_argument("--sst2-passes", type=int, default=1,
                        help="times the corpus holds the SST-2 training phrases (default: 1)")
    parser.add_argument("--pretrain-steps", type=int, help="override the recipe's max_steps")
    parser.add_argument("--resume", action="store_true", help="continue an interrupted pretraining run")
    parser.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting of the pretraining recipe (as tformer train --set) after PRETRAIN_SETTINGS, "
                             "repeatable")
    parser.add_argument("--tasks", nargs="+", choices=list(FINE_TUNING), default=list(FINE_TUNING))
    parser.add_argument("--starts", nargs="+", choices=["pretrained", "scratch"], default=["pretrained", "scratch"])
    parser.add_argument("--steps", type=int, help="fine-tune for this many steps instead of each recipe's")
    parser.add_argument("--threads", type=int, help="fine-tune with this many CPU threads instead of each recipe's")
    parser.add_argument("--finetune-set", dest="finetune_settings", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting of the fine-tuning recipes (as tformer train --set), both starts, repeatable")
    args = parser.parse_args()
    new_corpus = args.stage in ("corpus", "all") or not (args.out / "corpus.txt").is_file()
    if new_corpus:
        save_results(args.out, "corpus", build_corpus(args.out, args.sst2_passes))
    no_tokenizer = not (args.out / "tokenizer.json").is_file()
    if new_corpus or args.stage == "tokenizer" or (args.stage == "pretrain" and no_tokenizer):
        save_results(args.out, "tokenizer", build_tokenizer(args.out))  # the vocabulary of the corpus there
    if args.stage in ("pretrain", "all"):
        save_results(args.out, "pretrain", pretrain(args.out, args.pretrain_steps, args.resume, args.settings))
    if args.stage in ("baseline", "pretrain", "all"):
        save_results(args.out, "frequency_baseline", frequency_baseline(args.out))
    if args.stage in ("finetune", "all"):
        if not (args.out / "pretrain" / "model.safetensors").is_file():
            raise SystemExit(f"{args.out / 'pretrain'}: no pretrained model yet (run the pretrain stage)")
        for task in args.tasks:
            for start in args.starts:
                save_results(args.out, f"{task}-{start}", fine_tune(args.out, task, start, args.steps, args.threads,
                                                                      tuple(args.finetune_settings)))
    report(json.loads((args.out / "results.json").read_text()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
