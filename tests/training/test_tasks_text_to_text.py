"""The text_to_text task: T5's mixing rates, rows drawn at those rates (within 1% over many draws) and read
epoch by epoch per source as a pure function of (seed, position), inputs written from each source's
template, one-line refusals naming the source, and evaluation that decodes the answers and scores each
source with its own metric: equal to sacreBLEU, SQuAD's scorer and plain accuracy on the same answers."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from tformer.cli import main
from tformer.data.sources import DataError
from tformer.data.text_to_text import mixture_rates, parse_sources
from tformer.evaluation.squad import squad_scores
from tformer.generation.translation import translate_ids
from tformer.training.config import TrainingConfig, TrainingError
from tformer.training.distributed import ProcessContext
from tformer.training.recipe import RecipeError, recipe_from_dict, toml_value
from tformer.training.run import train_recipe
from tformer.training.tasks.registry import task_for_recipe

sacrebleu = pytest.importorskip("sacrebleu")

pytestmark = pytest.mark.slow  # imports sacrebleu

LEXICON = {"ein": "a", "hund": "dog", "mann": "man", "läuft": "runs", "sitzt": "sits", "rot": "red",
           "katze": "cat", "auf": "on", "dem": "the", "gras": "grass"}
WORDS = sorted({*LEXICON, *LEXICON.values(), "good", "bad", "film", "is", "very", "question", "context", "sentence",
                "translate", "to", "german", "english", "sst2", "who", "where", "what", "positive", "negative",
                "paris", "london", "lives", "in", "her", "name", "anna", "tom"})
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ":", ".", *WORDS]
SENTINELS = 4


def write_sources(folder: Path, pairs: int = 60, seed: int = 0) -> None:
    """A classification TSV, a German -> English corpus and a SQuAD file, all of the test's words."""
    rng = random.Random(seed)
    (folder / "vocab.txt").write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    rows = [(label, f"film is {'very ' * rng.randint(0, 2)}{'good' if label else 'bad'}")
            for label in (rng.randint(0, 1) for _ in range(pairs))]
    (folder / "sst.tsv").write_text("".join(f"{label}\t{text}\n" for label, text in rows), encoding="utf-8")
    sources, targets = [], []
    for _ in range(pairs):
        chosen = [rng.choice(list(LEXICON)) for _ in range(rng.randint(1, 6))]
        sources.append(" ".join(chosen) + " .")
        targets.append(" ".join(LEXICON[word] for word in chosen) + " .")
    (folder / "pairs.de").write_text("\n".join(sources) + "\n", encoding="utf-8")
    (folder / "pairs.en").write_text("\n".join(targets) + "\n", encoding="utf-8")
    articles = []
    for article in range(5):
        paragraphs = []
        for number in range(4):
            name, city = rng.choice(["anna", "tom"]), rng.choice(["paris", "london"])
            context = f"her name is {name} . {name} lives in {city} ."
            qas = [{"id": f"{article}-{number}-who", "question": "who lives in " + city,
                    "answers": [{"text": name, "answer_start": context.index(name)}]},
                   {"id": f"{article}-{number}-where", "question": f"where lives {name}",
                    "answers": [{"text": city, "answer_start": context.rindex(city)},
                                {"text": f"in {city}", "answer_start": context.rindex(f"in {city}")}]}]
            paragraphs.append({"context": context, "qas": qas})
        articles.append({"title": f"t{article}", "paragraphs": paragraphs})
    (folder / "squad.json").write_text(json.dumps({"data": articles}), encoding="utf-8")


def source_tables(folder: Path) -> list[dict]:
    return [{"name": "sst", "kind": "classification", "train": str(folder / "sst.tsv"),
             "columns": ["label", "sentence"], "eval_fraction": 0.2, "template": "sst2 sentence: {text}",
             "label_names": ["negative", "positive"]},
            {"name": "de_en", "kind": "translation", "train": str(folder / "pairs"), "source_language": "de",
             "target_language": "en", "eval_fraction": 0.2, "template": "translate german to english: {source}"},
            {"name": "qa", "kind": "squad", "train": str(folder / "squad.json"), "eval_fraction": 0.4}]


def recipe(folder: Path, task: dict | None = None, **training) -> dict:
    end = len(VOCAB)  # </s> follows the vocabulary, then the sentinels
    return {"model": {"preset": "transformer-multi30k", "vocab_size": end + 1 + SENTINELS, "d_model": 32,
                      "num_layers": 1, "num_heads": 2, "d_ff": 64, "max_seq_len": 64, "dropout": 0.0,
                      "pad_token_id": 0, "bos_token_id": None, "eos_token_id": end, "decoder_start_token_id": 0},
            "data": {"tokenizer": str(folder / "vocab.txt"), "sources": source_tables(folder)},
            "task": {"name": "text_to_text", "sentinels": SENTINELS, **(task or {})},
            "training": {"max_steps": 4, "batch_size": 8, "seq_len": 48, "eval_every": 4, "eval_batches": 0,
                         "threads": 1, "schedule": "constant", "warmup_steps": 0, "lr": 3e-3, **training}}


def prepared(folder: Path, task: dict | None = None, batch_size: int = 8, rank: int = 0, world_size: int = 1,
             seed: int = 1):
    loaded = recipe_from_dict(recipe(folder, task))
    text_task, _ = task_for_recipe(loaded.task, loaded.data, seq_len=48)
    import tformer

    model = tformer.build_model(loaded.model)
    text_task.prepare(TrainingConfig(batch_size=batch_size, seq_len=48, seed=seed, eval_batches=0),
                      ProcessContext(rank, world_size), model)
    return text_task, model


def test_mixing_rates_are_t5s():
    assert mixture_rates([100, 300]) == pytest.approx([0.25, 0.75])
    assert mixture_rates([100, 300], rate_limit=200) == pytest.approx([1 / 3, 2 / 3])  # 300 counts as 200
    # temperature 2: proportions (0.1, 0.9) to the power 1/2, renormalised: (0.316, 0.949) / 1.265
    assert mixture_rates([100, 900], "temperature", temperature=2.0) == pytest.approx([0.25, 0.75])
    assert mixture_rates([100, 900], "temperature", temperature=1.0) == pytest.approx([0.1, 0.9])
    assert mixture_rates([5, 7, 1000], "equal") == pytest.approx([1 / 3] * 3)
    assert mixture_rates([5, 7, 1000], "rates", given=[2, 1, 1]) == pytest.approx([0.5, 0.25, 0.25])
    with pytest.raises(DataError, match="mixing='mean' is not one of proportional, temperature, equal, rates"):
        mixture_rates([1, 2], "mean")
    with pytest.raises(DataError, match="needs a positive rate for each of the 2 sources"):
        mixture_rates([1, 2], "rates", given=[1.0])


def test_rows_are_drawn_at_each_sources_own_rate(tmp_path):
    write_sources(tmp_path, pairs=200)
    config = recipe(tmp_path, {"mixing": "rates"})
    for table, rate in zip(config["data"]["sources"], (5, 3, 2), strict=True):
        table["rate"] = rate
    task, _ = prepared_from(config)
    assert task.rates.tolist() == pytest.approx([0.5, 0.3, 0.2])
    task.prepare(TrainingConfig(batch_size=32, seq_len=48, seed=1, eval_batches=0), ProcessContext(0, 1),
                 prepared(tmp_path)[1])
    sources = torch.cat([task.source_draws(position) for position in range(400)])
    shares = torch.bincount(sources, minlength=3).double() / len(sources)
    assert torch.allclose(shares, task.rates, atol=0.01), shares


@pytest.mark.parametrize(("task", "rates", "message"), [
    ({"mixing": "rates"}, (2, 1, None), r"data.sources \(qa\) has no rate; with task.mixing = \"rates\" every"),
    ({}, (2, None, None), r"data.sources \(sst\): rate is read only with task.mixing = \"rates\" \(here "
                          r"'proportional'\)"),
    ({"mixing": "rates"}, (0, 1, 1), r"sources\[0\] \(sst\): rate=0 must be a positive finite number"),
    ({"mixing": "rates"}, ("high", 1, 1), r"sources\[0\] \(sst\): rate='high' must be a positive finite number"),
    ({"mixing": "rates"}, (float("inf"), 1, 1), r"sources\[0\] \(sst\): rate=inf must be a positive finite"),
    ({"mixing": "equal", "rate_limit": 100}, (None, None, None), "rate_limit limits a source's count in "
                                                                  'proportional or temperature mixing; mixing = '
                                                                  '"equal" counts no examples'),
])
def test_a_rate_the_mixing_cannot_honour_is_refused(tmp_path, task, rates, message):
    write_sources(tmp_path)
    config = recipe(tmp_path, task)
    for table, rate in zip(config["data"]["sources"], rates, strict=True):
        if rate is not None:
            table["rate"] = rate
    with pytest.raises((RecipeError, TrainingError, DataError), match=message):
        prepared_from(config)


def test_rows_are_drawn_at_the_rates_and_each_source_read_epoch_by_epoch(tmp_path):
    write_sources(tmp_path, pairs=200)
    task, _ = prepared(tmp_path, {"mixing": "temperature", "mixing_temperature": 2.0}, batch_size=32)
    positions = 400
    sources = torch.cat([task.source_draws(position) for position in range(positions)])
    shares = torch.bincount(sources, minlength=3).double() / len(sources)
    assert torch.allclose(shares, task.rates, atol=0.01), (shares, task.rates)
    rows = torch.cat([task.global_rows(position) for position in range(positions)])
    for number, size in enumerate(task.train_sizes):
        start = int(task.train_starts[number])
        mine = rows[(rows >= start) & (rows < start + size)]
        assert torch.equal(mine[:size].sort().values, torch.arange(start, start + size))  # every example once
        assert torch.equal(mine[size : 2 * size].sort().values, torch.arange(start, start + size))  # then again


def test_a_source_per_batch_keeps_the_rates_over_batches(tmp_path):
    write_sources(tmp_path, pairs=200)
    task, _ = prepared(tmp_path, {"source_per_batch": True}, batch_size=4)
    draws = [task.source_draws(position) for position in range(20_000)]
    assert all(bool((batch == batch[0]).all()) for batch in draws[:100])  # one source a batch
    shares = torch.bincount(torch.stack([batch[0] for batch in draws]), minlength=3).double() / len(draws)
    assert torch.allclose(shares, task.rates, atol=0.01), (shares, task.rates)
    for position in range(20):  # every row of a batch is an example of the batch's source
        source, rows = int(task.source_draws(position)[0]), task.global_rows(position)
        start = int(task.train_starts[source])
        assert bool(((rows >= start) & (rows < start + task.train_sizes[source])).all())


def test_batches_are_a_pure_function_of_seed_and_position_shared_by_processes(tmp_path):
    write_sources(tmp_path)
    one, _ = prepared(tmp_path, batch_size=8)
    fresh, _ = prepared(tmp_path, batch_size=8)
    later = one.train_batch(7)
    assert all(torch.equal(later[name], fresh.train_batch(7)[name]) for name in later)  # no state carried
    other_seed, _ = prepared(tmp_path, batch_size=8, seed=2)
    assert not torch.equal(other_seed.global_rows(3), one.global_rows(3))
    whole, _ = prepared(tmp_path, batch_size=8)
    halves = [prepared(tmp_path, batch_size=4, rank=rank, world_size=2)[0] for rank in (0, 1)]
    for position in (0, 5):
        assert torch.equal(whole.global_rows(position), halves[0].global_rows(position))
        rows = torch.cat([half.global_rows(position)[rank * 4 : rank * 4 + 4] for rank, half in enumerate(halves)])
        assert torch.equal(rows, whole.global_rows(position))


def test_inputs_follow_each_sources_template_and_targets_end_with_the_end_token(tmp_path):
    write_sources(tmp_path)
    task, model = prepared(tmp_path)
    tokenizer = task.tokenizer
    end = tokenizer.eos_token_id
    assert tokenizer.token_to_id("<extra_id_0>") == tokenizer.vocab_size - 1  # T5's numbering, from the end
    batch = task.train_batch(0)
    for row in range(batch["input_ids"].shape[0]):
        ids = batch["input_ids"][row][batch["attention_mask"][row].bool()].tolist()
        assert ids[-1] == end
        text = tokenizer.decode(ids[:-1]).replace(" ", "")  # WordPiece writes "english : hund"
        assert text.startswith(("sst2sentence:", "translategermantoenglish:", "question:")), text
        labels = batch["labels"][row][batch["labels"][row] != -100].tolist()
        assert labels[-1] == end
        assert batch["decoder_input_ids"][row].tolist()[: len(labels)] == [0, *labels[:-1]]
        if text.startswith("sst2"):
            assert tokenizer.decode(labels[:-1]) == ("positive" if text.endswith("good") else "negative")
    assert {source.name: source.metric for source in task.sources} == {"sst": "accuracy", "de_en": "bleu",
                                                                      "qa": "squad"}
    assert task.metrics == ("eval_loss", "eval_ppl", "eval_sst_accuracy", "eval_de_en_bleu", "eval_qa_em",
                            "eval_qa_f1")


def test_each_source_is_scored_as_its_own_scorer_scores_the_answers(tmp_path):
    write_sources(tmp_path)
    task, model = prepared(tmp_path)
    torch.manual_seed(0)
    with torch.no_grad():  # a model that writes varied answers, not one that repeats a token
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.5)
    model.eval()
    totals: dict[str, float] = {}
    for batch in task.eval_batches():
        with torch.no_grad():
            sums = task.eval_sums(model, batch)
        for key, value in sums.items():
            totals[key] = totals.get(key, 0.0) + float(value)
    metrics = task.finalise(totals)
    budget = task._answer_budget()
    answers = {}
    for number, source in enumerate(task.sources):
        rows = (task.eval_source == number).nonzero().squeeze(1)
        batch = task._pairs(rows, task.eval_rows, task.eval_targets)
        answers[source.name] = (translate_ids(model, batch["input_ids"], batch["attention_mask"], task.tokenizer,
                                              max_new_tokens=budget), [task.eval_references[int(row)] for row in rows])
    hypotheses, references = answers["de_en"]
    expected_bleu = sacrebleu.corpus_bleu(hypotheses, [[golds[0] for golds in references]]).score
    assert metrics["eval_de_en_bleu"] == pytest.approx(expected_bleu, abs=1e-9)
    hypotheses, references = answers["qa"]
    scores = squad_scores({str(n): answer for n, answer in enumerate(hypotheses)},
                          {str(n): golds for n, golds in enumerate(references)})
    assert (metrics["eval_qa_em"], metrics["eval_qa_f1"]) == pytest.approx((scores.exact_match, scores.f1), abs=1e-9)
    hypotheses, references = answers["sst"]
    correct = sum(answer.strip() == golds[0] for answer, golds in zip(hypotheses, references, strict=True))
    assert metrics["eval_sst_accuracy"] == pytest.approx(correct / len(hypotheses), abs=1e-12)


def test_an_answer_scores_against_the_best_of_every_gold_answer(tmp_path, monkeypatch):
    write_sources(tmp_path)
    task, model = prepared(tmp_path)

    def last_gold(model, input_ids, attention_mask, tokenizer, **options):  # every row answers its last reference
        rows = [int(row) for row in current_rows]
        return [task.eval_references[row][-1] for row in rows]

    import tformer.training.tasks.text_to_text as text_to_text

    monkeypatch.setattr(text_to_text, "translate_ids", last_gold)
    totals: dict[str, float] = {}
    for batch in task.eval_batches():
        current_rows = batch["row_index"][batch["weights"] > 0]
        with torch.no_grad():
            for key, value in task.eval_sums(model, batch).items():
                totals[key] = totals.get(key, 0.0) + float(value)
    metrics = task.finalise(totals)
    # SQuAD's "where" questions have two golds ("paris", "in paris"): the second is as right as the first
    assert metrics["eval_qa_em"] == metrics["eval_qa_f1"] == 100.0
    assert metrics["eval_sst_accuracy"] == 1.0 and metrics["eval_de_en_bleu"] == pytest.approx(100.0)


def test_a_run_learns_the_mixture_and_reports_every_source(tmp_path, capsys):
    write_sources(tmp_path, pairs=80)
    config = recipe(tmp_path, max_steps=200, eval_every=100)
    config["model"].update(d_model=64, d_ff=256)
    result = train_recipe(recipe_from_dict(config), tmp_path / "run", progress=False)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    final = [record for record in records if "eval_sst_accuracy" in record][-1]
    first = [record for record in records if "eval_sst_accuracy" in record][0]
    assert final["eval_sst_accuracy"] > 0.9  # "good" or "bad" decides the label: learned in 200 steps
    assert final["eval_loss"] < first["eval_loss"] and final["eval_qa_f1"] > 0
    assert {"eval_de_en_bleu", "eval_qa_em"} <= set(final) and result.steps == 200
    capsys.readouterr()
    # evaluate scores the sources named, each on its own file (the training file here: read as the run reads it)
    assert main(["evaluate", str(tmp_path / "run"), "--data", f"sst={tmp_path / 'sst.tsv'}", "--beam", "2"]) == 0
    printed = capsys.readouterr().out
    assert "eval_sst_accuracy" in printed and "eval_qa_f1" not in printed
    assert main(["evaluate", str(tmp_path / "run"), "--data", f"nli={tmp_path / 'sst.tsv'}"]) == 2
    assert "NAME one of its sources: sst, de_en, qa" in capsys.readouterr().err


@pytest.mark.parametrize(("change", "message"), [
    ({"metric": "rouge"}, r"sources\[0\] \(sst\): metric='rouge' is not one of accuracy, bleu, squad"),
    ({"metric": "squad"}, r"sources\[0\] \(sst\): metric = \"squad\" scores SQuAD's gold answers"),
    ({"template": "{sentence}"}, r"sources\[0\] \(sst\): template '\{sentence\}' must name its input as "
                                 r"\{field\}, fields: text, text_pair"),
    ({"kind": "tagging"}, r"sources\[0\] \(sst\): kind='tagging' is not one of classification, "),
    ({"colour": "red"}, r"sources\[0\] \(sst\): 'colour' is not a source setting"),
    ({"train": "/nonexistent/sst.tsv"}, r"sources\[0\] \(sst\): train: /nonexistent/sst.tsv: no such file"),
    ({"label_names": ["bad", "good", "meh"]}, r"\(sst\): label_names lists 3 words but the data has 2 labels"),
])
def test_a_source_it_cannot_read_is_refused_in_one_line_naming_it(tmp_path, change, message):
    write_sources(tmp_path)
    config = recipe(tmp_path)
    config["data"]["sources"][0].update(change)
    with pytest.raises((RecipeError, TrainingError), match=message):
        prepared_from(config)


def prepared_from(config: dict):
    loaded = recipe_from_dict(config)
    return task_for_recipe(loaded.task, loaded.data, seq_len=48)


def test_a_source_whose_rows_lack_a_target_is_refused(tmp_path):
    write_sources(tmp_path)
    document = json.loads((tmp_path / "squad.json").read_text())
    document["data"][0]["paragraphs"][0]["qas"][0]["answers"] = []
    (tmp_path / "squad.json").write_text(json.dumps(document), encoding="utf-8")
    with pytest.raises(TrainingError, match=r"data.sources \(qa\): .*squad.json: .*0-0-who.*answer"):
        prepared_from(recipe(tmp_path))
    config = recipe(tmp_path)
    del config["data"]["sources"]
    config["data"]["train"] = str(tmp_path / "sst.tsv")
    with pytest.raises(RecipeError, match="the text_to_text task reads data.sources"):
        recipe_from_dict(config)
    config = recipe(tmp_path)
    config["task"] = {"name": "translation"}
    with pytest.raises(RecipeError, match=r"\[data\] sources is not read by the translation task \(it is a setting of "
                                          r"text_to_text\)"):
        recipe_from_dict(config)
    with pytest.raises(DataError, match="two sources are named 'sst'"):
        parse_sources([source_tables(tmp_path)[0]] * 2)


def test_the_command_line_refuses_a_bad_source_with_exit_2_and_no_traceback(tmp_path, capsys):
    write_sources(tmp_path)
    config = recipe(tmp_path)
    config["data"]["sources"][1]["metric"] = "meteor"

    lines = []
    for section, values in config.items():
        lines.append(f"[{section}]")
        lines += [f"{key} = {toml_value(value)}" for key, value in values.items() if value is not None]
    (tmp_path / "recipe.toml").write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert main(["train", str(tmp_path / "recipe.toml"), "--out", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert "Traceback" not in error and len(error.strip().splitlines()) == 1
    assert "[data] sources[1] (de_en): metric='meteor' is not one of accuracy, bleu, squad" in error
    assert not (tmp_path / "out").exists()


def test_a_bleu_source_without_sacrebleu_is_refused_before_training(tmp_path, monkeypatch):
    import tformer.training.tasks.text_to_text as text_to_text

    write_sources(tmp_path)
    monkeypatch.setattr(text_to_text, "sacrebleu_installed", lambda: False)
    with pytest.raises(TrainingError, match=r"a bleu source needs sacrebleu: pip install 'tformer\[translation\]'"):
        prepared(tmp_path)
    prepared(tmp_path, {"eval_generate": False})  # the loss alone needs no scorer


def test_a_cut_evaluation_takes_each_sources_first_rows_in_proportion(tmp_path):
    write_sources(tmp_path, pairs=100)
    loaded = recipe_from_dict(recipe(tmp_path))
    task, _ = task_for_recipe(loaded.task, loaded.data, seq_len=48)
    import tformer

    task.prepare(TrainingConfig(batch_size=10, seq_len=48, eval_batches=1), ProcessContext(), tformer.build_model(
        loaded.model))
    rows = next(iter(task.eval_batches()))["row_index"]
    counts = torch.bincount(task.eval_source[rows], minlength=3).tolist()
    sizes = [len(pairs) for pairs in task.eval_pairs]  # 20, 20 and 16 held out
    assert sum(counts) == 10 and sizes == [20, 20, 16]
    assert all(abs(count - 10 * size / sum(sizes)) < 1 for count, size in zip(counts, sizes, strict=True))
