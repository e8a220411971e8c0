"""rope_prefix: blocking patch -> prefix attention (hooks.block_prefix) and the experiment built on it."""

from __future__ import annotations

import pytest
import torch

from conftest import TIMM_TINY, TINY, images_for, tiny_own, tiny_surface, tiny_timm
from vitpos.data.base import DatasetInfo, TensorImageDataset
from vitpos.errors import VitposError
from vitpos.experiments.common import recovery
from vitpos.experiments.rope_prefix import RopePrefixExperiment, families, prefix_attention, run_rope_prefix
from vitpos.hooks import block_prefix, capture, remove_rope, stack
from vitpos.models.surface import Site

# rope ViT without CLS (average pooling): no prefix tokens
NO_PREFIX = TIMM_TINY["rope_axial"] + "&class_token=False&global_pool=avg"
WITH_PREFIX = [pytest.param(("own", "rope-axial"), id="own-rope-axial"),
               pytest.param(("timm", "rope_axial"), id="timm-rope_axial"),
               pytest.param(("timm", "rope_mixed"), id="timm-rope_mixed"),
               pytest.param(("timm", "eva02"), id="timm-eva02"),
               pytest.param(("timm", "dinov3"), id="timm-dinov3-cls+registers")]


def _no_prefix():
    from vitpos.models import load_model

    torch.manual_seed(0)
    return load_model(NO_PREFIX)


def test_blocking_on_a_model_without_prefix_tokens_is_bit_identical():
    s = _no_prefix()
    assert s.num_prefix_tokens == 0
    x = images_for(s, 4)
    plain = s(x)
    with block_prefix(s):
        blocked = s(x)
    assert torch.equal(plain, blocked)


@pytest.mark.parametrize("which", WITH_PREFIX)
def test_blocking_in_no_layers_is_the_plain_forward(which):
    s = tiny_surface(which)
    x = images_for(s, 4)
    plain = s(x)
    with block_prefix(s, layers=[]):
        none = s(x)
    with block_prefix(s):
        blocked = s(x)
    assert torch.equal(plain, none)
    assert not torch.allclose(plain, blocked)  # blocking in every layer does change the output


@pytest.mark.parametrize("which", WITH_PREFIX)
def test_blocked_patch_queries_give_the_prefix_exactly_zero(which):
    s = tiny_surface(which)
    npt, L = s.num_prefix_tokens, s.depth
    x = images_for(s, 3)
    with capture(s, "attn_pattern") as c:
        s(x)
    clean = {li: c[str(Site(li, "attn_pattern"))] for li in range(L)}
    with block_prefix(s), capture(s, "attn_pattern") as c:
        s(x)
    for li in range(L):
        a = c[str(Site(li, "attn_pattern"))]
        assert torch.all(a[:, :, npt:, :npt] == 0)
        torch.testing.assert_close(a.sum(-1), torch.ones(a.shape[:-1]), rtol=0, atol=1e-5)
    # layer 0 sees the clean input: prefix queries unchanged, patch rows the clean rows renormalised
    a0, c0 = c[str(Site(0, "attn_pattern"))], clean[0]
    assert torch.equal(a0[:, :, :npt], c0[:, :, :npt])
    patch = c0[:, :, npt:, npt:]
    torch.testing.assert_close(a0[:, :, npt:, npt:], patch / patch.sum(-1, keepdim=True))


def test_blocking_from_a_layer_leaves_earlier_layers_alone():
    s = tiny_timm("dinov3")
    x = images_for(s, 3)
    with capture(s, "attn_pattern") as clean:
        s(x)
    with block_prefix(s, layers=[1]), capture(s, "attn_pattern") as c:
        s(x)
    assert torch.equal(c["blocks.0.attn_pattern"], clean["blocks.0.attn_pattern"])
    assert torch.all(c["blocks.1.attn_pattern"][:, :, s.num_prefix_tokens:, :s.num_prefix_tokens] == 0)
    with pytest.raises(VitposError, match="outside"):
        with block_prefix(s, layers=[s.depth]):
            pass


def test_prefix_attention_is_the_captured_mass():
    s = tiny_timm("dinov3")
    x = images_for(s, 3)
    npt = s.num_prefix_tokens
    with capture(s, "attn_pattern") as c:
        s(x)
    want = [float(c[f"blocks.{li}.attn_pattern"][:, :, npt:, :npt].sum(-1).double().mean()) for li in range(s.depth)]
    got = prefix_attention(s, x)
    assert got == pytest.approx(want, rel=1e-6) and all(0 < v < 1 for v in got)


def _rope4(pe: str = "rope-mixed"):
    from vitpos.models.own import OwnViTConfig, build_own_vit
    from vitpos.models.spec import OwnSurface

    torch.manual_seed(0)
    cfg = OwnViTConfig(pe=pe, **{**TINY, "depth": 4})
    s = OwnSurface(build_own_vit(cfg).eval(), f"tiny:{pe}4", cfg)
    with torch.no_grad():  # a strong CLS and sharp attention: the prefix route carries weight
        s.model.cls_token.mul_(3)
        for b in s.model.blocks:
            b.attn.qkv.weight[: 2 * s.width] *= 4
    return s


def _toy(n: int, seed: int = 0, size: int = 16) -> TensorImageDataset:
    info = DatasetInfo(name="toy", num_classes=4, class_names=("a", "b", "c", "d"), image_size=(size, size),
                       in_chans=3)
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n, 3, size, size), generator=g, dtype=torch.uint8)
    return TensorImageDataset(images, torch.randint(0, 4, (n,), generator=g), info, "test")


def _by_hand(s, name: str, R: int, B: int):
    """The hook context a condition's name promises, built without the experiment's code."""
    axes = {"row": ["row"], "col": ["col"], "both": ["row", "col"]}
    parts = name.split("_")
    managers = []
    if parts[0] in ("no", "restore"):
        before = R if parts[0] == "restore" else s.depth
        managers.append(remove_rope(s, dict.fromkeys(axes[parts[1]]), layers=range(before)))
    if parts[-1] == "block":
        managers.append(block_prefix(s, range(R if parts[0] == "restore" else B, s.depth)))
    return stack(*managers)


def test_the_conditions_are_what_they_claim():
    s, data = _rope4(), _toy(80)
    R, B = 2, 1
    doc = run_rope_prefix(s, data, n_images=80, restore_from=R, block_from=B, n_attn_images=8).to_json()
    specs = [spec for parent, kids in families(B, R) for spec in (parent, *(k for k, _ in kids))]
    names = [spec.name for spec in specs]
    assert list(doc["conditions"]) == names and len(names) == 12
    x = torch.cat([b for b, _ in data.batches(80)])
    y = data.labels
    logits = {}
    for spec, name in zip(specs, names, strict=True):
        c = doc["conditions"][name]
        with _by_hand(s, name, R, B):
            logits[name] = s(x)
        with spec.context(s)():
            assert torch.equal(s(x), logits[name]), name
        assert c["top1"] == pytest.approx(float((logits[name].argmax(-1) == y).float().mean()))
        assert c["axis"] == (None if name in ("baseline", "block") else name.split("_")[1])
        assert c["restore_from"] == (R if name.startswith("restore") else None)
        assert c["prefix_blocked_from"] == (None if not name.endswith("block") else R if name.startswith("restore")
                                            else B)
    # blocking changes each condition it is added to
    for open_name in ("baseline", "no_row", "no_col", "no_both", f"restore_row_R{R}", f"restore_col_R{R}"):
        blocked = "block" if open_name == "baseline" else f"{open_name}_block"
        assert not torch.allclose(logits[open_name], logits[blocked])
    # recovery: clean and off references shared by the open and blocked restore conditions
    conds = doc["conditions"]
    for a in ("row", "col"):
        clean, off = conds["baseline"][f"{a}_acc"], conds[f"no_{a}"][f"{a}_acc"]
        for key, cond in (("open", f"restore_{a}_R{R}"), ("blocked", f"restore_{a}_R{R}_block")):
            got = dict(doc["recovery"][a][key])
            ci = got.pop("mean_rec_ci95")
            assert got == recovery(clean, off, conds[cond][f"{a}_acc"], R, doc["layers"])
            assert (ci is None) if got["mean_rec"] is None else ci[0] - 1e-9 <= got["mean_rec"] <= ci[1] + 1e-9


def _leaves(doc, path: str = ""):
    if isinstance(doc, dict):
        return [x for k, v in doc.items() for x in _leaves(v, f"{path}/{k}")]
    if isinstance(doc, list):
        return [x for i, v in enumerate(doc) for x in _leaves(v, f"{path}[{i}]")]
    return [(path, doc)]


@pytest.mark.parametrize("R, B", [(2, 0), (2, 1), (1, 3), (2, 2)])
def test_shared_prefix_gives_the_same_numbers(R, B):
    s, data = _rope4("rope-axial"), _toy(60)
    old = run_rope_prefix(s, data, n_images=60, restore_from=R, block_from=B, n_attn_images=4,
                          shared_prefix=False).to_json()
    new = run_rope_prefix(s, data, n_images=60, restore_from=R, block_from=B, n_attn_images=4).to_json()
    _assert_same(old, new)


def _assert_same(old: dict, new: dict) -> None:
    want, got = _leaves(old), _leaves(new)
    assert [p for p, _ in want] == [p for p, _ in got]
    diffs = [(p, a, b) for (p, a), (_, b) in zip(want, got, strict=True)
             if not (a == b or isinstance(a, float) and isinstance(b, float) and abs(a - b) <= 1e-5)]
    assert not diffs, diffs[:10]


@pytest.mark.parametrize("which", WITH_PREFIX[1:])
def test_runs_on_timm_rope_families(which):
    """naver rope ViTs (axial, mixed), EVA-02 and DINOv3 (CLS + registers): the study's conditions
    run, and the shared-prefix path gives the per-condition path's numbers."""
    s = tiny_surface(which)
    data = _toy(40, size=s.input_size[1])
    new = run_rope_prefix(s, data, n_images=40, n_attn_images=4).to_json()
    old = run_rope_prefix(s, data, n_images=40, n_attn_images=4, shared_prefix=False).to_json()
    _assert_same(old, new)
    assert new["num_prefix_tokens"] == s.num_prefix_tokens and len(new["conditions"]) == 12
    assert len(new["prefix_attention"]) == s.depth and all(0 < v < 1 for v in new["prefix_attention"])


def test_refusals_and_applicability():
    exp = RopePrefixExperiment()
    assert "rotary" in (exp.applies_to(tiny_own("ape")) or "")
    s = _no_prefix()
    assert "prefix" in (exp.applies_to(s) or "")
    assert exp.applies_to(tiny_own("rope-axial")) is None
    with pytest.raises(VitposError, match="no prefix tokens"):
        run_rope_prefix(s, _toy(8), n_images=8)
    rope = tiny_own("rope-axial")
    with pytest.raises(VitposError, match="--block-from 2"):
        run_rope_prefix(rope, _toy(8), n_images=8, block_from=2)
    with pytest.raises(VitposError, match="--restore-from"):
        run_rope_prefix(rope, _toy(8), n_images=8, restore_from=2)


def test_document_figure_and_report_section(tmp_path):
    from vitpos.experiments.registry import BY_NAME
    from vitpos.report.sections import CLAIM_RULES

    s = tiny_own("rope-axial")
    result = run_rope_prefix(s, _toy(40), n_images=40, n_attn_images=4, out=tmp_path)
    assert (tmp_path / "rope_prefix.json").exists()
    assert (tmp_path / "rope_prefix.png").read_bytes().startswith(b"\x89PNG")
    assert RopePrefixExperiment().load(result.to_json()) == result
    html = BY_NAME["rope_prefix"].section(result, CLAIM_RULES)
    assert "restore_row_R1_block" in html and "mean Rec, prefix blocked from R" in html
