"""The engine's decode-only steps at fixed shapes (``serving/captured_decode.py``), as a GPU captures them: under a
tracing-only compiler standing in for CUDA's, every request decodes what ``generate`` decodes alone, each shape is
one graph with no break, and the padded rows touch only their own slot. (The capture itself: tests/test_cuda.py.)"""

import pytest
import torch
from torch._dynamo.utils import counters

import tformer
from tformer.generation import GenerationConfig
from tformer.nn.attention.paged import PagedLayout
from tformer.serving.block_pool import BlockPool, BlockTable
from tformer.serving.engine import Engine


def requests(count, seed=3):
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 12, (count,), generator=generator).tolist()
    prompts = [torch.randint(0, 64, (length,), generator=generator).tolist() for length in lengths]
    return prompts, torch.randint(3, 30, (count,), generator=generator).tolist()


@pytest.mark.parametrize("positional", ["learned", "rope", "alibi"])
def test_captured_steps_decode_what_generate_decodes(traced_on_the_cpu, positional):
    """Greedy requests of many lengths (the batch shrinks as they end: other row buckets), seeded sampling and beam
    search (beams taking over each other's keys between captured steps)."""
    torch.manual_seed(0)
    model = tformer.build_model("gpt-nano", initializer_range=0.3, positional=positional).eval()
    engine = Engine(model, cache_tokens=2048, block_size=8, max_running=32, paged_attention="gather",
                    prefix_caching=False)
    prompts, budgets = requests(20)
    configs = [GenerationConfig(max_new_tokens=budget, eos_token_id=()) for budget in budgets]
    configs[3] = GenerationConfig(max_new_tokens=12, temperature=0.9, seed=7, eos_token_id=())
    configs[5] = GenerationConfig(max_new_tokens=10, num_beams=3, eos_token_id=())
    submitted = [engine.submit(prompt, config) for prompt, config in zip(prompts, configs, strict=True)]
    engine.run_until_idle()
    for prompt, config, request in zip(prompts, configs, submitted, strict=True):
        alone = tformer.generate(model, torch.tensor([prompt]), generation_config=config)
        assert request.outputs()[0] == alone[0, len(prompt):].tolist(), config
    assert engine.captured.steps >= 20 and not counters["graph_break"]
    assert 2 <= counters["stats"]["unique_graphs"] <= 8  # one per (rows, context) shape met


def test_the_engine_captures_only_where_a_device_compiles_its_steps():
    model = tformer.build_model("gpt-nano").eval()
    assert Engine(model, cache_tokens=256, block_size=8, paged_attention="gather").captured is None  # the CPU


def test_a_decoding_layout_pads_rows_onto_a_slot_no_sequence_holds():
    pool = BlockPool(8, 4, 1, 1, 2, torch.float32, "cpu")
    tables = []
    for length in (3, 6):
        pool.reserve(2)
        table = BlockTable(pool, 2)
        table.append_slots(length)
        tables.append(table)
    layout = PagedLayout.decoding(tables, torch.device("cpu"), rows=4, length=8, filler_slot=31)
    assert layout.decode_context.shape == layout.decode_padding.shape == (4, 8)
    assert layout.slots.tolist() == [tables[0].slots(2, 3).item(), tables[1].slots(5, 6).item(), 31, 31]
    assert layout.positions.tolist() == [[2, 5, 0, 0]]
    assert layout.decode_padding.sum(1).tolist() == [3, 6, 1, 1]  # the padded rows see their own slot only
    assert set(layout.decode_context[2:].flatten().tolist()) == {31}
