"""`vitpos browse`: a self-contained HTML page to look at every latent of an SAE.

`browse_sae(surface, sae_dir, out)` runs the trained SAE of ``sae_dir`` (``vitpos sae``'s folder)
over the held-out images of its data (the test split, as many images as the SAE was scored on),
collects what each latent does in one bounded-memory pass (`collect`), recomputes the heatmaps of
the top images only, and writes ``out/index.html`` (`page`).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from vitpos.errors import VitposError
from vitpos.io import read_json, require_out_dir, validate_doc
from vitpos.runtime.memory import require_memory
from vitpos.sae.special import OUTLIER_K

PAGE = "index.html"
REWRITE_SAE = "it is not the sae.json of `vitpos sae`; retrain the SAE with `vitpos sae` or restore the file"
Fraction = Annotated[float, Field(ge=0, le=1)]


class BrowseDescription(BaseModel):
    """The keys of sae.json the latent browser reads, typed (`SAEDescription`'s, and more): a missing or
    wrong one is one error line naming sae.json and the key (not a KeyError or an int() ValueError
    halfway through)."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)
    model: str = Field(...)  # required here (the parent allows None: sae.json without it cannot be browsed)
    data: str
    layer: int = Field(ge=0)
    site: Literal["resid_post", "resid_pre", "attn_out", "mlp_out"] = "resid_post"
    row_features: list[Annotated[int, Field(ge=0)]]
    col_features: list[Annotated[int, Field(ge=0)]]
    mixed_features: list[Annotated[int, Field(ge=0)]] = []
    run: dict[str, Any] = {}
    tokens: int = Field(default=0, ge=0)
    arch: str | None = None
    k: int | None = Field(default=None, ge=1)
    d_sae: int | None = Field(default=None, ge=1)
    fvu: float | None = None
    l0: float | None = Field(default=None, ge=0)
    dead_frac: Fraction | None = None
    top1: Fraction | None = None
    top1_spliced: Fraction | None = None
    logit_kl: float | None = None
    outlier_threshold: float | None = Field(default=None, ge=0)
    include_special: bool | None = None
    special_tokens: dict[str, Any] | None = None
    training: dict[str, Any] | None = None
    fidelity: dict[str, Any] | None = None
    sweep: dict[str, Any] | None = None


def sae_doc(sae_dir: str | Path) -> dict[str, Any]:
    d = Path(sae_dir)
    if not (d / "sae.json").is_file() or not (d / "sae.safetensors").is_file():
        raise VitposError(f"{d} is not an SAE folder (no sae.json and sae.safetensors); pass the --out folder of "
                          "`vitpos sae`")
    path = d / "sae.json"
    # one line naming sae.json and the key; the keys it leaves out get their defaults (site: resid_post)
    return validate_doc(BrowseDescription, read_json(path, REWRITE_SAE), path, REWRITE_SAE).model_dump()


def slot_bytes(num_patches: int) -> int:
    """Bytes the browser holds per (latent, top-k slot): its heatmap (float32 per patch), its score,
    image and patch (4 + 8 + 8) and the merge's candidates and sort (about twice those again)."""
    return 4 * num_patches + 3 * 20


def check_sae_owner(sae_dir: str | Path, recorded: str | None, in_weights: str | None, digest: str, spec: str,
                    log: Callable[[str], None]) -> None:
    """The SAE was trained on this model: the weights digest sae.json records (`run.weights`) and the one
    its weights file records must both be the model's. A folder that records none (written before the
    digest was kept) is browsed with a warning."""
    for where, got in (("sae.json", recorded), ("sae.safetensors", in_weights)):
        if got is not None and got != digest:
            raise VitposError(f"{Path(sae_dir) / where} records an SAE of model weights {got}, not those of {spec} "
                              f"({digest}): the SAE was trained on another model; pass the same model, --checkpoint "
                              "and --pretrained as `vitpos sae` (older SAE folders that record no digest are browsed "
                              "with a warning)")
    if recorded is None and in_weights is None:
        log(f"warning: {sae_dir} records no digest of the model it was trained on (an older SAE folder): it is "
            f"browsed on {spec} unchecked")


def _stderr(message: str) -> None:
    print(message, file=sys.stderr)


def browse_sae(surface, sae_dir: str | Path, out: str | Path, *, images: int | None = None, top_k: int = 8,
               doc: dict | None = None, data=None, log: Callable[[str], None] = _stderr) -> dict[str, Any]:
    """Write `out/index.html` for the SAE in `sae_dir` on `surface` (the model it was trained on);
    `data`: the dataset (a name or a dataset object) whose test split it browses (default: the SAE's).
    Returns a summary: page path and bytes, latents, images, seconds, the pass's state bytes.
    Everything is checked before the pass: --out, sae.json, the SAE's model, the memory --top-k needs."""
    from vitpos.browse.collect import collect, heatmaps, thumbnail_pixels
    from vitpos.browse.page import page_data, png_b64, render_page
    from vitpos.data.resolve import dataset_for
    from vitpos.models.surface import Site
    from vitpos.sae import SAE

    t0 = time.time()
    require_out_dir(Path(out))
    if (Path(out) / PAGE).is_dir():
        raise VitposError(f"{Path(out) / PAGE} is a folder, where the page is written; move it away and rerun")
    doc = sae_doc(sae_dir) if doc is None else doc
    run = doc.get("run") or {}
    if doc.get("model") != surface.spec:
        raise VitposError(f"{sae_dir} holds an SAE of {doc.get('model')!r}, not {surface.spec!r}")
    sae = SAE.load(sae_dir)
    recorded = run.get("weights") if isinstance(run, dict) else None
    check_sae_owner(sae_dir, None if recorded is None else str(recorded), sae.model_weights, surface.weights_digest(),
                    surface.spec, log)
    if sae.d_in != surface.width:
        raise VitposError(f"the SAE in {sae_dir} takes width {sae.d_in}, {surface.spec} has {surface.width}")
    for key in ("row_features", "col_features", "mixed_features"):  # latents of this SAE, or another's sae.json
        beyond = [i for i in doc.get(key) or [] if int(i) >= sae.d_sae]
        if beyond:
            raise VitposError(f"{Path(sae_dir) / 'sae.json'}: key {key!r} names latent {beyond[0]}, but the SAE in "
                              f"sae.safetensors has {sae.d_sae} (0..{sae.d_sae - 1}); {REWRITE_SAE}")
    if not 0 <= int(doc["layer"]) < surface.depth:
        raise VitposError(f"{Path(sae_dir) / 'sae.json'}: key 'layer' is {doc['layer']}, outside {surface.spec}'s "
                          f"blocks 0..{surface.depth - 1}; {REWRITE_SAE}")
    if top_k < 1:
        raise VitposError(f"--top-k must be >= 1 (got {top_k})")
    require_memory(sae.d_sae * top_k * slot_bytes(surface.num_patches),
                   f"--top-k {top_k} ({sae.d_sae} latents x {top_k} images x {surface.num_patches} patches)",
                   "pass a smaller --top-k")
    site = Site(int(doc["layer"]), str(doc["site"]))
    n_eval = images if images is not None else max(2, int(doc.get("tokens", 0)) // surface.num_patches or 1000)
    dataset = dataset_for(surface, str(doc["data"]) if data is None else data, "test", limit=n_eval)
    if len(dataset) == 0:
        raise VitposError(f"the test split of {doc['data']} has no images to browse with")
    if images is not None and len(dataset) < images:  # not silently fewer than asked for
        raise VitposError(f"--images {images}: the test split of {doc['data'] if data is None else 'the data'} has "
                          f"{len(dataset)} images; pass --images {len(dataset)} or less")
    col = collect(surface, sae, site, dataset, top_k=top_k)
    F, k = col.top_score.shape
    flat_img = col.top_image.reshape(-1)
    filled = flat_img >= 0
    heat = torch.zeros(F * k, surface.num_patches)
    if bool(filled.any()):
        latents = torch.arange(F).repeat_interleave(k)
        heat[filled] = heatmaps(surface, sae, site, dataset, flat_img[filled], latents[filled])
    winners = sorted(set(flat_img[filled].tolist()))
    thumbs = {i: png_b64(px) for i, px in zip(winners, thumbnail_pixels(dataset, winners), strict=True)}
    special = doc.get("special_tokens") or None
    thr = doc.get("outlier_threshold")
    s = col.scores
    counts = {t: len(getattr(s, f"{t}_features")) for t in ("row", "col", "mixed")}
    fid = doc.get("fidelity") or {}
    meta = {
        "model": surface.spec, "layer": site.layer, "site": site.name, "data": str(doc["data"]),
        "arch": doc.get("arch"), "k": doc.get("k"), "grid": list(surface.grid), "n_images": col.n_images,
        "top_k": k, "fvu": doc.get("fvu"), "l0": doc.get("l0"), "dead_frac": doc.get("dead_frac"),
        "dense_frac": fid.get("dense_frac"), "dense_threshold": fid.get("dense_threshold"),
        "top1": doc.get("top1"), "top1_spliced": doc.get("top1_spliced"), "logit_kl": doc.get("logit_kl"),
        "stability": (fid.get("stability") or {}).get("share_matched"),
        "stability_median_cos": (fid.get("stability") or {}).get("median_cos"),
        "counts": counts, "outlier_threshold": thr, "thresholds": vars(s.thresholds),
        "stability_agreement": _agreement(doc),
        "special": _special_line(special, int(doc["layer"]), doc.get("include_special"),
                                 (doc.get("training") or {}).get("high_norm_factor")),
    }
    class_names: list[str] = [str(c) for c in getattr(dataset.info, "class_names", ()) or ()]
    data = page_data(col, heat, thumbs, meta, class_names, thr)
    path = render_page(data, Path(out) / PAGE)
    return {"page": str(path), "bytes": path.stat().st_size, "latents": F, "images": col.n_images,
            "thumbnails": len(thumbs), "filled_slots": int(filled.sum()), "seconds": round(time.time() - t0, 1),
            "state_bytes": col.peak_state_bytes,
            "counts": counts}


def _agreement(doc: dict) -> list[float | None] | None:
    """[row, col]: the share of this SAE's row (col) latents whose seed-matched latent in the other seed's SAE of
    its size is a row (col) latent (the sae stage's seed grid), None when no grid ran."""
    grid = (doc.get("sweep") or {}).get("stability") or []
    pair = next((m for m in grid if m.get("d_sae") == doc.get("d_sae")), None)
    return None if pair is None else [pair.get("row_agreement"), pair.get("col_agreement")]


def _special_line(special: dict | None, layer: int, included: bool | None, factor: float | None) -> str | None:
    if not isinstance(special, dict):
        return None
    row = next((r for r in special.get("layers", []) if r.get("layer") == layer), None)
    if row is None:
        return None
    prefix = ", ".join(f"{n} {r:.2g}x" for n, r in zip(special.get("prefix", []), row.get("prefix_norm_ratio", []),
                                                       strict=False))
    outl = row.get("outlier_share", 0.0)
    train_k = OUTLIER_K if factor is None else factor
    k = special.get("k")
    held_k = f"{k:g}" if isinstance(k, (int, float)) else "?"
    how = "trained on" if included else "left out of SAE training"
    # the held-out share is measured at the report's factor; training (and the red dashes) use the run's own
    return (f"prefix tokens ({prefix or 'none'} the median patch norm) are not encoded; patch tokens with norm > "
            f"{held_k}x median: {100 * outl:.2f} % of held-out tokens at this layer; tokens with norm > "
            f"{train_k:g}x the median training-token norm are {how} and red-dashed in the images")
