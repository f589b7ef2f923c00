"""The request fields of OpenAI's completions and chat APIs, and of vLLM's extensions to them, that the server does
not honour, each with why: ``openai_api`` answers a request sending one with a 400 naming it and the reason."""

from __future__ import annotations

_NOT_STORED = "the server stores no completions"
# Request fields of OpenAI's completions and chat APIs, and of vLLM's extensions to them, that no request schema
# here declares, with why the server does not honour them: a request sending one is a 400 naming it and the reason
# (any other unknown field is a 400 listing the known ones). docs/serving.md's table lists every field.
REFUSED_FIELDS: dict[str, str] = {
    # OpenAI's
    "store": _NOT_STORED,
    "metadata": f"{_NOT_STORED} (metadata tags stored ones)",
    "service_tier": "the server has one tier: every request is served alike",
    "modalities": "the server answers in text only",
    "audio": "the server answers in text only (no audio output)",
    "prediction": "predicted outputs are not implemented",
    "reasoning_effort": "the server passes no reasoning settings to the model",
    "verbosity": "the server passes no verbosity setting to the model",
    "web_search_options": "the server has no web search",
    "prompt_cache_key": "the prefix cache needs no key: prompts sharing a prefix share its cached blocks",
    "functions": "OpenAI's deprecated form of tools: send tools",
    "function_call": "OpenAI's deprecated form of tool_choice: send tool_choice",
    # vLLM's
    "use_beam_search": "vLLM's older switch: send num_beams (the beams' count) for beam search",
    "prompt_logprobs": "score a prompt with /v1/completions' echo=true and logprobs",
    "bad_words": "not implemented: ban single tokens with logit_bias (-100), or list the allowed ones in "
                 "allowed_token_ids",
    "spaces_between_special_tokens": "the text is the tokenizer's decoding of the ids; not switchable",
    "add_special_tokens": "a text prompt is encoded as POST /tokenize shows (completions: with the tokenizer's "
                          "special tokens; chat: the template's alone); send token ids for other ids",
    "priority": "requests are admitted first come, first served (no priority scheduling)",
    "request_id": "the server names each response itself",
    "logits_processors": "the server runs no code a request names",
    "return_tokens_as_token_ids": "logprobs give each token's text",
    "cache_salt": "the prefix cache is not salted per request",
    "kv_transfer_params": "no disaggregated serving: one engine holds a request's cache",
    "vllm_xargs": "the server has no custom extensions",
    "mm_processor_kwargs": "the server takes text (no multimodal processor)",
    "prompt_embeds": "a prompt is text or token ids, not embeddings",
    "documents": "the chat template is given the messages only",
    "chat_template": "the chat template is the server's (the checkpoint's, or tformer serve --chat-template)",
    "chat_template_kwargs": "the chat template is given the messages only",
    "echo": "chat completions do not echo (vLLM's chat echo is not implemented); /v1/completions echoes prompts",
}
