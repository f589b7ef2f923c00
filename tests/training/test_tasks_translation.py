"""The translation task: parallel files read aligned (mismatches named, empty pairs counted), a joint BPE
learned from both sides, batches within a token budget that cover every pair once an epoch and are a pure
function of (seed, position), a run that resumes bitwise, BLEU during training equal to sacreBLEU on the
translations `tformer translate` writes, and the command line (translate, evaluate --source, average)."""

import json
import random
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import tformer
from tformer.cli import main
from tformer.data.files import DataFileError
from tformer.data.parallel import read_parallel
from tformer.generation.translation import translate
from tformer.nn.losses import token_cross_entropy
from tformer.training.config import TrainingConfig, TrainingError
from tformer.training.distributed import ProcessContext
from tformer.training.recipe import RecipeError, recipe_from_dict
from tformer.training.run import train_recipe
from tformer.training.tasks.translation import Translation, learn_joint_bpe

sacrebleu = pytest.importorskip("sacrebleu")

pytestmark = pytest.mark.slow  # imports sacrebleu

LEXICON = {"ein": "a", "hund": "dog", "mann": "man", "läuft": "runs", "sitzt": "sits", "rot": "red",
           "groß": "big", "katze": "cat", "auf": "on", "dem": "the", "gras": "grass", "haus": "house"}


def write_corpus(folder: Path, name: str, pairs: int, seed: int = 0) -> None:
    """Toy German -> English: each word translated, the order kept, a capital and a full stop."""
    rng = random.Random(seed)
    words = list(LEXICON)
    sources, targets = [], []
    for _ in range(pairs):
        chosen = [rng.choice(words) for _ in range(rng.randint(1, 9))]
        sources.append(" ".join(chosen).capitalize() + ".")
        targets.append(" ".join(LEXICON[word] for word in chosen).capitalize() + ".")
    (folder / f"{name}.de").write_text("\n".join(sources) + "\n", encoding="utf-8")
    (folder / f"{name}.en").write_text("\n".join(targets) + "\n", encoding="utf-8")


def recipe(folder: Path, **training) -> dict:
    return {"model": {"preset": "transformer-multi30k", "d_model": 32, "num_layers": 1, "num_heads": 2, "d_ff": 64,
                      "max_seq_len": 64, "dropout": 0.0},
            "data": {"train": "train", "eval": "val", "source_language": "de", "target_language": "en",
                     "tokenizer": "bpe"},
            "task": {"name": "translation", "bpe_vocab_size": 300, "batch_tokens": 160},
            "training": {"max_steps": 4, "batch_size": 8, "seq_len": 32, "eval_every": 4, "eval_batches": 0,
                         "threads": 1, "schedule": "constant", "warmup_steps": 0, "lr": 3e-3,
                         "early_stopping_metric": "eval_bleu", **training}}


def prepared(pairs: int = 60, batch_tokens: int = 160, seed: int = 1337, rank: int = 0, world_size: int = 1,
             folder: Path | None = None):
    write_corpus(folder, "train", pairs)
    data = read_parallel(folder / "train", "de", "en")
    tokenizer = learn_joint_bpe(data, 300)
    task = Translation(data, data, tokenizer, seq_len=32, batch_tokens=batch_tokens)
    model = tformer.build_model("transformer-multi30k", vocab_size=tokenizer.vocab_size, d_model=32, num_layers=1,
                                num_heads=2, d_ff=64, max_seq_len=64)
    model.tokenizer = tokenizer
    task.prepare(TrainingConfig(batch_size=8, seq_len=32, seed=seed), ProcessContext(rank, world_size), model)
    return task, model


def test_parallel_files_align_and_empty_pairs_are_counted(tmp_path):
    (tmp_path / "c.de").write_text("Ein Hund.\n\nEin Mann.\nHaus\n", encoding="utf-8")
    (tmp_path / "c.en").write_text("A dog.\nA cat.\nA man.\n \n", encoding="utf-8")
    data = read_parallel(tmp_path / "c", "de", "en")
    assert data.sources == ["Ein Hund.", "Ein Mann."] and data.targets == ["A dog.", "A man."]
    assert data.empty_skipped == 2 and "2 pairs (2 with an empty side skipped)" in data.describe()
    (tmp_path / "c.en").write_text("A dog.\nA cat.\n", encoding="utf-8")
    with pytest.raises(DataFileError, match=r"c.de has 4 lines but .*c.en has 2; they must align"):
        read_parallel(tmp_path / "c", "de", "en")
    with pytest.raises(DataFileError, match=r"c.fr: no such file \(nor c.fr.gz\)"):
        read_parallel(tmp_path / "c", "de", "fr")


def test_the_joint_bpe_reads_both_languages_and_rows_end_with_the_end_token(tmp_path):
    task, _ = prepared(folder=tmp_path)
    tokenizer = task.tokenizer
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 1, 2)
    pair = 3
    for rows, text in ((task.train_rows, task.train_pairs.sources[pair]),
                       (task.train_targets, task.train_pairs.targets[pair])):
        length = int(rows.lengths[pair])
        ids = rows.fields["ids"][pair, :length].tolist()
        assert ids == [*tokenizer.encode(text), 2] and tokenizer.decode(ids[:-1]) == text
        assert rows.fields["ids"][pair, length:].eq(0).all()
    # both languages' words are single tokens of the one vocabulary
    assert len(tokenizer.encode(" hund")) == 1 and len(tokenizer.encode(" dog")) == 1


def test_the_training_loss_is_the_models_own_without_its_logits(tmp_path):
    task, model = prepared(folder=tmp_path)
    task.prepare(TrainingConfig(batch_size=8, seq_len=32, seed=1337, label_smoothing=0.1), ProcessContext(0, 1), model)
    batch = task.train_batch(0)
    model.train()
    held = []
    hook = model.register_forward_hook(lambda module, args, output: held.append(output.logits))
    torch.manual_seed(1)  # the same dropout masks both ways
    loss = task.loss(model, batch)
    hook.remove()
    torch.manual_seed(1)
    logits = model(**{name: values for name, values in batch.items() if name != "labels"}).logits
    torch.testing.assert_close(loss, token_cross_entropy(logits, batch["labels"], 0.1), rtol=1e-5, atol=0)
    assert held == [None]  # the loss alone (losses.head_loss): no (B, T, V) logits kept for the backward


def test_token_budget_batches_cover_every_pair_once_an_epoch(tmp_path):
    task, _ = prepared(folder=tmp_path)
    per_epoch = len(task._length_batches())
    seen = []
    for position in range(per_epoch):
        batch = task.train_batch(position)
        rows, source_len = batch["input_ids"].shape
        target_len = batch["labels"].shape[1]
        assert rows * max(source_len, target_len) <= 160  # the budget, padding included
        assert batch["attention_mask"].sum(dim=1).min() >= 1
        targets = torch.where(batch["labels"] == -100, 0, batch["labels"])
        seen += [tuple(row) for row in targets.tolist()]
        assert torch.equal(batch["decoder_input_ids"][:, 0], torch.ones(rows, dtype=torch.long))  # <s> first
        kept = batch["labels"][:, 1:] != -100  # where the decoder reads a target token, it reads the previous one
        assert torch.equal(batch["decoder_input_ids"][:, 1:][kept], batch["labels"][:, :-1][kept])
    expected = [tuple(row) for row in task.train_targets.fields["ids"].tolist()]
    trim = [tuple(value for value in row if value) for row in seen]
    assert sorted(trim) == sorted(tuple(value for value in row if value) for row in expected)
    # the next epoch draws other batches in another order
    first = [task.train_batch(p)["labels"].tolist() for p in range(per_epoch)]
    second = [task.train_batch(per_epoch + p)["labels"].tolist() for p in range(per_epoch)]
    assert first != second


def test_a_batch_is_a_pure_function_of_seed_and_position(tmp_path):
    task, _ = prepared(folder=tmp_path)
    again, _ = prepared(folder=tmp_path)
    other_seed, _ = prepared(folder=tmp_path, seed=7)
    for position in (0, 5, 17, 3):  # any order, a fresh task: the same batch
        expected = task.train_batch(position)
        actual = again.train_batch(position)
        assert all(torch.equal(expected[name], actual[name]) for name in expected)
    assert any(not torch.equal(task.train_batch(p)["labels"], other_seed.train_batch(p)["labels"])
               for p in range(4) if task.train_batch(p)["labels"].shape == other_seed.train_batch(p)["labels"].shape)
    # two processes take alternate batches of the one stream
    shard, _ = prepared(folder=tmp_path, rank=1, world_size=2)
    assert torch.equal(shard.train_batch(2)["labels"], task.train_batch(5)["labels"])


def test_the_task_refuses_a_model_whose_special_tokens_differ(tmp_path):
    write_corpus(tmp_path, "train", 20)
    data = read_parallel(tmp_path / "train", "de", "en")
    task = Translation(data, None, learn_joint_bpe(data, 300), seq_len=32)
    model = tformer.build_model("transformer-multi30k", vocab_size=300, d_model=32, num_layers=1, num_heads=2,
                                d_ff=64, eos_token_id=5)
    with pytest.raises(TrainingError, match=r"the tokenizer's eos token is id 2 but the model's eos_token_id is 5"):
        task.prepare(TrainingConfig(batch_size=8, seq_len=32), ProcessContext(0, 1), model)
    decoder = tformer.build_model("gpt-nano", vocab_size=300)
    with pytest.raises(TrainingError, match=r"trains a sequence-to-sequence model over tokens \(encoder_decoder, "
                                            r"rnn_seq2seq\), not architecture='decoder'"):
        task.prepare(TrainingConfig(batch_size=8, seq_len=32), ProcessContext(0, 1), decoder)


def test_recipe_settings_are_checked_before_any_work(tmp_path):
    write_corpus(tmp_path, "train", 20)
    write_corpus(tmp_path, "val", 5, seed=1)
    raw = recipe(tmp_path)
    raw["data"]["target_language"] = "fr"
    with pytest.raises(RecipeError, match=r"\[data\] train: .*train.fr: no such file"):
        recipe_from_dict(raw, base_dir=tmp_path)
    raw = recipe(tmp_path)
    del raw["data"]["source_language"], raw["data"]["target_language"]
    with pytest.raises(RecipeError, match=r"set data.source_language and data.target_language"):
        recipe_from_dict(raw, base_dir=tmp_path)
    raw = recipe(tmp_path)
    raw["task"]["name"] = "lm"
    del raw["task"]["batch_tokens"], raw["task"]["bpe_vocab_size"]
    with pytest.raises(RecipeError, match=r"\[data\] source_language is not read by the lm task"):
        recipe_from_dict(raw, base_dir=tmp_path)
    assert not (tmp_path / "run").exists()


def test_a_run_trains_reports_bleu_and_resumes_bitwise(tmp_path, capsys):
    write_corpus(tmp_path, "train", 60)
    write_corpus(tmp_path, "val", 12, seed=1)
    lines: list[str] = []
    result = train_recipe(recipe_from_dict(recipe(tmp_path, max_steps=6, eval_every=3, checkpoint_every=3),
                                           base_dir=tmp_path), tmp_path / "whole", progress=False, echo=lines.append)
    assert "training train.de + train.en: 60 pairs; evaluation val.de + val.en: 12 pairs" in lines[0]
    assert "batches an epoch of up to 160 tokens a side" in lines[2]
    evaluated = [r for r in result.history if "eval_bleu" in r]
    assert [r["step"] for r in evaluated] == [3, 6] and all(0 <= r["eval_bleu"] <= 100 for r in evaluated)
    assert result.unit == "tokens"

    # stopped at step 3, resumed: the same weights to the bit
    train_recipe(recipe_from_dict(recipe(tmp_path, max_steps=3, eval_every=3, checkpoint_every=3),
                                  base_dir=tmp_path), tmp_path / "split", progress=False, echo=lambda text: None)
    train_recipe(recipe_from_dict(recipe(tmp_path, max_steps=6, eval_every=3, checkpoint_every=3),
                                  base_dir=tmp_path), tmp_path / "split", resume="auto", progress=False,
                 echo=lambda text: None)
    whole = load_file(str(tmp_path / "whole" / "model.safetensors"))
    split = load_file(str(tmp_path / "split" / "model.safetensors"))
    assert all(torch.equal(whole[name], split[name]) for name in whole)

    # the BLEU the run reported is sacreBLEU's on the translations tformer translate writes (greedy)
    model = tformer.load(tmp_path / "whole")
    sources = (tmp_path / "val.de").read_text(encoding="utf-8").splitlines()
    references = (tmp_path / "val.en").read_text(encoding="utf-8").splitlines()
    hypotheses = translate(model, sources, num_beams=1, batch_size=5).texts
    assert evaluated[-1]["eval_bleu"] == pytest.approx(sacrebleu.corpus_bleu(hypotheses, [references]).score)
    capsys.readouterr()
    assert main(["translate", str(tmp_path / "whole"), "--input", str(tmp_path / "val.de"), "--beam", "1",
                 "--output", str(tmp_path / "out.en"), "--no-progress"]) == 0
    assert (tmp_path / "out.en").read_text(encoding="utf-8").splitlines() == hypotheses
    assert "translated 12 sentences" in capsys.readouterr().err

    assert main(["evaluate", str(tmp_path / "whole"), "--source", str(tmp_path / "val.de"), "--reference",
                 str(tmp_path / "val.en"), "--beam", "1"]) == 0
    assert "translating" not in capsys.readouterr().err  # stderr is no terminal here: no progress bar in a log
    record = json.loads((tmp_path / "whole" / "evaluation" / "val.json").read_text())
    assert record["bleu"] == pytest.approx(evaluated[-1]["eval_bleu"])
    assert (tmp_path / "whole" / "evaluation" / "val.beam1.txt").read_text().splitlines() == hypotheses


def test_translate_keeps_lines_in_place_and_refuses_what_it_cannot_do(tmp_path, capsys):
    write_corpus(tmp_path, "train", 30)
    write_corpus(tmp_path, "val", 4, seed=1)
    train_recipe(recipe_from_dict(recipe(tmp_path, max_steps=1, eval_every=1), base_dir=tmp_path),
                 tmp_path / "run", progress=False, echo=lambda text: None)
    model = tformer.load(tmp_path / "run")
    lines = ["Ein hund.", "", "Ein mann sitzt.", "  "]
    result = translate(model, lines, num_beams=3, batch_size=2, max_new_tokens=12)
    alone = [translate(model, [line], num_beams=3, max_new_tokens=12).texts[0] for line in lines]
    assert result.texts == alone and result.texts[1] == result.texts[3] == "" and result.empty == 2
    # a line break the model writes never splits a translation in two
    (newline,) = model.tokenizer.encode("\n")
    with torch.no_grad():
        model.lm_head.weight[newline] = 0.0
        model.lm_head.weight[newline, 0] = 1e4 * float(torch.sign(model.embedding.token.weight[1, 0]) or 1)
    written = translate(model, ["Ein hund."], max_new_tokens=4).texts
    assert len(written) == 1 and "\n" not in written[0]
    (tmp_path / "in.de").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (tmp_path / "taken.en").write_text("mine\n")
    capsys.readouterr()
    assert main(["translate", str(tmp_path / "run"), "--input", str(tmp_path / "in.de"), "--output",
                 str(tmp_path / "taken.en")]) == 2
    assert "taken.en exists; give --overwrite" in capsys.readouterr().err
    assert (tmp_path / "taken.en").read_text() == "mine\n"
    assert main(["translate", str(tmp_path / "run"), "--input", str(tmp_path / "in.de"), "--beam", "0"]) == 2
    assert "--beam 0 must be a positive integer" in capsys.readouterr().err
    tformer.build_model("gpt-nano").save(tmp_path / "gpt")
    assert main(["translate", str(tmp_path / "gpt"), "--input", str(tmp_path / "in.de")]) == 2
    assert "a decoder model does not translate" in capsys.readouterr().err


def test_average_is_the_mean_of_the_checkpoints(tmp_path, capsys):
    write_corpus(tmp_path, "train", 30)
    write_corpus(tmp_path, "val", 4, seed=1)
    train_recipe(recipe_from_dict(recipe(tmp_path, max_steps=3, eval_every=3, checkpoint_every=1, keep_last=0),
                                  base_dir=tmp_path), tmp_path / "run", progress=False, echo=lambda text: None)
    assert main(["average", str(tmp_path / "run"), "--last", "2", "--out", str(tmp_path / "avg")]) == 0
    steps = [load_file(str(tmp_path / "run" / "checkpoints" / f"step-{n:08d}" / "model.safetensors")) for n in (2, 3)]
    averaged = load_file(str(tmp_path / "avg" / "model.safetensors"))
    for name, value in averaged.items():
        assert torch.allclose(value, (steps[0][name] + steps[1][name]) / 2, atol=1e-7)
    weight = "decoder.blocks.0.feedforward.in_proj.weight"
    assert not torch.equal(steps[0][weight], steps[1][weight])
    assert tformer.load(tmp_path / "avg").tokenizer is not None
    assert main(["average", str(tmp_path / "run"), "--last", "9", "--out", str(tmp_path / "avg9")]) == 2
    assert "holds 3 step checkpoints, fewer than the 9 to average" in capsys.readouterr().err
    assert main(["average", str(tmp_path / "run"), "--last", "2", "--out", str(tmp_path / "avg")]) == 2


@pytest.mark.parametrize("family", ["encoder_decoder", "rnn_seq2seq"])
def test_alignment_plots_draw_the_translations_attention(tmp_path, capsys, family):
    from tformer.viz.alignment import alignment_weights
    from tformer.viz.figures import written_by_tformer

    write_corpus(tmp_path, "train", 30)
    tokenizer = learn_joint_bpe(read_parallel(tmp_path / "train", "de", "en"), 300)
    if family == "encoder_decoder":
        model = tformer.build_model("transformer-multi30k", vocab_size=300, d_model=32, num_layers=2, num_heads=2,
                                    d_ff=64, max_seq_len=64)
    else:
        model = tformer.build_model("rnn-multi30k", vocab_size=300, d_model=16, rnn_hidden_size=24)
    model.tokenizer = tokenizer
    model.save(tmp_path / "model")
    source = torch.tensor([[*tokenizer.encode("Ein hund läuft."), 2]])
    with torch.no_grad():
        result = model.eval()(source, decoder_input_ids=torch.tensor([[1, 5, 9, 7]]), output_attentions=True)
    weights = alignment_weights(result.cross_attentions)
    assert weights.shape == (4, source.shape[1]) and torch.allclose(weights.sum(-1), torch.ones(4))
    capsys.readouterr()
    assert main(["attention", str(tmp_path / "model"), "--source", "Ein hund läuft.", "--beam", "2"]) == 0
    printed = capsys.readouterr().out
    assert "alignment" in printed and written_by_tformer(tmp_path / "model" / "attention" / "alignment.png")
    assert "\nbeam       2\n" in printed
    layers = 2 if family == "encoder_decoder" else 1
    assert main(["attention", str(tmp_path / "model"), "--source", "Ein hund.", "--layer", "3"]) == 2
    assert f"--layer 3: this model has {layers} cross-attention layers" in capsys.readouterr().err
