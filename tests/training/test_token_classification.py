"""The token-classification (NER) task: labels on each word's first piece, entity scores equal to
seqeval's on the full sentences (truncated ones included) for one process or two, one-line errors
for bad CoNLL data, a recipe run end to end, and predict_entities' character spans."""

import json
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from seqeval.metrics import accuracy_score, f1_score, precision_score, recall_score
from shared_data import BERT_DIR, SHARED_DATA, require
from torch import nn

import tformer
from tformer.cli import main
from tformer.data.sources import DataConfig
from tformer.errors import TformerError
from tformer.nn.losses import IGNORE_INDEX
from tformer.tokenizers import load as load_tokenizer
from tformer.training.config import TrainingConfig, TrainingError
from tformer.training.distributed import ProcessContext
from tformer.training.recipe import load_recipe
from tformer.training.tasks import TASKS
from tformer.training.tasks.token_classification import TokenClassification, predict_entities

pytestmark = pytest.mark.slow  # compares with seqeval

VOCAB = BERT_DIR / "vocab.txt"
WNUT_TRAIN, WNUT_TEST = SHARED_DATA / "wnut17" / "wnut17train.conll", SHARED_DATA / "wnut17" / "emerging.test.annotated"
RECIPES = Path(__file__).resolve().parents[2] / "configs"
TAGS = ("O", "B-LOC", "B-PER", "I-LOC", "I-PER")
# Words of one piece and of several (unbelievably -> un ##bel ##ie ##va ##bly).
WORDS = ["john", "smith", "paris", "the", "ate", "unbelievably", "tokenization", "london", "xylophones", "of",
         "a", "berlin", "microprocessor", "walked", "to"]


@pytest.fixture(scope="module")
def tokenizer():
    require(VOCAB)
    return load_tokenizer(str(VOCAB))


def write_conll(path, sentences):
    path.write_text("\n\n".join("\n".join(f"{word}\t{tag}" for word, tag in sentence) for sentence in sentences)
                    + "\n", encoding="utf-8")
    return str(path)


def random_sentences(seed, count, longest=20):
    rng = random.Random(seed)
    return [[(rng.choice(WORDS), rng.choice(TAGS)) for _ in range(rng.randint(1, longest))] for _ in range(count)]


class TableTagger(nn.Module):
    """A token-classification model whose logits at a token are a fixed row of ``table`` (V, L)."""

    def __init__(self, table, max_seq_len=512, label_names=TAGS):
        super().__init__()
        self.table = nn.Parameter(table)
        self.config = SimpleNamespace(head="token_classification", num_labels=table.shape[1],
                                      vocab_size=table.shape[0], label_names=label_names)
        self.position_limit = max_seq_len

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        return SimpleNamespace(logits=self.table[input_ids])  # (B, T, L)


def run_config(**overrides):
    return TrainingConfig(**{"batch_size": 4, "eval_batches": 0, "threads": 1, **overrides})


def eval_totals(task, model, context):
    task.prepare(run_config(seq_len=task.seq_len), context, model)
    totals = {}
    with torch.no_grad():
        for batch in task.eval_batches():
            for name, value in task.eval_sums(model, batch).items():
                totals[name] = totals.get(name, 0) + float(value)
    return totals


def make_task(tmp_path, tokenizer, train, evaluation, seq_len):
    data = DataConfig(train=write_conll(tmp_path / "train.conll", train),
                      eval=write_conll(tmp_path / "eval.conll", evaluation))
    return TokenClassification.from_recipe(data, seq_len=seq_len, tokenizer=tokenizer)


def test_tags_land_on_each_words_first_piece_only(tmp_path, tokenizer):
    sentence = [("john", "B-PER"), ("unbelievably", "O"), ("tokenization", "B-LOC"), ("paris", "I-LOC")]
    task, data = make_task(tmp_path, tokenizer, [sentence], [sentence], seq_len=None)
    assert data.label_names == ("O", "B-LOC", "B-PER", "I-LOC") and TASKS["token_classification"] is TokenClassification
    task.prepare(run_config(), ProcessContext(), TableTagger(torch.zeros(tokenizer.vocab_size, 4),
                                                              label_names=data.label_names))
    batch = task.train_batch(0)
    expected_ids, expected_labels = [tokenizer.cls_token_id], [IGNORE_INDEX]
    for word, tag in sentence:
        pieces = tokenizer.encode(word, add_special_tokens=False)
        expected_ids += pieces
        expected_labels += [data.label_names.index(tag)] + [IGNORE_INDEX] * (len(pieces) - 1)
    expected_ids.append(tokenizer.sep_token_id)
    expected_labels.append(IGNORE_INDEX)
    assert len(expected_ids) > len(sentence) + 4  # several words of several pieces
    assert batch["input_ids"][0].tolist() == expected_ids
    assert batch["labels"][0].tolist() == expected_labels
    assert batch["attention_mask"][0].tolist() == [1] * len(expected_ids)


def expected_predictions(tokenizer, table, sentences, seq_len):
    """Word-level predictions worked out apart from the task: each word's first piece (the word
    encoded alone) read in the table, words whose first piece falls past seq_len predicted O; and
    the loss over the kept words' first pieces."""
    predicted, losses = [], []
    for sentence in sentences:
        tags, used = [], 0
        for word, tag in sentence:
            pieces = tokenizer.encode(word, add_special_tokens=False)
            if used < seq_len - 2:
                row = table[pieces[0]]
                tags.append(TAGS[int(row.argmax())])
                losses.append(F.cross_entropy(row[None], torch.tensor([TAGS.index(tag)])).item())
            else:
                tags.append("O")
            used += len(pieces)
        predicted.append(tags)
    return predicted, sum(losses) / len(losses)


@pytest.mark.parametrize("seq_len", [12, 128])
def test_evaluation_equals_seqeval_on_the_full_sentences(tmp_path, tokenizer, seq_len):
    train, evaluation = random_sentences(0, 5), random_sentences(1, 23)
    task, data = make_task(tmp_path, tokenizer, train + [[("paris", tag) for tag in TAGS]], evaluation, seq_len)
    assert data.label_names == TAGS
    truncated = task.eval_encoded.truncated
    assert (truncated == 0) if seq_len == 128 else (truncated > 5)
    assert f"{truncated} truncated to {seq_len} tokens" in data.description and "\n" not in data.description
    table = torch.randn(tokenizer.vocab_size, len(TAGS), generator=torch.Generator().manual_seed(2))
    totals = eval_totals(task, TableTagger(table), ProcessContext())
    metrics = task.finalise(totals)

    gold = [[tag for _, tag in sentence] for sentence in evaluation]
    predicted, loss = expected_predictions(tokenizer, table, evaluation, seq_len)
    assert sum(map(len, gold)) == totals["words"]
    assert metrics["eval_precision"] == pytest.approx(precision_score(gold, predicted), abs=1e-12)
    assert metrics["eval_recall"] == pytest.approx(recall_score(gold, predicted), abs=1e-12)
    assert metrics["eval_f1"] == pytest.approx(f1_score(gold, predicted), abs=1e-12)
    assert metrics["eval_accuracy"] == pytest.approx(accuracy_score(gold, predicted), abs=1e-12)
    assert metrics["eval_loss"] == pytest.approx(loss, rel=1e-5)
    assert 0 < metrics["eval_f1"] < 1  # neither trivially empty nor perfect


def test_two_processes_total_what_one_does_and_fillers_count_nothing(tmp_path, tokenizer):
    task, _ = make_task(tmp_path, tokenizer, random_sentences(3, 5), random_sentences(4, 11), seq_len=16)
    table = torch.randn(tokenizer.vocab_size, len(TAGS), generator=torch.Generator().manual_seed(5))
    whole = eval_totals(task, TableTagger(table), ProcessContext())
    shards = [eval_totals(task, TableTagger(table), ProcessContext(rank=rank, world_size=2)) for rank in (0, 1)]
    assert set(shards[0]) == set(shards[1]) == set(whole)  # the same keys everywhere: one all-reduce adds them
    assert {"tp/PER", "predicted/LOC", "actual/PER"} <= set(whole)
    for name, value in whole.items():  # counts exactly; the loss up to float32 sums in another order
        assert shards[0][name] + shards[1][name] == (pytest.approx(value, rel=1e-6) if name == "loss" else value), name
    assert task.finalise({name: shards[0][name] + shards[1][name] for name in whole}) == pytest.approx(
        task.finalise(whole), rel=1e-6)


def test_bad_conll_data_is_a_one_line_error(tmp_path, tokenizer):
    good = write_conll(tmp_path / "good.conll", [[("john", "B-PER"), ("ate", "O")]])
    bad = tmp_path / "bad.conll"
    bad.write_text("john\tB-PER\nate\n\nparis\tB-LOC\n", encoding="utf-8")
    with pytest.raises(TrainingError, match=r"bad\.conll:2: expected a token and its tag") as caught:
        TokenClassification.from_recipe(DataConfig(train=str(bad)), seq_len=None, tokenizer=tokenizer)
    assert "\n" not in str(caught.value)
    _, data = TokenClassification.from_recipe(DataConfig(train=str(bad), skip_bad=True, eval_fraction=0.0),
                                              seq_len=None, tokenizer=tokenizer)
    assert "1 bad records skipped" in data.description and data.label_names == ("B-LOC",)  # "john B-PER" left out
    with pytest.raises(TrainingError, match=r"good\.conll:1: tag 'B-PER' is not one of the declared tags: O, B-LOC"):
        TokenClassification.from_recipe(DataConfig(train=good), seq_len=None, tokenizer=tokenizer,
                                        label_names=("O", "B-LOC"))
    unseen = write_conll(tmp_path / "unseen.conll", [[("the", "O"), ("paris", "B-LOC")]])
    with pytest.raises(TrainingError, match=r"unseen\.conll:2: tag 'B-LOC' is not one of the tags of the training file "
                                            r".*good\.conll: O, B-PER"):
        TokenClassification.from_recipe(DataConfig(train=good, eval=unseen), seq_len=None, tokenizer=tokenizer)
    pos = write_conll(tmp_path / "pos.conll", [[("john", "NNP"), ("ate", "VBD")]])
    with pytest.raises(TrainingError, match=r"pos\.conll: the tags must be O or BIO/IOBES entity tags: tag 'NNP'"):
        TokenClassification.from_recipe(DataConfig(train=pos, eval_fraction=0.0), seq_len=None, tokenizer=tokenizer)
    nothing_held = r"data\.eval_fraction=0\.1 of the 1 sentences of .*good\.conll holds out 0"  # not silently none
    with pytest.raises(TrainingError, match=nothing_held):
        TokenClassification.from_recipe(DataConfig(train=good), seq_len=None, tokenizer=tokenizer)


def test_prepare_refuses_a_model_that_does_not_fit_the_data(tmp_path, tokenizer):
    task, _ = make_task(tmp_path, tokenizer, random_sentences(6, 4), random_sentences(7, 2), seq_len=None)
    with pytest.raises(TrainingError, match=r"num_labels=3 but the data has 5 tags \(O, B-LOC"):
        task.prepare(run_config(), ProcessContext(), TableTagger(torch.zeros(tokenizer.vocab_size, 3)))
    classifier = TableTagger(torch.zeros(tokenizer.vocab_size, 5))
    classifier.config.head = "sequence_classification"
    with pytest.raises(TrainingError, match="head='token_classification', not head='sequence_classification'"):
        task.prepare(run_config(), ProcessContext(), classifier)
    reordered = TableTagger(torch.zeros(tokenizer.vocab_size, 5), label_names=("O", "B-PER", "B-LOC", "I-LOC", "I-PER"))
    with pytest.raises(TrainingError, match=r"label_names \(O, B-PER, B-LOC, I-LOC, I-PER\) are not the data's tags"):
        task.prepare(run_config(), ProcessContext(), reordered)
    with pytest.raises(TrainingError, match="set training.seq_len"):  # no silent cut without seq_len
        task.prepare(run_config(), ProcessContext(), TableTagger(torch.zeros(tokenizer.vocab_size, 5), max_seq_len=8))
    task.seq_len = 64
    with pytest.raises(TrainingError, match="training.seq_len=64 exceeds the model's max_seq_len=32"):
        task.prepare(run_config(), ProcessContext(), TableTagger(torch.zeros(tokenizer.vocab_size, 5), max_seq_len=32))


def test_a_recipe_trains_and_the_run_keeps_its_tag_names(tmp_path, tokenizer):
    train = write_conll(tmp_path / "train.conll", random_sentences(8, 24))
    evaluation = write_conll(tmp_path / "eval.conll", random_sentences(9, 6))
    recipe = tmp_path / "ner.toml"
    recipe.write_text(f"""
[model]
preset = "bert-tiny"
head = "token_classification"
max_seq_len = 64

[data]
train = "{train}"
eval = "{evaluation}"
tokenizer = "{VOCAB}"

[task]
name = "token_classification"

[training]
max_steps = 3
batch_size = 4
seq_len = 32
warmup_steps = 1
eval_every = 3
eval_batches = 0
early_stopping_metric = "eval_f1"
threads = 1
device = "cpu"
""", encoding="utf-8")
    run = tmp_path / "run"
    assert main(["train", str(recipe), "--out", str(run), "--no-progress"]) == 0
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evaluated = [record for record in logged if "eval_f1" in record]
    assert evaluated and {"eval_loss", "eval_precision", "eval_recall", "eval_accuracy"} <= set(evaluated[-1])
    model = tformer.load(run)
    assert model.config.head == "token_classification" and tuple(model.config.label_names) == TAGS
    assert model.config.num_labels == len(TAGS) and model.tokenizer is not None
    entities = predict_entities(model, model.tokenizer, "john smith walked to paris")
    assert all(kind in ("LOC", "PER") for kind, *_ in entities)


def test_predict_entities_gives_character_spans_of_the_original_text(tokenizer):
    table = torch.zeros(tokenizer.vocab_size, len(TAGS))
    first_piece = {word: tokenizer.encode(word, add_special_tokens=False)[0] for word in
                   ("john", "smith", "paris", "berlin", "Zürich")}
    for word, tag, logit in [("john", "B-PER", 2.0), ("smith", "I-PER", 3.0), ("paris", "B-LOC", 1.0),
                             ("berlin", "I-LOC", 4.0), ("Zürich", "B-LOC", 5.0)]:
        table[first_piece[word], TAGS.index(tag)] = logit
    probability = table.softmax(dim=-1).max(dim=-1).values  # the top tag's probability per token
    score = {word: float(probability[piece]) for word, piece in first_piece.items()}
    # BERT's words: punctuation is a word of its own ("Paris" "."), accents are stripped ("zurich").
    text = "  John  Smith visited\tParis. Unbelievably berlin,Zürich"
    expected = [("PER", 2, 13, "John  Smith", (score["john"] + score["smith"]) / 2),
                ("LOC", 22, 27, "Paris", score["paris"]), ("LOC", 42, 48, "berlin", score["berlin"]),
                ("LOC", 49, 55, "Zürich", score["Zürich"])]
    for limit in (512, 6):  # 6: windows of 4 pieces (+ [CLS], [SEP]), too few for "unbelievably"'s 5
        model = TableTagger(table, max_seq_len=limit)
        if limit == 6:
            with pytest.raises(TformerError, match="'Unbelievably' is 5 tokens"):
                predict_entities(model, tokenizer, text)
            text = text.replace("Unbelievably", "Walked")  # 6 characters fewer before "berlin"
            expected[2:] = [(kind, start - 6, end - 6, span, value) for kind, start, end, span, value in expected[2:]]
        found = predict_entities(model, tokenizer, text)
        assert [entity[:4] for entity in found] == [entity[:4] for entity in expected]
        assert [entity[4] for entity in found] == pytest.approx([entity[4] for entity in expected], rel=1e-6)
    assert predict_entities(model, tokenizer, " \n ") == []


def test_the_wnut17_recipe_is_valid_and_names_the_shared_data(tmp_path):
    require(WNUT_TRAIN, WNUT_TEST)
    tformer.build_model("bert-tiny", head="masked_lm", vocab_size=64).save(tmp_path / "mlm")
    recipe = load_recipe(RECIPES / "wnut17.toml", [f"model.init_from={tmp_path / 'mlm'}"])
    assert recipe.task.name == "token_classification"
    assert recipe.init_settings == {"head": "token_classification", "dropout": 0.1, "attention_dropout": 0.1}
    assert Path(recipe.data.train).samefile(WNUT_TRAIN) and Path(recipe.data.eval).samefile(WNUT_TEST)
    assert recipe.training.eval_batches == 0 and recipe.training.seq_len == 128
