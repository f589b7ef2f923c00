"""Plant known bugs in a copy of the tree, one at a time, and check that the tests catch each.

Each mutation is a search/replace on one source file and names the tests that guard it. The
tree (the files git tracks or would track) is copied into a temporary folder, the named tests
run there once unmutated (they must pass), then once per mutation (they must fail). The table
says caught / survived and how long each took. The exit status is non-zero when a mutation
survived, when a search string is not found exactly once (the list went stale), or when the
unmutated tests fail.

    python tools/mutation_check.py                         # every mutation
    python tools/mutation_check.py --list                  # their names and tests
    python tools/mutation_check.py --only rope-rotates-backwards
    python tools/mutation_check.py --without-transformers  # `transformers` hidden: its tests skip

Slow (minutes), so not part of ``make test``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutation:
    name: str
    file: str  # relative to the repository root
    search: str  # must occur exactly once in the file
    replace: str
    tests: tuple[str, ...]  # pytest arguments: files, node ids, -k expressions
    why: str


MUTATIONS = (
    Mutation(
        "llama3-scaling-blends-backwards", "tformer/nn/positions/rope_scaling.py",
        "smoothed = (1 - blend) * scaled / factor + blend * scaled",
        "smoothed = blend * scaled / factor + (1 - blend) * scaled",
        ("tests/nn/test_rope_scaling_hf.py",),
        "Llama 3.1's scaling blends the middle wavelengths with the weights swapped",
    ),
    Mutation(
        "yarn-attention-factor-dropped", "tformer/nn/positions/rotary.py",
        "        if factor != 1.0:\n            cos, sin = cos * factor, sin * factor\n",
        "",
        ("tests/nn/test_rope_scaling.py", "tests/interop/test_interop.py::test_llama_checkpoint_gives_hf_logits"),
        "YaRN's and LongRoPE's attention factor never scales cos and sin",
    ),
    Mutation(
        "longrope-switches-one-position-late", "tformer/nn/positions/rope_scaling.py",
        "long = seq_len is not None and seq_len > original",
        "long = seq_len is not None and seq_len > original + 1",
        ("tests/nn/test_rope_scaling_hf.py",),
        "LongRoPE keeps its short factors for a pass whose longest position is the first past the original context",
    ),
    Mutation(
        "partial-rotary-turns-the-tail", "tformer/nn/positions/rotary.py",
        "    turning, passing = x[..., :rotated], x[..., rotated:]\n"
        "    return torch.cat([turning * cos + rotate_half(turning) * sin, passing], dim=-1)",
        "    passing, turning = x[..., :-rotated], x[..., -rotated:]\n"
        "    return torch.cat([passing, turning * cos + rotate_half(turning) * sin], dim=-1)",
        ("tests/nn/test_rope_scaling.py", "tests/nn/test_rope_scaling_hf.py"),
        "a partial rotary embedding turns the last dimensions of each head instead of the first",
    ),
    Mutation(
        "output-bias-ignored", "tformer/nn/attention/module.py",
        "self.out_proj = nn.Linear(q_size, d_model, bias=bias and output_bias)",
        "self.out_proj = nn.Linear(q_size, d_model, bias=bias)",
        ("tests/models/test_config.py",),
        "output_bias=False leaves the output projection its bias (Qwen2 would load with a missing weight)",
    ),
    Mutation(
        "mistral-window-one-key-wide", "tformer/interop/mistral.py",
        'return {**values, "attention_kernel": WINDOW_KERNEL, "attention_window": window - 1}',
        'return {**values, "attention_kernel": WINDOW_KERNEL, "attention_window": window}',
        ("tests/interop/test_interop.py::test_open_families_give_hf_logits_and_decode_as_hf_generate",),
        "Mistral's sliding_window read as tformer's window (one key more than Hugging Face attends)",
    ),
    Mutation(
        "gemma-norm-without-the-one", "tformer/nn/norm.py",
        'return (normed * (1.0 + self._parameters["weight"].float())).to(x.dtype)',
        'return (normed * self._parameters["weight"].float()).to(x.dtype)',
        ("tests/nn/test_norm.py",),
        "Gemma's RMSNorm scales by its weight instead of one plus it",
    ),
    Mutation(
        "chunked-window-cut-one-key-late", "tformer/nn/attention/chunked.py",
        "cuts_window = window is not None and (ks < last - window or",
        "cuts_window = window is not None and (ks < last - window - 1 or",
        ("tests/nn/test_attention_properties.py",),
        "a key block whose first key sits exactly one past the window's edge is taken whole (that key attended)",
    ),
    Mutation(
        "attention-causal-dropped-with-mask", "tformer/nn/attention/sdpa.py",
        "        mask = mask + additive_mask(causal_mask(q.shape[-2], k.shape[-2], q.device), mask.dtype)\n",
        "",
        ("tests/nn/test_attention.py",),
        "attention(is_causal=True, mask=...) on the fused path forgets causality",
    ),
    Mutation(
        "int8-scales-per-input-column", "tformer/nn/weights/int8.py",
        "    scales = weight.abs().amax(dim=1) / 127\n",
        "    scales = weight.abs().amax(dim=0)[: weight.shape[0]] / 127\n",
        ("tests/nn/test_quantization.py",),
        "int8 scales taken over the wrong axis: rows quantized with another row's range",
    ),
    Mutation(
        "w8a8-one-step-for-the-whole-batch", "tformer/nn/weights/int8.py",
        "    steps = rows.abs().amax(dim=1, keepdim=True)",
        "    steps = rows.abs().amax().expand(rows.shape[0], 1)",
        ("tests/nn/test_quantization.py",),
        "w8a8 (its tensor-operation rounding) rounds a batch's activations with one shared step",
    ),
    Mutation(
        "w8a8-compiled-one-step-for-the-whole-batch", "tformer/nn/kernels/int8_dynamic.cpp",
        "largest_magnitude(source + r * length, length)",
        "largest_magnitude(source, length)",
        ("tests/nn/test_quantization.py", "-k", "dynamic or compiled"),
        "w8a8's compiled rounding gives every row the first row's step: a row's result depends on the other rows",
    ),
    Mutation(
        "int4-zero-point-one-step-off", "tformer/nn/weights/int4.py",
        "    zeros = low + 8 * scales  # the value of q = 8\n",
        "    zeros = low + 7 * scales  # the value of q = 8\n",
        ("tests/nn/test_quantization.py",),
        "int4 zeros one step off the kernel's q = 8 convention: every weight shifted by a step",
    ),
    Mutation(
        "rolling-cache-hides-the-oldest-key", "tformer/nn/attention/cache.py",
        "        first = max(0, held - self.window)  # the oldest key the first new query sees\n",
        "        first = max(0, held - self.window + 1)  # the oldest key the first new query sees\n",
        ("tests/nn/test_attention_kernels.py",),
        "a sliding window's decoding step misses the key W positions back",
    ),
    Mutation(
        "paged-decode-ignores-padding", "tformer/nn/attention/paged.py",
        "            self.decode_padding = self.decode_positions >= 0\n",
        "            pass\n",
        ("tests/serving/test_serving_engine.py",),
        "one-token sequences of different lengths attend to the padding slots of the shorter ones",
    ),
    Mutation(
        "translation-source-padding-attended", "tformer/models/base.py",
        '"encoder_attention_mask": mask})\n',
        '"encoder_attention_mask": torch.ones_like(mask)})\n',
        ("tests/models/test_encoder_decoder.py", "tests/models/test_rnn_seq2seq.py"),
        "the decoder cross-attends to the padding of a shorter source in a batch",
    ),
    Mutation(
        "marian-positions-interleaved", "tformer/interop/marian.py",
        '"sinusoidal_layout": "split",',
        '"sinusoidal_layout": "interleaved",',
        ("tests/interop/test_interop_marian.py",),
        "a Marian checkpoint runs with the paper's interleaved sine/cosine table instead of Marian's split one",
    ),
    Mutation(
        "t5-scores-scaled-twice", "tformer/interop/t5.py",
        "t * config.head_dim ** 0.5 if name.endswith(QUERY_SUFFIXES) else t",
        "t if name.endswith(QUERY_SUFFIXES) else t",
        ("tests/interop/test_interop_t5.py",),
        "T5's unscaled attention scores divided by sqrt(d_kv) (the query weights not rescaled on load)",
    ),
    Mutation(
        "many-rows-projection-drops-bias", "tformer/nn/weights/prepacked.py",
        "                out = torch.addmm(packed.bias_column, packed.weight_out_in, rows.t()).t().contiguous()\n",
        "                out = torch.mm(packed.weight_out_in, rows.t()).t().contiguous()\n",
        ("tests/serving/test_serving_engine.py::test_sixteen_concurrent_greedy_requests_equal_each_alone",
         "tests/generation/test_generation_cache.py", "-k", "row_count"),
        "a large projection over many rows (a batched decode step, a prefill) forgets its bias",
    ),
    Mutation(
        "server-keeps-decoding-for-a-gone-client", "tformer/serving/submission.py",
        "        self.client_gone = True\n        self.cancel()\n",
        "        self.client_gone = True\n",
        ("tests/serving/test_serving_server.py::test_a_client_that_leaves_stops_the_decode_within_one_step",),
        "a request whose client closed its connection decodes on to max_tokens, holding its cache blocks",
    ),
    Mutation(
        "server-mixes-up-choices", "tformer/serving/submission.py",
        "            yield prompt_index * self.n + event.index, event\n",
        "            yield prompt_index * self.n, event\n",
        ("tests/serving/test_serving_server.py::test_stop_strings_n_and_seeded_sampling",),
        "the n sequences of one request are merged into one choice",
    ),
    Mutation(
        "pool-frees-a-shared-block", "tformer/serving/block_pool.py",
        "            self._references[block] -= 1\n            if self._references[block] == 0:",
        "            self._references[block] -= 1\n            if self._references[block] <= 1:",
        ("tests/serving/test_prefix_cache.py",),
        "a block another table still holds is given back: a new sequence overwrites a running one's keys",
    ),
    Mutation(
        "running-state-not-written-back", "tformer/nn/attention/performer.py",
        "            out[rows] = step.squeeze(2)\n            self.write(slots, state)",
        "            out[rows] = step.squeeze(2)",
        ("tests/serving/test_cache_specs.py",),
        "a decoding step's Performer sums are dropped: the next step reads the state before it",
    ),
    Mutation(
        "state-row-given-twice", "tformer/serving/scheduler.py",
        "                self.free_states.append(row)",
        "                self.free_states.extend((row, 0))",
        ("tests/serving/test_cache_specs.py",),
        "a finished sequence's running-state row is handed out twice: two sequences overwrite each other's sums",
    ),
    Mutation(
        "pool-holds-every-layer", "tformer/serving/engine_caches.py",
        "    pool = BlockPool(num_blocks, block_size, len(paged), heads, head_dim, dtype, device)",
        "    pool = BlockPool(num_blocks, block_size, len(specs), heads, head_dim, dtype, device)",
        ("tests/serving/test_cache_specs.py",),
        "the pool keeps keys for layers that store none per token (Performer's): memory the specs do not ask for",
    ),
    Mutation(
        "cross-attention-reads-another-source", "tformer/nn/attention/paged.py",
        "            out[layout.decode_rows] = self._decode(kernel, queries, layout.decode_state_slots)",
        "            out[layout.decode_rows] = self._decode(kernel, queries, layout.decode_state_slots.flip(0))",
        ("tests/serving/test_serve_encoder_decoder.py",),
        "a decoding sequence of an encoder-decoder attends over another sequence's source",
    ),
    Mutation(
        "source-padding-kept-as-keys", "tformer/nn/attention/paged.py",
        "            length = k.shape[2] if mask.new_lengths is None else mask.new_lengths[index]",
        "            length = k.shape[2]",
        ("tests/serving/test_serve_encoder_decoder.py",),
        "a short source's padding, started beside a longer one, is kept among its cross-attention keys",
    ),
    Mutation(
        "beams-keep-their-own-keys", "tformer/serving/emitter.py",
        "        self.scheduler.reorder_beams(moves)",
        "        pass",
        ("tests/serving/test_serve_beam_search.py", "tests/serving/test_serve_encoder_decoder.py"),
        "a beam that takes over another's hypothesis keeps its own cached keys: its next tokens read the wrong past",
    ),
    Mutation(
        "beam-copy-writes-shared-slots", "tformer/serving/scheduler.py",
        "        if bool(moved.any()):\n            self.pool.copy_slots(sources[moved], targets[moved])",
        "        self.pool.copy_slots(sources, targets[torch.randperm(len(targets))])",
        ("tests/serving/test_serve_beam_search.py",),
        "a beam's copy lands in slots it does not own (the shared prompt's, another beam's)",
    ),
    Mutation(
        "stale-source-lengths", "tformer/nn/attention/paged.py",
        "        self.lengths[slot] = length\n",
        "",
        ("tests/serving/test_serve_encoder_decoder.py",),
        "a row taken over by a new source keeps the old one's length: the new sequence reads past its source or short",
    ),
    Mutation(
        "every-beam-reports-its-end", "tformer/serving/emitter.py",
        "            if sequence.index < request.answers:  # a beam search's other beams have no events",
        "            if True:",
        ("tests/serving/test_serve_beam_search.py",),
        "a cancelled beam search sends an end event for every beam: the route counts choices it never asked for",
    ),
    Mutation(
        "shared-beam-step-reads-one-length", "tformer/generation/beam.py",
        "    lengths = [search.length for search in searches]",
        "    lengths = [first.length for search in searches]",
        ("tests/generation/test_beam_searches_together.py",),
        "beam searches sharing a step all write, score and end at the first one's length, not each at its own",
    ),
    Mutation(
        "shared-beam-step-skips-rules", "tformer/generation/beam.py",
        "        if search.run.chooser.rules:  # no rules",
        "        if False:  # no rules",
        ("tests/generation/test_beam_searches_together.py",),
        "a beam search sharing its step with others loses its own rules (min_new_tokens): an end comes too early",
    ),
    Mutation(
        "beam-length-penalty-of-the-first-prompt", "tformer/generation/beam.py",
        "[[count**length_penalty] for count in generated]",
        "[[generated[0] ** length_penalty] for count in generated]",
        ("tests/generation/test_beam_searches_together.py",),
        "every prompt's finished hypotheses are scored with the first prompt's length penalty divisor",
    ),
    Mutation(
        "beam-reorder-of-the-last-search-only", "tformer/serving/scheduler.py",
        "        for beams, parents in searches:\n            length = beams[0].table.length",
        "        for beams, parents in searches[-1:]:\n            length = beams[0].table.length",
        ("tests/serving/test_serve_encoder_decoder.py", "tests/serving/test_serve_beam_search.py"),
        "only one request's beams take over their parents' keys when several beam searches step together",
    ),
    Mutation(
        "cli-dtype-loads-float32-first", "tformer/cli/model_source.py",
        "    built_in = source.dtype if source.adapter is None and source.quantize is None else None",
        "    built_in = None",
        ("tests/cli/test_dtype.py",),
        "--dtype loads the float32 model and casts it: a model that fits only in the smaller type is refused",
    ),
    Mutation(
        "serving-leaks-finished-blocks", "tformer/serving/scheduler.py",
        "            sequence.table.release()",
        "            pass",
        ("tests/serving/test_serving_engine.py",),
        "a finished sequence keeps its cache blocks",
    ),
    Mutation(
        "beam-never-bound-at-current-length", "tformer/generation/beam.py",
        '[max_new_tokens] * len(generated) if early_stopping == "never"',
        'generated if early_stopping == "never"',
        ("tests/generation/test_generation_strategies.py", "-k", "beam"),
        'early_stopping="never" bounds a running beam at its current length instead of the longest',
    ),
    Mutation(
        "beam-reorder-skips-values", "tformer/nn/attention/cache.py",
        "for cache in (self.keys, self.values):",
        "for cache in (self.keys,):",
        ("tests/generation/test_generation_strategies.py", "-k", "beam"),
        "beam search reorders the key cache but not the value cache",
    ),
    Mutation(
        "beams-read-another-sources-keys", "tformer/nn/attention/cache.py",
        "grouped = q.view(sources, group, heads, length, head_dim).transpose(1, 2)",
        "grouped = q.view(group, sources, heads, length, head_dim).permute(1, 2, 0, 3, 4)",
        ("tests/generation/test_generation_cache.py", "-k", "share"),
        "beams sharing their sources' cross-attention keys are matched to sources interleaved, not in groups",
    ),
    Mutation(
        "checkpoint-config-renamed-first", "tformer/checkpoint.py",
        "key=lambda f: f.name == CONFIG_NAME",
        "key=lambda f: f.name != CONFIG_NAME",
        ("tests/models/test_checkpoint.py",),
        "a save into a run folder renames config.json into place before the weights",
    ),
    Mutation(
        "checkpoint-target-deleted-before-rename", "tformer/checkpoint.py",
        "            os.replace(target, previous)\n",
        "            shutil.rmtree(target)\n",
        ("tests/models/test_checkpoint.py",),
        "atomic_directory deletes the old checkpoint before the new one is renamed into place",
    ),
    Mutation(
        "rope-rotates-backwards", "tformer/nn/positions/rotary.py",
        "return torch.cat([-second, first], dim=-1)",
        "return torch.cat([second, -first], dim=-1)",
        ("tests/nn/test_position.py",),
        "rotary embeddings rotate each pair clockwise (rotate_half's sign)",
    ),
    Mutation(
        "qa-loss-counts-padding", "tformer/nn/heads.py",
        "start_positions, end_positions,\n                                    features.attention_mask)",
        "start_positions, end_positions)",
        ("tests/training/test_one_loss.py",),
        "the model's span loss spreads its softmax over padding, unlike the loss span_qa trains on",
    ),
    Mutation(
        "label-smoothing-in-evaluation", "tformer/training/tasks/lm.py",
        '"loss": next_token_loss(logits, batch["labels"]).double()',
        '"loss": next_token_loss(logits, batch["labels"], self.config.label_smoothing).double()',
        ("tests/training/test_training_engine.py", "-k", "label_smoothing"),
        "evaluation reports the label-smoothed loss",
    ),
    Mutation(
        "best-checkpoint-keeps-the-worst", "tformer/training/trainer.py",
        "sign = -1.0 if name in self.task.higher_is_better else 1.0",
        "sign = 1.0 if name in self.task.higher_is_better else -1.0",
        ("tests/training/test_training_engine.py", "-k", "best"),
        "checkpoints/best tracks the worst evaluation",
    ),
    Mutation(
        "another-tasks-setting-accepted", "tformer/training/tasks/registry.py",
        "            if value != known[key][1]:",
        "            if False:",
        ("tests/training/test_task_registry.py",),
        "a [task] setting of another task is silently dropped instead of refused",
    ),
    Mutation(
        "token-head-reads-the-pooled-vector", "tformer/nn/heads.py",
        "model.classifier(model.classifier_dropout(features.hidden))  # (B, T, L)",
        "model.classifier(model.classifier_dropout(features.pooled))[:, None].expand(-1, features.hidden.shape[1], -1)",
        ("tests/training/test_one_loss.py", "tests/interop/test_interop_encoder.py", "-k", "token"),
        "the token-classification head tags every token with the sentence's pooled vector",
    ),
    Mutation(
        "int8-bfloat16-kernel-on-any-width", "tformer/nn/weights/int8.py",
        "        return dtype != torch.bfloat16 or self.in_features % 16 == 0",
        "        return True",
        ("tests/nn/test_quantization.py", "-k", "widths"),
        "an int8 layer whose width is not a multiple of 16 reaches the bfloat16 kernel, which ends the process",
    ),
    Mutation(
        "spec-augment-masks-the-padding", "tformer/training/tasks/speech_recognition.py",
        "    starts = (torch.rand(rows, count, generator=generator) * (lengths[:, None] - widths + 1)).long()",
        "    starts = (torch.rand(rows, count, generator=generator) * (size - widths + 1)).long()",
        ("tests/training/test_speech_recognition.py", "-k", "spec_augment"),
        "SpecAugment's time spans land in the silence that pads a recording to the window, masking nothing",
    ),
    Mutation(
        "time-budget-restarts-on-resume", "tformer/training/trainer.py",
        "seconds_before, budget = self.elapsed_seconds, 60 * config.max_minutes",
        "seconds_before, budget = 0.0, 60 * config.max_minutes",
        ("tests/training/test_training_engine.py", "-k", "max_minutes"),
        "a resumed run gets training.max_minutes afresh instead of what the budget has left",
    ),
    Mutation(
        "stacked-adapters-mix-rows", "tformer/nn/weights/multi_lora.py",
        "            low = low * torch.where(per_row[:, None] == owner, scale, 0.0)",
        "            low = low * scale",
        ("tests/nn/test_multi_lora.py",),
        "a served step's rows each get every adapter's update, not only their own (the stacked products' mask lost)",
    ),
    Mutation(
        "mixing-temperature-ignored", "tformer/data/text_to_text.py",
        "    exponent = 1.0 / temperature if mixing == \"temperature\" else 1.0",
        "    exponent = 1.0",
        ("tests/training/test_tasks_text_to_text.py",),
        "temperature-scaled mixing draws at the proportional rates: a large source crowds out the small ones",
    ),
    Mutation(
        "source-rate-ignored", "tformer/data/text_to_text.py",
        "        return [rate / sum(given) for rate in given]",
        "        return [1.0 / len(given)] * len(given)",
        ("tests/training/test_tasks_text_to_text.py",),
        "a mixture at hand-set rates draws every source equally: the rates a recipe sets are silently ignored",
    ),
    Mutation(
        "mixture-source-reread-from-its-start", "tformer/training/tasks/text_to_text.py",
        "            rows[chosen] = self._source_examples(source, before[source] + torch.arange(len(chosen)))",
        "            rows[chosen] = self._source_examples(source, torch.arange(len(chosen)))",
        ("tests/training/test_tasks_text_to_text.py",),
        "every batch reads a source's first examples again: most of each source is never trained on",
    ),
    Mutation(
        "squad-source-scored-on-first-answer", "tformer/training/tasks/text_to_text.py",
        "                    sums[f\"{source.name}/{score}\"] = sum(max(measure(answer, gold) for gold in golds)",
        "                    sums[f\"{source.name}/{score}\"] = sum(max(measure(answer, gold) for gold in golds[:1])",
        ("tests/training/test_tasks_text_to_text.py",),
        "a SQuAD source's answers are scored against the first gold answer only, not the best of all of them",
    ),
    Mutation(
        "constraint-mask-ignored", "tformer/generation/rules.py",
        "    masked = scores.masked_fill(~allowed.to(scores.device), NEVER)  # (R, V)",
        "    masked = scores",
        ("tests/generation/test_constraints.py",),
        "a constrained request decodes freely: the grammar's mask is computed and never applied",
    ),
    Mutation(
        "batched-constraint-unmasked", "tformer/serving/emitter.py",
        "        scores = apply_grammar_masks(logits.index_select(0, picked).float(), masks)",
        "        scores = logits.index_select(0, picked).float()",
        ("tests/serving/test_serve_structured.py::"
         "test_the_engine_batches_rows_with_different_constraints_each_as_generate_alone",),
        "the engine's greedy constrained rows, masked together, take the plain argmax: their text leaves the grammar",
    ),
    Mutation(
        "beams-store-their-source-each", "tformer/serving/engine.py",
        "                                   shares_rows=model.encodes_prompt and not self._keeps_sums,",
        "                                   shares_rows=False,",
        ("tests/serving/test_serve_encoder_decoder.py", "-k", "beam_searches_beside"),
        "every beam of a request keeps its own copy of the encoder's keys: a row each, projected once each",
    ),
    Mutation(
        "shared-row-freed-by-its-first-holder", "tformer/serving/scheduler.py",
        "            if not any(other.state_slot == row for _, other in self.running):  # its last holder",
        "            if True:",
        ("tests/serving/test_serve_encoder_decoder.py", "tests/serving/test_cache_specs.py"),
        "a request's shared row of encoder keys goes back to the pool when its first sequence ends: a new source "
        "overwrites it under the others",
    ),
    Mutation(
        "engine-transcribes-the-first-window", "tformer/serving/engine.py",
        "            for window in audio_windows(features, model.config.input_frames):",
        "            for window in audio_windows(features, model.config.input_frames)[:1]:",
        ("tests/serving/test_serve_speech.py", "-k", "alone"),
        "a recording longer than the model's window is transcribed from its first window only",
    ),
    Mutation(
        "speech-decoder-loses-its-prompt", "tformer/serving/engine.py",
        "        return prompt, model.decoder_start(1, self.device, config.decoder_prompt_ids)[0].tolist()",
        "        return prompt, model.decoder_start(1, self.device)[0].tolist()",
        ("tests/serving/test_serve_speech.py", "-k", "whisper"),
        "a served Whisper window starts from the start token, not <|startoftranscript|> and the task tokens",
    ),
    Mutation(
        "transcript-windows-joined-backwards", "tformer/serving/routes/transcriptions.py",
        "    text = _text(served, [token for window in windows for token in window.token_ids])",
        "    text = _text(served, [token for window in reversed(windows) for token in window.token_ids])",
        ("tests/serving/test_serve_speech.py", "-k", "verbose"),
        "a served transcript joins its windows in the wrong order",
    ),
    Mutation(
        "head-loss-ignores-the-gradient-from-above", "tformer/nn/losses.py",
        "        scaled = [None if each is None else each * grad.to(each.dtype) for each in kept]",
        "        scaled = list(kept)",
        ("tests/nn/test_head_loss.py",),
        "the piecewise loss's kept gradients are returned as they are: a loss scaled, averaged over accumulated "
        "micro-batches or by an fp16 scaler trains at the wrong size",
    ),
    Mutation(
        "head-loss-keeps-the-last-piece-of-the-heads-gradient", "tformer/nn/losses.py",
        "trained_grads[index] = grad if trained_grads[index] is None else trained_grads[index].add_(grad)",
        "trained_grads[index] = grad",
        ("tests/nn/test_head_loss.py",),
        "a trained head's weight gradient holds its last piece of positions only",
    ),
    Mutation(
        "quantized-head-dequantized-every-piece", "tformer/nn/weights/quantized.py",
        "        return reused_weights.weight(self, (\"weight\", dtype), lambda: self.dequantized_weight().to(dtype))",
        "        return self.dequantized_weight().to(dtype)",
        ("tests/nn/test_head_loss.py",),
        "a quantized head rebuilds its float weight for every piece of the loss (QLoRA's step 25% slower)",
    ),
    Mutation(
        "int8-integers-kept-as-its-weight", "tformer/nn/weights/int8.py",
        "sums = self._by_blocks(rows, (\"integers\", dtype),",
        "sums = self._by_blocks(rows, (\"weight\", dtype),",
        ("tests/nn/test_head_loss.py", "-k", "apart"),
        "an int8 layer's integers as floats, kept for its product, are read back as its dequantized weight (the "
        "scales lost) by the input gradient within the same block",
    ),
    Mutation(
        "int8-compiled-hands-over-bfloat16-scales", "tformer/nn/weights/int8.py",
        "scales = self.scales if self.scales.dtype == torch.float32 else self.scales.float()",
        "scales = self.scales",
        ("tests/nn/test_quantization.py", "-k", "cast_to_bfloat16"),
        "an int8 model cast to bfloat16 hands the compiled kernel its bfloat16 scales, which it refuses "
        "(--quantize int8 --dtype bf16 refused on hosts whose plan picks the compiled way)",
    ),
    Mutation(
        "load-quantizes-weights-already-cast", "tformer/hub.py",
        "    build_dtype = dtype if wanted is None and saved_scheme is None else None",
        "    build_dtype = dtype",
        ("tests/models/test_checkpoint.py", "-k", "quantized_as_it_loads"),
        "tformer.load(quantize=, dtype=) quantizes weights already rounded to the type (other integers and scales)",
    ),
    Mutation(
        "load-in-a-type-casts-after-the-load", "tformer/hub.py",
        "    return model if dtype is None else model.to(dtype)",
        "    return model",
        ("tests/models/test_checkpoint.py", "-k", "another_type"),
        "tformer.load(dtype=) builds the model in float32 again (twice the memory of a bfloat16 model on the way)",
    ),
    Mutation(
        "int4-block-dequantized-with-the-first-rows-scales", "tformer/nn/weights/int4.py",
        ".mul_(self.scales[first:last, :, None]).add_(self.zeros[first:last, :, None])",
        ".mul_(self.scales[: last - first, :, None]).add_(self.zeros[: last - first, :, None])",
        ("tests/nn/test_quantization.py", "-k", "block_of_output"),
        "an int4 layer's product over many rows scales every block of its weight by the first block's scales",
    ),
    Mutation(
        "quantized-product-leaves-the-last-block", "tformer/nn/weights/quantized.py",
        "        for first in range(0, self.out_features, block):",
        "        for first in range(0, self.out_features - block, block):",
        ("tests/nn/test_quantization.py", "-k", "block_of_output"),
        "a quantized layer's product over many rows (a prompt) never computes its last block of outputs (left as "
        "allocated)",
    ),
    Mutation(
        "int4-dequantized-a-step-off", "tformer/nn/weights/int4.py",
        "        groups.sub_(8).mul_(self.scales[first:last, :, None]).add_(self.zeros[first:last, :, None])",
        "        groups.sub_(7).mul_(self.scales[first:last, :, None]).add_(self.zeros[first:last, :, None])",
        ("tests/nn/test_quantization.py", "tests/nn/test_head_loss.py"),
        "an int4 layer's float weight (its input gradient under QLoRA, to_linear, off the CPU) a step off its kernel's",
    ),
    Mutation(
        "task-loss-drops-label-smoothing", "tformer/training/tasks/base.py",
        "return_logits=False, label_smoothing=smoothing).loss",
        "return_logits=False).loss",
        ("tests/data/test_chat_data.py",),
        "the lm, sft and sequence-to-sequence tasks train without their recipe's label smoothing",
    ),
    Mutation(
        "task-loss-holds-the-logits-of-a-model-that-needs-none", "tformer/training/tasks/base.py",
        "        if self.loss_alone:",
        "        if False:",
        ("tests/training/test_tasks_translation.py", "tests/training/test_training_engine.py"),
        "lm, sft, translation, text-to-text and span-corruption steps hold the (B, T, V) logits their loss can do "
        "without",
    ),
    Mutation(
        "head-outputs-drop-label-smoothing", "tformer/models/base.py",
        "model.config.vocab_size,\n                               label_smoothing)",
        "model.config.vocab_size,\n                               0.0)",
        ("tests/nn/test_head_loss.py",),
        "a model asked for its loss alone trains without the task's label smoothing",
    ),
    Mutation(
        "clock-schedule-never-decays", "tformer/training/schedules.py",
        "    return min(ramp, _decayed(min(1.0, max(0.0, budget_fraction)), schedule, lr, min_lr))",
        "    return ramp",
        ("tests/training/test_training_clock.py",),
        "a run sized by the clock keeps its peak learning rate to the end, as a step-sized run cut by the budget did",
    ),
    Mutation(
        "clock-schedule-misses-evaluation-time", "tformer/training/trainer.py",
        "self.elapsed_seconds = seconds_before + self.clock() - started  # the schedule's, at this step",
        "pass",
        ("tests/training/test_training_clock.py", "-k", "evaluations_spend"),
        "the rate of the step after an evaluation is read before the evaluation's time is counted",
    ),
    Mutation(
        "bf16-autocast-off", "tformer/training/trainer.py",
        "return torch.autocast(device_type=self.context.device.type, dtype=dtype)",
        "return torch.autocast(device_type=self.context.device.type, dtype=dtype, enabled=False)",
        ("tests/training/test_training_engine.py", "-k", "bf16"),
        "precision='bf16' silently trains in fp32",
    ),
    Mutation(
        "interop-exact-gelu-read-as-tanh", "tformer/interop/family.py",
        '    "gelu": "gelu",\n',
        '    "gelu": "gelu_tanh",\n',
        ("tests/interop/test_interop.py", "tests/interop/test_interop_files.py", "-k", "gelu"),
        "a GPT-2 checkpoint with the exact GELU is mapped to the tanh approximation (7.7e-5 off)",
    ),
    Mutation(
        "nsp-label-in-the-pair-builders-convention", "tformer/training/tasks/mlm.py",
        'fields["next_sentence_label"] = 1 - made.next_sentence_label',
        'fields["next_sentence_label"] = made.next_sentence_label',
        ("tests/training/test_tasks_mlm.py", "-k", "next_sentence"),
        "next-sentence labels reach the model as 1 = B follows A (BertForPreTraining reads 0 = follows)",
    ),
    Mutation(
        "confusion-matrix-transposed", "tformer/training/tasks/classification.py",
        "torch.bincount(labels * num_labels + logits.argmax(dim=-1)",
        "torch.bincount(logits.argmax(dim=-1) * num_labels + labels",
        ("tests/training/test_tasks_classification.py", "-k", "confusion"),
        "the summed confusion matrix puts predictions in rows: per-class figures and the plot swap",
    ),
    Mutation(
        "epoch-order-ignores-the-seed", "tformer/training/tasks/examples.py",
        "generator=seeded_generator(self.config.seed, 1, epoch)",
        "generator=seeded_generator(0, 1, epoch)",
        ("tests/training/test_tasks_mlm.py", "-k", "seeded_order"),
        "every seed reads the training examples in the same order",
    ),
    Mutation(
        "held-out-count-trains-on-the-evaluation-share", "tformer/training/tasks/examples.py",
        "    return total - held\n",
        "    return held\n",
        ("tests/training/test_task_examples.py",),
        "data.eval_fraction's split trains on the held-out share and evaluates on the rest",
    ),
    Mutation(
        "utterance-mean-counts-the-silence", "tformer/data/log_mel.py",
        "    mean = (blocks * inside).sum(-1, keepdim=True) / count  # (B, W, M, 1)\n",
        "    mean = blocks.mean(-1, keepdim=True)  # (B, W, M, 1)\n",
        ("tests/data/test_audio.py", "-k", "normalis"),
        "feature_normalization='utterance' centres each channel on the window's silence as well as its audio",
    ),
    Mutation(
        "transcription-skips-the-normalisation", "tformer/data/log_mel.py",
        "    return normalize_windows(features, [samples.shape[-1]], settings)[0]\n",
        "    return features[0]\n",
        ("tests/data/test_speech_data.py", "-k", "transcription_reads"),
        "tformer transcribe reads plain features where the model trained on normalised ones",
    ),
    Mutation(
        "threads-option-ignored", "tformer/cli/model_source.py",
        "        torch.set_num_threads(threads)\n",
        "        pass\n",
        ("tests/cli/test_hardening_cli.py", "-k", "threads"),
        "tformer generate --threads N computes with as many threads as before",
    ),
    Mutation(
        "ctc-targets-keep-the-end-token", "tformer/models/speech.py",
        "        return labels.masked_fill(labels == self.config.eos_token_id, IGNORE_INDEX)\n",
        "        return labels\n",
        ("tests/models/test_speech_model.py", "-k", "ctc"),
        "the CTC head is trained to write the end token in the audio, a word nobody said",
    ),
    Mutation(
        "ctc-repeats-need-no-blank", "tformer/nn/losses.py",
        "    return real.sum(dim=1) + repeats.sum(dim=1)\n",
        "    return real.sum(dim=1)\n",
        ("tests/nn/test_losses.py",),
        "a transcript of repeated digits is accepted for a window its CTC alignment cannot fit",
    ),
    Mutation(
        "ctc-loss-missing-from-evaluation", "tformer/training/tasks/speech_recognition.py",
        '        if "ctc" in totals:',
        '        if False:',
        ("tests/training/test_one_loss.py", "-k", "ctc"),
        "eval_loss of a model with a CTC head is not the loss it trains on",
    ),
    Mutation(
        "vit-interpolation-aligns-corners", "tformer/nn/patches.py",
        'mode="bicubic", align_corners=False',
        'mode="bicubic", align_corners=True',
        ("tests/models/test_vision.py", "-k", "interpolation"),
        "position tables resampled with align_corners=True: not Hugging Face's ViT at another resolution",
    ),
    Mutation(
        "vit-mean-pooling-reads-the-class-token", "tformer/nn/heads.py",
        "    tokens = hidden[:, class_tokens:]\n",
        "    tokens = hidden\n",
        ("tests/models/test_vision.py", "-k", "pooled_vector"),
        "pooling='mean' averages the class token in with the patches",
    ),
    Mutation(
        "vit-interop-query-key-swapped", "tformer/interop/vit.py",
        '(layer + "attention.attention.query", layer + "attention.attention.key",',
        '(layer + "attention.attention.key", layer + "attention.attention.query",',
        ("tests/interop/test_interop_vit.py", "-k", "outputs_equal"),
        "a ViT checkpoint's query and key matrices land in each other's rows of qkv_proj",
    ),
    Mutation(
        "chunked-attention-forgets-the-running-max", "tformer/nn/attention/chunked.py",
        "total = total * correction + probabilities.sum(-1, keepdim=True)",
        "total = total + probabilities.sum(-1, keepdim=True)",
        ("tests/nn/test_attention_kernels.py", "-k", "chunked_equals"),
        "the online softmax adds a new key block's sum without rescaling the old one to the new maximum",
    ),
    Mutation(
        "performer-causal-chunk-sees-ahead", "tformer/nn/favor.py",
        "decay = decay * below[:length, :length]",
        "decay = decay * below[:length, :length].T",
        ("tests/nn/test_performer.py",),
        "inside a chunk, causal Performer lets a query read later keys instead of earlier ones",
    ),
    Mutation(
        "bleu-matches-unclipped", "tformer/evaluation/translation.py",
        "totals[1 + order] += sum(min(count, wanted.get(gram, 0)) for gram, count in found.items())",
        "totals[1 + order] += sum(count for gram, count in found.items() if gram in wanted)",
        ("tests/training/test_evaluation_translation.py",),
        "BLEU during training counts a repeated n-gram more often than the reference has it",
    ),
    Mutation(
        "translation-batches-overflow-the-budget", "tformer/training/tasks/translation.py",
        "if length * (end - start) > self.batch_tokens:",
        "if length * (end - start - 1) > self.batch_tokens:",
        ("tests/training/test_tasks_translation.py::test_token_budget_batches_cover_every_pair_once_an_epoch",),
        "a translation batch holds one pair more than its token budget allows",
    ),
    Mutation(
        "rnn-attends-to-padding", "tformer/models/rnn_seq2seq.py",
        'scores = self.scores(query, keys).masked_fill(~mask, float("-inf"))',
        "scores = self.scores(query, keys)",
        ("tests/models/test_rnn_seq2seq.py",),
        "the attention RNN puts weight on the padding of a shorter source",
    ),
    Mutation(
        "bahdanau-scores-on-the-new-state", "tformer/models/rnn_seq2seq.py",
        "            context, weights = self.attention(cache.hidden[-1], cache.keys, memory, mask)  # on s(t-1)\n"
        "            output, state = self.decoder(torch.cat([embedded, context], dim=-1)[:, None, :], state)\n",
        "            output, state = self.decoder(torch.cat([embedded, embedded.new_zeros(embedded.shape[0], "
        "memory.shape[-1])], dim=-1)[:, None, :], state)\n"
        "            context, weights = self.attention(output[:, 0], cache.keys, memory, mask)\n",
        ("tests/models/test_rnn_seq2seq.py",),
        "Bahdanau's decoder never reads the context: it attends after its step, as Luong's does",
    ),
    Mutation(
        "teacher-forcing-inverted", "tformer/models/rnn_seq2seq.py",
        "keep = torch.rand(token.shape[0], device=token.device) < teacher_forcing_ratio",
        "keep = torch.rand(token.shape[0], device=token.device) >= teacher_forcing_ratio",
        ("tests/models/test_rnn_seq2seq.py",),
        "teacher forcing below 1 reads the true token where it should read the model's own prediction",
    ),
    Mutation(
        "forced-eos-one-step-early", "tformer/generation/rules.py",
        "if not consecutive and last == 0:",
        "if not consecutive and last == 1:",
        ("tests/interop/test_interop_marian.py",),
        "Marian's forced end token put one step before the length limit instead of at it",
    ),
    Mutation(
        "unigram-ties-go-to-the-later-cut", "tformer/tokenizers/unigram.py",
        "if best[end] is None or candidate > best[end][0]:",
        "if best[end] is None or candidate >= best[end][0]:",
        ("tests/tokenizers/test_tokenizers_unigram.py",),
        "equal-scoring cuts resolved the other way from Hugging Face's (the last piece starting later wins)",
    ),
    Mutation(
        "unigram-unknowns-not-fused", "tformer/tokenizers/unigram.py",
        "if unknown and spans and spans[-1][2]:",
        "if False:",
        ("tests/tokenizers/test_tokenizers_unigram.py",),
        "each unknown character its own <unk> where SentencePiece fuses a run into one",
    ),
    Mutation(
        "charsmap-takes-the-longest-key", "tformer/tokenizers/precompiled.py",
        "                return units[position] & 0x7FFFFFFF\n        return None",
        "                longest = units[position] & 0x7FFFFFFF\n        return locals().get('longest')",
        ("tests/tokenizers/test_tokenizers_unigram.py",),
        "the precompiled map replaces by the longest key that begins a grapheme, not the first as Hugging Face does",
    ),
    Mutation(
        "metaspace-mark-stands-for-nothing", "tformer/tokenizers/unigram.py",
        "                source.insert(0, offset)",
        "                source.insert(0, offset - 1)",
        ("tests/tokenizers/test_tokenizers_unigram.py",),
        "the mark put before a word points one character early, so token offsets start too soon",
    ),
    Mutation(
        "mean-pooling-counts-padding", "tformer/nn/heads.py",
        "    weights = attention_mask[:, class_tokens:].to(hidden.dtype)[:, :, None]  # (B, T, 1)",
        "    weights = torch.ones_like(attention_mask[:, class_tokens:], dtype=hidden.dtype)[:, :, None]  # (B, T, 1)",
        ("tests/models/test_encoder.py::test_mean_pooling_reads_the_tokens_that_are_not_padding",),
        "pooling='mean' averages the padding too, so a sentence's label depends on its batch",
    ),
    Mutation(
        "fine-tuning-load-keeps-the-folders-dropout", "tformer/hub.py",
        "_build(config.replace(**regularisation), folder, initialised=head_options is not None,  # as above\n",
        "_build(config, folder, initialised=head_options is not None,  # as above\n",
        ("tests/models/test_encoder.py::test_a_load_may_change_the_dropout_rates_and_nothing_else_of_the_backbone",),
        "tformer.load(dropout=0.1) silently fine-tunes without dropout",
    ),

    Mutation(
        "empty-rows-not-zeroed", "tformer/nn/attention/sdpa.py",
        "        return zero_empty_rows(out, None, mask, k_len)\n",
        "        return out, None\n",
        ("tests/nn/test_one_forward.py", "-k", "switching"),
        "the fused kernel gives a query that sees no key (left padding) the mean of the values, not zeros: the "
        "loss changes with the kernel",
    ),
    Mutation(
        "output-blocks-read-as-rows", "tformer/nn/weights/prepacked.py",
        "out.view(packed.size_out, count).t().contiguous()",
        "out.view(count, packed.size_out)",
        ("tests/generation/test_generation_cache.py", "-k", "row_count or split_across"),
        "a few rows multiplied by blocks of output rows come back with rows and outputs interleaved",
    ),
    Mutation(
        "prepacked-layout-survives-a-fused-step", "tformer/nn/weights/prepacked.py",
        "        if packed is not None and not packed.holds(self.weight, self.bias):\n",
        "        if False:\n",
        ("tests/generation/test_generation_cache.py", "-k", "fused"),
        "a fused AdamW step (which keeps the weights' version) leaves generation reading the old weights' layout",
    ),
    Mutation(
        "performer-decode-keeps-the-old-level", "tformer/nn/favor.py",
        "    if not torch.equal(raw, level):  # the running max rose\n",
        "    if False:\n",
        ("tests/nn/test_attention_kernels.py", "-k", "performer", "tests/nn/test_performer.py"),
        "a Performer decoding step whose key raises the running max adds to sums still at the old level",
    ),
    Mutation(
        "prefix-cache-computes-no-last-token", "tformer/serving/scheduler.py",
        "self.pool.lookup(request.block_keys[: (length - 1) // size])",
        "self.pool.lookup(request.block_keys[: length // size])",
        ("tests/serving/test_prefix_cache.py",),
        "a prompt of whole cached blocks is taken entirely from the cache, leaving no token whose logits start it",
    ),
    Mutation(
        "paged-in-place-contexts-out-of-order", "tformer/nn/attention/paged.py",
        "layout.decode_context = on_device(torch.cat(decode_contexts), device)",
        "layout.decode_context = on_device(torch.cat(decode_contexts[::-1]), device)",
        ("tests/nn/test_paged_kernel.py", "tests/serving/test_serving_engine.py", "-k", "sixteen or in_place"),
        "the in-place paged kernel reads each sequence's keys at another sequence's offsets",
    ),
    Mutation(
        "overlap-hands-out-a-token-after-the-end", "tformer/serving/overlapped_steps.py",
        "            if sequence.finish_reason is None:\n",
        "            if True:\n",
        ("tests/serving/test_overlapped_steps.py",),
        "the token of the step a sequence was given past its end (an end id, a stop string) is handed out too",
    ),
    Mutation(
        "overlap-steps-past-the-length-limit", "tformer/serving/overlapped_steps.py",
        "if len(sequence.output_ids) + (id(sequence) in ahead) < request.config.max_new_tokens]",
        "if len(sequence.output_ids) < request.config.max_new_tokens]",
        ("tests/serving/test_overlapped_steps.py",),
        "a step launched ahead runs a sequence whose token in flight is its last: a forward pass for nothing",
    ),
    Mutation(
        "overlap-feeds-the-rows-in-the-old-order", "tformer/serving/overlapped_steps.py",
        "    if order == list(range(len(previous.sequences))):",
        "    if len(order) <= len(previous.sequences):",
        ("tests/serving/test_overlapped_steps.py",),
        "once a sequence leaves, the step launched ahead feeds each row the token of the row the step in flight "
        "had there, another sequence's",
    ),
    Mutation(
        "overlap-launches-ahead-of-a-penalty", "tformer/serving/overlapped_steps.py",
        "                   and not request.chooser.reads_history for request, _ in self.scheduler.running)",
        "                   for request, _ in self.scheduler.running)",
        ("tests/serving/test_overlapped_steps.py",),
        "a step is launched ahead for a sequence whose rule reads its tokens so far (a penalty), one still in flight",
    ),
    Mutation(
        "overlap-takes-the-argmax-of-a-sampled-request", "tformer/serving/overlapped_steps.py",
        "        if chooser.alters(generated):\n",
        "        if False:\n",
        ("tests/serving/test_overlapped_steps.py",),
        "a step launched ahead gives a sampled sequence the argmax, not its chooser's draw",
    ),
    Mutation(
        "overlap-draws-a-token-early", "tformer/serving/overlapped_steps.py",
        "        generated = len(sequence.output_ids) + (id(sequence) in ahead)\n",
        "        generated = len(sequence.output_ids)\n",
        ("tests/serving/test_overlapped_steps.py",),
        "a sequence's rules apply as if its token in flight were not there (an end id held back a step too long)",
    ),
    Mutation(
        "embeddings-engine-ignores-cache-switches", "tformer/serving/engine.py",
        "        if value not in defaults:\n",
        "        if False:\n",
        ("tests/serving/test_serve_embeddings.py", "-k", "batches_waiting"),
        "an engine serving embeddings only takes overlap, paged_attention and prefix_caching and ignores them",
    ),
    Mutation(
        "overlap-admits-without-handing-out", "tformer/serving/engine.py",
        "            made += overlapped.drain()  # every running sequence's last token on the host, for the step as it "
        "comes\n",
        "            pass\n",
        ("tests/serving/test_overlapped_steps.py",),
        "a step that admits a request runs while the last step's tokens are still unread: the others' input is stale",
    ),
    Mutation(
        "flex-paged-reads-a-row-past-the-block-s-tokens", "tformer/nn/attention/paged_kernel.py",
        "return kv_idx % block_size < held[b, kv_idx // block_size]",
        "return kv_idx % block_size <= held[b, kv_idx // block_size]",
        ("tests/nn/test_paged_kernel.py", "-k", "flex"),
        "FlexAttention's paged read takes one row more of each block than the sequence holds there",
    ),
    Mutation(
        "flex-paged-mask-misses-a-tile", "tformer/nn/attention/paged_kernel.py",
        "count = used.sum(-1, dtype=torch.int32)",
        "count = used.sum(-1, dtype=torch.int32) - 1",
        ("tests/nn/test_paged_kernel.py", "-k", "flex"),
        "the block mask lists one tile fewer than a sequence's rows lie in, so a GPU's fused kernel skips keys",
    ),
    Mutation(
        "flex-paged-mask-lists-tiles-unsorted", "tformer/nn/attention/paged_kernel.py",
        "order = torch.argsort(1 - used, dim=-1, stable=True).to(torch.int32)",
        "order = torch.arange(used.shape[1], dtype=torch.int32).expand(used.shape[0], -1)",
        ("tests/nn/test_paged_kernel.py", "-k", "flex"),
        "the block mask's first tiles are the pool's first, not the sequence's",
    ),
    Mutation(
        "flex-paged-block-mask-shared-across-steps", "tformer/nn/attention/paged.py",
        "                                           keys.shape[0])\n",
        "                                           keys.shape[0])\n"
        "        mask.block_mask = read_in_place.__dict__.setdefault('kept', mask.block_mask)\n",
        ("tests/nn/test_paged_kernel.py", "-k", "flex"),
        "a step reads the block mask another step made (stale contexts)",
    ),
    Mutation(
        "paged-in-place-reads-another-kv-head", "tformer/nn/kernels/paged_decode.cpp",
        "const scalar_t* key = row + ((first + h) / group) * head_dim;",
        "const scalar_t* key = row + ((first + h) % kv_heads) * head_dim;",
        ("tests/nn/test_paged_kernel.py",),
        "the in-place paged kernel scores a query head against the keys of a key/value head it does not share "
        "(grouped-query attention)",
    ),
    Mutation(
        "int8-compiled-scales-by-the-blocks-first-row", "tformer/nn/kernels/matvec.cpp",
        "const float scale = scales ? scales[row] : 1.0f,",
        "const float scale = scales ? scales[o] : 1.0f,",
        ("tests/nn/test_quantization.py", "-k", "compiled"),
        "the compiled int8 kernel scales four output rows by the first one's scale",
    ),
    Mutation(
        "float-matvec-reads-neighbouring-rows-for-strided-ones", "tformer/nn/kernels/matvec.cpp",
        "for (int k = 0; k < OUTS; ++k) rows[k] = weight + (o + k * walk.stride) * inputs;",
        "for (int k = 0; k < OUTS; ++k) rows[k] = weight + (o + k) * inputs;",
        ("tests/generation/test_generation_cache.py", "-k", "row_count"),
        "the compiled float32 kernel multiplies the rows next to a block's first instead of those a share apart",
    ),
    Mutation(
        "float-matvec-drops-the-bias", "tformer/nn/kernels/matvec.cpp",
        "const float* shifts = has_bias ? bias.data_ptr<float>() : nullptr;",
        "const float* shifts = nullptr;",
        ("tests/generation/test_generation_cache.py", "-k", "row_count or bfloat16_layer"),
        "the compiled float32 and bfloat16 kernel forgets the layer's bias (Qwen2's and GPT-2's projections have one)",
    ),
    Mutation(
        "bfloat16-weights-read-as-their-low-half", "tformer/nn/kernels/matvec.cpp",
        "return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(halves), 16));",
        "return _mm512_castsi512_ps(_mm512_cvtepu16_epi32(halves));",
        ("tests/generation/test_generation_cache.py", "-k", "bfloat16_layer"),
        "the compiled kernel reads a bfloat16 weight's bits as a float32's low half (tiny nonsense values)",
    ),
    Mutation(
        "bfloat16-bias-handed-over-in-its-own-type", "tformer/nn/weights/prepacked.py",
        "self.bias_or_none = compiled.NONE if bias is None else bias.float()",
        "self.bias_or_none = compiled.NONE if bias is None else bias",
        ("tests/generation/test_generation_cache.py", "-k", "bfloat16_layer"),
        "a bfloat16 layer hands the kernel its bfloat16 bias, which it refuses (float32 sums take a float32 bias)",
    ),
    Mutation(
        "bfloat16-layers-in-cache-leave-the-kernel-at-8-rows", "tformer/nn/weights/prepacked.py",
        "BFLOAT16_KERNEL_MAX_ROWS + 1 if small_bfloat16 else TRANSPOSED_MIN_ROWS)",
        "TRANSPOSED_MIN_ROWS)",
        ("tests/generation/test_generation_cache.py", "-k", "bfloat16_layer"),
        "a bfloat16 weight in cache goes back to PyTorch's product at 8 rows (30-55 us a call: a served step's)",
    ),
    Mutation(
        "few-row-ways-ranked-slowest-first", "tformer/nn/weights/prepacked.py",
        "    return tuple(sorted(seconds, key=seconds.__getitem__))\n",
        "    return tuple(sorted(seconds, key=seconds.__getitem__, reverse=True))\n",
        ("tests/generation/test_generation_cache.py", "-k", "ranked"),
        "decoding multiplies a few rows the slowest way the race measured",
    ),
    Mutation(
        "compiled-way-takes-any-dtype", "tformer/nn/weights/prepacked.py",
        "        return (weight.device.type == \"cpu\" and weight.dtype in COMPILED_TYPES and weight.is_contiguous()\n",
        "        return (weight.device.type == \"cpu\" and weight.is_contiguous()\n",
        ("tests/generation/test_generation_cache.py", "-k", "first_way"),
        "a float16 model's decoding step hands its weights to the kernel, which takes float32 and bfloat16 only (an "
        "error, not a product)",
    ),
    Mutation(
        "initialisers-never-skipped", "tformer/nn/uninitialised.py",
        "        if _skipping.depth:\n",
        "        if False:\n",
        ("tests/nn/test_uninitialised.py",),
        "a load initialises every weight it is about to overwrite (a Llama-3.2-1B folder: 22.55 s to load, not 3.48)",
    ),
    Mutation(
        "new-head-left-uninitialised", "tformer/hub.py",
        "folder, initialised=head_options is not None,  # as above\n",
        "folder, initialised=False,  # as above\n",
        ("tests/nn/test_uninitialised.py",),
        "a tformer folder loaded with a new head keeps that head as uninitialised memory",
    ),
    Mutation(
        "finite-check-misses-negative-infinity", "tformer/checkpoint.py",
        "    return bool(torch.isfinite(low)) and bool(torch.isfinite(high))\n",
        "    return bool(torch.isfinite(high))\n",
        ("tests/models/test_checkpoint.py", "-k", "nan_or_infinity"),
        "a weight holding -inf loads without the warning that its outputs will not be finite",
    ),
    Mutation(
        "dense-decode-ignores-the-mask", "tformer/nn/kernels/dense_decode.cpp",
        "score = added <= hidden ? -std::numeric_limits<acc_t>::infinity() : score + added;",
        "score = score;",
        ("tests/nn/test_dense_decode.py",),
        "the compiled one-query decode attends to padded source positions and drops position biases",
    ),
    Mutation(
        "w8a8-compiled-rounding-truncates", "tformer/nn/kernels/int8_dynamic.cpp",
        "_mm512_roundscale_ps(ratio, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)",
        "_mm512_roundscale_ps(ratio, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC)",
        ("tests/nn/test_quantization.py", "-k", "compiled"),
        "the compiled rounding of w8a8's activations truncates toward zero instead of rounding to nearest",
    ),
    Mutation(
        "quantized-table-scales-by-the-first-row", "tformer/nn/weights/table.py",
        "F.embedding(ids, integers).to(scales.dtype) * F.embedding(ids, scales[:, None])",
        "F.embedding(ids, integers).to(scales.dtype) * scales[0]",
        ("tests/nn/test_quantization.py", "-k", "table"),
        "a quantized token table scales every looked-up row by the first token's scale",
    ),
    Mutation(
        "performer-compiled-step-keeps-the-old-level", "tformer/nn/kernels/performer_decode.cpp",
        "const scalar_t carry = raised > previous ? std::exp(previous - raised) : scalar_t(1);",
        "const scalar_t carry = scalar_t(1);",
        ("tests/nn/test_performer.py", "-k", "compiled"),
        "the compiled Performer step adds a key that raises the running max to sums still at the old level",
    ),
    Mutation(
        "engine-drops-the-forced-end", "tformer/serving/engine.py",
        "        chooser = TokenChooser.from_config(config, model.config, self.device, self.tokenizer)\n",
        "        chooser = TokenChooser.from_config(config.replace(forced_eos_token_id=False), model.config, "
        "self.device, self.tokenizer)\n",
        ("tests/serving/test_serving_engine.py", "-k", "every_option_equal_generate"),
        "the server drifts from generate: it drops the forced end token (Marian's forced_eos_token_id)",
    ),
    Mutation(
        "decoding-skips-the-users-hooks", "tformer/nn/decoding_view.py",
        "    return _view(model, WEIGHT_BACKENDS[weights], not observed(model), {})\n",
        "    return _view(model, WEIGHT_BACKENDS[weights], True, {})\n",
        ("tests/nn/test_one_forward.py", "tests/generation/test_decoding_view.py", "-k", "hook"),
        "a decoding step calls the parts' forwards directly even when a user registered a hook on one",
    ),
    Mutation(
        "decoding-view-rewires-the-callers-model", "tformer/nn/decoding_view.py",
        "    state = dict(module.__dict__)  # shares the parameter, buffer and hook dictionaries\n",
        "    state = module.__dict__\n",
        ("tests/generation/test_decoding_view.py",),
        "generate swaps prepacked layers into the caller's own model (its module types change under it)",
    ),
    Mutation(
        "decoding-view-keeps-dropout", "tformer/nn/decoding_view.py",
        "    state[\"training\"] = False\n",
        "",
        ("tests/generation/test_decoding_view.py", "-k", "engine"),
        "the server decodes a model built in training mode with dropout on: its answers are noise",
    ),
    Mutation(
        "scheduler-forgets-the-prefix-blocks", "tformer/serving/scheduler.py",
        "                    self.pool.register(block, key)\n",
        "                    pass\n",
        ("tests/serving/test_prefix_cache.py",),
        "a shared system prompt is computed again for every request: prefix caching never hits",
    ),
    Mutation(
        "session-forgets-the-padding", "tformer/generation/session.py",
        "            key_padding=self.attend[:, :end] if self.padded else None,\n",
        "            key_padding=None,\n",
        ("tests/generation/test_generation_cache.py", "-k", "left-padded"),
        "a left-padded batch's decoding steps attend to the padding before the shorter prompts",
    ),
    Mutation(
        "rolling-cache-rewinds-past-its-window", "tformer/nn/attention/cache.py",
        "        if not (0 <= value <= self._length and held >= min(value, self.window)):\n",
        "        if not (0 <= value <= self._length):\n",
        ("tests/nn/test_attention_kernels.py", "-k", "rolling"),
        "a sliding window's cache takes back tokens past the point where it still holds the window",
    ),
    Mutation(
        "table-adapter-transposed", "tformer/nn/weights/lora.py",
        "        return F.embedding(ids, self.lora_A[0].t(), padding_idx=self.base.padding_idx)",
        "        return F.embedding(ids % self.rank, self.lora_A[0], padding_idx=None)[..., :self.rank]",
        ("tests/nn/test_lora_tables.py", "-k", "one_hot"),
        "a token table's update reads A's rows by id instead of its columns (not the one-hot product PEFT computes)",
    ),
    Mutation(
        "table-merge-untransposed", "tformer/nn/weights/lora.py",
        "        return [((0, self.in_features), self.block_updates()[0].t())]",
        "        return [((0, self.in_features), self.block_updates()[0].reshape(self.in_features, -1))]",
        ("tests/nn/test_lora_tables.py", "-k", "merged"),
        "merging a table's adapter adds its (D, V) update into the (V, D) table as reshaped, not turned",
    ),
    Mutation(
        "table-adapter-starts-nonzero", "tformer/nn/weights/lora.py",
        "            self.lora_A[0].zero_()\n",
        "            nn.init.normal_(self.lora_A[0])\n",
        ("tests/nn/test_lora_tables.py", "-k", "starts_as_its_base"),
        "a token table's adapter starts moving the table (A drawn, not zero): the adapted model is not its base",
    ),
    Mutation(
        "table-files-named-as-linear", "tformer/interop/peft_adapter.py",
        "        suffix_a, suffix_b = TABLE_SUFFIXES if isinstance(layer, LoraEmbedding) else SUFFIXES",
        "        suffix_a, suffix_b = SUFFIXES",
        ("tests/nn/test_lora_tables.py", "-k", "saves_as_peft"),
        "a token table's adapter saved as lora_A.weight / lora_B.weight, which PEFT reads as a linear layer's",
    ),
    Mutation(
        "saved-base-table-unchecked", "tformer/interop/peft_adapter.py",
        "        if saved.shape != weight.shape or not torch.equal(saved.to(weight.dtype), weight.detach().cpu()):",
        "        if saved.shape != weight.shape:",
        ("tests/nn/test_lora_tables.py", "-k", "saved_base_table"),
        "PEFT's saved base weight is taken without comparing it to the model's: another vocabulary's adapter loads",
    ),
    Mutation(
        "tied-table-adapted", "tformer/interop/lora_targets.py",
        "    if f\"{path}.weight\" in getattr(model, \"tied_parameters\", dict)().values():",
        "    if False:",
        ("tests/nn/test_lora_tables.py", "-k", "cannot_be"),
        "an adapter goes over a table tied to the output head, whose copy then reads the base's rows until merged",
    ),
    Mutation(
        "quantized-table-target-unexplained", "tformer/interop/lora_targets.py",
        "            _refuse_quantized_table(model, target)\n",
        "",
        ("tests/nn/test_lora_tables.py", "-k", "quantized_first"),
        "a target naming an int8 token table (QLoRA's base quantized first) is answered as a name that matches nothing",
    ),
    Mutation(
        "saved-head-base-refused", "tformer/interop/peft_adapter.py",
        "        if found is None:\n",
        "        if found is None or not found[0].is_table:\n",
        ("tests/interop/test_interop_peft.py", "-k", "tied-head"),
        "PEFT's adapter over GPT-2's tied lm_head (its base weight saved beside it) is refused as for another base",
    ),
    Mutation(
        "tied-head-under-adapter-saved-twice", "tformer/models/base.py",
        "        sources = {id(parameters[source]): source for source in tied.values() if source in parameters}",
        "        sources = {}",
        ("tests/training/test_sft_adapters.py", "-k", "tied_head"),
        "a checkpoint of a run whose adapter sits over the tied head holds the table twice (safetensors refuses it)",
    ),
    Mutation(
        "adapted-head-held-whole", "tformer/nn/losses.py",
        "    if gradients and weight_trains and len(targets) * vocab_size <= HEAD_LOSS_WHOLE_FLOATS:",
        "    if gradients and trained and len(targets) * vocab_size <= HEAD_LOSS_WHOLE_FLOATS:",
        ("tests/nn/test_head_loss.py", "-k", "adapters_over_a_frozen_head"),
        "an adapter over the head holds the (N, V) logits whole as full fine-tuning does, its memory with them",
    ),
    Mutation(
        "lora-fused-add-unscaled", "tformer/nn/weights/lora.py",
        "                               self.lora_B[0].t().contiguous(), alpha=self.scale).view(out.shape)",
        "                               self.lora_B[0].t().contiguous(), alpha=1.0).view(out.shape)",
        ("tests/nn/test_lora.py",),
        "a whole layer's update is added unscaled by the fused multiply-add (alpha / rank dropped)",
    ),
    Mutation(
        "quantize-drops-table-adapter", "tformer/quantization.py",
        "    if scheme.embeddings and adapted:",
        "    if False:",
        ("tests/nn/test_lora_tables.py", "-k", "quantiz"),
        "quantizing a model whose table carries an adapter replaces the table and drops the adapter with it",
    ),
    Mutation(
        "head-task-type-without-head", "tformer/interop/peft_adapter.py",
        "    head_type = HEAD_TASK_TYPES.get(model.config.head) if trains_whole else None",
        "    head_type = HEAD_TASK_TYPES.get(model.config.head)",
        ("tests/interop/test_interop_peft.py", "-k", "token_tables"),
        "a classifier's adapter that leaves its head alone is written as SEQ_CLS, which PEFT cannot load headless",
    ),
    Mutation(
        "qlora-tied-head-table-counted-twice", "tformer/quantization.py",
        "    return any(isinstance(module, QuantizedLinear) for module in head.modules())",
        "    return isinstance(head, QuantizedLinear)",
        ("tests/nn/test_lora.py", "-k", "tied_head_counts"),
        "QLoRA over a tied head counts the token table twice in the run's 'N of M parameters train' line",
    ),
    Mutation(
        "qlora-quantizes-an-adapted-table", "tformer/training/run.py",
        "                     embeddings=not adapted_tables(model, targets))",
        "                     embeddings=True)",
        ("tests/training/test_lora_classification.py", "-k", "qlora"),
        "a QLoRA recipe that adapts a token table is refused: the table was quantized before its adapter went on",
    ),
    Mutation(
        "qlora-quantizes-a-named-trained-head", "tformer/training/run.py",
        "if adapter.train_modules is None else adapter.train_modules\n",
        "if adapter.train_modules is None else ()\n",
        ("tests/training/test_lora_classification.py", "-k", "qlora"),
        "a QLoRA recipe naming its classifier in train_modules is refused: the head was quantized, so it cannot train",
    ),
    Mutation(
        "evaluation-holds-a-whole-batchs-logits", "tformer/training/trainer.py",
        "        rows = self.task.eval_rows_per_pass()\n",
        "        rows = None\n",
        ("tests/training/test_one_loss.py", "-k", "pieces"),
        "an evaluation batch of a large vocabulary holds its whole (B, T, V) logits (GSM8K LoRA: 2,400 MiB, not 1,088)",
    ),
    Mutation(
        "flex-lets-packed-examples-see-each-other", "tformer/nn/attention/flex.py",
        "            keep = keep & (segments[b, position] == segments[b, kv_idx])\n",
        "            keep = keep\n",
        ("tests/nn/test_flex_attention.py",),
        "the flex kernel lets a packed example attend to the other examples of its row",
    ),
    Mutation(
        "train-offers-a-merge-merge-refuses", "tformer/cli/train.py",
        '        merge = "" if result.merge_refused else f"tformer merge {base} {out} --out MERGED, "\n',
        '        merge = f"tformer merge {base} {out} --out MERGED, "\n',
        ("tests/training/test_sft_adapters.py", "-k", "tied_head"),
        "tformer train's closing hint offers tformer merge for an adapter over a tied head, which merge refuses",
    ),
    Mutation(
        "static-step-hides-its-own-key", "tformer/generation/session.py",
        "    key_padding = attend & (columns <= column)",
        "    key_padding = attend & (columns < column)",
        ("tests/generation/test_static_cache.py",),
        "a static cache's one-token step masks the key it has just written: no token sees itself",
    ),
    Mutation(
        "static-cache-keeps-garbage", "tformer/nn/attention/cache.py",
        "        self.keys, self.values = keys.zero_(), values.zero_()  # (B, Hkv, Tmax, Dh) each",
        "        self.keys, self.values = keys.fill_(float('nan')), values.fill_(float('nan'))",
        ("tests/generation/test_static_cache.py",),
        "a static cache's unwritten positions hold NaN (as torch.empty may): the masked columns poison every row",
    ),
    Mutation(
        "ends-read-late-are-not-taken-back", "tformer/generation/autoregressive.py",
        "    run.length -= steps\n",
        "    run.length -= 0\n",
        ("tests/generation/test_generation_strategies.py", "-k", "reading_the_ends"),
        "steps run after every row had ended (the ends read every few steps on a GPU) stay in the output",
    ),
    Mutation(
        "captured-decode-writes-the-wrong-slot", "tformer/nn/attention/paged.py",
        "        layout.slots = layout.decode_context[:, -1]  # (rows,) where its key and value go",
        "        layout.slots = layout.decode_context[:, -2]  # (rows,) where its key and value go",
        ("tests/serving/test_captured_decode.py",),
        "the engine's fixed-shape decode step writes each new key over the token before it",
    ),
    Mutation(
        "engine-writes-a-new-key-over-the-last", "tformer/serving/block_pool.py",
        "        return int(self._slot_values[self.length - 1])",
        "        return int(self._slot_values[max(self.length - 2, 0)])",
        ("tests/serving/test_serving_engine.py", "-k", "mixing_prefills or sixteen"),
        "a decoding sequence's new key and value go to its previous token's slot, overwriting it",
    ),
    Mutation(
        "block-table-slot-written-a-block-off", "tformer/serving/block_pool.py",
        "            self._slot_values[start] = self.blocks[start // size] * size + start % size",
        "            self._slot_values[start] = self.blocks[start // size - 1] * size + start % size",
        ("tests/serving/test_serving_engine.py", "-k", "mixing_prefills or sixteen"),
        "a token past a block's end is given a slot in the block before its own",
    ),
    Mutation(
        "training-auto-compiles-on-the-cpu", "tformer/training/config.py",
        '        return device_type == "cuda" if self.compile == "auto" else self.compile',
        '        return True if self.compile == "auto" else self.compile',
        ("tests/training/test_training_engine.py", "-k", "default_to_each_devices_choice"),
        "training.compile=auto compiles on the CPU too, where a compile costs about 40 s before the first step",
    ),
    Mutation(
        "schedule-drops-the-position-bias-lr-scale", "tformer/training/trainer.py",
        '                group["lr"] = lr * group.get("lr_scale", 1.0)',
        '                group["lr"] = lr',
        ("tests/training/test_training.py", "-k", "position_bias_lr_scale"),
        "the schedule sets every group to its rate, so training.position_bias_lr_scale holds for the first step only",
    ),
    Mutation(
        "position-bias-tables-stay-in-the-plain-group", "tformer/training/optim.py",
        "    scaled = position_bias_tables(model) if position_bias_lr_scale != 1.0 else []",
        "    scaled = []",
        ("tests/training/test_training.py", "-k", "position_bias_lr_scale"),
        "the relative position bias trains at the plain rate (or the option is refused) whatever the scale",
    ),
    Mutation(
        "t5-initializer-forgets-the-relative-bias-tables", "tformer/models/encoder_decoder.py",
        "                nn.init.normal_(module.embedding.weight, 0.0, factor * self.config.d_model ** -0.5)",
        "                pass",
        ("tests/interop/test_interop_t5.py", "-k", "draws"),
        "a T5-initialised model keeps its relative bias tables drawn as token tables (normal(0, factor))",
    ),
    Mutation(
        "t5-initializer-draws-the-output-by-fan-in", "tformer/models/encoder_decoder.py",
        "                fan_in_std = 1.0 if isinstance(module, LMHead) else module.in_features ** -0.5",
        "                fan_in_std = module.in_features ** -0.5",
        ("tests/interop/test_interop_t5.py", "-k", "draws"),
        "T5 v1.1's untied output drawn at fan_in^-0.5 instead of T5's normal(0, 1)",
    ),
    Mutation(
        "t5-separate-token-tables-load-silently", "tformer/interop/t5.py",
        "            if shared is not None and alias in hf_state and not torch.equal(hf_state[alias], shared):",
        "            if False:",
        ("tests/interop/test_interop_t5.py", "-k", "separate"),
        "a T5 folder whose encoder or decoder table differs from shared loads with shared's, silently",
    ),
    Mutation(
        "gathering-holds-requests-forever", "tformer/serving/scheduler.py",
        "                or self.held_steps >= self.gather_sources):",
        "                ):",
        ("tests/serving/test_serve_speech.py", "-k", "gathered"),
        "a request waits behind the decoding ones for others to join it, however many steps it takes",
    ),
    Mutation(
        "gathering-ignores-the-switch", "tformer/serving/scheduler.py",
        "        if self._gathering():\n",
        "        if False:\n",
        ("tests/serving/test_serve_speech.py", "-k", "gathered"),
        "gather_sources is taken and ignored: every request starts at the first step it can",
    ),
    Mutation(
        "cross-rows-read-in-running-order", "tformer/nn/attention/paged.py",
        "        placed[places] = queries\n",
        "        placed[: len(listed)] = queries\n",
        ("tests/serving/test_serve_encoder_decoder.py", "tests/serving/test_serve_speech.py", "-k", "alone"),
        "the one-token sequences' queries meet the sources of the first rows of the range, not their own rows'",
    ),
    Mutation(
        "cross-shared-rows-read-in-place", "tformer/nn/attention/paged.py",
        "        if len(set(listed)) < len(listed):  # rows shared (beams): each sequence its row, gathered\n",
        "        if False:\n",
        ("tests/serving/test_serve_translation.py", "tests/serving/test_serve_speech.py", "-k", "beam"),
        "beams that share their source's row are placed in it together: one beam's query takes another's place",
    ),
    Mutation(
        "features-skip-heard-frames", "tformer/data/log_mel.py",
        "    return -(-(audio_samples + settings.n_fft // 2) // settings.hop_length)",
        "    return (audio_samples + settings.n_fft // 2) // settings.hop_length",
        ("tests/data/test_audio.py", "-k", "padded_audio"),
        "a recording's last frames, which still read its audio, are filled in as silence",
    ),
)

HIDDEN_TRANSFORMERS = '''"""Written by tools/mutation_check.py --without-transformers: no transformers here."""
raise ModuleNotFoundError("transformers is hidden by mutation_check --without-transformers", name="transformers")
'''


def tree_files(repo: Path) -> list[Path]:
    """The files git tracks or would track (untracked, not ignored), relative to ``repo``."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=repo, capture_output=True, text=True, check=True,
    ).stdout
    return [Path(name) for name in listed.split("\0") if name and (repo / name).is_file()]


def copy_tree(repo: Path, destination: Path) -> None:
    """Copy the tree into ``destination``; link ``../shared`` beside it when the repo has one,
    so tests that read the shared datasets run in the copy as they do in the repo."""
    for relative in tree_files(repo):
        target = destination / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / relative, target)
    shared = repo.parent / "shared"
    if shared.is_dir():
        (destination.parent / "shared").symlink_to(shared)


def check_search_strings(tree: Path, mutations) -> list[str]:
    """One line per mutation whose search string does not occur exactly once in its file."""
    problems = []
    for mutation in mutations:
        path = tree / mutation.file
        if not path.is_file():
            problems.append(f"{mutation.name}: {mutation.file} does not exist")
            continue
        count = path.read_text().count(mutation.search)
        if count != 1:
            problems.append(f"{mutation.name}: search string found {count} times in {mutation.file} (needs 1): "
                            f"{mutation.search!r}")
    return problems


def run_tests(tree: Path, tests: tuple[str, ...], environment: dict[str, str]) -> tuple[int, float, str]:
    """Run pytest on ``tests`` in ``tree``: exit status, seconds, the last lines of output."""
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests],
        cwd=tree, capture_output=True, text=True, env=environment,
    )
    tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
    return result.returncode, time.perf_counter() - started, tail


def union_of_selections(mutations) -> list[tuple[str, ...]]:
    """Each distinct test selection once, in order."""
    seen: list[tuple[str, ...]] = []
    for mutation in mutations:
        if mutation.tests not in seen:
            seen.append(mutation.tests)
    return seen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", metavar="NAME", help="run only this mutation (repeatable)")
    parser.add_argument("--list", action="store_true", help="list the mutations and their tests, then exit")
    parser.add_argument("--without-transformers", action="store_true",
                        help="hide the transformers package, so tests that need it skip")
    args = parser.parse_args(argv)

    if args.list:
        for mutation in MUTATIONS:
            print(f"{mutation.name:42} {mutation.file:34} {' '.join(mutation.tests)}\n{'':42} {mutation.why}")
        return 0
    mutations = MUTATIONS
    if args.only:
        unknown = sorted(set(args.only) - {m.name for m in MUTATIONS})
        if unknown:
            print(f"unknown mutation(s): {', '.join(unknown)}; see --list", file=sys.stderr)
            return 2
        mutations = tuple(m for m in MUTATIONS if m.name in args.only)

    problems = check_search_strings(REPO, mutations)
    if problems:
        print("stale mutations (fix the list in tools/mutation_check.py):", *problems, sep="\n  ", file=sys.stderr)
        return 1

    with tempfile.TemporaryDirectory(prefix="tformer-mutation-") as scratch:
        tree = Path(scratch) / "repo"
        copy_tree(REPO, tree)
        path = [str(tree)]
        if args.without_transformers:
            shim = Path(scratch) / "hide-transformers"
            (shim / "transformers").mkdir(parents=True)
            (shim / "transformers" / "__init__.py").write_text(HIDDEN_TRANSFORMERS)
            path.insert(0, str(shim))
        environment = {**os.environ, "PYTHONPATH": os.pathsep.join(path), "PYTHONDONTWRITEBYTECODE": "1"}

        for tests in union_of_selections(mutations):
            status, seconds, tail = run_tests(tree, tests, environment)
            print(f"unmutated  {' '.join(tests):60} {'pass' if status == 0 else 'FAIL'}  {seconds:6.1f} s", flush=True)
            if status != 0:
                print(f"the unmutated tests fail, so no mutation can be judged:\n{tail}", file=sys.stderr)
                return 1

        rows, failures = [], 0
        for mutation in mutations:
            source = tree / mutation.file
            original = source.read_text()
            source.write_text(original.replace(mutation.search, mutation.replace, 1))
            try:
                status, seconds, tail = run_tests(tree, mutation.tests, environment)
            finally:
                source.write_text(original)
            # A test process ended by a signal (a crash the planted bug causes) has caught it too.
            caught = status == 1 or status < 0
            verdict = "SURVIVED" if status == 0 else "caught" if caught else f"ERROR (pytest exit {status})"
            failures += verdict != "caught"
            rows.append((mutation.name, verdict, seconds))
            print(f"{mutation.name:42} {verdict:10} {seconds:6.1f} s", flush=True)
            if verdict != "caught":
                print("  " + tail.replace("\n", "\n  "), flush=True)

    mode = " (transformers hidden)" if args.without_transformers else ""
    print(f"\n{'mutation':42} {'result':10} {'time':>8}{mode}")
    for name, verdict, seconds in rows:
        print(f"{name:42} {verdict:10} {seconds:6.1f} s")
    print(f"{len(rows) - failures} of {len(rows)} caught")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
