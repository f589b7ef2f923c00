"""The logits rules (``generation/rules.py``) and the option tables derived from the ``GenerationConfig`` fields:
only the rules an option turns on are composed (greedy decoding composes none), in Hugging Face's order; min-p and
the repetition penalty do what Hugging Face's processors do (by hand here; against ``transformers`` itself in
``test_generation_hf.py``); a decoding path that cannot apply a rule refuses it by name; the command line, the
server's support table and request fields and generation_config.json's keys come from the fields' declarations."""

import dataclasses

import pytest
import torch

import tformer
from tformer.generation import GenerationConfig, GenerationError
from tformer.generation.rules import (
    RULES,
    AllowedTokens,
    Constrained,
    LogitBias,
    MinNewTokens,
    MinP,
    PresenceFrequencyPenalty,
    RepetitionPenalty,
    Temperature,
    TopK,
)
from tformer.generation.sampling import TokenChooser
from tformer.generation.settings import BEAM_SEARCH, SERVER, SPECULATIVE, declared, refusals


def nano(**overrides):
    return tformer.build_model("gpt-nano", **overrides).eval()


CONFIG = nano().config  # a vocabulary of 64, end id in it


def test_greedy_decoding_composes_no_rule():
    chooser = TokenChooser.from_config(GenerationConfig(), CONFIG)
    assert chooser.rules == () and not chooser.reads_history and not chooser.alters(0)
    logits = torch.randn(2, 64)
    assert chooser.scores(logits, 0) is logits  # float32 logits pass untouched: no work a step
    # Sampling options are not composed when decoding greedily (do_sample=False), as in Hugging Face.
    greedy = TokenChooser.from_config(GenerationConfig(do_sample=False, temperature=0.5, top_k=3, min_p=0.2), CONFIG)
    assert greedy.rules == () and not greedy.do_sample


def test_every_rule_composes_in_hugging_faces_order():
    config = GenerationConfig(allowed_token_ids=(1, 2, 3, 4, 5), logit_bias={4: 2.0}, repetition_penalty=1.3,
                              presence_penalty=0.5, forced_eos_token_id=5, suppress_tokens=(1,),
                              begin_suppress_tokens=(2,), min_new_tokens=2, eos_token_id=3, temperature=0.7, top_k=5,
                              top_p=0.9, min_p=0.1)
    chooser = TokenChooser.from_config(config, CONFIG)
    # every rule but a constraint's (it needs a tokenizer, and refuses min_new_tokens: test_constraints.py)
    assert [type(rule) for rule in chooser.rules] == [kind for kind in RULES if kind is not Constrained]
    assert chooser.do_sample and chooser.reads_history
    # Options at their neutral values compose nothing: top_p 1, min_p 0, temperature 1, penalty 1.
    neutral = GenerationConfig(do_sample=True, top_p=1.0, min_p=0.0, temperature=1.0, repetition_penalty=1.0,
                               presence_penalty=0.0, frequency_penalty=0.0, logit_bias={})
    assert TokenChooser.from_config(neutral, CONFIG).rules == ()
    assert [type(r) for r in TokenChooser.from_config(GenerationConfig(temperature=0.5, top_k=4), CONFIG).rules] == \
        [Temperature, TopK]


def test_min_p_keeps_the_tokens_at_least_min_p_times_as_probable_as_the_best():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, float("-inf")], [0.0, 0.0, 0.0, 0.0, 0.0]])
    probabilities = logits.softmax(-1)
    rule = MinP(0.3)
    got = rule(logits, 0, False, None)
    keep = probabilities >= 0.3 * probabilities.amax(-1, keepdim=True)
    assert torch.equal(torch.isfinite(got), keep)
    assert keep[0].tolist() == [True, True, False, False, False] and keep[1].all()  # ties with the best stay
    assert torch.equal(got[keep], logits[keep])
    assert torch.isfinite(MinP(1.0)(logits, 0, False, None)[0]).tolist() == [True, False, False, False, False]


def test_min_p_one_samples_the_argmax():
    model = nano()
    prompt = torch.randint(0, 64, (2, 4), generator=torch.Generator().manual_seed(1))
    greedy = tformer.generate(model, prompt, 8, eos_token_id=())
    assert GenerationConfig(min_p=1.0).sampling  # min_p implies sampling, as top_k and top_p do
    assert torch.equal(tformer.generate(model, prompt, 8, eos_token_id=(), min_p=1.0, seed=0), greedy)


def test_the_repetition_penalty_divides_positive_and_multiplies_negative_scores_of_tokens_seen():
    scores = torch.tensor([[2.0, -2.0, 1.0, 0.0, 3.0], [2.0, -2.0, 1.0, 0.0, 3.0]])
    history = torch.tensor([[0, 1, 1, 3], [4, 4, 4, 4]])  # repeats count once
    got = RepetitionPenalty(2.0)(scores, 0, False, history)
    assert got.tolist() == [[1.0, -4.0, 1.0, 0.0, 3.0], [2.0, -2.0, 1.0, 0.0, 1.5]]
    with pytest.raises(GenerationError, match="repetition_penalty needs each row's tokens so far"):
        RepetitionPenalty(2.0)(scores, 0, False, None)  # fail closed where a path gives no history


def test_greedy_decoding_with_a_repetition_penalty_penalises_the_prompt_and_what_it_wrote():
    model = nano()
    prompt = torch.tensor([[5, 9, 5, 9, 5, 9]])
    plain = tformer.generate(model, prompt, 12, eos_token_id=())
    penalised = tformer.generate(model, prompt, 12, eos_token_id=(), repetition_penalty=50.0, return_dict=True,
                                 output_scores=True)
    assert not torch.equal(plain, penalised.sequences)
    # Each step: the logits with every token of the sequence so far penalised.
    for step, scores in enumerate(penalised.scores):
        seen = set(penalised.sequences[0, : prompt.shape[1] + step].tolist())
        chosen = int(penalised.sequences[0, prompt.shape[1] + step])
        assert chosen == int(scores.argmax())
        assert chosen not in seen or len(seen) == 64


@pytest.mark.parametrize(("options", "path"), [
    (dict(num_beams=2, repetition_penalty=1.2), BEAM_SEARCH),
])
def test_beam_search_refuses_what_it_cannot_apply_by_name(options, path):
    with pytest.raises(GenerationError, match=rf"repetition_penalty=1.2 is not supported by {path}: ") as caught:
        GenerationConfig(**options)
    assert "\n" not in str(caught.value)


def test_speculative_decoding_refuses_the_repetition_penalty_by_name():
    model, draft = nano(), nano()
    with pytest.raises(GenerationError, match=f"repetition_penalty=1.2 is not supported by {SPECULATIVE}: "):
        tformer.generate(model, torch.tensor([[1, 2]]), 4, draft_model=draft, repetition_penalty=1.2)
    # min_p is a per-row filter: speculative decoding applies it (min_p 1: the greedy output).
    out = tformer.generate(model, torch.tensor([[1, 2]]), 6, draft_model=draft, min_p=1.0, seed=0, eos_token_id=())
    assert torch.equal(out, tformer.generate(model, torch.tensor([[1, 2]]), 6, eos_token_id=()))


@pytest.mark.parametrize(("options", "message"), [
    (dict(min_p=1.5), r"min_p=1.5 must be a number in \[0, 1\]"),
    (dict(min_p=float("nan")), r"min_p=nan must be a number in \[0, 1\]"),
    (dict(repetition_penalty=0), r"repetition_penalty=0 must be a number > 0 \(1 = none\)"),
    (dict(repetition_penalty="2"), r"repetition_penalty='2' must be a number > 0"),
    (dict(num_beams=2, min_p=0.1), r"sampling \(do_sample, temperature, top_k, top_p, min_p\) cannot be combined"),
])
def test_bad_rule_options_are_refused_naming_them(options, message):
    with pytest.raises(GenerationError, match=message):
        GenerationConfig(**options)


def test_the_option_tables_are_derived_from_the_fields():
    from tformer.cli import build_parser
    from tformer.cli.generate import OPTIONS, SAMPLING_OPTIONS
    from tformer.generation.defaults import HONOURED, NEUTRAL, READ
    from tformer.serving.engine import GENERATION_FIELDS
    from tformer.serving.openai_api import FIELD_OF_OPTION, CompletionRequest

    names = [field.name for field in dataclasses.fields(GenerationConfig)]
    assert list(declared()) == names
    assert GENERATION_FIELDS == refusals(SERVER) and set(GENERATION_FIELDS) == set(names)
    assert {"min_p": "--min-p", "repetition_penalty": "--repetition-penalty"}.items() <= OPTIONS.items()
    assert SAMPLING_OPTIONS == {"temperature", "top_k", "top_p", "min_p"}
    args = build_parser().parse_args(["generate", "x", "--prompt", "y", "--min-p", "0.1", "--repetition-penalty",
                                      "1.1", "--stop", "a", "--stop", "b"])
    assert (args.min_p, args.repetition_penalty, args.stop) == (0.1, 1.1, ["a", "b"])
    assert FIELD_OF_OPTION["min_p"] == "min_p" and FIELD_OF_OPTION["max_new_tokens"] == "max_tokens"
    request = CompletionRequest(model="m", prompt="x", min_p=0.2, repetition_penalty=1.1)
    assert (request.generation_config(4).min_p, request.generation_config(4).repetition_penalty) == (0.2, 1.1)
    assert {"repetition_penalty", "min_p"} <= set(READ) and "repetition_penalty" in HONOURED
    assert not {"repetition_penalty", "min_p"} & set(NEUTRAL)
    # Each decoding path that cannot apply an option says why, in its field's declaration.
    assert refusals(SERVER)["repetition_penalty"] is None and refusals(SERVER)["min_p"] is None  # the engine does both
    assert refusals(SPECULATIVE)["repetition_penalty"] and refusals(BEAM_SEARCH)["repetition_penalty"]


def _openai_penalised(scores, history, generated, presence, frequency):
    """OpenAI's definition, token by token: mu[j] - c[j] * frequency - (c[j] > 0) * presence, c[j] the times token
    j was chosen among a row's ``generated`` new tokens (the end of ``history``; the prompt does not count)."""
    expected = scores.clone()
    for row in range(scores.shape[0]):
        new = history[row, history.shape[1] - generated:].tolist() if generated else []
        for token in set(new):
            expected[row, token] -= new.count(token) * frequency + presence
    return expected


@pytest.mark.parametrize(("presence", "frequency"), [(0.5, 0.0), (0.0, 0.7), (1.5, -0.4), (-2.0, 2.0)])
def test_presence_and_frequency_penalties_are_openais_over_the_new_tokens_only(presence, frequency):
    generator = torch.Generator().manual_seed(3)
    scores = torch.randn(3, 20, generator=generator)
    history = torch.randint(0, 20, (3, 11), generator=generator)
    history[2, :3] = -1  # a left-padded prompt
    history[0, -4:] = torch.tensor([7, 7, 7, 2])  # a token chosen three times
    rule = PresenceFrequencyPenalty(presence, frequency)
    for generated in (0, 1, 4, 8):
        got = rule(scores, generated, False, history)
        assert torch.allclose(got, _openai_penalised(scores, history, generated, presence, frequency), atol=1e-6)
    assert not rule.alters(0) and rule.alters(1)  # the first new token: nothing chosen yet, the plain argmax
    with pytest.raises(GenerationError, match="presence_penalty and frequency_penalty need each row's tokens"):
        rule(scores, 2, False, None)  # fail closed where a path gives no history


def test_greedy_decoding_with_penalties_is_openais_step_by_step():
    """tformer.generate's greedy tokens with both penalties equal a loop over the model's logits applying OpenAI's
    formula to the tokens chosen so far (the prompt not counted)."""
    model = nano()
    prompt = [5, 9, 5, 9, 5]
    got = tformer.generate(model, torch.tensor([prompt]), 10, eos_token_id=(), presence_penalty=0.8,
                           frequency_penalty=1.1)[0, len(prompt):].tolist()
    ids = list(prompt)
    with torch.no_grad():
        for step in range(10):
            logits = model(torch.tensor([ids])).logits[:, -1].float()
            scores = _openai_penalised(logits, torch.tensor([ids]), step, 0.8, 1.1)
            ids.append(int(scores.argmax()))
    assert got == ids[len(prompt):]
    assert got != tformer.generate(model, torch.tensor([prompt]), 10, eos_token_id=())[0, len(prompt):].tolist()


def test_logit_bias_adds_each_bias_and_checks_its_ids_against_the_vocabulary():
    scores = torch.zeros(2, 64)
    rule = LogitBias.from_config(GenerationConfig(logit_bias={3: 5.0, 60: -100}), CONFIG, None)
    got = rule(scores, 0, False, None)
    expected = scores.clone()
    expected[:, 3], expected[:, 60] = 5.0, -100.0
    assert torch.equal(got, expected)
    model = nano()
    biased = tformer.generate(model, torch.tensor([[1, 2, 3]]), 6, eos_token_id=(), logit_bias={17: 100})
    assert biased[0, 3:].tolist() == [17] * 6
    with pytest.raises(GenerationError, match=r"logit_bias=\[64\]: 64 is not a token id in \[0, 64\)"):
        tformer.generate(model, torch.tensor([[1, 2, 3]]), 2, logit_bias={64: 1.0})


def test_allowed_token_ids_are_the_only_ones_chosen():
    rule = AllowedTokens.from_config(GenerationConfig(allowed_token_ids=[2, 7]), CONFIG, None)
    got = rule(torch.randn(2, 64), 0, False, None)
    assert torch.isfinite(got).nonzero()[:, 1].tolist() == [2, 7, 2, 7]
    out = tformer.generate(nano(), torch.tensor([[1, 2, 3]]), 12, eos_token_id=(), allowed_token_ids=[2, 7],
                           do_sample=True, seed=0)
    assert set(out[0, 3:].tolist()) <= {2, 7}


def test_stop_token_ids_end_a_sequence_and_min_new_tokens_forbids_them():
    model = nano()
    prompt = torch.tensor([[4, 11, 4, 11]])
    free = tformer.generate(model, prompt, 12, eos_token_id=(), temperature=1.3, seed=2)[0, 4:].tolist()
    stop = free[5]
    first = free.index(stop)
    stopped = tformer.generate(model, prompt, 12, eos_token_id=(), stop_token_ids=[stop], temperature=1.3, seed=2)
    assert stopped[0, 4:].tolist() == free[:first + 1]  # ends at the stop id, which it keeps
    config = GenerationConfig(eos_token_id=(), stop_token_ids=[stop], min_new_tokens=3)
    assert config.end_ids(CONFIG) == (stop,)
    assert isinstance(TokenChooser.from_config(config, CONFIG).rules[0], MinNewTokens)
    assert GenerationConfig(eos_token_id=(3,), stop_token_ids=[9, 3]).end_ids(CONFIG) == (3, 9)
    with pytest.raises(GenerationError, match=r"stop_token_ids=\(70,\): 70 is not a token id in \[0, 64\)"):
        GenerationConfig(stop_token_ids=[70]).end_ids(CONFIG)


@pytest.mark.parametrize(("options", "message"), [
    (dict(presence_penalty=2.5), r"presence_penalty=2.5 must be a number in \[-2, 2\]"),
    (dict(frequency_penalty=float("inf")), r"frequency_penalty=inf must be a number in \[-2, 2\]"),
    (dict(logit_bias={5: 100.5}), r"logit_bias: the bias of token id 5 is 100.5; it must be a number in \[-100, 100\]"),
    (dict(logit_bias=[(5, 1.0), (5, 2.0)]), "logit_bias: token id 5 is given twice"),
    (dict(logit_bias={-1: 1.0}), "logit_bias: -1 is not a token id >= 0"),
    (dict(logit_bias="5"), "logit_bias='5' must map token ids to biases"),
    (dict(allowed_token_ids=[]), r"allowed_token_ids=\(\) allows no token"),
    (dict(num_beams=2, frequency_penalty=0.5), "frequency_penalty=0.5 is not supported by beam search"),
])
def test_bad_openai_options_are_refused_naming_them(options, message):
    with pytest.raises(GenerationError, match=message):
        GenerationConfig(**options)


def test_speculative_decoding_refuses_the_openai_penalties_and_applies_a_logit_bias():
    model, draft = nano(), nano()
    with pytest.raises(GenerationError, match=f"presence_penalty=0.5 is not supported by {SPECULATIVE}: "):
        tformer.generate(model, torch.tensor([[1, 2]]), 4, draft_model=draft, presence_penalty=0.5)
    out = tformer.generate(model, torch.tensor([[1, 2]]), 6, draft_model=draft, logit_bias={9: 50}, eos_token_id=())
    assert torch.equal(out, tformer.generate(model, torch.tensor([[1, 2]]), 6, logit_bias={9: 50}, eos_token_id=()))


def test_the_command_line_sets_the_openai_options():
    from tformer.cli import build_parser

    args = build_parser().parse_args(["generate", "x", "--prompt", "y", "--presence-penalty", "0.5",
                                      "--frequency-penalty", "-1", "--logit-bias", "5=-100", "--logit-bias", "7=2.5"])
    assert (args.presence_penalty, args.frequency_penalty, args.logit_bias) == (0.5, -1.0, [(5, -100.0), (7, 2.5)])
    assert GenerationConfig(logit_bias=tuple(args.logit_bias)).logit_bias == ((5, -100.0), (7, 2.5))


@pytest.mark.parametrize("value", ["5", "five=1", "5=much"])
def test_a_malformed_logit_bias_option_is_refused_in_one_line(value, capsys):
    from tformer.cli import build_parser

    with pytest.raises(SystemExit) as caught:
        build_parser().parse_args(["generate", "x", "--prompt", "y", "--logit-bias", value])
    assert caught.value.code == 2
    assert f"argument --logit-bias: {value!r} is not ID=BIAS" in capsys.readouterr().err
