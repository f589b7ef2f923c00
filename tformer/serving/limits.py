"""The HTTP server's default request limits, importable without the serving extra (``tformer serve``'s
options name them in their help)."""

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024  # a request body's size limit (413 past it, before it is read whole)
DEFAULT_MAX_PROMPTS = 128  # prompts in one completions request (400 past it, before any is tokenized)
