"""Adding an experiment is one module and one registry line (issue 27).

The experiment below is defined here and nowhere else: its settings (the `patch_norm:` config
section and its `--quick` size follow from them), its typed result, `run_stage` (the mean patch-token
norm per layer, measured on the model), `plan`, one figure and its report section. Registered at
run time, it is planned (`vitpos run --plan` lists it), run, cached (a second run says so), given
its figure and section in report.html, and written to results.json; no other file knows it. Its
command (`vitpos patch-norm`) is derived from its settings (issue 45): their defaults, bounds and help."""

from __future__ import annotations

import html
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from pydantic import Field

from vitpos.analysis.forward import capture_layers
from vitpos.cli import main
from vitpos.data.resolve import dataset_for
from vitpos.experiments import registry
from vitpos.experiments.base import Experiment, Figure, Settings, SplitSizes, StageInput, StagePlan
from vitpos.models.surface import ModelSurface, Site
from vitpos.results.base import Result
from vitpos.results.claim_rules import ClaimRules

MODEL = "builtin:ape"
# the built-in stages below --quick's sizes: this test is about the added stage, not theirs
SMALL = {"eval_images": 16, "probe": {"images": 16}, "sae": {"images": 64, "eval_images": 16, "epochs": 1,
                                                                 "expansion": 1, "stability": False, "browse": False},
         "ape_permute": {"images": 8, "seeds": 1}, "extrapolate": {"images": 8}}
MARKER = "patch-norm section from the test module"


class PatchNormSettings(Settings):
    QUICK = {"images": 12}
    images: int = Field(default=200, ge=1, description="test-split images")
    scale: float = Field(default=1.0, gt=0, allow_inf_nan=False, description="factor on the reported norms")


class PatchNormResult(Result):
    n_images: int
    layers: list[int]
    mean_norm: list[float]  # mean L2 norm of the patch tokens after each block, times `scale`
    scale: float


def plot_norms(result: PatchNormResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot(result.layers, result.mean_norm, marker="o")
    ax.set_xlabel("layer")
    ax.set_ylabel("mean patch-token norm")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


class PatchNormExperiment(Experiment[PatchNormResult, PatchNormSettings]):
    name = "patch_norm"
    version = 1
    title = "Patch-token norm per layer (a test's experiment)"
    result_type = PatchNormResult
    settings_type = PatchNormSettings

    def plan(self, settings: PatchNormSettings, surface: ModelSurface, sizes: SplitSizes) -> StagePlan:
        return StagePlan.full(sizes.n("test", settings.images), surface.depth)

    def run_stage(self, surface: ModelSurface, stage: StageInput[PatchNormSettings]) -> PatchNormResult:
        dataset = dataset_for(surface, stage.data, "test", limit=stage.settings.images)
        layers = list(range(surface.depth))
        acts, labels, _ = capture_layers(surface, dataset, [Site(layer, "resid_post") for layer in layers],
                                         check_classifier=False)
        scale = stage.settings.scale
        norms = [scale * float(acts[str(Site(layer, "resid_post"))].norm(dim=-1).mean()) for layer in layers]
        return PatchNormResult(n_images=len(labels), layers=layers, mean_norm=norms, scale=scale)

    def figures(self, result: PatchNormResult) -> list[Figure]:
        return [Figure("patch_norm", "mean patch-token norm per layer", plot_norms)]

    def section(self, result: PatchNormResult, claims: ClaimRules) -> str:
        return f"<p>{MARKER}: {result.n_images} images, last layer {result.mean_norm[-1]:.3f}</p>"


@pytest.fixture
def patch_norm() -> Iterator[PatchNormExperiment]:
    exp = registry.register(PatchNormExperiment())
    try:
        yield exp
    finally:
        registry.unregister(exp.name)


def _rows(text: str) -> dict[str, str]:
    return {line.split()[1]: line for line in text.splitlines() if line.startswith(MODEL)}


def test_an_experiment_from_a_test_module_is_planned_run_cached_and_reported(tmp_path, capsys, monkeypatch,
                                                                               patch_norm):
    from vitpos.study.config import load_config
    from vitpos.study.results import figure_key

    # the planted-model validation table (~30 s a run here) is the claims' business, not this stage's
    monkeypatch.setattr("vitpos.study.run._validation", lambda cache, log: (None, 0.0))

    assert load_config(None, {}, quick=True).section("patch_norm") == PatchNormSettings(images=12)  # --quick size
    config = tmp_path / "run.yaml"
    config.write_text(json.dumps({**SMALL, "patch_norm": {"images": 10}}))  # JSON is YAML
    out = tmp_path / "out"
    args = ["run", "--quick", "--no-progress", "--models", MODEL, "--config", str(config), "--out", str(out)]

    main(["run", "--plan", *args[1:]])  # listed by the CLI, before anything ran
    rows = _rows(capsys.readouterr().out)
    assert rows["patch_norm"].split()[2] == "10"  # 10 image-forwards: its config section, counted by its plan
    assert "n/a" not in rows["patch_norm"]

    main(args)
    text = capsys.readouterr()
    assert "[builtin:ape] patch_norm ..." in text.out + text.err
    doc = json.loads((out / "results.json").read_text())
    result = PatchNormResult.from_json(doc["models"][MODEL]["patch_norm"])
    assert result.n_images == 10 and result.layers == list(range(len(result.mean_norm)))
    assert all(torch.isfinite(torch.tensor(result.mean_norm))) and min(result.mean_norm) > 0
    assert doc["config"]["patch_norm"] == {"images": 10, "scale": 1.0}
    page = html.unescape((out / "report.html").read_text())
    assert patch_norm.title in page and f"{MARKER}: 10 images" in page
    figure = doc["figures"][figure_key(MODEL, "patch_norm")]
    assert (out / figure).read_bytes().startswith(b"\x89PNG") and f"{MODEL}: mean patch-token norm per layer" in page

    main(args)  # the second run finds the stage in the cache
    text = capsys.readouterr()
    assert "[builtin:ape] patch_norm: cached" in text.out + text.err
    main(["run", "--plan", *args[1:]])
    assert _rows(capsys.readouterr().out)["patch_norm"].rstrip().endswith("cached")


def test_register_refuses_what_would_break_the_config_or_the_order():
    class Clash(PatchNormExperiment):
        name = "probe"

    class Needs(PatchNormExperiment):
        name = "needs_missing"
        requires = ("no_such_experiment",)

    class Reserved(PatchNormExperiment):
        name = "models"

    for exp in (Clash(), Needs(), Reserved()):
        with pytest.raises(ValueError):
            registry.register(exp)
    assert "needs_missing" not in registry.names()


@pytest.fixture
def patch_norm_command(patch_norm: PatchNormExperiment) -> Iterator[str]:
    """`vitpos patch-norm`, added to the CLI from this module (and removed after the test)."""
    from vitpos.cli import app
    from vitpos.commands.options import experiment_command

    before = list(app.registered_commands)
    try:
        yield experiment_command(app, patch_norm)
    finally:
        app.registered_commands[:] = before


def _one_error(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert exit_info.value.code == 2 and len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_an_experiment_gets_a_command_from_its_settings(tmp_path, capsys, patch_norm_command):
    base = [patch_norm_command, "-m", MODEL, "--no-progress"]
    main([patch_norm_command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--images" in text and "test-split images" in text and "--scale" in text and "reported norms" in text

    main([*base, "--out", str(tmp_path / "default")])  # the settings' defaults
    default = PatchNormResult.from_json(json.loads((tmp_path / "default" / "patch_norm.json").read_text()))
    assert (default.n_images, default.scale) == (PatchNormSettings().images, PatchNormSettings().scale) == (200, 1.0)
    assert (tmp_path / "default" / "patch_norm.png").read_bytes().startswith(b"\x89PNG")

    main([*base, "--out", str(tmp_path / "given"), "--images", "6", "--scale", "2.5"])  # the options reach the stage
    given = PatchNormResult.from_json(json.loads((tmp_path / "given" / "patch_norm.json").read_text()))
    assert (given.n_images, given.scale) == (6, 2.5)

    # out of the settings' bounds: refused before any work, naming the option, nothing written
    for option, value in (("--images", "0"), ("--scale", "0"), ("--scale", "nan"), ("--images", "x")):
        out = tmp_path / f"bad{option}{value}"
        assert option in _one_error([*base, "--out", str(out), option, value], capsys)
        assert not out.exists() or not any(out.iterdir())


def test_the_commands_options_default_to_the_experiments_settings():
    """The per-experiment commands (`vitpos sae`, `vitpos intervene rope-heads`, ...) are generated from
    their experiments' settings (`vitpos.commands.options`): each default and lower bound of an option
    named like a settings field must equal the settings' own, so a command that sets one by hand
    (or a generator that drops one) fails here."""
    import typer.main
    from annotated_types import Ge

    from vitpos.cli import app
    from vitpos.experiments.registry import BY_NAME
    from vitpos.study.config import HeadStage

    root = typer.main.get_command(app)
    commands = {"probe": "probe", "sae": "sae", "extrapolate": "extrapolate", "intervene ape-permute": "ape_permute",
                "intervene rope-axis": "rope_axis", "intervene rope-heads": "rope_heads",
                "intervene rope-prefix": "rope_prefix", "intervene rope-freq": "rope_freq", "head": None}
    renamed: dict[str, str] = {}
    mismatched = []
    compared = 0
    for path, name in commands.items():
        cmd = root
        for part in path.split():
            cmd = cmd.commands[part]  # type: ignore[attr-defined]
        settings = HeadStage if name is None else BY_NAME[name].settings_type
        assert settings is not None
        for param in cmd.params:
            field = settings.model_fields.get(renamed.get(param.name or "", param.name or ""))
            if field is None or param.required or param.name == "data":  # --data: the run's data, not sae.data
                continue
            if param.default != field.default:
                mismatched.append(f"{path} --{param.name}: {param.default!r} != {field.default!r}")
            ge = next((m.ge for m in field.metadata if isinstance(m, Ge)), None)
            low = getattr(param, "min", None)
            if ge is not None and low is not None and low != ge:
                mismatched.append(f"{path} --{param.name}: min {low} != ge {ge}")
            compared += 1
    assert not mismatched
    assert compared >= 20
