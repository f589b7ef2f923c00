"""The HTTP server's default request limits and the engine's liveness figures, importable without the serving
extra (``tformer serve``'s options name them in their help)."""

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024  # a request body's size limit (413 past it, before it is read whole)
DEFAULT_MAX_PROMPTS = 128  # prompts in one completions request (400 past it, before any is tokenized)
HEARTBEAT_SECONDS = 0.5  # the longest an engine that runs goes without a sign of life, idle or between steps
DEFAULT_STALL_SECONDS = 60.0  # silence after which the engine counts as stalled (tformer serve --engine-timeout)
MIN_STALL_SECONDS = 1.0  # the shortest --engine-timeout: a few heartbeats
# the key/value cache's size in tokens (tformer serve --cache-tokens), and a request's tokens at most by default
# (--max-request-tokens) when the model embeds only and has no cache
DEFAULT_CACHE_TOKENS = 16384
