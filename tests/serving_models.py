"""The small decoders the serving tests run, and what ``generate`` decodes for a prompt alone."""

import torch

import tformer

VOCAB = 61


def small_model(**overrides):
    settings = dict(vocab_size=VOCAB, max_seq_len=96, d_model=48, num_layers=2, num_heads=4)
    settings.update(overrides)
    torch.manual_seed(0)
    model = tformer.build_model("gpt-nano", **settings).eval()
    with torch.no_grad():  # biases start at zero; a path that forgot one would go unseen
        for name, parameter in model.named_parameters():
            if name.endswith("bias"):
                parameter.normal_(0, 0.1)
    return model


def alone(model, prompt, config):
    """The new tokens ``generate`` gives ``prompt`` alone (an encoder-decoder's after its decoder's start token)."""
    output = tformer.generate(model, torch.tensor([prompt]), generation_config=config)[0]
    return output[1 if model.encodes_prompt else len(prompt):].tolist()


def assert_distributions_are_generates(model, prompt, config, events):
    """Every step's log-probabilities over the whole vocabulary, as served (``events`` of a request asking for
    ``logprobs`` of every token), are ``generate``'s for ``prompt`` alone."""
    expected = tformer.generate(model, torch.tensor([prompt]), generation_config=config, output_scores=True)
    assert len(events) == len(expected.scores)
    vocab = model.config.vocab_size
    for event, scores in zip(events, expected.scores, strict=True):
        served = torch.empty(vocab)
        for token, logprob in event.top_logprobs:
            served[token] = logprob
        torch.testing.assert_close(served, torch.log_softmax(scores[0].float(), -1), atol=2e-5, rtol=1e-5)


def assert_two_waves_decode_as_generate(model, engine, first, later, config, steps_between):
    """The prompts ``first`` submitted, ``steps_between`` steps run, then ``later`` joining a batch already decoding:
    every request's tokens and every step's distribution over the whole vocabulary are ``generate``'s alone."""
    prompts = first + later
    events = [[] for _ in prompts]
    vocab = model.config.vocab_size

    def submit(index):
        return engine.submit(prompts[index], config, logprobs=vocab, on_event=events[index].append)

    requests = [submit(index) for index in range(len(first))]
    for _ in range(steps_between):
        engine.step()
    requests += [submit(index) for index in range(len(first), len(prompts))]
    engine.run_until_idle()
    for prompt, request, received in zip(prompts, requests, events, strict=True):
        assert request.outputs()[0] == alone(model, prompt, config)
        assert_distributions_are_generates(model, prompt, config, received)
