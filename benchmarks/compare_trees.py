"""Speed of this tree against another one (a git ref: the tree before a change), measured alternately in
one run, with Hugging Face beside them where it has the same workload.

    python benchmarks/compare_trees.py --before 5b50677                      # every workload
    python benchmarks/compare_trees.py --before HEAD~3 --workloads generate-b --rounds 9
    python benchmarks/compare_trees.py --before-tree ../baseline --workloads translate --out logs/ab.json

Each workload runs in a fresh subprocess per tree and round, ``PYTHONPATH`` pointing at that tree, so each
side imports its own tformer; the order alternates from round to round and every figure is the median
over the rounds; the comparison is also given as the median of each round's after/before ratio (a
round's two runs are back to back, so drifting machine speed moves both). The models are written once
(random weights, seed 0) into ``--work`` and loaded by both sides through ``tformer.load``, so they are
the same weights.

- ``generate-a`` / ``generate-b``: greedy, batch 1, a 32-token prompt, 128 new tokens, fp32: GPT-2's 124M
  shape, and 6 layers x 384 (14M) with an 8,192-token vocabulary, as ``generate_speed.py``; Hugging Face
  ``GPT2LMHeadModel.generate`` on the same folder is a third column (its ratio to each tree).
- ``translate``: ``tformer.generation.translate`` of Multi30k's test_2016_flickr (1,000 German sentences)
  by beam search (5 beams, 64 sentences a batch) with a random model of the Multi30k recipe's shape and a
  joint byte-level BPE of 8,000 tokens learned from its training pairs; random weights never end a
  sentence early, so every beam runs to the length budget (the most decoding steps a batch can take).
- ``serve-gpt-mini`` / ``serve-gpt2``: each tree's own ``benchmarks/serve_load.py`` at 16 clients, tformer
  serve only, 128 new tokens a request (its random gpt-mini or GPT-2-shaped model, written in each run's
  work folder from seed 0): tokens/s received by the clients.
- ``kernels`` (this tree only): ``generate-b``'s model and workload with each attention kernel of the
  registry (the sliding window at 64 positions, Performer with 256 features), against sdpa; each must
  decode through the model's step hook (a StackSession), which the worker checks. Inside a worker every
  kernel runs once a repeat in a rotating order; a kernel's figure is the median over rounds of its
  median time per call, and its ratio to sdpa the median over rounds of the median of its per-repeat
  ratios (each taken beside an sdpa call of the same repeat).

Nothing here is downloaded: the tokenizer and the Multi30k text come from ../shared/data.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "multi30k"
# GPT-2's tokenizer files, from this tree's ../shared (a worktree of the other tree has none beside it).
GPT2_TOKENIZER = ROOT.parent / "shared" / "data" / "tokenizers" / "gpt2" / "encoder.json"
SHAPES = {"a": dict(n_embd=768, n_layer=12, n_head=12, vocab_size=50257),
          "b": dict(n_embd=384, n_layer=6, n_head=6, vocab_size=8192)}
PROMPT_LENGTH, NEW_TOKENS = 32, 128
WORKLOADS = ("generate-a", "generate-b", "translate", "serve-gpt-mini", "serve-gpt2", "kernels")
KERNELS = {"sdpa": {}, "reference": {"attention_kernel": "reference"}, "chunked": {"attention_kernel": "chunked"},
           "sliding_window": {"attention_kernel": "sliding_window", "attention_window": 64},
           "performer": {"attention_kernel": "performer", "performer_features": 256}}


# ---- the models, written once ----------------------------------------------------------------------


def gpt2_folder(work: Path, shape: str) -> Path:
    """A random GPT-2-shaped Hugging Face folder (both trees read it through tformer.load)."""
    folder = work / f"gpt2-{shape}"
    if not (folder / "model.safetensors").is_file():
        import torch
        from transformers import GPT2Config, GPT2LMHeadModel

        torch.manual_seed(0)
        config = GPT2Config(n_positions=1024, bos_token_id=0, eos_token_id=0, pad_token_id=0, **SHAPES[shape])
        GPT2LMHeadModel(config).save_pretrained(folder)
    return folder


def translation_folder(work: Path, writer: Path) -> Path:
    """A random transformer-multi30k model with a joint BPE of 8,000 tokens learned from Multi30k's training
    pairs, saved as a tformer checkpoint (config.json, model.safetensors, tokenizer.json) by the tree ``writer``
    (the older one: a newer tformer reads an older one's config.json, which lacks the fields added since, but
    an older one refuses the newer's)."""
    folder = work / "multi30k-random"
    if not (folder / "model.safetensors").is_file():
        run_worker(writer, "write-translation", folder, 0, None)
    return folder


def write_translation(folder: Path, repeats: int) -> dict:
    """The worker that writes ``translation_folder`` with its tree's tformer."""
    import torch

    import tformer
    from tformer.data.parallel import read_parallel
    from tformer.training.tasks.translation import learn_joint_bpe

    tokenizer = learn_joint_bpe(read_parallel(DATA / "train", "de", "en"), 8000)
    torch.manual_seed(0)
    model = tformer.build_model("transformer-multi30k", vocab_size=tokenizer.vocab_size)
    model.tokenizer = tokenizer
    model.save(folder)
    return {}


# ---- the workers (run with PYTHONPATH set to one tree) ---------------------------------------------


def time_calls(function, repeats: int) -> float:
    """The median seconds of ``repeats`` calls, after one warm-up call."""
    function()
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


def prompt_ids(vocab_size: int):
    import torch

    return torch.randint(0, vocab_size, (1, PROMPT_LENGTH), generator=torch.Generator().manual_seed(1))


def work_generate(folder: Path, repeats: int) -> dict:
    import torch

    import tformer

    model = tformer.load(folder).eval()
    prompt = prompt_ids(model.config.vocab_size)
    output = None

    def run():
        nonlocal output
        output = tformer.generate(model, prompt, NEW_TOKENS, eos_token_id=[])

    seconds = time_calls(run, repeats)
    return {"tokens_per_s": NEW_TOKENS / seconds, "last_tokens": output[0, -8:].tolist(),
            "threads": torch.get_num_threads()}


def work_hf_generate(folder: Path, repeats: int) -> dict:
    import torch
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel.from_pretrained(folder).eval()
    model.generation_config.eos_token_id = None  # exactly NEW_TOKENS new tokens, as tformer's
    prompt = prompt_ids(model.config.vocab_size)
    output = None

    def run():
        nonlocal output
        with torch.inference_mode():
            output = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW_TOKENS,
                                    do_sample=False, pad_token_id=0)

    seconds = time_calls(run, repeats)
    return {"tokens_per_s": NEW_TOKENS / seconds, "last_tokens": output[0, -8:].tolist()}


def work_translate(folder: Path, repeats: int) -> dict:
    import gzip

    import tformer
    from tformer.generation.translation import translate

    model = tformer.load(folder).eval()
    with gzip.open(DATA / "test_2016_flickr.de.gz", "rt", encoding="utf-8") as file:
        sentences = file.read().splitlines()
    texts = None

    def run():
        nonlocal texts
        texts = translate(model, sentences, num_beams=5, batch_size=64).texts

    started = time.perf_counter()
    run()  # one run: it is long, and its first batches warm everything up
    seconds = time.perf_counter() - started
    return {"sentences_per_s": len(sentences) / seconds, "seconds": seconds, "first": texts[0][:60],
            "characters": sum(len(text) for text in texts)}


def work_kernels(folder: Path, repeats: int) -> dict:
    import torch

    import tformer
    from tformer.generation import StackSession, open_session

    base = tformer.load(folder).eval()
    prompt = prompt_ids(base.config.vocab_size)
    models = {}
    for name, fields in KERNELS.items():
        torch.manual_seed(0)
        model = tformer.build_model(base.config.replace(dropout=0.0, attention_dropout=0.0, **fields)).eval()
        model.load_state_dict(base.state_dict(), strict=False)  # Performer's projections are its own
        session, _ = open_session(model, prompt, None, NEW_TOKENS)
        if not isinstance(session, StackSession):
            raise SystemExit(f"attention_kernel {name} does not decode through the step hook")
        tformer.generate(model, prompt, NEW_TOKENS, eos_token_id=[])  # warm up
        models[name] = model
    # Every kernel once a repeat, the order rotating, so that each sees the same machine load as sdpa.
    seconds: dict[str, list[float]] = {name: [] for name in models}
    names = list(models)
    for repeat in range(repeats):
        for name in names[repeat % len(names):] + names[:repeat % len(names)]:
            started = time.perf_counter()
            tformer.generate(models[name], prompt, NEW_TOKENS, eos_token_id=[])
            seconds[name].append(time.perf_counter() - started)
    return {"tokens_per_s": {name: NEW_TOKENS / statistics.median(times) for name, times in seconds.items()},
            "ratio_to_sdpa": {name: statistics.median(s / t for s, t in zip(seconds["sdpa"], times, strict=True))
                              for name, times in seconds.items()}}


WORKERS = {"generate": work_generate, "hf-generate": work_hf_generate, "translate": work_translate,
           "write-translation": write_translation,
           "kernels": work_kernels}


def run_serve_load(tree: Path, model: str, work: Path, threads: int | None) -> dict:
    """``tree``'s own serve_load.py at 16 clients (tformer serve alone), in a subprocess that imports ``tree``."""
    out = work / f"serve-{model}-{tree.name}.json"
    command = [sys.executable, str(tree / "benchmarks" / "serve_load.py"), "--models", model, "--clients", "16",
               "--servers", "tformer", "--new-tokens", str(NEW_TOKENS), "--work", str(work / f"serve-{tree.name}"),
               "--out", str(out), "--gpt2-tokenizer", str(GPT2_TOKENIZER)] + (["--threads", str(threads)] if threads
                                                                              else [])
    done = subprocess.run(command, env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True, text=True,
                          cwd=tree)
    if done.returncode:
        raise SystemExit(f"serve_load ({tree}) failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    (row,) = [r for r in json.loads(out.read_text())["models"][model]["rows"] if r["system"] == "tformer"]
    if "error" in row:
        raise SystemExit(f"serve_load ({tree}): {row['error']}")
    return {"tokens_per_s": row["tokens_per_s"], "tokens": row["tokens"], "short_requests": row["short_requests"],
            "server_cores": row.get("server_cores")}


def run_worker(tree: Path | None, worker: str, folder: Path, repeats: int, threads: int | None) -> dict:
    """One worker in a subprocess whose tformer is ``tree``'s (None: this environment's own)."""
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    if threads:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", worker, "--folder", str(folder),
               "--repeats", str(repeats)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=tempfile.gettempdir())
    if done.returncode:
        raise SystemExit(f"worker {worker} ({tree or 'this environment'}) failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---- the comparison ----------------------------------------------------------------------------------


def before_tree(args, work: Path) -> Path:
    """The tree to compare with: --before-tree as it is, or --before checked out as a git worktree."""
    if args.before_tree is not None:
        return args.before_tree.resolve()
    tree = work / f"tree-{args.before}"
    if not tree.is_dir():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--force", str(tree), args.before],
                       check=True, capture_output=True)
    return tree


def compare(args) -> dict:
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    before = before_tree(args, work)
    results: dict[str, dict] = {}
    for workload in args.workloads:
        if workload == "kernels":
            folder = gpt2_folder(work, "b")
            rounds = [run_worker(ROOT, "kernels", folder, args.repeats, args.threads) for _ in range(args.rounds)]
            names = list(KERNELS)
            medians = {name: statistics.median(r["tokens_per_s"][name] for r in rounds) for name in names}
            ratios = {name: statistics.median(r["ratio_to_sdpa"][name] for r in rounds) for name in names}
            results[workload] = {"rounds": rounds, "median": medians, "ratio_to_sdpa": ratios}
            print_kernels(results[workload])
            continue
        if workload.startswith("serve"):
            model = workload.removeprefix("serve-")
            sides = {"before": before, "after": ROOT}
            per_side = {side: [] for side in sides}
            for round_index in range(args.rounds):
                for side in (list(sides) if round_index % 2 == 0 else list(sides)[::-1]):
                    per_side[side].append(run_serve_load(sides[side], model, work, args.threads))
                print(f"{workload} round {round_index + 1}: " + ", ".join(
                    f"{side} {per_side[side][-1]['tokens_per_s']:.1f}" for side in sides), flush=True)
            medians = {side: statistics.median(r["tokens_per_s"] for r in rows) for side, rows in per_side.items()}
            summary = {"key": "tokens_per_s", "median": medians, "rounds": per_side,
                       "after_over_before": medians["after"] / medians["before"],
                       "paired": paired_ratio(per_side, "tokens_per_s"),
                       "same_output": all(r["short_requests"] == 0 for rows in per_side.values() for r in rows)}
            results[workload] = summary
            print_summary(workload, summary)
            continue
        if workload.startswith("generate"):
            folder = gpt2_folder(work, workload[-1])
            sides = {"before": ("generate", before), "after": ("generate", ROOT), "hf": ("hf-generate", None)}
            key = "tokens_per_s"
        else:
            folder = translation_folder(work, before)
            sides = {"before": ("translate", before), "after": ("translate", ROOT)}
            key = "sentences_per_s"
        per_side: dict[str, list[dict]] = {side: [] for side in sides}
        for round_index in range(args.rounds):
            order = list(sides) if round_index % 2 == 0 else list(sides)[::-1]
            for side in order:
                worker, tree = sides[side]
                per_side[side].append(run_worker(tree, worker, folder, args.repeats, args.threads))
            print(f"{workload} round {round_index + 1}: " + ", ".join(
                f"{side} {per_side[side][-1][key]:.2f}" for side in sides), flush=True)
        medians = {side: statistics.median(r[key] for r in rows) for side, rows in per_side.items()}
        summary = {"key": key, "median": medians, "after_over_before": medians["after"] / medians["before"],
                   "paired": paired_ratio(per_side, key), "rounds": per_side}
        if "hf" in medians:
            summary["over_hf"] = {side: medians[side] / medians["hf"] for side in ("before", "after")}
        summary["same_output"] = per_side["before"][-1].get("last_tokens", per_side["before"][-1].get(
            "characters")) == per_side["after"][-1].get("last_tokens", per_side["after"][-1].get("characters"))
        results[workload] = summary
        print_summary(workload, summary)
    return results


def paired_ratio(per_side: dict[str, list[dict]], key: str) -> float:
    """The median over rounds of after / before within each round: the two sides of a round run back to
    back, so a machine that speeds up or slows down over the run moves both."""
    return statistics.median(after[key] / before[key] for before, after in zip(per_side["before"], per_side["after"],
                                                                                strict=True))


def print_summary(workload: str, summary: dict) -> None:
    medians, key = summary["median"], summary["key"]
    line = (f"== {workload}: {key} median before {medians['before']:.2f}, after {medians['after']:.2f}: "
            f"after/before {summary['after_over_before']:.3f} (median of each round's ratio {summary['paired']:.3f})")
    if "over_hf" in summary:
        line += (f"; Hugging Face {medians['hf']:.2f}: before/HF {summary['over_hf']['before']:.2f}x, "
                 f"after/HF {summary['over_hf']['after']:.2f}x")
    check = "every request got all its tokens" if workload.startswith("serve") else "same output"
    print(line + f"; {check}: {'yes' if summary['same_output'] else 'NO'}", flush=True)


def print_kernels(summary: dict) -> None:
    print("== kernels (this tree, generate-b's workload): " + ", ".join(
        f"{name} {speed:.1f} tok/s ({summary['ratio_to_sdpa'][name]:.2f}x sdpa)"
        for name, speed in summary["median"].items()), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="HEAD", help="the git ref to compare with (default: HEAD)")
    parser.add_argument("--before-tree", type=Path, help="a folder holding the tree to compare with (instead)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="of " + ", ".join(WORKLOADS))
    parser.add_argument("--rounds", type=int, default=5, help="subprocess runs per side (median)")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls inside each run (median)")
    parser.add_argument("--threads", type=int, help="CPU threads for every side (default: torch's default)")
    parser.add_argument("--work", type=Path, default=Path("runs/compare-trees"), help="models and worktrees")
    parser.add_argument("--out", type=Path, help="write every figure here as JSON")
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(WORKERS[args.worker](args.folder, args.repeats)))
        return
    args.workloads = [name.strip() for name in args.workloads.split(",") if name.strip()]
    unknown = sorted(set(args.workloads) - set(WORKLOADS))
    if unknown:
        parser.error(f"unknown workload(s) {', '.join(unknown)}; known: {', '.join(WORKLOADS)}")
    started = time.time()
    print(f"load average at start {os.getloadavg()[0]:.1f}", flush=True)
    results = compare(args)
    print(f"load average at the end {os.getloadavg()[0]:.1f}; {time.time() - started:.0f} s", flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
