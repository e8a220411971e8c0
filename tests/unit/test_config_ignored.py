"""Run-config settings the run would not read are refused, not ignored (issue 49): model_seeds with
models, a model or data set named twice, a checkpoint for a model that is not run, a key given twice;
a byte-order mark before YAML or TOML is not a key."""

from __future__ import annotations

import pytest

from vitpos.errors import VitposError
from vitpos.study.config import load_config


@pytest.mark.parametrize(("text", "overrides", "words"), [
    ("models: [builtin:ape]\n", {"model_seeds": 3}, "model_seeds 3 picks shipped models, but models are given"),
    ("models: [builtin:ape, builtin:none, builtin:ape]\n", {}, "models names builtin:ape more than once"),
    ("data: [shapes, shapes]\n", {}, "data names shapes more than once"),
    ("models: [builtin:ape]\ncheckpoints:\n  timm:vit_small_patch16_224: w.safetensors\n", {},
     "checkpoints names timm:vit_small_patch16_224, which is not among the models"),
    ("models: [builtin:ape]\ncheckpoints:\n  builtin:ape: a.safetensors\n  builtin:ape: b.safetensors\n", {},
     "key 'builtin:ape' is given twice (line 4)"),
    ("models: [builtin:ape]\nseed: 1\nseed: 2\n", {}, "key 'seed' is given twice"),
])
def test_a_setting_the_run_would_ignore_is_refused(text, overrides, words, tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    with pytest.raises(VitposError) as info:
        load_config(path, overrides, quick=False)
    assert words in str(info.value) and "\n" not in str(info.value)
    assert "config key ''" not in str(info.value)  # a check across keys names none


def test_quick_sizes_with_models_are_accepted(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("models: [builtin:ape]\n")
    assert load_config(path, {}, quick=True).models == ["builtin:ape"]  # --quick sets model_seeds 1 itself


@pytest.mark.parametrize("suffix, body", [(".yaml", b"models: [builtin:ape]\nseed: 3\n"),
                                          (".toml", b'models = ["builtin:ape"]\nseed = 3\n')])
def test_a_byte_order_mark_is_read_past(suffix, body, tmp_path):
    path = tmp_path / f"run{suffix}"
    path.write_bytes(b"\xef\xbb\xbf" + body)
    cfg = load_config(path, {}, quick=False)
    assert cfg.models == ["builtin:ape"] and cfg.seed == 3


def test_a_checkpoint_for_a_model_outside_the_shipped_set_is_refused_when_models_are_left_out(tmp_path):
    """With `models` left out the run's models are the shipped ones (`_models_for`): a checkpoint keyed
    by any other spec would never be loaded, so the plan refuses it, as it does with `models` given."""
    from vitpos.study.run import plan_study

    path = tmp_path / "run.yaml"
    path.write_text("checkpoints:\n  bogus-model: w.safetensors\n")
    cfg = load_config(path, {}, quick=True)
    with pytest.raises(VitposError) as info:
        plan_study(tmp_path / "out", cfg, measure=None)
    said = str(info.value)
    assert "config key 'checkpoints' names bogus-model, which is not among the run's models (builtin:" in said
    assert "\n" not in str(info.value) and not (tmp_path / "out").exists()
