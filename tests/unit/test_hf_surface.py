"""Hugging Face transformers families behind the surface: the output-match gate per family, layouts that
must fail it, timm <-> transformers twins on random weights, offline loading and one-line errors."""

from __future__ import annotations

import copy
import re

import pytest
import torch

pytest.importorskip("transformers", reason="transformers is not installed (pip install 'vitpos[hf]')")

from vitpos.cli import main  # noqa: E402
from vitpos.errors import VitposError  # noqa: E402
from vitpos.hooks import capture, remove_rope  # noqa: E402
from vitpos.models import load_model  # noqa: E402
from vitpos.models.gates import (  # noqa: E402
    check_axis_removal,
    check_rotations,
    run_gate,
    site_differences,
)
from vitpos.models.hf_adapter import HFSurface  # noqa: E402
from vitpos.models.hf_families import FAMILIES, tiny_spec  # noqa: E402
from vitpos.models.surface import RopeAxisMap  # noqa: E402


def tiny(key: str, seed: int = 0, **extra) -> HFSurface:
    torch.manual_seed(seed)
    s = load_model(tiny_spec(key, **extra))
    assert isinstance(s, HFSurface)
    return s


def images(s, n: int = 2, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, *s.input_size, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("key", list(FAMILIES))
def test_family_passes_its_gate(key):
    spec = tiny_spec(key)
    result = run_gate(key, spec, lambda: tiny(key))
    assert result.passed, [c for c in result.checks if not c.passed]
    names = {c.name for c in result.checks}
    assert {"noop", "partial", "pattern", "head_proj"} <= names
    if FAMILIES[key].pe == "rope":
        assert {"rotations", "axis_removal", "per_head"} <= names


@pytest.mark.parametrize("key,prefix", [("vit", 1), ("deit", 2), ("dinov2", 1), ("dinov2_reg", 3), ("dinov3", 3),
                                        ("clip", 1), ("siglip", 0)])
def test_shapes_prefix_and_scheme(key, prefix):
    s = tiny(key)
    assert s.grid == (4, 4) and s.num_prefix_tokens == prefix and s.depth == 2 and s.num_heads == 2
    assert s.scheme == ("rope" if key == "dinov3" else "ape")
    x = images(s)
    with capture(s, ["blocks.0.resid_post", "blocks.0.q"]) as c:
        out = s(x)
    assert out.shape == (2, 32) and s.num_classes == 0  # headless: pooled features
    assert c["blocks.0.resid_post"].shape == (2, prefix + 16, 32)
    assert c["blocks.0.q"].shape == (2, 2, prefix + 16, 16)
    if s.has_ape:
        assert s.patch_pos_embed().shape == (16, 32)


def test_plain_forward_is_the_models_own_sdpa_forward():
    """The dispatcher vitpos installs calls the model's own attention implementation: bit for bit."""
    s = tiny("dinov3")
    twin = copy.deepcopy(s.model)
    twin.set_attn_implementation("sdpa")
    x = images(s)
    with torch.no_grad():
        own = twin(pixel_values=x).last_hidden_state[:, 0]
    assert torch.equal(s(x), own)


def test_pattern_carries_rope_under_sdpa():
    s = tiny("dinov3")
    assert s.model.config._attn_implementation != "eager"
    x = images(s)
    with capture(s, ["blocks.1.attn_pattern", "blocks.1.q", "blocks.1.k", "blocks.1.q_rot", "blocks.1.k_rot"]) as c:
        s(x)
    scale = s.head_dim ** -0.5
    with_rope = torch.softmax(c["blocks.1.q_rot"] @ c["blocks.1.k_rot"].transpose(-1, -2) * scale, -1)
    without = torch.softmax(c["blocks.1.q"] @ c["blocks.1.k"].transpose(-1, -2) * scale, -1)
    torch.testing.assert_close(c["blocks.1.attn_pattern"], with_rope, atol=1e-6, rtol=1e-5)
    assert (c["blocks.1.attn_pattern"] - without).abs().max() > 1e-3
    npt = s.num_prefix_tokens  # prefix tokens are not rotated, patches are
    assert torch.equal(c["blocks.1.q_rot"][:, :, :npt], c["blocks.1.q"][:, :, :npt])
    assert not torch.allclose(c["blocks.1.q_rot"][:, :, npt:], c["blocks.1.q"][:, :, npt:])


def test_axis_map_reads_dinov3_layout():
    amap = tiny("dinov3").rope_axis_map()
    d = 16  # head_dim: rotate-half pairs (p, p + 8); the first d/4 pairs turn with rows, the next d/4 with columns
    assert amap.kind == "axial" and amap.layout == "half"
    assert amap.channels("row") == [0, 1, 2, 3, 8, 9, 10, 11] and amap.channels("col") == [4, 5, 6, 7, 12, 13, 14, 15]
    pairs, f = amap.axis_pairs("row", 0, 0)
    assert pairs == [0, 1, 2, 3] and len(amap.channels("col")) == d // 2
    assert f[0] > f[1] > f[2] > f[3] > 0  # inv_freq falls with the pair index


def test_wrong_layout_fails_the_rotation_gate():
    s = tiny("dinov3")
    x = images(s)
    assert check_rotations(s, x).passed
    good = s.rope_axis_map()
    s._axis_map = RopeAxisMap("axial", good.head_dim, good.depth, good.num_heads, "interleaved",
                              channel_axis=good.channel_axis, channel_freq=good.channel_freq)
    bad = check_rotations(s, x)
    assert not bad.passed, bad.detail


def test_swapped_axes_fail_the_axis_removal_gate():
    s = tiny("dinov3")
    x = images(s)
    good = s.rope_axis_map()
    assert good.channel_axis is not None
    swapped = tuple({"row": "col", "col": "row"}.get(a, a) for a in good.channel_axis)
    s._axis_map = RopeAxisMap("axial", good.head_dim, good.depth, good.num_heads, "half", channel_axis=swapped,
                              channel_freq=good.channel_freq)
    assert not check_axis_removal(s, x).passed


def test_per_head_removal_and_band_touch_only_their_channels():
    s = tiny("dinov3")
    x = images(s)
    with capture(s, ["blocks.0.q_rot"]) as c0:
        s(x)
    with remove_rope(s, {"col": [1]}, layers=[0]), capture(s, ["blocks.0.q_rot", "blocks.0.q"]) as c1:
        s(x)
    assert torch.equal(c0["blocks.0.q_rot"][:, 0], c1["blocks.0.q_rot"][:, 0])
    amap = s.rope_axis_map()
    npt = s.num_prefix_tokens
    q1 = c1["blocks.0.q"][:, 1, npt:]
    col = amap.channels("col")
    torch.testing.assert_close(c1["blocks.0.q_rot"][:, 1, npt:, col], q1[..., col])  # col channels: identity
    assert not torch.allclose(c1["blocks.0.q_rot"][:, 1, npt:, amap.channels("row")], q1[..., amap.channels("row")])


TWINS = [  # (family, timm name, timm kwargs, transformers classifier variant)
    ("dinov2", "vit_small_patch14_dinov2", dict(num_classes=0, init_values=0.5), False),
    ("vit", "vit_small_patch16_224", dict(num_classes=4), True),
    ("deit", "deit_small_distilled_patch16_224", dict(num_classes=0), False),
    ("dinov3", "vit_small_patch16_dinov3", dict(num_classes=0, global_pool="token", init_values=0.5), False),
]


@pytest.mark.parametrize("family,name,kwargs,classifier", TWINS)
def test_timm_and_transformers_twins_agree_on_every_site(family, name, kwargs, classifier):
    import timm

    from vitpos.models.hf_convert import hf_from_timm, hf_to_timm
    from vitpos.models.timm_adapter import surface_for

    torch.manual_seed(0)
    t = timm.create_model(name, img_size=16, patch_size=4, depth=2, embed_dim=32, num_heads=2, **kwargs).eval()
    hf = hf_from_timm(t, family, classifier=classifier)
    back = hf_to_timm(hf.state_dict(), family, classifier=hf.base_model_prefix if classifier else None)
    assert set(back) == set(t.state_dict()) and all(torch.equal(back[k], v) for k, v in t.state_dict().items())
    a, b = surface_for(t, f"timm:{name}"), HFSurface(hf, f"hf:{family}", FAMILIES[family])
    x = images(a)
    diffs = site_differences(a, b, x)
    assert len(diffs) >= 2 * 11 + 2 and max(diffs.values()) <= 1e-5, {k: v for k, v in diffs.items() if v > 1e-5}
    torch.testing.assert_close(a(x), b(x), atol=1e-5, rtol=1e-5)  # logits (vit) or pooled features
    if a.has_rope:
        torch.testing.assert_close(a.rope_table(), b.rope_table(), atol=1e-6, rtol=1e-6)


def test_classifier_variant_outputs_logits():
    s = tiny("vit")
    torch.manual_seed(0)
    c = load_model("hf:ViTForImageClassification?" + tiny_spec("vit").split("?")[1] + "&num_labels=4")
    assert c.num_classes == 4
    x = images(s)
    out = c(x)
    assert out.shape == (2, 4) and torch.equal(out, c.forward_from(0, c.embed_tokens(x)))
    assert c.pooled_features(x).shape == (2, 32)


def test_save_pretrained_folder_and_checkpoint_load_offline(tmp_path):
    s = tiny("dinov2_reg")
    s.model.save_pretrained(tmp_path / "m")
    (tmp_path / "m" / "preprocessor_config.json").write_text(
        '{"image_mean": [0.1, 0.2, 0.3], "image_std": [0.5, 0.5, 0.5], "resample": 2}')
    x = images(s)
    d = load_model(f"hf:{tmp_path / 'm'}")
    assert torch.equal(d(x), s(x))
    assert d.data_config() == {"mean": (0.1, 0.2, 0.3), "std": (0.5, 0.5, 0.5), "interpolation": "bilinear"}
    # the same weights as --checkpoint into a random-init model of the same config
    r = load_model(tiny_spec("dinov2_reg"), checkpoint=tmp_path / "m" / "model.safetensors")
    assert torch.equal(r(x), s(x))


def test_bad_hf_inputs_raise_one_line(tmp_path):
    s = tiny("dinov2")
    s.model.save_pretrained(tmp_path / "m")
    cases = {
        "hf:NoSuchModel": "neither a transformers class vitpos supports",
        "hf:PixtralVisionModel": "has no vitpos surface",
        "hf:facebook/not-cached-anywhere": "local Hugging Face cache",
        "hf:Dinov2Model?hidden_size=banana": "hidden_size=.banana.; it must be a whole number",
        "hf:Dinov2Model?hidden_act=banana": "could not build",
        # issue 49: a one-patch grid (nothing to study) and a negative label count (was read as headless)
        tiny_spec("dinov2", image_size=8, patch_size=8): "gives a 1 x 1 patch grid; a position study needs at least "
                                                          "2 x 2 patches: set image_size to at least 16",
        tiny_spec("dinov2") + "&num_labels=-1": "num_labels=-1; it must be a whole number in 0..",
    }
    for spec, words in cases.items():
        with pytest.raises(VitposError, match=words) as info:
            load_model(spec)
        assert "\n" not in str(info.value)
    with pytest.raises(VitposError, match="does not fit") as info:  # 32-wide weights into a 48-wide config
        load_model(tiny_spec("dinov2", hidden_size=48), checkpoint=tmp_path / "m" / "model.safetensors")
    assert "\n" not in str(info.value)
    (tmp_path / "w.bin").write_bytes(b"x")
    with pytest.raises(VitposError, match="never unpickles"):
        load_model(tiny_spec("dinov2"), checkpoint=tmp_path / "w.bin")


@pytest.mark.parametrize("argv", [
    "eval -m hf:NoSuchModel",
    "eval -m hf:Qwen2VisionTransformerPretrainedModel",
    f"eval -m {tiny_spec('dinov2', hidden_size=48)} --checkpoint {{ckpt}}",
])
def test_cli_bad_hf_input_is_one_error_line(argv, tmp_path, capsys):
    s = tiny("dinov2")
    s.model.save_pretrained(tmp_path / "m")
    args = argv.format(ckpt=tmp_path / "m" / "model.safetensors").split()
    capsys.readouterr()  # save_pretrained's progress bar
    with pytest.raises(SystemExit) as info:
        main(args)
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert info.value.code == 2 and len(err) == 1 and err[0].startswith("error: "), err


def test_models_families_lists_every_family_with_its_gate(capsys):
    main(["models", "--families"])
    out = capsys.readouterr().out
    for fam in FAMILIES.values():
        assert fam.model_cls in out
    assert "timm DINOv3" in out and "FAILS" not in out and out.count("passes") == len(FAMILIES) + 7


@pytest.mark.parametrize("family,name,kwargs", [(f, n, k) for f, n, k, c in TWINS if f in ("dinov2", "dinov3")])
def test_resized_twins_still_agree(family, name, kwargs):
    """at_size at 1.5x: DINOv3's rotary grid is the same in both libraries. DINOv2's resampled APE tables differ
    (timm: bicubic with antialias, PIL's a=-0.5 kernel; transformers: bicubic without, a=-0.75): each library's
    own resize, kept as it is; with transformers' table put into timm, every site agrees again."""
    import timm

    from vitpos.models.hf_convert import hf_from_timm
    from vitpos.models.timm_adapter import surface_for

    torch.manual_seed(0)
    t = timm.create_model(name, img_size=16, patch_size=4, depth=2, embed_dim=32, num_heads=2, **kwargs).eval()
    a = surface_for(t, "timm").at_size(24)
    b = HFSurface(hf_from_timm(t, family), "hf", FAMILIES[family]).at_size(24)
    assert a.grid == b.grid == (6, 6)
    if a.has_ape:
        gap = float((a.patch_pos_embed() - b.patch_pos_embed()).abs().max())
        assert 1e-4 < gap < 0.1 * float(b.patch_pos_embed().abs().max()), gap  # other kernels, the same table
        with torch.no_grad():
            a.model.pos_embed[0, 1:] = b.patch_pos_embed()
    diffs = site_differences(a, b, images(a))
    assert max(diffs.values()) <= 1e-5, {k: v for k, v in diffs.items() if v > 1e-5}
    with pytest.raises(VitposError, match="positive multiple"):
        b.at_size(25)


def test_eager_models_keep_eager_attention():
    """A model set to eager attention runs its family's own eager function (bit for bit) when no pattern is hooked."""
    import transformers

    torch.manual_seed(0)
    model = transformers.Dinov2Model(transformers.Dinov2Config(**FAMILIES["dinov2"].tiny)).eval()
    model.set_attn_implementation("eager")
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(pixel_values=x).last_hidden_state[:, 0]
    s = HFSurface(model, "hf:eager", FAMILIES["dinov2"])
    assert s.attention(0).get_submodule("vitpos_taps").impl == "eager"
    assert torch.equal(s(x), ref)
    assert run_gate("dinov2", "hf:eager", lambda: s).passed


def test_image_transform_uses_the_family_preprocessing():
    from PIL import Image

    s = tiny("clip")
    img = Image.new("RGB", (40, 30), (255, 0, 0))
    t = s.image_transform()(img)
    assert t.shape == (3, 16, 16)
    mean, std = s.data_config()["mean"], s.data_config()["std"]
    assert mean[0] == pytest.approx(0.48145466)  # CLIP's own normalisation, not ImageNet's
    torch.testing.assert_close(t[:, 5, 5], torch.tensor([(1 - mean[0]) / std[0], -mean[1] / std[1], -mean[2] / std[2]]))


# --- every Hugging Face input refused in one line, before the work (issue 49) ---------------------------

@pytest.mark.parametrize(("text", "words"), [
    ('{"image_mean": [0.1, 0.2', "preprocessor_config.json is not valid JSON"),
    ('{"image_mean": "abc", "image_std": [0.5, 0.5, 0.5]}', "key 'image_mean'"),
    ('{"image_mean": [0.1, 0.2, 0.3], "image_std": [0.5, 0, 0.5]}', "key 'image_std.1'"),
    ('{"image_mean": [0.1, 0.2], "image_std": [0.5, 0.5]}', "has 2 values for a model of 3 input channels"),
    ('{"image_mean": [NaN, 0.2, 0.3], "image_std": [0.5, 0.5, 0.5]}', "key 'image_mean.0'"),
    ('[1, 2]', "holds a JSON list"),
])
def test_a_bad_preprocessor_config_is_one_line(text, words, tmp_path):
    s = tiny("dinov2")
    s.model.save_pretrained(tmp_path / "m")
    (tmp_path / "m" / "preprocessor_config.json").write_text(text)
    with pytest.raises(VitposError, match=words) as info:
        load_model(f"hf:{tmp_path / 'm'}")
    assert "\n" not in str(info.value) and "preprocessor_config.json" in str(info.value)


def test_query_keys_are_checked_against_the_config(tmp_path):
    with pytest.raises(VitposError, match="unknown query key bogus_key; the config's keys are .*hidden_size"):
        load_model(tiny_spec("dinov2", bogus_key=1))
    s = tiny("dinov2")
    s.model.save_pretrained(tmp_path / "m")
    with pytest.raises(VitposError, match="unknown query key bogus_key"):
        load_model(f"hf:{tmp_path / 'm'}?bogus_key=1")
    assert load_model(f"hf:{tmp_path / 'm'}?layer_norm_eps=0.001").config.layer_norm_eps == 0.001
    with pytest.raises(VitposError, match="takes no \\?key=value"):  # checked before the cache is looked at
        load_model("hf:facebook/dinov2-small?hidden_size=32")
    with pytest.raises(VitposError, match="num_hidden_layers=0; it must be a whole number in 1..256"):
        load_model(tiny_spec("dinov2", num_hidden_layers=0))
    with pytest.raises(VitposError, match="image_size 2 is smaller than patch_size 4"):
        load_model(tiny_spec("dinov2", image_size=2))
    # a whole number where the config holds a float is that float (DINOv3's config is strict about it)
    assert load_model(tiny_spec("dinov3", rope_theta=100)).config.rope_theta == 100.0


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_weights_are_refused_naming_the_file_and_key(value, tmp_path):
    from safetensors.torch import save_file

    s = tiny("dinov2")
    sd = {k: v.clone().contiguous() for k, v in s.model.state_dict().items()}
    key = "encoder.layer.1.mlp.fc1.weight"
    sd[key][0, 0] = value
    save_file(sd, str(tmp_path / "w.safetensors"))
    with pytest.raises(VitposError, match=f"w.safetensors: tensor '{key}' holds NaN or infinite values"):
        load_model(tiny_spec("dinov2"), checkpoint=tmp_path / "w.safetensors")
    s.model.save_pretrained(tmp_path / "m")
    save_file(sd, str(tmp_path / "m" / "model.safetensors"))
    with pytest.raises(VitposError, match=f"model.safetensors: tensor '{key}'"):
        load_model(f"hf:{tmp_path / 'm'}")


def test_a_classifier_is_scored_only_on_its_own_classes(tmp_path, capsys):
    import transformers

    from vitpos.data import dataset_info

    torch.manual_seed(0)
    labels = {0: "cat", 1: "dog", 2: "car", 3: "ship"}
    cfg = transformers.ViTConfig(**FAMILIES["vit"].tiny, id2label=labels, label2id={v: k for k, v in labels.items()})
    transformers.ViTForImageClassification(cfg).save_pretrained(tmp_path / "m")
    s = load_model(f"hf:{tmp_path / 'm'}")
    assert s.num_classes == 4 and s.trained_classes == ("cat", "dog", "car", "ship")
    assert "not those of shapes" in (s.classifier_problem(dataset_info("shapes"), "shapes") or "")
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        main(["eval", "-m", f"hf:{tmp_path / 'm'}", "--data", "shapes", "--limit", "4", "--out", str(tmp_path / "o")])
    cap = capsys.readouterr()
    err = [line for line in cap.err.splitlines() if line.strip()]
    assert info.value.code == 2 and len(err) == 1 and err[0].startswith("error: "), err
    assert "top-1" not in cap.out and not (tmp_path / "o").exists()
    # transformers' placeholder names (LABEL_0, ...) say nothing about the classes: the count decides, as before
    plain = load_model("hf:ViTForImageClassification?" + tiny_spec("vit").split("?")[1] + "&num_labels=4")
    assert plain.trained_classes is None


def test_weights_of_another_shape_than_the_config_name_the_tensor_and_both_shapes(tmp_path, capsys):
    """A save_pretrained folder whose config.json was edited after the weights (image_size doubled: the
    position table of the file no longer fits) is one error line naming the tensor and both shapes, not
    transformers' traceback telling to set `ignore_mismatched_sizes`."""
    import json

    tiny("dinov2").model.save_pretrained(tmp_path / "m")
    cfg = tmp_path / "m" / "config.json"
    doc = json.loads(cfg.read_text())
    grid = doc["image_size"] // doc["patch_size"]
    doc["image_size"] *= 2
    cfg.write_text(json.dumps(doc))
    capsys.readouterr()  # save_pretrained's progress bar
    with pytest.raises(SystemExit) as info:
        main(["eval", "-m", f"hf:{tmp_path / 'm'}", "--data", "shapes", "--limit", "4"])
    captured = capsys.readouterr()
    err = [line for line in captured.err.splitlines() if line.strip()]
    assert info.value.code == 2 and len(err) == 1 and not captured.out.strip(), (err, captured.out)
    assert err[0] == (f"error: hf:{tmp_path / 'm'}: weight 'embeddings.position_embeddings' has shape "
                      f"[1, {grid ** 2 + 1}, 32] in model.safetensors but the config implies "
                      f"[1, {(2 * grid) ** 2 + 1}, 32]; fix config.json or re-save the weights")
    assert "ignore_mismatched_sizes" not in captured.err


def test_a_resample_code_vitpos_does_not_apply_is_refused_not_ignored(tmp_path):
    """preprocessor_config.json's `resample`: 0 / 2 / 3 are applied; PIL's lanczos (1), box (4), hamming (5)
    and codes PIL lacks were silently replaced by the family's bicubic (issue 49): refused, naming the key."""
    tiny("dinov2").model.save_pretrained(tmp_path / "m")
    pre = tmp_path / "m" / "preprocessor_config.json"
    for code, words in ((1, "is 1 (PIL's lanczos, which vitpos does not apply)"), (99, "is 99 (no PIL resampling")):
        pre.write_text(f'{{"resample": {code}}}')
        with pytest.raises(VitposError, match=r"preprocessor_config.json: key 'resample' " + re.escape(words)) as e:
            load_model(f"hf:{tmp_path / 'm'}")
        assert str(e.value).endswith("set it to one of 0 (nearest), 2 (bilinear), 3 (bicubic), or remove the key to "
                                     "use the family's own")
    pre.write_text('{"resample": 0}')
    assert load_model(f"hf:{tmp_path / 'm'}").data_config()["interpolation"] == "nearest"


def test_a_path_that_is_no_folder_is_not_looked_up_in_the_hub_cache(tmp_path):
    """hf:FILE and hf:/missing/folder were taken for hub ids (ORG/NAME): the first met transformers'
    torch.load message, the second 'not in the local Hugging Face cache' (issue 49)."""
    tiny("dinov2").model.save_pretrained(tmp_path / "m")
    with pytest.raises(VitposError, match=re.escape(f"config.json is a file; pass the save_pretrained folder holding "
                                                    f"it (hf:{tmp_path / 'm'})")):
        load_model(f"hf:{tmp_path / 'm' / 'config.json'}")
    with pytest.raises(VitposError, match=re.escape(f"no folder {tmp_path / 'gone'}; pass an existing")):
        load_model(f"hf:{tmp_path / 'gone'}")
