"""A model by its Hugging Face Hub name: the local folder that holds it, through ``huggingface_hub``
(an optional extra, ``tformer[hub]``) and its shared cache, so a name works as it does in the peers'
``from_pretrained``: ``HF_HOME``/``HF_HUB_CACHE``, ``HF_HUB_OFFLINE``, ``HF_TOKEN``, revisions by
branch, tag or commit, its progress bars.

Only the files tformer reads are fetched (configs, safetensors weights and their index, tokenizer
files); pickle weights (``*.bin``) are never downloaded nor read from the cache. An existing local
path always wins over a name, and ``local_only`` never touches the network."""

from __future__ import annotations

from pathlib import Path

from tformer.checkpoint import CHECKPOINT_NAMES, CheckpointError

# What loading a folder reads (``checkpoint.CHECKPOINT_NAMES``), pickle weights left out, with safetensors shards.
PICKLE_WEIGHTS = frozenset({"pytorch_model.bin", "pytorch_model.bin.index.json"})
FILES_READ = [*sorted(CHECKPOINT_NAMES - PICKLE_WEIGHTS), "model-*-of-*.safetensors"]
SAFETENSORS_WEIGHTS = ("model.safetensors", "model.safetensors.index.json")
INSTALL_HINT = "pip install 'tformer[hub]'"


class HubError(CheckpointError):
    """A Hub name that cannot be resolved: unknown, a missing revision, nothing cached while offline,
    gated without a token, or a repo with no safetensors weights."""


def resolve_model(source: str | Path, revision: str | None = None, local_only: bool = False) -> Path:
    """The folder of ``source``: itself when it exists on disk, else the snapshot of the Hub model of
    that name at ``revision`` (default: the repo's default branch), fetched when not cached unless
    ``local_only`` (or ``HF_HUB_OFFLINE=1``)."""
    path = Path(source).expanduser()
    if path.exists():
        if revision is not None:
            raise HubError(f"{source}: a local folder; --revision/revision= applies to Hub names only")
        return path
    name = str(source)
    if not hub_available():
        raise HubError(f"{name}: not a checkpoint folder (no such directory); for a Hugging Face Hub name, "
                       f"{INSTALL_HINT}")
    if not is_hub_name(name):
        raise HubError(f"{name}: not a checkpoint folder (no such directory), nor a Hub name ('name' or 'org/name')")
    return _snapshot(name, revision, local_only, also_a_path=True)


def is_hub_name(text: str) -> bool:
    """Whether ``text`` is a valid Hub repo id (``name`` or ``org/name``); False without huggingface_hub,
    whose rules decide."""
    try:
        from huggingface_hub.utils import HFValidationError, validate_repo_id
    except ImportError:
        return False
    try:
        validate_repo_id(text)
    except HFValidationError:
        return False
    return True


def hub_available() -> bool:
    try:
        import huggingface_hub  # noqa: F401
    except ImportError:
        return False
    return True


def download(name: str, revision: str | None = None, local_only: bool = False) -> Path:
    """The snapshot folder of the Hub model ``name``, fetched into the cache when it is not there."""
    if not hub_available():
        raise HubError(f"{name}: fetching a Hub model needs huggingface_hub ({INSTALL_HINT})")
    if not is_hub_name(name):
        raise HubError(f"{name!r} is not a Hub model name (allowed: 'name' or 'org/name' of letters, digits, "
                       "'-', '_', '.')")
    return _snapshot(name, revision, local_only)


def _snapshot(name: str, revision: str | None, local_only: bool, also_a_path: bool = False) -> Path:
    """The cached (or freshly fetched) snapshot of ``name``, checked to hold safetensors weights;
    ``also_a_path``: ``name`` was looked for as a folder first, and the errors say so."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if revision is not None and not revision.strip():
        raise HubError(f"{name}: the revision is empty (--revision/revision=); give a branch, a tag or a commit, or "
                       "leave it out for the repo's default branch")
    at = f"{name}@{revision}" if revision else name
    offline = local_only or constants.HF_HUB_OFFLINE
    try:
        folder = Path(snapshot_download(name, revision=revision, allow_patterns=FILES_READ,
                                        local_files_only=local_only))
    except GatedRepoError:
        raise HubError(f"{at}: a gated repo; accept its terms on huggingface.co and set HF_TOKEN (or run "
                       "`hf auth login`)") from None
    except RepositoryNotFoundError:
        head = f"{name}: not a checkpoint folder (no such directory), and" if also_a_path else f"{name}:"
        raise HubError(f"{head} no model of that name on the Hugging Face Hub (a private repo needs "
                       "HF_TOKEN)") from None
    except RevisionNotFoundError:
        raise HubError(f"{name}: the Hub repo has no revision {revision!r} (a branch, a tag or a commit)") from None
    except LocalEntryNotFoundError:
        where = "the network is off (--local-only)" if local_only else (
            "the network is off (HF_HUB_OFFLINE)" if offline else "the Hugging Face Hub could not be reached")
        head = f"{name}: not a checkpoint folder (no such directory), and {at} is" if also_a_path else f"{at}:"
        raise HubError(f"{head} not in the Hugging Face cache ({constants.HF_HUB_CACHE}) while {where}; fetch it "
                       f"with `tformer download {at}` where the network is on") from None
    except HfHubHTTPError as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise HubError(f"{at}: the Hugging Face Hub refused: {first_line}") from None
    broken = sorted(entry for entry in folder.iterdir() if entry.is_symlink() and not entry.exists())
    if broken:
        blob = broken[0].resolve()
        raise HubError(f"{at}: the cached snapshot's {', '.join(entry.name for entry in broken)} "
                       f"{'is a broken link' if len(broken) == 1 else 'are broken links'}: the blob {blob.name} is "
                       f"missing from {blob.parent}; fetch it again with `tformer download {at}` where the network "
                       "is on")
    if not any((folder / weights).is_file() for weights in SAFETENSORS_WEIGHTS):
        pickles = sorted(path.name for path in folder.glob("*.bin"))
        held = f" (its cached snapshot holds only {', '.join(pickles)})" if pickles else ""
        raise HubError(f"{at}: no safetensors weights{held}; tformer reads model.safetensors (or its sharded "
                       "index) and never loads pickle (.bin) weights from the Hub")
    return folder
