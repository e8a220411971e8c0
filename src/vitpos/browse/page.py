"""The latent browser: one self-contained HTML page (no network, no server).

Everything the page shows sits in one JSON block inside the page (``<script type="application/json">``,
with ``<``, ``>`` and ``&`` written as JSON escapes so no string can close the block); the inline
script builds the table and the latent view from it with ``textContent`` only, never HTML from
data; the few server-side strings go through ``html.escape``. Images are small PNG thumbnails,
base64 inline, each image once however many latents it wins; heatmaps and row x column maps are
drawn on canvases from quantised values (one character per patch, 64 levels), so a 4 096-latent
SAE stays a few MB (README: "Browse latents").
"""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from vitpos.io import atomic_path

LEVELS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz-_"  # 64 levels, one char each
THUMB_MAX = 96  # longest side of a thumbnail, pixels (smaller images keep their size)
TYPE_ORDER = ("row", "col", "mixed", "content", "rare", "dead")


def quantise(values: Tensor, top: float) -> str:
    """Values in [0, top] as one LEVELS character each (negative values clamp to 0)."""
    if top <= 0:
        return LEVELS[0] * values.numel()
    q = (values.reshape(-1).float() / top * (len(LEVELS) - 1)).round().clamp(0, len(LEVELS) - 1).to(torch.long)
    return "".join(LEVELS[i] for i in q.tolist())


def png_b64(pixels: Tensor) -> str:
    """uint8 (H, W, 3) -> base64 PNG, downscaled so the longest side is at most THUMB_MAX."""
    from PIL import Image

    im = Image.fromarray(pixels.numpy())
    if max(im.size) > THUMB_MAX:
        im.thumbnail((THUMB_MAX, THUMB_MAX), Image.Resampling.LANCZOS)
    buf = io.BytesIO()
    im.save(buf, format="PNG", optimize=True)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _r(x: float, digits: int = 4) -> float:
    return float(f"{float(x):.{digits}g}")


def latent_types(scores) -> list[str]:
    t = ["content"] * scores.n_features
    fr = scores.fire_rate.tolist()
    for i, f in enumerate(fr):
        if f == 0:
            t[i] = "dead"
        elif f < scores.thresholds.min_fire_rate:
            t[i] = "rare"
    for name in ("row", "col", "mixed"):
        for i in getattr(scores, f"{name}_features"):
            t[i] = name
    return t


def page_data(collected, heat: Tensor, thumbs: dict[int, str], meta: dict[str, Any], class_names: list[str],
              outlier_threshold: float | None) -> dict[str, Any]:
    """The JSON the page renders. heat: (F*k, N) z of each top-k slot in (latent, slot) order."""
    s = collected.scores
    F, k = collected.top_score.shape
    types = latent_types(s)
    rank_key = {"row": s.eta2_row, "col": s.eta2_col, "mixed": s.eta2_pos}
    order: list[int] = []
    for t in TYPE_ORDER:
        ids = [i for i in range(F) if types[i] == t]
        key = rank_key.get(t, s.fire_rate)
        ids.sort(key=lambda i: (-float(key[i]), i))
        order += ids
    maps, mapmax, examples = [], [], []
    norms = collected.patch_norms
    for f in range(F):
        m = s.cell_means[f]
        top = float(m.max())
        maps.append(quantise(m, top))
        mapmax.append(_r(top))
        ex = []
        top_score = float(collected.top_score[f, 0])
        for j in range(k):
            img = int(collected.top_image[f, j])
            if img < 0:
                continue
            out_p = []
            if outlier_threshold is not None and norms is not None and norms.numel():
                out_p = (norms[img] > outlier_threshold).nonzero().squeeze(1).tolist()
            ex.append([img, _r(collected.top_score[f, j]), quantise(heat[f * k + j], top_score),
                       int(collected.top_patch[f, j]), out_p])
        examples.append(ex)
    labels = collected.labels.tolist() if collected.labels is not None else []
    doc: dict[str, Any] = {
        "meta": meta,
        "classes": class_names,
        "groups": collected.group_names,
        "order": order,
        "lat": {
            "type": types,
            "er": [_r(v) for v in s.eta2_row.tolist()], "ec": [_r(v) for v in s.eta2_col.tolist()],
            "ep": [_r(v) for v in s.eta2_pos.tolist()], "fr": [_r(v) for v in s.fire_rate.tolist()],
            "ma": [_r(v) for v in collected.mean_act.tolist()], "mx": [_r(v) for v in collected.max_act.tolist()],
            "map": maps, "mapmax": mapmax, "ex": examples,
        },
        "img": {str(i): b64 for i, b64 in thumbs.items()},
        "label": {str(i): labels[i] for i in thumbs if i < len(labels)},
    }
    if collected.group_mean is not None:
        doc["lat"]["gm"] = [[_r(v) for v in row] for row in collected.group_mean.tolist()]
        doc["lat"]["gf"] = [[_r(v) for v in row] for row in collected.group_fire.tolist()]
    return doc


def _json_block(doc: dict) -> str:
    text = json.dumps(doc, separators=(",", ":"), allow_nan=False)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def _script() -> str:
    return (Path(__file__).with_name("browser.js")).read_text(encoding="utf-8")


def render_page(doc: dict[str, Any], path: str | Path) -> Path:
    """Write the page to `path` atomically; returns it."""
    meta = doc["meta"]
    title = f"vitpos latents: {meta.get('model', '?')} layer {meta.get('layer', '?')} {meta.get('site', '')}"
    page = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        # no network: the page may load nothing from anywhere (images are data: URIs)
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; img-src data:; "
        "style-src 'unsafe-inline'; script-src 'unsafe-inline'\">"
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>\n"
        f"<header><h1>{html.escape(title)}</h1><div id=\"summary\"></div></header>\n"
        '<main><section id="list"><div id="filters">'
        '<label>type <select id="f-type"><option value="all">all</option><option value="positional">positional '
        '(row, col, mixed)</option><option value="row">row</option><option value="col">col</option>'
        '<option value="mixed">mixed</option><option value="content">content</option><option value="rare">rare'
        '</option><option value="dead">dead</option></select></label>'
        '<label>firing ≥ <input id="f-freq" type="number" min="0" max="1" step="0.001" value="0"></label>'
        '<label>η²<sub>pos</sub> ≥ <input id="f-pos" type="number" min="0" max="1" step="0.05" value="0"></label>'
        '<label>mean act ≥ <input id="f-str" type="number" min="0" step="0.1" value="0"></label>'
        '<label>id <input id="f-id" type="search" placeholder="latent id" size="8"></label>'
        '<span id="count"></span></div>'
        '<div id="table-wrap"><table id="latents"><thead><tr>'
        '<th data-key="id">id</th><th data-key="type">type</th><th data-key="er" title="share of the latent\'s '
        'variance explained by its row">η²<sub>row</sub></th><th data-key="ec" title="explained by its column">'
        'η²<sub>col</sub></th><th data-key="ep" title="explained by its (row, column) cell: the position share">'
        'η²<sub>pos</sub></th><th data-key="fr" title="share of patch tokens where it fires">firing</th>'
        '<th data-key="ma" title="mean activation where it fires">mean act</th></tr></thead><tbody></tbody>'
        '</table><button id="more" hidden>show all</button></div></section>\n'
        '<section id="detail"><p class="na">click a latent in the table</p></section></main>\n'
        f'<script type="application/json" id="data">{_json_block(doc)}</script>\n'
        f"<script>{_script()}</script>\n</body></html>\n")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        tmp.write_text(page, encoding="utf-8")
    return path


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:0;color:#1b1b1b;
font-size:14px;line-height:1.4}
header{padding:.6em 1.2em;background:#f4f6f9;border-bottom:1px solid #d5dbe3}
h1{font-size:1.25em;margin:.2em 0}h2{font-size:1.1em;margin:.3em 0}h3{font-size:1em;margin:.8em 0 .3em}
#summary{font-size:.92em;color:#333}#summary p{margin:.2em 0}
.pills{display:flex;flex-wrap:wrap;gap:.35em .5em;margin:.35em 0}
.pill{background:#fff;border:1px solid #d5dbe3;border-radius:1em;padding:.05em .7em}.pill b{font-weight:600;color:#444}
main{display:flex;gap:1em;padding:0 1em;align-items:flex-start}
#list{flex:0 0 470px;position:sticky;top:0;max-height:100vh;display:flex;flex-direction:column}
#filters{display:flex;flex-wrap:wrap;gap:.3em .9em;padding:.6em 0;align-items:center}
#filters input[type=number]{width:4.5em}
#count{color:#555;font-size:.9em}
#table-wrap{overflow-y:auto;border:1px solid #d5dbe3}
table{border-collapse:collapse;font-size:.9em;width:100%}
th,td{border-bottom:1px solid #e4e8ee;padding:.2em .5em;text-align:right;white-space:nowrap}
th{background:#eef1f5;position:sticky;top:0;cursor:pointer;user-select:none}
th.asc::after{content:" ▲"}th.desc::after{content:" ▼"}
td:nth-child(2),th:nth-child(2){text-align:left}
#latents tbody tr{cursor:pointer}#latents tbody tr:hover{background:#f0f5fb}
#latents tbody tr.sel{background:#dbe9f7}
.t{display:inline-block;padding:0 .45em;border-radius:.7em;color:#fff;font-size:.85em}
.t.row{background:#0072B2}.t.col{background:#D55E00}.t.mixed{background:#009E73}
.t.content{background:#8a8a8a}.t.rare{background:#b8b8b8}.t.dead{background:#d8d8d8;color:#555}
#detail{flex:1;min-width:0;padding:.6em 0}
.maps{display:flex;gap:1.4em;flex-wrap:wrap;align-items:flex-start}
.maps figure{margin:0}figcaption{font-size:.85em;color:#555;max-width:300px}
.ex{display:flex;flex-wrap:wrap;gap:.7em}
.ex figure{margin:0;width:132px}
.thumb{position:relative;width:128px;height:128px;border:2px solid #ccc}
.thumb img,.thumb canvas{position:absolute;left:0;top:0;width:128px;height:128px;image-rendering:pixelated}
.bars div{display:flex;align-items:center;gap:.4em;font-size:.88em;margin:.15em 0}
.bars span.lab{width:8em;text-align:right}.bars span.bar{height:.9em;background:#0072B2;display:inline-block}
.na{color:#666;font-style:italic}.small{color:#555;font-size:.85em}
.mapgrid{display:grid;grid-template-columns:auto 240px;gap:2px 4px;font-size:.72em;color:#666}
.axis.cols{display:flex;justify-content:space-around}.axis.rows{display:flex;flex-direction:column;justify-content:space-around;text-align:right}
.cbar{display:flex;align-items:center;gap:.4em;font-size:.8em;color:#555;margin:.3em 0 0 1.4em}
"""
