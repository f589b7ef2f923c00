"""An encoder-decoder served: ``/v1/completions`` whose prompt is the source text, through the real ``openai`` client
under 16 concurrent clients, answers what ``translate`` (``tformer translate``) writes for each sentence alone, greedy
and with 4 beams; the chat route refuses it by name."""

import concurrent.futures

import pytest
import torch
from test_serving_server import ServerThread

import tformer
from tformer.generation.translation import translate
from tformer.tokenizers import CharTokenizer

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.slow  # the openai client against a server

SENTENCES = ["ein hund läuft", "zwei katzen", "der mann liest ein buch am fenster", "kinder", "eine frau singt laut",
             "rote blumen im garten", "ein alter mann", "der zug kommt", "wir essen brot", "sie lacht",
             "ein kleines boot auf dem see", "die sonne", "zwei hunde spielen im schnee", "er schläft", "musik",
             "ein mädchen mit einem ball"]
# translate leaves special tokens out of its text; the server keeps them unless asked
AS_TRANSLATE_PRINTS = {"skip_special_tokens": True}


@pytest.fixture(scope="module")
def translator_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("serve-translation") / "tiny-translator"
    tokenizer = CharTokenizer.train("".join(SENTENCES), special_tokens=["<pad>", "<s>", "</s>", "<unk>"])
    torch.manual_seed(0)
    model = tformer.build_model("transformer-multi30k", vocab_size=tokenizer.vocab_size, d_model=32, num_heads=4,
                                num_layers=2, d_ff=64, max_seq_len=64, dropout=0.0, initializer_range=0.3)
    model.tokenizer = tokenizer
    model.save(folder)
    return folder


@pytest.fixture(scope="module", params=["process", "thread"])
def server(request, translator_folder):
    served = ServerThread(translator_folder, request.param, chat=False, cache_tokens=2048, block_size=8,
                          max_running=16)
    yield served
    served.stop()


def test_sixteen_concurrent_clients_get_what_translate_writes(server):
    expected = translate(server.model, SENTENCES, num_beams=1, max_new_tokens=20).texts
    assert len(set(expected)) > 8  # the sources lead to different translations

    def ask(sentence):
        answer = server.client().completions.create(model="tiny", prompt=sentence, max_tokens=20, temperature=0,
                                                    extra_body=AS_TRANSLATE_PRINTS)
        return answer.choices[0].text

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        served = list(pool.map(ask, SENTENCES))
    assert [text.strip() for text in served] == expected


def test_beam_search_answers_are_translates_beam_4(server):
    expected = translate(server.model, SENTENCES, num_beams=4, max_new_tokens=20).texts

    def ask(sentence):
        answer = server.client().completions.create(model="tiny", prompt=sentence, max_tokens=20, temperature=0,
                                                    extra_body={"num_beams": 4, **AS_TRANSLATE_PRINTS})
        return answer.choices[0].text

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        served = list(pool.map(ask, SENTENCES))
    assert [text.strip() for text in served] == expected


def test_a_translations_default_length_is_translates(server):
    sentence = SENTENCES[2]
    (expected,) = translate(server.model, [sentence], num_beams=1).texts
    answer = server.client().completions.create(model="tiny", prompt=sentence, temperature=0,
                                                extra_body=AS_TRANSLATE_PRINTS)
    assert answer.choices[0].text.strip() == expected


def test_the_chat_route_refuses_an_encoder_decoder(server):
    with pytest.raises(openai.BadRequestError, match=r"is an encoder-decoder: .* send the source to POST "
                                                     r"/v1/completions"):
        server.client().chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hallo"}])
