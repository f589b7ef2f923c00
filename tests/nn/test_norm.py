"""The norms against their definitions: RMSNorm x / sqrt(mean(x^2) + eps) * w, and Gemma's kind scaled by
1 + w in float32 before the cast back."""

import torch

from tformer.nn.norm import RMSNorm, RMSNormPlusOne, build_norm


def test_rmsnorm_plus_one_scales_by_one_plus_its_weight_and_starts_as_rmsnorm():
    x = torch.randn(3, 5, 16, dtype=torch.float64)
    norm = build_norm("rmsnorm_plus_one", 16, eps=1e-6)
    assert isinstance(norm, RMSNormPlusOne) and torch.equal(norm.weight, torch.zeros(16))
    torch.testing.assert_close(norm(x.float()), RMSNorm(16, eps=1e-6)(x.float()))  # weight 0: plain RMSNorm
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(-0.5, 0.5, 16))
    expected = x / (x.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt() * (1 + norm.weight.double())
    torch.testing.assert_close(norm(x.float()).double(), expected, rtol=1e-6, atol=1e-6)


def test_rmsnorm_plus_one_multiplies_in_float32_before_the_cast():
    x = torch.randn(4, 64).bfloat16()
    norm = RMSNormPlusOne(64)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(64))
    normed = torch.rms_norm(x.float(), (64,), None, norm.eps)
    assert torch.equal(norm(x), (normed * (1 + norm.weight)).bfloat16())
