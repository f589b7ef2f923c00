"""A folder's generation_config.json read as Hugging Face's ``generate`` reads it: an end-id list (Llama 3
Instruct's kind) stops greedy decoding where ``generate`` stops, sampling and length defaults reach the
GenerationConfig (a caller's option winning), Whisper's suppressions there decode as Hugging Face, and a field
tformer cannot honour is refused in one line naming it (Whisper's suppressions: test_interop_whisper.py)."""

import json

import pytest
import torch

import tformer
from tformer.checkpoint import CheckpointError
from tformer.cli import main
from tformer.generation.defaults import model_defaults

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.slow  # compares with transformers

PROMPTS = torch.tensor([[5, 9, 11, 40], [7, 2, 60, 61]])


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A tiny random LlamaForCausalLM folder (config.json's eos_token_id 3, which these weights never produce)
    and its greedy continuations without any end."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=97, hidden_size=24, intermediate_size=40, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, eos_token_id=3, bos_token_id=1)
    folder = tmp_path_factory.mktemp("llama") / "plain"
    transformers.LlamaForCausalLM(config).eval().save_pretrained(folder)
    plain = tformer.generate(tformer.load(folder), PROMPTS, 12, eos_token_id=())[:, PROMPTS.shape[1]:]
    return folder, plain


def with_generation_config(folder, target, **changes):
    """A copy of ``folder`` whose generation_config.json holds ``changes`` over what save_pretrained wrote
    (a value None removes the key)."""
    target.mkdir()
    for path in folder.iterdir():
        (target / path.name).write_bytes(path.read_bytes())
    raw = {**json.loads((folder / "generation_config.json").read_text()), **changes}
    (target / "generation_config.json").write_text(json.dumps({k: v for k, v in raw.items() if v is not None}))
    return target


def hf_generate(folder, **options):
    hf = transformers.LlamaForCausalLM.from_pretrained(folder).eval()
    return hf.generate(PROMPTS, attention_mask=torch.ones_like(PROMPTS), **options)


def test_an_end_id_list_stops_greedy_decoding_where_hugging_face_stops(llama, tmp_path):
    folder, plain = llama
    row_one_end = next(int(token) for token in plain[1, 3:] if token not in plain[1, :3])
    ends = [row_one_end, 96, int(plain[0, 2])]  # Llama 3 Instruct's shape: several ids, the first not the last
    folder = with_generation_config(folder, tmp_path / "ends", eos_token_id=ends)
    ours = tformer.load(folder)
    assert model_defaults(ours).end_ids(ours.config) == tuple(ends)
    expected = hf_generate(folder, max_new_tokens=12)
    got = tformer.generate(ours, PROMPTS, 12)
    assert torch.equal(got, expected)
    assert got.shape[1] < PROMPTS.shape[1] + 12  # both rows ended early, filled with the first end id
    # A caller's end ids win over the folder's.
    assert torch.equal(tformer.generate(ours, PROMPTS, 12, eos_token_id=()), torch.cat([PROMPTS, plain], 1))


def test_a_file_without_an_end_id_never_ends_early_as_in_hugging_face(llama, tmp_path):
    folder, plain = llama
    ends = [int(plain[0, 1])]
    base = with_generation_config(folder, tmp_path / "config-ends", eos_token_id=None)
    raw = json.loads((base / "config.json").read_text())
    (base / "config.json").write_text(json.dumps({**raw, "eos_token_id": ends[0]}))  # config.json's is not read
    ours = tformer.load(base)
    assert torch.equal(tformer.generate(ours, PROMPTS, 6), hf_generate(base, max_new_tokens=6))
    assert tformer.generate(ours, PROMPTS, 6).shape[1] == PROMPTS.shape[1] + 6


def test_sampling_and_length_defaults_reach_the_generation_config(llama, tmp_path):
    folder, plain = llama
    folder = with_generation_config(folder, tmp_path / "sampling", do_sample=True, temperature=0.6, top_p=0.9,
                                    max_length=9, eos_token_id=[3])
    ours = tformer.load(folder)
    defaults = model_defaults(ours)
    assert (defaults.do_sample, defaults.temperature, defaults.top_k, defaults.top_p) == (True, 0.6, 50, 0.9)
    assert defaults.sampling and defaults.max_length == 9
    sampled = tformer.generate(ours, PROMPTS, seed=0)
    assert sampled.shape[1] == 9  # max_length counts the prompt, as in Hugging Face
    assert torch.equal(sampled, tformer.generate(ours, PROMPTS, 5, do_sample=True, temperature=0.6, top_k=50,
                                                 top_p=0.9, eos_token_id=[3], seed=0))
    # The caller's options win: greedy and a length of its own, equal to Hugging Face's with the same options.
    greedy = tformer.generate(ours, PROMPTS, 7, do_sample=False)
    assert torch.equal(greedy, hf_generate(folder, max_new_tokens=7, do_sample=False))
    assert torch.equal(greedy[:, 4:], plain[:, :7])


def test_the_cli_takes_the_folders_defaults_and_its_options_win(llama, tmp_path, capsys):
    folder, _ = llama
    folder = with_generation_config(folder, tmp_path / "cli", max_new_tokens=3, temperature=0.5, do_sample=True)
    model = tformer.load(folder)
    from tformer.cli.generate import call_config

    config = call_config(model, {})
    assert (config.max_new_tokens, config.temperature, config.do_sample) == (3, 0.5, True)
    config = call_config(model, {"max_new_tokens": 5, "temperature": 0.0})
    assert (config.max_new_tokens, config.sampling) == (5, False)
    greedy = tformer.load(with_generation_config(folder, tmp_path / "greedy", do_sample=False, max_new_tokens=None))
    assert not call_config(greedy, {}).sampling and call_config(greedy, {"top_k": 5}).sampling  # --top-k samples
    assert call_config(greedy, {}).max_new_tokens == 100  # the command's own default without a length


@pytest.mark.parametrize(("changes", "named"), [
    ({"typical_p": 0.9}, "typical_p=0.9 is not supported by tformer (supported: 1.0)"),
    ({"repetition_penalty": 0}, "repetition_penalty=0 must be a number > 0"),
    ({"no_repeat_ngram_size": 3}, "no_repeat_ngram_size=3"),
    ({"watermarking_config": {"greenlist_ratio": 0.25}}, "watermarking_config="),
    ({"return_timestamps": True}, "return_timestamps=True"),
    ({"brand_new_option": 1}, "brand_new_option=1 is not supported by tformer (it honours"),
    ({"top_k": "many", "do_sample": True}, "top_k='many' must be an integer >= 1"),
])
def test_a_field_tformer_cannot_honour_is_refused_naming_it(llama, tmp_path, capsys, changes, named):
    folder = with_generation_config(llama[0], tmp_path / "refused", **changes)
    with pytest.raises(CheckpointError, match="generation_config.json") as caught:
        tformer.load(folder)
    assert named in str(caught.value) and "\n" not in str(caught.value)
    assert main(["generate", str(folder), "--prompt", "x"]) == 2
    assert named in capsys.readouterr().err


def test_a_repetition_penalty_and_min_p_are_read_as_hugging_face_reads_them(llama, tmp_path):
    """Qwen2.5-Instruct's file holds repetition_penalty 1.05 (with do_sample, top_p...): the penalty applies to greedy
    decoding too, min_p only when sampling, as in Hugging Face."""
    folder, plain = llama
    penalised = with_generation_config(folder, tmp_path / "penalty", repetition_penalty=1.5, min_p=0.2)
    ours = tformer.load(penalised)
    assert (model_defaults(ours).repetition_penalty, model_defaults(ours).min_p) == (1.5, None)  # no do_sample
    expected = hf_generate(penalised, max_new_tokens=12)
    assert torch.equal(tformer.generate(ours, PROMPTS, 12), expected)
    assert not torch.equal(expected[:, PROMPTS.shape[1]:], plain)  # it bites
    sampling = tformer.load(with_generation_config(folder, tmp_path / "min-p", do_sample=True, min_p=0.2))
    assert model_defaults(sampling).min_p == 0.2 and model_defaults(sampling).sampling


def test_neutral_values_and_ignored_fields_load(llama, tmp_path):
    folder = with_generation_config(llama[0], tmp_path / "neutral", repetition_penalty=1.0, num_beam_groups=1,
                                    cache_implementation="static", output_scores=True)
    assert model_defaults(tformer.load(folder)).end_ids(tformer.load(folder).config) == (3,)


def test_without_the_file_config_jsons_end_id_list_is_used_whole(llama, tmp_path):
    """No generation_config.json: Hugging Face builds its defaults from config.json, a Llama 3 list included."""
    folder, plain = llama
    ends = [int(plain[1, 3]), int(plain[0, 2])]
    target = with_generation_config(folder, tmp_path / "no-file")
    (target / "generation_config.json").unlink()
    raw = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**raw, "eos_token_id": ends}))
    ours = tformer.load(target)
    assert ours.generation_config is None
    got = tformer.generate(ours, PROMPTS, 12)
    assert torch.equal(got, hf_generate(target, max_new_tokens=12)) and got.shape[1] < PROMPTS.shape[1] + 12


def test_the_serving_engine_stops_at_the_files_end_ids(llama, tmp_path):
    from tformer.generation import GenerationConfig
    from tformer.serving import Engine

    folder, plain = llama
    end = int(plain[0, 2])
    ours = tformer.load(with_generation_config(folder, tmp_path / "served", eos_token_id=[96, end]))
    (ended,) = Engine(ours, cache_tokens=64, block_size=8).complete([PROMPTS[0].tolist()],
                                                                     GenerationConfig(max_new_tokens=12))
    free = plain[0].tolist()
    assert ended.outputs()[0] == free[: free.index(end) + 1] and ended.finish_reasons() == ["stop"]
