"""Partial forwards (ModelSurface.embed_tokens / run_blocks / forward_from) and the shared-prefix
sweeps built on them: equal to the full forward and to the old per-condition path."""

from __future__ import annotations

import pytest
import torch

from conftest import TIMM_TINY, images_for, tiny_own, tiny_timm
from vitpos.errors import VitposError
from vitpos.hooks import capture, edit, remove_rope, zero_ablate

OWN = ("ape", "rope-axial", "rope-mixed", "rope-ape", "none")


def _surfaces():
    return [pytest.param(("own", pe), id=f"own-{pe}") for pe in OWN] + [
        pytest.param(("timm", k), id=f"timm-{k}") for k in TIMM_TINY]


def _load(which):
    kind, name = which
    return tiny_own(name) if kind == "own" else tiny_timm(name)


@pytest.mark.parametrize("which", _surfaces())
def test_forward_from_equals_the_full_forward_bit_for_bit(which):
    s = _load(which)
    x = images_for(s, 4)
    full = s(x)
    with capture(s, "resid_pre") as c:
        s(x)
    assert torch.equal(s.forward_from(0, s.embed_tokens(x)), full)
    for layer in range(s.depth):
        assert torch.equal(s.forward_from(layer, c[f"blocks.{layer}.resid_pre"]), full)
    t = s.embed_tokens(x)
    assert torch.equal(s.run_blocks(t, 0, 1), c["blocks.1.resid_pre"])
    assert torch.equal(s.run_blocks(t, 1, 1), t)
    assert torch.equal(s.forward_from(s.depth, s.run_blocks(t, 0)), full)


@pytest.mark.parametrize("which", _surfaces())
def test_hooks_on_later_blocks_act_in_partial_forwards(which):
    s = _load(which)
    x = images_for(s, 3)
    with capture(s, ["blocks.1.resid_pre"]) as c:
        s(x)
    start = c["blocks.1.resid_pre"]
    ctxs = [lambda: edit(s, {"blocks.1.attn_out": zero_ablate()})]
    if s.has_rope:
        ctxs.append(lambda: remove_rope(s, {"row": [0]}, layers=[1]))
        ctxs.append(lambda: remove_rope(s, {"row": None, "col": [1]}, layers=[1]))
    for make in ctxs:
        with make():
            want, got = s(x), s.forward_from(1, start)
        assert torch.equal(got, want)
        # capturing the pattern switches block 1 to unfused attention, in both paths alike
        with make(), capture(s, ["blocks.1.attn_pattern", "blocks.1.resid_post"]) as got_c:
            got = s.forward_from(1, start)
        with make(), capture(s, ["blocks.1.attn_pattern", "blocks.1.resid_post"]) as want_c:
            want = s(x)
        assert torch.equal(got, want)
        for key in ("blocks.1.attn_pattern", "blocks.1.resid_post"):
            assert torch.equal(got_c[key], want_c[key])
        assert not torch.equal(want, s(x))  # the edit did something


def test_partial_forwards_refuse_bad_inputs():
    s = tiny_own("rope-axial")
    t = s.embed_tokens(images_for(s, 2))
    with pytest.raises(VitposError, match="outside layers"):
        s.run_blocks(t, 1, s.depth + 1)
    with pytest.raises(VitposError, match="does not fit"):
        s.forward_from(0, t[:, 1:])
