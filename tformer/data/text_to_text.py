"""Text-to-text data (T5's format): every task is (input text, target text), the input carrying its task's
prefix ("sst2 sentence: ...", "translate German to English: ...", "question: ... context: ..."), so one
encoder-decoder learns them all and is scored by each task's own metric on the text it writes.

A recipe names its sources in ``[data] sources``, a list of tables: each has a ``name``, a ``kind`` saying
how its files are read (``classification``: a text and a label, the label's name the target;
``translation``: sentence pairs, corpus prefixes or records; ``squad``: SQuAD questions, the first gold
answer the target and every gold answer scored), a ``template`` the input is written from, the ``metric``
its evaluation reports, and the ``[data]`` settings that read its files (``train``, ``eval``,
``eval_fraction``, ``columns``, ``source_language``, ...). The mixture draws training rows from the sources
at rates set by ``mixture_rates`` (T5's examples-proportional mixing with a limit, or temperature-scaled,
or each source's own ``rate``, as seqio's mixtures take them).
"""

from __future__ import annotations

import dataclasses
import math
import string
from collections.abc import Sequence
from dataclasses import dataclass

from tformer.data.classification import ClassificationData
from tformer.data.files import DataFileError
from tformer.data.parallel import ParallelText
from tformer.data.sources import DataConfig, DataError
from tformer.data.squad import SquadData
from tformer.errors import listed

# kind -> (the fields its template may name, its default template, its default metric)
SOURCE_KINDS: dict[str, tuple[tuple[str, ...], str, str]] = {
    "classification": (("text", "text_pair"), "{text}", "accuracy"),
    "translation": (("source",), "{source}", "bleu"),
    "squad": (("question", "context"), "question: {question} context: {context}", "squad"),
}
METRICS = ("accuracy", "bleu", "squad")  # exact text match, corpus sacreBLEU, SQuAD exact match and F1
MIXING = ("proportional", "temperature", "equal", "rates")
SOURCE_KEYS = ("name", "kind", "template", "metric", "lowercase", "label_names", "rate")  # the rest are [data] settings


@dataclass(frozen=True)
class TextSource:
    """One source of a mixture: its ``name`` (the metrics' prefix), how its files are read (``kind``, with
    ``data``: the [data] settings of its files), the ``template`` its inputs are written from, the ``metric``
    it is scored by, whether texts are compared lowercased (``lowercase``: an uncased tokenizer's outputs),
    for a classification source the words its labels are written as (``label_names``, by label id), and its
    share of the training rows when the mixing is ``rates`` (``rate``, relative to the others')."""

    name: str
    kind: str
    template: str
    metric: str
    data: DataConfig
    lowercase: bool = False
    label_names: tuple[str, ...] | None = None
    rate: float | None = None


@dataclass
class TextPairs:
    """A source's examples as text: ``inputs`` (its template filled), ``targets`` (what the decoder learns to
    write) and ``references`` (every acceptable target, for scoring: SQuAD's gold answers)."""

    inputs: list[str]
    targets: list[str]
    references: list[list[str]]

    def __len__(self) -> int:
        return len(self.inputs)


def parse_sources(tables: Sequence[dict]) -> list[TextSource]:
    """The sources ``[data] sources`` lists, checked: a one-line DataError naming the source and its setting."""
    if not isinstance(tables, (list, tuple)) or not tables:
        raise DataError("data.sources must be a list of tables, one a source (name, kind, train, ...)")
    sources, names = [], set()
    for number, table in enumerate(tables):
        source = _parse_source(table, number)
        if source.name in names:
            raise DataError(f"data.sources: two sources are named {source.name!r}; names must differ (they "
                            "prefix the metrics)")
        names.add(source.name)
        sources.append(source)
    return sources


def check_source_files(sources: Sequence[TextSource], tokenizer: str) -> None:
    """Fail now, before any work, if a source's file is missing (a DataError naming the source)."""
    for number, source in enumerate(sources):
        try:
            dataclasses.replace(source.data, tokenizer=tokenizer).check_files()
        except DataError as error:
            raise DataError(f"data.sources[{number}] ({source.name}): {str(error).removeprefix('data.')}") from None


def _parse_source(table: dict, number: int) -> TextSource:
    where = f"data.sources[{number}]"
    if not isinstance(table, dict):
        raise DataError(f"{where} must be a table (name = ..., kind = ..., train = ...)")
    name = table.get("name")
    if not isinstance(name, str) or not name.isidentifier():
        raise DataError(f"{where}.name={name!r} must be a name of letters, digits and _ (it prefixes the metrics)")
    where = f"data.sources[{number}] ({name})"
    kind = table.get("kind")
    if kind not in SOURCE_KINDS:
        raise DataError(f"{where}: kind={kind!r} is not one of {', '.join(SOURCE_KINDS)}")
    fields, default_template, default_metric = SOURCE_KINDS[kind]
    template = table.get("template", default_template)
    metric = table.get("metric", default_metric)
    if metric not in METRICS:
        raise DataError(f"{where}: metric={metric!r} is not one of {', '.join(METRICS)}")
    if metric == "squad" and kind != "squad":
        raise DataError(f"{where}: metric = \"squad\" scores SQuAD's gold answers; a {kind} source has one target")
    _check_template(template, fields, where)
    lowercase = table.get("lowercase", False)
    if not isinstance(lowercase, bool):
        raise DataError(f"{where}: lowercase={lowercase!r} must be true or false")
    label_names = table.get("label_names")
    if label_names is not None:
        if kind != "classification":
            raise DataError(f"{where}: label_names are the target words of a classification source, not {kind}")
        if not isinstance(label_names, list) or not all(isinstance(word, str) and word.strip() for word in label_names):
            raise DataError(f"{where}: label_names={label_names!r} must be a list of words, one a label id")
        label_names = tuple(label_names)
    rate = table.get("rate")
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate < math.inf):
        raise DataError(f"{where}: rate={rate!r} must be a positive finite number (its share of the rows, relative to "
                        "the other sources' rates)")
    settings = {key: value for key, value in table.items() if key not in SOURCE_KEYS}
    allowed = {field.name for field in dataclasses.fields(DataConfig)} - {"sources", "tokenizer"}
    unknown = sorted(set(settings) - allowed)
    if unknown:
        raise DataError(f"{where}: {unknown[0]!r} is not a source setting; besides {', '.join(SOURCE_KEYS)} a "
                        "source takes the [data] settings of its files (train, eval, eval_fraction, columns, ...)")
    try:
        data = DataConfig(**settings)
    except DataError as error:
        raise DataError(f"{where}: {str(error).removeprefix('data.')}") from None
    return TextSource(name, kind, template, metric, data, lowercase, label_names,
                      None if rate is None else float(rate))


def _check_template(template: object, fields: tuple[str, ...], where: str) -> None:
    if not isinstance(template, str):
        raise DataError(f"{where}: template={template!r} must be a string such as \"{{{fields[0]}}}\"")
    try:
        named = [field for _, field, _, _ in string.Formatter().parse(template) if field is not None]
    except ValueError as error:
        raise DataError(f"{where}: template {template!r} is not a format string ({error})") from None
    wrong = [field for field in named if field not in fields]
    if wrong or not named:
        raise DataError(f"{where}: template {template!r} must name its input as {{field}}, fields: "
                        f"{listed(fields)}")


def classification_pairs(source: TextSource, data: ClassificationData) -> TextPairs:
    """Each example's template filled with its text (and second text), its label's word the target."""
    words = _label_words(source, data.label_names)
    inputs = [source.template.format(text=example.text, text_pair=example.text_pair or "")
              for example in data.examples]
    targets = [words[example.label] for example in data.examples]
    return TextPairs(inputs, targets, [[target] for target in targets])


def _label_words(source: TextSource, label_names: tuple[str, ...]) -> dict[str, str]:
    """The data's label names -> the words the targets write them as (``source.label_names`` by position)."""
    if source.label_names is None:
        return {name: name for name in label_names}
    if len(source.label_names) != len(label_names):
        raise DataError(f"data.sources ({source.name}): label_names lists {len(source.label_names)} words but the "
                        f"data has {len(label_names)} labels ({listed(label_names)})")
    return dict(zip(label_names, source.label_names, strict=True))


def translation_pairs(source: TextSource, data: ParallelText) -> TextPairs:
    """Each pair's source sentence in the template, its target sentence the target."""
    inputs = [source.template.format(source=sentence) for sentence in data.sources]
    return TextPairs(inputs, list(data.targets), [[target] for target in data.targets])


def squad_pairs(source: TextSource, data: SquadData) -> TextPairs:
    """Each question and its context in the template, its first gold answer the target, all of them scored."""
    inputs, targets, references = [], [], []
    for example in data.examples:
        if not example.answers:
            raise DataFileError(f"{data.path}: question {example.id} has no answer: a squad source's rows need a "
                                "target")
        inputs.append(source.template.format(question=example.question, context=example.context))
        targets.append(example.answers[0].text)
        references.append([answer.text for answer in example.answers])
    return TextPairs(inputs, targets, references)


def source_rates(sources: Sequence[TextSource], sizes: Sequence[int], mixing: str = "proportional", *,
                 temperature: float = 1.0, rate_limit: int = 0) -> list[float]:
    """The sources' shares of the training rows: their own ``rate`` settings with ``mixing = "rates"`` (every
    source needs one), else ``mixture_rates`` of their sizes (a source's ``rate`` is then refused, not ignored)."""
    if mixing == "rates":
        unrated = [source.name for source in sources if source.rate is None]
        if unrated:
            raise DataError(f"data.sources ({unrated[0]}) has no rate; with task.mixing = \"rates\" every source "
                            "sets its rate")
        return mixture_rates(sizes, mixing, given=[source.rate for source in sources])
    rated = [source.name for source in sources if source.rate is not None]
    if rated:
        raise DataError(f"data.sources ({rated[0]}): rate is read only with task.mixing = \"rates\" (here "
                        f"{mixing!r})")
    return mixture_rates(sizes, mixing, temperature=temperature, rate_limit=rate_limit)


def mixture_rates(sizes: Sequence[int], mixing: str = "proportional", *, temperature: float = 1.0,
                  rate_limit: int = 0, given: Sequence[float] = ()) -> list[float]:
    """Each source's share of the training rows (summing to 1), from its number of examples: ``proportional``
    to them, each counted as at most ``rate_limit`` (0: no limit; T5's K); ``temperature``: those
    proportions to the power 1 / ``temperature``, renormalised (T5's temperature-scaled mixing, T = 1 being
    proportional); ``equal``: the same share each; ``rates``: the ``given`` rates (one a source), renormalised."""
    if mixing not in MIXING:
        raise DataError(f"mixing={mixing!r} is not one of {', '.join(MIXING)}")
    if mixing == "rates":
        if len(given) != len(sizes) or not all(rate > 0 for rate in given):
            raise DataError(f"mixing = \"rates\" needs a positive rate for each of the {len(sizes)} sources, got "
                            f"{list(given)}")
        return [rate / sum(given) for rate in given]
    if mixing == "equal":
        return [1.0 / len(sizes)] * len(sizes)
    counted = [min(size, rate_limit) if rate_limit else size for size in sizes]
    exponent = 1.0 / temperature if mixing == "temperature" else 1.0
    weights = [(count / sum(counted)) ** exponent for count in counted]
    return [weight / sum(weights) for weight in weights]
