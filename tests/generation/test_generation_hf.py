"""The same random weights in Hugging Face ``GPT2LMHeadModel`` and in tformer: greedy decoding and
beam search give Hugging Face ``generate``'s outputs token for token (and the same scores),
on a left-padded batch, with one or several end ids, length penalties and early stopping."""

import pytest
import torch

import tformer

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.slow  # compares with transformers

EOS, PAD = 2, 3  # ids of the config; the tests also end at ids these weights often produce


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=50, n_positions=64,
                                     bos_token_id=1, eos_token_id=EOS, pad_token_id=PAD, initializer_range=0.3)
    hf = transformers.GPT2LMHeadModel(config).eval()
    folder = tmp_path_factory.mktemp("hf-gpt2")
    hf.save_pretrained(folder)
    return hf, tformer.load(folder)  # through tformer.interop


def prompts():
    ids = torch.randint(4, 50, (2, 6), generator=torch.Generator().manual_seed(7))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # the second prompt is 4 tokens, left-padded
    return ids, mask


@pytest.mark.parametrize("eos", [[46], [16, 30, 46]], ids=["one-end-id", "three-end-ids"])
def test_greedy_equals_hugging_face(models, eos):
    hf, ours = models
    ids, mask = prompts()
    expected = hf.generate(ids, attention_mask=mask, max_new_tokens=15, do_sample=False, eos_token_id=eos,
                           pad_token_id=PAD, min_new_tokens=3, output_scores=True, return_dict_in_generate=True)
    got = tformer.generate(ours, ids, 15, attention_mask=mask, eos_token_id=eos, pad_token_id=PAD, min_new_tokens=3,
                           output_scores=True)
    assert torch.equal(got.sequences, expected.sequences)
    torch.testing.assert_close(torch.stack(got.scores), torch.stack(expected.scores), rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("num_beams, length_penalty, early_stopping, eos, returned", [
    (3, 1.0, False, [46], 1),
    (4, 0.7, True, [16], 2),
    (4, 1.5, "never", [46, 16], 3),
    (5, -0.5, False, [EOS, 9, 30], 2),
])
def test_beam_search_equals_hugging_face(models, num_beams, length_penalty, early_stopping, eos, returned):
    hf, ours = models
    ids, mask = prompts()
    options = dict(num_beams=num_beams, length_penalty=length_penalty, early_stopping=early_stopping,
                   eos_token_id=eos, pad_token_id=PAD, num_return_sequences=returned)
    expected = hf.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False, output_scores=True,
                           return_dict_in_generate=True, **options)
    got = tformer.generate(ours, ids, 12, attention_mask=mask, return_dict=True, **options)
    assert torch.equal(got.sequences, expected.sequences)
    torch.testing.assert_close(got.sequences_scores, expected.sequences_scores, rtol=1e-5, atol=1e-5)


# ---- the logits rules against Hugging Face's processors ---------------------------------------


def rule_inputs():
    """Scores (4, 50) with ties, -inf entries and a row of equal scores, and token ids (4, 9) with repeats and ids
    past the vocabulary (a larger embedding than the head's: Hugging Face ignores them)."""
    generator = torch.Generator().manual_seed(3)
    scores = torch.randn(4, 50, generator=generator) * 3
    scores[0, :5] = scores[0, 5]
    scores[1, 10:20] = float("-inf")
    scores[2] = 0.5
    ids = torch.randint(0, 50, (4, 9), generator=generator)
    ids[3, :4] = torch.tensor([7, 7, 55, 60])
    return scores, ids


@pytest.mark.parametrize("min_p", [0.0, 0.05, 0.3, 0.9, 1.0])
def test_min_p_equals_hugging_faces_warper(min_p):
    from tformer.generation.rules import MinP

    scores, ids = rule_inputs()
    expected = transformers.MinPLogitsWarper(min_p)(ids, scores.clone())
    assert torch.equal(MinP(min_p)(scores, 0, False, ids), expected)  # the same float operations: exact


@pytest.mark.parametrize("penalty", [0.5, 1.3, 2.0])
def test_the_repetition_penalty_equals_hugging_faces_processor(penalty):
    from tformer.generation.rules import RepetitionPenalty

    scores, ids = rule_inputs()
    expected = transformers.RepetitionPenaltyLogitsProcessor(penalty)(ids, scores.clone())
    assert torch.equal(RepetitionPenalty(penalty)(scores, 0, False, ids), expected)


def test_the_sampling_rules_together_equal_hugging_faces_warpers():
    from tformer.generation import GenerationConfig
    from tformer.generation.sampling import TokenChooser

    scores, ids = rule_inputs()
    config = GenerationConfig(temperature=0.7, top_k=20, min_p=0.1, repetition_penalty=1.2)
    ours = TokenChooser.from_config(config, tformer.build_model("gpt-nano", vocab_size=50).config)
    expected = transformers.LogitsProcessorList([
        transformers.RepetitionPenaltyLogitsProcessor(1.2), transformers.TemperatureLogitsWarper(0.7),
        transformers.TopKLogitsWarper(20), transformers.MinPLogitsWarper(0.1)])(ids, scores.clone())
    assert torch.equal(ours.scores(scores, 0, history=ids), expected)


@pytest.mark.parametrize("penalty", [1.3, 0.8])
def test_greedy_with_a_repetition_penalty_equals_hugging_face(models, penalty):
    """Over the prompt and the new tokens, padding included, as Hugging Face's generate applies it."""
    hf, ours = models
    ids, mask = prompts()
    options = dict(eos_token_id=[46], pad_token_id=PAD, min_new_tokens=2, repetition_penalty=penalty)
    expected = hf.generate(ids, attention_mask=mask, max_new_tokens=15, do_sample=False, output_scores=True,
                           return_dict_in_generate=True, **options)
    got = tformer.generate(ours, ids, 15, attention_mask=mask, output_scores=True, **options)
    assert torch.equal(got.sequences, expected.sequences)
    assert not torch.equal(got.sequences, tformer.generate(ours, ids, 15, attention_mask=mask, eos_token_id=[46],
                                                           pad_token_id=PAD, min_new_tokens=2))  # it bites
    torch.testing.assert_close(torch.stack(got.scores), torch.stack(expected.scores), rtol=1e-6, atol=1e-5)


def test_logit_bias_equals_hugging_faces_sequence_bias_of_single_tokens():
    from tformer.generation import GenerationConfig
    from tformer.generation.rules import LogitBias

    scores, ids = rule_inputs()
    bias = {3: 2.5, 17: -100.0, 49: 0.75}
    config = tformer.build_model("gpt-nano", vocab_size=50).config
    rule = LogitBias.from_config(GenerationConfig(logit_bias=bias), config, None)
    expected = transformers.SequenceBiasLogitsProcessor([[[token], value] for token, value in bias.items()])(
        ids, scores.clone())
    assert torch.equal(rule(scores, 0, False, ids), expected)


def test_allowed_token_ids_equal_hugging_faces_suppression_of_every_other_id():
    from tformer.generation import GenerationConfig
    from tformer.generation.rules import AllowedTokens

    scores, ids = rule_inputs()
    allowed = [0, 7, 31, 49]
    rule = AllowedTokens.from_config(GenerationConfig(allowed_token_ids=allowed),
                                     tformer.build_model("gpt-nano", vocab_size=50).config, None)
    others = [token for token in range(50) if token not in allowed]
    expected = transformers.SuppressTokensLogitsProcessor(others)(ids, scores.clone())
    assert torch.equal(rule(scores, 0, False, ids), expected)
