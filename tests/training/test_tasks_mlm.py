"""The example tasks' sampling (epochs, processes, evaluation split) and the masked-LM task: masks
per batch from (seed, position), fixed evaluation masks, next-sentence labels in the model's
convention, and a recipe run end to end."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import tformer
from tformer.nn.losses import IGNORE_INDEX
from tformer.tokenizers import WordPieceTokenizer
from tformer.training.config import TrainingConfig, TrainingError
from tformer.training.distributed import ProcessContext
from tformer.training.recipe import RecipeError, load_recipe, recipe_from_dict
from tformer.training.run import train_recipe
from tformer.training.tasks import TaskConfig
from tformer.training.tasks.examples import EVAL_WEIGHTS, ExampleTask, pad_rows
from tformer.training.tasks.mlm import MaskedLanguageModelling, split_documents, text_documents

WORDS = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran", "to", "park", "and", "slept", "in", "sun", "."]
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, "##s"]


def wordpiece() -> WordPieceTokenizer:
    return WordPieceTokenizer(VOCAB)


def documents(count: int = 12, lines: int = 6, seed: int = 0) -> list[list[str]]:
    generator = torch.Generator().manual_seed(seed)
    def sentence() -> str:
        picks = torch.randint(len(WORDS), (int(torch.randint(3, 9, (1,), generator=generator)),), generator=generator)
        return " ".join(WORDS[index] for index in picks.tolist())
    return [[sentence() for _ in range(lines)] for _ in range(count)]


def prepared(task, batch_size=4, seed=7, rank=0, world_size=1, head="masked_lm", seq_len=16, **training):
    config = TrainingConfig(batch_size=batch_size, seed=seed, seq_len=seq_len, max_steps=10, **training)
    model = tformer.build_model("bert-tiny", head=head, vocab_size=len(VOCAB), max_seq_len=seq_len)
    task.prepare(config, ProcessContext(rank=rank, world_size=world_size), model)
    return task, model


class Numbered(ExampleTask):
    """Rows whose input id is their index, to watch the sampling."""

    def __init__(self, count: int, eval_count: int = 0) -> None:
        super().__init__()
        self.train_rows = pad_rows({"input_ids": [[index] for index in range(count)]})
        self.eval_rows = pad_rows({"input_ids": [[index] for index in range(eval_count)]}) if eval_count else None


def test_each_epoch_visits_every_row_once_in_a_seeded_order():
    task, _ = prepared(Numbered(10), batch_size=5)
    seen = torch.cat([task.train_batch(position)["input_ids"].flatten() for position in range(4)]).tolist()
    assert sorted(seen[:10]) == list(range(10)) and sorted(seen[10:]) == list(range(10))
    assert seen[:10] != seen[10:]  # a new order each epoch
    again, _ = prepared(Numbered(10), batch_size=5)
    assert again.train_batch(3)["input_ids"].flatten().tolist() == seen[15:]  # a pure function of the position
    other_seed, _ = prepared(Numbered(10), batch_size=5, seed=8)
    assert other_seed.train_batch(0)["input_ids"].flatten().tolist() != seen[:5]


def test_batches_across_epochs_and_processes_match_one_process():
    one, _ = prepared(Numbered(7), batch_size=6)
    ranks = [prepared(Numbered(7), batch_size=3, rank=rank, world_size=2)[0] for rank in range(2)]
    for position in range(5):  # 6 rows per global batch over 7 rows: batches straddle epochs
        joined = torch.cat([task.train_batch(position)["input_ids"] for task in ranks]).flatten()
        assert joined.tolist() == one.train_batch(position)["input_ids"].flatten().tolist()


def test_evaluation_rows_split_over_processes_with_weightless_fillers():
    ranks = [prepared(Numbered(4, eval_count=7), batch_size=2, rank=rank, world_size=2)[0] for rank in range(2)]
    batches = [list(task.eval_batches()) for task in ranks]
    assert len(batches[0]) == len(batches[1]) == 2  # every process runs as many forward passes
    weighted = [int(row) for rank_batches in batches for batch in rank_batches
                for row, weight in zip(batch["input_ids"].flatten(), batch[EVAL_WEIGHTS], strict=True) if weight > 0]
    assert sorted(weighted) == list(range(7))
    assert sum(float(batch[EVAL_WEIGHTS].sum()) for rank_batches in batches for batch in rank_batches) == 7


def test_text_documents_and_the_held_out_lines():
    text = "a b\nc d\n\n\ne f\n  \ng h\ni j\n"
    assert text_documents(text) == [["a b", "c d"], ["e f"], ["g h", "i j"]]
    train, held_out = split_documents(text_documents(text), 0.4)
    assert train == [["a b", "c d"], ["e f"]] and held_out == [["g h", "i j"]]
    train, held_out = split_documents([["1", "2", "3", "4", "5"]], 0.4)
    assert train == [["1", "2", "3"]] and held_out == [["4", "5"]]  # a document cut where the split falls


def test_training_masks_follow_the_seed_and_position_and_skip_special_tokens():
    task, _ = prepared(MaskedLanguageModelling(documents(), documents(4, seed=1), wordpiece()))
    first, again = task.train_batch(5), task.train_batch(5)
    assert torch.equal(first["input_ids"], again["input_ids"]) and torch.equal(first["labels"], again["labels"])
    labels = torch.cat([task.train_batch(position)["labels"] for position in range(60)])
    chosen = labels != IGNORE_INDEX
    batches = torch.cat([task.train_rows.select(task.global_indices(p, len(task.train_rows)))["input_ids"]
                         for p in range(60)])
    eligible = ~torch.isin(batches, torch.tensor(sorted(wordpiece().special_token_ids) + [0]))
    assert not (chosen & ~eligible).any()  # [CLS], [SEP] and padding are never chosen
    assert abs(chosen.sum().item() / eligible.sum().item() - 0.15) < 0.02
    assert torch.equal(labels[chosen], batches[chosen])  # the labels are the original ids


def test_evaluation_masks_are_the_same_for_every_seed():
    tasks = [prepared(MaskedLanguageModelling(documents(), documents(4, seed=1), wordpiece()), seed=seed)[0]
             for seed in (1, 2)]
    assert torch.equal(tasks[0].eval_rows.fields["input_ids"], tasks[1].eval_rows.fields["input_ids"])
    assert not torch.equal(tasks[0].train_batch(0)["labels"], tasks[1].train_batch(0)["labels"])


def test_evaluation_sums_finalise_to_the_masked_token_loss_and_accuracy():
    task, model = prepared(MaskedLanguageModelling(documents(), documents(4, seed=1), wordpiece()), batch_size=3)
    model.eval()
    totals: dict = {}
    with torch.no_grad():
        for batch in task.eval_batches():
            for name, value in task.eval_sums(model, batch).items():
                totals[name] = totals.get(name, 0) + float(value)
    metrics = task.finalise(totals)
    rows = task.eval_rows.fields
    with torch.no_grad():
        logits = model(rows["input_ids"], attention_mask=rows["attention_mask"]).logits
    labelled = rows["labels"] != IGNORE_INDEX
    expected = torch.nn.functional.cross_entropy(logits[labelled], rows["labels"][labelled])
    assert metrics["eval_loss"] == pytest.approx(expected.item(), rel=1e-5)
    accuracy = (logits[labelled].argmax(-1) == rows["labels"][labelled]).float().mean().item()
    assert metrics["eval_accuracy"] == pytest.approx(accuracy)


def test_next_sentence_labels_use_the_models_convention():
    # Each document's tokens come from its own words, so B continues A exactly when they share words.
    docs = [[f"{WORDS[index]} {WORDS[index]}"] * 8 for index in range(12)]
    task, _ = prepared(MaskedLanguageModelling(docs, None, wordpiece()), head="pretraining", seq_len=12)
    rows = task.train_rows.fields
    for ids, types, label in zip(rows["input_ids"], rows["token_type_ids"], rows["next_sentence_label"], strict=True):
        first = set(ids[(types == 0) & (ids > 4)].tolist())
        second = set(ids[(types == 1) & (ids > 4)].tolist())
        assert (first == second) == (int(label) == 0)  # 0: B follows A, as BertForPreTraining reads it
    assert 0.3 < rows["next_sentence_label"].float().mean().item() < 0.7
    assert task.metrics[-1] == "eval_nsp_accuracy"


def test_the_mlm_task_refuses_what_it_cannot_train():
    with pytest.raises(TrainingError, match="head 'masked_lm' or 'pretraining'"):
        prepared(MaskedLanguageModelling(documents(), None, wordpiece()), head="sequence_classification")
    with pytest.raises(TrainingError, match="training.label_smoothing is not supported by the mlm task"):
        prepared(MaskedLanguageModelling(documents(), None, wordpiece()), label_smoothing=0.1)
    with pytest.raises(TrainingError, match="needs a tokenizer with cls, sep, mask"):
        MaskedLanguageModelling(documents(), None, tformer.tokenizers.CharTokenizer.train("abc"))
    with pytest.raises(TrainingError, match="whole_word_masking needs a WordPiece"):
        bpe = tformer.tokenizers.BPETokenizer.train(["the cat sat"] * 5, vocab_size=270)
        bpe.add_special_tokens({"cls": "<s>", "sep": "</s>", "mask": "<mask>", "pad": "<pad>"})
        MaskedLanguageModelling(documents(), None, bpe, whole_word_masking=True)


def write_corpus(folder: Path) -> Path:
    path = folder / "corpus.txt"
    path.write_text("\n\n".join("\n".join(document) for document in documents(30)) + "\n", encoding="utf-8")
    (folder / "vocab.txt").write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    return path


def mlm_recipe(folder: Path, **training) -> dict:
    return {"model": {"preset": "bert-tiny", "head": "masked_lm", "max_seq_len": 32},
            "data": {"train": "corpus.txt", "tokenizer": "vocab.txt", "eval_fraction": 0.1},
            "task": {"name": "mlm"},
            "training": {"max_steps": 3, "batch_size": 4, "seq_len": 32, "eval_every": 3, "threads": 1, **training}}


def test_a_recipe_pretrains_and_a_second_fine_tunes_from_its_folder(tmp_path):
    write_corpus(tmp_path)
    recipe = recipe_from_dict(mlm_recipe(tmp_path), base_dir=tmp_path)
    result = train_recipe(recipe, tmp_path / "pretrained", progress=False, echo=lambda text: None)
    assert result.steps == 3 and result.final_eval_loss is not None
    (tmp_path / "train.tsv").write_text("sentence\tlabel\n" + "".join(
        f"{' '.join(document[:1])}\t{'yes' if index % 2 else 'no'}\n" for index, document in
        enumerate(documents(20))), encoding="utf-8")
    raw = {"model": {"init_from": "pretrained", "head": "sequence_classification", "pooling": "mean", "dropout": 0.0},
           "data": {"train": "train.tsv", "eval_fraction": 0.25}, "task": {"name": "classification"},
           "training": {"max_steps": 2, "batch_size": 4, "seq_len": 32, "eval_every": 2, "threads": 1}}
    lines: list[str] = []
    fine_tune = recipe_from_dict(raw, base_dir=tmp_path)
    train_recipe(fine_tune, tmp_path / "classifier", progress=False, echo=lines.append)
    assert any(line.startswith("init_from") and "newly initialised: classifier.bias" in line and
               "not used: mlm_head" in line for line in lines)
    model = tformer.load(tmp_path / "classifier")
    assert model.config.label_names == ("no", "yes") and model.config.num_labels == 2
    assert (model.config.pooling, model.config.dropout) == ("mean", 0.0)
    backbone = tformer.load(tmp_path / "pretrained")
    assert (backbone.config.pooling, backbone.config.dropout) == ("cls", 0.1)
    assert not torch.equal(model.embedding.token.weight, backbone.embedding.token.weight)  # it trained
    written = (tmp_path / "classifier" / "recipe.toml").read_text()
    assert "init_from" in written and "d_model" not in written
    again = load_recipe(tmp_path / "classifier" / "recipe.toml")
    assert again.init_from == str((tmp_path / "pretrained").resolve())
    assert again.init_settings == {"head": "sequence_classification", "pooling": "mean", "dropout": 0.0,
                                   "label_names": ["no", "yes"], "num_labels": 2}


def test_init_from_takes_only_head_settings(tmp_path):
    write_corpus(tmp_path)
    train_recipe(recipe_from_dict(mlm_recipe(tmp_path), base_dir=tmp_path), tmp_path / "pretrained",
                 progress=False, echo=lambda text: None)
    raw = {"model": {"init_from": "pretrained", "d_model": 64}, "data": {"train": "corpus.txt"}}
    with pytest.raises(RecipeError, match=r"\[model\] d_model cannot be set with init_from"):
        recipe_from_dict(raw, base_dir=tmp_path)
    raw = {"model": {"init_from": "missing"}, "data": {"train": "corpus.txt"}}
    with pytest.raises(RecipeError, match="init_from: .*missing: not a checkpoint folder"):
        recipe_from_dict(raw, base_dir=tmp_path)


def test_task_settings_of_another_task_are_refused():
    with pytest.raises(TrainingError, match="task.doc_stride is a setting of the span_qa task, not 'mlm'"):
        TaskConfig(name="mlm", doc_stride=64)
    assert TaskConfig(name="mlm", mask_probability=0.2).mask_probability == 0.2
    with pytest.raises(TrainingError, match=r"task.mask_probability=1.5 must be in \(0, 1\)"):
        TaskConfig(name="mlm", mask_probability=1.5)
