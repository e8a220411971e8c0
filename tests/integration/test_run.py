"""`vitpos run`: end to end on tiny models, resume after a killed stage, config errors, the report."""

from __future__ import annotations

import json
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

import vitpos
from conftest import seed_validation
from vitpos.errors import VitposError
from vitpos.study.config import RunConfig, load_config
from vitpos.study.run import run_study
from vitpos.train import train

pytestmark = pytest.mark.slow  # end-to-end `vitpos run`s, in and out of process


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    for pe in ("ape", "rope-axial"):
        train(pe, root / pe, quick=True, progress=False)
    return [str(root / "ape"), str(root / "rope-axial")]


def _cfg(models, **kw) -> RunConfig:
    return load_config(None, {"models": models, **kw}, quick=True)


class _Tags(HTMLParser):
    VOID = {"meta", "img", "br", "hr", "link", "input"}

    def __init__(self):
        super().__init__()
        self.stack, self.errors = [], []

    def handle_starttag(self, tag, attrs):
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(tag)
        else:
            self.stack.pop()


def test_cli_run_quick_end_to_end(tiny_models, tmp_path):
    out = tmp_path / "out"
    seed_validation(out)  # the planted-model table: measured once per session
    proc = subprocess.run([sys.executable, "-m", "vitpos.cli", "run", "--quick", "--no-progress", "--models",
                           ",".join(tiny_models), "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads((out / "results.json").read_text())
    assert set(res["models"]) == set(tiny_models)
    ape, rope = (res["models"][m] for m in tiny_models)
    assert ape["sae"] and ape["ape_permute"] and ape["rope_axis"] is None and "rope_axis" in ape["not_applicable"]
    assert rope["rope_axis"] and rope["rope_heads"] and rope["rope_prefix"] and rope["sae"] is None
    assert ape["rope_prefix"] is None and "rope_prefix" in ape["not_applicable"]
    assert rope["rope_freq"]["splits"] and ape["rope_freq"] is None and "rope_freq" in ape["not_applicable"]
    for doc in (ape["extrapolate"], rope["extrapolate"]):  # --quick: 100 images at 32, 40 and 48 px
        assert [sz["img_size"][0] for sz in doc["sizes"]] == [32, 40, 48] and doc["n_images"] == 100
    assert 0 <= ape["eval"]["top1"] <= 1 and "baseline_top1" in ape["ape_permute"]
    assert [c["id"] for c in res["summary"]["claims"]] == ["C1", "C2", "C3", "C4", "C5"]
    assert all(c["verdict"] in ("supported", "not supported", "partly supported", "inconclusive",
                                  "not applicable")
               for c in res["summary"]["claims"])
    assert res["torch_version"] and res["timm_version"] and res["config"]["seed"] == 0
    page = (out / "report.html").read_text()
    parser = _Tags()
    parser.feed(page)
    assert not parser.errors and not parser.stack
    assert '<table id="headline">' in page
    headline = page.index('<table id="headline">')
    assert page.index('alt="APE vs RoPE at a glance') < headline < page.index("<img", headline)


def test_rerun_skips_and_killed_stage_resumes(tiny_models, tmp_path, monkeypatch):
    cfg = _cfg(tiny_models[1:])
    import vitpos.experiments.rope_heads as rh

    real = rh.run_rope_heads

    def killed(*a, **k):
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(rh, "run_rope_heads", killed)
    logs: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        run_study(tmp_path, cfg, quick=True, progress=False, log=logs.append)
    assert not (tmp_path / "results.json").exists()
    monkeypatch.setattr(rh, "run_rope_heads", real)
    logs.clear()
    res = run_study(tmp_path, cfg, quick=True, progress=False, log=logs.append).to_json()
    cached = [m for m in logs if m.endswith("cached")]
    assert {m.split("] ")[1].split(":")[0] for m in cached} == {"eval", "probe", "rope_axis"}
    heads = res["models"][tiny_models[1]]["rope_heads"]
    assert len(heads["drop_points"]) == 2 and len(heads["drop_points"][0]) == 2  # the resumed stage ran
    logs.clear()
    run_study(tmp_path, cfg, quick=True, progress=False, log=logs.append)
    assert all(m.endswith("cached") for m in logs)  # everything finished: nothing recomputed
    logs.clear()
    run_study(tmp_path, cfg, quick=True, force=True, progress=False, log=logs.append)
    assert not any(m.endswith("cached") for m in logs)


def test_bad_config_names_the_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("probe:\n  imgs: 3\n")
    with pytest.raises(VitposError, match="probe.imgs"):
        load_config(bad, {}, quick=False)
    bad.write_text("rope_heads:\n  axis: diagonal\n")
    with pytest.raises(VitposError, match="rope_heads.axis"):
        load_config(bad, {}, quick=False)
    toml = tmp_path / "ok.toml"
    toml.write_text('data = ["shapes"]\n[probe]\nimages = 300\n')
    assert load_config(toml, {}, quick=False).probe.images == 300
    proc = subprocess.run([sys.executable, "-m", "vitpos.cli", "run", "--config", str(bad),
                           "--out", str(tmp_path / "o")], capture_output=True, text=True)
    assert proc.returncode != 0 and "rope_heads.axis" in proc.stderr and "Traceback" not in proc.stderr


def test_one_writer_per_output_folder(tmp_path):
    from vitpos.io import exclusive_lock

    with exclusive_lock(tmp_path / "out"):
        with pytest.raises(VitposError, match="another `vitpos run` is writing"):
            with exclusive_lock(tmp_path / "out"):
                pass
    with exclusive_lock(tmp_path / "out"):  # released on exit: the next run may write
        pass


def test_imagefolder_fingerprint_follows_the_files(tmp_path):
    from PIL import Image

    from vitpos.data.resolve import data_fingerprint

    for cls in ("cat", "dog"):
        (tmp_path / cls).mkdir()
        for i in range(2):
            Image.new("RGB", (8, 8), (i * 40, 0, 0)).save(tmp_path / cls / f"{i}.png")
    spec = f"imagefolder:{tmp_path}"
    first = data_fingerprint(spec)
    assert data_fingerprint(spec) == first and data_fingerprint("shapes") == ""
    (tmp_path / "dog" / "1.png").unlink()
    assert data_fingerprint(spec) != first  # a deleted image changes the cache key


def test_default_models_are_the_zoo_seed_0_and_quick_is_the_shapes_seed_0():
    """The full run studies seed 0 of each zoo encoding (issue 33), --quick seed 0 of each shapes
    encoding; `--data shapes --model-seeds N` the shapes seeds 0..N-1, each a shipped checkpoint
    with its metrics; more seeds than shipped is refused."""
    from vitpos import zoo
    from vitpos.models import load_model
    from vitpos.study.run import _models_for

    default = [m for m, d in _models_for(load_config(None, {}, quick=False))]
    assert default == [f"builtin:pairs-{e.key}" for e in zoo.ENCODINGS] and len(default) == 7
    assert {d for _, d in _models_for(load_config(None, {}, quick=False))} == {"pairs"}
    full = [m for m, _ in _models_for(load_config(None, {"data": ["shapes"], "model_seeds": 3}, quick=False))]
    assert len(full) == 12 and len(set(full)) == 12
    assert [m for m, _ in _models_for(load_config(None, {}, quick=True))] == full[:4] == [
        "builtin:ape", "builtin:rope-axial", "builtin:rope-mixed", "builtin:none"]
    assert [m for m, _ in _models_for(load_config(None, {"data": ["shapes"], "model_seeds": 2}, quick=False))] == \
        full[:8]
    assert full[4:8] == [m + "-seed1" for m in full[:4]]
    for spec in full + default:
        s = load_model(spec)
        assert s.scheme in ("ape", "rope", "rope+ape", "none"), spec
        metrics = json.loads((Path(vitpos.__file__).parent / "models" / "builtin" / spec.split(":")[1] /
                              "metrics.json").read_text())
        assert metrics["seed"] == (int(spec[-1]) if "-seed" in spec else 0) and metrics["test_top1"] > 0.2
    with pytest.raises(VitposError, match="model_seeds"):
        load_config(None, {"model_seeds": 4}, quick=False)
