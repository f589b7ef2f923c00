"""Checks shared by the encoder-decoder interop tests (Marian, T5): tformer's generate against Hugging
Face's on the same sources, and a folder tformer saves read back by ``from_pretrained``."""

from __future__ import annotations

import torch

import tformer


def assert_generate_equals(hf, ours, ids, mask, num_beams: int, ends, pad: int, new_tokens: int = 12) -> None:
    """The same sequences token for token, and the same scores (per-step for greedy, per-beam for beam search)."""
    expected = hf.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, num_beams=num_beams, do_sample=False,
                           eos_token_id=ends, pad_token_id=pad, decoder_start_token_id=pad, output_scores=True,
                           return_dict_in_generate=True)
    got = tformer.generate(ours, ids, new_tokens, attention_mask=mask, num_beams=num_beams, eos_token_id=ends,
                           pad_token_id=pad, output_scores=True, return_dict=True)
    assert torch.equal(got.sequences, expected.sequences)
    if num_beams == 1:
        torch.testing.assert_close(torch.stack(got.scores), torch.stack(expected.scores), rtol=1e-4, atol=1e-4)
    else:
        torch.testing.assert_close(got.sequences_scores, expected.sequences_scores, rtol=1e-4, atol=1e-4)


def assert_saved_folder_loads(hf, ours, hf_class, folder, ids, mask, start: int) -> None:
    """``ours`` saved in Hugging Face's format gives ``hf``'s first-step logits in ``hf_class.from_pretrained``."""
    ours.save(folder, format="hf")
    again = hf_class.from_pretrained(folder).eval()
    target = torch.full((ids.shape[0], 1), start)
    torch.testing.assert_close(again(input_ids=ids, attention_mask=mask, decoder_input_ids=target).logits,
                               hf(input_ids=ids, attention_mask=mask, decoder_input_ids=target).logits,
                               rtol=1e-5, atol=1e-5)
