"""Shared tiny models: every test model is small enough for a 2-core CPU."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from vitpos.data import fashion
from vitpos.models.own import OwnViTConfig, build_own_vit
from vitpos.models.spec import OwnSurface, load_model
from vitpos.sae import SAEConfig

# Fashion-MNIST tests skip where the Debian package (or $VITPOS_FASHION_DIR) is absent, as the loader looks
needs_fashion = pytest.mark.skipif(not fashion.data_dir().is_dir(), reason="dataset-fashion-mnist not installed")

TINY = dict(img_size=16, patch_size=4, in_chans=3, num_classes=4, embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.0)
# timm models at toy size (pretrained=False): the real timm classes, just small; _Q is their shared size
_Q = "img_size=16&patch_size=4&depth=2&embed_dim=32&num_heads=2&num_classes=4"
TIMM_TINY = {
    "vit": f"timm:vit_small_patch16_224?{_Q}",
    "vit_reg": f"timm:vit_small_patch16_224?{_Q}&reg_tokens=2&no_embed_class=True",
    "deit3": f"timm:deit3_small_patch16_224?{_Q}",
    "rope_axial": f"timm:vit_small_patch16_rope_224?{_Q}&init_values=1.0",
    "rope_mixed": f"timm:vit_small_patch16_rope_mixed_224?{_Q}&init_values=1.0",
    "rope_ape": f"timm:vit_small_patch16_rope_ape_224?{_Q}&init_values=1.0",
    "dinov3": f"timm:vit_small_patch16_dinov3?{_Q}&init_values=1.0",
    "eva02": "timm:eva02_tiny_patch14_224?img_size=28&patch_size=7&depth=2&embed_dim=32&num_heads=2&num_classes=4",
}


def tiny_own(pe: str, seed: int = 0) -> OwnSurface:
    torch.manual_seed(seed)
    cfg = OwnViTConfig(pe=pe, **TINY)
    return OwnSurface(build_own_vit(cfg).eval(), f"tiny:{pe}", cfg)


def tiny_timm(key: str, seed: int = 0):
    torch.manual_seed(seed)
    return load_model(TIMM_TINY[key])


def tiny_surface(which: tuple[str, str]):
    """("own", pe) -> tiny_own(pe); ("timm", key) -> tiny_timm(key): the families tests parametrise over."""
    kind, name = which
    return tiny_own(name) if kind == "own" else tiny_timm(name)


def images_for(surface, n: int = 3, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, *surface.input_size, generator=g)


def permute_patches(images: torch.Tensor, perm: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """Move image patch n to position perm-inverse: output patch m is input patch perm[m]."""
    B, C, Hp, Wp = images.shape
    H, W = grid
    ph, pw = Hp // H, Wp // W
    patches = images.reshape(B, C, H, ph, W, pw).permute(0, 2, 4, 1, 3, 5).reshape(B, H * W, C, ph, pw)
    patches = patches[:, perm]
    return patches.reshape(B, H, W, C, ph, pw).permute(0, 3, 1, 4, 2, 5).reshape(B, C, Hp, Wp)



@pytest.fixture(scope="session", autouse=True)
def _hub_offline():
    """Every test runs as on an offline machine: a hub request (timm `pretrained=True`, a transformers
    hub id) fails at once instead of waiting on the network's retries and timeouts (47 s for one test).
    huggingface_hub reads HF_HUB_OFFLINE into `constants.HF_HUB_OFFLINE` when it is imported, so the
    variable is set for subprocesses and the already-read constant is patched for this process."""
    from huggingface_hub import constants

    mp = pytest.MonkeyPatch()
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.setattr(constants, "HF_HUB_OFFLINE", True)
    yield
    mp.undo()


class PlantedInputs:
    """Each planted case measured once per session at each size (the validation table, the mutation
    test and the power tests read the same cases): `inputs(case, n_images, seeds)` is what
    `case.measure(n_images, seeds)` returns, measured on first use. The RoPE cases take sizes of their
    own whatever they are asked (`validation.table.rope_case`), so they are measured once in all.
    Only for cases as they are: a test that measures under a mutation or a patch calls `measure` itself."""

    def __init__(self) -> None:
        from vitpos.validation.rope_cases import rope_cases
        from vitpos.validation.table import rope_case

        self._sizeless = {rope_case(c).name for c in rope_cases()}
        self._memo: dict[tuple, object] = {}

    def __call__(self, case, n_images: int, seeds: tuple[int, ...]):
        key = (case.name,) if case.name in self._sizeless else (case.name, n_images, tuple(seeds))
        if key not in self._memo:
            self._memo[key] = case.measure(n_images, tuple(seeds))
        return copy.deepcopy(self._memo[key])

    def cached(self, case):
        """`case` whose measure reads this memo (a PlantedCase, as the table's functions take)."""
        from vitpos.validation.ape_cases import PlantedCase

        return PlantedCase(case.name, case.description, dict(case.truth),
                           lambda n, seeds: self(case, n, seeds), case.split)

    def table(self, cases, n_images: int = 300, seeds: tuple[int, ...] = (0, 1)):
        """validation_table(cases, n_images, seeds) from this session's measurements (built-in cases only:
        a registered claim's case is known by its name alone)."""
        from vitpos.validation.table import validation_table

        return validation_table([self.cached(c) for c in cases], n_images=n_images, seeds=seeds)


@pytest.fixture(scope="session")
def planted_inputs() -> PlantedInputs:
    return PlantedInputs()


@pytest.fixture(scope="session", autouse=True)
def _one_validation_table_per_session(planted_inputs):
    """The run's planted-model validation table depends only on the code, the registered claims and its
    sizes (a run caches it under the code's fingerprint); every run_study of a session reads one
    measurement of it, as a run's own cache would, instead of measuring it again for each output
    directory. A test that registers a claim or passes its own cases gets a fresh table."""
    from vitpos.claims.registry import CLAIMS, rule_set
    from vitpos.study import run as study_run
    from vitpos.study.cache import code_fingerprint
    from vitpos.validation.table import CASES, registered_cases

    real = study_run.validation_table
    memo: dict[tuple, object] = {}

    def once(cases=None, n_images=300, seeds=(0, 1)):
        if cases is not None:
            return real(cases, n_images=n_images, seeds=seeds)
        key = (n_images, tuple(seeds), code_fingerprint(), rule_set().digest(), tuple(c.id for c in CLAIMS))
        if key not in memo:  # the built-in cases other tests measured already are not measured again
            builtin = {c.name for c in CASES}
            cases = [planted_inputs.cached(c) if c.name in builtin else c for c in registered_cases()]
            memo[key] = real(cases, n_images=n_images, seeds=seeds)
        return memo[key].model_copy(deep=True)  # type: ignore[attr-defined]

    mp = pytest.MonkeyPatch()
    mp.setattr(study_run, "validation_table", once)
    yield
    mp.undo()

def seed_validation(out: Path) -> None:
    """Put the session's one validation table in `out`'s stage cache, as a run there would have: a
    `vitpos run` in a subprocess (which the session's memo cannot reach) then reads it instead of
    measuring the planted models again. The run's own check (`validation_problem`) still reads it."""
    from vitpos.study import run as study_run
    from vitpos.study.cache import StageCache

    table = study_run.validation_table(n_images=study_run.VALIDATION_IMAGES, seeds=study_run.VALIDATION_SEEDS)
    cache = StageCache(out, False)
    key = study_run._validation_key()  # the key the run looks the table up by
    cache.put(study_run._validation_path(cache, key), key, table.model_dump(mode="json"), 0.0)


@pytest.fixture
def own():
    return tiny_own


def toy_set(n=96, seed=0):
    """n random 16x16 RGB images of 4 classes (the size of the tiny own models)."""
    from vitpos.data import DatasetInfo, TensorImageDataset

    g = torch.Generator().manual_seed(seed)
    info = DatasetInfo(name="toy", num_classes=4, class_names=("a", "b", "c", "d"), image_size=(16, 16), in_chans=3)
    return TensorImageDataset(torch.randint(0, 256, (n, 3, 16, 16), dtype=torch.uint8, generator=g),
                              torch.randint(0, 4, (n,), generator=g), info, "train")


# --- shared by unit/test_runtime.py (one process) and integration/test_distributed.py (2 ranks) ----

def sae_data(n_batches: int = 8, n: int = 256, seed: int = 0) -> list[torch.Tensor]:
    """Sparse combinations of 40 directions in 16-D: latents die at 16x expansion, so AuxK runs."""
    g = torch.Generator().manual_seed(seed)
    basis = torch.randn(40, 16, generator=g)
    out = []
    for _ in range(n_batches):
        z = torch.rand(n, 40, generator=g) * (torch.rand(n, 40, generator=g) < 0.1)
        out.append(z @ basis + 0.01 * torch.randn(n, 16, generator=g))
    return out


SAE_CFGS = {
    "topk": SAEConfig(d_in=16, expansion=16, k=2, dead_steps=256),
    "relu": SAEConfig(arch="relu", d_in=16, expansion=4, l1_coeff=1e-2),
}
SAE_STEPS = 12


CAPTURE_SPEC = "timm:vit_small_patch16_224?img_size=32&patch_size=8&depth=2&embed_dim=32&num_heads=2&num_classes=4"
CAPTURE_ARGS = dict(limit=45, batch_size=16, shard_images=8, progress=False)
CAPTURE_SITES = "resid_post,blocks.0.q"


def capture_surface():
    """A seed-0 tiny timm ViT (CAPTURE_SPEC): the same weights in every process that builds it."""
    from vitpos.models import load_model

    torch.manual_seed(0)
    return load_model(CAPTURE_SPEC)


def assert_same_store(a_dir, b_dir):
    from vitpos.store.reader import ActivationStore

    a, b = ActivationStore(a_dir), ActivationStore(b_dir)
    assert a.meta == b.meta and a.num_images == b.num_images and a.sites == b.sites and a.d == b.d
    la, ia = a.load_labels()
    lb, ib = b.load_labels()
    assert torch.equal(ia, ib) and torch.equal(la, lb) and torch.equal(ia, torch.arange(a.num_images))
    for site in a.sites:
        assert torch.equal(a.load_site(site), b.load_site(site)), site  # bit-exact (float32)
    xa = torch.cat([t[0] for t in a.iter_tokens(a.sites[0], 100)])
    xb = torch.cat([t[0] for t in b.iter_tokens(b.sites[0], 100)])
    assert torch.equal(xa, xb)


@pytest.fixture(scope="module")
def single_store(tmp_path_factory):
    """The single-process reference store every distributed / OOM-retried capture must equal."""
    from vitpos.store.capture import capture_to_store

    out = tmp_path_factory.mktemp("single")
    capture_to_store(capture_surface(), "shapes", "test", CAPTURE_SITES, out, **CAPTURE_ARGS)
    return out


# --- results documents, shared by unit/test_report.py and integration/test_report_browser.py ---------

GOLDEN_PATH = Path(__file__).parent / "golden" / "run_quick_results.json"  # also integration/test_golden_run.py
GOLDEN = json.loads(GOLDEN_PATH.read_text())
XSS = "<script>alert(1)</script>"
XSS_DATA = "imagefolder:/data/cats&dogs<v2>"
APE, ROPE = "builtin:ape", "builtin:rope-axial"
CLAIM_VERDICTS = {"C1": "supported", "C2": "supported", "C3": "supported", "C4": "not supported",
                  "C5": "not applicable"}


def make_results(second_data: str = "shapes") -> dict:
    """A results.json made of real result documents (a quick run of the shipped models), plus a
    model whose name, data and reasons carry markup."""
    from vitpos.study.config import RunConfig

    models = {APE: copy.deepcopy(GOLDEN["models"]["builtin:ape"]),
              ROPE: copy.deepcopy(GOLDEN["models"]["builtin:rope-axial"])}
    models[ROPE]["data"] = second_data
    xss = copy.deepcopy(GOLDEN["models"]["builtin:none"])
    xss["describe"]["spec"] = XSS
    xss["data"] = XSS_DATA
    xss["eval"] = xss["probe"] = None
    xss["not_applicable"] = {"probe": "no patches & <no> grid", "sae": "untrained"}
    models[XSS] = xss
    summary = copy.deepcopy(GOLDEN["summary"])
    for c in summary["claims"]:
        c["verdict"] = CLAIM_VERDICTS[c["id"]]
    return {"vitpos_version": "0.1.0", "torch_version": "2.14.1", "timm_version": "1.0.31",
            "created": "2026-01-01T00:00:00", "seed": 0, "config": RunConfig().model_dump(),
            "reproduce": "vitpos run --config study.yaml", "quick": True, "models": models,
            "summary": summary, "timings": {"probe": 12.5, "sae": 30.25}, "figures": {}}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """make_results() with its figures drawn and the report rendered: (results, figures, page, out)."""
    from vitpos.report.html import render_report
    from vitpos.study.results import StudyResults
    from vitpos.study.run import draw_figures

    out = tmp_path_factory.mktemp("report")
    results = make_results()
    results["figures"] = draw_figures(StudyResults.from_json(results), out)
    figs = {k: out / p for k, p in results["figures"].items()}
    path = render_report(results, out)
    return results, figs, path.read_text(encoding="utf-8"), out
