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
    return tformer.generate(model, torch.tensor([prompt]), generation_config=config)[0, len(prompt):].tolist()
