// The latent browser's script (vitpos.browse.page inlines it into the page).
(function(){
"use strict";
const D = JSON.parse(document.getElementById("data").textContent);
const L = D.lat, M = D.meta, H = M.grid[0], W = M.grid[1], N = H * W;
const LV = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz-_";
const F = L.type.length, PAGE = 300;
const el = (tag, attrs, text) => { const e = document.createElement(tag);
  for (const k in (attrs || {})) e.setAttribute(k, attrs[k]);
  if (text !== undefined) e.textContent = String(text); return e; };
const fmt = (x, d) => (x === null || x === undefined) ? "n/a" : Number(x).toPrecision(d || 3);
const pct = x => (x === null || x === undefined) ? "n/a" : (100 * x).toFixed(1) + " %";
const deq = s => { const a = new Float32Array(s.length); for (let i = 0; i < s.length; i++) a[i] = LV.indexOf(s[i]) / 63; return a; };
// colour map: viridis (perceptually uniform, readable in grey and by colour-blind readers)
const VIR = [[68,1,84],[72,40,120],[62,74,137],[49,104,142],[38,130,142],[31,158,137],[53,183,121],[109,205,89],[180,222,44],[253,231,37]];
function colour(v){ v = Math.max(0, Math.min(1, v)) * (VIR.length - 1); const i = Math.min(VIR.length - 2, Math.floor(v)), t = v - i;
  const c = [0, 1, 2].map(j => Math.round(VIR[i][j] + t * (VIR[i + 1][j] - VIR[i][j]))); return "rgb(" + c.join(",") + ")"; }
function summary(){
  const s = document.getElementById("summary");
  const p = el("p");
  p.textContent = M.model + " · layer " + M.layer + " " + M.site + " · data " + M.data + " · " + M.arch + " SAE, " +
    F + " latents, k = " + M.k + " · " + M.n_images + " held-out images (" + H + "×" + W + " patches) · top " +
    M.top_k + " images per latent";
  s.appendChild(p);
  const box = el("div", {class: "pills"});
  const rows = [["FVU", fmt(M.fvu)], ["L0", fmt(M.l0)], ["dead", pct(M.dead_frac)],
    ["dense (fires on > " + (M.dense_threshold === null || M.dense_threshold === undefined ? "?" : pct(M.dense_threshold)) + " of tokens)", pct(M.dense_frac)],
    ["top-1 clean → spliced", M.top1 === null || M.top1 === undefined ? "not measured" : pct(M.top1) + " → " + pct(M.top1_spliced)],
    ["logit KL", fmt(M.logit_kl)],
    ["seed stability (decoder cos ≥ 0.9)", M.stability === null || M.stability === undefined ? "not measured" :
      pct(M.stability) + " (median matched cos " + fmt(M.stability_median_cos, 2) + ")" +
      (M.stability_agreement && M.stability_agreement.some(v => v !== null) ? "; row / col latents matched to one of their axis " +
        pct(M.stability_agreement[0]) + " / " + pct(M.stability_agreement[1]) : "")],
    ["latents", Object.entries(M.counts).map(kv => kv[1] + " " + kv[0]).join(", ")]];
  for (const r of rows){ const p = el("span", {class: "pill"}); p.appendChild(el("b", {}, r[0] + " "));
    p.appendChild(document.createTextNode(r[1])); box.appendChild(p); }
  s.appendChild(box);
  const T = M.thresholds;
  if (T) s.appendChild(el("p", {class: "small"}, "η²: share of a latent's variance over held-out patch tokens explained " +
    "by its row, column or (row, column) cell. Types: row = η²row ≥ " + T.min_eta2 + " and η²col ≤ " + T.max_other_eta2 +
    " (col mirrored); mixed = η²pos ≥ " + T.min_eta2_pos + ", neither; content = fires on ≥ " + pct(T.min_fire_rate) +
    " of tokens, not positional; rare = fires less; dead = never fires."));
  if (M.special) s.appendChild(el("p", {class: "small"}, "Special tokens: " + M.special));
}
let sortKey = null, sortDir = -1, shown = PAGE, sel = null;
const vals = {id: i => i, type: i => ["row","col","mixed","content","rare","dead"].indexOf(L.type[i]),
  er: i => L.er[i], ec: i => L.ec[i], ep: i => L.ep[i], fr: i => L.fr[i], ma: i => L.ma[i]};
function filtered(){
  const t = document.getElementById("f-type").value;
  const fq = parseFloat(document.getElementById("f-freq").value) || 0;
  const ps = parseFloat(document.getElementById("f-pos").value) || 0;
  const st = parseFloat(document.getElementById("f-str").value) || 0;
  const q = document.getElementById("f-id").value.trim();
  let ids = D.order.filter(i => (t === "all" || L.type[i] === t ||
      (t === "positional" && ["row","col","mixed"].includes(L.type[i]))) &&
    L.fr[i] >= fq && L.ep[i] >= ps && L.ma[i] >= st && (q === "" || String(i).startsWith(q)));
  if (sortKey !== null){ const f = vals[sortKey]; ids = ids.slice().sort((a, b) => sortDir * (f(a) - f(b)) || a - b); }
  return ids;
}
function table(){
  const ids = filtered(), tb = document.querySelector("#latents tbody");
  tb.textContent = "";
  const frag = document.createDocumentFragment();
  for (const i of ids.slice(0, shown)){
    const tr = el("tr", {"data-id": i, "data-type": L.type[i]});
    if (i === sel) tr.className = "sel";
    tr.appendChild(el("td", {}, i));
    const td = el("td"); td.appendChild(el("span", {class: "t " + L.type[i]}, L.type[i])); tr.appendChild(td);
    for (const k of ["er", "ec", "ep"]) tr.appendChild(el("td", {}, L[k][i].toFixed(2)));
    tr.appendChild(el("td", {}, pct(L.fr[i])));
    tr.appendChild(el("td", {}, fmt(L.ma[i])));
    tr.addEventListener("click", () => show(i));
    frag.appendChild(tr);
  }
  tb.appendChild(frag);
  document.getElementById("count").textContent = ids.length + " of " + F + " latents";
  const more = document.getElementById("more");
  more.hidden = ids.length <= shown; more.textContent = "show all " + ids.length;
  return ids;
}
function drawMap(cv, s, scale){
  const a = deq(s), c = cv.getContext("2d"), cw = cv.width / W, ch = cv.height / H;
  for (let n = 0; n < N; n++){ c.fillStyle = colour(a[n]); c.fillRect((n % W) * cw, Math.floor(n / W) * ch, Math.ceil(cw), Math.ceil(ch)); }
  c.strokeStyle = "rgba(255,255,255,0.25)"; c.lineWidth = 1;
  for (let r = 1; r < H; r++){ c.beginPath(); c.moveTo(0, r * ch); c.lineTo(cv.width, r * ch); c.stroke(); }
  for (let q = 1; q < W; q++){ c.beginPath(); c.moveTo(q * cw, 0); c.lineTo(q * cw, cv.height); c.stroke(); }
}
function mapFigure(s, top){ // the map with row / column numbers and a colour bar
  const fig = el("figure", {class: "mapfig"}), grid = el("div", {class: "mapgrid"});
  const size = 240, cv = el("canvas", {width: size, height: Math.round(size * H / W), class: "map", "data-kind": "map"});
  drawMap(cv, s);
  const cols = el("div", {class: "axis cols"}), rows = el("div", {class: "axis rows"});
  const step = Math.max(1, Math.ceil(W / 16)), rstep = Math.max(1, Math.ceil(H / 16));
  for (let q = 0; q < W; q++) cols.appendChild(el("span", {}, q % step ? "" : q));
  for (let r = 0; r < H; r++) rows.appendChild(el("span", {}, r % rstep ? "" : r));
  grid.appendChild(el("span")); grid.appendChild(cols); grid.appendChild(rows); grid.appendChild(cv);
  fig.appendChild(grid);
  const bar = el("div", {class: "cbar"}), bc = el("canvas", {width: 160, height: 10}), g = bc.getContext("2d");
  for (let x = 0; x < 160; x++){ g.fillStyle = colour(x / 159); g.fillRect(x, 0, 1, 10); }
  bar.appendChild(el("span", {}, "0")); bar.appendChild(bc); bar.appendChild(el("span", {}, fmt(top)));
  fig.appendChild(bar);
  fig.appendChild(el("figcaption", {}, "mean activation at each patch position (rows top → bottom, columns left → right)"));
  return fig;
}
function drawHeat(cv, s, peak, outl){
  const a = deq(s), c = cv.getContext("2d"), cw = cv.width / W, ch = cv.height / H;
  for (let n = 0; n < N; n++){ if (a[n] <= 0) continue;
    c.fillStyle = "rgba(255,140,0," + (0.15 + 0.6 * a[n]).toFixed(3) + ")";
    c.fillRect((n % W) * cw, Math.floor(n / W) * ch, cw, ch); }
  c.lineWidth = 2; c.strokeStyle = "#000";
  c.strokeRect((peak % W) * cw + 1, Math.floor(peak / W) * ch + 1, cw - 2, ch - 2);
  c.strokeStyle = "#e0001b"; c.setLineDash([3, 2]);
  for (const n of outl) c.strokeRect((n % W) * cw + 2, Math.floor(n / W) * ch + 2, cw - 4, ch - 4);
}
function profile(s, axis){ // mean of the quantised map over columns (axis 0) or rows (axis 1)
  const a = deq(s), out = new Array(axis === 0 ? H : W).fill(0);
  for (let n = 0; n < N; n++){ const r = Math.floor(n / W), q = n % W; if (axis === 0) out[r] += a[n] / W; else out[q] += a[n] / H; }
  return out;
}
function bars(title, labels, values, fmtv){
  const box = el("div", {class: "bars"}); box.appendChild(el("h3", {}, title));
  const top = Math.max(1e-12, ...values);
  labels.forEach((lab, j) => { const d = el("div"); d.appendChild(el("span", {class: "lab"}, lab));
    const b = el("span", {class: "bar"}); b.style.width = Math.round(160 * values[j] / top) + "px"; d.appendChild(b);
    d.appendChild(el("span", {}, fmtv(values[j]))); box.appendChild(d); });
  return box;
}
function show(i){
  sel = i;
  for (const tr of document.querySelectorAll("#latents tbody tr")) tr.className = Number(tr.dataset.id) === i ? "sel" : "";
  const d = document.getElementById("detail"); d.textContent = "";
  d.setAttribute("data-latent", i);
  const h = el("h2"); h.appendChild(document.createTextNode("latent " + i + " ")); h.appendChild(el("span", {class: "t " + L.type[i]}, L.type[i]));
  d.appendChild(h);
  d.appendChild(el("p", {}, "η² row " + L.er[i].toFixed(3) + " · col " + L.ec[i].toFixed(3) + " · position (cell) " +
    L.ep[i].toFixed(3) + " · fires on " + pct(L.fr[i]) + " of patch tokens · mean activation when firing " + fmt(L.ma[i]) +
    " · max " + fmt(L.mx[i])));
  const maps = el("div", {class: "maps"});
  maps.appendChild(mapFigure(L.map[i], L.mapmax[i]));
  const rp = profile(L.map[i], 0), cp = profile(L.map[i], 1);
  maps.appendChild(bars("by row (top → bottom)", rp.map((_, r) => "row " + r), rp, v => fmt(v * L.mapmax[i], 2)));
  maps.appendChild(bars("by column (left → right)", cp.map((_, q) => "col " + q), cp, v => fmt(v * L.mapmax[i], 2)));
  if (L.gm){ maps.appendChild(bars("by class group (mean activation)", D.groups, L.gm[i], v => fmt(v, 3))); }
  d.appendChild(maps);
  d.appendChild(el("h3", {}, "top " + L.ex[i].length + " images (orange: where it fires, black box: its peak patch" +
    (L.ex[i].some(e => e[4].length) ? ", red dashes: high-norm outlier tokens" : "") + ")"));
  const ex = el("div", {class: "ex"});
  if (!L.ex[i].length) ex.appendChild(el("p", {class: "na"}, "never fires on these images"));
  for (const e of L.ex[i]){
    const [img, score, heat, peak, outl] = e;
    const fig = el("figure"), box = el("div", {class: "thumb"});
    const im = el("img", {src: "data:image/png;base64," + D.img[String(img)], alt: "image " + img});
    const hc = el("canvas", {width: 128, height: 128});
    box.appendChild(im); box.appendChild(hc); fig.appendChild(box);
    drawHeat(hc, heat, peak, outl);
    const lab = D.label[String(img)];
    fig.appendChild(el("figcaption", {}, "img " + img + (lab !== undefined ? " · " + (D.classes[lab] || lab) : "") +
      " · max " + fmt(score) + " at r" + Math.floor(peak / W) + " c" + (peak % W)));
    ex.appendChild(fig);
  }
  d.appendChild(ex);
}
document.querySelectorAll("#latents th").forEach(th => th.addEventListener("click", () => {
  const k = th.dataset.key; if (sortKey === k) sortDir = -sortDir; else { sortKey = k; sortDir = k === "id" || k === "type" ? 1 : -1; }
  document.querySelectorAll("#latents th").forEach(o => o.className = "");
  th.className = sortDir > 0 ? "asc" : "desc"; table(); }));
for (const id of ["f-type", "f-freq", "f-pos", "f-str", "f-id"]) document.getElementById(id).addEventListener("input", () => { shown = PAGE; table(); });
document.getElementById("more").addEventListener("click", () => { shown = F; table(); });
summary();
const first = table();
if (first.length) show(first[0]);
window.vitposBrowser = {show: show, table: table, data: D};
})();
