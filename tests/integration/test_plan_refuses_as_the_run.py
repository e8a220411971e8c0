"""`vitpos run --plan` exits 2 exactly where the run would refuse (issue 49): every experiment of the
registry has settings its stage refuses, and for each the plan and the run refuse them alike, in one
`error:` line, before the first stage (the run's --out is left as it was: no stages, no activations).

The table is keyed by the registry: an experiment added without a case here fails
`test_every_experiment_has_a_refused_case`. The refusals come from each experiment's `check` (sizes,
data, expansions, splits: vitpos.experiments.checks) or from its settings' schema."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vitpos.cli import main
from vitpos.experiments.registry import EXPERIMENTS

APE, ROPE = "builtin:ape", "builtin:rope-axial"
# experiment -> (model, run-config sections its stage refuses, words of the refusal)
REFUSED: dict[str, list[tuple[str, dict, str]]] = {
    "eval": [(APE, {"eval_images": 0}, "eval_images")],
    "probe": [(APE, {"probe": {"images": 2}}, "probe.images gives 2 images")],
    "sae": [(APE, {"sae": {"data": "nonsense"}}, "sae.data 'nonsense': unknown dataset"),
            (APE, {"sae": {"data": "tiles"}}, "sae.data 'tiles'"),
            (APE, {"sae": {"expansions": [100000]}}, "sae.expansions holds 100000"),
            (APE, {"sae": {"k": 100000}}, "exceeds the dictionary size")],
    "ape_permute": [(APE, {"ape_permute": {"seeds": 101}}, "ape_permute.seeds")],
    "rope_axis": [(ROPE, {"rope_axis": {"restore": [99]}}, "rope_axis.restore"),
                  (ROPE, {"rope_axis": {"images": 2}}, "rope_axis.images gives 2 images")],
    "rope_heads": [(ROPE, {"rope_heads": {"restore_from": 99}}, "rope_heads.restore_from"),
                   (ROPE, {"rope_heads": {"probe_images": 2}}, "rope_heads.probe_images gives 2 images")],
    "rope_prefix": [(ROPE, {"rope_prefix": {"block_from": 99}}, "rope_prefix.block_from"),
                    (ROPE, {"rope_prefix": {"images": 2}}, "rope_prefix.images gives 2 images")],
    "rope_freq": [(ROPE, {"rope_freq": {"windows": [[0, 99]]}}, "rope_freq"),
                  (ROPE, {"rope_freq": {"images": 2}}, "rope_freq.images gives 2 images")],
    "extrapolate": [(APE, {"extrapolate": {"scales": [0.5]}}, "extrapolate.scales")],
    "sae_layers": [(APE, {"sae_layers": {"enabled": True, "k": 100000}}, "exceeds the dictionary size")],
}
CASES = [(name, *case) for name, cases in REFUSED.items() for case in cases]


def _snapshot(out: Path) -> dict[str, str] | None:
    if not out.exists():
        return None
    return {str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(out.rglob("*"))}


def _refused(argv: list[str], out: Path, capsys) -> str:
    """The one `error:` line of a command that must exit 2 and leave `out` as it was."""
    before = _snapshot(out)
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert info.value.code == 2 and len(err) == 1 and err[0].startswith("error: "), (argv, err)
    assert _snapshot(out) == before, argv
    return err[0]


def test_every_experiment_has_a_refused_case():
    assert sorted(REFUSED) == sorted(e.name for e in EXPERIMENTS)


@pytest.mark.parametrize(("experiment", "model", "sections", "words"), CASES,
                         ids=[f"{c[0]}-{json.dumps(c[2], sort_keys=True)}" for c in CASES])
def test_the_plan_refuses_what_the_run_refuses(experiment, model, sections, words, tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text(json.dumps(sections))  # JSON is YAML
    out = tmp_path / "out"
    args = ["--quick", "--no-progress", "--models", model, "--config", str(config), "--out", str(out)]
    planned = _refused(["run", "--plan", *args], out, capsys)
    assert words in planned, planned
    out.mkdir()
    (out / "mine.txt").write_text("kept")  # an --out holding something: left exactly as it was
    ran = _refused(["run", *args], out, capsys)
    assert ran == planned


def test_a_model_needing_a_head_on_data_without_val_images(tmp_path, capsys):
    """builtin:ape's classifier is for shapes: on an image folder it needs a head, fitted on the train
    split and chosen on the val split; an empty val split is refused by the plan and the run alike."""
    rng = np.random.default_rng(0)
    root = tmp_path / "imgs"
    for split, n in (("train", 4), ("val", 0), ("test", 4)):
        for c in ("a", "b"):
            (root / split / c).mkdir(parents=True)
            for i in range(n):
                Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(root / split / c / f"{i}.png")
    out = tmp_path / "out"
    args = ["--quick", "--no-progress", "--models", APE, "--data", f"imagefolder:{root}", "--out", str(out)]
    planned = _refused(["run", "--plan", *args], out, capsys)
    assert "no images for split 'val'" in planned and "needs a head" in planned, planned
    # the model is named (a run may hold several), and the head that would spare the fit (issue 49)
    assert planned.startswith(f"error: {APE} needs a head for imagefolder:{root} (its outputs"), planned
    assert planned.endswith(f"or pass a head for {APE} (heads: {{{APE}: HEAD_DIR}})"), planned
    assert _refused(["run", *args], out, capsys) == planned
