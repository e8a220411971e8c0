"""`vitpos run`: the whole study on the built-in defaults, cached per stage, resumable, one report.

Stages per model: the experiments of the registry in order (eval, probe, then sae + ape_permute
+ sae_layers for APE models, rope_axis + rope_heads + rope_prefix + rope_freq for RoPE models, extrapolate for
every resizable model); an experiment that does not apply to a model is recorded with its reason.
Each stage's result lives in OUT/stages/<model>/<stage>-<key>.json
(`vitpos.study.cache`): a rerun skips finished stages, an interrupted run resumes at the first
unfinished one, --force recomputes. Figures are drawn once per run, from the results, into
OUT/figures/. Before them, a model whose classifier does not fit the data (a headless backbone, another
class count) gets a head on its pooled features: the one `heads:` names for it, else one fitted as the
cached stage `head` (vitpos.study.head_stage); every top-1 is then measured through it.
SAE layer (documented choice): the layer whose patch tokens hold the most of both
axes by the probes (max of min(row, col) accuracy), last layer excluded, earliest on ties; the
sae_layers stage measures every layer instead, and C1 / C2 read their plausible layers where it ran.
"""

from __future__ import annotations

import datetime as _dt
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

import vitpos
from vitpos import zoo
from vitpos.claims.inputs import model_family
from vitpos.claims.summary import summarise
from vitpos.data import dataset_info
from vitpos.data.base import require_classes
from vitpos.data.resolve import data_fingerprint, dataset_for, require_fit
from vitpos.errors import VitposError
from vitpos.experiments.base import Done, Experiment, Settings, StageInput, StagePlan
from vitpos.experiments.checks import check_head_splits
from vitpos.experiments.registry import BY_NAME, EXPERIMENTS, stage_versions
from vitpos.io import artifact_path, exclusive_lock, relative_artifact, require_out_dir, write_json
from vitpos.models.head import Head, check_head
from vitpos.models.spec import library_versions
from vitpos.models.surface import ModelSurface
from vitpos.results.base import Result
from vitpos.results.validation import ValidationTable
from vitpos.runtime.device import peak_memory_gb
from vitpos.study.cache import StageCache, code_fingerprint, model_fingerprint
from vitpos.study.config import FASHION_MODELS, RunConfig, shapes_models, zoo_models
from vitpos.study.head_stage import HEAD_VERSION, HeadResult
from vitpos.study.plan import (
    BUSY_SHARE,
    Measure,
    PlannedStage,
    StudyPlan,
    Throughput,
    measure_throughput,
    split_sizes,
)
from vitpos.study.results import HEADLINE_FIGURE, ModelDescription, ModelEntry, StudyResults, figure_key, model_slug
from vitpos.study.sanity import retyped, validation_problem
from vitpos.study.validate import check_stage
from vitpos.validation.table import validation_table


def _models_for(cfg: RunConfig) -> list[tuple[str, str]]:
    if cfg.models:
        return [(m, d) for d in cfg.data for m in cfg.models]
    pairs = []
    for d in cfg.data:
        if d == "shapes":
            pairs += [(m, d) for m in shapes_models(cfg.model_seeds)]
        elif d == "fashion":
            pairs += [(m, d) for m in FASHION_MODELS]
        elif d == "pairs":
            pairs += [(m, d) for m in zoo_models(cfg.model_seeds)]
        else:
            raise VitposError(f"no shipped models for --data {d}; pass --models (e.g. timm:NAME) for it")
    return pairs


def _load_inputs(out: Path, cfg: RunConfig
                 ) -> tuple[list[tuple[str, str]], dict[str, ModelSurface], dict[str, str], dict[str, Head]]:
    """Every model, data set and given head, checked before anything is written: a bad one late in
    the list must not cost the stages of the ones before it."""
    from vitpos.models import load_model

    if out.exists() and not out.is_dir():
        raise VitposError(f"--out {out} is a file; pass a directory path")
    surfaces = {}
    fingerprints = {}
    pairs = _models_for(cfg)
    run = dict.fromkeys(s for s, _ in pairs)
    for key, given_for in (("heads", cfg.heads), ("checkpoints", cfg.checkpoints)):
        # with `models` left out the run's models are the shipped ones: an entry for any other is never read
        stray = sorted(set(given_for) - set(run))
        if stray:
            raise VitposError(f"config key '{key}' names {', '.join(stray)}, which is not among the run's models "
                              f"({', '.join(run)}); key each entry by its model spec, or leave it out")
    given: dict[str, Head] = {}
    for spec, data in pairs:
        if spec not in surfaces:
            surfaces[spec] = load_model(spec, pretrained=cfg.pretrained, checkpoint=cfg.checkpoints.get(spec))
        if data not in fingerprints:
            # names the problem with an unknown or empty data set, or one class (every stage's top-1 needs 2)
            require_classes(dataset_info(data), data)
            fingerprints[data] = data_fingerprint(data)
        require_fit(surfaces[spec], data)
        if spec in cfg.heads:  # a given head must fit the model's weights and every data set it is run on
            given.setdefault(spec, Head.load(cfg.heads[spec]))
            check_head(given[spec], surfaces[spec], dataset_info(data), data)
    return pairs, surfaces, fingerprints, given


def _runners(out: Path, cfg: RunConfig, cache: StageCache, quick: bool, progress: bool, timings: dict[str, float],
             log: Callable[[str], None]) -> list[_ModelStages]:
    pairs, surfaces, fingerprints, given = _load_inputs(out, cfg)
    runners = []
    for spec, data in pairs:
        key_spec = spec if len(cfg.data) == 1 or cfg.models is None else f"{spec}@{data}"
        runners.append(_ModelStages(surfaces[spec], spec, key_spec, data, fingerprints[data], cfg, cache, out, quick,
                                    progress, timings, log, given.get(spec)))
    return runners


def plan_study(out: str | Path, cfg: RunConfig, *, quick: bool = False, force: bool = False,
               measure: Measure | None = measure_throughput) -> StudyPlan:
    """What `run_study` with these arguments would compute, per model and stage; writes nothing.
    measure: how to time a model (None: no time estimate)."""
    out = Path(out)
    _check_outputs(out)
    cache = StageCache(out, force)
    return _plan(_runners(out, cfg, cache, quick, False, {}, print), measure, cache)


OUTPUTS = ("results.json", "report.html", "figures", "stages")  # what a run writes at the top of OUT


def _check_outputs(out: Path) -> None:
    """A run writes its results last: a path there of the wrong kind is refused before the first stage."""
    require_out_dir(out)
    for name in OUTPUTS:
        path = out / name
        want_dir = "." not in name
        if path.exists() and path.is_dir() != want_dir:
            kind = "a folder" if path.is_dir() else "a file"
            raise VitposError(f"{path} is {kind}, where the run writes its {name}; move it away and rerun")


def _plan(runners: list[_ModelStages], measure: Measure | None, cache: StageCache) -> StudyPlan:
    plan = StudyPlan(validation_cached=cache.get(_validation_path(cache, _validation_key()),
                                                 validation_problem) is not None)
    measured: dict[str, Throughput] = {}
    per_runner = []
    for runner in runners:
        stages = runner.plan_all()
        runs = measure is not None and any(s.status == "run" for s in stages)
        if measure is not None and runs and runner.spec not in measured:
            measured[runner.spec] = measure(runner.surface)
        problem = runner.data_problem()
        if problem:  # every stage would stop on it: refused before the first
            raise VitposError(f"{runner.spec} on {runner.data}: {' '.join(problem.split())}")
        per_runner.append((runner, stages, runs))
    if measure is not None:
        _retake_starved(measured, {r.spec: r.surface for r in runners}, measure)
    for runner, stages, runs in per_runner:
        if runs:  # a runner whose stages are all cached gets no throughput, even if its model was timed
            plan.throughput[runner.key_spec] = tp = measured[runner.spec]
            for s in stages:
                if s.status == "run" and s.plan is not None:
                    s.seconds = tp.seconds(s.plan)
        plan.stages.extend(stages)
    return plan


def _retake_starved(measured: dict[str, Throughput], surfaces: Mapping[str, ModelSurface], measure: Measure) -> None:
    """Time once more, after the others, the first model timed (the process's first forwards run cold)
    and each model whose timing was starved of CPU, and keep the faster of its two timings. Why: right
    after `pip install` (README command 1) the first model's timing met ~10x slower throughput than its
    twins' seconds later (350 vs 4,000-5,500 image-blocks/s: a 66 min estimate for a 30 min run)."""
    for i, (spec, tp) in enumerate(list(measured.items())):
        if i == 0 or tp.cpu_share < BUSY_SHARE:
            again = measure(surfaces[spec])
            if again.block_s < tp.block_s:
                measured[spec] = again


def run_study(out: str | Path, cfg: RunConfig, *, quick: bool = False, force: bool = False, progress: bool = True,
              reproduce: str | None = None, log: Callable[[str], None] = print,
              measure: Measure | None = measure_throughput) -> StudyResults:
    """measure: times each model for the plan line logged first (None: counts only, no estimate)."""
    out = Path(out)
    _check_outputs(out)
    timings: dict[str, float] = {}
    cache = StageCache(out, force, log)
    runners = _runners(out, cfg, cache, quick, progress, timings, log)
    summary = _plan(runners, measure, cache).summary()  # validates every stage's settings before anything is written
    with exclusive_lock(out):
        t_start = time.time()
        entries: dict[str, ModelEntry] = {}
        log(summary)
        for note in filter(None, (zoo.older_recipe_note(r.spec) for r in runners)):
            log(note)
        for runner in runners:
            entries[runner.key_spec] = runner.run_all()
        return _finish(out, cfg, entries, timings, t_start, quick, reproduce, log, cache)


VALIDATION_IMAGES = 240  # planted test images per validation case (each run re-checks its rules on them)
VALIDATION_SEEDS = (0,)


def _validation_path(cache: StageCache, key: dict) -> Path:
    """The validation table's cache entry: keyed by the code (see `code_fingerprint`) and its sizes."""
    return cache.path("validation", "table", key)


def _validation_key() -> dict:
    return {"stage": "validation", "code": code_fingerprint(), "n_images": VALIDATION_IMAGES,
            "seeds": list(VALIDATION_SEEDS)}


def _validation(cache: StageCache, log: Callable[[str], None]) -> tuple[ValidationTable, float]:
    """The planted-model validation table, from the cache when this code computed it for this output."""
    key = _validation_key()
    path = _validation_path(cache, key)
    doc = cache.get(path, validation_problem)
    if doc is not None:
        try:
            return ValidationTable.model_validate(doc), 0.0
        except ValueError as e:
            cache.damaged(path, str(e))
    log("validation: measuring the verdict rules on the planted models")
    t = time.time()
    table = validation_table(n_images=VALIDATION_IMAGES, seeds=VALIDATION_SEEDS)
    seconds = time.time() - t
    cache.put(path, key, table.model_dump(mode="json"), seconds)
    return table, seconds


def _finish(out: Path, cfg: RunConfig, entries: dict[str, ModelEntry], timings: dict[str, float], t_start: float,
            quick: bool, reproduce: str | None, log: Callable[[str], None], cache: StageCache) -> StudyResults:

    results = StudyResults(
        vitpos_version=vitpos.__version__, torch_version=torch.__version__, timm_version=library_versions()["timm"],
        created=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"), seed=cfg.seed, quick=quick,
        config=cfg, models=entries, timings=timings, reproduce=reproduce or "vitpos run --out OUT",
        summary=summarise(entries))
    results.summary.validation, seconds = _validation(cache, log)
    results.timings["validation"] = round(seconds, 1)
    results.timings["total_this_run"] = round(time.time() - t_start, 1)
    results.figures = draw_figures(results, out, log)
    write_json(out / "results.json", results.to_json())
    return results


def _peak_memory() -> str:
    """The run's peak memory so far, for the stage's log line: which stage sets the peak shows."""
    gb = peak_memory_gb()
    return "" if gb is None else f" (peak memory of the run so far {gb:.2f} GB)"


class _ModelStages:
    """The registry's stages for one model: cached, in order, each given the results before it."""

    def __init__(self, surface: ModelSurface, spec: str, key_spec: str, data: str, data_fp: str, cfg: RunConfig,
                 cache: StageCache, out: Path, quick: bool, progress: bool, timings: dict[str, float],
                 log: Callable[[str], None], given_head: Head | None = None):
        self.surface, self.spec, self.key_spec, self.data, self.cfg = surface, spec, key_spec, data, cfg
        self.given_head = given_head
        self.data_fp = data_fp
        self.cache, self.out, self.quick, self.progress, self.timings, self.log = (
            cache, out, quick, progress, timings, log)
        self.slug = model_slug(key_spec)
        self.fingerprint = model_fingerprint(spec, cfg)

    def _attach_head(self) -> HeadResult | None:
        """Put a head on the surface when its classifier does not fit the data (or `heads:` gives one)."""
        info = dataset_info(self.data)
        n, k = self.surface.num_classes, len(info.class_names)
        if self.surface.classifier_problem(info, self.data) is None:
            reason = None
        elif n <= 0:
            reason = "the model has no classifier (num_classes=0): its outputs are pooled features"
        elif n != k:
            reason = f"the model's classifier has {n} classes, {self.data} has {k}"
        else:
            trained = getattr(self.surface, "trained_data", None)
            reason = (f"the model's classifier was trained on {trained}, not {self.data}" if trained != self.data else
                      f"the model's classifier was trained on other classes than {self.data}'s (its folders changed?)")
        if self.given_head is not None:
            self.surface = self.surface.with_head(self.given_head, info, self.data)
            return HeadResult.of(self.given_head, self.cfg.heads[self.spec], "given",
                                 reason or "given in the run config's heads")
        if reason is None:
            return None
        result, head = self._head_stage(reason)
        self.surface = self.surface.with_head(head, info, self.data)
        return result

    def _head_stage(self, reason: str) -> tuple[HeadResult, Head]:
        from vitpos.analysis.heads import fit_head

        settings = self.cfg.head.model_dump()
        key = self._head_key(settings)
        path = self.cache.path(self.slug, "head", key)
        hit = self._cached_head(key)
        if hit is not None:
            self.log(f"[{self.spec}] head: cached")
            return hit
        self.log(f"[{self.spec}] head ({reason}) ...")
        t0 = time.time()
        head_dir = self.out / "artifacts" / self.slug / "head"
        head = fit_head(self.surface, self.data, n_images=self.cfg.head.images, seed=self.cfg.seed, out=head_dir,
                        progress=self.progress)
        result = HeadResult.of(head, relative_artifact(self.out, head_dir), "fitted", reason)
        secs = time.time() - t0
        self.timings[f"{self.key_spec}/head"] = round(secs, 1)
        self.cache.put(path, key, result.to_json(), secs)
        self.log(f"[{self.spec}] head: val top-1 {result.val_top1:.3f}, test top-1 {result.test_top1:.3f} "
                 f"(l2 {result.l2:g}), done in {secs:.0f} s{_peak_memory()}")
        return result, head

    def _head_key(self, settings: dict) -> dict:
        return {"model": self.fingerprint, "weights": self.surface.weights_digest(), "spec": self.spec,
                "data": self.data, "seed": self.cfg.seed, **({"data_files": self.data_fp} if self.data_fp else {}),
                "stage": "head", "settings": settings, "version": HEAD_VERSION}

    def _cached_head(self, key: dict) -> tuple[HeadResult, Head] | None:
        hit = self.cache.get(self.cache.path(self.slug, "head", key))
        if hit is None:
            return None
        try:
            cached = HeadResult.from_json(hit)
            head = Head.load(artifact_path(self.out, cached.head_dir))
            if head.digest() == cached.digest:
                check_head(head, self.surface, dataset_info(self.data), self.data)
                return cached, head
        except (ValueError, VitposError):
            pass  # an older entry, or its head files are gone or changed: refitted
        return None

    def run_all(self) -> ModelEntry:
        head = self._attach_head()
        done: dict[str, Done] = {}
        not_applicable: dict[str, str] = {}
        computed: set[str] = set()  # stages computed in this run: what reads them is computed too (a cached
        # permutation of an SAE retrained since, its files removed, would be served beside the new SAE)
        for exp in EXPERIMENTS:
            reason = self._why_not(exp, not_applicable)
            if reason is not None:
                not_applicable[exp.name] = reason
                continue
            settings = exp.stage_settings(self.cfg, self.surface, done, self.quick)
            result, fresh = self._stage(exp, settings, done, recompute=any(r in computed for r in exp.requires))
            if fresh:
                computed.add(exp.name)
            done[exp.name] = Done(result, settings)
        return ModelEntry(describe=ModelDescription.model_validate(self.surface.describe()), data=self.data,
                          not_applicable=not_applicable, results={k: d.result for k, d in done.items()}, head=head)

    def _why_not(self, exp: Experiment, not_applicable: Mapping[str, str]) -> str | None:
        """Why `exp` does not run on this model and data (None: it runs): its own reason, else that of a
        stage it requires. The run and its plan ask here, so that they agree."""
        reason = exp.applies_to(self.surface) or exp.applies_to_data(self.data) or exp.disabled(self.cfg)
        if reason is not None:
            return reason
        return next((not_applicable[r] for r in exp.requires if r in not_applicable), None)

    def _key(self, exp: Experiment, settings: Settings, head: str | None) -> dict:
        # the settings' JSON, as the stage settings' dicts were hashed before they were typed: old caches still hit
        return {"model": self.fingerprint, "spec": self.spec, "data": self.data, "seed": self.cfg.seed,
                **({"data_files": self.data_fp} if self.data_fp else {}),
                "stage": exp.name, "settings": settings.model_dump(mode="json"), "versions": stage_versions(exp),
                **({"head": head} if head is not None else {})}

    def _cached(self, exp: Experiment, key: dict) -> Result | None:
        hit = self.cache.get(self.cache.path(self.slug, exp.name, key))
        if hit is None:
            return None
        try:
            result = exp.load(hit)
        except (ValueError, TypeError, KeyError, AttributeError) as e:  # an older result type, or damaged
            self.cache.damaged(self.cache.path(self.slug, exp.name, key), f"not a {exp.name} result: {e}")
            return None
        if not isinstance(result, Result):
            return None
        if (problem := retyped(hit, result.to_json())) is not None:  # a hand edit the lax schema took in
            self.cache.damaged(self.cache.path(self.slug, exp.name, key), problem)
            return None
        return result

    def _plan_head(self, sizes) -> tuple[PlannedStage | None, str | None, bool]:
        """The head stage as _attach_head would run it: (its row, the head's digest when known,
        whether the stages measure through a head)."""
        if self.given_head is not None:
            return None, self.given_head.digest(), True
        if self.surface.classifier_problem(dataset_info(self.data), self.data) is None:
            return None, None, False
        settings = self.cfg.head.model_dump()
        hit = self._cached_head(self._head_key(settings))
        if hit is not None:
            return PlannedStage(self.key_spec, self.data, "head", None, "cached"), hit[1].digest(), True
        check_head_splits(sizes, self.data, self.spec)  # what fit_head would refuse, before the first stage
        n = self.cfg.head.images
        try:
            n_val = sizes.n("val", max(1, n // 4))
            images = sizes.n("train", n) + n_val + sizes.n("test", n_val)
        except ValueError as e:
            return PlannedStage(self.key_spec, self.data, "head", None, "run", f"not counted: {e}"), None, True
        counted = StagePlan.full(images, self.surface.depth) + StagePlan(note="plus the head's own fit")
        return PlannedStage(self.key_spec, self.data, "head", counted, "run", counted.note), None, True

    def plan_all(self) -> list[PlannedStage]:
        """run_all's stages counted, not run: cached ones found by their keys (a stage whose settings
        read earlier results gets the real settings when those are cached, a guess otherwise)."""
        done: dict[str, Done] = {}
        planned: dict[str, Settings] = {}
        not_applicable: dict[str, str] = {}
        sizes = split_sizes(self.data)
        head_row, head_digest, needs_head = self._plan_head(sizes)
        rows = [head_row] if head_row is not None else []
        computed: set[str] = set()  # as run_all: what reads a stage that runs runs too
        for exp in EXPERIMENTS:
            reason = self._why_not(exp, not_applicable)
            if reason is not None:
                not_applicable[exp.name] = reason
                rows.append(PlannedStage(self.key_spec, self.data, exp.name, None, "n/a", reason))
                continue
            if all(r in done for r in exp.requires):
                settings = exp.stage_settings(self.cfg, self.surface, done, self.quick)
            else:
                settings = exp.plan_settings(self.cfg, self.surface, planned, self.quick)
            planned[exp.name] = settings
            check_stage(exp.name, settings, self.surface, self.data, sizes)  # what the stage would refuse
            # a head still to be fitted has no digest yet: nothing measured through it is cached
            result = None if needs_head and head_digest is None else self._cached(
                exp, self._key(exp, settings, head_digest))
            if (result is not None and exp.artifacts_ready(result, self.out)
                    and not any(r in computed for r in exp.requires)):
                done[exp.name] = Done(result, settings)
                rows.append(PlannedStage(self.key_spec, self.data, exp.name, None, "cached"))
                continue
            computed.add(exp.name)
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

    def _stage(self, exp: Experiment, settings: Settings, done: dict[str, Done], recompute: bool = False
               ) -> tuple[Result, bool]:
        """The stage's result, and whether it was computed (not served from the cache)."""
        key = self._key(exp, settings, self.surface.head.digest() if self.surface.head is not None else None)
        path = self.cache.path(self.slug, exp.name, key)
        result = None if recompute else self._cached(exp, key)
        if result is not None:
            if exp.artifacts_ready(result, self.out):
                self.log(f"[{self.spec}] {exp.name}: cached")
                return result, False
            self.log(f"[{self.spec}] {exp.name}: cached, but its files under {self.out / 'artifacts'} are gone or "
                     "damaged: recomputing it")
        self.log(f"[{self.spec}] {exp.name} ...")
        t0 = time.time()
        stage = StageInput(data=self.data, seed=self.cfg.seed, settings=settings, prior=done,
                           out=self.out / "artifacts" / self.slug / exp.name, progress=self.progress,
                           quick=self.quick, root=self.out)
        result = exp.run_stage(self.surface, stage)
        secs = time.time() - t0
        self.timings[f"{self.key_spec}/{exp.name}"] = round(secs, 1)
        self.cache.put(path, key, result.to_json(), secs)
        self.log(f"[{self.spec}] {exp.name}: done in {secs:.0f} s{_peak_memory()}")
        return result, True


def draw_figures(results: StudyResults, out: Path, log: Callable[[str], None] = print) -> dict[str, str]:
    """Every figure the experiments declare, drawn once into OUT/figures/; key -> path relative to OUT."""
    from vitpos import plots

    rel: dict[str, str] = {}
    try:
        path = Path("figures") / f"{HEADLINE_FIGURE}.png"
        plots.plot_headline({spec: e.results for spec, e in results.models.items()}, out / path,
                            families={spec: model_family(spec) for spec in results.models})
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
