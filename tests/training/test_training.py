"""The first training loop, schedules and batches."""

import json
import math

import pytest
import torch

import tformer
from tformer.data.lm import random_crops, split_tokens, unigram_cross_entropy
from tformer.training.optim import build_optimizer, parameter_groups
from tformer.training.schedules import learning_rate
from tformer.training.tasks import LanguageModelling
from tformer.training.trainer import Trainer, TrainingConfig, TrainingError


def test_warmup_cosine_matches_its_formula():
    kwargs = dict(schedule="cosine", lr=1e-3, warmup_steps=10, max_steps=110, min_lr=1e-4)
    assert learning_rate(0, **kwargs) == pytest.approx(1e-4)
    assert learning_rate(9, **kwargs) == pytest.approx(1e-3)
    assert learning_rate(60, **kwargs) == pytest.approx(1e-4 + 0.5 * (1 + math.cos(math.pi * 0.5)) * 9e-4)
    assert learning_rate(110, **kwargs) == pytest.approx(1e-4)


def test_inverse_sqrt_matches_the_2017_formula():
    for step in (0, 99, 3999, 10000):
        s = step + 1
        expected = 512**-0.5 * min(s**-0.5, s * 4000**-1.5)
        assert learning_rate(step, schedule="inverse_sqrt", lr=1.0, warmup_steps=4000, max_steps=0,
                             d_model=512) == pytest.approx(expected)


def test_no_weight_decay_on_norms_biases_and_embeddings():
    model = tformer.build_model("gpt-nano")
    decay, no_decay = parameter_groups(model, 0.1)
    decayed = {id(p) for p in decay["params"]}
    assert id(model.stack.blocks[0].attention.qkv_proj.weight) in decayed
    assert id(model.embedding.token.weight) not in decayed
    assert id(model.stack.blocks[0].attention_norm.weight) not in decayed
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def _adam_step_changes(model, scale: float) -> dict[str, torch.Tensor]:
    """Each parameter's change after one AdamW step of ``build_optimizer`` on a fixed batch."""
    optimizer = build_optimizer(model, lr=1e-3, weight_decay=0.0, fused=False, position_bias_lr_scale=scale)
    before = {name: parameter.detach().clone() for name, parameter in model.named_parameters()}
    ids = torch.arange(32).remainder(8).view(2, 16)
    torch.nn.functional.cross_entropy(model(ids).logits.flatten(0, 1), ids.roll(-1, 1).flatten()).backward()
    optimizer.step()
    return {name: parameter.detach() - before[name] for name, parameter in model.named_parameters()}


def test_the_position_bias_lr_scale_moves_only_the_relative_bias_faster():
    """Adam's first step moves a parameter by about lr whatever its gradient: ten times the rate is ten times the
    step for the bias tables (where the gradient is well above eps), and the same step for everything else."""
    changes = []
    for scale in (1.0, 10.0):
        torch.manual_seed(0)
        changes.append(_adam_step_changes(tformer.build_model("gpt-nano", vocab_size=8, positional="relative"), scale))
    plain, scaled = changes
    table = "stack.positional.bias.embedding.weight"
    moved = plain[table].abs() > 1e-5
    assert moved.sum() > 0
    torch.testing.assert_close(scaled[table][moved], 10 * plain[table][moved], rtol=1e-3, atol=0)
    for name in plain:
        if name != table:
            torch.testing.assert_close(scaled[name], plain[name], rtol=0, atol=0)


def test_the_schedule_keeps_the_position_bias_lr_scale_and_a_model_without_the_bias_refuses_it():
    tokens = LanguageModelling(torch.arange(8).repeat(40))
    model = tformer.build_model("gpt-nano", vocab_size=8, positional="relative")
    config = TrainingConfig(max_steps=3, batch_size=2, seq_len=8, warmup_steps=2, position_bias_lr_scale=10.0)
    trainer = Trainer(model, config, tokens, progress=False)
    trainer.train()
    rates = [group["lr"] for group in trainer.optimizer.param_groups]
    assert rates[2] == pytest.approx(10 * rates[0]) and rates[0] == rates[1] > 0
    with pytest.raises(TrainingError, match="position_bias_lr_scale=10.0 scales a learned relative position bias"):
        Trainer(tformer.build_model("gpt-nano", vocab_size=8, positional="rope"), config, tokens, progress=False)
    with pytest.raises(TrainingError, match="position_bias_lr_scale"):
        TrainingConfig(position_bias_lr_scale=0.0)


def test_batches_are_a_function_of_seed_and_step():
    tokens = torch.arange(1000)
    a = random_crops(tokens, 4, 16, seed=1, step=7)
    b = random_crops(tokens, 4, 16, seed=1, step=7)
    assert torch.equal(a[0], b[0]) and torch.equal(a[0][:, 1:], a[1][:, :-1])
    assert not torch.equal(a[0], random_crops(tokens, 4, 16, seed=1, step=8)[0])


def test_unigram_baseline_and_split():
    train, evaluation = split_tokens(torch.tensor([0, 0, 1, 1, 0, 0, 1, 1, 0, 1]), 0.2)
    assert train.numel() == 8
    assert unigram_cross_entropy(train, evaluation, 2) == pytest.approx(math.log(2))


def test_trainer_learns_and_writes_a_run_folder(tmp_path):
    torch.manual_seed(0)
    text_tokens = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7] * 200)
    model = tformer.build_model("gpt-nano", vocab_size=8)
    config = TrainingConfig(max_steps=60, batch_size=8, seq_len=16, lr=1e-2, min_lr=1e-3, warmup_steps=5, eval_every=30,
                            eval_batches=2, device="cpu")
    task = LanguageModelling(text_tokens, text_tokens)
    result = Trainer(model, config, task, out_dir=tmp_path, progress=False).train()
    assert result.final_eval_loss < 0.1
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 60 and {"step", "train_loss", "lr", "tokens_per_s"} <= set(lines[0])
    assert "eval_loss" in lines[29]
    loaded = tformer.load(tmp_path)
    ids = torch.tensor([[0, 1, 2, 3]])
    assert torch.equal(loaded(ids).logits, model.eval()(ids).logits)


def test_bad_training_settings_are_named():
    with pytest.raises(TrainingError, match="training.schedule='cosin' is not one of"):
        TrainingConfig(schedule="cosin")
    with pytest.raises(TrainingError, match="training.max_steps=0"):
        TrainingConfig(max_steps=0)


def test_a_window_longer_than_the_position_table_is_refused_and_rotary_is_not_limited():
    tokens = LanguageModelling(torch.arange(8).repeat(40))
    with pytest.raises(TrainingError, match="training.seq_len=80 exceeds the model's max_seq_len=64"):
        Trainer(tformer.build_model("gpt-nano", vocab_size=8), TrainingConfig(seq_len=80), tokens, progress=False)
    rotary = tformer.build_model("gpt-nano", vocab_size=8, positional="rope")
    assert Trainer(rotary, TrainingConfig(seq_len=80), tokens, progress=False).task.seq_len == 80


def test_non_finite_loss_stops_training():
    model = tformer.build_model("gpt-nano", vocab_size=8)
    with torch.no_grad():
        model.embedding.token.weight.fill_(float("nan"))
    trainer = Trainer(model, TrainingConfig(max_steps=3, batch_size=2, seq_len=8),
                      LanguageModelling(torch.arange(8).repeat(10)), progress=False)
    with pytest.raises(TrainingError, match="loss became nan at step 1"):  # numbered as metrics.jsonl numbers steps
        trainer.train()
