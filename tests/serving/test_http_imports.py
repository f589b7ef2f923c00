"""The HTTP process imports no torch: the server, the engine-process client and what the engine process sends it
(token events, prompt scores, counters: ``serving.wire``) load without it, in a fresh interpreter. The lazy
packages that make this possible (``tformer``, ``tformer.generation``, ``tformer.serving``) still give every name
they export (and ``tformer.data``, whose ``audio`` reads the server's WAV uploads)."""

import pickle
import subprocess
import sys

import pytest
from python_path import child_python_path

import tformer
import tformer.data
import tformer.generation
import tformer.serving
from tformer.generation import GenerationConfig
from tformer.serving.engine_client import EngineFacts, EngineSnapshot
from tformer.serving.engine_process import Started, SubmitFailed, Update
from tformer.serving.wire import EngineStats, PromptLogprobs, TokenEvent


def run_fresh(code: str, stdin: bytes = b"") -> subprocess.CompletedProcess:
    """``code`` in a new interpreter that sees this checkout."""
    environment = {"PYTHONPATH": child_python_path(), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-c", code], input=stdin, capture_output=True, timeout=120,
                          env=environment)


@pytest.mark.slow  # a process each
@pytest.mark.parametrize("module", ["tformer.serving.server", "tformer.serving.engine_process",
                                    "tformer.serving.engine_client", "tformer.serving.wire", "tformer"])
def test_the_http_side_imports_without_torch(module):
    result = run_fresh(f"import {module}, sys\n"
                       "heavy = sorted(name for name in ('torch', 'tformer.nn', 'tformer.serving.engine') "
                       "if name in sys.modules)\n"
                       "assert not heavy, heavy")
    assert result.returncode == 0, result.stderr.decode()[-3000:]


@pytest.mark.slow  # starts a process
def test_what_the_engine_process_sends_unpickles_without_torch():
    stats = EngineStats(requests_submitted=2, generated_tokens=5, prompt_tokens=4, prefix_cache_hit_tokens=1)
    snapshot = EngineSnapshot(stats, queue_length=1, running=2, blocks_in_use=3, cached_blocks=0, tokens_stored=9,
                              has_work=True)
    facts = EngineFacts(num_blocks=8, block_size=4, position_limit=64, queue_timeout=None, end_token_ids=(0,),
                        paged_attention="gather")
    event = TokenEvent(None, 0, 7, "a", logprob=-0.5, top_logprobs=[(7, -0.5)], finish_reason="stop",
                       prompt_logprobs=PromptLogprobs([-1.0], [[(3, -1.0)]]))
    update = Update(snapshot, events=[(4, event)], answers={0: 4, 1: "refused", 2: SubmitFailed("KeyError")})
    sent = pickle.dumps([Started(facts, snapshot), update])
    result = run_fresh("import pickle, sys\n"
                       "started, update = pickle.loads(sys.stdin.buffer.read())\n"
                       "assert 'torch' not in sys.modules, 'torch imported'\n"
                       "print(update.events[0][1].prompt_logprobs.token_logprobs, update.snapshot.stats.steps)",
                       stdin=sent)
    assert result.returncode == 0, result.stderr.decode()[-3000:]
    assert result.stdout.decode().split() == ["[-1.0]", "0"]


def test_the_lazy_packages_give_every_name_they_export():
    for package in (tformer, tformer.data, tformer.generation, tformer.serving):
        for name in package.__all__:
            assert getattr(package, name) is not None, f"{package.__name__}.{name}"
            assert name in dir(package)
    from tformer import GenerationConfig as exported
    from tformer import generate, tokenizers

    assert exported is GenerationConfig and generate is tformer.generation.generate
    assert callable(generate) and tokenizers is sys.modules["tformer.tokenizers"]
    assert tformer.nn is sys.modules["tformer.nn"]  # a subpackage loads when first reached
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        tformer.no_such_name  # noqa: B018


@pytest.mark.slow  # starts a process
def test_a_name_shared_with_a_submodule_stays_the_function():
    # The import system sets a package's attribute to each submodule it loads: generation/generate.py must not
    # replace the function generation.generate once something imports it, whatever was imported first.
    result = run_fresh("import tformer.generation.translation, tformer.generation.generate\n"
                       "import tformer, tformer.generation as generation, types\n"
                       "from tformer.generation import generate\n"
                       "assert callable(generate) and not isinstance(generate, types.ModuleType), generate\n"
                       "assert generation.generate is generate is tformer.generate\n")
    assert result.returncode == 0, result.stderr.decode()[-3000:]


@pytest.mark.slow  # starts a process
def test_a_config_made_from_the_package_sees_every_registered_choice():
    # The registries a config is checked against are filled by the modules that implement each choice: a name
    # taken from the lazy package comes with them loaded, as the eager package had them.
    result = run_fresh("from tformer import PRESETS, ModelConfig\n"
                       "assert ModelConfig().architecture == 'decoder' and 'gpt-mini' in PRESETS\n"
                       "import tformer\n"
                       "assert tformer.config.ModelConfig(attention_kernel='sliding_window', attention_window=4)\n")
    assert result.returncode == 0, result.stderr.decode()[-3000:]


@pytest.mark.slow  # starts a process
def test_a_config_made_from_the_config_module_alone_sees_every_family_and_choice():
    """The lazy package imports no model: the registries fill themselves when the first config is made."""
    result = run_fresh("from tformer.config import ModelConfig, resolve_config\n"
                       "assert resolve_config('gpt-mini').d_model == 192\n"
                       "ModelConfig(architecture='vision', image_size=32, patch_size=16, attention_kernel='chunked')\n"
                       "print('ok')")
    assert result.returncode == 0 and result.stdout.decode().strip() == "ok", result.stderr.decode()[-3000:]
