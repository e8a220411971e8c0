"""The probes' solver (vitpos.analysis.lbfgs): design helpers, preconditioner, compact L-BFGS, batched heads."""

import math

import numpy as np
import pytest
import torch

from vitpos.analysis import lbfgs as L


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # The test machine is shared; one thread avoids oversubscription stalls on small matmuls
    # (results are deterministic for a given thread count, BLAS rounding differs between counts).
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def test_preconditioner_cuts_iterations_on_anisotropic_features():
    # Rotate, scale by 1/i, rotate again: per-dim standardising cannot undo this anisotropy.
    g = torch.Generator().manual_seed(0)
    n, d, k = 3000, 64, 6
    y = torch.randint(0, k, (n,), generator=g)
    x = torch.randn(n, d, generator=g) + 0.5 * torch.randn(k, d, generator=g)[y]
    q1, _ = torch.linalg.qr(torch.randn(d, d, generator=g))
    q2, _ = torch.linalg.qr(torch.randn(d, d, generator=g))
    x = x @ (q1 / torch.arange(1, d + 1).float()) @ q2
    design = L.Design(L.standardised_design(x, *L.standardise_stats(x)))
    out = {}
    for pc in (True, False):
        obj = L.SoftmaxHeads(design, [y], [k], [1e-3])
        theta, iters = L.lbfgs_heads(obj, torch.zeros(d + 1, k), max_iter=500, tol=1e-4, precondition=pc)
        f, resid = obj.value(theta)
        assert obj.grad(theta, resid).abs().max() <= 1e-4  # both reach the tolerance
        out[pc] = (f, iters)
    assert out[True][0] == pytest.approx(out[False][0], abs=1e-4)  # same optimum
    assert out[True][1] <= 25 and 3 * out[True][1] <= out[False][1]


def test_standardise_stats_and_finiteness_check():
    g = torch.Generator().manual_seed(0)
    x = 3.0 + 2.0 * torch.randn(5000, 7, generator=g)
    x[:, 3] = 1.5  # a constant feature gets std 1, not 0
    mean, std = L.standardise_stats(x)
    ref = x.std(0, unbiased=False)
    torch.testing.assert_close(mean, x.mean(0))
    torch.testing.assert_close(std[[0, 1, 2, 4, 5, 6]], ref[[0, 1, 2, 4, 5, 6]], rtol=1e-5, atol=0)
    assert std[3] == 1.0
    # The float64-sum check flags every non-finite value and never overflows on finite ones.
    big = torch.full((100_000,), 3.0e38)
    assert L.all_finite(big) and L.all_finite(-big) and L.all_finite(x)
    for bad in (math.nan, math.inf, -math.inf):
        y = x.clone()
        y[1234 % y.shape[0], 5] = bad
        assert not L.all_finite(y)
    y = big.clone()
    y[7], y[8] = math.inf, -math.inf  # inf - inf is NaN: still caught
    assert not L.all_finite(y)


@pytest.mark.slow
def test_joint_heads_on_an_l2_path_reach_sklearns_optimum():
    # Several heads of different sizes and l2s share one design matrix (the (sum K, N) logits
    # layout, per-head slices) and are fitted along a strong-to-weak l2 path with warm starts and
    # carried curvature pairs, as fit_position_probes does. Each head must land on the optimum
    # scikit-learn finds for that head alone, at every point of the path.
    from sklearn.linear_model import LogisticRegression

    g = torch.Generator().manual_seed(1)
    n, d = 1500, 12
    x = torch.randn(n, d, generator=g) @ torch.randn(d, d, generator=g)  # correlated features
    ys = [(x @ torch.randn(d, k, generator=g) + torch.randn(n, k, generator=g)).argmax(1) for k in (4, 6)]
    mean, std = L.standardise_stats(x)
    design = L.Design(L.standardised_design(x, mean, std))
    xs = ((x - mean) / std).double().numpy()
    heads, memory = None, {}
    for l2 in (1.0, 1e-1, 1e-2, 1e-3):
        l2s = [l2, 3 * l2]  # different l2 per head
        heads = L.fit_softmax_heads(design, ys, [4, 6], l2s, heads, max_iter=500, tol=1e-6, memory=memory)
        for (w, b), y, lam in zip(heads, ys, l2s, strict=True):
            sk = LogisticRegression(C=1.0 / (lam * n), tol=1e-10, max_iter=5000).fit(xs, y.numpy())
            ours = w.double().numpy() - w.double().numpy().mean(1, keepdims=True)
            theirs = sk.coef_.T - sk.coef_.T.mean(1, keepdims=True)
            scale = max(1.0, float(np.abs(theirs).max()))
            np.testing.assert_allclose(ours, theirs, atol=1e-3 * scale)
            b_ours = b.double().numpy() - b.double().numpy().mean()
            b_theirs = sk.intercept_ - sk.intercept_.mean()
            np.testing.assert_allclose(b_ours, b_theirs, atol=1e-3 * scale)


def _anisotropic_design(n=2000, d=24, k=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, k, (n,), generator=g)
    x = torch.randn(n, d, generator=g) + 0.7 * torch.randn(k, d, generator=g)[y]
    q, _ = torch.linalg.qr(torch.randn(d, d, generator=g))
    x = x @ (q / torch.arange(1, d + 1).float())
    return L.Design(L.standardised_design(x, *L.standardise_stats(x))), y, g


def test_compact_lbfgs_direction_equals_two_loop_recursion():
    # The compact (matrix) form of H g must be the classic two-loop recursion's result, with and
    # without the diagonal preconditioner, for any number of stored pairs up to the history.
    design, _, g = _anisotropic_design()
    d1, k = design.xt.shape[0], 4
    a = torch.randn(d1 * k, d1 * k, generator=g, dtype=torch.float64)
    hess = a @ a.T / (d1 * k) + 0.1 * torch.eye(d1 * k, dtype=torch.float64)  # SPD: s^T y > 0
    state = L.HeadLBFGS(torch.zeros(d1, k), history=6, design=design)
    state.g = torch.randn(d1, k, generator=g)
    m_diag = 0.5 + torch.rand(d1, 1, generator=g, dtype=torch.float64)
    for pairs in range(9):  # 0 pairs (first step), then past the history of 6
        if pairs:
            s = torch.randn(d1, k, generator=g)
            state.push(s, (hess @ s.double().reshape(-1)).reshape(d1, k).float())
        assert state.s.shape[0] == min(pairs, 6)
        for m in (None, m_diag):
            compact, loop = state.direction(m), state.direction_two_loop(m)
            torch.testing.assert_close(compact, loop, rtol=1e-5, atol=1e-6)
            assert float((compact * state.g).sum()) < 0  # a descent direction


def test_heads_converge_independently_to_their_own_optimum():
    # Batched heads with very different conditioning (a strongly and a weakly regularised one)
    # stop separately; each must reach the tolerance and end where it ends when fitted alone
    # (a head that has converged leaves the batch and is not moved by the other's iterations).
    design, y, g = _anisotropic_design()
    y2 = (y + torch.randint(0, 2, y.shape, generator=g)) % 5  # a noisier second target
    both = L.fit_softmax_heads(design, [y, y2], [5, 5], [1.0, 1e-4], tol=1e-4, max_iter=500)
    alone = [
        L.fit_softmax_heads(design, [t], [5], [l2], tol=1e-4, max_iter=500)[0] for t, l2 in ((y, 1.0), (y2, 1e-4))
    ]
    obj = L.SoftmaxHeads(design, [y, y2], [5, 5], [1.0, 1e-4])
    theta = torch.cat([torch.cat([w, b[None]]) for w, b in both], 1)
    f, resid = obj.value(theta)
    assert float(obj.grad(theta, resid).abs().max()) <= 1e-4
    for (w, b), (w1, b1) in zip(both, alone, strict=True):
        scale = max(1.0, float(w1.abs().max()))
        torch.testing.assert_close(w, w1, rtol=0, atol=1e-5 * scale)
        torch.testing.assert_close(b, b1, rtol=0, atol=1e-5 * scale)
