"""Recipes: TOML sections onto ModelConfig / DataConfig / TrainingConfig, --set overrides,
errors that name the section, key and choices before any work, a resolved recipe that reads back."""

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from shared_data import SHARED_DATA

from tformer.checkpoint import write_model_files
from tformer.data.parallel import corpus_file
from tformer.data.text_to_text import parse_sources
from tformer.training.recipe import RecipeError, load_recipe, parse_override, recipe_from_dict

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path, text, name="recipe.toml"):
    (tmp_path / "text.txt").write_text("hello world, " * 50)
    path = tmp_path / name
    path.write_text(text)
    return path


BASE = """
[model]
preset = "gpt-nano"
d_model = 48
num_heads = 4

[data]
train = "text.txt"

[training]
max_steps = 10
lr = 3e-3
"""


def test_a_recipe_maps_onto_the_three_configs(tmp_path):
    recipe = load_recipe(write(tmp_path, BASE))
    assert recipe.model.d_model == 48 and recipe.model.num_layers == 2  # preset + field
    assert recipe.training.max_steps == 10 and recipe.training.lr == 3e-3
    assert recipe.training.seq_len == recipe.model.max_seq_len  # resolved from the model
    assert recipe.data.train == str(tmp_path / "text.txt")  # relative to the recipe's folder
    assert not recipe.vocab_size_given


def test_overrides_are_typed_toml_values_or_plain_strings(tmp_path):
    recipe = load_recipe(write(tmp_path, BASE), ["training.lr=1e-4", "training.deterministic=true",
                                                 "model.num_layers=3", "training.schedule=linear"])
    assert recipe.training.lr == 1e-4 and recipe.training.deterministic is True
    assert recipe.model.num_layers == 3 and recipe.training.schedule == "linear"
    assert parse_override("data.train=some/file.txt") == ("data", "train", "some/file.txt")
    with pytest.raises(RecipeError, match="expected section.key=value"):
        parse_override("training.lr")


@pytest.mark.parametrize(
    "change, message",
    [
        (["training.lrr=1"], r"\[training\] unknown key 'lrr' \(did you mean 'lr'\?\); valid keys: .*max_steps"),
        (["training.max_steps='100'"], r"\[training\] max_steps='100' must be an integer \(got str\)"),
        (["training.deterministic=1"], r"\[training\] deterministic=1 must be true or false"),
        (["training.schedule=cosin"], r"\[training\] schedule='cosin' is not one of cosine, linear, constant, "
                                      r"inverse_sqrt"),
        (["training.max_steps=-1"], r"\[training\] max_steps=-1 must be an integer >= 0"),
        (["training.max_steps=0"], r"\[training\] max_steps=0 sizes the run by the clock and needs "
                                   r"training.max_minutes > 0"),
        (["model.d_model=50"], r"\[model\] d_model=50 is not divisible by num_heads=4"),
        (["model.activation=tanh"], r"\[model\] activation='tanh' is not one of relu, gelu"),
        (["model.presett=x"], r"\[model\] unknown key 'presett' \(did you mean 'preset'\?\)"),
        (["model.preset=gpt5"], r"\[model\] unknown preset 'gpt5'; presets: "),
        (["data.format=conll"], r"\[data\] format='conll' is not read by the lm task; it reads auto, text, tokens, "
         r"npy, jsonl, csv, tsv, parquet, datasets"),
        (["data.train=/nonexistent/corpus.txt"], r"\[data\] train: /nonexistent/corpus.txt: no such file"),
        (["optim.lr=1"], r"unknown section \[optim\]; sections: model, data, training"),
        (["training.seq_len=500"], r"\[training\] seq_len=500 exceeds \[model\] max_seq_len=64"),
    ],
)
def test_bad_recipes_name_the_section_key_and_choices(tmp_path, change, message):
    with pytest.raises(RecipeError, match=message):
        load_recipe(write(tmp_path, BASE), change)


def test_unreadable_recipes(tmp_path):
    with pytest.raises(RecipeError, match="no such recipe file"):
        load_recipe(tmp_path / "missing.toml")
    with pytest.raises(RecipeError, match="not valid TOML"):
        load_recipe(write(tmp_path, "[training\nmax_steps = 1"))
    with pytest.raises(RecipeError, match=r"unknown section \[trainer\]"):
        load_recipe(write(tmp_path, BASE + "\n[trainer]\nx = 1\n"))


def test_the_resolved_recipe_reads_back_to_the_same_configs(tmp_path):
    recipe = load_recipe(write(tmp_path, BASE)).with_vocab_size(77)
    text = recipe.to_toml()
    tomllib.loads(text)
    again = recipe_from_dict(tomllib.loads(text))
    assert again.model == recipe.model and again.training == recipe.training and again.data == recipe.data
    assert again.model.vocab_size == 77 and again.vocab_size_given


def test_a_preset_with_special_tokens_follows_the_tokenizers_vocabulary(tmp_path):
    recipe = load_recipe(write(tmp_path, BASE.replace('"gpt-nano"', '"gpt2"').replace("d_model = 48", "d_model = 64")))
    assert recipe.model.bos_token_id == 50256
    assert recipe.with_vocab_size(66).model.bos_token_id is None


def test_vocab_size_comes_from_the_tokenizer_unless_the_recipe_sets_it(tmp_path):
    recipe = load_recipe(write(tmp_path, BASE))
    assert recipe.with_vocab_size(30).model.vocab_size == 30
    fixed = load_recipe(write(tmp_path, BASE), ["model.vocab_size=40"])
    assert fixed.with_vocab_size(30).model.vocab_size == 40
    with pytest.raises(RecipeError, match="vocab_size=40 is smaller than the tokenizer's 50 tokens"):
        fixed.with_vocab_size(50)


def test_the_shipped_recipes_are_valid(tmp_path):
    """Every recipe in configs/ validates; its data path must name a real file wherever the shared
    datasets are present (beside the repository), and is swapped for this file only where they are not
    (data a script builds into data/ is swapped for a stand-in where it has not been built).
    A recipe that starts from another's run (``init_from = "../runs/NAME"``, trained by configs/NAME.toml)
    validates against a stand-in folder holding that recipe's model config where the run is not there."""
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\n", encoding="utf-8")

    for language in ("de", "en"):  # a two-line corpus stands in for a translation recipe's
        (tmp_path / f"pairs.{language}").write_text("a\nb\n", encoding="utf-8")

    def without_shared_data(raw: dict) -> dict:
        if not SHARED_DATA.is_dir():  # this file stands in for the data, a tiny vocabulary for the tokenizer
            for data in raw["data"].get("sources", [raw["data"]]):  # a text-to-text recipe's sources: each one's
                translation = "source_language" in data
                data["train"] = str(tmp_path / "pairs") if translation else __file__
                data.pop("eval", None)
            if raw["data"].get("tokenizer", "char") not in ("char", "bpe"):
                raw["data"]["tokenizer"] = str(tmp_path / "vocab.txt")
        return raw

    def built_data_stand_ins(raw: dict, folder: Path) -> dict:
        """Data a script builds into the repository's data/ (benchmarks/speech_fsdd.py, t5_corpus.py): a
        header-only manifest (a tiny vocabulary for a tokenizer) stands in where it has not been built."""
        for key in ("train", "eval", "tokenizer"):
            value = raw["data"].get(key)
            built = (folder / value).resolve() if value else None
            if built is not None and built.is_relative_to(REPO / "data") and not built.exists():
                stand_in = tmp_path / "built" / built.name
                stand_in.parent.mkdir(exist_ok=True)
                stand_in.write_text("audio\ttext\n", encoding="utf-8")
                raw["data"][key] = str(tmp_path / "vocab.txt") if key == "tokenizer" else str(stand_in)
        return raw

    for path in sorted((REPO / "configs").glob("*.toml")):
        raw = built_data_stand_ins(without_shared_data(tomllib.loads(path.read_text())), path.parent)
        init_from = raw["model"].get("init_from")
        if init_from and not (path.parent / init_from).is_dir():
            source = path.parent / f"{Path(init_from).name}.toml"
            assert source.is_file(), f"{path.name}: init_from={init_from} is no run of a shipped recipe"
            stand_in = tmp_path / Path(init_from).name
            stand_in.mkdir(exist_ok=True)
            source_raw = built_data_stand_ins(without_shared_data(tomllib.loads(source.read_text())), path.parent)
            model = recipe_from_dict(source_raw, source=str(source), base_dir=path.parent).model
            write_model_files(stand_in, model, {})
            raw["model"]["init_from"] = str(stand_in)
        recipe = recipe_from_dict(raw, source=str(path), base_dir=path.parent)
        for data in [source.data for source in parse_sources(recipe.data.sources)] if recipe.data.sources else \
                [recipe.data]:
            files = [corpus_file(data.train, language) for language in (data.source_language, data.target_language)] \
                if data.source_language else [Path(data.train)]
            assert all(file.is_file() for file in files), f"{path.name}: data.train={data.train} does not exist"


@pytest.mark.slow  # runs the command line in a subprocess
def test_the_command_line_reports_a_bad_recipe_in_one_line_before_any_work(tmp_path):
    path = write(tmp_path, BASE)
    out = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "tformer", "train", str(path), "--set", "training.schedule=cosin", "--out", str(out)],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "Traceback" not in result.stderr
    assert "[training] schedule='cosin' is not one of cosine" in result.stderr
    assert not out.exists()


VIT_RECIPE = """
[model]
preset = "vit-mnist"
num_layers = 1

[data]
train = "images.npz"

[task]
name = "image_classification"
"""


def test_seq_len_is_refused_by_a_task_that_does_not_read_it(tmp_path):
    """A ViT's sequence is its patches: training.seq_len is refused by name, whatever its size (4096 was refused
    as past a 'learned position table' it does not have, 64 accepted and never read)."""
    (tmp_path / "images.npz").write_bytes(b"")
    path = write(tmp_path, VIT_RECIPE)
    for value in (64, 4096):
        with pytest.raises(RecipeError, match=rf"--set training.seq_len={value}: \[training\] seq_len={value} is not "
                                              r"read by the image_classification task"):
            load_recipe(path, [f"training.seq_len={value}"])
    recipe = load_recipe(path)
    assert recipe.training.seq_len is None and "\nseq_len =" not in recipe.to_toml()
    # a run's recipe.toml from before the check holds the length it resolved to: still read
    assert load_recipe(path, [f"training.seq_len={recipe.model.max_seq_len}"]).training.seq_len is not None
