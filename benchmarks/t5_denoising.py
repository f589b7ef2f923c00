"""Does the span-corruption model restore what was dropped? The paper's example, measured: 100 held-out
sentences (Multi30k's validation English captions: not in data/t5-corpus) each lose spans by T5's noise
(fixed seeds), the pretrained model writes the sentinels and what it believes each replaced (greedy), and
a span counts as restored when its tokens are exactly the dropped ones. Two unigram baselines that know
each span's length: the corpus's most frequent token in every position (the best a unigram model can guess),
and the expected share when sampling each token from the corpus's unigram frequencies. Beside them, the
cross-entropy of the dropped tokens when the model reads the true targets, against the unigram frequencies'
on the same tokens: how far the model has left the word-frequency plateau, and the same cross-entropy when the
encoder reads the next sentence's inputs instead: how much the model reads its inputs at all; the same on rows
like the ones it trained on (the recipe's own held-out rows, four batches of the task's evaluation), and the
share of those rows' spans greedy decoding restores, beside the unigram mode's; whether
the encoder keeps its positions apart (from the embedded inputs to its output). And where
the decoder looks: after it writes sentinel k it must find sentinel k in the input to know what follows it; per
layer, the attention (the most of any head) that its cross-attention puts on the input's sentinel k, against a
uniform spread.

    python benchmarks/t5_denoising.py runs/recipes/t5-span-pretrain/seed-1
    python benchmarks/t5_denoising.py RUN --sentences 20 --show 5

The first sentences are also run through `tformer generate RUN --prompt INPUTS` (the command line, a process
each), whose output (the prompt, then the answer) is checked to end with the script's: the figure is what the
command writes. T5's noise ends every row in a dropped span and gives a sentence of under ~17 tokens one span.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import subprocess
import sys
from collections import Counter
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from data_roots import data_file  # noqa: E402

import tformer  # noqa: E402
from tformer.data.span_corruption import corrupt_spans, random_spans_noise_mask  # noqa: E402
from tformer.generation import generate  # noqa: E402
from tformer.nn.losses import token_cross_entropy  # noqa: E402
from tformer.training.config import TrainingConfig  # noqa: E402
from tformer.training.distributed import ProcessContext  # noqa: E402
from tformer.training.recipe import load_recipe  # noqa: E402
from tformer.training.tasks.span_corruption import SpanCorruption  # noqa: E402


def held_out_sentences(count: int) -> list[str]:
    with gzip.open(data_file("multi30k/val.en.gz"), "rt", encoding="utf-8") as file:
        return [line.strip() for line in file if line.strip()][:count]


def spans_of(ids: list[int], sentinels: list[int], end_id: int) -> list[list[int]]:
    """The spans a target sequence holds: the tokens after each sentinel, up to the next sentinel or the end."""
    spans, current = [], None
    for token in ids:
        if token in sentinels or token == end_id:
            if current is not None:
                spans.append(current)
            if token == end_id:
                break
            current = []
        elif current is not None:
            current.append(token)
    else:
        if current is not None:
            spans.append(current)
    return spans


def span_matches(dropped: list[list[int]], predicted: list[list[int]], most_frequent: int) -> tuple[int, int]:
    """Of the dropped spans: how many the predicted ones (in sentinel order) restore exactly, and how many the
    unigram mode restores (spans of the most frequent token alone, the span's length known)."""
    restored = sum(number < len(predicted) and predicted[number] == span for number, span in enumerate(dropped))
    return restored, sum(all(token == most_frequent for token in span) for span in dropped)


def corrupted(tokenizer, sentence: str, index: int, sentinels: list[int]) -> tuple[list[int], list[list[int]]]:
    """The inputs of one sentence under T5's noise (seeded by its index) and the spans it dropped."""
    ids = torch.tensor([tokenizer.encode(sentence, add_special_tokens=False)])
    mask = random_spans_noise_mask(1, ids.shape[1], torch.Generator().manual_seed(index))
    inputs, targets = corrupt_spans(ids, mask, sentinels, tokenizer.eos_token_id)
    return inputs[0].tolist(), spans_of(targets[0].tolist(), sentinels, tokenizer.eos_token_id)


def unigram_frequencies(run: Path, tokenizer) -> Counter:
    """Token counts of the pretraining run's training text (its recipe's data.train, the held-out tail included)."""
    recipe = load_recipe(run / "recipe.toml")
    text = Path(recipe.data.train).read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if line.strip()]
    counts: Counter = Counter()
    for ids in tokenizer.encode_batch(lines, add_special_tokens=False, return_attention_mask=False)["input_ids"]:
        counts.update(ids)
    return counts


@torch.no_grad()
def span_token_nats(model, inputs: list[int], dropped: list[list[int]], sentinels: list[int],
                    log_unigram: dict[int, float]) -> tuple[float, float]:
    """Cross-entropy summed over the dropped tokens (sentinels and the end token left out: they are free) when
    the model reads the true targets, and what the unigram frequencies give the same tokens (unseen: one count)."""
    targets = [token for number, span in enumerate(dropped) for token in (sentinels[number], *span)]
    labels = torch.tensor([[*targets, model.config.eos_token_id]])
    decoder_inputs = torch.tensor([[model.start_token_id, *targets]])
    logits = model(input_ids=torch.tensor([inputs]), decoder_input_ids=decoder_inputs).logits[0]
    log_probs = torch.log_softmax(logits.float(), dim=-1).gather(1, labels[0, :, None])[:, 0]
    keep = [position for position, token in enumerate(targets) if token not in sentinels]
    floor = min(log_unigram.values())
    return (-float(log_probs[keep].sum()),
            -sum(log_unigram.get(targets[position], floor) for position in keep))


@torch.no_grad()
def sentinel_attention(model, tokenizer, sentences: list[str], sentinels: list[int]) -> dict[str, float]:
    """Per decoder layer, the mean over sentinels of the most attention any head of its cross-attention puts on
    the input's matching sentinel when the decoder reads sentinel k (rows of four sentences, several spans
    each), beside the uniform share 1 / input length."""
    found: dict[int, list[float]] = {}
    uniform = []
    for index in range(0, len(sentences) - 3, 4):
        inputs, dropped = corrupted(tokenizer, " ".join(sentences[index : index + 4]), index, sentinels)
        targets = [token for number, span in enumerate(dropped) for token in (sentinels[number], *span)]
        decoder_inputs = [model.start_token_id, *targets]
        attentions = model(input_ids=torch.tensor([inputs]), decoder_input_ids=torch.tensor([decoder_inputs]),
                           output_attentions=True).cross_attentions  # per layer (1, H, T, S)
        uniform.append(1 / len(inputs))
        for position, token in enumerate(decoder_inputs):
            if token in sentinels:
                column = inputs.index(token)
                for layer, weights in enumerate(attentions):
                    found.setdefault(layer, []).append(float(weights[0, :, position, column].max()))
    shares = {f"layer_{layer + 1}": round(sum(values) / len(values), 3) for layer, values in found.items()}
    return {**shares, "uniform": round(sum(uniform) / len(uniform), 3), "sentinels": len(found.get(0, []))}


def training_rows(model, run: Path, batches: int = 4) -> tuple[list[dict], list[int]]:
    """The recipe's held-out rows, corrupted as its training evaluation corrupts them, and its sentinels."""
    recipe = load_recipe(run / "recipe.toml")
    task, _ = SpanCorruption.from_recipe(recipe.data, seq_len=recipe.training.seq_len, tokenizer=model.tokenizer,
                                         noise_density=recipe.task.noise_density,
                                         mean_noise_span_length=recipe.task.mean_noise_span_length)
    task.prepare(TrainingConfig(batch_size=recipe.training.batch_size, seq_len=recipe.training.seq_len,
                                eval_batches=batches), ProcessContext(), model)
    return list(task.eval_batches()), list(task.sentinels)


@torch.no_grad()
def training_rows_nats(model, rows: list[dict], sentinels: list[int], log_unigram: dict[int, float]) -> dict:
    """Cross-entropy per dropped token (sentinels and the end token left out) on the held-out training rows when
    the encoder reads each row's inputs and the next row's, beside the unigram frequencies' (unseen: one count)."""
    free = torch.tensor([*sentinels, model.config.eos_token_id])
    sums, tokens = {"true_inputs": 0.0, "next_row_inputs": 0.0, "unigram": 0.0}, 0
    floor = min(log_unigram.values())
    for batch in rows:
        labels = batch["labels"]
        dropped = ~torch.isin(labels, free)
        for name, inputs in (("true_inputs", batch["input_ids"]), ("next_row_inputs", batch["input_ids"].roll(-1, 0))):
            logits = model(input_ids=inputs, decoder_input_ids=batch["decoder_input_ids"]).logits
            sums[name] += float(token_cross_entropy(logits, labels, reduction="none")[dropped].sum())
        sums["unigram"] -= sum(log_unigram.get(token, floor) for token in labels[dropped].tolist())
        tokens += int(dropped.sum())
    return {name: round(total / tokens, 4) for name, total in sums.items()} | {"dropped_tokens": tokens}


@torch.no_grad()
def training_rows_restored(model, rows: list[dict], sentinels: list[int], most_frequent: int) -> dict:
    """Greedy decoding of the held-out training rows (long rows, several spans each: what the model trained on):
    the share of spans it restores exactly, beside the unigram mode's (the most frequent token, the span's length
    known)."""
    end_id = model.config.eos_token_id
    restored = mode_restored = spans = 0
    for batch in rows:
        labels = batch["labels"]
        outputs = generate(model, batch["input_ids"], max_new_tokens=labels.shape[1] + 5)[:, 1:].tolist()
        for output, target in zip(outputs, labels.tolist(), strict=True):
            dropped = spans_of([token for token in target if token >= 0], sentinels, end_id)
            found, mode_found = span_matches(dropped, spans_of(output, sentinels, end_id), most_frequent)
            spans, restored, mode_restored = spans + len(dropped), restored + found, mode_restored + mode_found
    return {"spans": spans, "restored_share": round(restored / spans, 4),
            "unigram_mode_share": round(mode_restored / spans, 4)}


@torch.no_grad()
def encoder_spread(model, tokenizer, sentences: list[str], sentinels: list[int]) -> dict[str, list[float]]:
    """Whether the encoder's positions stay apart: for the embedded inputs, what each block passes to the next, and
    the encoder's output after its final norm (rows of four sentences), the RMS of the hidden states and the share
    of their variance that differs between positions (one minus the share of the row's mean vector; near 0 when
    every position holds the same vector)."""
    rms: dict[int, list[float]] = {}
    spread: dict[int, list[float]] = {}
    for index in range(0, len(sentences) - 3, 4):
        inputs, _ = corrupted(tokenizer, " ".join(sentences[index : index + 4]), index, sentinels)
        states = model.encoder(model.embedding(torch.tensor([inputs])), output_hidden_states=True).hidden_states
        for layer, hidden in enumerate(states):
            hidden = hidden[0].float()
            total = hidden.pow(2).mean()
            rms.setdefault(layer, []).append(float(total.sqrt()))
            spread.setdefault(layer, []).append(float((hidden - hidden.mean(0)).pow(2).mean() / total))
    return {"rms": [round(sum(v) / len(v), 3) for v in rms.values()],
            "position_share": [round(sum(v) / len(v), 4) for v in spread.values()]}


def command_line_output(run: Path, prompt: str, max_new_tokens: int) -> str:
    result = subprocess.run([sys.executable, "-m", "tformer", "generate", str(run), "--prompt", prompt,
                             "--max-new-tokens", str(max_new_tokens), "--temperature", "0"],
                            capture_output=True, text=True, cwd=ROOT, check=True)
    return result.stdout.strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a span-corruption run folder (or checkpoint)")
    parser.add_argument("--sentences", type=int, default=100)
    parser.add_argument("--show", type=int, default=3, help="sentences printed (and checked through the CLI)")
    args = parser.parse_args()
    torch.set_num_threads(2)
    model = tformer.load(args.run)
    model.eval()
    tokenizer = model.tokenizer
    sentinels = [tokenizer.token_to_id(f"<extra_id_{k}>") for k in range(100)]
    frequencies = unigram_frequencies(args.run, tokenizer)
    total = sum(frequencies.values())
    most_frequent, _ = frequencies.most_common(1)[0]
    log_unigram = {token: math.log(count / total) for token, count in frequencies.items()}
    restored = spans = mode_restored = cli_agrees = span_tokens = 0
    expected_sampled = model_nats = unigram_nats = other_inputs_nats = 0.0
    sentences = held_out_sentences(args.sentences)
    corruptions = [corrupted(tokenizer, sentence, index, sentinels) for index, sentence in enumerate(sentences)]
    for index, (sentence, (inputs, dropped)) in enumerate(zip(sentences, corruptions, strict=True)):
        model_span_nats, unigram_span_nats = span_token_nats(model, inputs, dropped, sentinels, log_unigram)
        model_nats, unigram_nats = model_nats + model_span_nats, unigram_nats + unigram_span_nats
        other_inputs = corruptions[(index + 1) % len(sentences)][0]
        other_inputs_nats += span_token_nats(model, other_inputs, dropped, sentinels, log_unigram)[0]
        span_tokens += sum(map(len, dropped))
        budget = sum(len(span) + 1 for span in dropped) + 5
        output = generate(model, torch.tensor([inputs]), max_new_tokens=budget)[0, 1:].tolist()
        found, mode_found = span_matches(dropped, spans_of(output, sentinels, tokenizer.eos_token_id), most_frequent)
        spans, restored, mode_restored = spans + len(dropped), restored + found, mode_restored + mode_found
        for span in dropped:
            probability = 1.0
            for token in span:
                probability *= frequencies[token] / total
            expected_sampled += probability
        if index < args.show:
            prompt = tokenizer.decode(inputs[:-1], skip_special_tokens=False)
            written = tokenizer.decode(output, skip_special_tokens=False)
            via_cli = command_line_output(args.run, prompt, budget)  # the prompt, then what the model wrote
            cli_agrees += via_cli.replace(" ", "").endswith(written.replace(" ", ""))
            print(f"sentence  {sentence}\ninputs    {prompt}\nwritten   {written}\n"
                  f"dropped   {[tokenizer.decode(span) for span in dropped]}\n"
                  f"tformer generate printed: {via_cli!r}\n")
    rows, row_sentinels = training_rows(model, args.run)
    figures = {"run": str(args.run), "sentences": args.sentences, "spans": spans,
               "restored_share": restored / spans, "unigram_mode_share": mode_restored / spans,
               "unigram_sampled_expected_share": expected_sampled / spans,
               "most_frequent_token": tokenizer.decode([most_frequent]),
               "span_token_nats_model": model_nats / span_tokens, "span_token_nats_unigram": unigram_nats / span_tokens,
               "span_token_nats_model_other_inputs": other_inputs_nats / span_tokens,
               "command_line_agrees": f"{cli_agrees} of {min(args.show, args.sentences)}",
               "training_rows_dropped_token_nats": training_rows_nats(model, rows, row_sentinels, log_unigram),
               "training_rows_spans": training_rows_restored(model, rows, row_sentinels, most_frequent),
               "encoder_inputs_then_blocks": encoder_spread(model, tokenizer, sentences, sentinels),
               "sentinel_attention": sentinel_attention(model, tokenizer, sentences, sentinels)}
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
