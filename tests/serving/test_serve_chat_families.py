"""``tformer serve`` on a Qwen2-shaped and a Llama-3-shaped Hugging Face folder, through the real ``openai`` client
(issue 55): the messages rendered by the folder's own chat template (Qwen2.5's ChatML, Llama 3.2's header template
with its ``strftime_now`` date) into the ids ``transformers``' ``apply_chat_template`` gives, and the answer ending
at the family's end-of-turn token (``<|im_end|>``, ``<|eot_id|>``) with finish reason "stop", the token kept out
of the text, the text what ``tformer.generate`` decodes greedily from the same ids.

Nothing is downloaded: each folder is built here, its weights random (transformers' ``Qwen2ForCausalLM`` /
``LlamaForCausalLM`` from small configs, ``save_pretrained``), its tokenizer.json a byte-level BPE laid out as the
family's (trained by ``tokenizers`` on a few lines, with the family's special tokens after the vocabulary), its
tokenizer_config.json and generation_config.json the family's (end-of-turn token, end-id lists). Random weights
never choose the end-of-turn token by themselves, so each folder's output layer (untied, as in Qwen2.5-7B and
Llama-3.1-8B) has the rows of the end-of-turn token and of the greedy reply's ``STOP_AT``-th token swapped: the
reply is then the same tokens up to there, where the end-of-turn token takes that token's place. A server that
ignored the end-of-turn token would go on to ``max_tokens`` (finish reason "length"), as it does with
``ignore_eos``: both are checked.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from python_path import child_python_path

import tformer
from tformer.cli import main
from tformer.generation import GenerationConfig
from tformer.hub import load_tokenizer
from tformer.tokenizers.chat_template import ChatTemplate

openai = pytest.importorskip("openai")
transformers = pytest.importorskip("transformers")
hf = pytest.importorskip("tokenizers")

pytestmark = pytest.mark.slow  # transformers, tokenizers, the openai client and a server process

ROOT = Path(__file__).resolve().parents[2]
STOP_AT = 4  # the end-of-turn token is the reply's 4th token
MAX_TOKENS = 12
MESSAGES = [{"role": "system", "content": "You are a terse assistant. "},
            {"role": "user", "content": "Hello, how are you today? 😀"}]

# Qwen2.5's chat template (ChatML), as its tokenizer_config.json ships it; its tool branches are left out (the
# server refuses tools).
QWEN_TEMPLATE = r"""{%- set default_system = 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' %}
{%- if messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
{%- else %}
    {{- '<|im_start|>system\n' + default_system + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'user' or (message.role == 'system' and not loop.first) or message.role == 'assistant' %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

# Llama 3.2's: the begin-of-text token, a system header with the knowledge cut-off and today's date (transformers
# gives templates ``strftime_now``), ``trim``med contents, ``<|eot_id|>`` after each turn; tool branches left out.
LLAMA_TEMPLATE = r"""{{- bos_token }}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = LLAMA3_PATTERN.replace(r"\p{N}{1,3}", r"\p{N}")
TRAINING = ["You are a terse assistant. Hello, how are you today? I am fine, thank you for asking.\n",
            "The quick brown fox jumps over the lazy dog; 12345 and 3.14.\n",
            "def answer(question: str) -> str:\n    return question.strip()\n",
            "日本語のテキストと中文字符 😀 👍 héllo wörld\n"] * 4


@dataclass
class Family:
    """How one family's folder is laid out: its special tokens (in id order after the vocabulary), the token that
    ends a turn, and its files' fields with token names where ids go."""

    name: str
    pattern: str
    specials: list[str]
    end_of_turn: str
    template: str
    tokenizer_config: dict
    config: dict  # the transformers config's fields; *_token_id fields name tokens
    generation_config: dict | None  # likewise


QWEN2 = Family(
    "qwen2", QWEN2_PATTERN, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], "<|im_end|>", QWEN_TEMPLATE,
    {"tokenizer_class": "Qwen2Tokenizer", "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
     "unk_token": None, "errors": "replace", "split_special_tokens": False, "add_prefix_space": False,
     "clean_up_tokenization_spaces": False, "model_max_length": 131072},
    {"bos_token_id": "<|endoftext|>", "eos_token_id": "<|im_end|>", "rope_theta": 1e6, "use_sliding_window": False},
    {"bos_token_id": "<|endoftext|>", "pad_token_id": "<|endoftext|>", "eos_token_id": ["<|im_end|>", "<|endoftext|>"],
     "do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20},
)
LLAMA3 = Family(
    "llama3", LLAMA3_PATTERN,
    ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
     "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>", "<|start_header_id|>", "<|end_header_id|>",
     "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"],
    "<|eot_id|>", LLAMA_TEMPLATE,
    {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
     "clean_up_tokenization_spaces": True, "model_input_names": ["input_ids", "attention_mask"],
     "model_max_length": 131072},
    {"bos_token_id": "<|begin_of_text|>", "eos_token_id": "<|end_of_text|>", "rope_theta": 500000.0,
     "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 8192}},
    {"bos_token_id": "<|begin_of_text|>", "eos_token_id": ["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"],
     "do_sample": True, "temperature": 0.6, "top_p": 0.9},
)
# A Qwen2 fine-tune saved without generation_config.json, its config.json ending at <|endoftext|>: only
# tokenizer_config.json's eos_token says a turn ends at <|im_end|> (vLLM stops there too).
QWEN2_NO_GENERATION_CONFIG = Family(
    "qwen2-finetune", QWEN2.pattern, QWEN2.specials, QWEN2.end_of_turn, QWEN2.template, QWEN2.tokenizer_config,
    {**QWEN2.config, "eos_token_id": "<|endoftext|>"}, None)
FAMILIES = [QWEN2, LLAMA3, QWEN2_NO_GENERATION_CONFIG]


def _tokenizer(family: Family) -> hf.Tokenizer:
    """A byte-level BPE tokenizer.json as the family's: its Split regex then ByteLevel, its specials after the
    vocabulary (Llama 3: a begin-of-text post-processor; Qwen2: NFC)."""
    split = hf.pre_tokenizers.Sequence([hf.pre_tokenizers.Split(hf.Regex(family.pattern), behavior="isolated"),
                                        hf.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    trainer_tokenizer = hf.Tokenizer(hf.models.BPE())
    trainer_tokenizer.pre_tokenizer = split
    trainer = hf.trainers.BpeTrainer(vocab_size=400, min_frequency=2, show_progress=False,
                                     initial_alphabet=hf.pre_tokenizers.ByteLevel.alphabet())
    trainer_tokenizer.train_from_iterator(TRAINING, trainer)
    trained = json.loads(trainer_tokenizer.to_str())["model"]
    merges = [tuple(merge) for merge in trained["merges"]]
    qwen = family.name.startswith("qwen2")
    tokenizer = hf.Tokenizer(hf.models.BPE(trained["vocab"], merges, fuse_unk=False, ignore_merges=not qwen))
    tokenizer.normalizer = hf.normalizers.NFC() if qwen else None
    tokenizer.pre_tokenizer = split
    tokenizer.decoder = hf.decoders.ByteLevel()
    tokenizer.add_special_tokens([hf.AddedToken(token, normalized=False, special=True) for token in family.specials])
    byte_level = hf.processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    if qwen:
        tokenizer.post_processor = byte_level
    else:
        bos = family.specials[0]
        tokenizer.post_processor = hf.processors.Sequence([byte_level, hf.processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B:1", special_tokens=[(bos, tokenizer.token_to_id(bos))])])
    return tokenizer


def _ids(fields: dict, tokenizer: hf.Tokenizer) -> dict:
    """``fields`` with the token names of its *_token_id entries replaced by their ids."""
    def resolve(value):
        return [resolve(item) for item in value] if isinstance(value, list) else tokenizer.token_to_id(value)
    return {key: resolve(value) if key.endswith("_token_id") else value for key, value in fields.items()}


def _build_folder(family: Family, folder: Path) -> None:
    """The family's folder with random weights whose greedy reply to MESSAGES ends at the end-of-turn token."""
    tokenizer = _tokenizer(family)
    size = tokenizer.get_vocab_size()
    config_class = transformers.Qwen2Config if family.name.startswith("qwen2") else transformers.LlamaConfig
    config = config_class(vocab_size=size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=131072,
                          tie_word_embeddings=False, initializer_range=0.2, **_ids(family.config, tokenizer))
    model_class = transformers.Qwen2ForCausalLM if family.name.startswith("qwen2") else transformers.LlamaForCausalLM
    torch.manual_seed(0)
    model = model_class(config).eval()
    folder.mkdir(parents=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    added = {str(tokenizer.token_to_id(token)): {"content": token, "lstrip": False, "normalized": False,
                                                 "rstrip": False, "single_word": False, "special": True}
             for token in family.specials}
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {**family.tokenizer_config, "added_tokens_decoder": added, "chat_template": family.template}, indent=2))
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    prompt = hf_tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True,
                                              return_dict=False)
    reply = model.generate(torch.tensor([prompt]), max_new_tokens=STOP_AT, do_sample=False, eos_token_id=None,
                           pad_token_id=0)[0, len(prompt):].tolist()
    end = tokenizer.token_to_id(family.end_of_turn)
    assert end not in reply and reply[-1] not in reply[:-1], "the swap would change the reply before its end"
    with torch.no_grad():
        rows = model.lm_head.weight  # untied: the prompt's embeddings stay as they are
        rows[[reply[-1], end]] = rows[[end, reply[-1]]]
    model.save_pretrained(folder)
    if family.generation_config is None:
        (folder / "generation_config.json").unlink(missing_ok=True)
    else:
        (folder / "generation_config.json").write_text(json.dumps(_ids(family.generation_config, tokenizer)))


@pytest.fixture(scope="module", params=FAMILIES, ids=[family.name for family in FAMILIES])
def folder(request, tmp_path_factory) -> tuple[Family, Path]:
    family = request.param
    path = tmp_path_factory.mktemp("chat-families") / family.name
    _build_folder(family, path)
    return family, path


@pytest.fixture(scope="module")
def qwen2_folder(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("chat-refusals") / "qwen2"
    _build_folder(QWEN2, path)
    return path


class Served:
    """``tformer serve FOLDER --port 0`` as a subprocess (its engine in a process of its own, the default), its
    port read from the line it prints when it listens."""

    def __init__(self, folder: Path, log: Path) -> None:
        self.log = log
        with log.open("w") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tformer", "serve", str(folder), "--port", "0", "--threads", "1",
                 "--cache-tokens", "2048", "--model-name", "chat"],
                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr,
                env={**os.environ, "PYTHONPATH": child_python_path()})
        deadline = time.monotonic() + 60
        while "listening on http://" not in (text := log.read_text()):
            assert self.process.poll() is None and time.monotonic() < deadline, f"serve did not start:\n{text}"
            time.sleep(0.05)
        line = next(line for line in text.splitlines() if "listening on http://" in line)
        self.port = int(line.split("http://", 1)[1].split()[0].rsplit(":", 1)[1])
        self.client = openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="unused", max_retries=0,
                                    timeout=60)

    def post(self, path: str, body: dict) -> tuple[int, dict]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        connection.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, json.loads(response.read())

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture(scope="module")
def served(folder, tmp_path_factory):
    family, path = folder
    server = Served(path, tmp_path_factory.mktemp("logs") / f"{family.name}.log")
    yield family, path, server
    server.stop()


def _expected(path: Path, family: Family, prompt: list[int]) -> tuple[list[int], str]:
    """The greedy reply tformer.generate gives for ``prompt`` from the folder, ending at the end-of-turn token
    (the reply's ids with it, the text without it)."""
    model = tformer.load(path)
    end = model.tokenizer.token_to_id(family.end_of_turn)
    config = GenerationConfig(max_new_tokens=MAX_TOKENS, do_sample=False, eos_token_id=(end,))
    reply = tformer.generate(model, torch.tensor([prompt]), generation_config=config)[0, len(prompt):].tolist()
    assert reply[-1] == end and len(reply) == STOP_AT  # the folder's weights end the reply there
    return reply, model.tokenizer.decode(reply[:-1])


def test_the_template_renders_as_transformers_renders_it(folder):
    """tformer's rendering of the folder's template equals apply_chat_template's text and ids, on the request's
    messages and on a longer conversation, with and without the assistant's turn opened."""
    family, path = folder
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    template = ChatTemplate.from_folder(path)
    tokenizer = load_tokenizer(path)
    conversation = [*MESSAGES, {"role": "assistant", "content": "Fine."}, {"role": "user", "content": " And you?\n"}]
    for messages in (MESSAGES, conversation, MESSAGES[1:]):
        for opened in (True, False):
            text = template.render(messages, add_generation_prompt=opened)
            assert text == hf_tokenizer.apply_chat_template(messages, add_generation_prompt=opened, tokenize=False)
            assert tokenizer.encode(text, add_special_tokens=False) == hf_tokenizer.apply_chat_template(
                messages, add_generation_prompt=opened, tokenize=True, return_dict=False)
    if family is LLAMA3:
        assert time.strftime("Today Date: %d %b %Y") in template.render(MESSAGES)  # strftime_now, as transformers


def test_tojson_is_transformers_not_jinjas(qwen2_folder):
    """Templates that print JSON (tool schemas, tool calls) get it unescaped and in key order, as transformers
    gives it (Jinja's own tojson escapes <, >, & and ' and sorts the keys)."""
    template = "{{ messages[0] | tojson }}|{{ messages[0] | tojson(indent=2) }}"
    messages = [{"role": "user", "content": "<b> & 'c' é"}]
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(qwen2_folder)
    assert ChatTemplate(template).render(messages) == hf_tokenizer.apply_chat_template(
        messages, chat_template=template, tokenize=False)


def test_a_chat_completion_ends_at_the_end_of_turn_token(served):
    family, path, server = served
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    prompt = hf_tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False)
    status, tokenized = server.post("/tokenize", {"model": "chat", "messages": MESSAGES})
    assert status == 200 and tokenized["tokens"] == prompt  # the ids the chat route prefills
    reply, text = _expected(path, family, prompt)

    response = server.client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=MAX_TOKENS,
                                                     temperature=0)
    choice = response.choices[0]
    assert (choice.message.content, choice.finish_reason) == (text, "stop")
    assert family.end_of_turn not in choice.message.content
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (len(prompt), len(reply))

    chunks = list(server.client.chat.completions.create(
        model="chat", messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices) == text
    assert [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices][-1] == "stop"
    assert chunks[-1].usage.completion_tokens == len(reply)

    # Without the end-of-turn token the reply runs on to max_tokens: the stop above was that token's.
    endless = server.client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=MAX_TOKENS,
                                                    temperature=0, extra_body={"ignore_eos": True})
    assert endless.choices[0].finish_reason == "length" and endless.usage.completion_tokens == MAX_TOKENS
    assert endless.choices[0].message.content.startswith(text)

    # A turn without content: Qwen2.5's template fails on it (a 400, and the server serves on), Llama's renders it
    # empty (``trim``), as in transformers.
    contentless = [{"role": "user", "content": None}]
    try:
        expected = hf_tokenizer.apply_chat_template([{"role": "user"}], add_generation_prompt=True, tokenize=True,
                                                    return_dict=False)
    except Exception:  # whatever the template raises
        with pytest.raises(openai.BadRequestError, match="the chat template failed on these messages"):
            server.client.chat.completions.create(model="chat", messages=contentless)
    else:
        answer = server.client.chat.completions.create(model="chat", messages=contentless, max_tokens=1)
        assert answer.usage.prompt_tokens == len(expected)
    again = server.client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=MAX_TOKENS,
                                                  temperature=0)
    assert again.choices[0].message.content == text


@pytest.mark.parametrize(("change", "message"), [
    ({"eos_token": "<|turn_end|>"}, "tokenizer_config.json's eos_token '<|turn_end|>' (where a chat turn ends) is "
                                    "not a token of the tokenizer"),
    ({"chat_template": "{% for m in messages %}{{ m.content }"}, "the chat template does not compile"),
], ids=["unknown-end-of-turn", "does-not-compile"])
def test_serve_refuses_a_template_it_cannot_honour_with_exit_code_2(qwen2_folder, tmp_path, capsys, change,
                                                                     message):
    """A template that does not compile, or an end of turn the tokenizer does not have (every answer would run to
    its length): one line and exit 2, before the server listens."""
    path = Path(shutil.copytree(qwen2_folder, tmp_path / "qwen2"))
    config = json.loads((path / "tokenizer_config.json").read_text())
    (path / "tokenizer_config.json").write_text(json.dumps({**config, **change}))
    assert main(["serve", str(path), "--port", "0", "--engine", "thread", "--threads", "1"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
