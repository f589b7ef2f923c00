"""The Vision Transformer: config fields and presets, the patch front end, position interpolation,
VisionModel's heads, resolution changes, head swaps and checkpoints with their image processing."""

import warnings

import pytest
import torch
import torch.nn.functional as F

import tformer
from tformer import ConfigError, ImageProcessing, ModelConfig, VisionModel
from tformer.models.registry import model_bytes
from tformer.nn.patches import PatchEmbedding, resize_position_table, sincos_2d_positions
from tformer.nn.positions import sinusoidal_table


def tiny(**fields) -> ModelConfig:
    """16 x 16 RGB images in 4 x 4 patches (a 4 x 4 grid), 32 wide, 2 layers, 5 classes."""
    settings = {"architecture": "vision", "d_model": 32, "num_layers": 2, "num_heads": 4, "activation": "gelu",
                "image_size": 16, "patch_size": 4, "head": "image_classification", "num_labels": 5}
    return ModelConfig(**{**settings, **fields})


def pixels(batch=2, size=16, channels=3) -> torch.Tensor:
    return torch.randn(batch, channels, size, size)


# ---- config -----------------------------------------------------------------------------------


def test_vit_base_preset_counts_hugging_faces_parameters():
    # Hugging Face's ViTForImageClassification google/vit-base-patch16-224 (1,000 labels).
    with torch.device("meta"):  # shapes only: counting needs no weights
        assert tformer.build_model("vit-base-patch16-224").num_parameters() == 86_567_656


@pytest.mark.slow  # imports transformers
def test_small_presets_count_what_hugging_face_builds():
    transformers = pytest.importorskip("transformers")
    from tformer.interop.vit import ViTFamily

    for name in ("vit-tiny-patch16-224", "vit-mnist"):
        config = tformer.PRESETS[name]
        hf_config = transformers.ViTConfig.from_dict(ViTFamily().config_to_hf(config))
        hf = transformers.ViTForImageClassification(hf_config)
        assert tformer.build_model(name).num_parameters() == sum(p.numel() for p in hf.parameters()), name
    assert tformer.build_model("vit-tiny-patch16-224").num_parameters() == 5_717_416
    mnist = tformer.PRESETS["vit-mnist"]
    assert (mnist.image_size, mnist.num_channels, mnist.num_labels, mnist.num_patches) == (28, 1, 10, 49)


TEXT = "decoder, encoder, encoder_decoder, rnn_seq2seq, speech"  # the families with a token vocabulary


@pytest.mark.parametrize(("fields", "message"), [
    ({"vocab_size": 100}, f"vocab_size=100 is a field of the {TEXT} families; architecture='vision' does not use it"),
    ({"max_seq_len": 64}, f"max_seq_len=64 is a field of the {TEXT} families"),
    ({"tie_embeddings": False}, f"tie_embeddings=False is a field of the {TEXT} families"),
    ({"pad_token_id": 0}, f"pad_token_id=0 is a field of the {TEXT} families"),
    ({"rope_theta": 500.0}, "rope_theta=500.0 is a field of the decoder, encoder, encoder_decoder families"),
    ({"type_vocab_size": 2}, "type_vocab_size=2 is a field of the encoder family"),
    ({"problem_type": "regression"}, "problem_type='regression' is a field of the encoder family"),
    ({"positional": "rope"}, "positional='rope' is not one of learned, sinusoidal (architecture='vision'"),
    ({"positional": "sinusoidal", "d_model": 34, "num_heads": 2}, "d_model=34 must be a multiple of 4"),
    ({"image_size": 18}, "image_size=18 is not a multiple of patch_size=4"),
    ({"patch_size": 0}, "patch_size=0 must be a positive integer"),
    ({"pooling": "max"}, "pooling='max' is not one of cls, mean"),
    ({"head": "masked_lm"}, "head='masked_lm' is not one of None, image_classification"),
    ({"head": None}, "num_labels=5 is read only by the classification heads (image_classification)"),
    ({"num_labels": 1}, "num_labels=1 must be >= 2 for head='image_classification'"),
    ({"label_names": ("a", "b")}, "label_names=['a', 'b'] must be 5 distinct names"),
])
def test_bad_vision_config_names_the_field(fields, message):
    with pytest.raises(ConfigError) as error:
        tiny(**fields)
    assert message in str(error.value)


@pytest.mark.parametrize("field", [{"image_size": 32}, {"patch_size": 8}, {"num_channels": 1}])
def test_vision_fields_are_refused_by_the_text_families(field):
    name = next(iter(field))
    with pytest.raises(ConfigError, match=f"{name}=.* is a field of the vision family; architecture='decoder'"):
        ModelConfig(**field)


def test_pooling_is_refused_by_the_decoder():
    with pytest.raises(ConfigError, match="pooling='mean' is a field of the encoder, vision families; "
                                          "architecture='decoder'"):
        ModelConfig(pooling="mean")


def test_vision_model_bytes_count_patches_not_a_vocabulary():
    parameters = 86_567_656  # vit-base-patch16-224's: norms, biases and the head are left out of the estimate
    assert 0.97 * parameters * 4 < model_bytes(tformer.PRESETS["vit-base-patch16-224"]) <= parameters * 4


# ---- the front end ----------------------------------------------------------------------------


def test_patch_embedding_equals_reshape_into_patches_and_a_linear():
    embedding = PatchEmbedding(num_channels=3, d_model=8, patch_size=4)
    images = torch.randn(2, 3, 12, 8)  # a 3 x 2 grid
    # (B, C, H/P, P, W/P, P) -> (B, H/P, W/P, C, P, P) -> (B, N, C * P * P): row-major patches
    patches = images.reshape(2, 3, 3, 4, 2, 4).permute(0, 2, 4, 1, 3, 5).reshape(2, 6, 3 * 16)
    weight = embedding.projection.weight.reshape(8, 3 * 16)  # (D, C, P, P) -> (D, C * P * P)
    torch.testing.assert_close(embedding(images), F.linear(patches, weight, embedding.projection.bias),
                               rtol=1e-5, atol=1e-6)


def test_interpolating_to_the_same_grid_is_the_identity():
    table = torch.randn(1 + 16, 32)
    assert torch.equal(resize_position_table(table, (4, 4)), table)


def test_interpolation_keeps_the_class_row_and_resamples_the_grid():
    table = torch.randn(1 + 16, 8)
    resized = resize_position_table(table, (6, 3))
    assert resized.shape == (1 + 18, 8)
    assert torch.equal(resized[0], table[0])
    # A grid that is constant along the rows stays so: bicubic over the grid, not across the width.
    ramp = torch.cat([torch.zeros(1, 8), torch.arange(4.0).repeat_interleave(4)[:, None].expand(16, 8)])
    rows = resize_position_table(ramp, (6, 3))[1:].reshape(6, 3, 8)
    assert torch.allclose(rows, rows[:, :1].expand(6, 3, 8))
    with pytest.raises(ValueError, match="15 patch rows is not a square grid"):
        resize_position_table(torch.randn(16, 8), (2, 2))


@pytest.mark.slow  # imports transformers
@pytest.mark.parametrize(("height", "width"), [(24, 24), (8, 8), (16, 24), (20, 12)])
def test_interpolation_equals_hugging_faces(height, width):
    transformers = pytest.importorskip("transformers")
    from transformers.models.vit.modeling_vit import ViTEmbeddings

    hf = ViTEmbeddings(transformers.ViTConfig(hidden_size=32, image_size=16, patch_size=4))
    table = torch.randn(1 + 16, 32)
    hf.position_embeddings.data.copy_(table[None])
    grid = (height // 4, width // 4)
    theirs = hf.interpolate_pos_encoding(torch.zeros(1, 1 + grid[0] * grid[1], 32), height, width)
    assert torch.equal(resize_position_table(table, grid)[None], theirs)


def test_fixed_2d_positions_encode_row_then_column():
    table = sincos_2d_positions(3, 5, 16)  # (15, 16)
    row_code, column_code = sinusoidal_table(3, 8), sinusoidal_table(5, 8)
    for row in range(3):
        for column in range(5):
            assert torch.equal(table[row * 5 + column], torch.cat([row_code[row], column_code[column]]))
    model = VisionModel(tiny(positional="sinusoidal"))
    assert "embedding.position_embeddings" not in model.state_dict()  # fixed: not a weight
    assert torch.equal(model.embedding.position_embeddings[0, 0], torch.zeros(32))  # the class token has no place


# ---- the model --------------------------------------------------------------------------------


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_classifier_reads_the_pooled_vector_and_the_loss_is_cross_entropy(pooling):
    model = VisionModel(tiny(pooling=pooling)).eval()
    images, labels = pixels(3), torch.tensor([0, 4, 2])
    output = model(images, labels=labels)
    hidden = output.last_hidden_state
    assert hidden.shape == (3, 1 + 16, 32) and output.logits.shape == (3, 5) and output.pooled is None
    pooled = hidden[:, 0] if pooling == "cls" else hidden[:, 1:].mean(dim=1)
    torch.testing.assert_close(output.logits, model.classifier(pooled))
    torch.testing.assert_close(output.loss, F.cross_entropy(output.logits, labels))


def test_bare_model_pools_the_class_token_through_tanh():
    model = VisionModel(tiny(head=None, num_labels=2)).eval()
    output = model(pixels())
    assert model.classifier is None and output.loss is None
    assert torch.equal(output.logits, output.last_hidden_state)
    torch.testing.assert_close(output.pooled, torch.tanh(model.pooler.dense(output.last_hidden_state[:, 0])))
    with pytest.raises(ValueError, match="labels given, but head=None reads none"):
        model(pixels(), labels=torch.tensor([0, 1]))


def test_attentions_and_hidden_states_when_asked_and_the_same_logits():
    model = VisionModel(tiny(num_layers=3)).eval()
    images = pixels()
    fast = model(images)
    output = model(images, output_attentions=True, output_hidden_states=True)
    assert fast.attentions is None and fast.hidden_states is None
    assert len(output.attentions) == 3 and output.attentions[0].shape == (2, 4, 17, 17)
    torch.testing.assert_close(output.attentions[-1].sum(-1), torch.ones(2, 4, 17))
    assert len(output.hidden_states) == 4 and torch.equal(output.hidden_states[-1], output.last_hidden_state)
    torch.testing.assert_close(output.logits, fast.logits, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("images", "message"), [
    (pixels(size=20), r"pixel_values are 20 x 20, the model reads 16 x 16 \(image_size=16\); pass "
                      "interpolate_pos_encoding=True"),
    (pixels(channels=1), r"pixel_values have 1 channels, the model reads 3 \(num_channels=3\)"),
    (torch.zeros(2, 3, 16, 16, dtype=torch.uint8), "must be normalised floats, got torch.uint8"),
    (torch.zeros(3, 16, 16), r"must be \(B, C, H, W\)"),
])
def test_images_that_do_not_fit_are_refused(images, message):
    with pytest.raises(ValueError, match=message):
        VisionModel(tiny())(images)


def test_interpolated_sizes_must_be_whole_patches_and_labels_class_ids():
    model = VisionModel(tiny())
    with pytest.raises(ValueError, match="pixel_values are 18 x 16, not a multiple of patch_size=4"):
        model(torch.randn(1, 3, 18, 16), interpolate_pos_encoding=True)
    with pytest.raises(ValueError, match=r"labels must be \(2,\) integer class ids"):
        model(pixels(), labels=torch.zeros(2, 5))


@pytest.mark.parametrize("positional", ["learned", "sinusoidal"])
def test_resize_image_for_good_equals_interpolating_each_batch(positional):
    model = VisionModel(tiny(positional=positional)).eval()
    model.image_processor = ImageProcessing(16, 3, (0.5,) * 3, (0.25,) * 3)
    images = pixels(size=24)
    interpolated = model(images, interpolate_pos_encoding=True).logits
    model.resize_image(24)
    assert model.config.image_size == 24 and model.image_processor.image_size == 24
    assert model.embedding.position_embeddings.shape == (1, 1 + 36, 32)
    assert torch.equal(model(images).logits, interpolated)
    with pytest.raises(ConfigError, match="image_size=30 is not a multiple of patch_size=4"):
        model.resize_image(30)


def test_a_resized_model_saves_and_loads_at_its_new_size(tmp_path):
    model = VisionModel(tiny()).eval()
    model.resize_image(32)
    model.save(tmp_path / "m")
    loaded = tformer.load(tmp_path / "m")
    images = pixels(size=32)
    assert loaded.config.image_size == 32 and torch.equal(loaded(images).logits, model(images).logits)


# ---- checkpoints ------------------------------------------------------------------------------


def test_checkpoint_keeps_weights_config_and_image_processing(tmp_path):
    model = VisionModel(tiny(label_names=("a", "b", "c", "d", "e"))).eval()
    model.image_processor = ImageProcessing(16, 3, (0.4, 0.5, 0.6), (0.2, 0.25, 0.3))
    model.save(tmp_path / "m")
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["config.json", "model.safetensors",
                                                                 "preprocessor_config.json"]
    loaded = tformer.load(tmp_path / "m")
    assert isinstance(loaded, VisionModel) and loaded.config == model.config
    assert loaded.image_processor == model.image_processor
    images = pixels()
    assert torch.equal(loaded(images).logits, model(images).logits)
    bare = VisionModel(tiny(head=None, num_labels=2))
    bare.save(tmp_path / "bare")
    assert tformer.load(tmp_path / "bare").image_processor is None


def test_unreadable_image_processing_loads_the_model_with_a_warning(tmp_path):
    VisionModel(tiny()).save(tmp_path / "m")
    (tmp_path / "m" / "preprocessor_config.json").write_text('{"size": {"shortest_edge": 16}, "image_mean": [0.5]}')
    with pytest.warns(UserWarning, match="image processor not attached: .*size=.*not supported"):
        model = tformer.load(tmp_path / "m")
    assert model.image_processor is None


def test_new_label_set_keeps_the_backbone_and_initialises_the_classifier(tmp_path):
    model = VisionModel(tiny()).eval()
    model.save(tmp_path / "m")
    with pytest.warns(UserWarning, match="newly initialised: classifier.bias, classifier.weight"):
        relabelled = tformer.load(tmp_path / "m", label_names=["cat", "dog", "eel"])
    assert relabelled.config.num_labels == 3 and relabelled.config.label_names == ("cat", "dog", "eel")
    state, original = relabelled.state_dict(), model.state_dict()
    assert all(torch.equal(state[name], tensor) for name, tensor in original.items() if not name.startswith("class"))
    assert relabelled(pixels()).logits.shape == (2, 3)
    with pytest.warns(UserWarning, match="newly initialised: pooler.dense.bias, pooler.dense.weight; not used: "
                                         "classifier.bias, classifier.weight"):
        bare = tformer.load(tmp_path / "m", head=None)
    assert bare.config.head is None and bare.pooler is not None
    with pytest.raises(ConfigError, match="problem_type='regression' is a field of the encoder family"):
        tformer.load(tmp_path / "m", problem_type="regression")


def test_same_labels_load_without_a_warning(tmp_path):
    VisionModel(tiny()).save(tmp_path / "m")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tformer.load(tmp_path / "m", num_labels=5).config.num_labels == 5


def test_training_checkpoints_keep_the_image_processing(tmp_path):
    from tformer.training.checkpoints import write_checkpoint

    model = VisionModel(tiny()).eval()
    processing = ImageProcessing(16, 3, (0.4, 0.5, 0.6), (0.2, 0.25, 0.3))
    write_checkpoint(tmp_path / "step", model.config, model.state_dict(), None, None, {"step": 1},
                     image_processor=processing)
    assert tformer.load(tmp_path / "step").image_processor == processing
