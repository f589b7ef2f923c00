"""Scoring through ``tformer serve``: /v1/completions with ``echo`` and ``logprobs`` returns the prompt's
log-probabilities (what evaluation clients rank continuations by) equal to the model's own forward, batched
and by token ids; the tokenizer routes; and lm-evaluation-harness end to end against the CLI server, whose
accuracy must be the one computed here from the model's forward (a server that ignored ``echo`` would leave
every log-likelihood task at chance).

The model is a small decoder trained here for a second on a handful of facts ("alice likes apples."), with a
byte-level BPE tokenizer saved as a Hugging Face folder, so lm_eval's Hugging Face tokenizer loads it offline."""

import http.client
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from python_path import child_python_path
from test_text_offsets import POOL as MULTILINGUAL
from test_text_offsets import check_offsets

import tformer
from tformer.tokenizers import BPETokenizer
from tformer.tokenizers.byte_level import BYTE_TO_CHAR
from tformer.tokenizers.chat_template import ChatTemplate

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")

pytestmark = pytest.mark.slow  # a server process (and lm_eval in another)

ROOT = Path(__file__).resolve().parents[2]
NAMES = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi"]
FRUITS = ["apples", "bananas", "cherries", "dates", "figs", "grapes", "kiwis", "lemons"]
UNSEEN = ["ivan", "judy", "mallory", "oscar"]  # names never trained on: the model's choice there is its own
TEMPLATE = ("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}bot:{% endif %}")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A Hugging Face folder (config.json, model.safetensors, tokenizer.json, a chat template) of a decoder that
    learned the facts: one token per byte, no merges (the 256 byte tokens)."""
    tokenizer = BPETokenizer({char: byte for byte, char in enumerate(BYTE_TO_CHAR)}, [])
    torch.manual_seed(0)
    model = tformer.build_model("gpt-nano", vocab_size=256, max_seq_len=64, d_model=64, num_layers=2, num_heads=4)
    facts = [tokenizer.encode(f"{name} likes {fruit}.") for name, fruit in zip(NAMES, FRUITS, strict=True)]
    longest = max(len(ids) for ids in facts)
    inputs = torch.tensor([ids + [0] * (longest - len(ids)) for ids in facts])  # (8, T)
    labels = torch.tensor([ids + [-100] * (longest - len(ids)) for ids in facts])
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(150):
        loss = model(inputs, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval().tokenizer = tokenizer
    path = tmp_path_factory.mktemp("scoring") / "facts"
    model.save(path, format="hf")
    (path / "chat_template.jinja").write_text(TEMPLATE)
    return path


@pytest.fixture(scope="module")
def model(folder):
    return tformer.load(folder)


@pytest.fixture(scope="module")
def port(folder):
    """``tformer serve`` on the folder, in a process of its own."""
    process = subprocess.Popen([sys.executable, "-m", "tformer", "serve", str(folder), "--port", "0", "--threads", "1",
                                "--block-size", "8"], cwd=ROOT, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": child_python_path()})
    line = process.stderr.readline()
    assert "listening on http://" in line, line + process.stderr.read()
    yield int(line.split("http://", 1)[1].split()[0].rsplit(":", 1)[1])
    process.terminate()
    assert process.wait(timeout=60) == 0


def request(port, method, path, body=None):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    connection.request(method, path, body=data, headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    return response.status, json.loads(response.read())


def client(port):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=60)


def log_softmax(model, ids):
    """(T, V) the model's own forward over ``ids``: row i scores the token after position i."""
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)


def continuation_logprob(model, context, continuation):
    """log p(continuation | context) summed over its tokens, as lm_eval scores a choice."""
    tokenizer = model.tokenizer
    context_ids, ids = tokenizer.encode(context), tokenizer.encode(context + continuation)
    rows = log_softmax(model, ids)
    return sum(float(rows[i - 1, ids[i]]) for i in range(len(context_ids), len(ids)))


def test_echo_returns_each_prompt_tokens_log_probability_as_the_models_forward(port, model):
    tokenizer = model.tokenizer
    prompts = [tokenizer.encode(text) for text in ("alice likes apples.", "dave", "b", "grace likes k")]
    response = client(port).completions.create(model="facts", prompt=prompts, echo=True, logprobs=3, max_tokens=0)
    assert [choice.index for choice in response.choices] == [0, 1, 2, 3]
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (sum(map(len, prompts)), 0)
    for ids, choice in zip(prompts, response.choices, strict=True):
        logprobs, expected = choice.logprobs, log_softmax(model, ids)
        texts = [tokenizer.decode([token]) for token in ids]
        assert choice.text == tokenizer.decode(ids) and choice.finish_reason == "length"
        assert logprobs.tokens == texts
        assert logprobs.text_offset == [sum(len(text) for text in texts[:i]) for i in range(len(ids))]
        assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
        assert logprobs.token_logprobs[1:] == pytest.approx([float(expected[i - 1, ids[i]])
                                                             for i in range(1, len(ids))], abs=1e-5)
        for row, top in enumerate(logprobs.top_logprobs[1:]):
            best = torch.topk(expected[row], 3)
            assert list(top) == [tokenizer.decode([token]) for token in best.indices.tolist()]
            assert list(top.values()) == pytest.approx(best.values.tolist(), abs=1e-5)


def test_echo_with_a_new_token_follows_the_prompt_in_text_and_logprobs(port, model):
    tokenizer = model.tokenizer
    prompt = "carol likes"
    response = client(port).completions.create(model="facts", prompt=prompt, echo=True, logprobs=1, max_tokens=1,
                                               temperature=0)
    choice = response.choices[0]
    ids = tokenizer.encode(prompt)
    expected = log_softmax(model, ids)[-1]
    new = int(expected.argmax())
    assert choice.text == prompt + tokenizer.decode([new])
    assert len(choice.logprobs.tokens) == len(ids) + 1
    assert choice.logprobs.text_offset[-1] == len(prompt)
    assert choice.logprobs.token_logprobs[-1] == pytest.approx(float(expected[new]), abs=1e-5)
    assert choice.logprobs.top_logprobs[-1] == {tokenizer.decode([new]): choice.logprobs.token_logprobs[-1]}


def test_the_known_answer_wins_by_the_servers_logprobs_as_in_process(port, model):
    """The trained fact ("alice likes apples") against a fruit of another name: the server's summed continuation
    log-probabilities (lm_eval's reading: echo, one new token, entries ctxlen .. -1) equal the model's own
    and prefer the fact by a wide margin."""
    tokenizer = model.tokenizer
    context = tokenizer.encode("alice likes")
    choices = [tokenizer.encode("alice likes" + ending) for ending in (" apples", " dates")]
    response = client(port).completions.create(model="facts", prompt=choices, echo=True, logprobs=1, max_tokens=1,
                                               temperature=0)
    served = [sum(choice.logprobs.token_logprobs[len(context) : -1]) for choice in response.choices]
    in_process = [continuation_logprob(model, "alice likes", ending) for ending in (" apples", " dates")]
    assert served == pytest.approx(in_process, abs=1e-4)
    assert served[0] > served[1] + 5


def test_an_echoed_stream_starts_each_choice_with_its_prompt(port):
    body = {"model": "facts", "prompt": ["bob likes", "erin"], "echo": True, "logprobs": 2, "max_tokens": 3,
            "temperature": 0, "n": 2}
    status, whole = request(port, "POST", "/v1/completions", body)
    assert status == 200
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.request("POST", "/v1/completions", body=json.dumps({**body, "stream": True}),
                       headers={"Content-Type": "application/json"})
    chunks = [json.loads(line[6:]) for line in connection.getresponse()
              if line.startswith(b"data: ") and line.strip() != b"data: [DONE]"]
    for choice in whole["choices"]:
        own = [chunk["choices"][0] for chunk in chunks if chunk["choices"][0]["index"] == choice["index"]]
        assert "".join(part["text"] for part in own) == choice["text"]
        assert choice["text"].startswith(body["prompt"][choice["index"] // 2])
        streamed = {field: [entry for part in own if part["logprobs"] for entry in part["logprobs"][field]]
                    for field in ("tokens", "token_logprobs", "top_logprobs", "text_offset")}
        assert streamed["tokens"] == choice["logprobs"]["tokens"]
        assert streamed["text_offset"] == choice["logprobs"]["text_offset"]
        # The same numbers up to float rounding: the two requests' decode steps batch differently.
        assert streamed["token_logprobs"] == pytest.approx(choice["logprobs"]["token_logprobs"], abs=1e-5)
        for mine, theirs in zip(streamed["top_logprobs"], choice["logprobs"]["top_logprobs"], strict=True):
            assert mine == theirs if mine is None else mine == pytest.approx(theirs, abs=1e-5)


def test_text_offsets_index_the_echoed_text_where_tokens_split_characters(port, model):
    """The issue's prompt and random multilingual strings as ids of the byte tokens (every character past ASCII
    split across tokens): each choice's offsets stay within its text, never decrease, and cut it into the text
    of its tokens (test_text_offsets.py checks the rule on a BPE with merges)."""
    tokenizer, rng = model.tokenizer, random.Random(0)
    texts = ["x 😀 ü 日本語 zq🎈", *("".join(rng.choice(MULTILINGUAL) for _ in range(rng.randint(1, 24)))
                                  for _ in range(12))]
    prompts = [tokenizer.encode(text) for text in texts]
    response = client(port).completions.create(model="facts", prompt=prompts, echo=True, logprobs=1, max_tokens=0)
    for text, ids, choice in zip(texts, prompts, response.choices, strict=True):
        assert choice.text == text
        check_offsets(tokenizer, ids, text, choice.logprobs.text_offset)
    assert response.choices[0].logprobs.text_offset[-5:] == [11, 12, 12, 12, 12]  # z, q, then 🎈's 4 bytes
    answer = client(port).completions.create(model="facts", prompt=prompts[0], echo=True, logprobs=1, max_tokens=4,
                                             temperature=0).choices[0]
    assert answer.logprobs.text_offset[len(prompts[0]):][0] == len(texts[0])
    assert max(answer.logprobs.text_offset) <= len(answer.text)


def test_max_tokens_0_only_scores_and_needs_echo_and_logprobs(port):
    for extra in ({}, {"echo": True}, {"logprobs": 2}):
        status, body = request(port, "POST", "/v1/completions",
                               {"model": "facts", "prompt": "bob", "max_tokens": 0, **extra})
        assert (status, body["error"]["param"]) == (400, "max_tokens"), extra
        assert "needs echo=true and logprobs" in body["error"]["message"]
    status, body = request(port, "POST", "/v1/completions", {"model": "facts", "prompt": "bob", "echo": "yes"})
    assert (status, body["error"]["param"]) == (422, "echo")
    for echo, message in ((False, "token id 300 in the prompt is outside the vocabulary"),
                          (True, "prompt 1: token id 300 is out of range")):
        status, body = request(port, "POST", "/v1/completions", {"model": "facts", "prompt": [[98], [98, 300]],
                                                                 "echo": echo, "logprobs": 1, "max_tokens": 1})
        assert status == 400 and message in body["error"]["message"]


def test_tokenize_and_detokenize_round_trip_as_the_completion_routes_encode(port, model):
    tokenizer = model.tokenizer
    status, body = request(port, "POST", "/tokenize", {"model": "facts", "prompt": "frank likes figs"})
    assert status == 200 and body == {"count": 16, "max_model_len": 64, "tokens": tokenizer.encode("frank likes figs")}
    status, back = request(port, "POST", "/detokenize", {"tokens": body["tokens"]})
    assert (status, back) == (200, {"prompt": "frank likes figs"})
    messages = [{"role": "user", "content": "who likes figs?"}]
    for add_generation_prompt in (True, False):
        status, body = request(port, "POST", "/tokenize",
                               {"messages": messages, "add_generation_prompt": add_generation_prompt})
        text = ChatTemplate(TEMPLATE).render(messages, add_generation_prompt)
        assert status == 200 and body["tokens"] == tokenizer.encode(text, add_special_tokens=False)
    chat = client(port).chat.completions.create(model="facts", messages=messages, max_tokens=1)
    assert chat.usage.prompt_tokens == len(tokenizer.encode(ChatTemplate(TEMPLATE).render(messages)))


def test_the_tokenizer_routes_refuse_bad_input_by_field(port):
    refused = [
        ("/tokenize", {"prompt": "a", "messages": [{"role": "user", "content": "a"}]}, 400, "prompt"),
        ("/tokenize", {"model": "facts"}, 400, "messages"),
        ("/tokenize", {"prompt": "a", "add_generation_prompt": True}, 400, "add_generation_prompt"),
        ("/tokenize", {"prompt": "a", "truncate": 3}, 400, "truncate"),
        ("/tokenize", {"prompt": 5}, 422, "prompt"),
        ("/tokenize", {"prompt": "a", "add_special_tokens": "no"}, 422, "add_special_tokens"),
        ("/tokenize", {"messages": []}, 422, "messages"),
        ("/tokenize", {"model": "gpt-4", "prompt": "a"}, 404, "model"),
        ("/detokenize", {"tokens": [97, 256]}, 400, "tokens"),
        ("/detokenize", {"tokens": [97, -1]}, 400, "tokens"),
        ("/detokenize", {"tokens": [97, "b"]}, 422, "tokens.1"),
        ("/detokenize", {"tokens": [97, True]}, 422, "tokens.1"),
        ("/detokenize", {}, 422, "tokens"),
    ]
    for path, body, status, param in refused:
        answer = request(port, "POST", path, body)
        assert (answer[0], answer[1]["error"]["param"]) == (status, param), (path, body, answer)
    assert "out of range" in request(port, "POST", "/detokenize", {"tokens": [256]})[1]["error"]["message"]
    assert request(port, "GET", "/tokenize")[0] == 405


def test_tokenizer_info_describes_the_tokenizer_and_lm_evals_remote_tokenizer_reads_it(port, model):
    status, info = request(port, "GET", "/tokenizer_info")
    assert status == 200 and info == {
        "tokenizer_class": "BPETokenizer", "kind": "bpe", "vocab_size": 256, "bos_token": None, "eos_token": None,
        "pad_token": None, "unk_token": None, "special_tokens": {}, "end_token_ids": [], "chat_template": TEMPLATE,
        "max_model_len": 64}
    utils = pytest.importorskip("lm_eval.utils")
    base_url = f"http://127.0.0.1:{port}/v1/completions"
    assert utils.check_remote_tokenizer_support(base_url)
    remote = utils.RemoteTokenizer(base_url)
    assert remote.encode("heidi likes") == model.tokenizer.encode("heidi likes", add_special_tokens=False)
    assert remote.decode(remote.encode("heidi likes")) == "heidi likes"


# ---- lm-evaluation-harness end to end ------------------------------------------------------------------------

TASK = """task: tformer_facts
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{gold}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""


def facts_items():
    """Four-way choices: the trained names' own fruit among three others (gold at varying places), and unseen
    names (gold 0), where the model's choice is whatever it prefers."""
    items = []
    for index, name in enumerate(NAMES + UNSEEN):
        correct = FRUITS[index % len(FRUITS)]
        others = [fruit for fruit in FRUITS if fruit != correct][(index * 3) % 5 : (index * 3) % 5 + 3]
        gold = index % 4 if name in NAMES else 0
        items.append({"context": f"{name} likes", "choices": [*others[:gold], correct, *others[gold:]], "gold": gold})
    return items


def test_lm_evaluation_harness_accuracy_equals_the_models_own(port, model, folder, tmp_path):
    pytest.importorskip("lm_eval")
    items = facts_items()
    (tmp_path / "facts.jsonl").write_text("".join(json.dumps(item) + "\n" for item in items))
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "tformer_facts.yaml").write_text(TASK.format(data=tmp_path / "facts.jsonl"))
    offline = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "HF_HOME": str(tmp_path / "hf"), "HF_DATASETS_CACHE": str(tmp_path / "hf" / "datasets")}
    command = [sys.executable, "-m", "lm_eval", "run", "--model", "local-completions", "--model_args",
               f"model=facts,base_url=http://127.0.0.1:{port}/v1/completions,tokenized_requests=True,"
               f"tokenizer={folder},tokenizer_backend=huggingface,max_length=64",
               "--batch_size", "8", "--tasks", "tformer_facts", "--include_path", str(tmp_path / "tasks"),
               "--output_path", str(tmp_path / "out"), "--log_samples"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300, env={**os.environ, **offline})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    # In process: each choice's continuation log-probability from the model's own forward, argmax per item.
    scores = [[continuation_logprob(model, item["context"], " " + choice) for choice in item["choices"]]
              for item in items]
    chosen = [max(range(len(row)), key=row.__getitem__) for row in scores]
    accuracy = sum(pick == item["gold"] for pick, item in zip(chosen, items, strict=True)) / len(items)
    assert 0.6 < accuracy < 1  # the trained names right, not every unseen one: neither chance nor trivial
    (results,) = (tmp_path / "out").glob("*/results_*.json")
    assert json.loads(results.read_text())["results"]["tformer_facts"]["acc,none"] == pytest.approx(accuracy)
    (row,) = [line.split("|") for line in run.stdout.splitlines() if line.startswith("|tformer_facts")]
    cells = [cell.strip() for cell in row]
    assert float(cells[cells.index("acc") + 2]) == pytest.approx(accuracy, abs=1e-4)  # the table it printed
    (samples,) = (tmp_path / "out").glob("*/samples_tformer_facts_*.jsonl")
    logged = sorted((json.loads(line) for line in samples.read_text().splitlines()), key=lambda s: s["doc_id"])
    for sample, row in zip(logged, scores, strict=True):
        served = [float(response[0]) for response in sample["filtered_resps"]]
        assert served == pytest.approx(row, abs=1e-4)
        assert max(range(len(served)), key=served.__getitem__) == max(range(len(row)), key=row.__getitem__)
