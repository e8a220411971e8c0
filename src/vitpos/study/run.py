"""`vitpos run`: the whole study on the built-in defaults, cached per stage, resumable, one report.

Stages per model: the experiments of the registry in order (eval, probe, then sae + ape_permute
for APE models, rope_axis + rope_heads for RoPE models); an experiment that does not apply to a
model is recorded with its reason. Each stage's result lives in OUT/stages/<model>/<stage>-<key>.json
(`vitpos.study.cache`): a rerun skips finished stages, an interrupted run resumes at the first
unfinished one, --force recomputes. Figures are drawn once per run, from the results, into
OUT/figures/. SAE layer (documented choice): the layer whose patch tokens hold the most of both
axes by the probes (max of min(row, col) accuracy), last layer excluded, earliest on ties.
"""

from __future__ import annotations

import datetime as _dt
import time
from collections.abc import Callable
from pathlib import Path

import timm
import torch

import vitpos
from vitpos.data import dataset_info
from vitpos.data.resolve import data_fingerprint, dataset_for
from vitpos.errors import VitposError
from vitpos.experiments.base import Done, Experiment, Result, StageInput
from vitpos.experiments.registry import BY_NAME, EXPERIMENTS
from vitpos.io import exclusive_lock, write_json
from vitpos.models.surface import ModelSurface
from vitpos.study.cache import StageCache, model_fingerprint
from vitpos.study.claims import summarise
from vitpos.study.config import FASHION_MODELS, SHAPES_MODELS, RunConfig
from vitpos.study.plan import Measure, PlannedStage, StudyPlan, Throughput, measure_throughput, split_sizes
from vitpos.study.results import HEADLINE_FIGURE, ModelDescription, ModelEntry, StudyResults, figure_key, model_slug


def _models_for(cfg: RunConfig) -> list[tuple[str, str]]:
    if cfg.models:
        return [(m, d) for d in cfg.data for m in cfg.models]
    pairs = []
    for d in cfg.data:
        if d == "shapes":
            pairs += [(m, d) for m in SHAPES_MODELS]
        elif d == "fashion":
            pairs += [(m, d) for m in FASHION_MODELS]
        else:
            raise VitposError(f"no shipped models for --data {d}; pass --models (e.g. timm:NAME) for it")
    return pairs


def _load_inputs(out: Path, cfg: RunConfig) -> tuple[dict[str, ModelSurface], dict[str, str]]:
    """Every model and data set, checked before anything is written: a bad one late in the list
    must not cost the stages of the ones before it."""
    from vitpos.models import load_model

    if out.exists() and not out.is_dir():
        raise VitposError(f"--out {out} is a file; pass a directory path")
    surfaces = {}
    fingerprints = {}
    for spec, data in _models_for(cfg):
        if spec not in surfaces:
            surfaces[spec] = load_model(spec, pretrained=cfg.pretrained, checkpoint=cfg.checkpoints.get(spec))
        if data not in fingerprints:
            dataset_info(data)  # names the problem with an unknown or empty data set
            fingerprints[data] = data_fingerprint(data)
    return surfaces, fingerprints


def _runners(out: Path, cfg: RunConfig, surfaces: dict[str, ModelSurface], fingerprints: dict[str, str],
             cache: StageCache, quick: bool, progress: bool, timings: dict[str, float],
             log: Callable[[str], None]) -> list[_ModelStages]:
    out_list = []
    for spec, data in _models_for(cfg):
        key_spec = spec if len(cfg.data) == 1 or cfg.models is None else f"{spec}@{data}"
        out_list.append(_ModelStages(surfaces[spec], spec, key_spec, data, fingerprints[data], cfg, cache, out, quick,
                                     progress, timings, log))
    return out_list


def plan_study(out: str | Path, cfg: RunConfig, *, quick: bool = False, force: bool = False,
               measure: Measure | None = measure_throughput) -> StudyPlan:
    """What `run_study` with these arguments would compute, per model and stage; writes nothing.
    measure: how to time a model (None: no time estimate)."""
    out = Path(out)
    surfaces, fingerprints = _load_inputs(out, cfg)
    return _plan(_runners(out, cfg, surfaces, fingerprints, StageCache(out, force), quick, False, {}, print), measure)


def _plan(runners: list[_ModelStages], measure: Measure | None) -> StudyPlan:
    plan = StudyPlan()
    measured: dict[str, Throughput] = {}
    for runner in runners:
        stages = runner.plan_all()
        if measure is not None and any(s.status == "run" for s in stages):
            if runner.spec not in measured:
                measured[runner.spec] = measure(runner.surface)
            plan.throughput[runner.key_spec] = tp = measured[runner.spec]
            for s in stages:
                if s.status == "run" and s.plan is not None:
                    s.seconds = tp.seconds(s.plan)
        problem = runner.data_problem()
        if problem:
            plan.data_problems[runner.key_spec] = problem
        plan.stages.extend(stages)
    return plan


def run_study(out: str | Path, cfg: RunConfig, *, quick: bool = False, force: bool = False, progress: bool = True,
              reproduce: str | None = None, log: Callable[[str], None] = print,
              measure: Measure | None = measure_throughput) -> StudyResults:
    """measure: times each model for the plan line logged first (None: counts only, no estimate)."""
    out = Path(out)
    surfaces, fingerprints = _load_inputs(out, cfg)
    with exclusive_lock(out):
        cache = StageCache(out, force)
        t_start = time.time()
        timings: dict[str, float] = {}
        entries: dict[str, ModelEntry] = {}
        runners = _runners(out, cfg, surfaces, fingerprints, cache, quick, progress, timings, log)
        log(_plan(runners, measure).summary())
        for runner in runners:
            entries[runner.key_spec] = runner.run_all()
        return _finish(out, cfg, entries, timings, t_start, quick, reproduce, log)


def _finish(out: Path, cfg: RunConfig, entries: dict[str, ModelEntry], timings: dict[str, float], t_start: float,
            quick: bool, reproduce: str | None, log: Callable[[str], None]) -> StudyResults:

    results = StudyResults(
        vitpos_version=vitpos.__version__, torch_version=torch.__version__, timm_version=timm.__version__,
        created=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"), seed=cfg.seed, quick=quick,
        config=cfg, models=entries, timings=timings, reproduce=reproduce or "vitpos run --out OUT",
        summary=summarise({k: e.to_json() for k, e in entries.items()}))
    results.timings["total_this_run"] = round(time.time() - t_start, 1)
    results.figures = draw_figures(results, out, log)
    write_json(out / "results.json", results.to_json())
    return results


class _ModelStages:
    """The registry's stages for one model: cached, in order, each given the results before it."""

    def __init__(self, surface: ModelSurface, spec: str, key_spec: str, data: str, data_fp: str, cfg: RunConfig,
                 cache: StageCache, out: Path, quick: bool, progress: bool, timings: dict[str, float],
                 log: Callable[[str], None]):
        self.surface, self.spec, self.key_spec, self.data, self.cfg = surface, spec, key_spec, data, cfg
        self.data_fp = data_fp
        self.cache, self.out, self.quick, self.progress, self.timings, self.log = (
            cache, out, quick, progress, timings, log)
        self.slug = model_slug(key_spec)
        self.fingerprint = model_fingerprint(spec, cfg)

    def run_all(self) -> ModelEntry:
        done: dict[str, Done] = {}
        not_applicable: dict[str, str] = {}
        for exp in EXPERIMENTS:
            reason = exp.applies_to(self.surface)
            if reason is None:
                reason = next((not_applicable[r] for r in exp.requires if r in not_applicable), None)
            if reason is not None:
                not_applicable[exp.name] = reason
                continue
            settings = exp.stage_settings(self.cfg, self.surface, done, self.quick)
            result = self._stage(exp, settings, done)
            if not exp.artifacts_ready(result):  # artifacts removed since: recompute
                result = self._stage(exp, settings, done, recompute=True)
            done[exp.name] = Done(result, settings)
        return ModelEntry(describe=ModelDescription.model_validate(self.surface.describe()), data=self.data,
                          not_applicable=not_applicable, results={k: d.result for k, d in done.items()})

    def _key(self, exp: Experiment, settings: dict) -> dict:
        return {"model": self.fingerprint, "spec": self.spec, "data": self.data, "seed": self.cfg.seed,
                **({"data_files": self.data_fp} if self.data_fp else {}),
                "stage": exp.name, "settings": settings, "vitpos": vitpos.__version__}

    def _cached(self, exp: Experiment, key: dict) -> Result | None:
        hit = self.cache.get(self.cache.path(self.slug, exp.name, key))
        if hit is None:
            return None
        try:
            result = exp.load(hit)
        except ValueError:
            return None  # a cache entry from an older result type: recomputed
        return result if isinstance(result, Result) else None

    def plan_all(self) -> list[PlannedStage]:
        """run_all's stages counted, not run: cached ones found by their keys (a stage whose settings
        read earlier results gets the real settings when those are cached, a guess otherwise)."""
        done: dict[str, Done] = {}
        planned: dict[str, dict] = {}
        not_applicable: dict[str, str] = {}
        sizes = split_sizes(self.data)
        rows = []
        for exp in EXPERIMENTS:
            reason = exp.applies_to(self.surface)
            if reason is None:
                reason = next((not_applicable[r] for r in exp.requires if r in not_applicable), None)
            if reason is not None:
                not_applicable[exp.name] = reason
                rows.append(PlannedStage(self.key_spec, self.data, exp.name, None, "n/a", reason))
                continue
            if all(r in done for r in exp.requires):
                settings = exp.stage_settings(self.cfg, self.surface, done, self.quick)
            else:
                settings = exp.plan_settings(self.cfg, self.surface, planned, self.quick)
            planned[exp.name] = settings
            result = self._cached(exp, self._key(exp, settings))
            if result is not None and exp.artifacts_ready(result):
                done[exp.name] = Done(result, settings)
                rows.append(PlannedStage(self.key_spec, self.data, exp.name, None, "cached"))
                continue
            try:
                counted = exp.plan(settings, self.surface, sizes)
            except ValueError as e:
                rows.append(PlannedStage(self.key_spec, self.data, exp.name, None, "run", f"not counted: {e}"))
                continue
            rows.append(PlannedStage(self.key_spec, self.data, exp.name, counted, "run", counted.note))
        return rows

    def data_problem(self) -> str | None:
        """Why the stages would refuse this model's data (e.g. images of another size), or None."""
        try:
            dataset_for(self.surface, self.data, "test", limit=1)
        except VitposError as e:
            return str(e)
        return None

    def _stage(self, exp: Experiment, settings: dict, done: dict[str, Done], recompute: bool = False) -> Result:
        key = self._key(exp, settings)
        path = self.cache.path(self.slug, exp.name, key)
        result = None if recompute else self._cached(exp, key)
        if result is not None:
            self.log(f"[{self.spec}] {exp.name}: cached")
            return result
        self.log(f"[{self.spec}] {exp.name} ...")
        t0 = time.time()
        stage = StageInput(data=self.data, seed=self.cfg.seed, settings=settings, prior=done,
                           out=self.out / "artifacts" / self.slug / exp.name, progress=self.progress,
                           quick=self.quick)
        result = exp.run_stage(self.surface, stage)
        secs = time.time() - t0
        self.timings[f"{self.key_spec}/{exp.name}"] = round(secs, 1)
        self.cache.put(path, key, result.to_json(), secs)
        self.log(f"[{self.spec}] {exp.name}: done in {secs:.0f} s")
        return result


def draw_figures(results: StudyResults, out: Path, log: Callable[[str], None] = print) -> dict[str, str]:
    """Every figure the experiments declare, drawn once into OUT/figures/; key -> path relative to OUT."""
    from vitpos import plots

    rel: dict[str, str] = {}
    try:
        path = Path("figures") / f"{HEADLINE_FIGURE}.png"
        plots.plot_headline({spec: e.to_json() for spec, e in results.models.items()}, out / path)
        rel[HEADLINE_FIGURE] = path.as_posix()
    except VitposError as err:
        log(f"warning: headline figure skipped: {err}")
    for spec, entry in results.models.items():
        for name, result in entry.results.items():
            if not isinstance(result, Result):
                continue
            for fig in BY_NAME[name].figures(result):
                key = figure_key(spec, fig.name)
                path = Path("figures") / f"{key}.png"
                try:
                    fig.plot(result, out / path)
                except VitposError as err:  # a figure that cannot be drawn is reported, the run goes on
                    log(f"warning: figure {key} skipped: {err}")
                    continue
                rel[key] = path.as_posix()
    return rel
