"""``tformer serve`` through the real ``openai`` client: completions and chat (whole and streamed)
equal to ``tformer.generate``, stop strings, ``n``, logprobs, errors as the client's exception
types, concurrent requests, a client that disconnects, a full cache, SIGTERM and the API key; with the
engine in a process of its own (the default) and on a thread of the server's, which answer alike."""

import concurrent.futures
import contextlib
import functools
import http.client
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from engine_hooks import hooked_engine, slowed
from python_path import child_python_path

import tformer
from tformer.cli import main
from tformer.generation import GenerationConfig
from tformer.hub import load_tokenizer
from tformer.serving import Engine
from tformer.serving.engine_client import ThreadEngineClient
from tformer.serving.engine_process import ProcessEngineClient
from tformer.serving.limits import DEFAULT_STALL_SECONDS
from tformer.serving.server import OpenAIServer
from tformer.tokenizers import CharTokenizer
from tformer.tokenizers.chat_template import ChatTemplate, ChatTemplateError

openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")

pytestmark = pytest.mark.slow  # the openai client against a server process

TEXT = "to be or not to be, that is the question.\nROMEO: JULIET: user assistant\n"
TEMPLATE = ("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant:{% endif %}")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("serve") / "tiny"
    tokenizer = CharTokenizer.train(TEXT)
    torch.manual_seed(0)
    model = tformer.build_model("gpt-nano", vocab_size=tokenizer.vocab_size, max_seq_len=512, initializer_range=0.2)
    model.tokenizer = tokenizer
    model.save(folder)
    (folder / "chat_template.jinja").write_text(TEMPLATE)
    return folder


class ServerThread:
    """An OpenAIServer under uvicorn on a free port, in this process; its engine in a process of its own
    (``engine="process"``) or on a thread (``"thread"``: ``self.engine`` is the Engine, inspectable)."""

    def __init__(self, checkpoint, engine="thread", api_key=None, chat=True, step_seconds=None, failing_prompt=None,
                 stall_timeout=DEFAULT_STALL_SECONDS, **engine_options):
        self.model = tformer.load(checkpoint)  # the reference the answers are compared with
        if engine == "thread":
            self.engine = Engine(self.model, self.model.tokenizer, **engine_options)
            if step_seconds is not None:
                self.engine.step = slowed(self.engine.step, step_seconds)
            self.engine_client = ThreadEngineClient(self.engine, stall_timeout)
        else:  # as tformer serve starts it: the engine process builds its engine, this one reads the tokenizer
            build = functools.partial(hooked_engine, step_seconds, failing_prompt, str(checkpoint), "cpu", None, 1,
                                      engine_options)
            self.engine_client = ProcessEngineClient(build, load_tokenizer(checkpoint), stall_timeout)
        template = ChatTemplate.from_folder(checkpoint) if chat else None
        self.server = OpenAIServer(self.engine_client, "tiny", api_key=api_key, chat_template=template)
        config = uvicorn.Config(self.server.app(), host="127.0.0.1", port=0, log_level="error", lifespan="on")
        self.uvicorn = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.uvicorn.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.uvicorn.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "the server did not start"
            time.sleep(0.02)
        self.port = self.uvicorn.servers[0].sockets[0].getsockname()[1]

    def client(self, api_key="unused"):
        return openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key=api_key, max_retries=0, timeout=60)

    def post(self, path, body: bytes, headers=None):
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        connection.request("POST", path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
        response = connection.getresponse()
        return response.status, json.loads(response.read())

    def metrics(self):
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        connection.request("GET", "/metrics")
        return dict(line.rsplit(" ", 1) for line in connection.getresponse().read().decode().splitlines()
                    if not line.startswith("#"))

    def stats(self):
        return self.engine_client.snapshot().stats

    def wait_idle(self):
        deadline = time.monotonic() + 10
        while (snapshot := self.engine_client.snapshot()).has_work or snapshot.blocks_in_use:
            assert time.monotonic() < deadline, "requests still in the engine"
            time.sleep(0.02)

    def stop(self):
        self.uvicorn.should_exit = True
        self.thread.join(30)


@pytest.fixture(scope="module")
def thread_server(checkpoint):
    server = ServerThread(checkpoint, "thread", cache_tokens=4096, block_size=8)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def process_server(checkpoint):
    server = ServerThread(checkpoint, "process", cache_tokens=4096, block_size=8)
    yield server
    server.stop()


@pytest.fixture(params=["process", "thread"])
def served(request):
    """The server with each engine: tests that take it run once per engine."""
    return request.getfixturevalue(f"{request.param}_server")


def generated(model, prompt_ids, **options):
    config = GenerationConfig(eos_token_id=(), **options)
    ids = tformer.generate(model, torch.tensor([prompt_ids]), generation_config=config)[0, len(prompt_ids):]
    return model.tokenizer.decode(ids.tolist())


def test_a_completion_is_what_generate_gives(served):
    client = served.client()
    response = client.completions.create(model="tiny", prompt="to be", max_tokens=20, temperature=0,
                                         extra_body={"ignore_eos": True})
    tokenizer = served.model.tokenizer
    assert response.choices[0].text == generated(served.model, tokenizer.encode("to be"), max_new_tokens=20)
    assert response.choices[0].finish_reason == "length"
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (5, 20)
    by_ids = client.completions.create(model="tiny", prompt=tokenizer.encode("to be"), max_tokens=20, temperature=0)
    assert by_ids.choices[0].text == response.choices[0].text


def test_a_stream_sends_one_chunk_per_token_then_usage(served):
    client = served.client()
    whole = client.completions.create(model="tiny", prompt="that is", max_tokens=15, temperature=0).choices[0]
    chunks = list(client.completions.create(model="tiny", prompt="that is", max_tokens=15, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    token_chunks = [chunk for chunk in chunks if chunk.choices]
    assert len(token_chunks) == 15
    assert "".join(chunk.choices[0].text for chunk in token_chunks) == whole.text
    assert token_chunks[-1].choices[0].finish_reason == whole.finish_reason == "length"
    assert chunks[-1].usage.completion_tokens == 15 and not chunks[-1].choices


def test_stop_strings_n_and_seeded_sampling(served):
    client = served.client()
    tokenizer = served.model.tokenizer
    prompt = tokenizer.encode("ROMEO:")
    free = generated(served.model, prompt, max_new_tokens=30)
    stop = free[8:10]
    stopped = client.completions.create(model="tiny", prompt="ROMEO:", max_tokens=30, temperature=0, stop=[stop])
    assert stopped.choices[0].text == free[: free.index(stop)] and stopped.choices[0].finish_reason == "stop"
    sampled = client.completions.create(model="tiny", prompt="ROMEO:", max_tokens=12, temperature=0.9, seed=5, n=3,
                                        extra_body={"ignore_eos": True})
    assert [choice.index for choice in sampled.choices] == [0, 1, 2]
    assert len({choice.text for choice in sampled.choices}) == 3
    assert sampled.choices[0].text == generated(served.model, prompt, max_new_tokens=12, do_sample=True,
                                                temperature=0.9, seed=5)
    assert sampled.usage.completion_tokens == 36
    min_p = client.completions.create(model="tiny", prompt="ROMEO:", max_tokens=12, temperature=1.2, seed=6,
                                      extra_body={"ignore_eos": True, "min_p": 0.3})  # vLLM's extension
    assert min_p.choices[0].text == generated(served.model, prompt, max_new_tokens=12, do_sample=True,
                                              temperature=1.2, min_p=0.3, seed=6)


def test_logprobs_are_the_models(served):
    client = served.client()
    tokenizer = served.model.tokenizer
    response = client.completions.create(model="tiny", prompt="to be", max_tokens=3, temperature=0, logprobs=2)
    ids = tokenizer.encode("to be")
    logprobs = response.choices[0].logprobs
    for token, value, top in zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs, strict=True):
        with torch.no_grad():
            expected = torch.log_softmax(served.model(torch.tensor([ids])).logits[0, -1], -1)
        best = int(expected.argmax())
        assert token == tokenizer.decode([best]) and value == pytest.approx(float(expected[best]), abs=1e-4)
        assert list(top) == [tokenizer.decode([i]) for i in expected.topk(2).indices.tolist()]
        ids.append(best)


def test_chat_renders_the_template_and_streams(served):
    client = served.client()
    messages = [{"role": "user", "content": "to be?"}]
    prompt = served.model.tokenizer.encode(ChatTemplate(TEMPLATE).render(messages), add_special_tokens=False)
    expected = generated(served.model, prompt, max_new_tokens=10)
    response = client.chat.completions.create(model="tiny", messages=messages, max_tokens=10, temperature=0,
                                              extra_body={"ignore_eos": True})
    assert response.choices[0].message.content == expected and response.choices[0].message.role == "assistant"
    assert response.usage.prompt_tokens == len(prompt)
    chunks = list(client.chat.completions.create(model="tiny", messages=messages, max_tokens=10, temperature=0,
                                                 stream=True, extra_body={"ignore_eos": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks) == expected
    assert chunks[-1].choices[0].finish_reason == "length"


def test_errors_are_the_clients_exception_types_and_the_server_keeps_serving(served):
    client = served.client()
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="gpt-4", prompt="to")
    with pytest.raises(openai.BadRequestError, match="max_tokens.*exceeds the model's context of 512"):
        client.completions.create(model="tiny", prompt="to be", max_tokens=510)
    with pytest.raises(openai.BadRequestError, match="max_tokens.*exceeds the model's context of 512"):
        client.completions.create(model="tiny", prompt="to be", max_tokens=510, stream=True)  # before SSE headers
    with pytest.raises(openai.BadRequestError, match="unknown field 'beam_width'"):
        client.completions.create(model="tiny", prompt="to", extra_body={"beam_width": 4})
    with pytest.raises(openai.BadRequestError, match=r"frequency_penalty=2.5 must be a number in \[-2, 2\]"):
        client.completions.create(model="tiny", prompt="to", frequency_penalty=2.5)
    with pytest.raises(openai.BadRequestError, match="repetition_penalty=0.0 must be a number > 0"):
        client.completions.create(model="tiny", prompt="to", extra_body={"repetition_penalty": 0.0})
    with pytest.raises(openai.BadRequestError, match=r"min_p=2.0 must be a number in \[0, 1\]"):
        client.completions.create(model="tiny", prompt="to", extra_body={"min_p": 2.0})
    with pytest.raises(openai.UnprocessableEntityError, match="min_p"):
        client.completions.create(model="tiny", prompt="to", extra_body={"min_p": "0.1"})
    with pytest.raises(openai.UnprocessableEntityError, match="max_tokens"):
        client.completions.create(model="tiny", prompt="to", max_tokens="many")
    with pytest.raises(openai.UnprocessableEntityError, match="temperature"):
        client.completions.create(model="tiny", prompt="to", temperature=-1)
    with pytest.raises(openai.BadRequestError, match="outside the vocabulary"):
        client.completions.create(model="tiny", prompt=[1, 2, 99999])
    status, body = served.post("/v1/completions", b'{"model": "tiny", "prompt": ')
    assert status == 400 and "not valid JSON" in body["error"]["message"]
    status, body = served.post("/v1/completions", b'[1, 2]')
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    assert client.completions.create(model="tiny", prompt="to", max_tokens=2).usage.completion_tokens >= 1
    served.wait_idle()


@pytest.mark.parametrize("clients", [1, 16, 64])
def test_concurrent_greedy_requests_equal_each_alone(served, clients):
    """The same 64 requests from 1, 16 or 64 clients at once: every text is what ``generate`` gives the prompt
    alone, so the batches the requests meet change nothing."""
    tokenizer = served.model.tokenizer
    generator = torch.Generator().manual_seed(0)
    lengths = [1 + (index * 13) % 41 for index in range(64)]
    prompts = [torch.randint(0, tokenizer.vocab_size, (n,), generator=generator).tolist() for n in lengths]
    new = [10 + (index * 7) % 30 for index in range(64)]
    client = served.client()

    def ask(index):
        return client.completions.create(model="tiny", prompt=prompts[index], max_tokens=new[index], temperature=0,
                                         extra_body={"ignore_eos": True}).choices[0].text

    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        texts = list(pool.map(ask, range(64)))
    for prompt, count, text in zip(prompts, new, texts, strict=True):
        assert text == generated(served.model, prompt, max_new_tokens=count)
    served.wait_idle()


def _answers(server, prompts):
    """Every prompt asked four ways at once: greedy with log-probabilities, streamed, n=2 seeded sampling, chat."""
    client = server.client()

    def ask(index):
        prompt, common = prompts[index // 4], {"model": "tiny", "max_tokens": 12, "extra_body": {"ignore_eos": True}}
        match index % 4:
            case 0:
                choice = client.completions.create(prompt=prompt, temperature=0, logprobs=2, **common).choices[0]
                logprobs = choice.logprobs
                return choice.text, logprobs.tokens, logprobs.token_logprobs, [list(t) for t in logprobs.top_logprobs]
            case 1:
                chunks = client.completions.create(prompt=prompt, temperature=0, stream=True, **common)
                return [(chunk.choices[0].text, chunk.choices[0].finish_reason) for chunk in chunks]
            case 2:
                answer = client.completions.create(prompt=prompt, temperature=0.9, seed=index, n=2, **common)
                return [(choice.index, choice.text) for choice in answer.choices], answer.usage.completion_tokens
            case 3:
                messages = [{"role": "user", "content": server.model.tokenizer.decode(prompt)}]
                answer = client.chat.completions.create(messages=messages, temperature=0, **common)
                return answer.choices[0].message.content, answer.usage.prompt_tokens

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        return list(pool.map(ask, range(4 * len(prompts))))


def test_the_engine_in_its_process_answers_as_on_a_thread(thread_server, process_server):
    """The same concurrent requests to both engines: the same texts, chunks, choices and usage, log-probabilities
    equal to float rounding (the steps' batches may differ); greedy texts are ``generate``'s."""
    generator = torch.Generator().manual_seed(1)
    vocab = thread_server.model.tokenizer.vocab_size
    prompts = [torch.randint(0, vocab, (length,), generator=generator).tolist() for length in (3, 19, 7, 30)]
    threaded, separate = _answers(thread_server, prompts), _answers(process_server, prompts)
    for index, (mine, theirs) in enumerate(zip(threaded, separate, strict=True)):
        if index % 4 == 0:
            assert mine[0] == theirs[0] == generated(thread_server.model, prompts[index // 4], max_new_tokens=12)
            assert mine[1] == theirs[1] and mine[3] == theirs[3]
            assert theirs[2] == pytest.approx(mine[2], abs=1e-5)
        else:
            assert mine == theirs
    process_server.wait_idle()


def test_a_client_that_disconnects_mid_stream_frees_its_blocks(served):
    cancelled = served.stats().requests_cancelled
    connection = http.client.HTTPConnection("127.0.0.1", served.port, timeout=30)
    body = {"model": "tiny", "prompt": "to be", "max_tokens": 500, "stream": True, "ignore_eos": True}
    connection.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    assert response.status == 200 and response.readline().startswith(b"data: ")
    connection.sock.shutdown(2)
    connection.close()
    served.wait_idle()
    assert served.stats().requests_cancelled == cancelled + 1


def test_metrics_count_requests_tokens_and_cache_blocks(served):
    served.client().completions.create(model="tiny", prompt="to", max_tokens=4, temperature=0)
    connection = http.client.HTTPConnection("127.0.0.1", served.port, timeout=30)
    connection.request("GET", "/metrics")
    lines = dict(line.rsplit(" ", 1) for line in connection.getresponse().read().decode().splitlines()
                 if not line.startswith("#"))
    assert float(lines['tformer_requests_total{outcome="finished"}']) >= 1
    assert float(lines["tformer_generated_tokens_total"]) == served.stats().generated_tokens
    assert float(lines['tformer_http_responses_total{code="200"}']) >= 1
    assert lines["tformer_cache_blocks_in_use"] == "0" and lines["tformer_cache_block_size"] == "8"


def test_metrics_count_prompt_tokens_served_from_the_prefix_cache(served):
    client = served.client()
    prompt = "ROMEO: to be or not to be, that is the question."  # 48 characters: 6 full blocks of 8
    options = dict(max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
    client.completions.create(model="tiny", prompt=prompt, **options)
    before = served.stats().prefix_cache_hit_tokens
    answer = client.completions.create(model="tiny", prompt=prompt + " JULIET", **options).choices[0].text
    assert answer == generated(served.model, served.model.tokenizer.encode(prompt + " JULIET"), max_new_tokens=6)
    stats = served.stats()
    assert stats.prefix_cache_hit_tokens == before + 48
    lines = served.metrics()
    assert float(lines["tformer_prefix_cache_hit_tokens_total"]) == stats.prefix_cache_hit_tokens
    rate = stats.prefix_cache_hit_tokens / stats.prompt_tokens
    assert float(lines["tformer_prefix_cache_hit_rate"]) == pytest.approx(rate)
    assert float(lines["tformer_prompt_tokens_computed_total"]) == stats.prompt_tokens_computed
    assert float(lines["tformer_cache_blocks_cached"]) >= 6


def test_serve_turns_prefix_caching_off_and_chooses_how_decode_steps_read_the_cache(checkpoint, monkeypatch):
    clients = []
    monkeypatch.setattr("tformer.serving.server.run", lambda server, **options: clients.append(server.engine))
    thread = ["serve", str(checkpoint), "--port", "0", "--engine", "thread"]
    assert main(thread) == 0
    assert main([*thread, "--no-prefix-cache", "--paged-attention", "gather", "--overlap", "on"]) == 0
    engines = [client.engine for client in clients]
    assert [engine.prefix_caching for engine in engines] == [True, False]
    assert [engine.in_place for engine in engines] == ["kernel", None]
    assert [engine.overlapped is not None for engine in engines] == [False, True]  # auto: off on the CPU
    assert clients[1].facts.paged_attention == "paged attention: gather (asked for)"


def test_a_full_cache_makes_a_request_wait_then_refuses_it_with_429(checkpoint):
    server = ServerThread(checkpoint, "thread", cache_tokens=64, block_size=8, queue_timeout=1.0)
    try:
        client = server.client()
        pool = server.engine.pool
        assert pool.reserve(pool.num_blocks)  # something else holds the whole pool
        with pytest.raises(openai.RateLimitError, match="no room in the cache"):
            client.completions.create(model="tiny", prompt="to be", max_tokens=5)
        with concurrent.futures.ThreadPoolExecutor(1) as executor:
            waiting = executor.submit(client.completions.create, model="tiny", prompt="to be", max_tokens=20,
                                      temperature=0, extra_body={"ignore_eos": True})
            time.sleep(0.3)
            assert server.engine.queue_length == 1
            pool.reserved -= pool.num_blocks  # the room comes back before the timeout
            text = waiting.result(timeout=30).choices[0].text
        assert text == generated(server.model, server.model.tokenizer.encode("to be"), max_new_tokens=20)
        server.wait_idle()
        assert pool.blocks_in_use == 0 and pool.reserved == 0
    finally:
        server.stop()


def test_an_api_key_is_required_when_set(checkpoint):
    server = ServerThread(checkpoint, "thread", api_key="sesame", chat=False)
    try:
        with pytest.raises(openai.AuthenticationError):
            server.client("wrong").completions.create(model="tiny", prompt="to", max_tokens=2)
        assert server.client("sesame").models.list().data[0].id == "tiny"
        with pytest.raises(openai.BadRequestError, match="no chat template"):
            server.client("sesame").chat.completions.create(model="tiny", messages=[{"role": "user", "content": "a"}])
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        connection.request("GET", "/health")
        assert connection.getresponse().status == 200
    finally:
        server.stop()


# The CLI with each engine step slowed to ``seconds`` (a larger model's pace: time to act between steps). A
# file: the engine process runs its top level too (as ``__mp_main__``), so its steps are the slowed ones.
SLOW_CLI = """import sys, time
from tformer.serving.engine import Engine
step = Engine.step

def slow_step(self):
    time.sleep({seconds})
    return step(self)

Engine.step = slow_step
if __name__ == "__main__":
    from tformer.cli import main
    sys.exit(main(sys.argv[1:]))
"""


def _start_cli_server(checkpoint, *options, step_seconds=None):
    entry = ["-m", "tformer"]
    if step_seconds is not None:
        script = checkpoint.parent / f"slow_serve_{step_seconds}.py"
        script.write_text(SLOW_CLI.format(seconds=step_seconds))
        entry = [str(script)]
    process = subprocess.Popen([sys.executable, *entry, "serve", str(checkpoint), "--port", "0", *options],
                               cwd=ROOT, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": child_python_path()})
    line = process.stderr.readline()
    assert "listening on http://" in line, line + process.stderr.read()
    return process, int(line.split("http://", 1)[1].split()[0].rsplit(":", 1)[1])


def _stream_count(port, max_tokens, first_chunk: threading.Event):
    """Tokens streamed by one request and whether it ended with [DONE]."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    body = {"model": "tiny", "prompt": "to be", "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
    connection.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    tokens, done = 0, False
    for line in response:
        if line.startswith(b"data: [DONE]"):
            done = True
        elif line.startswith(b"data: "):
            tokens += 1
            first_chunk.set()
    return tokens, done


@pytest.mark.parametrize("shutdown_timeout, finished, engine", [("30", True, "process"), ("0", False, "thread")],
                         ids=["drained", "cancelled-thread-engine"])
def test_sigterm_finishes_or_cancels_requests_in_flight_and_exits_0(checkpoint, shutdown_timeout, finished, engine):
    process, port = _start_cli_server(checkpoint, "--shutdown-timeout", shutdown_timeout, "--threads", "1",
                                      "--engine", engine)
    try:
        started = [threading.Event() for _ in range(3)]
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            streams = [pool.submit(_stream_count, port, 500, event) for event in started]
            assert all(event.wait(30) for event in started)  # every request is in flight
            process.send_signal(signal.SIGTERM)
            results = [stream.result(timeout=60) for stream in streams]
        assert process.wait(timeout=60) == 0
        log = process.stderr.read()
    finally:
        process.kill()
    if finished:
        assert results == [(500, True)] * 3
        assert "3 request(s) finished, 0 cancelled" in log
    else:
        assert all(tokens < 500 for tokens, _ in results)
    assert "0 cache blocks in use" in log
    with pytest.raises(ConnectionRefusedError):
        http.client.HTTPConnection("127.0.0.1", port, timeout=5).request("GET", "/health")


def test_serve_refuses_bad_options_with_exit_code_2(checkpoint, tmp_path, capsys):
    assert main(["serve", str(checkpoint), "--port", "70000"]) == 2
    assert "--port 70000 must be in [0, 65535]" in capsys.readouterr().err
    tformer.build_model("gpt-nano").save(tmp_path / "no-tokenizer")
    assert main(["serve", str(tmp_path / "no-tokenizer"), "--port", "0"]) == 2
    assert "serve needs one" in capsys.readouterr().err
    (tmp_path / "bad.jinja").write_text("{% for %}")
    assert main(["serve", str(checkpoint), "--port", "0", "--chat-template", str(tmp_path / "bad.jinja")]) == 2
    assert "does not compile" in capsys.readouterr().err
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        assert main(["serve", str(checkpoint), "--port", str(taken.getsockname()[1])]) == 2
    assert "cannot listen on 127.0.0.1:" in capsys.readouterr().err
    for option, value, message in (("--engine-timeout", "0.2", "--engine-timeout 0.2 must be >= 1 s"),
                                   ("--engine-timeout", "-1", "--engine-timeout -1.0 must be a number of seconds"),
                                   ("--shutdown-timeout", "inf", "--shutdown-timeout inf must be a finite number")):
        assert main(["serve", str(checkpoint), "--port", "0", option, value]) == 2
        assert message in capsys.readouterr().err


# ---- hardening (issue 37): limits, strict types, disconnects, shutdown, errors without tracebacks ----------


def _raw_request(port, body: bytes, declared_length=None) -> socket.socket:
    """A socket that sent a POST /v1/completions with ``body`` (all of it, or a part of ``declared_length``)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    length = len(body) if declared_length is None else declared_length
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(length).encode() + b"\r\n\r\n" + body)
    return sock


def _reply(sock: socket.socket) -> bytes:
    """Everything the server sends before it closes the connection (its answer said Connection: close)."""
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    sock.close()
    return received


class _Records(logging.Handler):
    """The log records of uvicorn's loggers (where an exception escaping the app is logged with its traceback)."""

    def __enter__(self):
        self.records = []
        logging.getLogger("uvicorn.error").addHandler(self)
        return self.records

    def emit(self, record):
        self.records.append(record)

    def __exit__(self, *exc_info):
        logging.getLogger("uvicorn.error").removeHandler(self)


@pytest.mark.parametrize("stream, engine", [(False, "thread"), (True, "thread"), (True, "process")],
                         ids=["whole", "streamed", "streamed-process"])
def test_a_client_that_leaves_stops_the_decode_within_one_step(checkpoint, stream, engine):
    server = ServerThread(checkpoint, engine, chat=False, cache_tokens=4096, block_size=8, step_seconds=0.05)
    try:
        body = {"model": "tiny", "prompt": "to be", "max_tokens": 500, "n": 4, "ignore_eos": True, "stream": stream}
        sock = _raw_request(server.port, json.dumps(body).encode())
        deadline = time.monotonic() + 10
        while server.stats().generated_tokens < 12:  # decoding: a few steps of 4 sequences
            assert time.monotonic() < deadline
            time.sleep(0.005)
        sock.shutdown(socket.SHUT_RDWR)
        sock.close()
        at_close = server.stats().generated_tokens
        server.wait_idle()
        # The step running at the close may finish (4 tokens, 8 if it had just begun); none after it.
        assert server.stats().generated_tokens - at_close <= 8
        assert float(server.metrics()["tformer_generated_tokens_total"]) == server.stats().generated_tokens
        assert server.stats().requests_cancelled == 1 and server.engine_client.snapshot().blocks_in_use == 0
    finally:
        server.stop()


def test_strict_types_and_one_max_tokens_default(served):
    refused = {
        '"max_tokens": "10"': 'max_tokens: Input should be a valid integer (got "10")',
        '"max_tokens": true': "max_tokens: Input should be a valid integer (got true)",
        '"stream": "yes"': 'stream: Input should be a valid boolean (got "yes")',
        '"logprobs": true': "logprobs: Input should be a valid integer (got true)",
        '"n": 2.0': "n: Input should be a valid integer (got 2.0)",
        '"max_tokens": -5': "max_tokens: Input should be greater than or equal to 0 (got -5)",
    }
    for field, message in refused.items():
        status, body = served.post("/v1/completions", f'{{"model": "tiny", "prompt": "to", {field}}}'.encode())
        assert (status, body["error"]["message"]) == (422, message), field
    status, body = served.post("/v1/completions", b'{"model": "tiny", "prompt": "to", "max_tokens": 0}')
    assert (status, body["error"]["param"]) == (400, "max_tokens")  # 0 only scores a prompt: echo and logprobs
    status, body = served.post("/v1/completions", b'{"model": "tiny", "prompt": [true, false]}')
    assert status == 422 and body["error"]["message"].startswith("prompt: must be one of str, list[int]")
    status, body = served.post("/v1/chat/completions",
                               b'{"model": "tiny", "messages": [{"role": "user", "content": 5}]}')
    assert status == 422 and body["error"]["param"] == "messages.0.content"
    for max_tokens in (', "max_tokens": null', ""):  # null is the default, as omitting it is: 16
        status, body = served.post("/v1/completions", f'{{"model": "tiny", "prompt": "to", "ignore_eos": true'
                                                      f'{max_tokens}}}'.encode())
        assert status == 200 and body["usage"]["completion_tokens"] == 16
    served.wait_idle()


def test_request_size_limits_refuse_before_reading_or_tokenizing(served, monkeypatch):
    started = time.monotonic()
    sock = _raw_request(served.port, b'{"model": "tiny", "prompt": "', declared_length=50_000_000)
    reply = _reply(sock)
    assert reply.startswith(b"HTTP/1.1 413") and b"larger than 4,194,304 bytes" in reply
    assert time.monotonic() - started < 5  # answered without waiting for the 50 MB
    # Chunked (no Content-Length): counted as it arrives. One byte too many, all sent, so the server's close
    # after its answer leaves nothing unread to reset the connection with.
    body = b'{"model": "tiny", "prompt": "'.ljust(4 * 1024 * 1024 + 1, b"a")
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(body[i : i + 65536]), body[i : i + 65536])
                       for i in range(0, len(body), 65536))
    sock = socket.create_connection(("127.0.0.1", served.port), timeout=10)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                 b"Transfer-Encoding: chunked\r\n\r\n" + chunked + b"0\r\n\r\n")
    assert _reply(sock).startswith(b"HTTP/1.1 413")
    encoded = []
    encode = served.server.tokenizer.encode
    monkeypatch.setattr(served.server.tokenizer, "encode", lambda *a, **k: encoded.append(1) or encode(*a, **k))
    status, body = served.post("/v1/completions", json.dumps({"model": "tiny", "prompt": ["to"] * 129}).encode())
    assert status == 400 and body["error"]["message"] == (
        "129 prompts in one request; at most 128 (the server's --max-prompts)")
    assert not encoded  # refused before tokenizing
    status, body = served.post("/v1/completions", json.dumps({"model": "tiny", "prompt": ["to"] * 100,
                                                              "max_tokens": 40}).encode())
    assert status == 400 and body["error"]["message"].startswith("the request needs 4,200 tokens")
    assert "at most 4,096 per request" in body["error"]["message"]


def test_every_status_is_counted_and_a_bug_is_an_error_object(served, monkeypatch):
    before = float(served.metrics().get('tformer_http_responses_total{code="500"}', 0))

    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(served.server.tokenizer, "encode", broken)
    status, body = served.post("/v1/completions", b'{"model": "tiny", "prompt": "to"}')
    assert status == 500 and body["error"] == {"message": "internal error: RuntimeError", "type": "server_error",
                                               "param": None, "code": None}
    assert float(served.metrics()['tformer_http_responses_total{code="500"}']) == before + 1


def test_bodies_and_templates_that_used_to_crash_get_error_objects_without_tracebacks(served, monkeypatch):
    with _Records() as records:
        status, body = served.post("/v1/completions", b"[" * 100_000)
        assert status == 400 and body["error"]["message"] == "the body nests arrays or objects too deeply to parse"
        monkeypatch.setattr(served.server, "chat_template", ChatTemplate("{% for i in range(100000000) %}{% endfor %}"))
        status, body = served.post("/v1/chat/completions",
                                   b'{"model": "tiny", "messages": [{"role": "user", "content": "a"}]}')
        assert status == 400 and "OverflowError: Range too big" in body["error"]["message"]
        gone = float(served.metrics().get('tformer_http_responses_total{code="499"}', 0))
        sock = _raw_request(served.port, b'{"model": "tiny", "pro', declared_length=1000)  # leaves mid-body
        time.sleep(0.1)
        sock.close()
        deadline = time.monotonic() + 10
        while float(served.metrics().get('tformer_http_responses_total{code="499"}', 0)) == gone:
            assert time.monotonic() < deadline
            time.sleep(0.02)
    assert [record.getMessage() for record in records if record.exc_info] == []


def test_a_chat_template_runs_within_a_time_and_size_bound():
    messages = [{"role": "user", "content": "hi"}]
    endless = ChatTemplate("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
                           time_limit=0.2)
    started = time.monotonic()
    with pytest.raises(ChatTemplateError, match=r"ran for more than 0.2 s"):
        endless.render(messages)
    assert time.monotonic() - started < 1
    with pytest.raises(ChatTemplateError, match="built a value past 1,000 characters or items with '\\*'"):
        ChatTemplate("{{ messages[0].content * 1000000000 }}", size_limit=1000).render(messages)
    with pytest.raises(ChatTemplateError, match="output passed 1,000 characters"):
        ChatTemplate("{% for a in range(5000) %}x{% endfor %}", size_limit=1000).render(messages)
    assert ChatTemplate(TEMPLATE, size_limit=1000).render(messages) == "user: hi\nassistant:"


def test_serve_refuses_a_cache_larger_than_memory_with_exit_code_2(checkpoint, capsys):
    assert main(["serve", str(checkpoint), "--port", "0", "--cache-tokens", "100000000000"]) == 2
    err = capsys.readouterr().err
    assert "cache_tokens=100000000000 needs " in err and "cache_tokens must be in [1, " in err
    assert len(err.strip().splitlines()) == 1
    for option in ("--max-body-bytes", "--max-prompts", "--max-request-tokens"):
        assert main(["serve", str(checkpoint), "--port", "0", option, "0"]) == 2
        assert f"{option} 0 must be >= 1" in capsys.readouterr().err


def _post_json(port, body):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    return response.status, json.loads(response.read())


def _stream_events(port, body):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.request("POST", "/v1/completions", body=json.dumps({**body, "stream": True}),
                       headers={"Content-Type": "application/json"})
    return [line[6:].strip() for line in connection.getresponse() if line.startswith(b"data: ")]


@pytest.mark.slow
def test_sigterm_drains_while_listening_and_ends_cut_requests_cleanly(checkpoint):
    process, port = _start_cli_server(checkpoint, "--shutdown-timeout", "3", "--threads", "1", step_seconds=0.02)
    try:
        long = {"model": "tiny", "prompt": "to be", "max_tokens": 400, "ignore_eos": True}
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            whole = pool.submit(_post_json, port, long)
            stream = pool.submit(_stream_events, port, long)
            deadline = time.monotonic() + 30
            while _metric(port, "tformer_running_sequences") < 2:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            half_open = _raw_request(port, b'{"model": "tiny", "pro', declared_length=1000)
            time.sleep(0.2)
            process.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            status, body = _post_json(port, {"model": "tiny", "prompt": "to", "max_tokens": 2})
            assert status == 503 and body["error"]["code"] == "shutting_down"  # still listening, refusing
            assert b'"code":"shutting_down"' in _reply(half_open)  # a 503 at once, not held until the timeout
            assert time.monotonic() - signalled < 2
            status, body = whole.result(timeout=60)
            assert status == 503 and body["error"]["code"] == "shutting_down"  # an error object, not text
            events = stream.result(timeout=60)
        assert events[-1] == b"[DONE]" and json.loads(events[-2])["choices"][0]["finish_reason"] == "cancelled"
        assert process.wait(timeout=60) == 0
        log = process.stderr.read()
    finally:
        process.kill()
    assert "Traceback" not in log and "Cancel" not in log
    assert "0 request(s) finished, 2 cancelled" in log and "0 cache blocks in use" in log


def _metric(port, name):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request("GET", "/metrics")
    for line in connection.getresponse().read().decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} is not in /metrics")


def _descendants(pid):
    """The processes ``pid`` started (the engine process, and multiprocessing's resource tracker)."""
    found = []
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        for child in map(int, children.read_text().split()):
            found += [child, *_descendants(child)]
    return found


def _running(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


def test_the_engine_process_ends_when_the_server_is_killed(checkpoint):
    """SIGKILL leaves the server no chance to close anything: its engine process, mid-request, sees its pipe end
    and exits within seconds."""
    process, port = _start_cli_server(checkpoint, "--threads", "1")
    try:
        children = _descendants(process.pid)
        assert children
        body = {"model": "tiny", "prompt": "to be", "max_tokens": 500, "ignore_eos": True, "stream": True}
        sock = _raw_request(port, json.dumps(body).encode())
        assert sock.recv(12).startswith(b"HTTP/1.1 200")  # decoding
        process.kill()
        process.wait(timeout=10)
        deadline = time.monotonic() + 5
        while running := [pid for pid in children if _running(pid)]:
            assert time.monotonic() < deadline, f"still running: {running}"
            time.sleep(0.05)
        sock.close()
    finally:
        process.kill()


def test_a_bug_or_a_dead_engine_process_is_a_500_and_health_says_so(checkpoint):
    server = ServerThread(checkpoint, "process", chat=False, step_seconds=0.02, failing_prompt=[1, 2, 3])
    try:
        client = server.client()
        assert client.completions.create(model="tiny", prompt="to", max_tokens=2).usage.completion_tokens == 2
        status, body = server.post("/v1/completions", b'{"model": "tiny", "prompt": [1, 2, 3]}')
        assert status == 500 and body["error"]["message"] == "internal error: KeyError"  # as in this process
        assert client.completions.create(model="tiny", prompt="to", max_tokens=2).usage.completion_tokens == 2
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(client.completions.create, model="tiny", prompt="to", max_tokens=400,
                                  extra_body={"ignore_eos": True})
            while server.engine_client.snapshot().running == 0:
                time.sleep(0.01)
            server.engine_client.process.kill()
            died = "the model failed: the engine process ended \\(exit code -9\\)"
            with pytest.raises(openai.InternalServerError, match=died):
                waiting.result(timeout=30)
        with pytest.raises(openai.InternalServerError, match=died):
            client.completions.create(model="tiny", prompt="to", max_tokens=2)
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        connection.request("GET", "/health")
        response = connection.getresponse()
        assert response.status == 500 and json.loads(response.read())["status"] == "failed"
    finally:
        server.stop()


# ---- issue 60: an engine that stops making progress, and a stop bounded by its timeout -------------------------


def _engine_pid(server_pid):
    """The engine process among the server's (multiprocessing's spawned child, not its resource tracker)."""
    engines = [pid for pid in _descendants(server_pid) if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert len(engines) == 1, engines
    return engines[0]


def _get(port, path):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request("GET", path)
    response = connection.getresponse()
    return response.status, json.loads(response.read())


def _wait_for(condition, seconds, what):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


LONG = {"model": "tiny", "prompt": "to be", "max_tokens": 400, "ignore_eos": True}


def test_a_stopped_engine_process_fails_health_and_requests_within_the_engine_timeout_then_recovers(checkpoint):
    """SIGSTOP stands in for an engine process that hangs: within --engine-timeout /health answers 503 with the
    reason, the stream in flight ends with that error and [DONE], a whole answer gets it as a 503; an idle engine
    never counts as stalled (it gives signs of life while idle), and one that resumes serves again."""
    process, port = _start_cli_server(checkpoint, "--engine-timeout", "1.5", "--threads", "1", step_seconds=0.02)
    engine = _engine_pid(process.pid)
    try:
        time.sleep(2)  # idle for longer than the engine timeout
        assert _get(port, "/health") == (200, {"status": "ok"})
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            first_chunk = threading.Event()
            stream = pool.submit(_stream_count, port, 400, first_chunk)
            assert first_chunk.wait(30)
            os.kill(engine, signal.SIGSTOP)
            stopped = time.monotonic()
            status, body = pool.submit(_post_json, port, {**LONG, "max_tokens": 5}).result(timeout=30)
            assert status == 503 and body["error"]["code"] == "engine_stalled", body
            assert re.fullmatch(r"the engine has made no progress for \d\.\d s \(more than the 1\.5 s allowed, "
                                r"--engine-timeout\): it is stopped or hung", body["error"]["message"]), body
            tokens, done = stream.result(timeout=30)
            assert time.monotonic() - stopped < 5
        assert 0 < tokens < 400 and done
        status, health = _get(port, "/health")
        assert status == 503 and health["status"] == "stalled" and "no progress" in health["error"]
        os.kill(engine, signal.SIGCONT)
        _wait_for(lambda: _get(port, "/health")[0] == 200, 5, "the resumed engine is not reported healthy")
        status, body = _post_json(port, {**LONG, "max_tokens": 3})
        assert status == 200 and body["usage"]["completion_tokens"] == 3
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        log = process.stderr.read()
    finally:
        process.kill()
        with contextlib.suppress(ProcessLookupError):
            os.kill(engine, signal.SIGCONT)
    assert "Traceback" not in log


def test_a_step_that_never_returns_stalls_the_thread_engine_until_it_does(checkpoint):
    """The engine on a thread: a step that does not return makes no sign of life either."""
    server = ServerThread(checkpoint, "thread", chat=False, stall_timeout=1.0)
    release, step = threading.Event(), server.engine.step

    def hanging_step():
        release.wait(60)
        return step()

    server.engine.step = hanging_step
    try:
        started = time.monotonic()
        status, body = server.post("/v1/completions", b'{"model": "tiny", "prompt": "to", "max_tokens": 2}')
        assert status == 503 and body["error"]["code"] == "engine_stalled" and time.monotonic() - started < 4
        assert _get(server.port, "/health")[0] == 503
        release.set()
        _wait_for(lambda: _get(server.port, "/health")[0] == 200, 5, "the engine is still reported stalled")
        assert server.client().completions.create(model="tiny", prompt="to", max_tokens=2).usage.completion_tokens == 2
    finally:
        release.set()
        server.stop()


def test_sigterm_with_a_stopped_engine_exits_within_the_shutdown_timeout(checkpoint):
    """The engine process stopped with requests in flight (one streaming, one waiting for the engine to take it):
    the stop ends both at the timeout (the server answers them itself: the engine cannot), kills the engine
    process and exits 0 within the timeout and a small margin, with no traceback."""
    process, port = _start_cli_server(checkpoint, "--shutdown-timeout", "1", "--threads", "1", step_seconds=0.02)
    engine = _engine_pid(process.pid)
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            stream = pool.submit(_stream_events, port, LONG)
            _wait_for(lambda: _metric(port, "tformer_running_sequences") == 1, 30, "the stream is not decoding")
            os.kill(engine, signal.SIGSTOP)
            whole = pool.submit(_post_json, port, LONG)
            time.sleep(0.5)  # the whole request waits for the stopped engine
            process.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            assert process.wait(timeout=30) == 0
            took = time.monotonic() - signalled
            status, body = whole.result(timeout=10)
            events = stream.result(timeout=10)
        log = process.stderr.read()
    finally:
        process.kill()
        with contextlib.suppress(ProcessLookupError):
            os.kill(engine, signal.SIGCONT)
    assert 1 <= took < 5, took  # the timeout, ending what is in flight, killing the engine, the exit
    assert status == 503 and body["error"]["code"] == "shutting_down"
    assert events[-1] == b"[DONE]" and json.loads(events[-2])["error"]["code"] == "shutting_down"
    _wait_for(lambda: not _running(engine), 5, "the stopped engine process outlived the server")
    assert "Traceback" not in log and "Cancel" not in log, log
    assert "the engine did not stop in time and was ended" in log


def test_a_second_signal_stops_at_once_without_a_traceback(checkpoint):
    """Requests in flight and a long shutdown timeout: the second SIGTERM ends them (streams with [DONE], a whole
    answer with a 503) and the server exits 0 within a second or two (it took 8 s and logged a CancelledError's
    traceback), its engine stopped, nothing logged but its lines."""
    process, port = _start_cli_server(checkpoint, "--shutdown-timeout", "30", "--threads", "1", step_seconds=0.02)
    try:
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            streams = [pool.submit(_stream_events, port, LONG) for _ in range(2)]
            whole = pool.submit(_post_json, port, LONG)
            _wait_for(lambda: _metric(port, "tformer_running_sequences") == 3, 30, "the requests are not decoding")
            process.send_signal(signal.SIGTERM)
            time.sleep(0.5)
            process.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            assert process.wait(timeout=30) == 0
            took = time.monotonic() - signalled
            status, body = whole.result(timeout=10)
            events = [stream.result(timeout=10) for stream in streams]
        log = process.stderr.read()
    finally:
        process.kill()
    assert took < 3, took  # most of it the interpreter's exit, with torch loaded
    assert status == 503 and body["error"]["code"] == "shutting_down"
    assert all(lines[-1] == b"[DONE]" for lines in events)
    assert "a second signal" in log and "0 cache blocks in use" in log
    assert "Traceback" not in log and "Cancel" not in log and "ERROR" not in log, log


@pytest.mark.slow
def test_the_shutdown_lines_of_a_server_whose_engine_was_killed_report_no_stale_figures(checkpoint):
    """The engine process killed with requests decoding, then SIGTERM: the lines said '3 sequence(s) in flight get
    up to 30 s' and '6 cache blocks in use', the engine's last figures from before it died."""
    process, port = _start_cli_server(checkpoint, "--threads", "1", step_seconds=0.05)
    engine = _engine_pid(process.pid)
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            streams = [pool.submit(_stream_events, port, LONG) for _ in range(2)]
            _wait_for(lambda: _metric(port, "tformer_running_sequences") == 2, 30, "the requests are not decoding")
            os.kill(engine, signal.SIGKILL)
            events = [stream.result(timeout=30) for stream in streams]
        assert all(b"the engine process ended (exit code -9)" in lines[-2] for lines in events)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        log = process.stderr.read()
    finally:
        process.kill()
    died = "the engine process ended (exit code -9)"
    assert log.splitlines() == [
        f"tformer serve: stopping: no new requests; none in flight: the engine had stopped ({died})",
        f"tformer serve: stopped: 0 request(s) finished, 0 cancelled, 0 timed out; the engine had stopped before "
        f"({died}): these are its figures up to then"], log
