"""``tformer serve BASE --adapter NAME=DIR ...`` through the real ``openai`` client: several LoRA adapters on one
base, a request's ``model`` choosing one (the base by its own name); 16 concurrent requests mixing the base and two
adapters each equal ``tformer.generate`` with that adapter loaded alone; an unknown name is a 404 listing the
served ones; the prefix cache never shares blocks across adapters; /v1/models lists them; an adapter for another
base is refused at start-up in one line (exit 2)."""

import concurrent.futures
import re

import pytest
import torch
from test_serving_server import ServerThread, checkpoint, generated  # noqa: F401 (checkpoint: the fixture)

import tformer
from tformer.adapters import add_lora, load_adapter, lora_layers, save_adapter
from tformer.cli import main

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.slow  # the openai client against a server with its engine in a process

ADAPTERS = {"poet": ["attention"], "clerk": "all-linear"}  # name -> targets
PROMPT = "ROMEO: to be or not to be, that is the question."  # 48 characters: 6 full blocks of 8


def trained_adapter(folder, model_folder, targets, seed):
    """An adapter over the checkpoint's model with B drawn at random (a zero B would change nothing)."""
    model = add_lora(tformer.load(model_folder), rank=4, alpha=8, targets=targets)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in lora_layers(model).values():
            for b in layer.lora_B:
                b.copy_(torch.randn(b.shape, generator=generator) * 0.5)
    return save_adapter(model, folder)


@pytest.fixture(scope="module")
def adapter_folders(checkpoint, tmp_path_factory):  # noqa: F811
    root = tmp_path_factory.mktemp("adapters")
    return {name: str(trained_adapter(root / name, checkpoint, targets, seed))
            for seed, (name, targets) in enumerate(ADAPTERS.items())}


@pytest.fixture(scope="module")
def alone(checkpoint, adapter_folders):  # noqa: F811
    """Each served name's model on its own: the base, and the base with one adapter loaded."""
    return {"tiny": tformer.load(checkpoint), **{name: load_adapter(tformer.load(checkpoint), folder).eval()
                                                 for name, folder in adapter_folders.items()}}


@pytest.fixture(scope="module")
def server(checkpoint, adapter_folders):  # noqa: F811
    server = ServerThread(checkpoint, "process", cache_tokens=4096, block_size=8, adapters=adapter_folders)
    yield server
    server.stop()


def test_mixed_concurrent_requests_each_equal_generate_with_its_adapter_alone(server, alone):
    tokenizer = server.model.tokenizer
    generator = torch.Generator().manual_seed(0)
    names = ["tiny", "poet", "clerk"]
    prompts = [torch.randint(0, tokenizer.vocab_size, (3 + index * 5 % 23,), generator=generator).tolist()
               for index in range(16)]
    client = server.client()

    def ask(index):
        answer = client.completions.create(model=names[index % 3], prompt=prompts[index], max_tokens=12,
                                           temperature=0, extra_body={"ignore_eos": True})
        return answer.model, answer.choices[0].text

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(ask, range(16)))
    for index, (model, text) in enumerate(answers):
        name = names[index % 3]
        assert model == name
        assert text == generated(alone[name], prompts[index], max_new_tokens=12), name
    texts = {name: generated(alone[name], prompts[0], max_new_tokens=12) for name in names}
    assert len(set(texts.values())) == 3  # the adapters change the answer: the test can tell them apart
    chat = client.chat.completions.create(model="clerk", messages=[{"role": "user", "content": "to be"}],
                                          max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
    rendered = tokenizer.encode("user: to be\nassistant:", add_special_tokens=False)
    assert chat.model == "clerk" and chat.choices[0].message.content == generated(alone["clerk"], rendered,
                                                                                  max_new_tokens=8)
    server.wait_idle()


def test_an_unknown_model_is_a_404_naming_the_served_ones_and_the_server_keeps_serving(server):
    client = server.client()
    with pytest.raises(openai.NotFoundError, match="model 'painter' does not exist; this server serves 'tiny', "
                                                   "'poet', 'clerk'"):
        client.completions.create(model="painter", prompt="to")
    with pytest.raises(openai.BadRequestError, match="'poet' is a LoRA adapter, which serves completions"):
        client.embeddings.create(model="poet", input="to be")
    assert client.completions.create(model="poet", prompt="to", max_tokens=2).usage.completion_tokens >= 1


def test_models_lists_the_base_and_every_adapter(server):
    listed = server.client().models.list().data
    assert [(model.id, model.parent) for model in listed] == [("tiny", None), ("poet", "tiny"), ("clerk", "tiny")]


def test_the_prefix_cache_is_not_shared_across_adapters(server, alone):
    client = server.client()
    options = dict(prompt=PROMPT, max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
    ids = server.model.tokenizer.encode(PROMPT)
    texts = {}
    for name in ("poet", "clerk", "tiny"):
        before = server.stats().prefix_cache_hit_tokens
        texts[name] = client.completions.create(model=name, **options).choices[0].text
        assert server.stats().prefix_cache_hit_tokens == before  # no block computed for another adapter is reused
        assert texts[name] == generated(alone[name], ids, max_new_tokens=8), name
    assert len(set(texts.values())) == 3
    before = server.stats().prefix_cache_hit_tokens
    again = client.completions.create(model="poet", **options).choices[0].text
    assert again == texts["poet"] and server.stats().prefix_cache_hit_tokens == before + 40  # its own blocks are
    server.wait_idle()


def test_an_adapter_for_another_base_is_refused_at_start_up(checkpoint, adapter_folders, tmp_path, capsys):  # noqa: F811
    torch.manual_seed(0)
    llama = tformer.build_model("llama-small", vocab_size=96, d_model=64, num_layers=2, num_heads=4)
    save_adapter(add_lora(llama, rank=4, targets=["q_proj"]), tmp_path / "llama")
    narrow = tformer.build_model("gpt-nano", d_model=64, num_heads=4)
    save_adapter(add_lora(narrow, rank=4, targets=["attention"]), tmp_path / "narrow")
    cases = [("process", f"other={tmp_path / 'llama'}", "adapter 'other': .*an adapter for LlamaForCausalLM; this "
                                                        "model is GPT2LMHeadModel"),
             ("thread", f"other={tmp_path / 'narrow'}",
              r"adapter 'other': .*is \(4, 64\) float32, this model needs \(4, 32\)"),
             ("thread", f"tiny={adapter_folders['poet']}", "the name 'tiny' is the base model's name"),
             ("thread", "poet", "--adapter 'poet' must be NAME=DIR"),
             ("thread", f"x={tmp_path}", "no adapter_config.json in")]
    for engine, option, message in cases:
        assert main(["serve", str(checkpoint), "--model-name", "tiny", "--port", "0", "--engine", engine,
                     "--adapter", f"poet={adapter_folders['poet']}", "--adapter", option]) == 2
        error = capsys.readouterr().err
        assert len(error.strip().splitlines()) == 1 and re.search(message, error), error
