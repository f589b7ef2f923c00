"""``tformer serve`` takes a folder's generation_config.json as the defaults of what a request leaves out, as Hugging
Face's ``generate`` and vLLM do (issue 55, point 5): sampling (``do_sample``, ``temperature``, ``top_p``, ``top_k``),
``repetition_penalty`` and the length, and ``/v1/completions`` stops at the file's end-id list (Llama 3 Instruct's
``<|end_of_text|>``, ``<|eom_id|>``, ``<|eot_id|>``) as ``generate`` does. A request's own field always wins; a
default the server cannot honour (beam search) stops it at startup.

The folder is test_serve_chat_families.py's Llama-3-shaped one (built by transformers, its greedy reply to the chat
prompt ending at ``<|eot_id|>``); the server runs in this process with its engine on a thread."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from test_serve_chat_families import LLAMA3, MESSAGES, _build_folder
from test_serving_server import ServerThread

import tformer
from tformer.generation import GenerationConfig, GenerationError
from tformer.serving import Engine
from tformer.serving.openai_api import CompletionRequest

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.slow  # transformers, tokenizers and a server


def _with_generation_config(source, target, **changes):
    """A copy of ``source`` whose generation_config.json has ``changes`` over its own."""
    shutil.copytree(source, target)
    raw = json.loads((target / "generation_config.json").read_text())
    (target / "generation_config.json").write_text(json.dumps({**raw, **changes}))
    return target


@pytest.fixture(scope="module")
def llama3(tmp_path_factory):
    """The Llama 3 folder (do_sample true, temperature 0.6, top_p 0.9, three end ids) and its chat prompt's ids."""
    folder = tmp_path_factory.mktemp("defaults") / "llama3"
    _build_folder(LLAMA3, folder)
    prompt = transformers.AutoTokenizer.from_pretrained(folder).apply_chat_template(
        MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False)
    return folder, prompt


@pytest.fixture(scope="module")
def served(llama3):
    server = ServerThread(llama3[0], "thread", cache_tokens=2048, block_size=8)
    yield server
    server.stop()


def _answer(server, **body):
    status, answer = server.post("/v1/completions", json.dumps({"model": "tiny", **body}).encode())
    assert status == 200, answer
    return answer["choices"][0], answer["usage"]["completion_tokens"]


def _text(model, new_ids: list[int]) -> str:
    """The text of new ids as the server gives it: an end id stays out of the text."""
    ends = GenerationConfig().end_ids(model.config) if model.generation_config is None \
        else model.generation_config.end_ids(model.config)
    return model.tokenizer.decode([token for token in new_ids if token not in ends])


def test_completions_stop_at_the_files_end_ids_as_generate(served, llama3):
    """Greedy: the reply ends at <|eot_id|>, the third id of generation_config.json's list (config.json's own end
    id is <|end_of_text|>), where tformer.generate and transformers' generate end it."""
    folder, prompt = llama3
    model = served.model
    ends = json.loads((folder / "generation_config.json").read_text())["eos_token_id"]
    assert len(ends) == 3 and model.generation_config.end_ids(model.config) == tuple(ends)
    expected = tformer.generate(model, torch.tensor([prompt]), 12, do_sample=False)[0, len(prompt):].tolist()
    hf = transformers.LlamaForCausalLM.from_pretrained(folder).eval()
    theirs = hf.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False)[0, len(prompt):].tolist()
    assert expected[:len(theirs)] == theirs and theirs[-1] == ends[2]  # tformer pads after the end
    choice, count = _answer(served, prompt=prompt, max_tokens=12, temperature=0)
    assert (choice["finish_reason"], count, choice["text"]) == ("stop", len(theirs), _text(model, theirs))


def test_a_request_without_sampling_fields_samples_as_the_file_says(served, llama3):
    """Omitted temperature and top_p: the file's 0.6 and 0.9 (with Hugging Face's top_k 50), the draws
    tformer.generate makes from the folder's defaults with the same seed; not OpenAI's temperature 1."""
    _, prompt = llama3
    model = served.model
    ids = torch.tensor([prompt])
    expected = tformer.generate(model, ids, 12, seed=7)[0, len(prompt):].tolist()
    plain = tformer.generate(model, ids, 12, seed=7, do_sample=True, temperature=1.0, top_k=None,
                             top_p=None)[0, len(prompt):].tolist()
    assert expected != plain  # the file's settings change the draws
    choice, count = _answer(served, prompt=prompt, max_tokens=12, seed=7)
    assert choice["text"] == _text(model, expected)
    choice, _ = _answer(served, prompt=prompt, max_tokens=12, seed=7, temperature=1.0, top_p=1.0, top_k=0)
    assert choice["text"] == _text(model, plain)  # the request's own fields win


def test_greedy_repetition_penalty_and_length_from_the_file(llama3, tmp_path):
    """do_sample false, repetition_penalty 1.3, max_new_tokens 6: a request with a prompt alone decodes what
    transformers' generate decodes from the same folder, on /v1/completions and /v1/chat/completions."""
    source, prompt = llama3
    folder = _with_generation_config(source, tmp_path / "greedy", do_sample=False, repetition_penalty=1.3,
                                     max_new_tokens=6, temperature=None, top_p=None)
    hf = transformers.LlamaForCausalLM.from_pretrained(folder).eval()
    theirs = hf.generate(torch.tensor([prompt]))[0, len(prompt):].tolist()
    unpenalised = hf.generate(torch.tensor([prompt]), repetition_penalty=1.0)[0, len(prompt):].tolist()
    assert theirs != unpenalised and len(theirs) <= 6
    server = ServerThread(folder, "thread", cache_tokens=2048, block_size=8)
    try:
        choice, count = _answer(server, prompt=prompt)
        assert (choice["text"], count) == (_text(server.model, theirs), len(theirs))
        answer = server.client().chat.completions.create(model="tiny", messages=MESSAGES)
        assert answer.choices[0].message.content == _text(server.model, theirs)
    finally:
        server.stop()


def test_a_default_the_server_cannot_honour_is_refused_at_startup(llama3, tmp_path):
    folder = _with_generation_config(llama3[0], tmp_path / "beams", do_sample=False, num_beams=4,
                                     num_return_sequences=2)
    with pytest.raises(GenerationError, match=r"^generation_config.json: num_return_sequences=2 is not supported by "
                                              r"the server"):
        Engine(tformer.load(folder), cache_tokens=64, block_size=8)


def test_a_folders_beam_search_is_what_a_request_leaving_it_out_gets():
    defaults = GenerationConfig(do_sample=False, num_beams=4, length_penalty=0.6, early_stopping=True)
    left_out = CompletionRequest(model="tiny", prompt="x").generation_config(8, defaults)
    assert (left_out.num_beams, left_out.length_penalty, left_out.early_stopping) == (4, 0.6, True)
    sent = CompletionRequest(model="tiny", prompt="x", num_beams=1).generation_config(8, defaults)
    assert sent.num_beams == 1
