"""The server's routes, one module per concern, each a set of handlers over a ``served.ServedModel``:
completions, chat completions, the tokenizer (tokenize, detokenize, its description), and the server's
status (models, health, metrics). ``server.OpenAIServer`` maps paths onto them."""
