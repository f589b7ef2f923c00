"""Models by Hub name, offline: a Hugging Face cache laid out as huggingface_hub writes it
(``models--org--name/refs``, ``snapshots/<commit>/``, ``blobs/``) under a temporary HF_HUB_CACHE,
resolved by huggingface_hub itself with the network off."""

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tformer
from tformer.cli import main
from tformer.hub_cache import HubError
from tformer.tokenizers import CharTokenizer

hub_constants = pytest.importorskip("huggingface_hub.constants")

TEXT = "the quick brown fox jumps over the lazy dog. " * 4
NAME = "tiny-org/tiny-gpt"
MAIN_COMMIT, TAGGED_COMMIT = "a" * 40, "b" * 40


def _model(seed: int) -> tformer.Model:
    torch.manual_seed(seed)
    tokenizer = CharTokenizer.train(TEXT)
    model = tformer.build_model("gpt-nano", vocab_size=tokenizer.vocab_size, initializer_range=0.2)
    model.tokenizer = tokenizer
    return model


def _add_snapshot(cache: Path, name: str, commit: str, files: Path, symlinks: bool, refs: tuple[str, ...]) -> None:
    """Put ``files``' contents in the cache as huggingface_hub does: each file's bytes in blobs/ under
    its hash, the snapshot's entries linking to them (or copies, as on a system without symlinks)."""
    repo = cache / f"models--{name.replace('/', '--')}"
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for source in sorted(files.iterdir()):
        data = source.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        if symlinks:
            (snapshot / source.name).symlink_to(Path("..", "..", "blobs", blob.name))
        else:
            (snapshot / source.name).write_bytes(data)
    for ref in refs:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / ref).write_text(commit)


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory):
    """A cache with tiny-org/tiny-gpt (main: seed 1, tag v1 and branch dev: seed 2, as symlinked blobs),
    tiny-org/copied (blobs as plain files) and tiny-org/pickled (pytorch_model.bin only)."""
    root = tmp_path_factory.mktemp("hub")
    cache = root / "cache"
    for seed, commit, refs in ((1, MAIN_COMMIT, ("main",)), (2, TAGGED_COMMIT, ("v1", "dev"))):
        _model(seed).save(root / f"seed{seed}", format="hf")
        _add_snapshot(cache, NAME, commit, root / f"seed{seed}", symlinks=True, refs=refs)
    _add_snapshot(cache, "tiny-org/copied", MAIN_COMMIT, root / "seed1", symlinks=False, refs=("main",))
    pickled = root / "pickled"
    pickled.mkdir()
    (pickled / "config.json").write_bytes((root / "seed1" / "config.json").read_bytes())
    torch.save(_model(1).state_dict(), pickled / "pytorch_model.bin")
    _add_snapshot(cache, "tiny-org/pickled", MAIN_COMMIT, pickled, symlinks=True, refs=("main",))
    return cache


@pytest.fixture
def offline(hub_cache, monkeypatch, tmp_path):
    """huggingface_hub reads HF_HUB_CACHE and HF_HUB_OFFLINE when it is imported: set its constants (a
    subprocess test below sets the environment variables themselves). The working directory is empty."""
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(hub_cache))
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.chdir(tmp_path)
    return hub_cache


def _files(root: Path) -> dict[str, bytes | str]:
    """Every entry under ``root`` with its bytes (a symlink: its target), to see that nothing changed."""
    return {str(path.relative_to(root)): (os.readlink(path) if path.is_symlink() else
                                          path.read_bytes() if path.is_file() else "dir")
            for path in sorted(root.rglob("*"))}


def _same_weights(model: tformer.Model, seed: int) -> bool:
    expected = _model(seed).state_dict()
    return all(torch.equal(tensor, expected[name]) for name, tensor in model.state_dict().items())


@pytest.mark.parametrize(("revision", "seed"), [(None, 1), ("main", 1), ("v1", 2), ("dev", 2),
                                                (TAGGED_COMMIT, 2), (MAIN_COMMIT, 1)])
def test_a_name_loads_its_revision_from_the_cache(offline, revision, seed):
    before = _files(offline.parent)
    model = tformer.load(NAME, revision=revision)
    assert _same_weights(model, seed)
    assert model.tokenizer.decode(model.tokenizer.encode("lazy fox")) == "lazy fox"
    assert _files(offline.parent) == before and not any(Path.cwd().iterdir())


def test_blobs_as_plain_files_load_too(offline):
    assert _same_weights(tformer.load("tiny-org/copied", local_only=True), 1)


def test_an_existing_local_folder_wins_over_a_name(offline, tmp_path):
    local = tmp_path / NAME
    _model(3).save(local)
    assert _same_weights(tformer.load(NAME), 3)  # the relative path tiny-org/tiny-gpt exists here
    with pytest.raises(HubError, match="a local folder; --revision"):
        tformer.load(NAME, revision="v1")


@pytest.mark.parametrize(("name", "revision", "message"), [
    ("tiny-org/pickled", None, r"tiny-org/pickled: no safetensors weights \(its cached snapshot holds only "
                               r"pytorch_model.bin\); .* never loads pickle"),
    ("tiny-org/absent", None, r"tiny-org/absent: not a checkpoint folder \(no such directory\), and "
                              r"tiny-org/absent is not in the Hugging Face cache .*\(HF_HUB_OFFLINE\); fetch it "
                              r"with `tformer download tiny-org/absent`"),
    (NAME, "v9", r"tiny-org/tiny-gpt@v9 is not in the Hugging Face cache"),
    (NAME, "", r"tiny-org/tiny-gpt: the revision is empty \(--revision/revision=\); give a branch, a tag or a commit"),
    (NAME, " ", r"tiny-org/tiny-gpt: the revision is empty"),
])
def test_names_that_cannot_be_loaded_say_why(offline, name, revision, message):
    with pytest.raises(HubError, match=message):
        tformer.load(name, revision=revision)


def test_a_path_that_is_no_name_stays_a_missing_file(offline):
    with pytest.raises(HubError, match="no such directory.*nor a Hub name"):
        tformer.load("./runs/absent")


def test_commands_take_the_name(offline, capsys):
    assert main(["info", NAME, "--revision", "v1"]) == 0
    assert f"snapshots/{TAGGED_COMMIT}" in capsys.readouterr().out
    assert main(["generate", NAME, "--prompt", "the ", "--max-new-tokens", "5"]) == 0
    model = _model(1)
    ids = torch.tensor([model.tokenizer.encode("the ")])
    expected = "the " + model.tokenizer.decode(tformer.generate(model, ids, 5)[0, ids.shape[1]:].tolist())
    assert capsys.readouterr().out.strip() == expected.strip()
    assert main(["download", NAME, "--local-only", "--revision", "dev"]) == 0
    assert capsys.readouterr().out.strip() == str(offline / "models--tiny-org--tiny-gpt" / "snapshots" / TAGGED_COMMIT)
    assert main(["attention", NAME, "--text", "the fox"]) == 0
    assert (Path("tiny-org--tiny-gpt") / "attention" / "text.png").is_file()  # beside us, not in the cache


def test_command_errors_are_one_line_with_exit_code_2(offline, capsys):
    assert main(["info", "tiny-org/pickled"]) == 2
    assert main(["download", "tiny-org/absent", "--local-only"]) == 2
    assert main(["download", "../not/a name"]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 3 and all(line.startswith("tformer ") and ": error: " in line for line in errors)
    assert "--local-only" in errors[1] and "not a Hub model name" in errors[2]
    assert errors[1].startswith("tformer download: error: tiny-org/absent: not in the Hugging Face cache")  # no folder


def test_an_empty_revision_is_one_line_on_the_command_line(offline, capsys):
    assert main(["info", NAME, "--revision", ""]) == 2  # was "refs/: Is a directory"
    assert capsys.readouterr().err == (f"tformer info: error: {NAME}: the revision is empty (--revision/revision=); "
                                       "give a branch, a tag or a commit, or leave it out for the repo's default "
                                       "branch\n")


def test_a_snapshot_whose_weight_blob_was_deleted_says_so(hub_cache, monkeypatch, tmp_path, capsys):
    """A blob deleted from the cache leaves the snapshot's link dangling: named as a broken link, with the way to
    fetch it again (it was reported as a repo without safetensors weights)."""
    cache = tmp_path / "cache"
    cache.mkdir()
    _add_snapshot(cache, NAME, MAIN_COMMIT, hub_cache / "models--tiny-org--tiny-gpt" / "snapshots" / MAIN_COMMIT,
                  symlinks=True, refs=("main",))
    weights = cache / "models--tiny-org--tiny-gpt" / "snapshots" / MAIN_COMMIT / "model.safetensors"
    blob = weights.resolve()
    blob.unlink()
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(HubError, match=f"^{NAME}: the cached snapshot's model.safetensors is a broken link: the blob "
                                       f"{blob.name} is missing from {blob.parent}; fetch it again with `tformer "
                                       f"download {NAME}` where the network is on$"):
        tformer.load(NAME)
    assert main(["info", NAME]) == 2
    err = capsys.readouterr().err
    assert "is a broken link" in err and err.count("\n") == 1


@pytest.mark.slow
def test_the_environment_variables_reach_huggingface_hub(hub_cache, tmp_path):
    environment = {**os.environ, "HF_HUB_CACHE": str(hub_cache), "HF_HUB_OFFLINE": "1"}
    run = [sys.executable, "-m", "tformer"]
    info = subprocess.run([*run, "info", NAME], capture_output=True, text=True, env=environment, cwd=tmp_path,
                          timeout=120)
    assert info.returncode == 0 and f"snapshots/{MAIN_COMMIT}" in info.stdout
    absent = subprocess.run([*run, "download", "tiny-org/absent"], capture_output=True, text=True,
                            env=environment, cwd=tmp_path, timeout=120)
    assert absent.returncode == 2 and absent.stdout == ""
    assert absent.stderr.count("\n") == 1 and "HF_HUB_OFFLINE" in absent.stderr and "Traceback" not in absent.stderr


def test_a_recipe_fine_tunes_from_a_name_at_a_revision(offline, tmp_path):
    from tformer.training.recipe import load_recipe, recipe_from_dict
    from tformer.training.run import train_recipe

    (tmp_path / "corpus.txt").write_text(TEXT * 8, encoding="utf-8")
    raw = {"model": {"init_from": NAME, "init_revision": "v1"}, "data": {"train": "corpus.txt", "eval_fraction": 0.2},
           "task": {"name": "lm"}, "training": {"max_steps": 2, "batch_size": 2, "seq_len": 16, "eval_every": 2,
                                                "threads": 1}}
    recipe = recipe_from_dict(raw, base_dir=tmp_path)
    assert (recipe.init_from, recipe.init_revision) == (NAME, "v1")
    train_recipe(recipe, tmp_path / "tuned", progress=False, echo=lambda text: None)
    tuned = tformer.load(tmp_path / "tuned")
    assert not _same_weights(tuned, 2)  # it trained...
    def distance(seed: int) -> float:
        expected = _model(seed).state_dict()
        return sum((tensor - expected[name]).norm().item() for name, tensor in tuned.state_dict().items())

    assert distance(2) < distance(1) / 4  # ...from the tagged snapshot, not main's
    again = load_recipe(tmp_path / "tuned" / "recipe.toml")
    assert (again.init_from, again.init_revision) == (NAME, "v1")
    with pytest.raises(Exception, match="init_revision.* of the Hub model init_from names"):
        recipe_from_dict({**raw, "model": {"init_revision": "v1", "preset": "gpt-nano"}}, base_dir=tmp_path)


@pytest.mark.parametrize(("error_code", "status", "message"), [
    ("RepoNotFound", 404, r"org/unknown: not a checkpoint folder \(no such directory\), and no model of that name "
                          r"on the Hugging Face Hub \(a private repo needs HF_TOKEN\)"),
    ("GatedRepo", 401, r"org/unknown@v2: a gated repo; accept its terms on huggingface.co and set HF_TOKEN"),
    ("RevisionNotFound", 404, r"org/unknown: the Hub repo has no revision 'v2'"),
])
def test_what_the_hub_answers_is_said_in_one_line(hub_cache, monkeypatch, tmp_path, error_code, status, message):
    """The Hub's answers as huggingface_hub turns them into errors (its own ``hf_raise_for_status`` on a
    response with the Hub's error code), through snapshot_download's own handling of them."""
    import httpx2
    from huggingface_hub import HfApi
    from huggingface_hub.utils import hf_raise_for_status

    def answer(self, repo_id, **options):
        request = httpx2.Request("GET", f"https://huggingface.co/api/models/{repo_id}")
        hf_raise_for_status(httpx2.Response(status, headers={"X-Error-Code": error_code}, request=request))

    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(hub_cache))
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(HfApi, "repo_info", answer)
    revision = None if error_code == "RepoNotFound" else "v2"
    with pytest.raises(HubError, match=message):
        tformer.load("org/unknown", revision=revision)
