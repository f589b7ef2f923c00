"""Readers of labelled data: classification rows (TSV, CSV, JSONL), CoNLL tag files and SQuAD v1.1 JSON.
Each bad input fails with a one-line message naming the file and the line (or the question), or is
skipped and counted when asked; the real shared files read with their published counts."""

from __future__ import annotations

import gzip
import json

import pytest
from shared_data import SHARED_DATA, require

from tformer.data.classification import read_classification
from tformer.data.conll import read_conll
from tformer.data.files import DataFileError
from tformer.data.squad import read_squad
from tformer.errors import TformerError

SST2 = SHARED_DATA / "sst2"
WNUT17 = SHARED_DATA / "wnut17"
SQUAD_DEV = SHARED_DATA / "squad-v1.1" / "dev-v1.1.json.gz"


def write(path, text: str):
    path.write_text(text, encoding="utf-8")
    return path


# ---- classification ---------------------------------------------------------------------------------------


def test_tsv_with_a_glue_header(tmp_path):
    path = write(tmp_path / "train.tsv", "sentence\tlabel\nit 's a charming journey . \t1\n\nbleak and desperate \t0\n")
    data = read_classification(path)
    assert [(e.text, e.text_pair, e.label, e.line) for e in data.examples] == [
        ("it 's a charming journey .", None, "1", 2), ("bleak and desperate", None, "0", 4)]
    assert data.label_names == ("0", "1") and data.label_ids() == [1, 0] and len(data.skipped) == 0
    assert isinstance(DataFileError("x"), TformerError)


def test_headerless_file_names_its_columns(tmp_path):
    path = write(tmp_path / "dev.tsv", "1\ta stirring , funny re-imagining\n0\tone long string of cliches .\n")
    data = read_classification(path, columns=["label", "sentence"])
    assert [(e.label, e.text) for e in data.examples] == [("1", "a stirring , funny re-imagining"),
                                                           ("0", "one long string of cliches .")]
    with pytest.raises(DataFileError) as error:
        read_classification(path)
    assert str(error.value) == (f"{path}:1: the first row ['1', 'a stirring , funny re-imagining'] is not a header "
                                "naming the columns (e.g. sentence, label); for a file without a header give "
                                "columns=[...]")


def test_pairs_csv_quoting_and_jsonl(tmp_path):
    csv_path = write(tmp_path / "pairs.csv", 'sentence1,sentence2,label\n"A man, quoted",'
                     '"He said ""hi""",entailment\nx,y,neutral\n')
    data = read_classification(csv_path)
    assert [(e.text, e.text_pair, e.label) for e in data.examples] == [
        ("A man, quoted", 'He said "hi"', "entailment"), ("x", "y", "neutral")]
    jsonl = write(tmp_path / "data.jsonl", '{"text": "good", "label": 2}\n\n{"text": "bad", "label": 10}\n'
                  '{"text": "meh", "label": 0}\n')
    data = read_classification(jsonl)
    assert data.label_names == ("0", "2", "10")  # integers sort by value, not as strings
    assert data.label_ids() == [1, 2, 0] and [e.line for e in data.examples] == [1, 3, 4]
    named = write(tmp_path / "reviews.csv", "review,stars\ngreat film,5\n")
    data = read_classification(named, text_column="review", label_column="stars")
    assert (data.examples[0].text, data.label_names) == ("great film", ("5",))
    custom = write(tmp_path / "custom.jsonl", '{"q": "is it?", "p": "it is", "y": "yes"}\n')
    data = read_classification(custom, text_column="q", text_pair_column="p", label_column="y")
    assert (data.examples[0].text, data.examples[0].text_pair, data.label_names) == ("is it?", "it is", ("yes",))


def test_declared_labels_fix_the_ids(tmp_path):
    path = write(tmp_path / "data.tsv", "text\tlabel\ngreat\tpositive\nawful\tnegative\n")
    data = read_classification(path, labels=["positive", "negative"])
    assert data.label_names == ("positive", "negative") and data.label_ids() == [0, 1]


def test_gzip_file(tmp_path):
    path = tmp_path / "train.tsv.gz"
    path.write_bytes(gzip.compress(b"sentence\tlabel\nfine \t1\n"))
    assert read_classification(path).examples[0].text == "fine"


@pytest.mark.parametrize("name, text, kwargs, message", [
    ("a.tsv", "sentence\tlabel\ngood\t1\na row without a label\n", {},
     "{path}:3: the row has no label (column 'label')"),
    ("a.tsv", "sentence\tlabel\ngood\t1\nmeh\t\n", {}, "{path}:3: the row has no label (column 'label')"),
    ("a.tsv", "sentence\tlabel\ngood\t1\nmeh\tneutral\n", {"labels": ["0", "1"]},
     "{path}:3: label 'neutral' is not one of the declared labels: 0, 1"),
    ("a.tsv", "sentence\tlabel\ngood\t1\na\ttab\t1\n", {},
     "{path}:3: 3 fields, but the header names 2: sentence, label"),
    ("a.tsv", "sentence\tlabel\n \t1\n", {}, "{path}:2: sentence is empty"),
    ("a.jsonl", '{"text": "ok", "label": 1}\n[1, 2]\n', {}, "{path}:2: not a JSON object (a list)"),
    ("a.jsonl", '{"text": "ok", "label": 1}\n{"text": "x", "label": 1.5}\n', {},
     "{path}:2: label 1.5 is not a name or an integer"),
    ("a.jsonl", '{"text": "ok", "label": 1}\n{"text": "ok", "label": 1\n', {},
     "{path}:2: not a JSON object (Expecting ',' delimiter at column 26)"),
    ("a.jsonl", '{"body": "ok", "label": 1}\n', {}, "{path}:1: no text column (one of sentence, text, sentence1, "
     "text_a) among body, label"),
    ("a.csv", 'sentence,label\n"open quote,1\n', {}, "{path}:2: the row has no label (column 'label')"),
    ("a.txt", "x", {}, "{path}: cannot tell the format from the name; use one ending in .tsv, .csv, .jsonl or "
     ".parquet, or a datasets save_to_disk folder (or give format= one of jsonl, csv, tsv, parquet, datasets)"),
    ("a.tsv", "", {}, "{path}: the file is empty"),
])
def test_bad_classification_rows(tmp_path, name, text, kwargs, message):
    path = write(tmp_path / name, text)
    with pytest.raises(DataFileError) as error:
        read_classification(path, **kwargs)
    assert str(error.value) == message.format(path=path)


def test_bad_rows_skipped_and_counted(tmp_path):
    path = write(tmp_path / "a.tsv", "sentence\tlabel\ngood\t1\nno label\nmeh\tneutral\nbad\t0\n")
    data = read_classification(path, labels=["0", "1"], skip_bad=True)
    assert [e.text for e in data.examples] == ["good", "bad"]
    assert data.skipped.messages == [f"{path}:3: the row has no label (column 'label')",
                                     f"{path}:4: label 'neutral' is not one of the declared labels: 0, 1"]
    assert data.skipped.summary() == f"2 bad records skipped (first: {path}:3: the row has no label (column 'label'))"
    only_bad = write(tmp_path / "b.tsv", "sentence\tlabel\nno label\n")
    with pytest.raises(DataFileError, match="no examples .1 bad records skipped"):
        read_classification(only_bad, skip_bad=True)


def test_unlabelled_test_split(tmp_path):
    path = write(tmp_path / "test.tsv", "index\tsentence\n0\tuneasy mishmash .\n")
    data = read_classification(path, labeled=False)
    assert (data.examples[0].text, data.examples[0].label, data.label_names) == ("uneasy mishmash .", None, ())


def test_sst2_shared_files():
    require(SST2 / "sentence-level" / "train.tsv", SST2 / "dev.tsv")
    train = read_classification(SST2 / "sentence-level" / "train.tsv", columns=["label", "sentence"])
    dev = read_classification(SST2 / "sentence-level" / "dev.tsv", columns=["label", "sentence"])
    assert (len(train), len(dev)) == (6920, 872)
    assert train.label_names == ("0", "1") and sum(train.label_ids()) == 3610 and sum(dev.label_ids()) == 444
    glue_dev = read_classification(SST2 / "dev.tsv")
    assert len(glue_dev) == 872 and not glue_dev.examples[0].text.endswith(" ")
    assert len(read_classification(SST2 / "test.tsv", labeled=False)) == 1821


# ---- CoNLL ------------------------------------------------------------------------------------------------


def test_conll_sentences(tmp_path):
    path = write(tmp_path / "a.conll", "-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\n\n\n"
                 "Peter\tB-person\nBlackburn\tI-person\n\t\n@paul\tO\n")
    data = read_conll(path)
    assert [(s.tokens, s.tags, s.line) for s in data.sentences] == [
        (("EU", "rejects"), ("B-ORG", "O"), 3), (("Peter", "Blackburn"), ("B-person", "I-person"), 7),
        (("@paul",), ("O",), 10)]
    assert data.tag_names == ("O", "B-ORG", "B-person", "I-person") and data.num_tokens == 5
    assert data.tag_ids() == [[1, 0], [2, 3], [0]]
    declared = read_conll(path, tags=["O", "B-ORG", "I-ORG", "B-person", "I-person"])
    assert declared.tag_ids() == [[1, 0], [3, 4], [0]]


def test_bad_conll_lines(tmp_path):
    path = write(tmp_path / "a.conll", "Peter\tB-PER\nBlackburn\n\nok\tO\n")
    with pytest.raises(DataFileError) as error:
        read_conll(path)
    assert str(error.value) == f"{path}:2: expected a token and its tag, got 'Blackburn'"
    with pytest.raises(DataFileError) as error:
        read_conll(write(tmp_path / "b.conll", "Peter\tB-PER\n\nParis\tB-LOC\n"), tags=["O", "B-PER", "I-PER"])
    assert str(error.value) == f"{tmp_path / 'b.conll'}:3: tag 'B-LOC' is not one of the declared tags: O, B-PER, I-PER"
    data = read_conll(path, skip_bad=True)  # the whole sentence with the bad line is left out
    assert [s.tokens for s in data.sentences] == [("ok",)]
    assert data.skipped.messages == [f"{path}:2: expected a token and its tag, got 'Blackburn'"]


def test_wnut17_shared_files():
    require(WNUT17 / "wnut17train.conll", WNUT17 / "emerging.test.annotated")
    train = read_conll(WNUT17 / "wnut17train.conll")
    test = read_conll(WNUT17 / "emerging.test.annotated")
    assert (len(train), train.num_tokens) == (3394, 62730)
    assert (len(test), test.num_tokens) == (1287, 23394)
    types = ("corporation", "creative-work", "group", "location", "person", "product")
    assert train.tag_names == ("O", *(f"B-{t}" for t in types), *(f"I-{t}" for t in types))


# ---- SQuAD ------------------------------------------------------------------------------------------------


def squad_file(path, answers=None, qas_extra=None):
    context = "The Broncos beat the Panthers in Santa Clara."
    qas = [{"id": "q1", "question": "Who won?", "answers": answers or [{"text": "Broncos", "answer_start": 4}]},
           {"id": "q2", "question": " Where? ", "answers": [{"text": "Santa Clara", "answer_start": 33},
                                                           {"text": "Santa Clara.", "answer_start": 33}]}]
    qas.extend(qas_extra or [])
    document = {"version": "1.1", "data": [
        {"title": "Super_Bowl", "paragraphs": [{"context": context, "qas": qas}]},
        {"title": "Other", "paragraphs": [{"context": "Blue sky.", "qas": [
            {"id": "q3", "question": "Colour?", "answers": [{"text": "Blue", "answer_start": 0}]}]}]}]}
    text = json.dumps(document, indent=1)
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def test_squad_examples_and_split(tmp_path):
    for name in ("s.json", "s.json.gz"):
        data = read_squad(squad_file(tmp_path / name))
        assert [(e.id, e.question, e.article, e.title) for e in data.examples] == [
            ("q1", "Who won?", 0, "Super_Bowl"), ("q2", "Where?", 0, "Super_Bowl"), ("q3", "Colour?", 1, "Other")]
        answer = data.examples[1].answers[1]
        assert (answer.text, answer.start, answer.end) == ("Santa Clara.", 33, 45)
        assert data.gold_answers()["q2"] == ["Santa Clara", "Santa Clara."]
    head, tail = data.split_articles(1)
    assert [e.id for e in head.examples] == ["q1", "q2"] and head.titles == ["Super_Bowl"]
    assert [(e.id, e.article) for e in tail.examples] == [("q3", 0)] and tail.titles == ["Other"]
    with pytest.raises(DataFileError, match="cannot split 2 articles after the first 2"):
        data.split_articles(2)


@pytest.mark.parametrize("answers, extra, message", [
    ([{"text": "Panthers", "answer_start": 4}], None,
     "{path}: question q1: answer 0 'Panthers' is not at answer_start=4 of the context (found 'Broncos ')"),
    ([{"text": "Broncos", "answer_start": "4"}], None,
     "{path}: question q1: answer 0 needs a non-empty \"text\" and an integer \"answer_start\""),
    (None, [{"id": "q1", "question": "Again?", "answers": [{"text": "The", "answer_start": 0}]}],
     "{path}: question q1: the id appears twice"),
    (None, [{"id": "q9", "question": "Unanswerable?", "answers": [], "is_impossible": True}],
     "{path}: question q9: an unanswerable (SQuAD v2) question; this reader is SQuAD v1.1"),
    (None, [{"id": "q9", "question": "No answer?", "answers": []}], "{path}: question q9: no answers"),
])
def test_bad_squad_questions(tmp_path, answers, extra, message):
    path = squad_file(tmp_path / "s.json", answers, extra)
    with pytest.raises(DataFileError) as error:
        read_squad(path)
    assert str(error.value) == message.format(path=path)
    data = read_squad(path, skip_bad=True)
    assert len(data.skipped) == 1 and data.skipped.messages[0] == message.format(path=path)
    assert len(data) == (2 if answers else 3)  # the bad question is left out, the others kept


def test_squad_without_answers_and_bad_json(tmp_path):
    path = squad_file(tmp_path / "s.json", qas_extra=[{"id": "q9", "question": "Open?"}])
    assert read_squad(path, require_answers=False).examples[2].answers == ()
    broken = write(tmp_path / "b.json", '{"data": [\n  {"title": "x",,}\n]}')
    with pytest.raises(DataFileError) as error:
        read_squad(broken)
    assert str(error.value) == (f"{broken}:2: not valid JSON (Expecting property name enclosed in double quotes "
                                "at column 17)")
    with pytest.raises(DataFileError, match="not a SQuAD file"):
        read_squad(write(tmp_path / "c.json", "[1]"))


def test_squad_shared_dev_file():
    require(SQUAD_DEV)
    data = read_squad(SQUAD_DEV)
    assert (len(data.titles), len(data)) == (48, 10570)
    assert sum(len(e.answers) for e in data.examples) == 34726
    train, evaluation = data.split_articles(38)
    assert len(train.titles) == 38 and len(evaluation.titles) == 10 and len(train) + len(evaluation) == 10570
    assert train.examples[0].title == "Super_Bowl_50"
