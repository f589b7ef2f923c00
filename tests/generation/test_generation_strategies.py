"""Greedy, sampling and beam search through ``tformer.generate``: exactness against simple
references (no cache, brute force), batches of prompts of different lengths, the filtered
sampling sets, end-of-sequence and stop rules, streaming, scores and argument errors."""

import io
import itertools
import math

import pytest
import torch

import tformer
from tformer.generation import GenerationError, TextStreamer, stream_generate
from tformer.generation.beam import beam_search
from tformer.generation.run import DecodingRun
from tformer.generation.sampling import TokenChooser
from tformer.generation.session import StackSession
from tformer.generation.stopping import StopRule
from tformer.tokenizers import CharTokenizer


def nano(**overrides):
    return tformer.build_model("gpt-nano", **overrides).eval()


def greedy_without_cache(model, ids, steps):
    for _ in range(steps):
        ids = torch.cat([ids, model(ids).logits[:, -1].argmax(-1, keepdim=True)], 1)
    return ids


def left_pad(prompts, pad=0):
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


# ---- greedy and batches ----------------------------------------------------------------------


@pytest.mark.parametrize("positional", ["learned", "rope", "alibi"])
def test_cached_greedy_equals_greedy_without_cache(positional):
    model = nano(positional=positional)
    prompt = torch.randint(0, 64, (2, 5))
    expected = greedy_without_cache(model, prompt, 12)
    assert torch.equal(tformer.generate(model, prompt, 12), expected)
    assert torch.equal(tformer.generate(model, prompt, 12, use_cache=False), expected)


@pytest.mark.parametrize("options", [dict(), dict(num_beams=3)], ids=["greedy", "beam"])
@pytest.mark.parametrize("positional", ["learned", "rope", "alibi"])
def test_a_left_padded_batch_gives_each_prompt_its_own_output(positional, options):
    model = nano(positional=positional)
    prompts = [[5, 9, 3], [7, 1, 2, 8, 4, 6, 11], [13]]
    ids, mask = left_pad(prompts, pad=63)
    batched = tformer.generate(model, ids, 10, attention_mask=mask, eos_token_id=[], **options)
    for row, prompt in enumerate(prompts):
        alone = tformer.generate(model, torch.tensor([prompt]), 10, eos_token_id=[], **options)
        assert torch.equal(batched[row, ids.shape[1] - len(prompt):], alone[0])


# ---- beam search -----------------------------------------------------------------------------


def run_beam_search(model, prompt, max_new_tokens, num_beams, **options):
    run = DecodingRun(
        sequences=torch.cat([prompt, torch.zeros(prompt.shape[0], max_new_tokens, dtype=torch.long)], 1),
        prompt_length=prompt.shape[1], max_new_tokens=max_new_tokens, chooser=TokenChooser(),
        stop=StopRule(None), pad_id=0,
    )
    session = StackSession(model, prompt.shape[0], prompt.shape[1] + max_new_tokens)
    with torch.inference_mode():
        logits = session.extend(prompt, last_only=True)[:, -1]
        return beam_search(session, run, logits, num_beams, **options)


def test_beam_search_with_one_beam_is_greedy():
    model = nano()
    prompt = torch.randint(0, 64, (3, 4))
    sequences, scores = run_beam_search(model, prompt, 9, num_beams=1)
    assert torch.equal(sequences, tformer.generate(model, prompt, 9, eos_token_id=[]))
    with torch.no_grad():
        log_probs = model(sequences).logits.log_softmax(-1)[:, 3:-1].gather(-1, sequences[:, 4:, None])
    torch.testing.assert_close(scores, log_probs.sum((1, 2)) / 9)


@pytest.mark.parametrize("length_penalty", [1.0, 0.0])
def test_beam_search_with_enough_beams_finds_the_most_probable_sequence(length_penalty):
    vocab, new = 5, 3
    model = nano(vocab_size=vocab, initializer_range=0.5)  # peaked, far from uniform
    prompt = torch.tensor([[1, 3]])
    continuations = torch.tensor(list(itertools.product(range(vocab), repeat=new)))  # every possible one
    sequences = torch.cat([prompt.expand(len(continuations), -1), continuations], 1)
    with torch.no_grad():
        log_probs = model(sequences).logits.log_softmax(-1)[:, 1:-1].gather(-1, sequences[:, 2:, None]).sum((1, 2))
    best = int(log_probs.argmax())
    found = tformer.generate(model, prompt, new, num_beams=vocab ** (new - 1), eos_token_id=[],
                             length_penalty=length_penalty, return_dict=True)
    assert torch.equal(found.sequences[0], sequences[best])
    torch.testing.assert_close(found.sequences_scores[0], log_probs[best] / new**length_penalty)


def reference_beam_search(model, prompt, max_new_tokens, num_beams, length_penalty, eos_ids):
    """Beam search from its definition, one prompt, every step a full forward pass of every beam
    (no cache): the best ``K = max(2, 1 + len(eos_ids)) * num_beams`` continuations are ranked by
    summed log-probability; one that ends (an end id, or the last step) among the top ``num_beams``
    becomes a hypothesis scored ``sum / generated ** length_penalty``; the best ``num_beams``
    continuations that do not end run on. It never stops early, which is what
    ``early_stopping="never"`` promises when the length penalty is positive: a running beam's
    score can only fall, so its best reachable score is its sum over the longest length.
    Returns the ``num_beams`` best (score, token list), best first."""
    keep = max(2, 1 + len(eos_ids)) * num_beams
    running, hypotheses = [(0.0, list(prompt))], []
    for generated in range(1, max_new_tokens + 1):
        candidates = []
        for score, sequence in running:
            with torch.no_grad():
                log_probs = model(torch.tensor([sequence])).logits[0, -1].float().log_softmax(-1).tolist()
            candidates += [(score + log_prob, sequence + [token]) for token, log_prob in enumerate(log_probs)]
        candidates = sorted(candidates, key=lambda candidate: -candidate[0])[:keep]
        running = []
        for rank, (total, sequence) in enumerate(candidates):
            if sequence[-1] in eos_ids or generated == max_new_tokens:
                if rank < num_beams:
                    hypotheses.append((total / generated**length_penalty, sequence))
            elif len(running) < num_beams:
                running.append((total, sequence))
        hypotheses = sorted(hypotheses, key=lambda hypothesis: -hypothesis[0])[:num_beams]
    return hypotheses


@pytest.mark.parametrize("seed, length_penalty", [(0, 2.0), (5, 0.5)])
def test_beam_search_never_stopping_early_equals_the_exhaustive_reference(seed, length_penalty):
    """A batch of two prompts whose beams reorder every step (so a cache that reorders only its
    keys is caught), with end ids common enough that hypotheses fill up early and a longer one
    found later still wins (so a bound on the running beams taken at the current length, which
    stops too soon, is caught)."""
    vocab, new, num_beams, returned, eos = 12, 8, 3, 2, [1, 2, 3, 4]
    torch.manual_seed(seed)
    model = nano(vocab_size=vocab, initializer_range=1.0)
    prompts = torch.randint(0, vocab, (2, 3), generator=torch.Generator().manual_seed(seed))
    out = tformer.generate(model, prompts, new, num_beams=num_beams, length_penalty=length_penalty,
                           early_stopping="never", eos_token_id=eos, pad_token_id=0,
                           num_return_sequences=returned, return_dict=True)
    for row, prompt in enumerate(prompts.tolist()):
        expected = reference_beam_search(model, prompt, new, num_beams, length_penalty, eos)[:returned]
        for rank, (score, sequence) in enumerate(expected):
            got = out.sequences[row * returned + rank].tolist()
            assert got == sequence + [0] * (len(got) - len(sequence)), (row, rank)  # then padding
            assert out.sequences_scores[row * returned + rank].item() == pytest.approx(score, rel=1e-5, abs=1e-6)


def test_beam_search_returns_its_best_sequences_in_order():
    model = nano()
    out = tformer.generate(model, torch.randint(0, 64, (2, 3)), 6, num_beams=4, num_return_sequences=3,
                           eos_token_id=[], return_dict=True)
    assert out.sequences.shape == (6, 9)
    assert torch.all(out.sequences_scores.view(2, 3).diff(dim=1) <= 0)
    assert len({tuple(row) for row in out.sequences[:3].tolist()}) == 3


# ---- sampling --------------------------------------------------------------------------------


def allowed_by_top_k(logits, k):
    return logits >= logits.topk(k, dim=-1).values[:, -1:]


def allowed_by_top_p(logits, p):
    """Reference nucleus: sort, keep tokens until the kept mass reaches p (at least one)."""
    allowed = torch.zeros_like(logits, dtype=torch.bool)
    for row in range(logits.shape[0]):
        mass = 0.0
        for token in logits[row].softmax(-1).argsort(descending=True).tolist():
            allowed[row, token] = True
            mass += float(logits[row].softmax(-1)[token])
            if mass >= p:
                break
    return allowed


@pytest.mark.parametrize("option, allowed_set", [
    (dict(top_k=3), lambda logits: allowed_by_top_k(logits, 3)),
    (dict(top_p=0.6), lambda logits: allowed_by_top_p(logits, 0.6)),
    (dict(top_k=5, top_p=0.5, temperature=0.7), lambda logits: allowed_by_top_k(logits, 5)
     & allowed_by_top_p(allowed_by_top_k(logits, 5).float().log() + logits / 0.7, 0.5)),
])
def test_top_k_and_top_p_never_sample_outside_their_set(option, allowed_set):
    model = nano(vocab_size=32, initializer_range=0.3)
    prompts = torch.randint(0, 32, (48, 3))
    out = tformer.generate(model, prompts, 6, seed=11, eos_token_id=[], **option)
    with torch.no_grad():
        logits = model(out[:, :-1]).logits[:, 2:]  # the distribution each new token was drawn from
    allowed = allowed_set(logits.reshape(-1, 32)).view(48, 6, 32)
    chosen = allowed.gather(-1, out[:, 3:, None]).squeeze(-1)
    assert chosen.all(), f"{int((~chosen).sum())} of {chosen.numel()} draws outside the allowed set"
    assert (allowed.sum(-1) > 1).any()  # the sets are real choices, not just the argmax


def test_sampling_is_reproducible_with_a_seed_and_greedy_at_the_limits():
    model = nano()
    prompt = torch.randint(0, 64, (1, 3))
    a = tformer.generate(model, prompt, 20, temperature=1.5, seed=3)
    assert torch.equal(a, tformer.generate(model, prompt, 20, temperature=1.5, seed=3))
    assert not torch.equal(a, tformer.generate(model, prompt, 20, temperature=1.5, seed=4))
    greedy = tformer.generate(model, prompt, 10)
    assert torch.equal(tformer.generate(model, prompt, 10, do_sample=True, top_k=1, seed=0), greedy)
    assert torch.equal(tformer.generate(model, prompt, 10, temperature=0.0, top_p=0.9), greedy)


def test_several_samples_per_prompt():
    model = nano()
    out = tformer.generate(model, torch.randint(0, 64, (2, 3)), 8, do_sample=True, num_return_sequences=4, seed=0)
    assert out.shape == (8, 11)
    assert len({tuple(row) for row in out[:4, 3:].tolist()}) > 1


# ---- ending: end-of-sequence ids, min_new_tokens, stop strings -------------------------------


def test_rows_end_at_any_end_id_and_are_padded_after():
    model = nano()
    prompt = torch.randint(0, 64, (4, 3))
    free = tformer.generate(model, prompt, 15, eos_token_id=[])
    ends = sorted({int(free[0, 5]), int(free[1, 8])})  # tokens rows 0 and 1 produce anyway
    out = tformer.generate(model, prompt, 15, eos_token_id=ends, pad_token_id=60)
    for row in range(4):
        new = out[row, 3:].tolist()
        hits = [i for i, token in enumerate(new) if token in ends]
        if hits:
            assert all(token == 60 for token in new[hits[0] + 1:])
            assert new[: hits[0]] == free[row, 3 : 3 + hits[0]].tolist()
        else:
            assert new == free[row, 3 : 3 + len(new)].tolist()
    if all(any(t in ends for t in out[row, 3:].tolist()) for row in range(4)):
        assert out.shape[1] < 18  # everyone finished: generation stopped early


def test_min_new_tokens_forbids_an_early_end():
    model = nano()
    prompt = torch.randint(0, 64, (1, 3))
    first = int(tformer.generate(model, prompt, 1)[0, 3])
    assert tformer.generate(model, prompt, 10, eos_token_id=first).shape[1] == 4
    late = tformer.generate(model, prompt, 10, eos_token_id=first, min_new_tokens=6)
    assert late.shape[1] >= 3 + 6
    assert first not in late[0, 3:9].tolist()


def test_stop_strings_end_generation_once_the_text_contains_them():
    tokenizer = CharTokenizer.train("abcdefgh ")
    model = nano(vocab_size=tokenizer.vocab_size)
    model.tokenizer = tokenizer
    prompt = torch.tensor([tokenizer.encode("ab")])
    free_text = tokenizer.decode(tformer.generate(model, prompt, 20, eos_token_id=[])[0, 2:].tolist())
    stop = free_text[4:6]
    out = tformer.generate(model, prompt, 20, eos_token_id=[], stop_strings=[stop, "zzz-never"])
    text = tokenizer.decode(out[0, 2:].tolist())
    assert text.endswith(stop) and stop not in text[:-1] and free_text.startswith(text)
    with pytest.raises(GenerationError, match="stop_strings need a tokenizer"):
        tformer.generate(nano(), prompt, 5, stop_strings="x")


# ---- streaming and results -------------------------------------------------------------------


def test_streaming_yields_the_tokens_as_they_come():
    model = nano()
    prompt = torch.randint(0, 64, (2, 4))
    expected = tformer.generate(model, prompt, 9)
    stream = stream_generate(model, prompt, 9)
    chunks = list(stream)
    assert len(chunks) == 9 and all(chunk.shape == (2, 1) for chunk in chunks)
    assert torch.equal(torch.cat([prompt, *chunks], 1), expected)
    assert torch.equal(stream.output.sequences, expected)
    received = []
    tformer.generate(model, prompt, 9, streamer=received.append)
    assert torch.equal(torch.cat(received, 1), expected[:, 4:])
    assert torch.is_grad_enabled()  # the stream's inference mode does not leak into the caller
    training = tformer.build_model("gpt-nano", dropout=0.5)
    early = stream_generate(training, prompt, 9)
    next(early)
    assert training.training  # the caller's model stays as it is: its decoding view runs in eval mode
    early.close()
    assert training.training and early.output.sequences.shape == (2, 5)
    whole = torch.cat([prompt, *stream_generate(training, prompt, 9)], 1)
    assert torch.equal(whole, tformer.generate(training.eval(), prompt, 9))  # decoded without dropout


def test_text_streamer_prints_the_new_text():
    tokenizer = CharTokenizer.train("hello world")
    model = nano(vocab_size=tokenizer.vocab_size)
    printed = io.StringIO()
    streamer = TextStreamer(tokenizer, file=printed)
    out = tformer.generate(model, torch.tensor([tokenizer.encode("he")]), 12, streamer=streamer)
    assert printed.getvalue() == tokenizer.decode(out[0, 2:].tolist()) == streamer.text


def test_scores_are_what_each_token_was_chosen_from():
    model = nano()
    prompt = torch.randint(0, 64, (2, 3))
    out = tformer.generate(model, prompt, 7, output_scores=True)
    assert len(out.scores) == 7 and out.scores[0].shape == (2, 64)
    assert torch.equal(torch.stack(out.scores, 1).argmax(-1), out.sequences[:, 3:])
    with torch.no_grad():
        torch.testing.assert_close(torch.stack(out.scores, 1), model(out.sequences[:, :-1]).logits[:, 2:],
                                   rtol=1e-5, atol=1e-5)


def test_generation_restores_training_mode_and_zero_new_tokens_returns_the_prompt():
    model = tformer.build_model("gpt-nano", dropout=0.5)
    prompt = torch.randint(0, 64, (1, 3))
    assert model.training
    assert torch.equal(tformer.generate(model, prompt, 5), tformer.generate(model, prompt, 5))  # no dropout
    assert model.training
    assert torch.equal(tformer.generate(model, prompt, 0), prompt)


# ---- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize("arguments, message", [
    (dict(max_new_tokens=-1), "max_new_tokens=-1 must be an integer >= 0"),
    (dict(temperature=-0.5), "temperature=-0.5 must be a number >= 0"),
    (dict(top_k=0), "top_k=0 must be an integer >= 1"),
    (dict(top_p=1.5), r"top_p=1.5 must be a number in \(0, 1\]"),
    (dict(min_new_tokens=9, max_new_tokens=4), "min_new_tokens=9 exceeds max_new_tokens=4"),
    (dict(eos_token_id=64), r"eos_token_id=64: 64 is not a token id in \[0, 64\)"),
    (dict(num_beams=2, do_sample=True), "cannot be combined with num_beams > 1"),
    (dict(num_beams=2, num_return_sequences=3), "num_return_sequences=3 exceeds num_beams=2"),
    (dict(num_return_sequences=2), "greedy decoding has one answer"),
    (dict(early_stopping="sometimes"), "early_stopping='sometimes' must be True, False or 'never'"),
    (dict(streamer=3), "streamer must be callable"),
    (dict(max_new_tokens=70), "exceeds max_seq_len=64"),
    (dict(input_ids=torch.tensor([[1, 64]])), r"token id 64 in input_ids is outside the vocabulary \[0, 64\)"),
    (dict(input_ids=torch.zeros(2, 0, dtype=torch.long)), r"shape \(batch, length >= 1\)"),
    (dict(attention_mask=torch.tensor([[1, 0, 1]])), "row 0 is not left-padded"),
    (dict(attention_mask=torch.ones(1, 2)), "attention_mask must have the shape of input_ids"),
])
def test_bad_arguments_are_one_clear_error(arguments, message):
    arguments = {"input_ids": torch.tensor([[1, 2, 3]]), "max_new_tokens": 4, **arguments}
    with pytest.raises(GenerationError, match=message):
        tformer.generate(nano(), **arguments)
    assert "\n" not in message


def test_streaming_beam_search_is_refused():
    with pytest.raises(GenerationError, match="streaming needs num_beams=1"):
        stream_generate(nano(), torch.tensor([[1, 2]]), 4, num_beams=2)


def test_every_probability_on_the_way_is_finite():
    model = nano(vocab_size=8, initializer_range=2.0)  # huge logits: no NaN or inf must appear
    out = tformer.generate(model, torch.randint(0, 8, (3, 2)), 6, temperature=0.05, top_p=0.3, output_scores=True,
                           seed=0)
    assert all(math.isfinite(float(s.max())) for s in out.scores)


@pytest.mark.parametrize("every", [5, 7])
def test_reading_the_ends_every_few_steps_gives_what_reading_every_step_gives(monkeypatch, every):
    """A GPU reads whether every row has ended only every few steps (``END_CHECK_EVERY``): the steps made after the
    last row ended are taken back, so the sequences and scores are those of a read at every step."""
    from tformer.generation import autoregressive

    torch.manual_seed(0)
    model = nano(initializer_range=0.3)
    ids = torch.tensor([[5, 9, 3, 2], [7, 1, 2, 8], [13, 4, 4, 6]])
    free = tformer.generate(model, ids, 30, eos_token_id=[])[:, 4:]
    # an end id every row makes, first at different steps, the last of them well before the limit
    firsts = {token: [row.tolist().index(token) for row in free] for token in range(64)
              if all(token in row.tolist() for row in free)}
    end = min((token for token, steps in firsts.items() if len(set(steps)) > 1), key=lambda token: max(firsts[token]))
    options = dict(eos_token_id=[end], output_scores=True, return_dict=True)
    expected = tformer.generate(model, ids, 30, **options)
    assert expected.sequences.shape[1] - 4 == max(firsts[end]) + 1 < 30
    assert (max(firsts[end]) + 1) % every  # the run ends between two reads: steps are taken back
    monkeypatch.setitem(autoregressive.END_CHECK_EVERY, "cpu", every)
    got = tformer.generate(model, ids, 30, **options)
    assert torch.equal(got.sequences, expected.sequences) and len(got.scores) == len(expected.scores)
    assert all(torch.equal(a, b) for a, b in zip(got.scores, expected.scores, strict=True))
