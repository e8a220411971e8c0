"""`CaptureCache` is a Mapping whose every method agrees: a dict subclass that kept its batches
outside dict storage answered `[]` while `get`, `items`, `len` and iteration saw nothing."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
import torch

from conftest import tiny_own
from vitpos.hooks import capture


def _read_every_way(cache: Mapping[str, torch.Tensor]) -> dict[str, object]:
    return {"len": len(cache), "iter": list(cache), "keys": list(cache.keys()), "in": [k in cache for k in cache],
            "items": [k for k, _ in cache.items()], "values": len(list(cache.values())), "dict": sorted(dict(cache))}


def test_every_mapping_method_sees_what_was_captured():
    surface = tiny_own("ape")
    sites = ["blocks.0.resid_post", "blocks.1.resid_post", "pos_embed"]
    x = torch.randn(3, 3, 16, 16)
    with capture(surface, sites) as cache:
        assert isinstance(cache, Mapping)
        assert list(cache) == ["pos_embed"]  # a table is there at once; activations after a forward
        assert cache.get("blocks.0.resid_post") is None and "blocks.0.resid_post" not in cache
        surface(x)
        surface(x[:2])
        expect = sorted(sites)
        seen = _read_every_way(cache)
        assert seen == {"len": 3, "iter": expect, "keys": expect, "in": [True] * 3, "items": expect, "values": 3,
                        "dict": expect}
        for k, v in cache.items():
            assert torch.equal(v, cache[k]) and torch.equal(v, cache.get(k))  # type: ignore[arg-type]
        assert cache["blocks.1.resid_post"].shape[0] == 5  # both forwards, concatenated
        assert dict(cache).keys() == set(expect)
        assert cache.get("blocks.9.resid_post", "absent") == "absent"
        with pytest.raises(KeyError, match="was not captured"):
            cache["blocks.9.resid_post"]


def test_pop_batch_empties_a_key_for_every_method():
    surface = tiny_own("ape")
    with capture(surface, ["blocks.0.resid_post"]) as cache:
        surface(torch.randn(2, 3, 16, 16))
        assert cache.pop_batch("blocks.0.resid_post").shape[0] == 2
        assert len(cache) == 0 and list(cache.items()) == [] and "blocks.0.resid_post" not in cache
        assert cache.get("blocks.0.resid_post") is None
        surface(torch.randn(4, 3, 16, 16))
        assert len(cache) == 1 and cache["blocks.0.resid_post"].shape[0] == 4  # only what came after the pop
