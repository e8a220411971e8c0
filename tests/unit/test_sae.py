"""Sparse autoencoders (vitpos.sae) and positional feature scoring."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

from conftest import toy_set
from vitpos.errors import VitposError
from vitpos.sae import SAE, FeatureThresholds, SAEConfig, sae_metrics, score_codes, score_features, train_sae
from vitpos.sae.model import ENC_INIT_SCALE


@pytest.fixture(autouse=True)
def one_thread():
    # Tiny tensors on a shared 2-core box: thread hand-offs cost more than the maths.
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def planted_dirs(n_dirs=64, d=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    dirs = torch.randn(n_dirs, d, generator=g)
    return dirs / dirs.norm(dim=1, keepdim=True)


def planted_tokens(dirs, n, active=3, seed=1):
    """Each token: a non-negative combination of `active` planted directions, plus an offset."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.rand(n, dirs.shape[0], generator=g).argsort(1)[:, :active]
    coef = torch.rand(n, active, generator=g) * 2 + 0.5
    return torch.zeros(n, dirs.shape[0]).scatter(1, idx, coef) @ dirs + 0.3


def chunks(x, b):
    return [x[i : i + b] for i in range(0, len(x), b)]


@pytest.fixture(scope="module")
def planted():
    dirs = planted_dirs()
    return dirs, planted_tokens(dirs, 16384), planted_tokens(dirs, 4000, seed=2)


def hand_sae(arch="topk", k=1):
    """d_in=2, F=4: latents 0/1 read and write e1/e2; latents 2/3 read -e1/-e2 (never fire on x ≥ 0)."""
    sae = SAE(SAEConfig(arch=arch, d_in=2, expansion=2, k=k, normalize=False))
    with torch.no_grad():
        sae.W_enc.copy_(torch.tensor([[1.0, 0], [0, 1], [-1, 0], [0, -1]]))
        sae.W_dec.copy_(torch.tensor([[1.0, 0], [0, 1], [1, 0], [0, 1]]))
        sae.b_enc.zero_()
        sae.b_dec.zero_()
    return sae.eval()


# --- model -----------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["topk", "batchtopk", "relu"])
def test_init_encoder_is_scaled_decoder_transpose_and_unit_norm(arch):
    cfg = SAEConfig(arch=arch, d_in=16, expansion=4, k=4, seed=3)
    sae = SAE(cfg)
    assert sae.W_dec.shape == (64, 16) and sae.d_sae == 64
    encoder = sae.W_enc  # (F, D): pre = encoder @ x
    decoder = sae.W_dec.T  # (D, F): x_hat = decoder @ z
    c = 1.0 if arch == "relu" else ENC_INIT_SCALE
    torch.testing.assert_close(encoder, c * decoder.T, rtol=0, atol=0)
    torch.testing.assert_close(sae.W_dec.norm(dim=1), torch.ones(64))
    torch.testing.assert_close(sae.W_enc.norm(dim=1), torch.full((64,), c))
    assert torch.equal(SAE(cfg).W_dec, sae.W_dec)
    assert not torch.equal(SAE(cfg.model_copy(update={"seed": 4})).W_dec, sae.W_dec)



def test_scaled_encoder_init_does_not_overshoot(planted):
    """At k/D = 1/4 the unit tied init reconstructs the first batch with FVU above 1 (the top-k
    projections add up past x); the TopK init scale brings it well below."""
    _, x, _ = planted
    sae = SAE(SAEConfig(d_in=32, expansion=4, k=8))
    sae.initialize(x[:256])
    with torch.no_grad():
        scaled = float(sae.step(x[:256]).fvu)
        sae.W_enc.div_(ENC_INIT_SCALE)
        unit = float(sae.step(x[:256]).fvu)
    assert scaled < 0.4 and unit > 1.0

def test_config_validation_and_defaults():
    cfg = SAEConfig(d_in=10)
    assert cfg.d_sae == 80 and cfg.aux_k_eff == 5 and cfg.arch == "topk"
    with pytest.raises(VitposError, match="k"):
        SAEConfig.parse({"d_in": 4, "expansion": 1, "k": 5})
    with pytest.raises(VitposError, match="arch"):
        SAEConfig.parse({"d_in": 4, "arch": "jumprelu"})


def test_sparse_gradients_match_dense_reference():
    torch.manual_seed(0)
    for arch in ("topk", "batchtopk"):
        cfg = SAEConfig(arch=arch, d_in=12, expansion=4, k=5, aux_k=6)
        sae = SAE(cfg).double().train()
        with torch.no_grad():
            sae.b_enc.normal_()
            sae.b_dec.normal_()
            sae.W_enc.add_(0.3 * torch.randn_like(sae.W_enc))
            sae.scale.fill_(0.7)
        x = torch.randn(30, 12, dtype=torch.float64)
        dead = torch.zeros(48, dtype=torch.bool)
        dead[::3] = True
        x_hat, z, info = sae(x, dead_mask=dead)
        params = [sae.W_enc, sae.b_enc, sae.W_dec, sae.b_dec]
        got = torch.autograd.grad(info["loss"] + x_hat.pow(2).sum() * 0.01, params)

        # Dense autograd reference with the same selection.
        xs = x * sae.scale
        pre = (xs - sae.b_dec) @ sae.W_enc.T + sae.b_enc
        zr = pre.relu() * (z != 0)
        xs_hat = zr @ sae.W_dec + sae.b_dec
        tv = (xs - xs.mean(0)).pow(2).sum()
        _, i = pre.masked_fill(~dead, -math.inf).topk(6, dim=1)
        za = pre.relu() * torch.zeros_like(pre, dtype=torch.bool).scatter(1, i, True)
        aux = min(int(dead.sum()) / 6, 1.0) * (za @ sae.W_dec - (xs - xs_hat).detach()).pow(2).sum() / tv
        ref = (xs_hat - xs).pow(2).sum() / tv + cfg.aux_coeff * aux
        assert float(aux.detach()) > 0
        torch.testing.assert_close(info["loss"], ref)
        want = torch.autograd.grad(ref + (xs_hat / sae.scale).pow(2).sum() * 0.01, params)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10)
        if arch == "batchtopk":
            assert int((z != 0).sum()) <= 5 * 30  # k·batch in total, not per token


def test_stable_argsort_small_is_torchs_stable_argsort():
    from vitpos.sae.sparse import stable_argsort_small

    g = torch.Generator().manual_seed(0)
    for bound in (1, 7, 768, 1 << 15, (1 << 15) + 1, 100_000):  # the last two take torch's path
        keys = torch.randint(0, bound, (5000,), generator=g)  # many ties: stability is what is tested
        assert torch.equal(stable_argsort_small(keys, bound), torch.argsort(keys, stable=True))


@pytest.mark.parametrize("arch", ["topk", "batchtopk"])
def test_step_bookkeeping_reads_the_codes(arch):
    """fired, L0 and the smallest active code of a training step, against the dense codes."""
    torch.manual_seed(2)
    sae = SAE(SAEConfig(arch=arch, d_in=12, expansion=4, k=5)).train()
    with torch.no_grad():
        sae.b_enc.fill_(-0.8)  # many selected pre-activations negative: selected, yet not active
    out = sae.step(torch.randn(40, 12), dense_codes=True)
    z = out.z.detach() if out.z is not None else None
    assert z is not None and 0 < float((z != 0).sum()) < 5 * 40
    assert torch.equal(out.fired, (z != 0).any(0))
    assert torch.equal(out.l0, (z != 0).sum() / 40)
    assert out.min_act is not None and float(out.min_act.detach()) == float(z[z > 0].min())


def test_decode_and_feature_contribution_swap_exact():
    torch.manual_seed(1)
    sae = SAE(SAEConfig(d_in=16, expansion=4, k=6))
    x = torch.randn(50, 16) * 3 + 1
    sae.initialize(x)  # non-trivial scale and b_dec
    assert float(sae.scale) != 1.0 and float(sae.b_dec.detach().abs().sum()) > 0
    with torch.no_grad():
        z = sae.encode(x)
        all_ids = list(range(sae.d_sae))
        torch.testing.assert_close(sae.decode(z), sae.feature_contribution(z, all_ids) + sae.b_dec / sae.scale)
        ids = z.count_nonzero(0).argsort(descending=True)[:8]  # frequently active latents
        contrib = sae.feature_contribution(z, ids)
        same = x - contrib + sae.feature_contribution(z[torch.arange(50)], ids)
        torch.testing.assert_close(same, x, rtol=0, atol=1e-5)
        perm = torch.randperm(50)
        moved = x - contrib + sae.feature_contribution(z[perm], ids)
        delta = moved - x
        assert float(delta.norm()) > 1e-2
        # The change lies in span{d_f : f ∈ ids}: nothing is left after projecting that span out.
        q, _ = torch.linalg.qr(sae.W_dec[ids].T)
        outside = delta - (delta @ q) @ q.T
        assert float(outside.norm()) < 1e-4 * float(delta.norm())


def test_fast_topk_selects_what_torch_topk_selects():
    from vitpos.sae.sparse import topk_flat, topk_rows

    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        pre = torch.randn(64, 48, generator=g, dtype=dtype)
        pre[3] = 0.5  # an all-ties row: any k of them is right
        for k in (1, 7, 47, 48):
            vals, idx = topk_rows(pre, k)
            ref = pre.topk(k, dim=1).values
            torch.testing.assert_close(vals.sort(1).values, ref.sort(1).values, rtol=0, atol=0)
            torch.testing.assert_close(pre.gather(1, idx), vals, rtol=0, atol=0)
            assert all(len(set(r.tolist())) == k for r in idx)  # distinct latents per row
        for k in (1, 100, 64 * 48):
            flat = topk_flat(pre, k)
            assert flat.numel() == k and flat.unique().numel() == k
            ref = pre.reshape(-1).topk(k).values
            torch.testing.assert_close(pre.reshape(-1)[flat].sort().values, ref.sort().values, rtol=0, atol=0)


def test_wrong_width_is_a_clear_error():
    sae = SAE(SAEConfig(d_in=8, expansion=2, k=2))
    with pytest.raises(VitposError, match="last dim 8"):
        sae.encode(torch.zeros(3, 9))


# --- metrics ---------------------------------------------------------------------------------


def test_metrics_exact_on_hand_built_sae():
    sae = hand_sae()
    x = torch.tensor([[3.0, 0], [0, 2], [2, 1]])
    # codes: [3,0,0,0], [0,2,0,0], [2,0,0,0] -> x_hat [3,0],[0,2],[2,0]; Σe² = 1
    # x̄ = (5/3, 1): Σ‖x-x̄‖² = (16+25+1)/9 + 2 = 20/3
    want = {"fvu": 1 / (20 / 3), "l0": 1.0, "dead_frac": 0.5, "mse": 1 / 6, "tokens": 3}
    for batches in ([x], chunks(x, 1), x):
        got = sae_metrics(sae, batches)
        assert got["tokens"] == 3
        for key, v in want.items():
            assert got[key] == pytest.approx(v, rel=1e-12, abs=1e-12), key


def test_metrics_exact_with_scale_and_tied_bias():
    sae = hand_sae()
    with torch.no_grad():
        sae.scale.fill_(2.0)
        sae.b_dec.copy_(torch.tensor([2.0, 0.0]))  # normalised units
    x = torch.tensor([[3.0, 0], [0, 2], [2, 0.5]])
    # x·2 - b_dec = [4,0],[0,4],[2,1] -> z0=4, z1=4, z0=2 -> x_hat = (z·d + b_dec)/2 = [3,0],[1,2],[2,0]
    torch.testing.assert_close(sae.decode(sae.encode(x)), torch.tensor([[3.0, 0], [1, 2], [2, 0]]))
    # Σe² = 1 + 0.25; Σ‖x-x̄‖² = 14/3 + 13/6 = 41/6
    got = sae_metrics(sae, chunks(x, 2))
    assert got["fvu"] == pytest.approx(1.25 / (41 / 6), rel=1e-12)
    assert got["mse"] == pytest.approx(1.25 / 6, rel=1e-12)
    assert got["l0"] == 1.0 and got["dead_frac"] == 0.5


def test_metrics_l0_and_dead_frac_relu():
    sae = hand_sae("relu")
    x = torch.tensor([[1.0, 1.0], [2.0, -1.0], [0.0, 0.0], [-1.0, 0.5]])
    # relu codes nonzero counts: 2, 2 (z0 and z3), 0, 2 (z1, z2); every latent fires once or more
    got = sae_metrics(sae, [x])
    assert got["l0"] == pytest.approx(6 / 4)
    assert got["dead_frac"] == 0.0
    got = sae_metrics(sae, [x[:1]])
    assert got["dead_frac"] == 0.5 and math.isnan(got["fvu"])  # one token: no variance


# --- training --------------------------------------------------------------------------------


def test_topk_recovers_planted_directions(planted):
    dirs, x, x_eval = planted
    cfg = SAEConfig(d_in=32, expansion=4, k=3, dead_steps=4096)
    sae, log = train_sae(chunks(x, 256), cfg, epochs=3, progress=False, eval_batches=chunks(x_eval, 1000))
    best = (dirs @ sae.W_dec.detach().T).max(1).values
    assert float((best >= 0.9).float().mean()) >= 0.9
    torch.testing.assert_close(sae.W_dec.detach().norm(dim=1), torch.ones(sae.d_sae))
    assert log.steps == 3 * 64 and log.tokens == 3 * 16384
    assert log.eval["fvu"] < 0.15 and log.eval["l0"] == 3.0
    assert log.fvu[-1] < 0.5 * log.fvu[0]
    assert max(log.aux_loss) > 0  # half the dictionary is surplus: AuxK must have kicked in


@pytest.mark.parametrize("arch", ["batchtopk", "relu"])
def test_batchtopk_and_relu_learn(planted, arch):
    _, x, x_eval = planted
    cfg = SAEConfig(arch=arch, d_in=32, expansion=4, k=3, l1_coeff=0.05)
    sae, log = train_sae(chunks(x, 256), cfg, epochs=2, progress=False)
    m = sae_metrics(sae, [x_eval])
    assert m["fvu"] < 0.3
    if arch == "batchtopk":
        assert float(sae.threshold) > 0
        assert 1.5 <= m["l0"] <= 6  # threshold inference keeps L0 near k
    else:
        assert m["l0"] < 0.5 * sae.d_sae  # L1 made it sparse
    torch.testing.assert_close(sae.W_dec.detach().norm(dim=1), torch.ones(sae.d_sae))


def test_training_is_deterministic(planted):
    _, x, _ = planted
    cfg = SAEConfig(d_in=32, expansion=2, k=4, seed=7)
    a, la = train_sae(chunks(x[:4096], 512), cfg, progress=False)
    b, lb = train_sae(chunks(x[:4096], 512), cfg, progress=False)
    for name in ("W_enc", "b_enc", "W_dec", "b_dec", "scale"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert la.fvu == lb.fvu


def test_training_settings_object_equals_keywords_and_keywords_override_it(planted):
    from vitpos.sae import TrainSettings

    _, x, _ = planted
    cfg = SAEConfig(d_in=32, expansion=2, k=4, seed=7)
    a, la = train_sae(chunks(x[:2048], 512), cfg, TrainSettings(epochs=2, lr=3e-3), progress=False)
    b, lb = train_sae(chunks(x[:2048], 512), cfg, epochs=2, lr=3e-3, progress=False)
    c, lc = train_sae(chunks(x[:2048], 512), cfg, TrainSettings(epochs=5, lr=1e-2), epochs=2, lr=3e-3, progress=False)
    assert torch.equal(a.W_dec, b.W_dec) and torch.equal(a.W_dec, c.W_dec) and la.fvu == lb.fvu == lc.fvu
    assert la.steps == 8 and la.lr == 3e-3
    with pytest.raises(VitposError, match="epochs must be >= 1"):
        train_sae(chunks(x[:2048], 512), cfg, TrainSettings(epochs=0), progress=False)


def test_training_sources_steps_and_errors(planted):
    _, x, _ = planted
    cfg = SAEConfig(d_in=32, expansion=2, k=4)
    data = chunks(x[:2048], 512)  # 4 batches
    _, log = train_sae(data, cfg, steps=10, progress=False)
    assert log.steps == 10 and log.tokens == 10 * 512  # cycles passes until steps
    _, log = train_sae(lambda: iter(data), cfg, epochs=2, progress=False)
    assert log.steps == 8 and log.epochs_done == 2
    _, log = train_sae(iter(data), cfg, steps=6, progress=False)
    assert log.steps == 4 and log.notes  # one-shot generator ran out, said so
    _, log = train_sae(data, cfg, progress=False, on_step=lambda step, m: step == 2)
    assert log.steps == 2
    with pytest.raises(VitposError, match="re-iterable"):
        train_sae(iter(data), cfg, epochs=2, progress=False)
    with pytest.raises(VitposError, match="no training batches"):
        train_sae([], cfg, progress=False)
    with pytest.raises(VitposError, match=r"\(B, 32\)"):
        train_sae([torch.zeros(4, 31)], cfg, progress=False)


def test_normalisation_is_transparent(planted):
    _, x, x_eval = planted
    cfg = SAEConfig(d_in=32, expansion=2, k=4)
    sae, _ = train_sae(chunks(x[:4096] * 50.0, 512), cfg, progress=False)
    # Mean token norm maps to √D inside; outside, reconstructions are in activation units.
    assert float(sae.scale) * float((x[:512] * 50).norm(dim=1).mean()) == pytest.approx(math.sqrt(32), rel=1e-5)
    m = sae_metrics(sae, [x_eval * 50.0])
    assert m["fvu"] < 0.5 and m["mse"] > 1.0  # mse in activation units (50x scale)


# --- persistence -----------------------------------------------------------------------------


def test_save_load_roundtrip_bit_identical(tmp_path, planted):
    _, x, x_eval = planted
    cfg = SAEConfig(arch="batchtopk", d_in=32, expansion=2, k=4)
    sae, _ = train_sae(chunks(x[:2048], 512), cfg, progress=False)
    file = sae.save(tmp_path / "run")
    assert file == tmp_path / "run" / "sae.safetensors"
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["sae.safetensors"]  # no temp left over
    for where in (tmp_path / "run", file):
        back = SAE.load(where)
        assert back.cfg == sae.cfg and back.to_config_dict() == sae.to_config_dict()
        for name, t in sae.state_dict().items():
            assert torch.equal(back.state_dict()[name], t), name
        assert torch.equal(back.encode(x_eval[:100]), sae.encode(x_eval[:100]))


def test_load_errors(tmp_path):
    with pytest.raises(VitposError, match="no SAE weights"):
        SAE.load(tmp_path / "missing")
    sae = SAE(SAEConfig(d_in=8, expansion=2, k=2))
    file = sae.save(tmp_path / "ok")
    data = file.read_bytes()
    bad = tmp_path / "bad" / "sae.safetensors"
    bad.parent.mkdir()
    bad.write_bytes(data[: len(data) // 2])  # truncated
    with pytest.raises(VitposError, match="not a readable SAE file"):
        SAE.load(bad.parent)
    bad.write_bytes(b"\x00garbage" * 10)
    with pytest.raises(VitposError, match="not a readable SAE file"):
        SAE.load(bad)
    from vitpos.io import write_safetensors

    write_safetensors(bad, {"W_enc": torch.zeros(2, 2)})  # a safetensors file, not an SAE
    with pytest.raises(VitposError, match="not a vitpos SAE"):
        SAE.load(bad)


# --- positional feature scoring --------------------------------------------------------------


def planted_codes(n_images, H, W, seed=0):
    """Latents: 0 row-only, 1 col-only, 2 checkerboard (both), 3 position-free noise,
    4 row-coded but rare, 5 never fires, 6 row-coded with a weak column term."""
    g = torch.Generator().manual_seed(seed)
    r = torch.arange(H * W) // W
    c = torch.arange(H * W) % W

    def noise() -> torch.Tensor:
        return 0.3 * torch.rand(n_images, H * W, generator=g)

    z = torch.zeros(n_images, H * W, 7)
    z[..., 0] = (r + 1).float() + noise()
    z[..., 1] = (c + 1).float() + noise()
    z[..., 2] = ((r + c) % 2 == 0).float() + noise()
    z[..., 3] = torch.rand(n_images, H * W, generator=g)
    z[0, 0, 4] = 5.0  # one token in the whole set
    z[..., 6] = (r + 1).float() + 0.35 * c.float() + noise()
    return z


def test_score_codes_finds_planted_row_col_mixed():
    H, W = 4, 5
    z = planted_codes(60, H, W)
    scores = score_codes(torch.split(z, 7), (H, W))
    assert scores.row_features == [0]
    assert scores.col_features == [1]
    # Sorted by η²_pos: both are positional up to the same noise, which is relatively smaller for 6.
    assert scores.mixed_features == [6, 2]
    assert scores.eta2_pos[6] > scores.eta2_pos[2]
    assert scores.eta2_row[0] > 0.9 and scores.eta2_col[0] < 0.01
    assert 0.05 < scores.eta2_col[6] < 0.3 and scores.eta2_row[6] > 0.3  # too much column for "row"
    assert scores.eta2_pos[2] > 0.9 and scores.eta2_row[2] < 0.05
    assert scores.eta2_pos[3] < 0.05
    assert scores.eta2_pos[5] == 0 and scores.fire_rate[5] == 0
    assert scores.fire_rate[4] == pytest.approx(1 / (60 * H * W))
    assert scores.fire_rate[0] == 1.0
    assert scores.cell_means.shape == (7, H, W)
    assert scores.n_images == 60
    # Streaming over batches gives the same numbers as one batch.
    whole = score_codes([z], (H, W))
    torch.testing.assert_close(whole.eta2_pos, scores.eta2_pos)
    torch.testing.assert_close(whole.cell_means, scores.cell_means)
    # Thresholds are configurable: a looser column limit makes latent 6 a row feature.
    scores.classify(FeatureThresholds(max_other_eta2=0.3))
    assert scores.row_features == [0, 6] and 6 not in scores.mixed_features
    j = scores.to_json()
    assert j["row_features"] == [0, 6] and set(j["cell_means"]) == {"0", "1", "2", "6"}
    assert len(j["eta2_row"]) == 7 and j["thresholds"]["max_other_eta2"] == 0.3


def test_eta2_exact_on_deterministic_maps():
    H, W = 3, 4
    r = (torch.arange(H * W) // W).float()
    c = (torch.arange(H * W) % W).float()
    z = torch.stack([r, c, r + c, r * c], dim=-1).expand(5, -1, -1)
    s = score_codes([z], (H, W))
    torch.testing.assert_close(s.eta2_row[:3], torch.tensor([1.0, 0.0, 2 / 3 / (2 / 3 + 5 / 4)]))
    torch.testing.assert_close(s.eta2_col[:3], torch.tensor([0.0, 1.0, 5 / 4 / (2 / 3 + 5 / 4)]))
    torch.testing.assert_close(s.eta2_pos, torch.ones(4))  # no within-cell variance at all
    torch.testing.assert_close(s.cell_means[3], (r * c).view(H, W))


def test_score_features_through_sae_and_errors():
    H, W = 2, 3
    z = planted_codes(40, H, W)[..., :3]
    sae = SAE(SAEConfig(arch="relu", d_in=3, expansion=1, normalize=False))
    with torch.no_grad():
        sae.W_enc.copy_(torch.eye(3))
        sae.W_dec.copy_(torch.eye(3))
        sae.b_enc.zero_()
        sae.b_dec.zero_()
    s = score_features(sae, torch.split(z, 16), (H, W))
    ref = score_codes([z], (H, W))
    torch.testing.assert_close(s.eta2_row, ref.eta2_row)
    assert s.row_features == [0] and s.col_features == [1]
    with pytest.raises(VitposError, match="patch tokens only"):
        score_features(sae, [torch.zeros(2, 7, 3)], (H, W))
    with pytest.raises(VitposError, match="no held-out images"):
        score_codes([], (H, W))


def test_plot_feature_maps(tmp_path):
    from vitpos.plots.features import plot_feature_maps

    scores = score_codes([planted_codes(20, 4, 5)], (4, 5))
    out = plot_feature_maps(scores, tmp_path / "maps.png", n=3)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["maps.png"]
    scores.classify(FeatureThresholds(min_fire_rate=2.0))  # nothing qualifies: still a figure
    assert plot_feature_maps(scores, tmp_path / "empty.png").stat().st_size > 0


# --- training from the on-disk activation store ----------------------------------------------


def write_store(path, tokens, grid=(4, 4), shard_images=16, meta=None):
    """Tokens (n, D) as a store of n / (H·W) images in stored (image-major) order."""
    from vitpos.store.writer import ActivationWriter

    n_p = grid[0] * grid[1]
    acts = tokens.reshape(-1, n_p, tokens.shape[-1])
    with ActivationWriter(path, sites=["blocks.0.resid_post"], grid=grid, num_prefix_tokens=0, meta=meta or {},
                          shard_images=shard_images) as w:
        for i in range(0, len(acts), 10):
            b = acts[i : i + 10]
            w.add({"blocks.0.resid_post": b}, torch.zeros(len(b), dtype=torch.long), torch.arange(i, i + len(b)))
    return path


def test_store_training_equals_in_memory_training(tmp_path, planted):
    from vitpos.sae.stream import store_batches

    _, x, x_eval = planted
    store = write_store(tmp_path / "acts", x[:8192])
    cfg = SAEConfig(d_in=32, expansion=4, k=3, dead_steps=4096)
    # Same token order (stored order, no shuffle): the very same SAE, bit for bit.
    streamed = store_batches(store, "blocks.0.resid_post", 256, shuffle=False)
    a, la = train_sae(streamed, cfg, epochs=2, progress=False)
    b, lb = train_sae(chunks(x[:8192], 256), cfg, epochs=2, progress=False)
    for name in ("W_enc", "b_enc", "W_dec", "b_dec", "scale"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert la.fvu == lb.fvu and la.tokens == lb.tokens == 2 * 8192
    # Buffered shuffle, fresh per epoch vs a full in-memory permutation: the same held-out FVU.
    shuffled = store_batches(store, "blocks.0.resid_post", 256, seed=3, buffer_tokens=1024)
    first, second = [torch.cat(list(shuffled())) for _ in range(2)]
    assert not torch.equal(first, second)  # a new shuffle each epoch ...

    def key(t: torch.Tensor) -> torch.Tensor:
        return t[torch.argsort(t[:, 0])]

    assert torch.equal(key(first), key(x[:8192]))  # ... of exactly the stored tokens
    c, _ = train_sae(store_batches(store, "blocks.0.resid_post", 256, seed=3, buffer_tokens=1024), cfg, epochs=3,
                     progress=False)
    g = torch.Generator().manual_seed(3)

    def perm_passes():
        return iter(chunks(x[:8192][torch.randperm(8192, generator=g)], 256))

    d, _ = train_sae(perm_passes, cfg, epochs=3, progress=False)
    fvu_c, fvu_d = sae_metrics(c, [x_eval])["fvu"], sae_metrics(d, [x_eval])["fvu"]
    assert fvu_c < 0.2 and abs(fvu_c - fvu_d) < 0.03, (fvu_c, fvu_d)


def test_store_training_memory_is_bounded(tmp_path):
    """The reader never holds more than buffer + 2 shards + one batch of tokens (its own byte
    accounting), a small fraction of the store, and the trainer keeps no batch past its step."""
    import weakref

    from vitpos.sae.stream import store_batches

    dirs = planted_dirs(d=32)
    x = planted_tokens(dirs, 48 * 16 * 16)  # 48 shards of 16 images x 16 patches
    store = write_store(tmp_path / "acts", x)
    batches = store_batches(store, "blocks.0.resid_post", 256, buffer_tokens=512)
    total_bytes = x.numel() * 4
    alive: list[weakref.ref] = []
    most_alive = 0

    def watched():
        nonlocal most_alive
        for t in batches():
            most_alive = max(most_alive, sum(r() is not None for r in alive))
            alive.append(weakref.ref(t))
            yield t

    sae, log = train_sae(watched, SAEConfig(d_in=32, expansion=2, k=3), epochs=2, progress=False)
    assert log.tokens == 2 * len(x) and log.steps == 2 * len(x) // 256
    bound = batches.bound_bytes()
    assert bound == (512 + 2 * 256 + 256) * 32 * 4
    assert 0 < batches.peak_reader_bytes <= bound <= total_bytes / 8
    assert most_alive <= 1  # when a batch is handed out, at most the previous one is still referenced
    assert batches.max_batch_tokens == 256


def test_store_batches_errors_and_tail(tmp_path, planted):
    from vitpos.sae.stream import store_batches

    _, x, _ = planted
    store = write_store(tmp_path / "acts", x[: 16 * 21])  # 336 tokens: one batch of 256 + a tail of 80
    with pytest.raises(VitposError, match="not in the store"):
        store_batches(store, "blocks.1.resid_post")
    b = store_batches(store, "blocks.0.resid_post", 256, shuffle=False)
    assert [len(t) for t in b()] == [256] and b.dropped_tokens == 80  # a tail under half a batch is dropped
    b = store_batches(store, "blocks.0.resid_post", 200, shuffle=False)
    assert [len(t) for t in b()] == [200, 136] and b.dropped_tokens == 0
    with pytest.raises(VitposError, match="no activation store"):
        store_batches(tmp_path / "nowhere", "blocks.0.resid_post")


def test_default_lr_rule():
    from vitpos.sae.train import default_lr

    assert default_lr(384) == default_lr(768) == pytest.approx(2e-3)
    assert default_lr(6144) == pytest.approx(2e-3 / math.sqrt(8))
    assert default_lr(16384) < default_lr(6144)


# --- run_sae: capture to a store, train streamed, score --------------------------------------


@pytest.fixture(scope="module")
def tiny_ape():
    from conftest import tiny_own

    return tiny_own("ape")


RUN_KW = dict(k=4, expansion=2, n_train_images=64, n_eval_images=32, epochs=2, batch_tokens=256, buffer_tokens=512)


def test_run_sae_trains_streamed_from_a_store(tmp_path, tiny_ape):
    from vitpos.experiments.sae_run import run_sae
    from vitpos.store.capture import capture_to_store

    ds = toy_set()
    res, sae = run_sae(tiny_ape, 0, data=ds, out=tmp_path / "o", **RUN_KW)
    doc = res.to_json()
    out = tmp_path / "o"
    assert (out / "acts" / "manifest.json").is_file()  # the train split went to disk first
    assert {"sae.safetensors", "sae.json", "features.png"} <= {p.name for p in out.iterdir()}
    tr = doc["training"]
    assert tr["train_images"] == 64 and doc["train_tokens"] == 2 * 64 * 16 and tr["lr"] == pytest.approx(2e-3)
    assert 0 < tr["reader_peak_bytes"] <= tr["reader_bound_bytes"] and tr["max_batch_tokens"] == 256
    for key in ("fvu", "l0", "dead_frac", "logit_kl", "top1_change_points", "row_features", "col_features",
                "mixed_features"):
        assert key in doc
    assert doc["l0"] <= 4 and 0 <= doc["dead_frac"] <= 1
    again, sae2 = run_sae(tiny_ape, 0, data=ds, out=out, **RUN_KW)  # same run: reloaded, not retrained
    assert again == res and torch.equal(sae2.W_dec, sae.W_dec)
    # A store made by `vitpos capture` (capture_to_store) of the same images: the very same training.
    capture_to_store(tiny_ape, ds, "train", "blocks.0.resid_post", tmp_path / "store", limit=64, progress=False)
    given_res, sae3 = run_sae(tiny_ape, 0, data=ds, store=tmp_path / "store", out=tmp_path / "o3", **RUN_KW)
    given = given_res.to_json()
    assert given["training"]["train_store"] == str(tmp_path / "store") and not (tmp_path / "o3" / "acts").exists()
    assert torch.equal(sae3.W_dec, sae.W_dec) and given["fvu"] == doc["fvu"]
    # Without an output folder the capture goes to a temp store, removed afterwards.
    doc4 = run_sae(tiny_ape, 0, data=ds, **RUN_KW)[0].to_json()
    assert doc4["fvu"] == doc["fvu"] and doc4["training"]["train_store"] is None


def test_run_sae_refuses_a_store_that_does_not_match(tmp_path, tiny_ape):
    from conftest import tiny_own
    from vitpos.experiments.sae_run import run_sae
    from vitpos.store.capture import capture_to_store

    ds = toy_set(24)
    capture_to_store(tiny_ape, ds, "train", "blocks.0.resid_post", tmp_path / "train", progress=False)
    capture_to_store(tiny_ape, ds, "test", "blocks.0.resid_post", tmp_path / "test", progress=False)
    cases = [
        (dict(surface=tiny_own("ape-sincos"), layer=0, store=tmp_path / "train", data=ds), "model 'tiny:ape'"),
        (dict(surface=tiny_ape, layer=1, store=tmp_path / "train", data=ds), "no site blocks.1.resid_post"),
        (dict(surface=tiny_ape, layer=0, store=tmp_path / "train", data="shapes"), "--data toy:train"),
        (dict(surface=tiny_ape, layer=0, store=tmp_path / "test", data=ds), "held-out"),
        (dict(surface=tiny_ape, layer=0, store=tmp_path / "missing", data=ds), "no activation store"),
    ]
    for kw, needle in cases:
        with pytest.raises(VitposError, match=re.escape(needle)) as e:
            run_sae(kw.pop("surface"), kw.pop("layer"), out=tmp_path / "o", **kw, **RUN_KW)
        assert "\n" not in str(e.value)


def test_versions_key_the_sae_dir_and_the_capture(tmp_path, tiny_ape, monkeypatch):
    """Bumping SAE_VERSION retrains instead of reloading the SAE dir; a store of another capture
    version is refused as a training store (one line naming the fix)."""
    import vitpos.experiments.sae_run as sae_run
    import vitpos.store.capture as store_capture

    ds = toy_set(24)
    first, _ = sae_run.run_sae(tiny_ape, 0, data=ds, out=tmp_path / "o", **RUN_KW)
    assert first.run["version"] == sae_run.SAE_VERSION
    monkeypatch.setattr(sae_run, "SAE_VERSION", sae_run.SAE_VERSION + 1)
    again, _ = sae_run.run_sae(tiny_ape, 0, data=ds, out=tmp_path / "o", **RUN_KW)
    assert again.run["version"] == sae_run.SAE_VERSION and json.loads(
        (tmp_path / "o" / "sae.json").read_text())["run"]["version"] == sae_run.SAE_VERSION
    assert again.fvu == first.fvu  # retrained by the same code: the same SAE
    store_capture.capture_to_store(tiny_ape, ds, "train", "blocks.0.resid_post", tmp_path / "st", progress=False)
    monkeypatch.setattr(store_capture, "CAPTURE_VERSION", store_capture.CAPTURE_VERSION + 1)
    with pytest.raises(VitposError, match="capture version 1, this vitpos captures version 2") as e:
        sae_run.run_sae(tiny_ape, 0, data=ds, store=tmp_path / "st", out=tmp_path / "o2", **RUN_KW)
    assert "\n" not in str(e.value) and "vitpos capture" in str(e.value)


def test_a_finished_sae_measured_on_another_held_out_size_is_not_served(tmp_path, tiny_ape):
    """The out dir's finished run is reused only for the same held-out size: a changed `n_eval_images` (e.g.
    `sae_layers.eval_images`, whose layers reuse one folder per layer) measures again, not the old numbers."""
    from vitpos.experiments.sae_run import run_sae

    ds = toy_set(48)
    kw = {**RUN_KW, "n_train_images": 32}
    first, _ = run_sae(tiny_ape, 0, data=ds, out=tmp_path / "o", **{**kw, "n_eval_images": 8})
    again, _ = run_sae(tiny_ape, 0, data=ds, out=tmp_path / "o", **{**kw, "n_eval_images": 8})
    assert again.to_json() == first.to_json()  # same run: served
    bigger, _ = run_sae(tiny_ape, 0, data=ds, out=tmp_path / "o", **{**kw, "n_eval_images": 16})
    assert first.run["held_out_images"] == 8 and bigger.run["held_out_images"] == 16
    assert bigger.tokens == 2 * first.tokens  # held-out patch tokens: measured on 16 images, not 8


def test_results_follow_the_weights_not_just_the_spec(tmp_path, tiny_ape):
    """The same spec over retrained weights must neither reuse a finished SAE nor train on the old store."""
    from conftest import tiny_own
    from vitpos.experiments.sae_run import run_sae
    from vitpos.store.capture import capture_to_store

    retrained = tiny_own("ape", seed=1)  # spec 'tiny:ape' again, other weights
    assert retrained.spec == tiny_ape.spec and retrained.weights_digest() != tiny_ape.weights_digest()
    assert tiny_own("ape", seed=0).weights_digest() == tiny_ape.weights_digest()
    ds = toy_set(32)
    kw = {**RUN_KW, "n_train_images": 32, "n_eval_images": 16}
    doc = run_sae(tiny_ape, 0, data=ds, out=tmp_path / "o", **kw)[0].to_json()
    doc2 = run_sae(retrained, 0, data=ds, out=tmp_path / "o", **kw)[0].to_json()
    assert doc2["run"]["weights"] == retrained.weights_digest() and doc2["fvu"] != doc["fvu"]
    capture_to_store(tiny_ape, ds, "train", "blocks.0.resid_post", tmp_path / "store", progress=False)
    with pytest.raises(VitposError, match="other weights"):
        run_sae(retrained, 0, data=ds, store=tmp_path / "store", out=tmp_path / "o2", **kw)


def test_seeds_outside_int64_are_refused_before_any_work():
    """`vitpos sae --stability-seed -1` trained and exited 0; the library refuses such a seed too."""
    from conftest import tiny_own
    from vitpos.experiments.sae_run import sae_job

    s = tiny_own("ape")
    for seed, other in ((-1, None), (0, -1), (0, 2**63)):
        with pytest.raises(VitposError, match="outside 0..2"):
            sae_job(s, 1, "resid_post", toy_set(8), "topk", 2, 1, 8, 1, 8, seed, None, None, None, None, other,
                    False)


def test_a_truncated_extra_seed_is_not_a_finished_run(tmp_path):
    """A finished sae run's extra claim seed cut short: not reused (the run retrains it) — until issue 49 it
    counted as saved because the file existed, and the stage then refused it with 're-train or re-copy it'."""
    from vitpos.experiments.sae_run import _load_seeds

    doc = {"seed_pool": {"runs": [{"dir": "seeds/seed1"}]}}
    SAE(SAEConfig(d_in=8, expansion=2, k=2)).save(tmp_path / "seeds" / "seed1")
    _load_seeds(tmp_path, doc)  # whole: loads
    weights = tmp_path / "seeds" / "seed1" / "sae.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(VitposError, match="is not a readable SAE file"):  # _finished catches it: trained again
        _load_seeds(tmp_path, doc)
