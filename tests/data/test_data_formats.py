"""Records (tformer.data.records): the same data written as JSON Lines, CSV, TSV, Parquet and a datasets
save_to_disk folder gives every task the examples its own reader gives (TSV classification, CoNLL tags,
SQuAD JSON, parallel text, text, .npz images); a missing column is named with the columns there are; a
tiny recipe trains from Parquet and JSON Lines through ``tformer train``."""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from tformer.cli import main
from tformer.data import records as records_module
from tformer.data.classification import read_classification
from tformer.data.conll import read_conll, read_tagged_records
from tformer.data.files import DataFileError
from tformer.data.images import read_image_records, read_npz_images
from tformer.data.parallel import read_parallel, read_parallel_records
from tformer.data.records import RecordFile, record_lines
from tformer.data.sources import DataConfig, DataError, read_text
from tformer.data.squad import read_squad, read_squad_records
from tformer.data.token_file import read_token_file, tokenize_files
from tformer.tokenizers import CharTokenizer
from tformer.training.config import TrainingError
from tformer.training.tasks.registry import TaskConfig, check_data_options, task_for_recipe
from tformer.training.tasks.token_classification import read_tagged

pyarrow = pytest.importorskip("pyarrow")
import pyarrow.parquet as parquet  # noqa: E402  (after the skip: pyarrow is the optional "data" extra)

FORMATS = ("jsonl", "csv", "tsv", "parquet", "datasets")


def cell(value) -> str:
    """A value as a TSV/CSV cell: lists of words separated by spaces, objects as JSON."""
    if isinstance(value, list):
        return " ".join(map(str, value))
    if isinstance(value, dict):
        return json.dumps(value)
    return str(value)


def write_datasets_folder(folder: Path, rows: list[dict], features: dict | None = None, shards: int = 2) -> Path:
    """What ``Dataset.save_to_disk`` writes, written with pyarrow alone: Arrow IPC stream shards
    ``data-0000i-of-0000n.arrow``, ``state.json`` listing them and ``dataset_info.json``."""
    folder.mkdir(parents=True)
    table = pyarrow.Table.from_pylist(rows)
    names = []
    cut = -(-len(rows) // shards)
    for index in range(shards):
        name = f"data-{index:05d}-of-{shards:05d}.arrow"
        with pyarrow.OSFile(str(folder / name), "wb") as sink, pyarrow.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table.slice(index * cut, cut))
        names.append({"filename": name})
    (folder / "state.json").write_text(json.dumps({"_data_files": names, "_fingerprint": "0", "_split": None}))
    (folder / "dataset_info.json").write_text(json.dumps({"features": features or {}}))
    return folder


def write_records(folder: Path, stem: str, rows: list[dict], features: dict | None = None,
                  formats: tuple[str, ...] = FORMATS) -> dict[str, Path]:
    """``rows`` in every record format (or those of ``formats``): {format: path}."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {name: folder / f"{stem}.{name}" for name in ("jsonl", "csv", "tsv", "parquet")}
    table = pyarrow.Table.from_pylist(rows)
    if features:
        table = table.replace_schema_metadata({"huggingface": json.dumps({"info": {"features": features}})})
    parquet.write_table(table, paths["parquet"])
    paths["datasets"] = write_datasets_folder(folder / f"{stem}-saved", rows, features)
    if formats == ("parquet", "datasets"):
        return {kind: paths[kind] for kind in formats}
    paths["jsonl"].write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    header = list(rows[0])
    with open(paths["csv"], "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows([cell(row[name]) for name in header] for row in rows)
    lines = ["\t".join(header)] + ["\t".join(cell(row[name]) for name in header) for row in rows]
    paths["tsv"].write_text("\n".join(lines) + "\n", encoding="utf-8")
    return paths


# ---- sequence classification ------------------------------------------------------------------------------

SENTENCES = [("it 's a charming journey .", "1"), ("bleak and desperate", "0"), ("a fine , funny film", "1"),
             ("one long string of cliches .", "0"), ("the cat sat on the mat", "2")]


def classification_view(data):
    return [(example.text, example.text_pair, example.label) for example in data.examples], data.label_names


def test_classification_reads_the_same_examples_in_every_format(tmp_path):
    tsv = tmp_path / "glue.tsv"
    tsv.write_text("sentence\tlabel\n" + "".join(f"{text}\t{label}\n" for text, label in SENTENCES))
    expected = classification_view(read_classification(tsv))
    string_rows = [{"sentence": text, "label": label} for text, label in SENTENCES]
    integer_rows = [{"sentence": text, "label": int(label)} for text, label in SENTENCES]
    for rows in (string_rows, integer_rows):
        paths = write_records(tmp_path / f"{type(rows[0]['label']).__name__}", "train", rows)
        for kind in FORMATS:
            assert classification_view(read_classification(paths[kind])) == expected, kind


def test_integer_labels_are_class_ids_named_by_the_file_or_the_declared_names(tmp_path):
    names = ["negative", "positive", "neutral"]
    rows = [{"sentence": text, "label": int(label)} for text, label in SENTENCES]
    features = {"sentence": {"dtype": "string", "_type": "Value"}, "label": {"names": names, "_type": "ClassLabel"}}
    paths = write_records(tmp_path, "train", rows, features)
    expected = ([(text, None, names[int(label)]) for text, label in SENTENCES], tuple(names))
    for kind in ("parquet", "datasets"):  # Hugging Face's ClassLabel names travel with the file
        assert classification_view(read_classification(paths[kind])) == expected, kind
    for kind in ("jsonl", "parquet"):  # names the caller declares name the ids of a file without its own
        declared = read_classification(paths["jsonl"], labels=names)
        assert classification_view(declared) == expected, kind
    with pytest.raises(DataFileError) as error:
        read_classification(paths["jsonl"], labels=["negative", "positive"])
    assert str(error.value) == (f"{paths['jsonl']}:5: label 2 is not a class id of the 2 names (0..1: negative, "
                                "positive)")


@pytest.mark.parametrize("label, message", [
    ("NaN", "label 'NaN' is a missing value (NaN), not a class name"),
    (-1, 'label -1 is Hugging Face\'s "no label" (the rows of an unlabelled split), not a class; give labelled '
         'rows, or declare "-1" among the label names if it is a class'),
], ids=["nan", "minus-one"])
def test_a_missing_label_is_refused_in_every_format_naming_the_row(tmp_path, label, message):
    rows = [{"sentence": text, "label": int(value) if isinstance(label, int) else value} for text, value in SENTENCES]
    rows[2]["label"] = label
    paths = write_records(tmp_path, "train", rows)
    places = {"jsonl": ":3", "csv": ":4", "tsv": ":4", "parquet": ": row 3", "datasets": ": row 3"}  # the third row
    for kind in FORMATS:
        with pytest.raises(DataFileError) as error:
            read_classification(paths[kind])
        assert str(error.value) == f"{paths[kind]}{places[kind]}: {message}", kind


def test_a_float_nan_label_and_a_class_labels_minus_one_are_refused_too(tmp_path):
    jsonl = tmp_path / "nan.jsonl"
    jsonl.write_text('{"sentence": "a fine film", "label": 1}\n{"sentence": "bleak", "label": NaN}\n')
    with pytest.raises(DataFileError, match=r"nan.jsonl:2: label nan is a missing value \(NaN\), not a class name$"):
        read_classification(jsonl)
    features = {"label": {"names": ["negative", "positive"], "_type": "ClassLabel"}}
    paths = write_records(tmp_path, "test", [{"sentence": "a", "label": 1}, {"sentence": "b", "label": -1}], features,
                          formats=("parquet", "datasets"))
    for path in paths.values():
        with pytest.raises(DataFileError, match=r": row 2: label -1 is Hugging Face's \"no label\""):
            read_classification(path)


def test_minus_one_is_a_class_where_the_labels_declare_it(tmp_path):
    tsv = tmp_path / "signs.tsv"
    tsv.write_text("sentence\tlabel\ngood\t1\nbad\t-1\nso so\t0\n")
    data = read_classification(tsv, labels=["-1", "0", "1"])
    assert [example.label for example in data.examples] == ["1", "-1", "0"]


@pytest.mark.parametrize("kind, content, message", [
    ("csv", "text,text,label\na,b,pos\n", ":1: the header names column 'text' twice; each column needs its own name"),
    ("tsv", "text\tlabel\ttext\na\tpos\tb\n", ":1: the header names column 'text' twice"),
    ("jsonl", '{"text": "a", "label": "pos", "text": "b"}\n', ":1: the object names 'text' twice; each key needs its "
                                                            "own name"),
    ("parquet", None, ": the schema names column 'text' twice; each column needs its own name"),
])
def test_a_column_named_twice_is_refused(tmp_path, kind, content, message):
    path = tmp_path / f"twice.{kind}"
    if content is None:
        parquet.write_table(pyarrow.Table.from_arrays([pyarrow.array(["a"]), pyarrow.array(["b"]),
                                                       pyarrow.array(["pos"])], names=["text", "text", "label"]), path)
    else:
        path.write_text(content)
    with pytest.raises(DataFileError) as error:
        read_classification(path)
    assert str(error.value).startswith(str(path) + message) and "\n" not in str(error.value)


def test_columns_naming_one_twice_are_refused(tmp_path):
    (tmp_path / "plain.tsv").write_text("a\tb\n")
    with pytest.raises(DataFileError, match=r"plain.tsv: columns=\[...\] names 'text' twice; each column needs"):
        read_classification(tmp_path / "plain.tsv", columns=["text", "text"])


def test_a_long_value_reads_alike_in_every_text_format_and_past_the_limit_is_one_line(tmp_path, monkeypatch):
    long_text = "word " * 40_000  # 200,000 characters: past the csv module's own 128 Ki limit
    paths = write_records(tmp_path, "long", [{"text": long_text, "label": "pos"}, {"text": "short", "label": "neg"}],
                          formats=("jsonl", "csv", "tsv"))
    for kind in ("jsonl", "csv", "tsv"):
        assert read_classification(paths[kind]).examples[0].text == long_text.strip(), kind
    monkeypatch.setattr(records_module, "MAX_RECORD_CHARS", 1000)
    limit = csv.field_size_limit(1000)  # as tformer raises it to its own bound
    try:
        multiline = tmp_path / "multiline.csv"  # a quoted value over lines, each under the bound
        multiline.write_text('text,label\nok,pos\n"' + "x\n" * 600 + '",neg\n')
        for path, line in [(paths["jsonl"], 1), (paths["csv"], 2), (paths["tsv"], 2), (multiline, 3)]:
            with pytest.raises(DataFileError) as error:
                read_classification(path)
            assert str(error.value).startswith(f"{path}:{line}: ") and "past the limit of one record (1,000 " \
                "characters: a JSONL, TSV or CSV line, or a CSV value)" in str(error.value), path
    finally:
        csv.field_size_limit(limit)


@pytest.mark.slow  # imports Hugging Face datasets
def test_a_real_save_to_disk_folder_reads_as_the_tsv_does(tmp_path):
    datasets = pytest.importorskip("datasets")
    features = datasets.Features({"sentence": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=["negative", "positive", "neutral"])})
    rows = {"sentence": [text for text, _ in SENTENCES], "label": [int(label) for _, label in SENTENCES]}
    datasets.Dataset.from_dict(rows, features=features).save_to_disk(str(tmp_path / "saved"))
    tsv = tmp_path / "named.tsv"
    names = ["negative", "positive", "neutral"]
    tsv.write_text("sentence\tlabel\n" + "".join(f"{text}\t{names[int(label)]}\n" for text, label in SENTENCES))
    expected = classification_view(read_classification(tsv, labels=names))
    assert classification_view(read_classification(tmp_path / "saved")) == expected
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows, features=features)}).save_to_disk(
        str(tmp_path / "splits"))
    with pytest.raises(DataFileError, match=r"splits: a DatasetDict folder holding splits train; name one split's "
                                            r"folder \(e.g. .*splits/train\)"):
        read_classification(tmp_path / "splits")
    assert classification_view(read_classification(tmp_path / "splits" / "train")) == expected


# ---- missing columns and other refusals -------------------------------------------------------------------


@pytest.mark.parametrize("kind", FORMATS)
def test_a_missing_column_is_named_with_the_columns_there_are(tmp_path, kind):
    paths = write_records(tmp_path, "train", [{"text": "fine", "stars": 5}, {"text": "bad", "stars": 1}])
    with pytest.raises(DataFileError) as error:
        read_classification(paths[kind], label_column="label")
    where = {"jsonl": f"{paths[kind]}:1"}.get(kind, str(paths[kind]))
    assert str(error.value) == f"{where}: no column 'label' (label_column); the columns are: text, stars"
    with pytest.raises(DataFileError, match=r"no column 'tokens' \(tokens_column\); the columns are: text, stars"):
        read_tagged_records(paths[kind])


def test_the_command_line_names_a_missing_column_in_one_line(tmp_path, capsys):
    paths = write_records(tmp_path, "corpus", [{"body": "to be or not to be " * 8}])
    recipe = tmp_path / "r.toml"
    recipe.write_text(f'[model]\npreset = "gpt-nano"\nmax_seq_len = 16\n[data]\ntrain = "{paths["parquet"].name}"\n'
                      '[training]\nmax_steps = 1\n')
    assert main(["train", str(recipe), "--out", str(tmp_path / "run"), "--no-progress"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.endswith(f"{paths['parquet']}: no column 'text' (text_column); the columns are: body")
    assert len(error.splitlines()) == 1 and not (tmp_path / "run").exists()


def test_records_settings_are_refused_where_they_cannot_be_read(tmp_path):
    with pytest.raises(TrainingError, match=r"data.tokens_column is not read by the classification task \(it is a "
                                            r"setting of token_classification\)"):
        check_data_options("classification", DataConfig(train="x", tokens_column="words"))
    conll = tmp_path / "train.conll"
    conll.write_text("EU\tB-ORG\nrejects\tO\n")
    with pytest.raises(DataError, match=r"data.tokens_column names a column of a records file .*train.conll is read "
                                        "as the token_classification task's own format"):
        read_tagged(DataConfig(train=str(conll), tokens_column="words"), str(conll), None)
    jsonl = tmp_path / "train.jsonl"
    jsonl.write_text('{"text": "a b"}\n')
    with pytest.raises(DataFileError, match=r"columns=\[...\] names the columns of a TSV/CSV file without a header "
                                            r"row, not of a jsonl file"):
        RecordFile.open(jsonl, columns=["text"])
    with pytest.raises(DataError, match=r"data.text_column='' must be a column name"):
        DataConfig(train="x", text_column="")


def test_without_pyarrow_the_message_says_what_to_install(tmp_path, monkeypatch):
    path = write_records(tmp_path, "train", [{"sentence": "fine", "label": 1}])["parquet"]
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(DataFileError) as error:
        read_classification(path)
    assert str(error.value) == ("reading Parquet files and datasets folders needs pyarrow: pip install "
                                "'tformer[data]'")


def test_records_stream_rather_than_read_whole(tmp_path, monkeypatch):
    jsonl = tmp_path / "big.jsonl"
    jsonl.write_text('{"text": "first"}\n{"text": "second"}\nnot json at all\n')
    assert next(RecordFile.open(jsonl).records()) == (1, {"text": "first"})  # before the bad third line is read
    rows = [{"text": f"row {number}", "label": number % 3} for number in range(25)]
    paths = write_records(tmp_path, "many", rows)
    monkeypatch.setattr(records_module, "BATCH_ROWS", 4)  # many record batches, across two Arrow shards
    for kind in ("parquet", "datasets"):
        read = [record for _, record in RecordFile.open(paths[kind]).records()]
        assert read == rows, kind
        assert [record for _, record in RecordFile.open(paths[kind]).records(["text"])] == [
            {"text": row["text"]} for row in rows]


# ---- token classification ---------------------------------------------------------------------------------

TAGGED = [(["EU", "rejects", "German", "call"], ["B-ORG", "O", "B-MISC", "O"]),
          (["Peter", "Blackburn"], ["B-PER", "I-PER"]),
          (["BRUSSELS", "1996-08-22"], ["B-LOC", "O"])]


def tagged_view(data):
    return [(sentence.tokens, sentence.tags) for sentence in data.sentences], data.tag_names


def test_tagged_records_read_as_the_conll_file(tmp_path):
    conll = tmp_path / "train.conll"
    blocks = ["\n".join(f"{word}\t{tag}" for word, tag in zip(*sentence, strict=True)) for sentence in TAGGED]
    conll.write_text("-DOCSTART- O\n\n" + "\n\n".join(blocks) + "\n")
    expected = tagged_view(read_conll(conll))
    rows = [{"tokens": tokens, "ner_tags": tags} for tokens, tags in TAGGED]
    paths = write_records(tmp_path, "train", rows)
    for kind in FORMATS:
        assert tagged_view(read_tagged_records(paths[kind])) == expected, kind
    names = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]  # conll2003's order
    features = {"tokens": {"feature": {"dtype": "string", "_type": "Value"}, "_type": "List"},
                "ner_tags": {"feature": {"names": names, "_type": "ClassLabel"}, "_type": "Sequence"}}
    id_rows = [{"tokens": tokens, "ner_tags": [names.index(tag) for tag in tags]} for tokens, tags in TAGGED]
    id_paths = write_records(tmp_path / "ids", "train", id_rows, features)
    for kind in ("parquet", "datasets"):
        assert tagged_view(read_tagged_records(id_paths[kind])) == (expected[0], tuple(names)), kind
    with pytest.raises(DataFileError, match=r"train.jsonl:1: integer tags need tag names"):
        read_tagged_records(id_paths["jsonl"])
    assert tagged_view(read_tagged_records(id_paths["jsonl"], tags=names)) == (expected[0], tuple(names))
    # data.format = "tsv" reads a TSV table; "auto" keeps reading a .tsv as CoNLL (token<TAB>tag lines)
    config = DataConfig(train=str(paths["tsv"]), format="tsv")
    assert tagged_view(read_tagged(config, str(paths["tsv"]), None)) == expected
    conll_tsv = tmp_path / "conll.tsv"
    conll_tsv.write_text(conll.read_text())
    assert tagged_view(read_tagged(DataConfig(train=str(conll_tsv)), str(conll_tsv), None)) == expected
    uneven = tmp_path / "uneven.jsonl"
    uneven.write_text('{"tokens": ["a", "b"], "ner_tags": ["O"]}\n')
    with pytest.raises(DataFileError, match=r"uneven.jsonl:1: 2 words \(tokens\) but 1 tags \(ner_tags\)"):
        read_tagged_records(uneven)


# ---- extractive QA ----------------------------------------------------------------------------------------

CONTEXTS = ["Super Bowl 50 was an American football game. The Denver Broncos won.",
            "The game was played at Levi's Stadium in Santa Clara."]


def test_squad_records_read_as_the_squad_file(tmp_path):
    squad = {"data": [
        {"title": "Super_Bowl", "paragraphs": [
            {"context": CONTEXTS[0], "qas": [
                {"id": "q1", "question": "Who won?", "answers": [{"text": "The Denver Broncos", "answer_start": 45},
                                                                   {"text": "Denver Broncos", "answer_start": 49}]},
                {"id": "q2", "question": " What was Super Bowl 50? ",
                 "answers": [{"text": "an American football game", "answer_start": 18}]}]},
            {"context": CONTEXTS[1], "qas": [
                {"id": "q3", "question": "Where?", "answers": [{"text": "Levi's Stadium", "answer_start": 23}]}]}]},
        {"title": "Stadium", "paragraphs": [{"context": CONTEXTS[1], "qas": [
            {"id": "q4", "question": "Which city?", "answers": [{"text": "Santa Clara", "answer_start": 41}]}]}]}]}
    path = tmp_path / "dev.json"
    path.write_text(json.dumps(squad))
    expected = read_squad(path)
    rows = [{"id": example.id, "title": example.title, "context": example.context, "question": example.question,
             "answers": {"text": [answer.text for answer in example.answers],
                         "answer_start": [answer.start for answer in example.answers]}}
            for example in expected.examples]
    paths = write_records(tmp_path, "dev", rows)
    for kind in FORMATS:
        data = read_squad_records(paths[kind])
        assert (data.examples, data.titles) == (expected.examples, expected.titles), kind
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({**rows[0], "answers": {"text": ["Broncos"], "answer_start": [3]}}) + "\n")
    with pytest.raises(DataFileError) as error:
        read_squad_records(bad)
    assert str(error.value) == (f"{bad}:1: question q1: answer 0 'Broncos' is not at answer_start=3 of the context "
                                "(found 'er Bowl')")


# ---- translation ------------------------------------------------------------------------------------------

PAIRS = [("Ein Hund läuft.", "A dog runs."), ("Guten Morgen", "Good morning"), ("", "an empty side"),
         ("Die Katze, sagt er, \"schläft\".", "The cat, he says, \"sleeps\".")]


def test_translation_records_read_as_the_parallel_files(tmp_path):
    for language, side in (("de", 0), ("en", 1)):
        (tmp_path / f"train.{language}").write_text("".join(pair[side] + "\n" for pair in PAIRS))
    expected = read_parallel(tmp_path / "train", "de", "en")

    def view(pairs):
        return pairs.sources, pairs.targets, pairs.empty_skipped

    rows = [{"translation": {"de": de, "en": en}} for de, en in PAIRS]
    paths = write_records(tmp_path / "dict", "train", rows)
    for kind in FORMATS:
        assert view(read_parallel_records(paths[kind], "de", "en")) == view(expected), kind
    two = write_records(tmp_path / "two", "train", [{"de": de, "en": en} for de, en in PAIRS])
    for kind in FORMATS:
        pairs = read_parallel_records(two[kind], source_column="de", target_column="en")
        assert view(pairs) == view(expected), kind
    with pytest.raises(DataFileError, match=r"train.jsonl:1: translation has no 'fr' sentence; its languages: de, en"):
        read_parallel_records(paths["jsonl"], "fr", "en")


# ---- text: language models and masked LM ------------------------------------------------------------------


def test_text_records_are_the_lines_of_the_text_file(tmp_path):
    lines = ["First line of the corpus.", "", "A second document, after a blank line.", "  indented\tand tabbed"]
    text_file = tmp_path / "corpus.txt"
    text_file.write_text("\n".join(lines) + "\n")
    paths = write_records(tmp_path, "corpus", [{"text": line} for line in lines], formats=("parquet", "datasets"))
    paths["jsonl"] = tmp_path / "corpus.jsonl"
    paths["jsonl"].write_text("".join(json.dumps({"text": line}) + "\n" for line in lines))
    for kind in ("jsonl", "parquet", "datasets"):
        assert read_text(paths[kind], kind=kind) == read_text(text_file), kind
    # a TSV/CSV table has no blank rows (and TSV no tabs in a cell): a corpus without them reads the same
    plain_file = tmp_path / "plain.txt"
    plain_file.write_text("".join(line + "\n" for line in lines if line and "\t" not in line))
    plain = write_records(tmp_path / "plain", "corpus", [{"text": line} for line in lines if line and "\t" not in line])
    for kind in FORMATS:
        assert read_text(plain[kind], kind=kind) == read_text(plain_file), kind
    ended = tmp_path / "ended.jsonl"
    ended.write_text(json.dumps({"text": "one\n"}) + "\n" + json.dumps({"text": "two"}) + "\n")
    assert "".join(record_lines(ended)) == "one\ntwo\n"  # a text that ends in a newline gets no other


# ---- images -----------------------------------------------------------------------------------------------


def test_image_records_read_as_the_npz_file(tmp_path):
    image_module = pytest.importorskip("PIL.Image")
    generator = np.random.default_rng(0)
    images = generator.integers(0, 256, (5, 6, 7), dtype=np.uint8)
    labels = np.array([2, 0, 1, 2, 0])
    names = np.array(["cat", "dog", "bird"])
    np.savez(tmp_path / "train.npz", images=images, labels=labels, label_names=names)
    expected = read_npz_images(tmp_path / "train.npz")
    pngs = []
    for index, image in enumerate(images):
        buffer = io.BytesIO()
        image_module.fromarray(image, mode="L").save(buffer, format="PNG")
        pngs.append(buffer.getvalue())
        (tmp_path / f"{index}.png").write_bytes(buffer.getvalue())
    features = {"image": {"_type": "Image"}, "label": {"names": names.tolist(), "_type": "ClassLabel"}}
    stored = [{"image": {"bytes": png, "path": None}, "label": int(label)}
              for png, label in zip(pngs, labels, strict=True)]
    table_paths = write_records(tmp_path / "tables", "train", stored, features, formats=("parquet", "datasets"))
    by_path = [{"image": f"{index}.png", "label": str(names[label])} for index, label in enumerate(labels)]
    file_paths = {"jsonl": tmp_path / "train.jsonl", "csv": tmp_path / "train.csv"}
    file_paths["jsonl"].write_text("".join(json.dumps(row) + "\n" for row in by_path))
    file_paths["csv"].write_text("image,label\n" + "".join(f"{row['image']},{row['label']}\n" for row in by_path))
    for kind, path in [("parquet", table_paths["parquet"]), ("datasets", table_paths["datasets"]), *file_paths.items()]:
        data = read_image_records(path, label_names=None if kind in ("parquet", "datasets") else names.tolist())
        assert data.images.equal(expected.images) and data.labels.equal(expected.labels), kind
        assert data.label_names == expected.label_names, kind
    made, described = task_for_recipe(TaskConfig(name="image_classification"),
                                      DataConfig(train=str(table_paths["datasets"]), eval_fraction=0), seq_len=None)
    assert made.label_names == ("cat", "dog", "bird") and described.description.startswith(
        "training train-saved: 5 images of 1 x 6 x 7")


# ---- training from records through `tformer train` --------------------------------------------------------

WORDS = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran", "good", "bad", "film", "."]


def classification_run(tmp_path: Path, kind: str) -> dict[str, Path]:
    """A one-step classification run (tmp_path/run) trained from records named by text_column and label_column;
    the records' paths."""
    generator = np.random.default_rng(1)
    rows = []
    for number in range(16):
        label = ["bad", "good"][number % 2]
        words = [WORDS[index] for index in generator.integers(0, 8, 5)]
        rows.append({"review": " ".join([*words, label, "film"]), "stars": number % 2})
    paths = write_records(tmp_path, "train", rows)
    (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    recipe = tmp_path / "r.toml"
    recipe.write_text(
        '[model]\npreset = "bert-tiny"\nhead = "sequence_classification"\nmax_seq_len = 16\n'
        'label_names = ["negative", "positive"]\n'
        f'[data]\ntrain = "{paths[kind].name}"\ntokenizer = "vocab.txt"\ntext_column = "review"\n'
        'label_column = "stars"\neval_fraction = 0.25\n[task]\nname = "classification"\n'
        '[training]\nmax_steps = 1\nbatch_size = 4\nseq_len = 16\neval_every = 1\nthreads = 1\n')
    assert main(["train", str(recipe), "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    return paths


@pytest.mark.parametrize("kind", ["parquet", "jsonl"])
def test_a_recipe_trains_a_step_from_records(tmp_path, kind):
    classification_run(tmp_path, kind)
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any("eval_accuracy" in record for record in metrics)
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["label_names"] == ["negative", "positive"]


@pytest.mark.slow  # tformer evaluate draws its confusion matrix: matplotlib's import takes seconds
def test_evaluate_reads_records_with_the_runs_columns(tmp_path, capsys):
    paths = classification_run(tmp_path, "parquet")
    capsys.readouterr()
    assert main(["evaluate", str(tmp_path / "run"), "--data", str(paths["datasets"])]) == 0
    assert "16 examples" in capsys.readouterr().out


# ---- every task reads records from its recipe -------------------------------------------------------------


def test_every_task_reads_records_from_its_recipe_data(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, "eu", "rejects", "peter",
                                "who", "won", "denver", "broncos"]) + "\n")

    def task(name: str, label_names=None, **data):
        made, described = task_for_recipe(TaskConfig(name=name), DataConfig(eval_fraction=0, **data), seq_len=32,
                                          label_names=label_names)
        return made, described.description

    rows = [{"words": tokens, "labels": tags} for tokens, tags in TAGGED]
    tagged = write_records(tmp_path / "tagged", "train", rows, formats=("parquet", "datasets"))
    made, line = task("token_classification", train=str(tagged["parquet"]), tokenizer=str(vocab),
                      tokens_column="words", tags_column="labels")
    assert made.tag_names == ("O", "B-LOC", "B-MISC", "B-ORG", "B-PER", "I-PER")
    assert line.startswith("training 3 sentences, 8 words (train.parquet)")
    questions = [{"id": "q1", "question": "Who won?", "context": CONTEXTS[0],
                  "answers": {"text": ["The Denver Broncos"], "answer_start": [45]}}]
    qa = write_records(tmp_path / "qa", "dev", questions)
    made, line = task("span_qa", train=str(qa["jsonl"]), tokenizer=str(vocab))
    assert line.startswith("dev.jsonl: training 1 questions, 1 articles")
    with pytest.raises(DataError, match=r"data.train: .*dev.json: not a SQuAD file"):  # .json stays SQuAD's own
        renamed = qa["jsonl"].rename(tmp_path / "dev.json")
        task("span_qa", train=str(renamed), tokenizer=str(vocab))
    made, _ = task("span_qa", train=str(renamed), tokenizer=str(vocab), format="jsonl")
    assert [example.id for example in made.train_data.examples] == ["q1"]
    pairs = write_records(tmp_path / "pairs", "train", [{"translation": {"de": de, "en": en}} for de, en in PAIRS])
    made, line = task("translation", train=str(pairs["parquet"]), tokenizer="bpe", source_language="de",
                      target_language="en")
    assert line == "training train.parquet: 3 pairs (1 with an empty side skipped)"
    text = write_records(tmp_path / "text", "corpus", [{"body": "the cat sat on the mat ."}, {"body": ""},
                                                        {"body": "a dog ran ."}], formats=("parquet", "datasets"))
    made, line = task("mlm", train=str(text["datasets"]), tokenizer=str(vocab), text_column="body")
    assert line.startswith("corpus-saved: training 2 documents, 2 lines")
    with pytest.raises(DataError, match=r"data.train: .*corpus.parquet: no column 'text' \(text_column\); the "
                                        "columns are: body"):
        task("mlm", train=str(text["parquet"]), tokenizer=str(vocab))


def test_tokenize_streams_records_into_the_token_file_of_the_same_text(tmp_path, capsys):
    lines = [f"line {number}: the cat sat on the mat, and the dog ran." for number in range(40)]
    text_file = tmp_path / "corpus.txt"
    text_file.write_text("".join(line + "\n" for line in lines))
    paths = write_records(tmp_path, "corpus", [{"body": line} for line in lines])
    tokenizer = CharTokenizer.train(text_file.read_text())
    tokenizer.save(tmp_path / "tokenizer.json")
    tokenize_files(tokenizer, [text_file], tmp_path / "text.bin", progress=False, chunk_chars=64)
    expected = read_token_file(tmp_path / "text.bin").tolist()
    for kind in FORMATS:
        header = tokenize_files(tokenizer, [paths[kind]], tmp_path / f"{kind}.bin", progress=False, chunk_chars=64,
                                text_column="body")
        assert read_token_file(tmp_path / f"{kind}.bin").tolist() == expected, kind
        assert header["text_bytes"] == text_file.stat().st_size
    assert main(["tokenize", str(paths["parquet"]), "--tokenizer", str(tmp_path / "tokenizer.json"), "--out",
                 str(tmp_path / "cli.bin"), "--text-column", "body", "--quiet"]) == 0
    assert read_token_file(tmp_path / "cli.bin").tolist() == expected
    capsys.readouterr()
    assert main(["tokenize", str(paths["parquet"]), "--tokenizer", str(tmp_path / "tokenizer.json"), "--out",
                 str(tmp_path / "wrong.bin"), "--quiet"]) == 2
    assert capsys.readouterr().err.strip().endswith(f"{paths['parquet']}: no column 'text' (text_column); the "
                                                    "columns are: body")
    assert not (tmp_path / "wrong.bin").exists()
