"""Extractive question answering (the span_qa task): windows cover each context with the stride
asked for and their answer positions map back to the answer's text (on SQuAD's own dev set too); a
window without the answer points at [CLS]; ``best_answer`` is the best legal span over all windows;
evaluation scores exactly as the official rules do on the same predictions, under one process or two;
bad data and impossible settings are one-line errors; a recipe trains end to end into a loadable folder."""

from __future__ import annotations

import json
import math
import random
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from shared_data import BERT_DIR, SHARED_DATA, require
from torch import nn

import tformer
from tformer.cli import main
from tformer.data.sources import DataConfig, DataError
from tformer.data.squad import read_squad
from tformer.evaluation.squad import squad_scores
from tformer.tokenizers import load as load_tokenizer
from tformer.training.config import TrainingConfig, TrainingError
from tformer.training.distributed import ProcessContext
from tformer.training.tasks.examples import EVAL_WEIGHTS
from tformer.training.tasks.span_qa import (
    SpanQuestionAnswering,
    answer_positions,
    best_answer,
    question_windows,
)

WORDS = ("river mountain city king queen army battle church music river bridge market harbour castle forest "
         "village north south east west old new great small red blue green golden silver winter summer "
         "ancient famous long built ruled crossed founded destroyed sang painted year").split()
QUESTION_WORDS = "what who where when which did was is the of".split()
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
SQUAD_DEV = SHARED_DATA / "squad-v1.1" / "dev-v1.1.json.gz"


def squad_json(articles: int = 6, seed: int = 0) -> dict:
    """A SQuAD v1.1 document of ``articles`` articles, 2 paragraphs of 20-60 words each, 3 questions per
    paragraph whose answers are 1-4 words of the context (a second gold answer sometimes, as in dev)."""
    generator = random.Random(seed)
    data = []
    for article in range(articles):
        paragraphs = []
        for paragraph in range(2):
            words = [generator.choice(WORDS) for _ in range(generator.randint(20, 60))]
            starts = [sum(len(word) + 1 for word in words[:index]) for index in range(len(words))]
            context = " ".join(words) + " ."
            questions = []
            for number in range(3):
                first = generator.randrange(len(words))
                last = min(len(words) - 1, first + generator.randint(0, 3))
                text = " ".join(words[first : last + 1])
                answers = [{"text": text, "answer_start": starts[first]}]
                if generator.random() < 0.3:
                    answers.append({"text": words[last], "answer_start": starts[last]})
                question = " ".join(generator.choice(QUESTION_WORDS + WORDS) for _ in range(generator.randint(3, 6)))
                questions.append({"id": f"q{article}-{paragraph}-{number}", "question": question + " ?",
                                  "answers": answers})
            paragraphs.append({"context": context, "qas": questions})
        data.append({"title": f"article {article}", "paragraphs": paragraphs})
    return {"version": "1.1", "data": data}


@pytest.fixture
def files(tmp_path):
    """(squad.json, vocab.txt) in tmp_path: the synthetic questions and a WordPiece vocabulary holding their words."""
    (tmp_path / "squad.json").write_text(json.dumps(squad_json()), encoding="utf-8")
    (tmp_path / "vocab.txt").write_text("\n".join([*SPECIALS, *dict.fromkeys(WORDS + QUESTION_WORDS), "?", "."]) + "\n",
                                        encoding="utf-8")
    return tmp_path / "squad.json", tmp_path / "vocab.txt"


def make_task(files, *, seq_len=32, doc_stride=8, **options):
    squad, vocab = files
    data = DataConfig(train=str(squad), tokenizer=str(vocab), eval_fraction=0.34)
    return SpanQuestionAnswering.from_recipe(data, seq_len=seq_len, doc_stride=doc_stride, **options)


def prepared(task, model, *, batch_size=4, rank=0, world_size=1, eval_batches=0):
    task.prepare(TrainingConfig(batch_size=batch_size, eval_batches=eval_batches, seq_len=task.seq_len),
                 ProcessContext(rank=rank, world_size=world_size), model)
    return task


class TableQA(nn.Module):
    """A stand-in QA model whose logits we control: start and end logits looked up per (token id,
    position) in fixed random tables, with the gold answers' first and last words raised."""

    def __init__(self, tokenizer, examples, max_len: int = 64) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(1)
        vocab = tokenizer.vocab_size
        self.config = SimpleNamespace(head="question_answering", vocab_size=vocab)
        self.position_limit = None
        self.start = torch.randn(vocab, generator=generator)[:, None] + torch.randn(vocab, max_len, generator=generator)
        self.end = torch.randn(vocab, generator=generator)[:, None] + torch.randn(vocab, max_len, generator=generator)
        for example in examples[::2]:  # about half the answers' boundary words made likely
            words = example.answers[0].text.split()
            self.start[tokenizer.token_to_id(words[0])] += 3.0
            self.end[tokenizer.token_to_id(words[-1])] += 3.0

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        positions = torch.arange(input_ids.shape[1])
        return SimpleNamespace(start_logits=self.start[input_ids, positions], end_logits=self.end[input_ids, positions])


def evaluate(task, model) -> tuple[dict, int]:
    """The sums over this process's evaluation batches (as the Trainer adds them) and the batch count."""
    totals, count = {}, 0
    with torch.no_grad():
        for batch in task.eval_batches():
            count += 1
            for name, value in task.eval_sums(model, batch).items():
                totals[name] = totals.get(name, 0.0) + float(value)
    return totals, count


# ---- windows ----------------------------------------------------------------------------------------------


def check_windows(tokenizer, examples, seq_len, doc_stride):
    """Windows of ``examples``: their context tokens, in order, are the context's own tokens; neighbours
    share ``doc_stride`` of them; answer positions give the answer's text. Returns (answers, exact) counts."""
    windows = question_windows(tokenizer, [e.question for e in examples], [e.context for e in examples],
                               seq_len=seq_len, doc_stride=doc_stride)
    starts, ends, no_window = answer_positions(windows, examples)
    assert no_window == 0
    by_question: dict[int, list[int]] = {}
    for row, question in enumerate(windows["overflow_to_sample_mapping"]):
        by_question.setdefault(question, []).append(row)
    assert sorted(by_question) == list(range(len(examples)))
    answers = exact = 0
    for question, rows in by_question.items():
        example = examples[question]
        context_offsets = [[offset for offset, sequence in zip(windows.encodings[row].offsets,
                                                               windows.encodings[row].sequence_ids, strict=True)
                            if sequence == 1] for row in rows]
        assert all(len(windows["input_ids"][row]) <= seq_len for row in rows)
        for left, right in zip(context_offsets, context_offsets[1:], strict=False):
            assert left[-doc_stride:] == right[:doc_stride]  # neighbours share doc_stride tokens
        covered = context_offsets[0] + [offset for part in context_offsets[1:] for offset in part[doc_stride:]]
        assert covered == tokenizer.encode_plus(example.context).offsets[1:-1]  # every context token, in order
        answer = example.answers[0]
        for row in rows:
            if starts[row] == 0:
                assert ends[row] == 0
                first, last = context_offsets[rows.index(row)][0][0], context_offsets[rows.index(row)][-1][1]
                assert not first <= answer.start < answer.end <= last  # the answer is not wholly inside
                continue
            offsets = windows.encodings[row].offsets
            text = example.context[offsets[starts[row]][0] : offsets[ends[row]][1]]
            assert windows.encodings[row].sequence_ids[starts[row]] == 1 and starts[row] <= ends[row]
            assert answer.text in text  # the tokens cover the answer (a sub-word answer: the whole word)
            answers += 1
            exact += text == answer.text
    return answers, exact


def test_windows_cover_the_context_with_the_stride_and_answers_map_back(files):
    task, _ = make_task(files)
    examples = task.train_data.examples + task.eval_examples
    answers, exact = check_windows(task.tokenizer, examples, seq_len=32, doc_stride=8)
    assert answers >= len(examples) and exact == answers  # whole words: every span is exactly the answer


def test_windows_of_squad_dev_answers_map_back_to_their_text():
    require(SQUAD_DEV, BERT_DIR / "vocab.txt")
    examples = read_squad(SQUAD_DEV).examples[::35]  # 302 questions from every article
    answers, exact = check_windows(load_tokenizer(BERT_DIR), examples, seq_len=128, doc_stride=48)
    # A few answers are part of a word ("Japan" of "Japanese"): their span is that whole word.
    assert answers >= len(examples) and exact >= 0.99 * answers


def hugging_face_positions(encoded, examples) -> tuple[list[int], list[int]]:
    """Training targets as Hugging Face's run_qa example labels its windows, from a fast tokenizer's
    output: the context's first and last token, [CLS] (0) unless they enclose the answer, else walked
    inwards to the last token starting at or before the answer and the first ending at or after it."""
    starts, ends = [], []
    for row, question in enumerate(encoded["overflow_to_sample_mapping"]):
        offsets, sequence_ids = encoded["offset_mapping"][row], encoded.sequence_ids(row)
        answer = examples[question].answers[0]
        first = sequence_ids.index(1)
        last = len(sequence_ids) - 1 - sequence_ids[::-1].index(1)
        if not (offsets[first][0] <= answer.start and offsets[last][1] >= answer.end):
            starts.append(0)
            ends.append(0)
            continue
        while first < len(offsets) and sequence_ids[first] == 1 and offsets[first][0] <= answer.start:
            first += 1
        while sequence_ids[last] == 1 and offsets[last][1] >= answer.end:
            last -= 1
        starts.append(first - 1)
        ends.append(last + 1)
    return starts, ends


@pytest.mark.slow  # imports transformers
def test_windows_and_their_targets_are_hugging_faces_on_squad_dev():
    require(SQUAD_DEV, BERT_DIR / "vocab.txt")
    transformers = pytest.importorskip("transformers")
    examples = read_squad(SQUAD_DEV).examples[5::35]
    questions, contexts = [e.question for e in examples], [e.context for e in examples]
    ours = question_windows(load_tokenizer(BERT_DIR), questions, contexts, seq_len=128, doc_stride=48)
    theirs = transformers.BertTokenizerFast(str(BERT_DIR / "vocab.txt"))(
        questions, contexts, truncation="only_second", max_length=128, stride=48, return_overflowing_tokens=True,
        return_offsets_mapping=True)
    for name in ("input_ids", "token_type_ids", "overflow_to_sample_mapping"):
        assert ours[name] == theirs[name], name
    starts, ends, _ = answer_positions(ours, examples)
    assert (starts, ends) == hugging_face_positions(theirs, examples)
    assert sum(map(bool, starts)) >= len(examples)


def test_a_window_without_the_answer_points_at_cls_and_training_reads_the_first_answer(files):
    task, _ = make_task(files)
    starts = task.train_rows.fields["start_positions"].tolist()
    ends = task.train_rows.fields["end_positions"].tolist()
    assert 0 in starts and any(starts)  # long contexts: windows without their answer
    assert all((start == 0) == (end == 0) for start, end in zip(starts, ends, strict=True))
    assert all(start <= end for start, end in zip(starts, ends, strict=True))
    cls_id = task.tokenizer.cls_token_id
    assert (task.train_rows.fields["input_ids"][:, 0] == cls_id).all()
    # Training targets the first gold answer (several words), not the second (its last word alone).
    example = next(e for e in task.train_data.examples if len(e.answers) > 1 and " " in e.answers[0].text)
    windows = question_windows(task.tokenizer, [example.question], [example.context], seq_len=32, doc_stride=8)
    spans = [(start, end) for start, end in zip(*answer_positions(windows, [example])[:2], strict=True) if start]
    assert spans and all(end - start + 1 == len(example.answers[0].text.split()) for start, end in spans)


# ---- best_answer ------------------------------------------------------------------------------------------


def brute_force(start_logits, end_logits, windows, context, max_answer_length):
    """Every (window, start, end) span inside the context, scored in plain Python."""
    best = ("", -math.inf)
    for row, window in enumerate(windows):
        inside = [index for index, sequence in enumerate(window.sequence_ids) if sequence == 1]
        for start in inside:
            for end in inside:
                if start <= end < start + max_answer_length:
                    score = float(start_logits[row, start] + end_logits[row, end])
                    if score > best[1]:
                        best = (context[window.offsets[start][0] : window.offsets[end][1]], score)
    return best


def test_best_answer_is_the_best_legal_span_over_all_windows(files):
    task, _ = make_task(files)
    example = max(task.train_data.examples, key=lambda e: len(e.context))
    windows = question_windows(task.tokenizer, [example.question], [example.context], seq_len=32,
                               doc_stride=8).encodings
    assert len(windows) >= 3
    shape = (len(windows), 40)  # padded past the windows' tokens
    generator = torch.Generator().manual_seed(0)
    for trial in range(20):
        start_logits, end_logits = torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)
        length = 1 + trial % 5
        text, score = brute_force(start_logits, end_logits, windows, example.context, length)
        answer = best_answer(start_logits, end_logits, windows, example.context, n_best=40, max_answer_length=length)
        assert (answer.text, answer.score) == (text, pytest.approx(score))
        assert example.context[answer.start_char : answer.end_char] == answer.text
    # Hand-made: the highest start is after the highest end, on the question, or too far: each is refused.
    start_logits, end_logits = torch.full(shape, -100.0), torch.full(shape, -100.0)
    inside = [[index for index, sequence in enumerate(window.sequence_ids) if sequence == 1] for window in windows]
    start_logits[0, 1] = end_logits[0, 1] = 100.0  # a question token: never the answer
    start_logits[2, inside[2][5]], end_logits[2, inside[2][2]] = 50.0, 50.0  # end before start
    start_logits[1, inside[1][0]], end_logits[1, inside[1][-1]] = 40.0, 40.0  # longer than max_answer_length
    start_logits[1, inside[1][3]], end_logits[1, inside[1][4]] = 10.0, 10.0  # the best legal span
    offsets = windows[1].offsets
    expected = (example.context[offsets[inside[1][3]][0] : offsets[inside[1][4]][1]], 20.0, offsets[inside[1][3]][0],
                offsets[inside[1][4]][1])
    for n_best in (2, 20):
        answer = best_answer(start_logits, end_logits, windows, example.context, n_best=n_best, max_answer_length=3)
        assert answer == expected
    # n_best limits the candidates: with one start and one end per window, none of them pairs legally.
    answer = best_answer(start_logits[1:3], end_logits[1:3], windows[1:3], example.context, n_best=1,
                         max_answer_length=3)
    assert answer == ("", -math.inf, 0, 0)


# ---- evaluation -------------------------------------------------------------------------------------------


def test_evaluation_scores_as_the_official_rules_on_the_same_predictions(files):
    task, _ = make_task(files, n_best=5, max_answer_length=4)
    model = TableQA(task.tokenizer, task.eval_examples)
    prepared(task, model, batch_size=4)
    batches = list(task.eval_batches())
    assert len(batches) > 2
    for batch in batches:  # every window of a question in one batch, at most batch_size windows but for one question
        questions = batch["question"].tolist()
        assert len(questions) <= 4 or len(set(questions)) == 1
        for question in set(questions):
            first, stop = task.eval_first_window[question], task.eval_first_window[question + 1]
            assert questions.count(question) == stop - first
    totals, _ = evaluate(task, model)
    metrics = task.finalise(totals)

    predictions, losses = {}, []
    for example in task.eval_examples:
        windows = question_windows(task.tokenizer, [example.question], [example.context], seq_len=32, doc_stride=8,
                                   padding=True)
        output = model(torch.tensor(windows["input_ids"]))
        predictions[example.id] = best_answer(output.start_logits, output.end_logits, windows.encodings,
                                              example.context, n_best=5, max_answer_length=4).text
        starts, ends, _ = answer_positions(windows, [example])
        for row, length in enumerate(map(sum, windows["attention_mask"])):  # each window's loss over its own tokens
            losses.append((F.cross_entropy(output.start_logits[row, :length], torch.tensor(starts[row]))
                           + F.cross_entropy(output.end_logits[row, :length], torch.tensor(ends[row]))).item() / 2)
    scores = squad_scores(predictions, {e.id: [a.text for a in e.answers] for e in task.eval_examples})
    assert 0 < scores.exact_match < scores.f1 < 100  # some right, some partly, some wrong
    assert metrics["eval_exact_match"] == pytest.approx(scores.exact_match, abs=1e-9)
    assert metrics["eval_f1"] == pytest.approx(scores.f1, abs=1e-9)
    assert metrics["eval_loss"] == pytest.approx(sum(losses) / len(losses), rel=1e-5)
    assert totals["questions"] == len(task.eval_examples) and totals["windows"] == len(task.eval_rows)


def test_two_processes_evaluate_and_train_on_what_one_does(files):
    single, _ = make_task(files)
    model = TableQA(single.tokenizer, single.eval_examples)
    one, one_count = evaluate(prepared(single, model, batch_size=4), model)
    halves, counts = [], []
    for rank in (0, 1):
        task, _ = make_task(files)
        totals, count = evaluate(prepared(task, model, batch_size=4, rank=rank, world_size=2), model)
        halves.append(totals)
        counts.append(count)
        assert all(float(batch[EVAL_WEIGHTS].sum()) in (0, len(batch[EVAL_WEIGHTS])) for batch in task.eval_batches())
        if rank == 0:
            first_half = task
    assert counts[0] == counts[1] and one_count > counts[0]  # as many forward passes on each process
    for name, value in one.items():  # the same windows' losses (float32) and the same predictions
        assert halves[0][name] + halves[1][name] == pytest.approx(value, rel=1e-6 if name == "loss" else 1e-12), name
    # Training: the two processes' rows are the single process's batch of twice the size.
    double, _ = make_task(files)
    prepared(double, model, batch_size=8)
    second, _ = make_task(files)
    prepared(second, model, batch_size=4, rank=1, world_size=2)
    for position in (0, 7):
        whole = double.train_batch(position)
        parts = [first_half.train_batch(position), second.train_batch(position)]
        for name, values in whole.items():
            width = values.shape[1] if values.dim() == 2 else None
            joined = torch.cat([part[name] if width is None else F.pad(part[name], (0, width - part[name].shape[1]))
                                for part in parts])
            assert torch.equal(joined, values), name


def test_eval_batches_limits_each_process_to_that_many(files):
    task, _ = make_task(files)
    model = TableQA(task.tokenizer, task.eval_examples)
    totals, count = evaluate(prepared(task, model, batch_size=4, eval_batches=2), model)
    assert count == 2 and 0 < totals["questions"] < len(task.eval_examples)


# ---- refusals ---------------------------------------------------------------------------------------------


def test_a_bad_squad_file_is_a_one_line_error_naming_the_file_and_question(files, tmp_path, capsys):
    document = squad_json()
    document["data"][1]["paragraphs"][0]["qas"][2]["answers"][0]["answer_start"] += 1
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(document), encoding="utf-8")
    with pytest.raises(DataError, match=r"^data\.train: .*bad\.json: question q1-0-2: answer 0 .* is not at "
                                        r"answer_start=\d+ of the context"):
        make_task((bad, files[1]))
    recipe = write_recipe(tmp_path, train="bad.json")
    assert main(["train", str(recipe), "--out", str(tmp_path / "run"), "--no-progress"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "question q1-0-2" in error and "Traceback" not in error
    # skip_bad: the question is left out and the description says so.
    data = DataConfig(train=str(bad), tokenizer=str(files[1]), eval_fraction=0.34, skip_bad=True)
    task, described = SpanQuestionAnswering.from_recipe(data, seq_len=32, doc_stride=8)
    assert len(task.train_data) + len(task.eval_examples) == 35
    assert "1 bad questions skipped (first: " in described.description and "\n" not in described.description


def test_impossible_settings_are_training_errors(files):
    with pytest.raises(TrainingError, match=r"task\.doc_stride=24 must be smaller than the context tokens a window "
                                            r"holds: seq_len 32 less question q\S+'s \d+ tokens and 3 special tokens"):
        make_task(files, doc_stride=24)
    with pytest.raises(TrainingError, match=r"training\.seq_len=8 leaves no room for the context of question q"):
        make_task(files, seq_len=8, doc_stride=1)
    with pytest.raises(TrainingError, match="label_names: the span_qa task has no labels"):
        make_task(files, label_names=("a", "b"))
    with pytest.raises(TrainingError, match="training.seq_len is needed by the span_qa task"):
        make_task(files, seq_len=None)
    data = DataConfig(train=str(files[0]), tokenizer=str(files[1]), eval_fraction=0.05)
    with pytest.raises(TrainingError, match=r"data\.eval_fraction=0\.05 of the 6 articles .* holds out 0"):
        SpanQuestionAnswering.from_recipe(data, seq_len=32)
    task, _ = make_task(files)
    classifier = tformer.build_model("bert-tiny", head="sequence_classification", vocab_size=64, max_seq_len=32)
    with pytest.raises(TrainingError, match="head 'question_answering', not head='sequence_classification'"):
        prepared(task, classifier)
    with pytest.raises(TrainingError, match="training.label_smoothing is not supported by the span_qa task"):
        task.prepare(TrainingConfig(label_smoothing=0.1, seq_len=32), ProcessContext(),
                     TableQA(task.tokenizer, task.eval_examples))
    with pytest.raises(TrainingError, match=r"training\.seq_len=64 differs from the task's windows of 32 tokens"):
        task.prepare(TrainingConfig(seq_len=64), ProcessContext(), TableQA(task.tokenizer, task.eval_examples))


def test_the_description_counts_each_split_and_answers_in_no_window(files):
    task, data = make_task(files)
    assert data.vocab_size == task.tokenizer.vocab_size and data.label_names is None
    assert data.description == (
        f"squad.json: training 24 questions, 4 articles, {len(task.train_rows)} windows of 32 tokens (0 answers in "
        f"no window); evaluation 12 questions, 2 articles, {len(task.eval_rows)} windows of 32 tokens (0 answers in "
        "no window)")
    # An answer longer than a window's context (5 words here) lies in no window: counted, kept as [CLS] rows.
    task, data = make_task(files, seq_len=17, doc_stride=2)
    assert task.train_no_window > 0 and f"({task.train_no_window} answers in no window)" in data.description


# ---- a recipe, end to end ---------------------------------------------------------------------------------


def write_recipe(folder, train="squad.json"):
    recipe = folder / "squad.toml"
    recipe.write_text(f"""
[model]
preset = "bert-tiny"
head = "question_answering"
max_seq_len = 32

[data]
train = "{train}"
tokenizer = "vocab.txt"
eval_fraction = 0.34

[task]
name = "span_qa"
doc_stride = 8
max_answer_length = 4

[training]
max_steps = 3
batch_size = 4
seq_len = 32
lr = 1e-3
warmup_steps = 1
eval_every = 3
eval_batches = 0
device = "cpu"
threads = 1
seed = 7
""", encoding="utf-8")
    return recipe


def test_a_recipe_trains_end_to_end_into_a_loadable_folder(files, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", str(write_recipe(tmp_path)), "--out", str(run), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "data       squad.json: training 24 questions, 4 articles" in printed
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evaluated = [record for record in logged if "eval_f1" in record]
    assert [record["step"] for record in evaluated] == [3]
    assert 0 <= evaluated[0]["eval_exact_match"] <= evaluated[0]["eval_f1"] <= 100
    assert math.isfinite(evaluated[0]["eval_loss"])
    model = tformer.load(run)
    assert model.config.head == "question_answering" and model.tokenizer is not None
    task, _ = make_task(files)
    example = task.eval_examples[0]
    windows = question_windows(model.tokenizer, [example.question], [example.context], seq_len=32, doc_stride=8,
                               padding=True)
    with torch.no_grad():
        output = model(**{name: torch.tensor(windows[name]) for name in ("input_ids", "token_type_ids",
                                                                          "attention_mask")})
    answer = best_answer(output.start_logits, output.end_logits, windows.encodings, example.context,
                         max_answer_length=4)
    assert answer.text and answer.text == example.context[answer.start_char : answer.end_char]
