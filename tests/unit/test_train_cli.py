"""Own-model training and the CLI in process: bit-exact checkpoints, determinism, resume, `vitpos eval`.
The CLI as a process (one-line errors, reruns) is integration/test_train_cli_process.py."""

from __future__ import annotations

import shutil
import types
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

import vitpos.data as vdata
import vitpos.train as vtrain
from vitpos.cli import app
from vitpos.data import load_split
from vitpos.errors import VitposError
from vitpos.io import read_json
from vitpos.models import load_model
from vitpos.models.checkpoint import read_own_config
from vitpos.models.own import build_own_vit
from vitpos.train import QUICK_LIMITS, QUICK_MODEL, accuracy, train


class _Stop(Exception):
    """Stands in for a kill in the middle of training."""


def _record_losses(monkeypatch, stop_at: int | None = None) -> list[float]:
    """Record every training loss train() computes; raise _Stop at call number `stop_at` (1-based)."""
    losses: list[float] = []
    real = torch.nn.functional.cross_entropy

    def ce(logits, y):
        if stop_at is not None and len(losses) + 1 == stop_at:
            raise _Stop
        loss = real(logits, y)
        losses.append(float(loss.detach()))
        return loss

    monkeypatch.setattr(vtrain, "F", types.SimpleNamespace(cross_entropy=ce))
    return losses


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    # tiny models on a shared CPU: one thread is several times faster than two that contend
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _weights(d: Path) -> dict[str, torch.Tensor]:
    return load_file(str(d / "model.safetensors"))


def _assert_same_tensors(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One quick-trained ape model on shapes, the in-memory model train() saved, and its metrics."""
    out = tmp_path_factory.mktemp("trained") / "ape"
    saved = {}
    real_save = vtrain.save_own_model

    def spy(out_dir, model, cfg, extra=None):
        saved["model"] = model
        real_save(out_dir, model, cfg, extra)

    mp = pytest.MonkeyPatch()
    mp.setattr(vtrain, "save_own_model", spy)
    try:
        metrics = train("ape", out, quick=True, progress=False)
    finally:
        mp.undo()
    return out, saved["model"], metrics


# --- checkpoints, metrics, config ----------------------------------------------------------------

def test_checkpoint_roundtrip_bit_identical(trained):
    out, model, _ = trained
    surface = load_model(str(out))
    loaded = surface.model.state_dict()
    _assert_same_tensors(loaded, _weights(out))
    _assert_same_tensors(loaded, {k: v.detach() for k, v in model.state_dict().items()})
    x, _ = next(load_split("shapes", "test", limit=64).batches(64))
    with torch.no_grad():
        assert torch.equal(surface(x), model.eval()(x))


def test_metrics_and_config_rebuild_the_model(trained):
    out, _, metrics = trained
    m = read_json(out / "metrics.json")
    assert m == metrics
    assert 0.0 <= m["test_top1"] <= 1.0 and 0.0 <= m["val_top1"] <= 1.0
    assert m["epochs"] == 2 and len(m["history"]) == 2 and m["seconds"] >= 0
    assert m["n_train"] == QUICK_LIMITS["train"] and m["n_test"] == QUICK_LIMITS["test"]

    cfg = read_own_config(out)
    assert cfg.pe == "ape" and cfg.img_size == 32 and cfg.num_classes == 4
    assert {k: getattr(cfg, k) for k in QUICK_MODEL} == QUICK_MODEL
    model = build_own_vit(cfg)
    model.load_state_dict(_weights(out), strict=True)
    # the rebuilt model reproduces the recorded test accuracy on the same images
    test = load_split("shapes", "test", limit=QUICK_LIMITS["test"])
    assert accuracy(model, test) == m["test_top1"]


# --- determinism -----------------------------------------------------------------------------------

def test_same_seed_same_data():
    a = load_split("shapes", "train", seed=0, limit=64)
    vdata._shapes_split.cache_clear()  # regenerate rather than hit the cache
    b = load_split("shapes", "train", seed=0, limit=64)
    c = load_split("shapes", "train", seed=1, limit=64)
    assert a is not b
    assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels)
    assert not torch.equal(a.images, c.images)


def test_same_seed_same_first_losses(tmp_path, monkeypatch):
    def first_losses(seed: int, name: str) -> list[float]:
        losses = _record_losses(monkeypatch, stop_at=3)  # loss of step 1 and of step 2 (after one update)
        with pytest.raises(_Stop):
            train("rope-axial", tmp_path / name, seed=seed, quick=True, progress=False)
        return losses

    a, b, c = first_losses(0, "a"), first_losses(0, "b"), first_losses(1, "c")
    assert len(a) == 2 and a == b
    assert a[0] != c[0]


# --- resume and reruns -----------------------------------------------------------------------------

def test_interrupted_run_resumes_bit_identically(tmp_path, monkeypatch):
    full = tmp_path / "full"
    m_full = train("rope-mixed", full, epochs=2, quick=True, progress=False)
    steps = -(-QUICK_LIMITS["train"] // 128)  # steps per epoch at batch 128

    cut = tmp_path / "cut"
    with monkeypatch.context() as mp:
        _record_losses(mp, stop_at=steps + 2)  # killed mid-way through epoch 2
        with pytest.raises(_Stop):
            train("rope-mixed", cut, epochs=2, quick=True, progress=False)
    state = read_json(cut / "checkpoint" / "state.json")
    assert state["epochs_done"] == 1 and not (cut / "metrics.json").exists()

    losses = _record_losses(monkeypatch)
    m_cut = train("rope-mixed", cut, epochs=2, quick=True, progress=False)
    assert len(losses) == steps  # only epoch 2 was trained again
    _assert_same_tensors(_weights(cut), _weights(full))
    _assert_same_tensors(load_file(str(cut / "checkpoint" / "optim.safetensors")),
                         load_file(str(full / "checkpoint" / "optim.safetensors")))

    def drop(m: dict) -> dict:
        return {k: v for k, v in m.items() if k != "seconds"}

    assert drop(m_cut) == drop(m_full)


def test_rerun_is_noop_and_other_config_needs_force(tmp_path, monkeypatch, trained):
    src, _, metrics = trained
    out = tmp_path / "run"
    shutil.copytree(src, out)
    before = (out / "model.safetensors").read_bytes()
    losses = _record_losses(monkeypatch)
    assert train("ape", out, quick=True, progress=False) == metrics
    assert losses == [] and (out / "model.safetensors").read_bytes() == before

    with pytest.raises(VitposError, match="--force"):
        train("ape", out, quick=True, lr=5e-4, progress=False)
    with pytest.raises(VitposError, match="--force"):
        train("none", out, quick=True, progress=False)
    assert read_json(out / "metrics.json") == metrics  # the refused runs changed nothing

    m = train("none", out, quick=True, force=True, progress=False)
    assert len(losses) == 2 * -(-QUICK_LIMITS["train"] // 128)
    assert m["pe"] == "none" and read_own_config(out).pe == "none"


@pytest.mark.parametrize("value", [7.5, float("nan"), -0.1])
def test_rerun_refuses_a_finished_run_whose_metrics_cannot_be_right(tmp_path, monkeypatch, trained, value):
    """A rerun of a finished training reports its metrics.json: a hand-edited top-1 of 7.5 or NaN was
    printed as the result with exit 0."""
    import json

    src, _, _ = trained
    out = tmp_path / "run"
    shutil.copytree(src, out)
    doc = read_json(out / "metrics.json")
    (out / "metrics.json").write_text(json.dumps({**doc, "test_top1": value}))
    before = (out / "metrics.json").read_bytes()
    losses = _record_losses(monkeypatch)
    with pytest.raises(VitposError, match=r"metrics\.json: key 'test_top1'.*--force"):
        train("ape", out, quick=True, progress=False)
    assert losses == [] and (out / "metrics.json").read_bytes() == before


@pytest.mark.parametrize("damage", ["not-utf8", "other-settings"])
def test_rerun_refuses_a_finished_run_whose_train_config_cannot_be_read(tmp_path, monkeypatch, capsys, trained, damage):
    """A finished run whose train_config.json was not UTF-8 (or held other settings) printed the old
    metrics with exit 0: the finished run cannot be checked against the request."""
    import json

    from vitpos.cli import main

    src, _, _ = trained
    out = tmp_path / "run"
    shutil.copytree(src, out)
    cfg = out / "train_config.json"
    if damage == "not-utf8":
        cfg.write_bytes(b"\xff\xfe" + cfg.read_bytes())
    else:
        doc = read_json(cfg)
        doc["train"]["lr"] = 123.0
        cfg.write_text(json.dumps(doc))
    def files():
        return {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}

    before = files()
    losses = _record_losses(monkeypatch)
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--pe", "ape", "--quick", "--out", str(out), "--no-progress"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert exit_info.value.code == 2 and len(err) == 1 and err[0].startswith("error: "), err
    assert "train_config.json" in err[0] and "--force" in err[0], err
    assert losses == [] and files() == before


def test_interrupted_run_with_other_settings_needs_force(tmp_path, monkeypatch):
    out = tmp_path / "cut"
    with monkeypatch.context() as mp:
        _record_losses(mp, stop_at=4)
        with pytest.raises(_Stop):
            train("ape", out, quick=True, progress=False)
    with pytest.raises(VitposError, match="--force"):
        train("ape", out, quick=True, seed=3, progress=False)


# --- CLI -------------------------------------------------------------------------------------------

def test_cli_eval_writes_eval_json(tmp_path, trained):
    src, _, metrics = trained
    res = CliRunner().invoke(app, ["eval", "--model", str(src), "--limit", str(QUICK_LIMITS["test"]),
                                   "--out", str(tmp_path), "--no-progress"])
    assert res.exit_code == 0, res.output
    doc = read_json(tmp_path / "eval.json")
    assert doc["test_top1"] == metrics["test_top1"] and doc["n"] == QUICK_LIMITS["test"]


def _folder_of_pngs(root: Path, size: int, per_class: int = 6) -> None:
    from PIL import Image

    gen = torch.Generator().manual_seed(0)
    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
        for i in range(per_class):
            pixels = torch.randint(0, 256, (size, size, 3), generator=gen, dtype=torch.uint8).numpy()
            Image.fromarray(pixels).save(root / c / f"{i}.png")


def test_cli_train_sizes_and_imagefolder_native_size(tmp_path):
    """An imagefolder of 16-px PNGs trains at 16 px (a 4x4 grid of 4-px patches), not resized to 224;
    the size options reach the saved config; --img-size overrides the images' size."""
    _folder_of_pngs(tmp_path / "imgs", 16)
    out = tmp_path / "m"
    res = CliRunner().invoke(app, ["train", "--pe", "rope-axial", "--data", f"imagefolder:{tmp_path / 'imgs'}",
                                   "--quick", "--epochs", "1", "--embed-dim", "48", "--depth", "3", "--heads", "3",
                                   "--out", str(out), "--no-progress"])
    assert res.exit_code == 0, res.output
    cfg = read_own_config(out)
    assert (cfg.img_size, cfg.patch_size, cfg.embed_dim, cfg.depth, cfg.num_heads) == (16, 4, 48, 3, 3)
    res = CliRunner().invoke(app, ["train", "--pe", "none", "--data", f"imagefolder:{tmp_path / 'imgs'}", "--quick",
                                   "--epochs", "1", "--img-size", "24", "--patch-size", "6", "--out",
                                   str(tmp_path / "m2"), "--no-progress"])
    assert res.exit_code == 0, res.output
    assert read_own_config(tmp_path / "m2").grid == (4, 4)


@pytest.mark.parametrize("argv, needle", [
    (["--embed-dim", "30", "--heads", "4", "--pe", "rope-axial"], "divisible by 4"),
    (["--patch-size", "5", "--pe", "ape"], "not divisible by the patch size"),
    (["--img-size", "24", "--pe", "ape"], "imagefolder data only"),
    (["--ape-init", "zeros", "--pe", "ape"], "unknown --ape-init"),
])
def test_cli_train_refuses_bad_sizes_in_one_line(tmp_path, argv, needle):
    out = tmp_path / "m"
    res = CliRunner().invoke(app, ["train", *argv, "--quick", "--out", str(out), "--no-progress"])
    # In process the error surfaces as a VitposError (cli.main turns it into `error: ...` and exit 2).
    assert isinstance(res.exception, VitposError) and needle in str(res.exception), res.output
    assert not (out / "model.safetensors").exists()


# --- options that would be ignored, or cannot fit, are refused before the work (issue 49) --------------

def _refused(argv: list[str], out: Path) -> str:
    res = CliRunner().invoke(app, ["train", *argv, "--quick", "--epochs", "1", "--out", str(out), "--no-progress"])
    assert isinstance(res.exception, VitposError), res.output
    assert not (out / "model.safetensors").exists() and not (out / "checkpoint").exists()
    return str(res.exception)


def test_ape_init_without_a_learned_table_is_refused(tmp_path):
    for pe in ("ape-sincos", "none", "rope-axial"):
        assert "--pe " + pe + " has none" in _refused(["--pe", pe, "--ape-init", "trunc_normal"], tmp_path / pe)
    # the default is what such a model records anyway (the zoo's recipes pass it): accepted
    from vitpos.train import LEARNED_APE, _data_and_config

    _, _, cfg = _data_and_config("none", "shapes", True, {"ape_init": "sincos"}, QUICK_LIMITS)
    assert cfg.ape_init == "sincos" and "ape" in LEARNED_APE and "ape-sincos" not in LEARNED_APE


def test_tiles_need_the_tiles_as_patches(tmp_path):
    assert "pass --patch-size 14" in _refused(["--pe", "ape", "--data", "tiles"], tmp_path / "t")


def test_a_one_patch_grid_is_refused(tmp_path):
    _folder_of_pngs(tmp_path / "imgs", 1)
    data = f"imagefolder:{tmp_path / 'imgs'}"
    msg = _refused(["--pe", "ape", "--data", data, "--patch-size", "1"], tmp_path / "m")
    assert "1 x 1 patch grid" in msg and "at least 2 x 2" in msg
    # the minimum and the fix, not "pick a patch size that divides" 1 (issue 49): no patch size can
    assert msg.endswith("so images of at least 2 px: pass --img-size 8 (or more) to resize them"), msg
    msg = _refused(["--pe", "ape", "--data", data], tmp_path / "m4")  # the default 4-px patches
    assert "0 x 0 patch grid" in msg and "images of at least 8 px (2 px with 1-px patches)" in msg, msg
    assert msg.endswith("pass --img-size 8 (or more) to resize them") and "divisible" not in msg, msg
    msg = _refused(["--pe", "ape", "--data", data, "--patch-size", "3"], tmp_path / "m3")
    assert msg.endswith("pass --img-size 9 (or more) to resize them"), msg  # 8 is no multiple of 3
    # and the fix works: resized to 8 px, the same folder trains (a 2 x 2 grid)
    res = CliRunner().invoke(app, ["train", "--pe", "ape", "--data", data, "--img-size", "8", "--quick", "--epochs",
                                   "1", "--out", str(tmp_path / "ok"), "--no-progress"])
    assert res.exit_code == 0, res.output
    assert read_own_config(tmp_path / "ok").grid == (2, 2)


def test_a_model_beyond_memory_is_refused_with_the_number(tmp_path):
    msg = _refused(["--pe", "ape", "--embed-dim", "4096", "--depth", "64", "--heads", "64"], tmp_path / "m")
    assert "training a 64-block, 4096-wide model" in msg and "GiB of memory, more than the" in msg


def test_an_out_with_only_metrics_is_not_a_finished_run(tmp_path):
    out = tmp_path / "m"
    out.mkdir()
    (out / "metrics.json").write_text('{"test_top1": 0.99}')
    assert "metrics.json but no config.json" in _refused(["--pe", "none"], out)
    assert (out / "metrics.json").read_text() == '{"test_top1": 0.99}'


def test_an_imagefolder_with_a_symlink_loop_is_refused(tmp_path):
    import os

    from vitpos.data import load_split

    _folder_of_pngs(tmp_path / "imgs", 16)
    os.symlink(tmp_path / "imgs", tmp_path / "imgs" / "a" / "loop")
    with pytest.raises(VitposError, match="through a symbolic link"):
        load_split(f"imagefolder:{tmp_path / 'imgs'}", "train", seed=0)


def test_images_larger_than_an_own_vit_trains_at_are_refused_before_loading(tmp_path):
    """A folder of 1040-px images (over MAX_IMG_SIZE) was a pydantic schema error after the images loaded;
    now one line naming the size and --img-size, and nothing written."""
    from vitpos.train import MAX_IMG_SIZE

    _folder_of_pngs(tmp_path / "imgs", MAX_IMG_SIZE + 16)
    out = tmp_path / "m"
    res = CliRunner().invoke(app, ["train", "--pe", "ape", "--data", f"imagefolder:{tmp_path / 'imgs'}", "--quick",
                                   "--out", str(out), "--no-progress"])
    assert isinstance(res.exception, VitposError), res.output
    assert f"images are {MAX_IMG_SIZE + 16} px" in str(res.exception) and "--img-size" in str(res.exception)
    assert not out.exists()
