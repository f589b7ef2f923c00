"""``tformer generate``: the text on standard output (streamed or at the end), the speed on
standard error, and one-line errors with exit code 2 before any text."""

import pytest
import torch

import tformer
from tformer.cli import main
from tformer.tokenizers import CharTokenizer

TEXT = "to be or not to be, that is the question.\n"


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    folder = tmp_path_factory.mktemp("checkpoints")
    tokenizer = CharTokenizer.train(TEXT)
    torch.manual_seed(0)
    target = tformer.build_model("gpt-nano", vocab_size=tokenizer.vocab_size, initializer_range=0.2)
    target.tokenizer = tokenizer
    target.save(folder / "target")
    draft = tformer.build_model("gpt-nano", vocab_size=tokenizer.vocab_size, num_layers=1)
    draft.load_state_dict({k: v for k, v in target.state_dict().items() if not k.startswith("stack.blocks.1.")})
    draft.tokenizer = tokenizer
    draft.save(folder / "draft")
    tformer.build_model("gpt-nano").save(folder / "no-tokenizer")
    return folder


def expected_text(folder, prompt, new, **options):
    model = tformer.load(folder / "target")
    ids = torch.tensor([model.tokenizer.encode(prompt)])
    return prompt + model.tokenizer.decode(tformer.generate(model, ids, new, **options)[0, ids.shape[1]:].tolist())


@pytest.mark.parametrize("extra", [[], ["--stream"], ["--draft", "DRAFT", "--stream", "--num-draft-tokens", "3"]],
                         ids=["greedy", "streamed", "speculative"])
def test_generate_prints_the_greedy_text_then_the_speed(checkpoints, capsys, extra):
    extra = [str(checkpoints / "draft") if arg == "DRAFT" else arg for arg in extra]
    assert main(["generate", str(checkpoints / "target"), "--prompt", "to be", "--max-new-tokens", "25", *extra]) == 0
    out, err = capsys.readouterr()
    assert out == expected_text(checkpoints, "to be", 25) + "\n"
    assert "25 new tokens in" in err and "tokens/s" in err
    assert ("draft acceptance" in err) == ("--draft" in extra)


def test_generate_samples_and_searches_beams(checkpoints, capsys):
    base = ["generate", str(checkpoints / "target"), "--prompt", "that", "--max-new-tokens", "12"]
    assert main([*base, "--temperature", "0.8", "--top-k", "5", "--seed", "4"]) == 0
    assert capsys.readouterr().out == expected_text(checkpoints, "that", 12, temperature=0.8, top_k=5, seed=4) + "\n"
    assert main([*base, "--num-beams", "3"]) == 0
    assert capsys.readouterr().out == expected_text(checkpoints, "that", 12, num_beams=3) + "\n"


def test_generate_stops_at_a_stop_string(checkpoints, capsys):
    free = expected_text(checkpoints, "to be", 30)[len("to be"):]
    stop = free[6:8]
    assert main(["generate", str(checkpoints / "target"), "--prompt", "to be", "--max-new-tokens", "30",
                 "--stop", stop]) == 0
    out = capsys.readouterr().out
    assert out.endswith(stop + "\n") and free.startswith(out[len("to be"):-1])


@pytest.mark.parametrize("args, message", [
    (["--temperature", "-1"], "temperature=-1.0 must be a number >= 0"),
    (["--top-p", "2"], r"top_p=2.0 must be a number in (0, 1]"),
    (["--num-beams", "2", "--stream"], "--stream needs --num-beams 1"),
    (["--max-new-tokens", "80"], "exceeds max_seq_len=64"),
    (["--draft", "NO_TOKENIZER_VOCAB"], "draft_model has vocab_size=64"),
    (["CKPT", "NO_TOKENIZER"], "no tokenizer.json; generate needs one"),
    (["CKPT", "/nonexistent/checkpoint"], "not a checkpoint folder"),
])
def test_user_errors_are_one_line_with_exit_code_2_and_no_text(checkpoints, capsys, args, message):
    checkpoint = str(checkpoints / "target")
    if args[0] == "CKPT":
        checkpoint = str(checkpoints / "no-tokenizer") if args[1] == "NO_TOKENIZER" else args[1]
        args = []
    args = [str(checkpoints / "no-tokenizer") if arg == "NO_TOKENIZER_VOCAB" else arg for arg in args]
    assert main(["generate", checkpoint, "--prompt", "to be", *args]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert message in err and len(err.strip().splitlines()) == 1


def test_device_is_checked_before_anything_is_loaded(checkpoints, capsys):
    base = ["generate", str(checkpoints / "target"), "--prompt", "to be", "--max-new-tokens", "5"]
    assert main([*base, "--device", "tpu"]) == 2
    assert "--device 'tpu' is not a device (cpu, cuda, cuda:N or auto); this machine has: cpu" in \
        capsys.readouterr().err
    if not torch.cuda.is_available():
        assert main([*base, "--device", "cuda"]) == 2
        assert "sees no CUDA device; this machine has: cpu, auto" in capsys.readouterr().err
    assert main([*base, "--device", "auto"]) == 0
    assert capsys.readouterr().out == expected_text(checkpoints, "to be", 5) + "\n"
