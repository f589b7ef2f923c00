"""``POST /v1/embeddings`` through the real ``openai`` client (``client.embeddings.create``): a tiny BERT folder
(embeddings only: the generation routes answer 400) and the tiny GPT-2-shaped decoder of test_serving_server.py
(both), with the engine in its process and on a thread; vectors equal ``tformer.embed`` of each input alone (the
in-process forward + pooling) to 1e-5, as floats and as base64; texts, token ids and lists of either; a
sentence-transformers folder pooled as its config says; requests of different lengths batched in one engine step;
bad input a 400 naming it, after which the server keeps serving."""

import base64
import concurrent.futures

import numpy as np
import pytest
from embedding_models import TEXTS, bert_folder, sentence_transformers_folder, sentence_transformers_vectors
from test_serving_server import ServerThread, checkpoint  # noqa: F401 (the decoder's folder, a fixture)

import tformer
from tformer.pooling import Pooling
from tformer.serving import Engine

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.slow  # the openai client against servers

TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    return bert_folder(tmp_path_factory.mktemp("embed") / "bert")


def _pooling_options(engine, mode=None, normalize=None):
    """The engine's pooling option as each engine takes it: a Pooling (an Engine built here), the option's names
    (tformer serve's build_engine, in the engine process)."""
    if engine == "thread":
        return {} if mode is None else {"pooling": Pooling(mode, bool(normalize))}
    return {"pooling": mode, "normalize": normalize}


@pytest.fixture(scope="module", params=["process", "thread"])
def bert_server(request, bert):
    server = ServerThread(bert, request.param, chat=False, **_pooling_options(request.param, "cls"))
    yield server
    server.stop()


@pytest.fixture(scope="module", params=["process", "thread"])
def gpt_server(request, checkpoint):  # noqa: F811
    server = ServerThread(checkpoint, request.param, cache_tokens=1024, block_size=8,
                          **_pooling_options(request.param, "mean", True))
    yield server
    server.stop()


def alone(model, inputs, **pooling):
    """Each input embedded by itself in this process."""
    return np.stack([tformer.embed(model, [item], **pooling)[0].numpy() for item in inputs])


def vectors_of(response):
    assert [item.index for item in response.data] == list(range(len(response.data)))
    return np.array([item.embedding for item in response.data], dtype=np.float32)


def test_an_encoder_embeds_as_in_process_floats_and_base64(bert_server):
    client, model = bert_server.client(), bert_server.model
    expected = alone(model, TEXTS)
    base64_answer = client.embeddings.create(model="tiny", input=TEXTS)  # the client asks for base64
    assert np.abs(vectors_of(base64_answer) - expected).max() < TOLERANCE
    floats = client.embeddings.create(model="tiny", input=TEXTS, encoding_format="float")
    assert np.abs(vectors_of(floats) - expected).max() < TOLERANCE
    tokens = sum(len(model.tokenizer.encode(text)) for text in TEXTS)
    assert (floats.usage.prompt_tokens, floats.usage.total_tokens) == (tokens, tokens)
    assert floats.model == "tiny" and floats.object == "list" and floats.data[0].object == "embedding"
    status, raw = bert_server.post("/v1/embeddings", b'{"model": "tiny", "input": "arms", "encoding_format": "base64"}')
    assert status == 200
    decoded = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
    assert np.abs(decoded - expected[3]).max() < TOLERANCE


def test_token_ids_and_lists_of_them(bert_server):
    client, model = bert_server.client(), bert_server.model
    ids = [model.tokenizer.encode(text) for text in TEXTS]
    expected = alone(model, ids)
    one = client.embeddings.create(model="tiny", input=ids[2], encoding_format="float")
    assert len(one.data) == 1 and np.abs(vectors_of(one)[0] - expected[2]).max() < TOLERANCE
    many = client.embeddings.create(model="tiny", input=ids)
    assert np.abs(vectors_of(many) - expected).max() < TOLERANCE
    assert many.usage.prompt_tokens == sum(map(len, ids))


def test_an_encoder_serves_embeddings_only(bert_server):
    client = bert_server.client()
    with pytest.raises(openai.BadRequestError, match="embeds only .*POST /v1/embeddings"):
        client.completions.create(model="tiny", prompt="to be", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="embeds only"):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
    assert client.embeddings.create(model="tiny", input="arms").data


def test_a_decoder_serves_embeddings_beside_completions(gpt_server):
    client, model = gpt_server.client(), gpt_server.model
    texts = ["to be or", "the question.", "ROMEO: JULIET: user assistant"]
    answer = client.embeddings.create(model="tiny", input=texts)
    assert np.abs(vectors_of(answer) - alone(model, texts, pooling="mean", normalize=True)).max() < TOLERANCE
    assert np.allclose(np.linalg.norm(vectors_of(answer), axis=1), 1.0, atol=1e-5)
    assert client.completions.create(model="tiny", prompt="to be", max_tokens=3, temperature=0).choices[0].text


@pytest.mark.parametrize("kwargs, status, message", [
    (dict(input=[]), 400, "input is empty"),
    (dict(input=""), 400, "input 0 is empty"),
    (dict(input=["arms", ""]), 400, "input 1 is empty"),
    (dict(input="arms", dimensions=8), 400, "dimensions=8 is not supported: model 'tiny' gives 32-dimensional"),
    (dict(input=" ".join(["to be"] * 40)), 400, "input 0 has .* tokens; model 'tiny' reads at most 32"),
    (dict(input=[[5, 6], [5, 999]]), 400, r"input 1: token id 999 is outside the vocabulary"),
    (dict(input="arms", model="other"), 404, "model 'other' does not exist"),
    (dict(input="arms", encoding_format="binary"), 422, "encoding_format"),
])
def test_bad_input_is_a_400_naming_it_and_the_server_keeps_serving(bert_server, kwargs, status, message):
    client = bert_server.client()
    with pytest.raises(openai.APIStatusError, match=message) as caught:
        client.embeddings.create(**{"model": "tiny", **kwargs})
    assert caught.value.status_code == status
    assert client.embeddings.create(model="tiny", input="arms").data


def test_a_server_without_pooling_refuses_embeddings(checkpoint):  # noqa: F811
    server = ServerThread(checkpoint, "thread", cache_tokens=256, block_size=8)  # an Engine without a pooling
    try:
        client = server.client()
        with pytest.raises(openai.BadRequestError, match="model 'tiny' has no pooling, so it serves no embeddings"):
            client.embeddings.create(model="tiny", input="to be")
        assert client.completions.create(model="tiny", prompt="to be", max_tokens=2).choices[0].text is not None
    finally:
        server.stop()


def test_concurrent_requests_of_different_lengths_share_a_step_and_equal_each_alone(bert_server):
    client, model = bert_server.client(), bert_server.model
    inputs = [TEXTS[index % len(TEXTS)] for index in range(12)]
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(lambda text: client.embeddings.create(model="tiny", input=text), inputs))
    got = np.stack([vectors_of(answer)[0] for answer in answers])
    assert np.abs(got - alone(model, inputs)).max() < TOLERANCE
    assert bert_server.stats().embedded_inputs >= 12


def test_the_engine_batches_waiting_requests_in_one_forward(bert):
    model = tformer.load(bert)
    engine = Engine(model, model.tokenizer, pooling=Pooling("mean"))
    answers = []
    ids = [model.tokenizer.encode(text) for text in TEXTS]
    for sequences in (ids[:2], ids[2:3], ids[3:]):
        engine.embed(sequences, answers.append)
    assert engine.step() == len(ids) and not engine.has_work()  # every input in the first step's one forward
    got = np.stack([np.frombuffer(vector, "<f4") for answer in answers for vector in answer.vectors])
    assert np.abs(got - alone(model, ids, pooling="mean")).max() < TOLERANCE
    with pytest.raises(tformer.generation.GenerationError, match="embeds only"):
        engine.submit(ids[0])
    with pytest.raises(tformer.generation.GenerationError, match="overlap=True: this model writes no text"):
        Engine(model, model.tokenizer, pooling=Pooling("mean"), overlap=True)  # no decode steps: refused
    for switch in ({"paged_attention": "gather"}, {"prefix_caching": True}):  # no key/value cache: refused
        with pytest.raises(tformer.generation.GenerationError, match=f"{next(iter(switch))}=.*embeddings only"):
            Engine(model, model.tokenizer, pooling=Pooling("mean"), **switch)


def test_a_sentence_transformers_folder_is_served_with_its_pooling(tmp_path):
    folder = sentence_transformers_folder(tmp_path / "st", "mean", normalize=True)
    server = ServerThread(folder, "process", chat=False)  # tformer serve's engine: the folder's pooling
    try:
        ids = [server.model.tokenizer.encode(text) for text in TEXTS]
        answer = server.client().embeddings.create(model="tiny", input=TEXTS)
        expected = sentence_transformers_vectors(folder, ids, "mean", True).numpy()
        assert np.abs(vectors_of(answer) - expected).max() < TOLERANCE
        assert server.engine_client.facts.embedding.source == "1_Pooling/config.json"
    finally:
        server.stop()


def test_cancelling_the_wait_cancels_the_engines_request(bert):
    model = tformer.load(bert)
    engine = Engine(model, model.tokenizer, pooling=Pooling("cls"))
    answers = []
    request = engine.embed([[5, 6]], answers.append)
    engine.cancel(request.id)
    assert engine.step() == 0 and answers[0].error == "cancelled" and not engine.has_work()
    assert engine.stats.embedded_inputs == 0
