"""``tformer predict RUN --text ...``: what a fine-tuned encoder says about a text, by its head: the
label and its probability (sequence classification), the entities with their character spans
(token classification), an answer with its score (``--question`` / ``--context``, extractive QA), or
the likeliest tokens for each ``[MASK]`` (masked LM)."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from tformer.cli.model_source import add_model_source, run_recipe
from tformer.errors import quoted

HEADS = ("sequence_classification", "token_classification", "question_answering", "masked_lm", "pretraining")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "predict", help="classify a text, tag its entities, answer a question or fill [MASK] with an encoder",
        description="Run the model of a folder (a run folder, a checkpoint, a Hugging Face folder) on texts given "
                    "on the command line, reading the answer its head gives: a label, entities, an answer span or "
                    "masked tokens. --json prints one JSON object per text instead of lines.",
    )
    add_model_source(parser, "model", "a model folder with a tokenizer (an encoder with a task head)",
                     without=("device",))
    parser.add_argument("--text", action="append", default=[], help="a text to classify, tag or fill (repeatable)")
    parser.add_argument("--pair", help="the second text of a pair (sequence classification of pairs)")
    parser.add_argument("--question", help="a question (extractive QA; with --context)")
    parser.add_argument("--context", help="the passage that holds the answer (extractive QA)")
    parser.add_argument("--top-k", type=int, default=1, help="labels or tokens to show per prediction (default: 1)")
    parser.add_argument("--max-answer-length", type=int, default=30, help="longest answer in tokens (default: 30)")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from tformer.cli import UsageError, check_text_option
    from tformer.cli.model_source import load_model

    for option, value in (("--top-k", args.top_k), ("--max-answer-length", args.max_answer_length)):
        if value < 1:
            raise UsageError(f"{option} {value} must be a positive integer")
    texts = [check_text_option(text, "--text") for text in args.text]
    model = load_model(args.model_source).model
    head = getattr(model.config, "head", None)
    if model.config.architecture != "encoder" or head not in HEADS:
        raise UsageError(f"{args.model}: predict reads an encoder's task head ({', '.join(HEADS)}); this model is "
                         f"architecture={model.config.architecture!r}, head={head!r}"
                         + {"decoder": " (tformer generate continues a prompt)",
                            "vision": " (tformer classify labels images)"}.get(model.config.architecture, ""))
    if model.tokenizer is None:
        raise UsageError(f"{args.model}: the model folder has no tokenizer")
    if head == "question_answering":
        if args.question is None or args.context is None or texts:
            raise UsageError("a question-answering model takes --question and --context"
                             + (" (not --text)" if texts else ""))
        for option, value in (("--question", args.question), ("--context", args.context)):
            if not value.strip():
                raise UsageError(f"{option} is empty; give the {option.removeprefix('--')} as text")
        results = [predict_answer(model, args.model, check_text_option(args.question, "--question"),
                                  check_text_option(args.context, "--context"), args.max_answer_length)]
    else:
        if args.question or args.context:
            raise UsageError(f"--question/--context are for a question-answering model; this one is head={head!r}")
        if not texts:
            raise UsageError("give a text to predict on with --text")
        if args.pair is not None and head != "sequence_classification":
            raise UsageError(f"--pair is for sequence classification; this model is head={head!r}")
        if args.pair is not None:
            check_reads_pairs(model, args.model)
        predict = {"sequence_classification": lambda text: predict_label(model, text, args.pair, args.top_k),
                   "token_classification": lambda text: predict_tags(model, text),
                   "masked_lm": lambda text: fill_masks(model, text, args.top_k),
                   "pretraining": lambda text: fill_masks(model, text, args.top_k)}[head]
        with torch.inference_mode():
            results = [predict(text) for text in texts]
    for result in results:
        print(json.dumps(result, ensure_ascii=False) if args.json else result["line"])
    return 0


def check_reads_pairs(model, folder: str) -> None:
    """Refuse ``--pair`` for a classifier of single texts: a model without segment embeddings, or a run
    whose training file has no second text (a model folder without a run's recipe is taken at its word)."""
    from tformer.cli import UsageError
    from tformer.data.classification import read_classification
    from tformer.data.files import DataFileError

    if not model.config.type_vocab_size:
        raise UsageError(f"--pair: {folder} classifies single texts (it has no segment embeddings, "
                         "type_vocab_size=0); give the text alone")
    try:
        recipe = run_recipe(Path(folder))
    except FileNotFoundError:
        return  # not a run folder: nothing says what it was trained on
    if recipe.task.name != "classification":
        return
    data = recipe.data
    try:
        train = read_classification(data.train, format=None if data.format == "auto" else data.format,
                                    columns=data.columns, labeled=False, skip_bad=True)
    except DataFileError:
        return  # the training file moved or changed: nothing to tell from it
    if all(example.text_pair is None for example in train.examples):
        raise UsageError(f"--pair: {folder} was trained on single texts ({Path(data.train).name} has no second "
                         "text); give the text alone")


def predict_label(model, text: str, pair: str | None, top_k: int) -> dict:
    """The labels of a text (or pair) by probability."""
    import torch

    encoded = _encode(model, text, pair)
    probabilities = torch.softmax(model(**encoded).logits[0].float(), dim=-1)
    names = model.config.label_names_or_ids
    values, indices = probabilities.topk(min(top_k, probabilities.numel()))
    labels = [{"label": names[index], "probability": round(value, 4)} for value, index in
              zip(values.tolist(), indices.tolist(), strict=True)]
    line = ", ".join(f"{label['label']} ({label['probability']:.3f})" for label in labels)
    return {"text": text, "labels": labels, "line": f"{line}\t{text}"}


def predict_tags(model, text: str) -> dict:
    """The entities of a text with their character spans."""
    from tformer.training.tasks.token_classification import predict_entities

    entities = [{"type": kind, "start": start, "end": end, "text": span, "score": round(score, 4)}
                for kind, start, end, span, score in predict_entities(model, model.tokenizer, text)]
    line = "; ".join(f"{entity['type']} [{entity['start']}:{entity['end']}] {entity['text']!r} ({entity['score']:.3f})"
                     for entity in entities) or "no entities"
    return {"text": text, "entities": entities, "line": f"{line}\t{text}"}


def predict_answer(model, folder: str, question: str, context: str, max_answer_length: int) -> dict:
    """The best answer span of ``context`` for ``question`` over windows as the run trained on (its
    recipe's seq_len and doc_stride; else the model's context up to 384 tokens, a third of it shared), with
    its score."""
    import torch

    from tformer.training.tasks.span_qa import best_answer, question_windows

    seq_len = min(model.config.max_seq_len, 384)
    doc_stride = seq_len // 3  # Hugging Face's run_qa: 384 and 128
    try:
        recipe = run_recipe(Path(folder))
        seq_len, doc_stride = recipe.training.seq_len or seq_len, getattr(recipe.task.options, "doc_stride", doc_stride)
    except FileNotFoundError:
        pass  # no run's recipe (a Hugging Face folder): the defaults
    windows = question_windows(model.tokenizer, [question], [context], seq_len=seq_len, doc_stride=doc_stride,
                               padding=True)
    inputs = {name: torch.tensor(windows[name]) for name in input_names(model) if name in windows}
    with torch.inference_mode():
        output = model(**inputs)
    answer = best_answer(output.start_logits, output.end_logits, windows.encodings, context,
                         max_answer_length=max_answer_length)
    line = f"{answer.text}\t(score {answer.score:.3f}, characters {answer.start_char}-{answer.end_char})"
    score = round(answer.score, 4) if math.isfinite(answer.score) else None  # None: no legal span
    return {"question": question, "answer": answer.text, "score": score,
            "start": answer.start_char, "end": answer.end_char, "line": line}


def fill_masks(model, text: str, top_k: int) -> dict:
    """The likeliest tokens at each mask token of the text."""
    import torch

    from tformer.cli import UsageError

    tokenizer = model.tokenizer
    mask_id = tokenizer.mask_token_id
    encoded = _encode(model, text, None)
    positions = (encoded["input_ids"][0] == mask_id).nonzero().flatten().tolist() if mask_id is not None else []
    if not positions:
        raise UsageError(f"--text {text!r} holds no {tokenizer.mask_token or 'mask'} token to fill")
    probabilities = torch.softmax(model(**encoded).logits[0, positions].float(), dim=-1)  # (M, V)
    values, indices = probabilities.topk(top_k, dim=-1)
    fills = [[{"token": tokenizer.id_to_token(index), "probability": round(value, 4)}
              for value, index in zip(row_values, row_indices, strict=True)]
             for row_values, row_indices in zip(values.tolist(), indices.tolist(), strict=True)]
    line = " | ".join(", ".join(f"{fill['token']} ({fill['probability']:.3f})" for fill in mask) for mask in fills)
    return {"text": text, "masks": fills, "line": f"{line}\t{text}"}


def _encode(model, text: str, pair: str | None) -> dict:
    """The model inputs of one text (or pair), cut to the model's positions with a warning saying how
    much was left out (the prediction reads only the start)."""
    import warnings

    limit = model.config.max_seq_len
    pairs = None if pair is None else [pair]
    length = len(model.tokenizer.encode_batch([text], pairs)["input_ids"][0])
    if length > limit:
        what = "--text and --pair" if pair is not None else "--text"
        warnings.warn(f"{what} {quoted(text, 40)}: {length:,} tokens, cut to the model's {limit}; the prediction "
                      f"reads only the first {limit} (the last {length - limit:,} tokens are left out)", stacklevel=2)
    encoded = model.tokenizer.encode_batch([text], pairs, truncation=True, max_length=limit, return_tensors="pt")
    return {name: values for name, values in encoded.items() if name in input_names(model)}


def input_names(model) -> tuple[str, ...]:
    """The tokenizer's outputs the model reads: token_type_ids only with segment embeddings (a model without
    them reads a pair as one sequence, as DistilBERT does)."""
    segments = ("token_type_ids",) if model.config.type_vocab_size else ()
    return ("input_ids", "attention_mask", *segments)
