"""tformer's speech model against Hugging Face WhisperForConditionalGeneration on the whisper-tiny shape
(WhisperConfig's defaults: 4 + 4 blocks, width 384, 6 heads, 80 mels, a 30 s window, 51,865 tokens), float32,
one process, interleaved, the same random weights on both sides (the HF model written with save_pretrained and
read by tformer.load).

  train       a training step: a batch of real FSDD utterances (--batch, padded to the 30 s window) with
              transcripts of --transcript-tokens tokens; forward, cross-entropy on the logits, backward, AdamW
  transcribe  greedy transcription of the first --utterances utterances of the FSDD test split (the log-mel
              features computed once, outside the timing; --batch at a time), from Whisper's English prompt
              (<|startoftranscript|> <|en|> <|transcribe|> <|notimestamps|>), --new-tokens new tokens each
              (random weights never write the end token, so both sides do the same work); utterances/s and
              whether every output is the same token for token; then the ceiling: the float32 work of encoding
              the windows (counted from the shape) at this host's measured matrix-product rate, the least time
              any float32 implementation needs, against transformers' time

Ratios are HF time / tformer time (> 1: tformer is faster). The utterances come from
``python benchmarks/speech_fsdd.py --out data/fsdd-digits``.

    python benchmarks/speech_speed.py [--rounds 3] [--threads 2] [--only train|transcribe]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import tformer  # noqa: E402
from benchmarks.timing import interleaved, timed  # noqa: E402
from tformer.data.audio import load_audio  # noqa: E402
from tformer.data.log_mel import LogMelSettings, log_mel_spectrogram, pad_or_trim  # noqa: E402

DATA = ROOT / "data" / "fsdd-digits"
# whisper-tiny's (multilingual) special tokens.
END, START, ENGLISH, TRANSLATE, TRANSCRIBE, NO_TIMESTAMPS = 50257, 50258, 50259, 50358, 50359, 50363
PROMPT = (START, ENGLISH, TRANSCRIBE, NO_TIMESTAMPS)


def whisper_pair(folder: Path):
    """A random whisper-tiny-shaped WhisperForConditionalGeneration and tformer's load of the same weights."""
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.WhisperConfig(pad_token_id=END, bos_token_id=END, eos_token_id=END,
                                        decoder_start_token_id=START, suppress_tokens=[], begin_suppress_tokens=[])
    hf = transformers.WhisperForConditionalGeneration(config)
    generation = hf.generation_config
    generation.lang_to_id = {"<|en|>": ENGLISH}
    generation.task_to_id = {"transcribe": TRANSCRIBE, "translate": TRANSLATE}
    generation.no_timestamps_token_id = NO_TIMESTAMPS
    generation.is_multilingual = True
    hf.save_pretrained(folder)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = tformer.load(folder)
    return hf, ours


def utterance_features(count: int) -> torch.Tensor:
    """The log-mel features (count, 80, 3000) of the first ``count`` FSDD test utterances, each padded to 30 s."""
    manifest = DATA / "test.tsv"
    if not manifest.exists():
        raise SystemExit(f"{manifest}: not built; run python benchmarks/speech_fsdd.py --out {DATA.relative_to(ROOT)}")
    paths = [DATA / line.split("\t")[0] for line in manifest.read_text().splitlines()[1:count + 1]]
    settings = LogMelSettings()
    audio = torch.stack([pad_or_trim(torch.from_numpy(load_audio(path)), settings.window_samples) for path in paths])
    return log_mel_spectrogram(audio, settings)


def training_step(model, features: torch.Tensor, transcripts: torch.Tensor, labels: torch.Tensor):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)

    def step() -> None:
        logits = model(features, decoder_input_ids=transcripts).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def measure_training(hf, ours, features: torch.Tensor, tokens: int, rounds: int, steps: int) -> dict[str, float]:
    generator = torch.Generator().manual_seed(0)
    text = torch.randint(0, END, (features.shape[0], tokens + 1), generator=generator)
    transcripts, labels = torch.cat([torch.full_like(text[:, :1], START), text[:, :-1]], 1), text
    hf.train()
    ours.train()
    times = interleaved({"tformer": training_step(ours, features, transcripts, labels),
                         "transformers": training_step(hf, features, transcripts, labels)}, rounds, steps)
    return {name: statistics.median(values) for name, values in times.items()}


def measure_transcription(hf, ours, features: torch.Tensor, batch: int, new_tokens: int,
                          rounds: int) -> dict[str, object]:
    hf.eval()
    ours.eval()
    batches = features.split(batch)
    outputs: dict[str, list[list[int]]] = {}

    def transcribe_all(name: str, model) -> None:
        rows = []
        with torch.inference_mode():
            for window in batches:
                if name == "tformer":
                    out = tformer.generate(model, window, new_tokens, decoder_prompt_ids=PROMPT)[:, len(PROMPT):]
                else:
                    out = model.generate(window, language="en", task="transcribe", max_new_tokens=new_tokens,
                                         do_sample=False, num_beams=1)
                rows += out.tolist()
        outputs[name] = rows

    times = interleaved({"tformer": lambda: transcribe_all("tformer", ours),
                         "transformers": lambda: transcribe_all("transformers", hf)}, rounds, 1, warm_up=False)
    pairs = list(zip(outputs["tformer"], outputs["transformers"], strict=True))
    lengths = sorted({len(row) for row in outputs["tformer"]})
    return {"seconds": {name: statistics.median(values) for name, values in times.items()},
            "identical": sum(ours_row == theirs_row for ours_row, theirs_row in pairs), "lengths": lengths}


def encoding_flops(config) -> int:
    """Floating-point operations (a multiply and an add each) of encoding one window of ``config``'s shape: the
    stem's two convolutions, each encoder block's projections and attention over its positions, and each
    decoder block's cross-attention keys and values of the encoder's output. Generation does all of it once
    an utterance; the decoding steps after it are left out (they only lower the ceiling further)."""
    positions, width, inner = config.max_source_positions, config.d_model, config.d_ff
    stem = 2 * (2 * positions) * 3 * config.num_mel_bins * width + 2 * positions * 3 * width * width
    block = 2 * positions * (4 * width * width + 2 * width * inner) + 2 * 2 * positions * positions * width
    cross_keys_values = 2 * positions * 2 * width * width * config.num_layers
    return stem + config.num_encoder_layers * block + cross_keys_values


def matrix_rate(rounds: int = 5, size: int = 2048) -> float:
    """This host's float32 matrix-product rate (FLOP/s): the fastest of ``rounds`` (size x size) products."""
    left, right = torch.randn(size, size), torch.randn(size, size)
    torch.mm(left, right)
    best = min(timed(lambda: torch.mm(left, right), 1) for _ in range(rounds))
    return 2 * size**3 / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2, help="training steps a round")
    parser.add_argument("--batch", type=int, default=8, help="utterances a training step / a generate call")
    parser.add_argument("--transcript-tokens", type=int, default=24)
    parser.add_argument("--utterances", type=int, default=100)
    parser.add_argument("--new-tokens", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", choices=["train", "transcribe"])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads")
    features = utterance_features(args.utterances)
    with tempfile.TemporaryDirectory() as folder:
        hf, ours = whisper_pair(Path(folder))
    print(f"whisper-tiny shape: {sum(p.numel() for p in ours.parameters()):,} parameters (tformer), "
          f"{sum(p.numel() for p in hf.parameters()):,} (transformers)")
    if args.only != "transcribe":
        step = measure_training(hf, ours, features[:args.batch], args.transcript_tokens, args.rounds, args.steps)
        print(f"training step, {args.batch} utterances x {args.transcript_tokens} tokens (median s): tformer "
              f"{step['tformer']:.3f}, transformers {step['transformers']:.3f}, ratio "
              f"{step['transformers'] / step['tformer']:.2f}")
    if args.only != "train":
        result = measure_transcription(hf, ours, features, args.batch, args.new_tokens, args.rounds)
        seconds, count = result["seconds"], len(features)
        print(f"greedy transcription of {count} utterances, {args.batch} at a time, {args.new_tokens} new tokens "
              f"(median s): tformer {seconds['tformer']:.1f} ({count / seconds['tformer']:.2f} utterances/s), "
              f"transformers generate {seconds['transformers']:.1f} ({count / seconds['transformers']:.2f} "
              f"utterances/s), ratio {seconds['transformers'] / seconds['tformer']:.2f}; identical outputs "
              f"{result['identical']} of {count} (new tokens per row: {result['lengths']})")
        flops, rate = encoding_flops(ours.config), matrix_rate()
        least = count * flops / rate
        print(f"ceiling: encoding one 30 s window is {flops / 1e9:.1f} GFLOP; at this host's float32 matrix rate of "
              f"{rate / 1e9:.0f} GFLOP/s (the fastest of 5 products of 2048 x 2048 matrices) the {count} utterances "
              f"need at least {least:.1f} s, so no float32 transcription beats transformers' "
              f"{seconds['transformers']:.1f} s by more than {seconds['transformers'] / least:.2f}x here")


if __name__ == "__main__":
    main()
