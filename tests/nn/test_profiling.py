"""The measuring helpers of the attention benchmarks: peak bytes of a call, log-log slopes, crossovers."""

import math

import pytest
import torch

from tformer.profiling import crossover, loglog_slope, peak_allocated_bytes

MIB = 2**20


def test_peak_counts_what_is_held_at_once_during_the_call():
    held_before = torch.ones(4 * MIB // 4)  # allocated before the call: not counted

    def work() -> torch.Tensor:
        first = torch.ones(MIB // 4)  # 1 MiB of float32
        second = torch.ones(2 * MIB // 4)  # 3 MiB held here: the peak
        del first, second
        return torch.ones(MIB // 4) + held_before[: MIB // 4]  # 2 MiB at most

    assert peak_allocated_bytes(work) == 3 * MIB


def test_peak_of_plain_attention_holds_the_score_matrix():
    q = torch.randn(1, 2, 256, 16)
    scores_bytes = 2 * 256 * 256 * 4
    peak = peak_allocated_bytes(lambda: torch.softmax(q @ q.transpose(-1, -2), dim=-1) @ q)
    assert 2 * scores_bytes <= peak <= 2 * scores_bytes + 2 * q.nbytes  # scores and their softmax, and the output


def test_peak_refuses_other_devices():
    with pytest.raises(ValueError, match="'meta'"):
        peak_allocated_bytes(lambda: None, "meta")


def test_loglog_slope_recovers_a_power_law():
    sizes = [256, 512, 1024, 2048]
    assert loglog_slope(sizes, [3.0 * size**1.5 for size in sizes]) == pytest.approx(1.5, abs=1e-12)
    assert loglog_slope(sizes, [7.0] * 4) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("sizes, values, message", [
    ([1, 2], [1.0], "as many values"), ([4, 4], [1.0, 2.0], "two distinct sizes"), ([1, 2], [0.0, 1.0], "positive"),
])
def test_loglog_slope_refuses_what_has_no_slope(sizes, values, message):
    with pytest.raises(ValueError, match=message):
        loglog_slope(sizes, values)


def test_crossover_interpolates_on_log_axes():
    sizes = [2, 4, 8, 16, 32]
    linear = [10.0 * size for size in sizes]  # cheaper than size^2 from size 10 on
    quadratic = [float(size**2) for size in sizes]
    assert crossover(sizes, linear, quadratic) == pytest.approx(10.0)
    assert crossover(sizes, quadratic, linear) is None  # dearer at the largest size
    assert crossover(sizes, [0.5 * q for q in quadratic], quadratic) == 2.0  # cheaper everywhere
    assert math.isclose(crossover([1, 100], [2.0, 1.0], [1.0, 2.0]), 10.0)


def test_crossover_needs_matching_increasing_sizes():
    with pytest.raises(ValueError, match="increasing"):
        crossover([4, 2], [1.0, 1.0], [1.0, 1.0])
    with pytest.raises(ValueError, match="one cost"):
        crossover([2, 4], [1.0], [1.0, 1.0])
