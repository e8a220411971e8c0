"""A second `vitpos run` of the same command serves every stage from its cache, also on a headless
model whose SAE trains on unlabelled natural crops (DINOv2's study): such an SAE has no top-1, and a
result JSON that left the None out never loaded back, so each resume retrained the SAE (19 min on
DINOv2-S/14) and everything after it."""

from __future__ import annotations

import json

import pytest

from vitpos.cli import main

SPEC = "timm:vit_small_patch14_dinov2?img_size=224&depth=2&embed_dim=32&num_heads=2&num_classes=0"
SMALL = {"eval_images": 16, "head": {"images": 32}, "probe": {"images": 16},
         "sae": {"data": "natural", "images": 16, "eval_images": 8, "epochs": 1, "expansion": 1,
                 "stability": False, "seeds": 2},
         "ape_permute": {"images": 8, "seeds": 1}}


def _stages(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if line.startswith(f"[{SPEC}] "):
            stage, _, rest = line.removeprefix(f"[{SPEC}] ").partition(" ")
            out[stage.rstrip(":")] = "cached" if rest == "cached" else "run"
    return out


def test_every_stage_of_a_headless_model_on_natural_crops_resumes_from_the_cache(tmp_path, capsys, monkeypatch):
    pytest.importorskip("skimage")
    monkeypatch.setattr("vitpos.study.run._validation", lambda cache, log: (None, 0.0))
    config = tmp_path / "run.yaml"
    config.write_text(json.dumps(SMALL))  # JSON is YAML
    args = ["run", "--quick", "--no-progress", "--models", SPEC, "--data", "tiles", "--config", str(config),
            "--out", str(tmp_path / "out")]
    main(args)
    first = _stages(capsys.readouterr().err)
    assert {"head", "sae", "ape_permute"} <= first.keys() and set(first.values()) == {"run"}
    main(args)
    text = capsys.readouterr()
    again = _stages(text.out + text.err)
    assert again.keys() == first.keys() and set(again.values()) == {"cached"}, again
    assert "damaged" not in text.out + text.err
    # C1's causal check reads the labelled task (the SAE's natural crops have no labels): its top-1 is measured
    sae = json.loads((tmp_path / "out" / "results.json").read_text())["models"][SPEC]["sae"]
    assert sae["data"] == "natural" and sae["top1"] is None
    assert sae["causal"]["data"] == "tiles" and sae["causal"]["clean_top1"] is not None
    report = (tmp_path / "out" / "report.html").read_text()
    assert "causal check read</td><td>tiles held-out images (labelled; the SAE&#x27;s own have no labels)" in report
    # the seed grid (sae.seeds 2) reaches the report and the latent browser's header (the page is written after
    # the grid, from the stage's result: sae.json alone has no grid)
    assert "<h4>seeds × dictionary sizes</h4>" in report and len(sae["sweep"]["stability"]) == 1
    page = (tmp_path / "out" / sae["browser"]).read_text()
    meta = json.loads(page.split('id="data">', 1)[1].split("</script>", 1)[0].replace("<\\/", "</"))["meta"]
    pair = sae["sweep"]["stability"][0]
    assert meta["stability_agreement"] == [pair["row_agreement"], pair["col_agreement"]]
