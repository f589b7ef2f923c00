"""GGUF both ways (tformer/interop/gguf*.py): tformer decoders written as GGUF and read back, GGUF files laid out
as llama.cpp's converter lays them out read into tformer, and what is refused. Every file is made here.

Independent checks where llama.cpp itself is absent (llama-cpp-python has no prebuilt wheel on PyPI for this
host): transformers' own GGUF loader (``from_pretrained(gguf_file=...)``, which dequantizes with gguf and undoes
llama.cpp's query/key permutation itself) reads the files tformer writes.
"""

from __future__ import annotations

import copy
import io
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType, GGUFWriter  # noqa: E402
from gguf import quants as gguf_quants  # noqa: E402

import tformer  # noqa: E402
from tformer.checkpoint import CheckpointError  # noqa: E402
from tformer.cli import main as cli_main  # noqa: E402
from tformer.hub import read_model_config  # noqa: E402
from tformer.interop.gguf import load_gguf_weights, read_gguf, save_gguf  # noqa: E402
from tformer.interop.gguf_layout import permute_qk, unpermute_qk  # noqa: E402
from tformer.interop.gguf_tokenizer import PRE_TOKENIZERS, tokenizer_from_gguf  # noqa: E402
from tformer.quantization import quantize  # noqa: E402
from tformer.tokenizers import train  # noqa: E402

Q = GGMLQuantizationType
VOCAB = 96
LLAMA = dict(vocab_size=VOCAB, max_seq_len=64, d_model=64, num_layers=2, num_heads=4, num_kv_heads=2,
             activation="swiglu", norm="rmsnorm", positional="rope", bias=False, tie_embeddings=False, d_ff=96)
QWEN2 = dict(LLAMA, num_kv_heads=1, tie_embeddings=True, attention_bias=True, output_bias=False, norm_bias=False,
             feedforward_bias=False, rope_theta=1e6, extra={"hf_model_type": "qwen2"})
TEXTS = ["The quick brown fox jumps over the lazy dog. It's 12345 o'clock!\n",
         "héllo wörld — 日本語 and code: x += 1\n"]


def tiny(config: dict, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return tformer.build_model(tformer.ModelConfig(**config)).eval()


def load_gguf(path: Path) -> torch.nn.Module:
    """The model of a GGUF file, as tformer convert builds it."""
    checkpoint = read_gguf(path)
    return load_gguf_weights(tformer.build_model(checkpoint.config), checkpoint)


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


IDS = torch.randint(0, VOCAB, (2, 13), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("config, arch", [(LLAMA, "llama"), (QWEN2, "qwen2")],
                         ids=["llama-gqa-untied", "qwen2-mqa-tied"])
def test_a_float_model_round_trips_exactly(tmp_path, config, arch):
    model = tiny(config)
    written = save_gguf(model, tmp_path / "m.gguf")
    assert written.architecture == arch and set(written.tensor_types.values()) == {"F32"}
    back = load_gguf(tmp_path / "m.gguf")
    assert back.config == model.config
    assert torch.equal(logits(back, IDS), logits(model, IDS))


@pytest.mark.parametrize("scaling", [
    {"rope_type": "linear", "factor": 2.0},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 8192},
], ids=lambda scaling: scaling["rope_type"])
def test_rope_scaling_round_trips(tmp_path, scaling):
    """linear and yarn as rope.scaling.* keys; llama3 as the rope_freqs.weight table convert_hf_to_gguf.py writes
    (read back when it is Llama 3.1's table of factors 1 and 4: recognised, not guessed)."""
    model = tiny(dict(LLAMA, rope_theta=500000.0, rope_scaling=scaling))
    written = save_gguf(model, tmp_path / "m.gguf")
    assert ("rope_freqs.weight" in written.tensor_types) == (scaling["rope_type"] == "llama3")
    back = load_gguf(tmp_path / "m.gguf")
    assert back.config.rope_scaling == model.config.rope_scaling
    assert torch.equal(logits(back, IDS), logits(model, IDS))


def test_the_query_key_permutation_is_undone():
    rows = np.arange(2 * 8 * 3, dtype=np.float32).reshape(16, 3)  # 2 heads of 8 rows
    permuted = permute_qk(rows, 2)
    assert permuted[:, 0].tolist()[:8] == [0, 12, 3, 15, 6, 18, 9, 21]  # head 0: rows 0,4,1,5,... interleaved
    assert np.array_equal(unpermute_qk(permuted, 2), rows)


def directly_quantized(model, kind: GGMLQuantizationType):
    """``model`` with every 2-D weight quantized straight from float by gguf as ``kind`` (the reference error)."""
    model = copy.deepcopy(model)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.dim() == 2:
                values = parameter.numpy()
                table = name.startswith("embedding")  # tformer's tables are int8 rows in every scheme: Q8_0 here
                direct = gguf_quants.dequantize(gguf_quants.quantize(values, Q.Q8_0 if table else kind),
                                                Q.Q8_0 if table else kind)
                parameter.copy_(torch.from_numpy(direct.reshape(values.shape)))
    return model


def block_bound(weight: torch.Tensor, kind: GGMLQuantizationType) -> torch.Tensor:
    """The most GGUF's rounding can move each weight: Q8_0 rounds to half its block's step d = amax / 127; Q4_0's
    step is amax / 8, and the extreme of the other sign is clipped from +8 to +7 steps, a whole step. The integers
    are found with d in float32 and stored with d in float16: up to 127 (Q4_0: 8) times d's float16 rounding more."""
    amax = weight.reshape(weight.shape[0], -1, 32).abs().amax(dim=-1, keepdim=True)
    levels = 127 if kind == Q.Q8_0 else 8
    step = amax / levels
    bound = (step / 2 if kind == Q.Q8_0 else step) + levels * (step.half().float() - step).abs()
    return (bound * (1 + 1e-5) + 1e-8).expand(-1, -1, 32).reshape(weight.shape)


@pytest.mark.parametrize("method, kind", [("int8", Q.Q8_0), ("int4", Q.Q4_0)])
def test_quantized_models_are_written_as_q8_0_and_q4_0(tmp_path, method, kind):
    """The file re-quantizes tformer's dequantized weights, so read back it carries tformer's error plus one more
    rounding by GGUF's quantizer: its distance from tformer's quantized model must stay within what quantizing
    the float weights straight with gguf costs (the reference), its distance from the float model within both."""
    model = tiny(LLAMA)
    quantized = quantize(copy.deepcopy(model), method, **({"group_size": 32} if method == "int4" else {}))
    written = save_gguf(quantized, tmp_path / f"{method}.gguf")
    assert {name for name, t in written.tensor_types.items() if t == kind.name} >= {"blk.0.attn_q.weight",
                                                                                     "output.weight"}
    assert written.tensor_types["token_embd.weight"] == "Q8_0" and written.tensor_types["output_norm.weight"] == "F32"
    back = load_gguf(tmp_path / f"{method}.gguf")
    reference = (logits(directly_quantized(model, kind), IDS) - logits(model, IDS)).abs().max().item()
    ours = (logits(quantized, IDS) - logits(model, IDS)).abs().max().item()
    requantized = (logits(back, IDS) - logits(quantized, IDS)).abs().max().item()
    total = (logits(back, IDS) - logits(model, IDS)).abs().max().item()
    print(f"{method} -> {kind.name}: max |logit| diff: file vs tformer {method} {requantized:.2e}, file vs float "
          f"{total:.2e}; tformer {method} vs float {ours:.2e}; gguf {kind.name} of the float weights vs float "
          f"{reference:.2e}", file=sys.stderr)
    assert 0 < requantized <= 2 * reference  # one more rounding of GGUF's, of the order of GGUF's alone
    assert total <= 1.5 * (reference + ours)
    ours_state = tformer.quantization.dequantized(copy.deepcopy(quantized)).state_dict()
    for name, weight in back.state_dict().items():  # each weight within one GGUF rounding of tformer's value
        if weight.dim() == 2:
            table = name.startswith("embedding")
            bound = block_bound(ours_state[name], Q.Q8_0 if table else kind)
            assert ((weight - ours_state[name]).abs() <= bound).all(), name


def test_a_tokenizer_round_trips_and_llama_cpp_metadata_is_written(tmp_path):
    tokenizer = train("bpe", TEXTS * 3, vocab_size=300, special_tokens=["<|endoftext|>"])
    model = tiny(dict(LLAMA, vocab_size=tokenizer.vocab_size, eos_token_id=tokenizer.vocab_size - 1))
    model.tokenizer = tokenizer
    save_gguf(model, tmp_path / "m.gguf")
    fields = {name: field.contents() for name, field in gguf.GGUFReader(tmp_path / "m.gguf").fields.items()}
    assert fields["general.architecture"] == "llama" and fields["llama.block_count"] == 2
    assert fields["llama.attention.head_count_kv"] == 2 and fields["tokenizer.ggml.model"] == "gpt2"
    assert fields["tokenizer.ggml.pre"] == "gpt-2"
    back = load_gguf(tmp_path / "m.gguf")
    for text in TEXTS:
        assert back.tokenizer.encode(text) == tokenizer.encode(text)
        assert back.tokenizer.decode(tokenizer.encode(text)) == text


@pytest.mark.slow
@pytest.mark.parametrize("pre", ["gpt-2", "llama-bpe", "qwen2"])
def test_byte_level_gguf_tokenizers_encode_as_hugging_face_tokenizers_does(tmp_path, pre):
    """A gpt2 GGUF tokenizer of each pre-tokenizer llama.cpp names (its regex, Llama 3's ignore_merges, Qwen2's NFC)
    gives the ids Hugging Face ``tokenizers`` gives on the tokenizer.json it stands for; written back, the same."""
    hf_tokenizers = pytest.importorskip("tokenizers")

    trained = train("bpe", TEXTS * 3, vocab_size=300, special_tokens=["<|endoftext|>"],
                    pattern=PRE_TOKENIZERS[pre][0]).to_dict()
    tokens = [""] * 300
    for token, i in trained["model"]["vocab"].items():
        tokens[i] = token
    for entry in trained["added_tokens"]:
        tokens[entry["id"]] = entry["content"]
    types = [3 if any(entry["id"] == i for entry in trained["added_tokens"]) else 1 for i in range(300)]
    fields = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": tokens,
              "tokenizer.ggml.token_type": types,
              "tokenizer.ggml.merges": [m if isinstance(m, str) else " ".join(m) for m in trained["model"]["merges"]]}
    tokenizer, problem = tokenizer_from_gguf(fields)
    assert problem is None
    tokenizer.save(tmp_path / "tokenizer.json")
    reference = hf_tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    model = tiny(dict(LLAMA, vocab_size=300))
    model.tokenizer = tokenizer
    save_gguf(model, tmp_path / "m.gguf")
    written = load_gguf(tmp_path / "m.gguf").tokenizer
    for text in [*TEXTS, "ＡＢＣ ﬁ 1234567 e\u0301 <|endoftext|>"]:
        assert tokenizer.encode(text) == written.encode(text) == reference.encode(text).ids, text


def test_a_sentencepiece_gguf_tokenizer_merges_by_score():
    tokens = ["<unk>", "<s>", "</s>", "▁", "a", "b", "c", "ab", "▁ab", "bc", "▁c"]
    scores = [0, 0, 0, -1, -2, -3, -4, -5, -6, -7, -8]
    types = [2, 3, 3] + [1] * 8
    tokenizer, problem = tokenizer_from_gguf({
        "tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types, "tokenizer.ggml.unknown_token_id": 0, "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.add_bos_token": True})
    assert problem is None
    # "abc": a+b (ab, score -5) merges before b+c (bc, -7); "▁" + "ab" then makes "▁ab"
    assert tokenizer.encode("abc") == [1, 8, 6]
    assert tokenizer.decode([1, 8, 6], skip_special_tokens=True) == "abc"


@pytest.mark.slow
def test_a_sentencepiece_gguf_tokenizer_encodes_as_sentencepiece_does(tmp_path):
    """A SentencePiece BPE model (byte fallback, the dummy prefix, Llama 2's settings) as convert_hf_to_gguf.py
    stores it (pieces, scores, types): tformer's tokenizer from that metadata gives sentencepiece's own ids, and so
    does the one tformer writes and reads back."""
    spm = pytest.importorskip("sentencepiece")
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter([*TEXTS, "  spaces   and\ttabs\nnew lines"] * 20), model_writer=model, vocab_size=400,
        model_type="bpe", byte_fallback=True, normalization_rule_name="identity", remove_extra_whitespaces=False,
        character_coverage=1.0, minloglevel=2, hard_vocab_limit=False)
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    ids = range(sp.get_piece_size())
    types = [2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 5 if sp.is_unused(i) else 6 if sp.is_byte(i)
             else 1 for i in ids]
    tokenizer, problem = tokenizer_from_gguf({
        "tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": [sp.id_to_piece(i) for i in ids],
        "tokenizer.ggml.scores": [sp.get_score(i) for i in ids], "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.unknown_token_id": sp.unk_id(), "tokenizer.ggml.bos_token_id": sp.bos_id()})
    assert problem is None
    model = tiny(dict(LLAMA, vocab_size=sp.get_piece_size(), bos_token_id=sp.bos_id(), eos_token_id=sp.eos_id()))
    model.tokenizer = tokenizer
    save_gguf(model, tmp_path / "spm.gguf")  # written back as GGUF's llama tokenizer: scores from merge ranks
    fields = {name: field.contents() for name, field in gguf.GGUFReader(tmp_path / "spm.gguf").fields.items()}
    assert fields["tokenizer.ggml.model"] == "llama" and fields["tokenizer.ggml.add_space_prefix"] is True
    assert fields["tokenizer.ggml.token_type"] == types
    written = load_gguf(tmp_path / "spm.gguf").tokenizer
    for text in [*TEXTS, "  spaces   and\ttabs\nnew lines", "unseen ✨ emoji 🎉 and Ω", " leading space"]:
        assert tokenizer.encode(text) == written.encode(text) == sp.encode(text), text
        assert tokenizer.decode(sp.encode(text)) == sp.decode(sp.encode(text)) == text


def k_quant_blocks(shape: tuple[int, int], kind: GGMLQuantizationType) -> np.ndarray:
    """Random blocks of ``kind`` for a (rows, columns) weight, their float16 scales set small and finite (gguf
    cannot quantize K-quants, so blocks are made, not quantized)."""
    block, size = gguf.GGML_QUANT_SIZES[kind]
    blocks = np.random.default_rng(0).integers(0, 256, (shape[0] * shape[1] // block, size), dtype=np.uint8)
    scales = np.array([0.01, 0.001], dtype=np.float16).view(np.uint8)
    if kind == Q.Q4_K:
        blocks[:, :4] = scales  # d, dmin first
    elif kind == Q.Q6_K:
        blocks[:, -2:] = scales[:2]  # d last
    return blocks.reshape(shape[0], -1)


def llama_cpp_file(path: Path, hf_model, *, arch: str = "llama", skip: tuple[str, ...] = (),
                   kinds: dict[str, GGMLQuantizationType] | None = None,
                   quantized_as: GGMLQuantizationType | None = None) -> Path:
    """A GGUF file of a transformers LlamaForCausalLM as convert_hf_to_gguf.py lays it out: llama.cpp's names and
    metadata, query/key rows permuted, written with gguf's own GGUFWriter (2-D weights quantized by gguf as
    ``quantized_as``; ``kinds``: tensors given a type whose blocks are zeros)."""
    config = hf_model.config
    writer = GGUFWriter(path, arch)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"] if hasattr(config, "rope_parameters")
                              else config.rope_theta)
    writer.add_vocab_size(config.vocab_size)
    names = {"embed_tokens": "token_embd", "norm": "output_norm", "lm_head": "output", "input_layernorm": "attn_norm",
             "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
             "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for hf_name, tensor in hf_model.state_dict().items():
        module = hf_name.removeprefix("model.").removesuffix(".weight")
        layer, _, module = module.removeprefix("layers.").partition(".") if module.startswith("layers.") else (
            None, None, module)
        name = (f"blk.{layer}.{names[module]}" if layer is not None else names[module]) + ".weight"
        values = tensor.numpy()
        if module == "self_attn.q_proj":
            values = permute_qk(values, config.num_attention_heads)
        if module == "self_attn.k_proj":
            values = permute_qk(values, config.num_key_value_heads)
        kind = (kinds or {}).get(name)
        if name in skip:
            continue
        if kind is None and quantized_as is not None and values.ndim == 2:
            writer.add_tensor(name, gguf_quants.quantize(np.ascontiguousarray(values), quantized_as),
                              raw_dtype=quantized_as)
        elif kind is None:
            writer.add_tensor(name, np.ascontiguousarray(values))
        else:
            writer.add_tensor(name, k_quant_blocks(values.shape, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture
def hf_llama():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      rms_norm_eps=1e-5, tie_word_embeddings=False)
    return transformers.LlamaForCausalLM(config).eval()


@pytest.mark.slow
def test_a_llama_cpp_layout_file_of_a_transformers_llama_loads_with_its_logits(tmp_path, hf_llama):
    model = load_gguf(llama_cpp_file(tmp_path / "hf.gguf", hf_llama))
    difference = (logits(model, IDS) - logits(hf_llama, IDS)).abs().max().item()
    print(f"llama.cpp-layout F32 file of a transformers Llama: max |logit| diff {difference:.2e}", file=sys.stderr)
    assert difference <= 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("kind", [Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q5_1])
def test_a_quantized_llama_cpp_layout_file_loads_as_gguf_dequantizes_it(tmp_path, hf_llama, kind):
    """The file's logits equal those of the transformers model holding the weights gguf dequantizes (so tformer
    reads each type as llama.cpp's own Python package defines it), and stay within that type's error of the
    source model's."""
    model = load_gguf(llama_cpp_file(tmp_path / "q.gguf", hf_llama, quantized_as=kind))
    rounded = copy.deepcopy(hf_llama)
    with torch.no_grad():
        for parameter in rounded.parameters():
            if parameter.dim() == 2:
                values = parameter.numpy()
                parameter.copy_(torch.from_numpy(
                    gguf_quants.dequantize(gguf_quants.quantize(values, kind), kind).reshape(values.shape)))
    exact = (logits(model, IDS) - logits(rounded, IDS)).abs().max().item()
    error = (logits(model, IDS) - logits(hf_llama, IDS)).abs().max().item()
    print(f"llama.cpp-layout {kind.name} file: max |logit| diff {exact:.2e} from transformers on gguf's "
          f"dequantized weights, {error:.2e} from the float source", file=sys.stderr)
    assert exact <= 1e-5


@pytest.mark.slow
def test_k_quant_tensors_are_read_as_gguf_dequantizes_them(tmp_path):
    """K-quant blocks hold 256 weights: a Llama 256 wide, its feed-forward's down and up projections as Q4_K and
    Q6_K blocks (random, with small float16 scales), each read as gguf.quants.dequantize gives it."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=256, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64)).eval()
    kinds = {"blk.0.ffn_down.weight": Q.Q4_K, "blk.0.ffn_up.weight": Q.Q6_K}
    model = load_gguf(llama_cpp_file(tmp_path / "k.gguf", hf, kinds=kinds))
    feedforward = model.stack.blocks[0].feedforward
    for weight, kind in ((feedforward.out_proj.weight, Q.Q4_K), (feedforward.in_proj.weight[256:], Q.Q6_K)):
        expected = gguf_quants.dequantize(k_quant_blocks(tuple(weight.shape), kind), kind).reshape(weight.shape)
        assert torch.equal(weight, torch.from_numpy(expected)) and weight.abs().max() > 0, kind.name
    assert torch.isfinite(logits(model, IDS)).all()


@pytest.mark.slow
@pytest.mark.parametrize("config, method", [(LLAMA, None), (LLAMA, "int8"), (LLAMA, "int4"), (QWEN2, None)],
                         ids=["llama-f32", "llama-int8", "llama-int4", "qwen2-f32"])
def test_transformers_gguf_loader_reads_what_tformer_writes(tmp_path, config, method):
    """An independent reader of llama.cpp's layout (its own names, un-permutation and metadata keys)."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")  # transformers needs it to read GGUF
    model = tiny(config)
    if method is not None:
        quantize(model, method, **({"group_size": 32} if method == "int4" else {}))
    save_gguf(model, tmp_path / "m.gguf")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="m.gguf").eval()
    assert torch.allclose(logits(theirs, IDS), logits(load_gguf(tmp_path / "m.gguf"), IDS), atol=1e-5, rtol=0)


def gguf_refused(capsys, path: Path, message: str) -> None:
    with pytest.raises(CheckpointError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_gguf(path)
    assert cli_main(["convert", str(path), str(path.with_suffix(".out")), "--to", "tformer"]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert not path.with_suffix(".out").exists()


@pytest.mark.slow
def test_bad_files_are_refused_in_one_line(tmp_path, capsys, hf_llama):
    writer = GGUFWriter(tmp_path / "gpt2.gguf", "gpt2")
    writer.add_block_count(2)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    gguf_refused(capsys, tmp_path / "gpt2.gguf", "general.architecture='gpt2' is not read by tformer")
    llama_cpp_file(tmp_path / "missing.gguf", hf_llama, skip=("blk.1.ffn_down.weight",))
    gguf_refused(capsys, tmp_path / "missing.gguf", "missing: blk.1.ffn_down.weight")
    llama_cpp_file(tmp_path / "q81.gguf", hf_llama, kinds={"blk.0.attn_v.weight": Q.Q8_1})
    gguf_refused(capsys, tmp_path / "q81.gguf", "tensor blk.0.attn_v.weight is stored as Q8_1, which gguf cannot")
    (tmp_path / "junk.gguf").write_bytes(b"GGUF" + b"\x00" * 7)
    gguf_refused(capsys, tmp_path / "junk.gguf", "not a readable GGUF file")


def test_a_model_gguf_cannot_hold_is_refused_before_writing(tmp_path, capsys):
    tiny(dict(LLAMA, positional="learned")).save(tmp_path / "learned")
    assert cli_main(["convert", str(tmp_path / "learned"), str(tmp_path / "m.gguf"), "--to", "gguf"]) == 2
    err = capsys.readouterr().err
    assert "has no GGUF equivalent" in err and "positional='learned'" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "m.gguf").exists()


def test_convert_writes_a_float_model_in_its_dtype(tmp_path, capsys):
    tiny(LLAMA).save(tmp_path / "float")
    assert cli_main(["convert", str(tmp_path / "float"), str(tmp_path / "h.gguf"), "--to", "gguf", "--dtype",
                     "fp16"]) == 0
    assert "F16" in capsys.readouterr().out
    assert load_gguf(tmp_path / "h.gguf").config == tformer.load(tmp_path / "float").config


def test_convert_writes_and_reads_gguf(tmp_path, capsys):
    model = tiny(LLAMA)
    quantize(model, "int8")
    model.save(tmp_path / "int8")
    assert cli_main(["convert", str(tmp_path / "int8"), str(tmp_path / "m.gguf"), "--to", "gguf"]) == 0
    out = capsys.readouterr().out
    assert "architecture llama" in out and "Q8_0" in out
    assert cli_main(["convert", str(tmp_path / "m.gguf"), str(tmp_path / "back"), "--to", "tformer"]) == 0
    back = tformer.load(tmp_path / "back")
    assert torch.equal(logits(back, IDS), logits(load_gguf(tmp_path / "m.gguf"), IDS))
    assert cli_main(["convert", str(tmp_path / "int8"), str(tmp_path / "m.gguf"), "--to", "gguf"]) == 2
    assert "already exists" in capsys.readouterr().err
    assert cli_main(["convert", str(tmp_path / "int8"), str(tmp_path / "m.gguf"), "--to", "gguf", "--overwrite"]) == 0
    assert (tmp_path / "m.gguf.replaced-1").is_file()
    assert cli_main(["convert", str(tmp_path / "int8"), str(tmp_path / "back"), "--to", "gguf"]) == 2
    assert "is a folder; --to gguf writes one file" in capsys.readouterr().err


def test_a_gguf_file_loads_by_path_and_every_model_command_runs_it(tmp_path, capsys):
    """``tformer.load("m.gguf")`` is the file's model (as read_gguf + load_gguf_weights build it) with its tokenizer;
    ``quantize`` and ``dtype`` apply as to a folder, a new head is refused, and ``tformer generate`` runs the file."""
    tokenizer = train("bpe", TEXTS * 3, vocab_size=300, special_tokens=["<|endoftext|>"])
    model = tiny(dict(LLAMA, vocab_size=tokenizer.vocab_size, eos_token_id=tokenizer.vocab_size - 1))
    model.tokenizer = tokenizer
    save_gguf(model, tmp_path / "m.gguf")
    loaded = tformer.load(tmp_path / "m.gguf")
    ids = IDS % tokenizer.vocab_size
    assert torch.equal(logits(loaded, ids), logits(load_gguf(tmp_path / "m.gguf"), ids))
    assert loaded.tokenizer.encode(TEXTS[1]) == tokenizer.encode(TEXTS[1])
    assert read_model_config(tmp_path / "m.gguf") == loaded.config
    assert tformer.load(tmp_path / "m.gguf", dtype=torch.bfloat16).lm_head.weight.dtype == torch.bfloat16
    assert type(tformer.load(tmp_path / "m.gguf", quantize="int8").lm_head).__name__ != type(loaded.lm_head).__name__
    with pytest.raises(CheckpointError, match="a GGUF file holds a decoder"):
        tformer.load(tmp_path / "m.gguf", num_labels=2)
    assert cli_main(["generate", str(tmp_path / "m.gguf"), "--prompt", "The quick", "--max-new-tokens", "4"]) == 0
    assert capsys.readouterr().out.startswith("The quick")
