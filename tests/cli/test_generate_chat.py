"""``tformer generate --chat``: the messages (--prompt as one user message, or --messages FILE) rendered by the
folder's chat template, the reply printed alone and ended at the end-of-turn token; one-line refusals (exit 2)
for a folder without a template and for bad messages."""

import json

import pytest
import torch

import tformer
from tformer.cli import main
from tformer.tokenizers import BPETokenizer
from tformer.tokenizers.byte_level import BYTE_TO_CHAR

START, END = "<|im_start|>", "<|im_end|>"  # ids 256 and 257
TEMPLATE = ("{% for m in messages %}" + START + "{{ m.role }}\n{{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}" + START + "assistant\n{% endif %}")
STEPS = 4  # the end-of-turn token comes as the reply's 4th token


def rendered_ids(tokenizer, messages):
    from tformer.tokenizers.chat_template import ChatTemplate

    text = ChatTemplate(TEMPLATE).render(messages)
    return tokenizer.encode(text, add_special_tokens=False)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A Hugging Face folder of a byte-level BPE decoder with ChatML-style tokens, whose weights end the reply
    to "hi" with <|im_end|>: the table rows of <|im_end|> and of the greedy reply's 4th token swapped."""
    tokenizer = BPETokenizer({char: byte for byte, char in enumerate(BYTE_TO_CHAR)}, [])
    tokenizer.add_special_tokens([START, END])
    torch.manual_seed(0)
    model = tformer.build_model("gpt-nano", vocab_size=258, initializer_range=0.2)
    model.tokenizer = tokenizer
    prompt = rendered_ids(tokenizer, [{"role": "user", "content": "hi"}])
    reply = tformer.generate(model, torch.tensor([prompt]), STEPS, eos_token_id=())[0, len(prompt):].tolist()
    assert reply[-1] not in prompt + reply[:-1]  # its row is read nowhere before it is chosen
    with torch.no_grad():
        table = model.embedding.token.weight  # tied: the output's rows too
        table[[reply[-1], 257]] = table[[257, reply[-1]]]
    root = tmp_path_factory.mktemp("chat")
    model.save(root / "chat", format="hf")
    (root / "chat" / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE, "eos_token": END}))
    model.save(root / "plain", format="hf")
    return root, tokenizer, reply[:-1]


def test_chat_renders_the_prompt_as_a_user_message_and_stops_at_the_end_of_turn(folders, capsys):
    root, tokenizer, reply = folders
    assert main(["generate", str(root / "chat"), "--chat", "--prompt", "hi", "--max-new-tokens", "20"]) == 0
    out, err = capsys.readouterr()
    assert out == tokenizer.decode(reply) + "\n"  # the reply alone, without <|im_end|>
    assert f"{STEPS} new tokens" in err


def test_chat_reads_a_messages_file(folders, tmp_path, capsys):
    root, tokenizer, _ = folders
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    (tmp_path / "chat.json").write_text(json.dumps(messages))
    assert main(["generate", str(root / "chat"), "--messages", str(tmp_path / "chat.json"),
                 "--max-new-tokens", "6"]) == 0
    model = tformer.load(root / "chat")
    prompt = torch.tensor([rendered_ids(tokenizer, messages)])
    new = tformer.generate(model, prompt, 6, eos_token_id=[257])[0, prompt.shape[1]:]
    assert capsys.readouterr().out == tokenizer.decode(new.tolist(), skip_special_tokens=True) + "\n"


@pytest.mark.parametrize(("args", "message"), [
    (["PLAIN", "--chat", "--prompt", "hi"], "no chat template (chat_template.jinja or tokenizer_config.json's "
                                            "chat_template); --chat needs one"),
    (["CHAT", "--chat"], "give --prompt TEXT or --messages FILE"),
    (["CHAT", "--prompt", "hi", "--messages", "FILE"], "give --prompt TEXT or --messages FILE"),
    (["CHAT", "--messages", "FILE"], "must be a non-empty JSON list of"),
])
def test_chat_refusals_are_one_line(folders, tmp_path, capsys, args, message):
    root, _, _ = folders
    (tmp_path / "bad.json").write_text(json.dumps([{"role": "user"}]))
    names = {"PLAIN": str(root / "plain"), "CHAT": str(root / "chat"), "FILE": str(tmp_path / "bad.json")}
    assert main(["generate", *[names.get(arg, arg) for arg in args]]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
