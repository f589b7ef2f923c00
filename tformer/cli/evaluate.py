"""``tformer evaluate RUN --data FILE``: the metrics of a trained model on a data file, by the task
of the recipe it was trained with (accuracy and F1, entity F1, exact match, loss and perplexity, BLEU,
WER and CER).
A classification run also gets its confusion matrix drawn as a PNG.

``tformer evaluate RUN --source FILE --reference FILE``: translate the sources with the run's
encoder-decoder, then score the translations as below (they are written beside the metrics).

``tformer evaluate --hypotheses FILE --reference FILE``: sacreBLEU's BLEU and chrF of translations
already made (one line per reference), with their signatures."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tformer.cli import add_progress_option, show_progress
from tformer.cli.model_source import add_model_source, output_beside_model, run_recipe


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "evaluate", help="score a trained model on a data file with its recipe's task and metrics",
        description="Evaluate the model of a run folder (or one of its checkpoints, e.g. RUN/checkpoints/best) on "
                    "--data, read and scored as the run's recipe reads and scores its evaluation data. Prints the "
                    "metrics and writes them, with a confusion matrix PNG for a classification run, into --out.",
    )
    add_model_source(parser, "folder", "a run folder (with recipe.toml), or a checkpoint folder inside one "
                       "(with --data); any model folder (with --source)", "RUN", nargs="?")
    parser.add_argument("--data", action="append",
                        help="the file (or image folder) to evaluate on, in the format of the run's data; for a "
                             "text_to_text run NAME=FILE, once per source to score (FILE read as that source's)")
    parser.add_argument("--hypotheses", metavar="FILE",
                        help="translations to score against --reference, one line each (no RUN): BLEU and chrF")
    parser.add_argument("--source", metavar="FILE",
                        help="sentences for RUN (an encoder-decoder) to translate and score against --reference")
    parser.add_argument("--reference", metavar="FILE", help="the reference translations, one line each")
    parser.add_argument("--beam", type=int,
                        help="beams (1 = greedy): with --source (default: 5), or with --data for a run whose task "
                             "decodes (translation, speech recognition, text to text; default: its eval_beams)")
    parser.add_argument("--lowercase", action="store_true", help="case-insensitive BLEU (default: cased)")
    parser.add_argument("--per-sentence", action="store_true", help="also print each line's sentence BLEU")
    parser.add_argument("--out", help="folder for the metrics JSON and plots (default: RUN/evaluation)")
    parser.add_argument("--batch-size", type=int, help="rows per forward pass (default: the recipe's batch size)")
    add_progress_option(parser)
    parser.add_argument("--overwrite", action="store_true",
                        help="replace outputs in --out that tformer evaluate did not write (or that were edited "
                             "since); its own are replaced without it")
    parser.set_defaults(run=run)


DEFAULT_TRANSLATION_BEAMS = 5  # --source
OUTPUTS_KEY = "outputs"  # in a metrics JSON: {name: SHA-256} of the files evaluate wrote beside it


def check_own_output(path: Path, overwrite: bool) -> None:
    """Refuse to replace a metrics file that tformer evaluate did not write (a JSON without its record's keys)
    unless ``overwrite``, and an output folder that is a file."""
    from tformer.cli import UsageError, check_replaceable

    if path.parent.exists() and not path.parent.is_dir():
        raise UsageError(f"--out {path.parent}: exists and is not a folder")
    check_replaceable(path, overwrite, written_by_tformer=lambda file: evaluation_record(file) is not None,
                      what="an evaluation tformer wrote")


def evaluation_record(path: Path) -> dict | None:
    """The record of a metrics file tformer evaluate wrote, or None (absent, unreadable, or not its record)."""
    try:
        written = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return written if isinstance(written, dict) and {"model", "data", "task"} <= written.keys() else None


def recorded_outputs(metrics_file: Path) -> dict[str, str]:
    """The files an evaluation recorded beside its metrics file, by name, with their SHA-256 when written."""
    outputs = (evaluation_record(metrics_file) or {}).get(OUTPUTS_KEY)
    return {name: digest for name, digest in outputs.items() if isinstance(digest, str)} \
        if isinstance(outputs, dict) else {}


def written_beside(path: Path, metrics_file: Path) -> bool:
    """Whether ``path`` is, byte for byte, the file the evaluation recorded in ``metrics_file`` wrote."""
    from tformer.files import sha256_of

    recorded = recorded_outputs(metrics_file).get(path.name)
    return recorded is not None and path.is_file() and sha256_of(path) == recorded


def run(args: argparse.Namespace) -> int:
    from tformer.cli import UsageError

    if args.beam is not None and args.beam < 1:
        raise UsageError(f"--beam {args.beam} must be a positive integer")
    if args.hypotheses:
        if not args.reference or args.folder or args.data or args.source:
            raise UsageError("scoring translations takes --hypotheses FILE and --reference FILE, without RUN, --data "
                             "or --source")
        return score_translations(args)
    if args.source or args.reference:
        if not (args.folder and args.source and args.reference) or args.data:
            raise UsageError("translating and scoring takes RUN, --source FILE and --reference FILE (without --data)")
        return evaluate_translation(args)
    if not args.folder or not args.data:
        raise UsageError("give RUN and --data FILE (or --hypotheses FILE --reference FILE to score translations)")
    return evaluate_run(args)


def score_translations(args: argparse.Namespace) -> int:
    """BLEU and chrF of a hypothesis file against a reference file, printed with their signatures."""
    from tformer.evaluation.translation import read_aligned_lines

    hypotheses, references = read_aligned_lines(args.hypotheses, args.reference)
    print_scores(hypotheses, references, args)
    return 0


def evaluate_translation(args: argparse.Namespace) -> int:
    """Translate --source with RUN's encoder-decoder, score against --reference, and write the metrics and
    the translations into --out (default RUN/evaluation)."""
    import time

    from tformer.cli import UsageError, check_replaceable
    from tformer.cli.model_source import load_translator
    from tformer.data.parallel import read_aligned
    from tformer.files import sha256_of, write_text_atomically
    from tformer.generation.translation import translate
    from tformer.nn import compiled

    quantize = args.model_source.quantize
    beam = DEFAULT_TRANSLATION_BEAMS if args.beam is None else args.beam
    if args.batch_size is not None and args.batch_size < 1:
        raise UsageError(f"--batch-size {args.batch_size} must be a positive integer")
    sources, references = read_aligned(args.source, args.reference, what="sentence")
    folder = Path(args.folder)
    out = output_beside_model(args, folder, "evaluation")
    stem = Path(args.source).name.split(".")[0] + quantized_suffix(quantize)
    metrics_file = out / f"{stem}.json"
    check_own_output(metrics_file, args.overwrite)
    hypotheses_file = out / f"{stem}.beam{beam}.txt"
    check_replaceable(hypotheses_file, args.overwrite, what=f"the translation {metrics_file.name} records (edited "
                      "since, or not written by tformer evaluate)",
                      written_by_tformer=lambda path: written_beside(path, metrics_file))
    model = load_translator(args.model_source)
    compiled.ready(model.device)  # a first run builds the CPU kernels here, outside the timed part
    started = time.perf_counter()
    result = translate(model, sources, num_beams=beam, batch_size=args.batch_size or 64, progress=show_progress(args))
    seconds = time.perf_counter() - started
    notes = f" ({result.cut:,} sources cut to {model.position_limit} tokens)" if result.cut else ""
    print(f"translated {len(sources):,} sentences in {seconds:.1f} s, beam {beam}{notes}")
    scores = print_scores(result.texts, references, args)
    record = {"model": str(folder), "data": str(args.source), "reference": str(args.reference), "task": "translation",
              "beam": beam, "seconds": seconds, **quantization_record(model), **scores.as_dict()}
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomically(hypotheses_file, "".join(f"{line}\n" for line in result.texts))
    record[OUTPUTS_KEY] = {**recorded_outputs(metrics_file), hypotheses_file.name: sha256_of(hypotheses_file)}
    write_text_atomically(metrics_file, json.dumps(record, indent=2) + "\n")
    print(f"metrics    {metrics_file}")
    print(f"output     {hypotheses_file}")
    return 0


def print_scores(hypotheses: list[str], references: list[str], args: argparse.Namespace):
    """Print (and return) the BLEU and chrF of ``hypotheses`` with their signatures (and each line's BLEU)."""
    from tformer.evaluation.translation import translation_scores

    scores = translation_scores(hypotheses, references, lowercase=args.lowercase, per_sentence=args.per_sentence)
    print(f"sentences  {scores.sentences:,}")
    print(f"bleu       {scores.bleu:.2f}   {scores.bleu_signature}")
    print(f"chrf       {scores.chrf:.2f}   {scores.chrf_signature}")
    for line, value in enumerate(scores.sentence_bleu, start=1):
        print(f"{line}\t{value:.2f}")
    return scores


def evaluate_run(args: argparse.Namespace) -> int:
    import dataclasses

    import torch

    from tformer.cli import UsageError, check_replaceable
    from tformer.cli.model_source import load_model
    from tformer.files import write_text_atomically
    from tformer.training.tasks import task_for_recipe
    from tformer.training.trainer import Trainer

    folder = Path(args.folder)
    if args.batch_size is not None and args.batch_size < 1:
        raise UsageError(f"--batch-size {args.batch_size} must be a positive integer")
    source = args.model_source
    quantize, device = source.quantize, source.device
    with_recipe = Path(source.adapter) if source.adapter and not (folder / "recipe.toml").is_file() else folder
    recipe = run_recipe(with_recipe, model=folder)  # an adapter run's recipe, over its base
    task_config, data_file = evaluation_task(args, recipe)
    decodes = hasattr(task_config.options, "eval_beams")  # translation, speech recognition, text to text
    model = load_model(source.replace(device=torch.device("cpu"))).model  # the Trainer moves it to --device
    if "image_processor" in type(model).attachments:
        if getattr(model, "image_processor", None) is None:
            raise UsageError(f"{folder}: the model folder has no preprocessor_config.json (the normalisation its "
                             "weights were trained with)")
    elif model.tokenizer is None:
        raise UsageError(f"{folder}: the model folder has no tokenizer to read --data with")
    if task_config.name == "text_to_text":
        data = dataclasses.replace(recipe.data, sources=evaluated_sources(args.data, recipe), tokenizer="char")
    else:
        data = dataclasses.replace(recipe.data, train=str(data_file), eval=str(data_file), eval_fraction=0.0,
                                   tokenizer="char")  # "char": none named; the model's own tokenizer reads the data
    label_names = tuple(model.config.label_names) or None
    task, loaded = task_for_recipe(task_config, data, seq_len=recipe.training.seq_len, tokenizer=model.tokenizer,
                                   label_names=label_names, model_folder=str(folder))
    training = dataclasses.replace(recipe.training, eval_batches=0, device=str(device), compile=False,
                                   batch_size=args.batch_size or recipe.training.batch_size,
                                   threads=args.threads or recipe.training.threads)  # --threads over the recipe's
    trainer = Trainer(model, training, task, out_dir=None, progress=False)
    print(f"data       {loaded.description}")
    metrics = trainer.evaluate_metrics(progress=show_progress(args))
    if metrics is None:
        raise UsageError(f"--data {data_file}: nothing to evaluate")
    for name, value in metrics.items():
        print(f"{name:<18} {value:.4f}")

    out = output_beside_model(args, folder, "evaluation")
    beam_suffix = "" if args.beam is None else f".beam{args.beam}"  # beside the recipe's own beams' figures
    stem = data_file.name.split(".")[0] + quantized_suffix(quantize) + beam_suffix
    record = {"model": str(folder), "data": str(data_file), "task": recipe.task.name, **quantization_record(model),
              **({"beam": task_config.eval_beams} if decodes else {}), **metrics}
    check_own_output(out / f"{stem}.json", args.overwrite)
    confusion = getattr(task, "confusion", None)
    if confusion is not None:
        from tformer.viz.figures import written_by_tformer

        check_replaceable(out / f"{stem}-confusion.png", args.overwrite, written_by_tformer=written_by_tformer,
                          what="a figure tformer wrote")
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomically(out / f"{stem}.json", json.dumps(record, indent=2) + "\n")
    print(f"metrics    {out / f'{stem}.json'}")
    if confusion is not None:
        from tformer.viz.confusion import plot_confusion_matrix

        png = plot_confusion_matrix(confusion, task.label_names, out / f"{stem}-confusion.png",
                                    title=f"{folder.name} on {data_file.name}")
        print(f"plot       {png}")
    return 0


def evaluation_task(args: argparse.Namespace, recipe):
    """The run's task settings as evaluate reads --data with them (--beam, a translation's tokenizer, speech's
    word error rate), and the data file (a text-to-text run: the name its outputs are written under)."""
    from tformer.cli import UsageError
    from tformer.training.tasks.translation import TranslationOptions

    task_config = recipe.task
    data_file = Path(args.data[0])
    if task_config.name == "text_to_text":
        data_file = Path(text_to_text_sources(args.data, recipe))
    elif len(args.data) > 1:
        raise UsageError(f"--data is given {len(args.data)} times; a {task_config.name} run is evaluated on one file")
    elif task_config.name == "translation":
        data_file = translation_corpus(data_file, recipe.data)
        # the model folder's tokenizer reads the data: the settings of learning one do not apply
        task_config = task_config.replace(bpe_vocab_size=TranslationOptions.bpe_vocab_size)
    elif not (data_file.is_file() or data_file.is_dir()):  # a folder: an image folder, speech pairs
        raise UsageError(f"--data {data_file}: no such file or folder")
    if task_config.name == "speech_recognition":  # scored by its transcripts, whatever the run evaluated
        task_config = task_config.replace(eval_wer=True)
    if args.beam is not None:
        if not hasattr(task_config.options, "eval_beams"):
            raise UsageError(f"--beam: a {task_config.name} run does not decode its evaluation data; --beam goes "
                             "with --source, or with --data for a translation, speech recognition or text-to-text "
                             "run")
        task_config = task_config.replace(eval_beams=args.beam)
    return task_config, data_file


def evaluated_sources(entries: list[str], recipe) -> list[dict]:
    """The recipe's text-to-text sources that ``--data NAME=FILE`` entries name, each read from its FILE alone
    (as training and evaluation data: the task reads both)."""
    from tformer.cli import UsageError

    tables = {table["name"]: table for table in recipe.data.sources}
    chosen = {}
    for entry in entries:
        name, equals, path = entry.partition("=")
        if not equals or name not in tables or not path:
            raise UsageError(f"--data {entry}: a text_to_text run takes --data NAME=FILE, NAME one of its sources: "
                             f"{', '.join(tables)}")
        if name in chosen:
            raise UsageError(f"--data names the source {name} twice")
        chosen[name] = {**tables[name], "train": str(Path(path).resolve()), "eval": str(Path(path).resolve()),
                        "eval_fraction": 0.0}
    return list(chosen.values())


def text_to_text_sources(entries: list[str], recipe) -> str:
    """The name the evaluation's outputs are written under: the sources scored, with their files' names."""
    sources = evaluated_sources(entries, recipe)
    return "+".join(f"{table['name']}-{Path(table['eval']).name.split('.')[0]}" for table in sources)


def translation_corpus(data_file: Path, data) -> Path:
    """The corpus prefix that ``--data`` names for a translation run (read as its recipe reads a corpus:
    PREFIX.SOURCE and PREFIX.TARGET, .gz or not): the prefix itself, or either side's file."""
    from tformer.cli import UsageError
    from tformer.data.files import DataFileError
    from tformer.data.parallel import corpus_file

    languages = (data.source_language, data.target_language)
    name = data_file.name.removesuffix(".gz")
    side = next((language for language in languages if name.endswith(f".{language}")), None)
    prefix = data_file.with_name(name.removesuffix(f".{side}")) if data_file.is_file() and side else data_file
    try:
        for language in languages:
            corpus_file(prefix, language)
    except DataFileError as error:
        raise UsageError(f"--data (the corpus of a {' -> '.join(languages)} translation run): {error}") from None
    return prefix


def quantized_suffix(scheme) -> str:
    """What the output files' names carry when --quantize asked for a scheme (".int8"), so that they stand
    beside the float model's instead of replacing them; "" otherwise."""
    return "" if scheme is None else f".{scheme.method}" + (f"-g{scheme.group_size}" if scheme.group_size else "")


def quantization_record(model) -> dict:
    """The quantization scheme of ``model`` for the metrics file, or nothing for a float model."""
    scheme = getattr(model, "quantization", None)
    return {} if scheme is None else {"quantization": scheme.to_dict()}
