"""The span_corruption task: packed rows that fill training.seq_len exactly, noise from (seed, position)
shared by processes, fixed evaluation noise, the loss of a Hugging Face T5 (v1.0 and v1.1) on its batches
equal to transformers' own, and `tformer train` pretraining a T5 folder with the loss falling."""

from __future__ import annotations

import json
import random

import pytest
import torch

import tformer
from tformer.cli import main
from tformer.tokenizers import WordPieceTokenizer
from tformer.training.config import TrainingConfig, TrainingError
from tformer.training.distributed import ProcessContext
from tformer.training.tasks import TASKS
from tformer.training.tasks.span_corruption import SpanCorruption

WORDS = "the a cat dog sat ran on in park mat sun slept big small red house tree".split()
VOCAB = ["[PAD]", "</s>", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]


def text(sentences: int = 400, seed: int = 0) -> str:
    rng = random.Random(seed)
    return "\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) + " ." for _ in range(sentences))


def small_task() -> tuple[SpanCorruption, object]:
    tokenizer = WordPieceTokenizer([*VOCAB, "."])
    tokenizer.add_special_tokens({"eos": "</s>"})
    from tformer.data.span_corruption import sentinel_ids

    sentinels = sentinel_ids(tokenizer, 20)
    ids = torch.tensor(tokenizer.encode(text(), add_special_tokens=False))
    cut = int(len(ids) * 0.9)
    return SpanCorruption(ids[:cut], ids[cut:], tokenizer, sentinels), tokenizer


def encoder_decoder(tokenizer) -> torch.nn.Module:
    return tformer.build_model("transformer-multi30k", vocab_size=tokenizer.vocab_size, d_model=32, num_layers=1,
                               num_heads=2, d_ff=64, pad_token_id=0, bos_token_id=None,
                               eos_token_id=tokenizer.eos_token_id, decoder_start_token_id=0, max_seq_len=64)


def prepared(task, model, batch_size=4, rank=0, world_size=1, seed=1):
    task.prepare(TrainingConfig(batch_size=batch_size, seq_len=48, seed=seed, eval_batches=2),
                 ProcessContext(rank=rank, world_size=world_size), model)
    return task


def test_the_task_is_named_span_corruption():
    assert TASKS["span_corruption"] is SpanCorruption


def test_rows_fill_the_inputs_and_follow_seed_and_position():
    task, tokenizer = small_task()
    task = prepared(task, encoder_decoder(tokenizer))
    assert (task.tokens_length, task.inputs_length, task.targets_length) == (52, 48, 12)  # 8 noise tokens in 3 spans
    batch = task.train_batch(3)
    assert batch["input_ids"].shape == (4, 48) and batch["labels"].shape == (4, 12)
    assert torch.all(batch["input_ids"][:, -1] == tokenizer.eos_token_id)
    assert torch.all(batch["labels"][:, 0] == tokenizer.token_to_id("<extra_id_0>"))
    assert torch.equal(batch["decoder_input_ids"][:, 1:], batch["labels"][:, :-1])
    assert torch.all(batch["decoder_input_ids"][:, 0] == 0)
    again = task.train_batch(3)
    assert all(torch.equal(batch[key], again[key]) for key in batch)
    assert not torch.equal(batch["input_ids"], task.train_batch(4)["input_ids"])


def test_two_processes_see_the_rows_of_one_with_twice_the_batch():
    task, tokenizer = small_task()
    model = encoder_decoder(tokenizer)
    whole = prepared(task, model, batch_size=4).train_batch(5)
    halves = [prepared(small_task()[0], model, batch_size=2, rank=rank, world_size=2).train_batch(5)
              for rank in range(2)]
    for key in whole:
        assert torch.equal(whole[key], torch.cat([half[key] for half in halves]))


def test_evaluation_noise_is_the_same_for_every_seed():
    task, tokenizer = small_task()
    model = encoder_decoder(tokenizer)
    first = list(prepared(task, model, seed=1).eval_batches())
    second = list(prepared(small_task()[0], model, seed=2).eval_batches())
    assert len(first) == 2
    assert all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(first, second, strict=True))
    with torch.no_grad():
        sums = task.eval_sums(model.eval(), first[0])
    metrics = task.finalise({key: float(value) for key, value in sums.items()})
    assert set(metrics) == set(task.metrics) and metrics["eval_loss"] > 0


def test_what_the_task_cannot_train_is_refused():
    task, tokenizer = small_task()
    decoder = tformer.build_model("gpt-nano", vocab_size=tokenizer.vocab_size)
    with pytest.raises(TrainingError, match="sequence-to-sequence model over tokens"):
        prepared(task, decoder)
    with pytest.raises(TrainingError, match="training.seq_len=300 makes rows of 300 inputs"):
        task.prepare(TrainingConfig(batch_size=2, seq_len=300), ProcessContext(), encoder_decoder(tokenizer))
    few, tokenizer = small_task()
    few.sentinels = few.sentinels[:2]
    with pytest.raises(TrainingError, match="makes rows of 3 noise spans but the tokenizer has 2"):
        few.prepare(TrainingConfig(batch_size=2, seq_len=48), ProcessContext(), encoder_decoder(tokenizer))


# ---- a Hugging Face T5 --------------------------------------------------------------------------------------

transformers_variants = {"t5": dict(feed_forward_proj="relu", tie_word_embeddings=True),
                         "t5-v1.1": dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False)}


def t5_folder(tmp_path, variant: str):
    """A tiny random T5ForConditionalGeneration written by transformers, with a T5 tokenizer (100 sentinels)."""
    transformers = pytest.importorskip("transformers")
    spm = pytest.importorskip("sentencepiece")
    from t5_folders import t5_tokenizer_folder

    folder = t5_tokenizer_folder(tmp_path, transformers, spm)
    vocab_size = len(transformers.AutoTokenizer.from_pretrained(folder))
    torch.manual_seed(0)
    config = transformers.T5Config(vocab_size=vocab_size, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                                   relative_attention_num_buckets=8, relative_attention_max_distance=20,
                                   dropout_rate=0.0, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
                                   **transformers_variants[variant])
    model = transformers.T5ForConditionalGeneration(config)
    model.save_pretrained(folder)
    return folder, model.eval()


def write_recipe(tmp_path, folder, steps: int):
    (tmp_path / "corpus.txt").write_text(text(600), encoding="utf-8")
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(
        f'[model]\ninit_from = "{folder}"\n[data]\ntrain = "corpus.txt"\neval_fraction = 0.1\n'
        '[task]\nname = "span_corruption"\n'
        f"[training]\nmax_steps = {steps}\nbatch_size = 8\nseq_len = 64\nlr = 0.01\nwarmup_steps = 0\n"
        f"eval_every = {steps}\neval_batches = 2\nthreads = 1\nlog_every = 1\n", encoding="utf-8")
    return recipe


@pytest.mark.slow  # imports transformers, trains a SentencePiece model
@pytest.mark.parametrize("variant", list(transformers_variants))
def test_a_hugging_face_t5_has_transformers_loss_on_the_tasks_batches(tmp_path, variant):
    folder, theirs = t5_folder(tmp_path, variant)
    ours = tformer.load(folder).eval()
    task, _ = SpanCorruption.from_recipe(_data(tmp_path, folder), seq_len=64, tokenizer=ours.tokenizer)
    task.prepare(TrainingConfig(batch_size=4, seq_len=64, seed=3), ProcessContext(), ours)
    batch = task.train_batch(0)
    assert batch["input_ids"].max() >= len(ours.tokenizer.get_vocab()) - 100  # sentinels among the inputs
    with torch.no_grad():
        expected = theirs(input_ids=batch["input_ids"], labels=batch["labels"]).loss
        got = task.loss(ours, batch)
    assert abs(got.item() - expected.item()) < 1e-5


def _data(tmp_path, folder):
    from tformer.data.sources import DataConfig

    (tmp_path / "corpus.txt").write_text(text(300), encoding="utf-8")
    return DataConfig(train=str(tmp_path / "corpus.txt"), eval_fraction=0.1)


@pytest.mark.slow  # trains through the CLI
def test_tformer_train_pretrains_a_t5_folder_with_the_loss_falling(tmp_path):
    folder, _ = t5_folder(tmp_path, "t5-v1.1")
    run = tmp_path / "run"
    assert main(["train", str(write_recipe(tmp_path, folder, 30)), "--out", str(run), "--no-progress"]) == 0
    losses = [record["train_loss"] for record in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
              if record.get("train_loss") is not None]
    assert len(losses) == 30
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    print(f"train loss {first:.3f} (steps 1-5) -> {last:.3f} (steps 26-30)")
    assert last < first - 0.5
    trained = tformer.load(run)
    assert trained.tokenizer.token_to_id("<extra_id_0>") == len(trained.tokenizer.get_vocab()) - 1
