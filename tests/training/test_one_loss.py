"""One loss: for every training task, ``model(**batch).loss`` is the loss the task trains on, and the
task's evaluation sums finalise to the same loss (both call the nn/losses function the model calls).

Each task is built tiny on made-up data with a real tformer model of its family; dropout is off, so
the model computes the same function in training and evaluation."""

from __future__ import annotations

import functools
import inspect
import json
import random

import pytest
import torch
from speech_corpus import tiny_model, write_corpus

import tformer
from tformer.data.chat import ChatData, ChatEncoder, ChatExample
from tformer.data.images import ImageData
from tformer.data.parallel import read_parallel
from tformer.data.sources import DataConfig
from tformer.data.span_corruption import sentinel_ids
from tformer.nn import losses
from tformer.nn.losses import (
    IGNORE_INDEX,
    next_token_loss,
    sequence_classification_loss,
    span_loss,
    token_cross_entropy,
)
from tformer.tokenizers import BPETokenizer, WordPieceTokenizer
from tformer.tokenizers.byte_level import BYTE_TO_CHAR
from tformer.tokenizers.chat_template import ChatTemplate
from tformer.training.config import TrainingConfig
from tformer.training.distributed import ProcessContext
from tformer.training.tasks import base as task_base
from tformer.training.tasks.classification import SequenceClassification
from tformer.training.tasks.examples import EVAL_WEIGHTS
from tformer.training.tasks.image_classification import ImageClassification
from tformer.training.tasks.lm import LanguageModelling
from tformer.training.tasks.mlm import MaskedLanguageModelling
from tformer.training.tasks.sft import SupervisedFineTuning
from tformer.training.tasks.span_corruption import SpanCorruption
from tformer.training.tasks.span_qa import SpanQuestionAnswering
from tformer.training.tasks.speech_recognition import SpeechRecognition
from tformer.training.tasks.token_classification import TokenClassification
from tformer.training.tasks.translation import Translation, learn_joint_bpe
from tformer.training.trainer import Trainer

TOLERANCE = 1e-6  # float32 losses of about 1-6 from the same function: a few units in the last place
SUMMED = 1e-6  # relative: evaluation adds per-token (per-row) float32 losses in float64, a mean reduces in float32
WORDS = "the cat sat on a mat dog ran to park and slept in sun river city king old new red blue".split()
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
LABELS = ("bad", "fine", "good")
TAGS = ("O", "B-LOC", "B-PER", "I-LOC")  # sorted after O, as the task orders the data's tags
VOCAB = [*SPECIALS, *WORDS, "?", "."]


def wordpiece() -> WordPieceTokenizer:
    return WordPieceTokenizer(VOCAB)


def encoder(head: str, **fields) -> tformer.Model:
    torch.manual_seed(0)
    return tformer.build_model("bert-tiny", head=head, vocab_size=len(VOCAB), max_seq_len=32,
                               dropout=0.0, attention_dropout=0.0, **fields)


def prepared(task, model, **training):
    settings = {"batch_size": 4, "seed": 3, "eval_batches": 0, **training}
    task.prepare(TrainingConfig(**settings), ProcessContext(0, 1), model)
    return task, model.train()


def sentences(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 9))) for _ in range(count)]


# ---- the eight tasks, tiny ----------------------------------------------------------------------


def lm_task(tmp_path):
    tokens = torch.randint(0, 16, (600,), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    model = tformer.build_model("gpt-nano", vocab_size=16, max_seq_len=16, dropout=0.0)
    return prepared(LanguageModelling(tokens, tokens[:300]), model, seq_len=16)


def mlm_task(tmp_path):
    documents = [sentences(6, seed) for seed in range(12)]
    task = MaskedLanguageModelling(documents, documents[:6], wordpiece())
    return prepared(task, encoder("pretraining"), seq_len=16)  # the masked tokens' and the next-sentence losses


def classification_task(tmp_path):
    lines = ["sentence\tlabel"] + [f"{text}\t{LABELS[row % 3]}" for row, text in enumerate(sentences(24, 2))]
    (tmp_path / "train.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    data = DataConfig(train=str(tmp_path / "train.tsv"), eval=str(tmp_path / "train.tsv"))
    task, _ = SequenceClassification.from_recipe(data, seq_len=16, tokenizer=wordpiece())
    return prepared(task, encoder("sequence_classification", num_labels=len(LABELS)), seq_len=16)


def token_classification_task(tmp_path):
    rng = random.Random(4)
    blocks = ["\n".join(f"{word}\t{rng.choice(TAGS) if word != 'the' else 'O'}" for word in text.split())
              for text in sentences(20, 4)]
    (tmp_path / "train.conll").write_text("\n\n".join(blocks) + "\n", encoding="utf-8")
    data = DataConfig(train=str(tmp_path / "train.conll"), eval=str(tmp_path / "train.conll"))
    task, _ = TokenClassification.from_recipe(data, seq_len=16, tokenizer=wordpiece())
    return prepared(task, encoder("token_classification", num_labels=len(TAGS), label_names=TAGS), seq_len=16)


def squad(questions: int, seed: int) -> dict:
    """SQuAD v1.1 of ``questions`` paragraphs, each asked one question whose answer is 1-3 of its words."""
    rng = random.Random(seed)
    paragraphs = []
    for number in range(questions):
        words = [rng.choice(WORDS) for _ in range(rng.randint(10, 40))]  # some longer than one window
        first = rng.randrange(len(words))
        last = min(len(words) - 1, first + rng.randint(0, 2))
        start = sum(len(word) + 1 for word in words[:first])
        answer = {"text": " ".join(words[first : last + 1]), "answer_start": start}
        question = " ".join(rng.choice(WORDS) for _ in range(3)) + " ?"
        paragraphs.append({"context": " ".join(words) + " .",
                           "qas": [{"id": f"q{number}", "question": question, "answers": [answer]}]})
    return {"version": "1.1", "data": [{"title": "made up", "paragraphs": paragraphs}]}


def span_qa_task(tmp_path):
    (tmp_path / "squad.json").write_text(json.dumps(squad(18, 5)), encoding="utf-8")
    (tmp_path / "vocab.txt").write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    squad_file = str(tmp_path / "squad.json")
    data = DataConfig(train=squad_file, eval=squad_file, tokenizer=str(tmp_path / "vocab.txt"))
    task, _ = SpanQuestionAnswering.from_recipe(data, seq_len=24, doc_stride=6)
    return prepared(task, encoder("question_answering"), seq_len=24)


def translation_task(tmp_path):
    lexicon = {"ein": "a", "hund": "dog", "mann": "man", "rot": "red", "katze": "cat", "haus": "house"}
    rng = random.Random(6)
    chosen = [[rng.choice(list(lexicon)) for _ in range(rng.randint(1, 7))] for _ in range(40)]
    (tmp_path / "train.de").write_text("\n".join(" ".join(words) + " ." for words in chosen) + "\n", encoding="utf-8")
    (tmp_path / "train.en").write_text("\n".join(" ".join(lexicon[word] for word in words) + " ." for words in chosen)
                                       + "\n", encoding="utf-8")
    pairs = read_parallel(tmp_path / "train", "de", "en")
    tokenizer = learn_joint_bpe(pairs, 300)
    torch.manual_seed(0)
    model = tformer.build_model("transformer-multi30k", vocab_size=tokenizer.vocab_size, d_model=32, num_layers=1,
                                num_heads=2, d_ff=64, max_seq_len=64, dropout=0.0)
    model.tokenizer = tokenizer
    task = Translation(pairs, pairs, tokenizer, seq_len=32, batch_tokens=0, eval_bleu=False)
    return prepared(task, model, seq_len=32)


def span_corruption_task(tmp_path):
    tokenizer = WordPieceTokenizer([*SPECIALS, *WORDS])
    tokenizer.add_special_tokens({"eos": "</s>"})
    sentinels = sentinel_ids(tokenizer, 10)
    ids = torch.tensor(tokenizer.encode(" ".join(sentences(80, 8)), add_special_tokens=False))
    torch.manual_seed(0)
    model = tformer.build_model("transformer-multi30k", vocab_size=tokenizer.vocab_size, d_model=32, num_layers=1,
                                num_heads=2, d_ff=64, max_seq_len=64, dropout=0.0, pad_token_id=0,
                                eos_token_id=tokenizer.eos_token_id, decoder_start_token_id=0)
    return prepared(SpanCorruption(ids, ids[:200], tokenizer, sentinels), model, seq_len=32)


def image_classification_task(tmp_path):
    generator = torch.Generator().manual_seed(7)
    images = torch.randint(0, 256, (24, 1, 8, 8), dtype=torch.uint8, generator=generator)
    data = ImageData(images, torch.randint(0, 3, (24,), generator=generator), ("circle", "square", "stripe"), "made up")
    torch.manual_seed(0)
    model = tformer.build_model("vit-mnist", image_size=8, patch_size=4, num_labels=3, d_model=32, num_layers=1,
                                num_heads=2, d_ff=64, dropout=0.0, attention_dropout=0.0)
    return prepared(ImageClassification(data, data), model)


def speech_recognition_task(tmp_path):
    manifest = write_corpus(tmp_path, count=6)
    task, loaded = SpeechRecognition.from_recipe(DataConfig(train=str(manifest), eval=str(manifest)), seq_len=16,
                                                 eval_wer=False)
    return prepared(task, tiny_model(loaded.vocab_size), seq_len=16)


def speech_recognition_ctc_task(tmp_path):
    """A speech model with a CTC head: its loss mixes the decoder's with the head's."""
    manifest = write_corpus(tmp_path, count=6)
    task, loaded = SpeechRecognition.from_recipe(DataConfig(train=str(manifest), eval=str(manifest)), seq_len=16,
                                                 eval_wer=False)
    return prepared(task, tiny_model(loaded.vocab_size, ctc_weight=0.3), seq_len=16)


TASKS = {"lm": lm_task, "mlm": mlm_task, "classification": classification_task,
         "token_classification": token_classification_task, "span_qa": span_qa_task, "translation": translation_task,
         "image_classification": image_classification_task, "speech_recognition": speech_recognition_task,
         "speech_recognition_ctc": speech_recognition_ctc_task, "span_corruption": span_corruption_task}


def model_loss(model, batch) -> torch.Tensor:
    """``model(**inputs).loss`` with the batch's fields the model reads (a batch also holds evaluation weights
    and the rows' bookkeeping)."""
    reads = inspect.signature(type(model).forward).parameters
    return model(**{name: value for name, value in batch.items() if name in reads}).loss


def evaluated_loss(task, sums: dict) -> float:
    """The mean loss one batch's evaluation sums give, as the task's ``finalise`` divides them."""
    if isinstance(task, MaskedLanguageModelling):
        return float(sums["mlm_loss"] / sums["masked"] + sums["nsp_loss"] / sums["rows"])
    if "ctc" in sums:  # the decoder's loss per token, the CTC head's per row: the task mixes them as the model does
        return task.finalise({name: float(value) for name, value in sums.items()})["eval_loss"]
    count = {"lm": "batches", "token_classification": "labelled", "span_qa": "windows", "translation": "tokens",
             "speech_recognition": "tokens", "span_corruption": "tokens"}
    return float(sums["loss"] / sums[count.get(task.name, "rows")])


@pytest.mark.parametrize("name", TASKS)
def test_the_models_loss_is_the_loss_the_task_trains_and_evaluates_on(tmp_path, name):
    task, model = TASKS[name](tmp_path)
    batch = task.train_batch(0)
    with torch.no_grad():
        trained = task.loss(model, batch)
        direct = model_loss(model, batch)
    print(f"{name}: model(**batch).loss {direct.item():.7f}, task.loss {trained.item():.7f}")
    assert torch.isfinite(direct) and abs(direct.item() - trained.item()) <= TOLERANCE

    model.eval()
    evaluation = next(iter(task.eval_batches()))
    assert EVAL_WEIGHTS not in evaluation or bool((evaluation[EVAL_WEIGHTS] == 1).all())  # no filler rows
    with torch.no_grad():
        sums = task.eval_sums(model, evaluation)
        direct = model_loss(model, evaluation)
    print(f"{name}: model(**batch).loss {direct.item():.7f}, evaluation sums {evaluated_loss(task, sums):.7f}")
    assert abs(direct.item() - evaluated_loss(task, sums)) <= SUMMED * direct.item()


def test_a_padded_question_answering_window_has_the_loss_it_has_alone(tmp_path):
    """The model's span loss leaves the padding out: a window's loss does not depend on its batch."""
    task, model = span_qa_task(tmp_path)
    batch = task.train_batch(0)
    lengths = batch["attention_mask"].sum(dim=1)
    row = int(lengths.argmin())
    assert lengths[row] < batch["attention_mask"].shape[1]  # the row is padded in its batch
    alone = {name: values[row : row + 1, : int(lengths[row])] if values.dim() == 2 else values[row : row + 1]
             for name, values in batch.items()}
    with torch.no_grad():
        one = model_loss(model, alone)
        padded = model_loss(model, {name: values[row : row + 1] for name, values in batch.items()})
    assert abs(one.item() - padded.item()) <= TOLERANCE


def test_each_reduction_is_the_mean_summed_or_per_example():
    """``"sum"`` adds the ``"none"`` losses and their mean is ``"mean"``: an evaluation's sum / count is the
    training loss. Ignored targets (-100) count 0 and are left out of the mean."""
    generator = torch.Generator().manual_seed(8)
    logits = torch.randn(3, 5, 7, generator=generator)  # (B, T, V)
    targets = torch.randint(0, 7, (3, 5), generator=generator)
    targets[0, 1] = targets[2, 4] = IGNORE_INDEX
    each = token_cross_entropy(logits, targets, reduction="none")  # (B, T)
    assert each.shape == (3, 5) and each[0, 1] == 0 and each[2, 4] == 0
    torch.testing.assert_close(token_cross_entropy(logits, targets, reduction="sum"), each.sum())
    torch.testing.assert_close(token_cross_entropy(logits, targets), each.sum() / 13)
    rows = logits[:, 0]  # (B, V)
    cases = {"regression": torch.randn(3, 7, generator=generator), "multi_label_classification": torch.rand(3, 7),
             "single_label_classification": targets[:, 0].clamp(min=0)}
    for problem_type, labels in cases.items():
        per_example = sequence_classification_loss(rows, labels, problem_type, reduction="none")
        assert per_example.shape == (3,), problem_type
        torch.testing.assert_close(sequence_classification_loss(rows, labels, problem_type), per_example.mean())
        torch.testing.assert_close(sequence_classification_loss(rows, labels, problem_type, reduction="sum"),
                                   per_example.sum())
    start, end = logits[..., 0], logits[..., 1]  # (B, T)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 0, 0, 0]])
    positions = torch.tensor([4, 2, 1]), torch.tensor([3, 1, 0])
    windows = span_loss(start, end, *positions, mask, reduction="none")  # (B,)
    torch.testing.assert_close(span_loss(start, end, *positions, mask), windows.mean())
    torch.testing.assert_close(span_loss(start, end, *positions, mask, reduction="sum"), windows.sum())
    with pytest.raises(ValueError, match="reduction='total' is not one of mean, sum, none"):
        token_cross_entropy(logits, targets, reduction="total")


def test_language_model_labels_are_aligned_with_the_inputs_or_hold_the_next_token_too():
    logits = torch.randn(2, 4, 9, generator=torch.Generator().manual_seed(9))  # (B, T, V)
    crop = torch.randint(0, 9, (2, 5), generator=torch.Generator().manual_seed(10))  # (B, T + 1)
    torch.testing.assert_close(next_token_loss(logits, crop), token_cross_entropy(logits, crop[:, 1:]))
    aligned = crop[:, :4]  # HF's labels: the last position predicts nothing
    torch.testing.assert_close(next_token_loss(logits, aligned), token_cross_entropy(logits[:, :3], crop[:, 1:4]))
    with pytest.raises(ValueError, match="labels hold 6 positions for 4 inputs"):
        next_token_loss(logits, torch.zeros(2, 6, dtype=torch.long))


def sft_task(tmp_path, evaluated: bool = False):
    """The sft task over ChatML conversations of byte tokens, packed into rows of 64 (``evaluated``: the same
    conversations its evaluation data too)."""
    tokenizer = BPETokenizer({char: byte for byte, char in enumerate(BYTE_TO_CHAR)}, [])
    tokenizer.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    template = ChatTemplate("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}")
    examples = [ChatExample(f"chat.jsonl:{line}", messages=({"role": "user", "content": " ".join(sentences(1, line))},
                                                            {"role": "assistant", "content": WORDS[line]}))
                for line in range(12)]
    data = ChatData("chat.jsonl", examples)
    task = SupervisedFineTuning(data, data if evaluated else None, ChatEncoder(tokenizer, template), seq_len=64)
    torch.manual_seed(0)
    model = tformer.build_model("gpt-nano", vocab_size=tokenizer.vocab_size, max_seq_len=64, dropout=0.0)
    return prepared(task, model, seq_len=64)


@pytest.mark.parametrize("build", [lm_task, functools.partial(sft_task, evaluated=True)], ids=["lm", "sft"])
def test_decoder_tasks_evaluate_in_pieces_of_rows_whose_logits_fit_the_budget(tmp_path, monkeypatch, build):
    """An evaluation batch whose logits (B, T, V) pass ``EVAL_LOGITS_BUDGET`` runs a few rows at a time (a GSM8K
    LoRA run's peak memory doubled at its first evaluation, holding a whole batch's logits); the metrics are the
    whole batch's."""
    task, model = build(tmp_path)
    trainer = Trainer(model, task.config, task, progress=False)
    whole = trainer.evaluate_metrics()
    row_positions = task.seq_len * model.config.vocab_size
    monkeypatch.setattr(task_base, "EVAL_LOGITS_BUDGET", row_positions)  # one row a pass
    rows = []
    model.lm_head.register_forward_hook(lambda module, args, out: rows.append(args[0].shape[0]))
    pieces = trainer.evaluate_metrics()
    assert max(rows) == 1 < task.config.batch_size
    assert pieces.keys() == whole.keys()
    for name, value in whole.items():
        assert pieces[name] == pytest.approx(value, rel=SUMMED), name


@pytest.mark.parametrize("build", [lm_task, sft_task], ids=["lm", "sft"])
def test_decoder_tasks_train_without_holding_the_logits_whole(tmp_path, monkeypatch, build):
    """The lm and sft tasks train on the decoder's loss without logits (``return_logits=False``): its head sees a
    piece of the batch's positions at a time, and the loss is the one from the whole logits."""
    task, model = build(tmp_path)
    batch = task.train_batch(0)
    positions = batch["input_ids"].numel()
    monkeypatch.setattr(losses, "HEAD_LOSS_MIN_ROWS", 1)
    monkeypatch.setattr(losses, "HEAD_LOSS_CHUNK_FLOATS", 8 * model.config.vocab_size)
    model.lm_head.requires_grad_(False)  # as under adapters: a frozen head runs in pieces
    most_rows = []
    model.lm_head.register_forward_hook(lambda module, args, out: most_rows.append(args[0].reshape(
        -1, args[0].shape[-1]).shape[0]))
    model.train()
    trained = task.loss(model, batch)
    trained.backward()
    assert max(most_rows) == 8 < positions
    with torch.no_grad():
        assert abs(trained.item() - model_loss(model, batch).item()) <= TOLERANCE
