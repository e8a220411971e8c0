"""Linear position probes: can a linear read-out recover a patch token's row / column?

Conventions (shared across vitpos):
  * features are (num_images, num_patches, D), tokens in patch order, prefix tokens (CLS,
    registers) already stripped by the caller;
  * patch n of an H x W grid has row n // W and column n % W.

A probe is multinomial logistic regression on standardised features, fitted full-batch in torch
(CPU or GPU) with L-BFGS, preconditioned by the feature covariance. The objective is
    mean cross-entropy + l2 / 2 * ||W||^2        (bias unpenalised),
which is scikit-learn's LogisticRegression objective with C = 1 / (l2 * n_train_tokens); it is
minimised to the same gradient tolerance as scikit-learn's lbfgs (max |grad| <= 1e-4).
Several probes on the same tokens (row, column, controls) share every evaluation's matmul but
each runs its own L-BFGS (see `_lbfgs`); the l2 grid is walked from strong to weak, each fit
warm-started from the previous one with its curvature pairs carried over.

`fit_position_probes` splits BY IMAGE (test images never reach training), chooses l2 per probe
on a validation split of the training images, refits on all training images and reports test
accuracy, plus a Hewitt & Liang-style control task (see `control_labels`) and its selectivity.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from vitpos.errors import VitposError

DEFAULT_L2_GRID: tuple[float, ...] = (1e-4, 1e-3, 1e-2, 1e-1, 1.0)
# Training tokens are capped: L-BFGS cost is linear in tokens, and ~50k tokens already give
# hundreds of examples per position for a few thousand parameters per probe.
DEFAULT_MAX_TRAIN_TOKENS = 50_000
_EVAL_CHUNK_TOKENS = 65_536  # bounds the memory of one evaluation matmul
_STD_EPS = 1e-6


# --------------------------------------------------------------------------------------------
# Labels and splits
# --------------------------------------------------------------------------------------------


def _stream_seed(seed: int, stream: str) -> int:
    """Independent seed per random stream, so e.g. changing the token cap never moves the split."""
    return int.from_bytes(hashlib.sha256(f"{stream}:{int(seed)}".encode()).digest()[:4], "little")


def _check_grid(grid: Any) -> tuple[int, int]:
    try:
        h, w = (int(v) for v in grid)
    except (TypeError, ValueError):
        raise VitposError(f"grid must be a pair (H, W) of positive ints, got {grid!r}") from None
    if h < 1 or w < 1 or (h, w) != tuple(grid):
        raise VitposError(f"grid must be a pair (H, W) of positive ints, got {grid!r}")
    return h, w


def position_labels(grid: Sequence[int], target: str) -> torch.Tensor:
    """(H*W,) int64 label of each patch for target 'row' (n // W) or 'col' (n % W)."""
    h, w = _check_grid(grid)
    n = torch.arange(h * w)
    if target == "row":
        return n // w
    if target == "col":
        return n % w
    raise VitposError(f"target must be 'row' or 'col', got {target!r}")


def control_labels(grid: Sequence[int], target: str, seed: int = 0) -> torch.Tensor:
    """(H*W,) control label of each grid position: a fixed random map, the same for every image.

    Labels live in {0..H-1} for target 'row' and {0..W-1} for 'col'. The map is a randomly
    permuted Latin rectangle, label(r, c) = s[(p[r] + q[c]) mod K], so every label occurs (about)
    equally often in each row and in each column. Why: the control labels then carry no
    information about the row alone or the column alone, so a control probe does better than
    chance only by exploiting joint position identity (memorisation), never by reading the very
    row/column code the real probe is meant to find.
    """
    h, w = _check_grid(grid)
    if target not in ("row", "col"):
        raise VitposError(f"target must be 'row' or 'col', got {target!r}")
    k = h if target == "row" else w
    # Row and column maps differ even on square grids (else the two controls would be one task).
    g = torch.Generator().manual_seed(_stream_seed(seed, f"control-{target}"))
    p = torch.randperm(h, generator=g)
    q = torch.randperm(w, generator=g)
    s = torch.randperm(k, generator=g)
    return s[(p[:, None] + q[None, :]) % k].reshape(-1)


@dataclass(frozen=True)
class ProbeSplit:
    """Row indices (into the features' image axis) of each split; fit + val = train."""

    train: torch.Tensor
    fit: torch.Tensor
    val: torch.Tensor
    test: torch.Tensor


def split_images(
    image_ids: Sequence[Any] | torch.Tensor | int,
    *,
    seed: int = 0,
    test_frac: float = 0.25,
    val_frac: float = 0.2,
) -> ProbeSplit:
    """Split images into train (= fit + val) and test, grouping rows that share an image id.

    `image_ids` is the id of each feature row (or an int: the number of rows, ids 0..n-1). Rows
    with equal ids (e.g. several crops of one source image) always land in the same split.
    """
    if isinstance(image_ids, int):
        ids = list(range(image_ids))
    elif isinstance(image_ids, torch.Tensor):
        ids = image_ids.reshape(-1).tolist()
    else:
        ids = list(image_ids)
    if not (0.0 < test_frac < 1.0) or not (0.0 < val_frac < 1.0):
        raise VitposError(f"test_frac and val_frac must be in (0, 1), got {test_frac} and {val_frac}")
    groups: dict[Any, list[int]] = {}
    for row, i in enumerate(ids):
        groups.setdefault(i, []).append(row)
    uniq = list(groups)
    n = len(uniq)
    n_test = max(1, round(test_frac * n))
    n_val = max(1, round(val_frac * (n - n_test)))
    if n - n_test - n_val < 1:
        raise VitposError(
            f"need at least 3 distinct images to split into fit/val/test, got {n}; probe more images"
        )
    g = torch.Generator().manual_seed(_stream_seed(seed, "split"))
    order = torch.randperm(n, generator=g).tolist()

    def rows(group_idx: list[int]) -> torch.Tensor:
        return torch.tensor(sorted(r for j in group_idx for r in groups[uniq[j]]), dtype=torch.long)

    test, val, fit = order[:n_test], order[n_test : n_test + n_val], order[n_test + n_val :]
    return ProbeSplit(train=rows(val + fit), fit=rows(fit), val=rows(val), test=rows(test))


def sample_train_tokens(
    images: torch.Tensor, num_patches: int, max_tokens: int | None, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(image_idx, patch_idx) of the training tokens: all tokens, or at most `max_tokens`.

    When capped, positions are dealt round-robin from shuffled decks, so every position (hence
    every row/column class) appears equally often (+-1) and each image contributes equally.
    """
    images = images.reshape(-1).long()
    n_img = images.numel()
    total = n_img * num_patches
    if max_tokens is None or max_tokens >= total:
        img = images.repeat_interleave(num_patches)
        patch = torch.arange(num_patches).repeat(n_img)
        return img, patch
    if max_tokens < 1:
        raise VitposError(f"max_train_tokens must be >= 1, got {max_tokens}")
    per_img = max(1, max_tokens // n_img)
    g = torch.Generator().manual_seed(_stream_seed(seed, "tokens"))
    n_decks = math.ceil(n_img * per_img / num_patches)
    deck = torch.cat([torch.randperm(num_patches, generator=g) for _ in range(n_decks)])
    patch = deck[: n_img * per_img].reshape(n_img, per_img)
    img = images[:, None].expand(n_img, per_img)
    keep = torch.randperm(n_img * per_img, generator=g)[:max_tokens].sort().values
    return img.reshape(-1)[keep], patch.reshape(-1)[keep]


# --------------------------------------------------------------------------------------------
# Fitting
# --------------------------------------------------------------------------------------------


def _all_finite(x: torch.Tensor) -> bool:
    """No NaN / inf in x. A float64 sum of float32 values cannot overflow, so it is finite iff
    every value is; one reduction is ~50x cheaper on CPU than isfinite(x).all()."""
    return bool(torch.isfinite(x.sum(dtype=torch.float64)))


def _standardise_stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    mean = x.mean(0)
    # Two-pass population std: same value as x.std(0, unbiased=False), ~15x faster on CPU
    # (torch's std reduces over dim 0 of a row-major matrix on a slow path).
    std = (x - mean).pow_(2).mean(0).sqrt_()
    # Constant features get std 1 so they stay constant instead of blowing up.
    std = torch.where(std > _STD_EPS, std, torch.ones_like(std))
    return mean, std


def _standardised_design(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """(N, D + 1): standardised features plus a ones column, so the bias rides in the matmul."""
    out = torch.empty(x.shape[0], x.shape[1] + 1, device=x.device, dtype=torch.float32)
    torch.sub(x, mean, out=out[:, :-1])
    out[:, :-1].div_(std)
    out[:, -1] = 1.0
    return out


_PRECOND_TOKENS = 8192  # tokens used to estimate the feature covariance for the preconditioner


class _Design:
    """A `_standardised_design` matrix, stored transposed, plus its feature-covariance eigenbasis.

    The (D + 1, N) layout is a speed choice: every softmax reduction then runs over a handful of
    contiguous length-N rows (one per class) instead of over the short inner axis of an (N, K)
    matrix, which is several times faster on CPU; the matmuls cost the same either way.

    Cov(x_std) ~ U diag(e) U^T (estimated on a strided subsample). L-BFGS does its algebra in
    the rotated coordinates [U^T w; b] (see `_HeadLBFGS`), where the covariance preconditioner
    is diagonal; the design itself stays unrotated (fits on a rotated float32 copy were seen to
    take ~30% more iterations, a rounding effect in the near-null directions).
    """

    def __init__(self, xs: torch.Tensor):
        n = xs.shape[0]
        self.n = n
        self.xt = xs.T.contiguous()  # (D + 1, N)
        # Evenly strided tokens: deterministic, and a preconditioner needs no exact covariance.
        sub = xs[:: max(1, n // _PRECOND_TOKENS), :-1].double()
        e, u = torch.linalg.eigh(sub.T @ sub / sub.shape[0])
        self.e = e.clamp_min(0)  # float64: the L-BFGS algebra runs in float64
        self.u = u

    def rotate(self, theta: torch.Tensor) -> torch.Tensor:
        """(D + 1, K) parameters -> float64 [U^T w; b]."""
        theta = theta.double()
        return torch.cat([self.u.T @ theta[:-1], theta[-1:]])

    def unrotate(self, theta: torch.Tensor) -> torch.Tensor:
        """Inverse of `rotate` (float64)."""
        return torch.cat([self.u @ theta[:-1], theta[-1:]])


class _SoftmaxHeads:
    """Objective and gradient of several independent softmax heads sharing one token matrix.

    `design` is a `_Design`. Head h has parameters theta_h, a (D + 1, K_h) tensor: weights with
    the bias as the last row. The objective is a sum of per-head objectives, so the joint
    optimum is each head's own optimum; evaluating several heads in one
    (sum K, D + 1) @ (D + 1, N) matmul per evaluation is what makes fitting them together cheap.
    Gradients are analytic (no autograd): softmax - one-hot, then one matmul.
    """

    def __init__(self, design: _Design, targets: list[torch.Tensor], num_classes: list[int], l2s: list[float]):
        xt = design.xt
        self.design = design
        self.xt = xt
        self.n = design.n
        self.num_classes = [int(k) for k in num_classes]
        self.l2s = [float(v) for v in l2s]
        self.slices = []
        start = 0
        for k in self.num_classes:
            self.slices.append(slice(start, start + k))
            start += k
        self.targets = [y.to(xt.device) for y in targets]
        # Transposed one-hot targets, so d loss / d logits is a plain subtraction, and each
        # token's true-class logit as one gather from the flattened (K, N) logits.
        self.onehots = [F.one_hot(y, k).T.to(xt.dtype).contiguous() for y, k in zip(self.targets, self.num_classes)]
        tokens = torch.arange(self.n, device=xt.device)
        self.true_idx = [y * self.n + tokens for y in self.targets]
        self.curv = [0.5] * len(self.num_classes)  # softmax curvature per head, see head_values()

    def head_values(self, thetas: list[torch.Tensor], heads: list[int]) -> tuple[list[float], torch.Tensor]:
        """Objective of each head in `heads` at its parameters, and N * d objective / d logits of
        those heads stacked as one (sum K, N) tensor. One exp per evaluation serves both."""
        w = thetas[0] if len(thetas) == 1 else torch.cat(thetas, 1)
        logits = w.T @ self.xt  # (sum K, N)
        fs = []
        start = 0
        for theta, h in zip(thetas, heads):
            k = self.num_classes[h]
            z = logits[start : start + k]  # (K, N), contiguous rows
            start += k
            m = z.amax(0)
            nll = z.reshape(-1).take(self.true_idx[h]).neg_().add_(m)  # m - true logit
            p = z.sub_(m).exp_()
            tot = p.sum(0)
            # Sums in float64: a float32 sum over N tokens is off by ~1e-6, about the decrease
            # an L-BFGS step makes near max|grad| = 1e-4, which would stall the line search.
            f = float(nll.add_(tot.log()).sum(dtype=torch.float64)) / self.n
            fs.append(f + 0.5 * self.l2s[h] * float(theta[:-1].pow(2).sum(dtype=torch.float64)))
            p.div_(tot)
            # Mean eigenvalue of the per-token logit Hessian diag(p) - p p^T: the softmax's
            # share of the curvature, used to scale the preconditioner.
            pf = p.reshape(-1)
            self.curv[h] = (1.0 - float(pf @ pf) / self.n) / k
            p.sub_(self.onehots[h])
        return fs, logits  # logits now hold softmax - one-hot, per token

    def head_grads(self, thetas: list[torch.Tensor], heads: list[int], resid: torch.Tensor) -> list[torch.Tensor]:
        """Gradient of each head in `heads`, from `head_values`' stacked residuals."""
        g = (self.xt @ resid.T).div_(self.n)
        out, start = [], 0
        for theta, h in zip(thetas, heads):
            k = self.num_classes[h]
            gh = g[:, start : start + k].contiguous()
            start += k
            gh[:-1].add_(theta[:-1], alpha=self.l2s[h])
            out.append(gh)
        return out

    def head_precondition_diag(self, h: int) -> torch.Tensor:
        """(D + 1, 1) float64 approximate inverse Hessian of head h, diagonal in the design's
        rotated coordinates (`_Design.rotate`): 1 / (c * e + l2) per weight row.

        Real activations are strongly anisotropic even after standardising, which is what makes
        plain L-BFGS (and scikit-learn) take hundreds of steps; this removes that part. c is the
        softmax's mean curvature at the latest evaluation; the bias row (the ones column, unit
        second moment, uncorrelated with the centred features) gets 1 / c.
        """
        c = max(self.curv[h], 1e-6)
        e = self.design.e
        # (floored: with l2 = 0, a constant feature would otherwise give 1 / 0)
        return torch.cat([1.0 / (c * e + self.l2s[h]).clamp_min(1e-12), e.new_full((1,), 1.0 / c)])[:, None]

    # Whole-parameter views (all heads in one (D + 1, sum K) tensor), for checks and tests.
    def value(self, theta: torch.Tensor) -> tuple[float, torch.Tensor]:
        heads = list(range(len(self.slices)))
        fs, resid = self.head_values([theta[:, sl] for sl in self.slices], heads)
        return sum(fs), resid

    def grad(self, theta: torch.Tensor, resid: torch.Tensor) -> torch.Tensor:
        heads = list(range(len(self.slices)))
        return torch.cat(self.head_grads([theta[:, sl] for sl in self.slices], heads, resid), 1)

    def precondition(self, q: torch.Tensor) -> torch.Tensor:
        d = self.design
        parts = [d.unrotate(d.rotate(q[:, sl]) * self.head_precondition_diag(h)) for h, sl in enumerate(self.slices)]
        return torch.cat(parts, 1).to(q.dtype)


class _HeadLBFGS:
    """L-BFGS state of one head: its curvature pairs and current point, objective and gradient.

    Pairs are kept in the design's rotated coordinates (`_Design.rotate`), where the
    preconditioner M is diagonal, as rows of float64 matrices S, Y, and H g is computed in the
    compact form of Byrd, Nocedal & Schnabel (1994, thm 2.2) with H0 = gamma * M:
        H g = H0 g + S^T R^-T ((D + Y H0 Y^T) p - Y H0 g) - (H0 Y^T) p,   p = R^-1 S g,
    R = upper triangle of S Y^T, D its diagonal. That is the two-loop recursion's result (a
    test checks it) in a dozen tensor ops instead of four per stored pair.
    """

    def __init__(self, theta: torch.Tensor, history: int, design: _Design):
        self.design = design
        self.theta = theta
        self.f = math.inf
        self.g: torch.Tensor | None = None
        self.history = history
        self.s = theta.new_zeros(0, theta.numel(), dtype=torch.float64)
        self.y = theta.new_zeros(0, theta.numel(), dtype=torch.float64)

    def push(self, s: torch.Tensor, y: torch.Tensor) -> None:
        s, y = self.design.rotate(s).reshape(1, -1), self.design.rotate(y).reshape(1, -1)
        if float(s @ y.T) > 1e-10:  # keep the pair only when curvature is positive (always, if l2 > 0)
            self.s = torch.cat([self.s[1 - self.history :] if self.history > 1 else self.s[:0], s])
            self.y = torch.cat([self.y[1 - self.history :] if self.history > 1 else self.y[:0], y])

    def forget(self) -> None:
        self.s, self.y = self.s[:0], self.y[:0]

    def direction(self, m_diag: torch.Tensor | None) -> torch.Tensor:
        """-H g, H0 = gamma * diag(m_diag) (None: identity), gamma from the newest pair."""
        shape = self.g.shape
        g = self.design.rotate(self.g).reshape(-1)
        m = None if m_diag is None else m_diag.double().expand_as(self.g).reshape(-1)
        mg = g if m is None else m * g
        if not self.s.shape[0]:
            return self._back(-mg, shape)
        s, y = self.s, self.y
        my = y if m is None else y * m
        sy = s @ y.T
        gamma = float(sy[-1, -1]) / float(my[-1] @ y[-1])
        r = sy.triu()
        p = torch.linalg.solve_triangular(r, (s @ g)[:, None], upper=True)
        w = sy.diagonal()[:, None] * p + gamma * ((my @ y.T) @ p - (my @ g)[:, None])
        v = torch.linalg.solve_triangular(r.T, w, upper=False)
        hg = gamma * mg + (s.T @ v - gamma * (my.T @ p)).squeeze(1)
        return self._back(-hg, shape)

    def _back(self, d: torch.Tensor, shape) -> torch.Tensor:
        return self.design.unrotate(d.reshape(shape)).to(self.g.dtype)

    def direction_two_loop(self, m_diag: torch.Tensor | None) -> torch.Tensor:
        """The same -H g by the classic two-loop recursion (reference for tests)."""
        shape = self.g.shape
        q = -self.design.rotate(self.g).reshape(-1)
        alphas = []
        for s, y in zip(reversed(self.s), reversed(self.y)):
            a = float(s @ q) / float(s @ y)
            alphas.append(a)
            q -= a * y
        if m_diag is not None:
            q = q * m_diag.double().expand_as(self.g).reshape(-1)
        if self.s.shape[0]:
            s_new, y_new = self.s[-1], self.y[-1]
            my = y_new if m_diag is None else y_new * m_diag.double().expand_as(self.g).reshape(-1)
            q = q * (float(s_new @ y_new) / float(my @ y_new))
        for (s, y), a in zip(zip(self.s, self.y), reversed(alphas)):
            q += (a - float(y @ q) / float(s @ y)) * s
        return self._back(q, shape)


@torch.no_grad()
def _lbfgs(
    obj: _SoftmaxHeads,
    theta: torch.Tensor,
    *,
    max_iter: int,
    tol: float,
    history: int = 40,
    memory: dict | None = None,
    precondition: bool = True,
) -> tuple[torch.Tensor, int]:
    """Minimise the sum of `obj`'s heads: one L-BFGS per head, sharing every evaluation.

    theta: (D + 1, sum K), the heads side by side. Each head
    has its own curvature pairs, its own Armijo backtracking line search and its own stopping
    test: the objective is separable, so a joint L-BFGS would only mix unrelated curvature and
    make every head wait for the slowest; here the heads still in progress are evaluated
    together in one matmul and a head leaves the batch once it has converged. A head stops when
    max|grad| <= tol (scikit-learn's lbfgs criterion), when its objective stops decreasing in
    float precision, or after max_iter iterations. Returns (theta, iterations of the longest head).

    `memory` (a dict, updated in place) carries each head's curvature pairs along a
    regularisation path: the penalty's Hessian is l2 * I on the weights, so a pair (s, y) stays
    exact under a new l2 after y += (l2_new - l2_old) * s. Warm starts then skip L-BFGS's slow
    first iterations.
    """
    nh = len(obj.slices)
    states = [
        _HeadLBFGS(theta[:, sl].clone(memory_format=torch.contiguous_format), history, obj.design) for sl in obj.slices
    ]
    old = memory.get("heads") if memory else None
    if old is not None and [m["k"] for m in old] == obj.num_classes:
        for st, m, l2 in zip(states, old, obj.l2s):
            if m["s"].shape[0]:
                weights = torch.ones(st.theta.shape, device=st.theta.device, dtype=torch.float64)
                weights[-1] = 0.0  # the bias is unpenalised
                st.s = m["s"]
                st.y = m["y"] + (l2 - m["l2"]) * m["s"] * weights.reshape(1, -1)
                keep = (st.s * st.y).sum(1) > 1e-10
                st.s, st.y = st.s[keep][-history:], st.y[keep][-history:]
    heads = list(range(nh))
    fs, resid = obj.head_values([st.theta for st in states], heads)
    for st, f, g in zip(states, fs, obj.head_grads([st.theta for st in states], heads, resid)):
        st.f, st.g = f, g
    active = [h for h in heads if float(states[h].g.abs().max()) > tol]
    it = 0
    while active and it < max_iter:
        it += 1
        steps, slopes, t = {}, {}, {}
        for h in active:
            st = states[h]
            m_diag = obj.head_precondition_diag(h) if precondition else None
            q = st.direction(m_diag)
            gd = float(st.g.reshape(-1) @ q.reshape(-1))
            if not gd < 0:  # not a descent direction (numerical trouble): drop the history
                st.forget()
                q = st.direction(m_diag)
                gd = float(st.g.reshape(-1) @ q.reshape(-1))
            steps[h], slopes[h] = q, gd
            # Unpreconditioned first steps are scaled like torch's LBFGS; else try the full step.
            t[h] = 1.0 if (st.s.shape[0] or precondition) else min(1.0, 1.0 / float(st.g.abs().sum()))
        # Backtracking, per head; heads whose trial point is accepted drop out of the retries.
        accepted: dict[int, tuple[torch.Tensor, float, torch.Tensor]] = {}
        pending = list(active)
        for _ in range(30):
            trial = [torch.add(states[h].theta, steps[h], alpha=t[h]) for h in pending]
            new_fs, new_resid = obj.head_values(trial, pending)
            retry, start = [], 0
            for h, th, f in zip(pending, trial, new_fs):
                k = obj.num_classes[h]
                if f <= states[h].f + 1e-4 * t[h] * slopes[h]:
                    accepted[h] = (th, f, new_resid[start : start + k])
                else:
                    t[h] *= 0.5
                    retry.append(h)
                start += k
            pending = retry
            if not pending:
                break
        # A head left pending has no representable decrease left: converged as far as float
        # precision allows, it leaves the batch.
        moved = [h for h in active if h in accepted]
        if not moved:
            break
        rows = [accepted[h][2] for h in moved]
        new_gs = obj.head_grads([accepted[h][0] for h in moved], moved, rows[0] if len(rows) == 1 else torch.cat(rows))
        still = []
        for h, new_g in zip(moved, new_gs):
            st = states[h]
            new_theta, new_f, _ = accepted[h]
            st.push(new_theta - st.theta, new_g - st.g)
            decrease = st.f - new_f
            st.theta, st.f, st.g = new_theta, new_f, new_g
            if float(new_g.abs().max()) > tol and decrease > 1e-9 * max(1.0, abs(new_f)):
                still.append(h)
        active = still
    if memory is not None:
        memory["heads"] = [
            {"k": k, "l2": l2, "s": st.s, "y": st.y} for k, l2, st in zip(obj.num_classes, obj.l2s, states)
        ]
    return torch.cat([st.theta for st in states], 1), it


def _fit_softmax_heads(
    xs: "torch.Tensor | _Design",
    targets: list[torch.Tensor],
    num_classes: list[int],
    l2s: list[float],
    init: list[tuple[torch.Tensor, torch.Tensor] | None] | None = None,
    *,
    max_iter: int = 200,
    tol: float = 1e-4,
    memory: dict | None = None,
    precondition: bool = True,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Fit independent softmax heads (one per target) on one (N, D + 1) `_standardised_design`.

    Returns one (weight (D, K), bias (K,)) per head; `init` optionally warm-starts heads and
    `memory` carries L-BFGS curvature along an l2 path on the same `_Design` (see `_lbfgs`).
    """
    design = xs if isinstance(xs, _Design) else _Design(xs)
    obj = _SoftmaxHeads(design, targets, num_classes, l2s)
    xt = design.xt
    theta = torch.zeros(xt.shape[0], sum(num_classes), device=xt.device, dtype=xt.dtype)
    for sl, start in zip(obj.slices, init or []):
        if start is not None:
            theta[:-1, sl] = start[0].to(theta)
            theta[-1, sl] = start[1].to(theta)
    theta, _ = _lbfgs(obj, theta, max_iter=max_iter, tol=tol, memory=memory, precondition=precondition)
    return [(theta[:-1, sl].clone(), theta[-1, sl].clone()) for sl in obj.slices]


def _folded(weight: torch.Tensor, bias: torch.Tensor, mean: torch.Tensor, std: torch.Tensor):
    """Weights acting on raw features: ((x - m) / s) @ W + b == x @ (W / s) + (b - (m / s) @ W)."""
    w = weight / std[:, None]
    return w, bias - mean @ w


def _check_features(features: Any, name: str = "features") -> torch.Tensor:
    if not isinstance(features, torch.Tensor):
        raise VitposError(f"{name} must be a torch.Tensor, got {type(features).__name__}")
    if not features.is_floating_point():
        raise VitposError(f"{name} must be a float tensor, got dtype {features.dtype}; cast with .float()")
    return features


class LinearProbe:
    """Multinomial logistic regression on standardised features; re-applicable across conditions.

    `position_labels` (optional, (num_patches,) int64) is the label of each patch position; with
    it, `fit` / `accuracy` take (num_images, num_patches, D) features and derive the labels.
    """

    def __init__(
        self,
        num_classes: int,
        l2: float = 1e-3,
        *,
        position_labels: torch.Tensor | None = None,
        max_iter: int = 200,
        tol: float = 1e-4,
    ):
        if int(num_classes) < 2:
            raise VitposError(f"a probe needs num_classes >= 2, got {num_classes}")
        if not (l2 >= 0.0):
            raise VitposError(f"l2 must be >= 0, got {l2}")
        self.num_classes = int(num_classes)
        self.l2 = float(l2)
        self.position_labels = None if position_labels is None else position_labels.detach().long().cpu()
        self.max_iter = int(max_iter)
        self.tol = float(tol)
        self.weight: torch.Tensor | None = None  # (D, K), acts on standardised features
        self.bias: torch.Tensor | None = None  # (K,)
        self.mean: torch.Tensor | None = None  # (D,) training mean
        self.std: torch.Tensor | None = None  # (D,) training std

    # -- shapes --------------------------------------------------------------------------------

    def _tokens_and_labels(self, features: torch.Tensor, labels: torch.Tensor | None):
        features = _check_features(features)
        if labels is None:
            if self.position_labels is None:
                raise VitposError("labels are required: this probe has no position_labels to derive them from")
            if features.ndim != 3 or features.shape[1] != self.position_labels.numel():
                raise VitposError(
                    f"features must be (num_images, {self.position_labels.numel()}, D) to derive position "
                    f"labels, got {tuple(features.shape)}"
                )
            labels = self.position_labels.to(features.device).expand(features.shape[0], -1)
        if tuple(labels.shape) != tuple(features.shape[:-1]):
            raise VitposError(
                f"labels shape {tuple(labels.shape)} must equal features shape without the last dim "
                f"{tuple(features.shape[:-1])}"
            )
        return features.reshape(-1, features.shape[-1]), labels.reshape(-1).long()

    def _require_fitted(self, d: int) -> None:
        if self.weight is None:
            raise VitposError("this probe is not fitted; call fit() or build it with LinearProbe.from_state_dict()")
        if d != self.weight.shape[0]:
            raise VitposError(f"features have D={d} but the probe was fitted on D={self.weight.shape[0]}")

    # -- API -------------------------------------------------------------------------------------

    def fit(self, features: torch.Tensor, labels: torch.Tensor | None = None, *, device=None) -> "LinearProbe":
        """Fit on (..., D) features with (...) labels (or position-derived labels, see class doc)."""
        x, y = self._tokens_and_labels(features, labels)
        if y.numel() == 0:
            raise VitposError("cannot fit a probe on zero tokens")
        if int(y.min()) < 0 or int(y.max()) >= self.num_classes:
            raise VitposError(f"labels must be in [0, {self.num_classes - 1}], got [{int(y.min())}, {int(y.max())}]")
        dev = torch.device(device) if device is not None else x.device
        x = x.to(dev, torch.float32)
        if not _all_finite(x):
            raise VitposError("features contain NaN or inf; fix the activations before probing")
        mean, std = _standardise_stats(x)
        xs = _standardised_design(x, mean, std)
        ((w, b),) = _fit_softmax_heads(
            xs, [y.to(dev)], [self.num_classes], [self.l2], max_iter=self.max_iter, tol=self.tol
        )
        self._set(w, b, mean, std)
        return self

    def _set(self, weight, bias, mean, std) -> None:
        self.weight, self.bias = weight.detach().cpu(), bias.detach().cpu()
        self.mean, self.std = mean.detach().cpu(), std.detach().cpu()

    @torch.no_grad()
    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """(..., K) logits for (..., D) features of any float dtype / device."""
        features = _check_features(features)
        self._require_fitted(features.shape[-1])
        w, b = _folded(self.weight, self.bias, self.mean, self.std)
        w, b = w.to(features.device), b.to(features.device)
        x = features.reshape(-1, features.shape[-1])
        out = torch.cat(
            [torch.addmm(b, x[i : i + _EVAL_CHUNK_TOKENS].float(), w) for i in range(0, x.shape[0], _EVAL_CHUNK_TOKENS)]
        ) if x.shape[0] else x.new_zeros(0, self.num_classes, dtype=torch.float32)
        return out.reshape(*features.shape[:-1], self.num_classes)

    def predict(self, features: torch.Tensor) -> torch.Tensor:
        """(...) predicted labels for (..., D) features."""
        return self.logits(features).argmax(-1)

    def accuracy(self, features: torch.Tensor, labels: torch.Tensor | None = None) -> float:
        """Fraction of tokens predicted correctly; labels derived from positions when omitted."""
        x, y = self._tokens_and_labels(features, labels)
        if y.numel() == 0:
            raise VitposError("cannot score a probe on zero tokens")
        return float((self.predict(x) == y.to(x.device)).float().mean())

    def state_dict(self) -> dict[str, torch.Tensor]:
        """All tensors (safetensors-friendly): weight, bias, mean, std, l2, num_classes[, position_labels]."""
        self._require_fitted(self.weight.shape[0] if self.weight is not None else -1)
        sd = {
            "weight": self.weight.clone(),
            "bias": self.bias.clone(),
            "mean": self.mean.clone(),
            "std": self.std.clone(),
            "l2": torch.tensor(self.l2, dtype=torch.float64),
            "num_classes": torch.tensor(self.num_classes, dtype=torch.int64),
        }
        if self.position_labels is not None:
            sd["position_labels"] = self.position_labels.clone()
        return sd

    @classmethod
    def from_state_dict(cls, sd: dict[str, torch.Tensor]) -> "LinearProbe":
        missing = {"weight", "bias", "mean", "std", "l2", "num_classes"} - set(sd)
        if missing:
            raise VitposError(f"probe state dict lacks {sorted(missing)}; save it with LinearProbe.state_dict()")
        probe = cls(int(sd["num_classes"]), float(sd["l2"]), position_labels=sd.get("position_labels"))
        d, k = sd["weight"].shape
        if k != probe.num_classes or sd["bias"].shape != (k,) or sd["mean"].shape != (d,) or sd["std"].shape != (d,):
            raise VitposError("probe state dict has inconsistent shapes; re-save it with LinearProbe.state_dict()")
        probe._set(sd["weight"].float(), sd["bias"].float(), sd["mean"].float(), sd["std"].float())
        return probe


# --------------------------------------------------------------------------------------------
# Position probes on one layer
# --------------------------------------------------------------------------------------------


@dataclass
class ProbeResult:
    """Test accuracies of the row / column probes on one set of activations, plus the probes."""

    row_acc: float
    col_acc: float
    row_control_acc: float | None
    col_control_acc: float | None
    row_selectivity: float | None
    col_selectivity: float | None
    chance_row: float
    chance_col: float
    l2_row: float
    l2_col: float
    n_train_images: int
    n_test_images: int
    n_train_tokens: int
    grid: tuple[int, int]
    l2_grid: tuple[float, ...]
    row_val_acc: list[float]  # validation accuracy per l2_grid entry (what chose l2_row)
    col_val_acc: list[float]
    train_image_ids: list[Any] = field(repr=False)
    val_image_ids: list[Any] = field(repr=False)  # a subset of train_image_ids
    test_image_ids: list[Any] = field(repr=False)
    row_probe: LinearProbe = field(repr=False)
    col_probe: LinearProbe = field(repr=False)
    row_control_probe: LinearProbe | None = field(default=None, repr=False)
    col_control_probe: LinearProbe | None = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able metrics (no probes, no image id lists)."""
        return {
            "row_acc": self.row_acc,
            "col_acc": self.col_acc,
            "row_control_acc": self.row_control_acc,
            "col_control_acc": self.col_control_acc,
            "row_selectivity": self.row_selectivity,
            "col_selectivity": self.col_selectivity,
            "chance_row": self.chance_row,
            "chance_col": self.chance_col,
            "l2_row": self.l2_row,
            "l2_col": self.l2_col,
            "n_train_images": self.n_train_images,
            "n_test_images": self.n_test_images,
            "n_train_tokens": self.n_train_tokens,
            "grid": list(self.grid),
            "l2_grid": list(self.l2_grid),
            "row_val_acc": list(self.row_val_acc),
            "col_val_acc": list(self.col_val_acc),
        }


@torch.no_grad()
def _head_accuracies(
    features: torch.Tensor,
    images: torch.Tensor,
    heads: list[tuple[torch.Tensor, torch.Tensor]],
    labels: list[torch.Tensor],
    mean: torch.Tensor,
    std: torch.Tensor,
    device: torch.device,
) -> list[float]:
    """Accuracy of each head on all tokens of `images`, streaming images to bound memory."""
    folded = [_folded(w, b, mean, std) for w, b in heads]
    w = torch.cat([f[0] for f in folded], 1)
    b = torch.cat([f[1] for f in folded])
    sizes = [f[1].numel() for f in folded]
    num_patches = features.shape[1]
    labels = [y.to(device) for y in labels]
    correct = torch.zeros(len(heads), dtype=torch.float64)
    per_chunk = max(1, _EVAL_CHUNK_TOKENS // num_patches)
    for i in range(0, images.numel(), per_chunk):
        x = features[images[i : i + per_chunk]].to(device, torch.float32)
        logits = torch.addmm(b, x.reshape(-1, x.shape[-1]), w).reshape(x.shape[0], num_patches, -1)
        for h, part in enumerate(logits.split(sizes, -1)):
            correct[h] += (part.argmax(-1) == labels[h]).sum().item()
    return (correct / (images.numel() * num_patches)).tolist()


from vitpos.runtime.device import full_precision, resolve_device  # noqa: E402 - device/amp plumbing (docs/distributed.md)


@full_precision  # the fit stays float32 under an outer --amp autocast (model forwards)
def fit_position_probes(
    features: torch.Tensor,
    grid: Sequence[int],
    image_ids: Sequence[Any] | torch.Tensor | None = None,
    *,
    seed: int = 0,
    test_frac: float = 0.25,
    val_frac: float = 0.2,
    l2_grid: Sequence[float] = DEFAULT_L2_GRID,
    control: bool = True,
    device: str | torch.device | None = None,
    max_train_tokens: int | None = DEFAULT_MAX_TRAIN_TOKENS,
    max_iter: int = 200,
    tol: float = 1e-4,
) -> ProbeResult:
    """Fit row and column probes on (num_images, H*W, D) patch features and score them on held-out images.

    image_ids: optional id per image (row of `features`); rows sharing an id share a split.
    device: where to fit (e.g. 'cuda'); default: the features' device.
    max_train_tokens: cap on training tokens, drawn position-balanced from the training images
        only (None: use all). Validation and test always use every token of their images.
    The control probes use the l2 chosen for the real probe (same probe, control task).
    Deterministic given `seed`.
    """
    features = _check_features(features)
    h, w = _check_grid(grid)
    if features.ndim != 3:
        raise VitposError(
            f"features must be (num_images, num_patches, D), got shape {tuple(features.shape)}; "
            "stack per-image patch tokens (prefix tokens stripped)"
        )
    n_img, n_patch, d = features.shape
    if n_patch != h * w:
        raise VitposError(
            f"features have {n_patch} patches per image but grid {h}x{w} has {h * w}; "
            "pass the model's patch grid and strip CLS/register tokens"
        )
    if h < 2 or w < 2:
        raise VitposError(f"grid {h}x{w} needs at least 2 rows and 2 columns to probe both axes")
    l2_grid = tuple(float(v) for v in l2_grid)
    if not l2_grid or any(not (v > 0) for v in l2_grid):
        raise VitposError(f"l2_grid must be a non-empty sequence of positive numbers, got {l2_grid}")
    if image_ids is None:
        image_ids = list(range(n_img))
    ids = image_ids.reshape(-1).tolist() if isinstance(image_ids, torch.Tensor) else list(image_ids)
    if len(ids) != n_img:
        raise VitposError(f"image_ids has {len(ids)} entries but features have {n_img} images")
    dev = resolve_device(device) if device is not None else features.device  # accepts auto|cpu|cuda

    split = split_images(ids, seed=seed, test_frac=test_frac, val_frac=val_frac)
    img_idx, patch_idx = sample_train_tokens(split.train, n_patch, max_train_tokens, seed=seed)
    targets = {"row": position_labels(grid, "row"), "col": position_labels(grid, "col")}
    ctrl = {"row": control_labels(grid, "row", seed), "col": control_labels(grid, "col", seed)}

    x_train = features[img_idx, patch_idx].to(dev, torch.float32)
    if not _all_finite(x_train):
        raise VitposError("features contain NaN or inf; fix the activations before probing")
    patch_dev = patch_idx.to(dev)
    in_fit = torch.isin(img_idx, split.fit)

    # 1) choose l2 per probe on the validation images, fitting on the rest of the train images
    x_fit = x_train[in_fit.to(dev)]
    mean_fit, std_fit = _standardise_stats(x_fit)
    xs_fit = _Design(_standardised_design(x_fit, mean_fit, std_fit))
    del x_fit
    y_fit = [targets[t].to(dev)[patch_dev[in_fit.to(dev)]] for t in ("row", "col")]
    val_by_l2: dict[str, dict[float, float]] = {"row": {}, "col": {}}
    best: dict[str, tuple[float, float, tuple[torch.Tensor, torch.Tensor]]] = {}
    heads, memory = None, {}
    # Largest l2 first: each fit warm-starts the next, weaker-regularised one (a path).
    for l2 in sorted(set(l2_grid), reverse=True):
        heads = _fit_softmax_heads(
            xs_fit, y_fit, [h, w], [l2, l2], heads, max_iter=max_iter, tol=tol, memory=memory
        )
        accs = _head_accuracies(features, split.val, heads, [targets["row"], targets["col"]], mean_fit, std_fit, dev)
        for t, acc, head in zip(("row", "col"), accs, heads):
            val_by_l2[t][l2] = acc
            # Strict '>' keeps the larger (safer) l2 on ties.
            if t not in best or acc > best[t][0]:
                best[t] = (acc, l2, head)
    del xs_fit, y_fit

    # 2) refit on all training images with the chosen l2; controls share the chosen l2
    mean, std = _standardise_stats(x_train)
    xs_train = _Design(_standardised_design(x_train, mean, std))
    del x_train
    names = ["row", "col"] + (["row_control", "col_control"] if control else [])
    labels = [targets["row"], targets["col"]] + ([ctrl["row"], ctrl["col"]] if control else [])
    l2s = [best["row"][1], best["col"][1]] * (2 if control else 1)
    sizes = [h, w] * (2 if control else 1)
    init = [best["row"][2], best["col"][2]] + ([None, None] if control else [])
    final = _fit_softmax_heads(
        xs_train, [y.to(dev)[patch_dev] for y in labels], sizes, l2s, init, max_iter=max_iter, tol=tol
    )
    del xs_train
    test_acc = dict(zip(names, _head_accuracies(features, split.test, final, labels, mean, std, dev)))

    probes = {}
    for name, (wt, bs), y, k, l2 in zip(names, final, labels, sizes, l2s):
        probe = LinearProbe(k, l2, position_labels=y, max_iter=max_iter, tol=tol)
        probe._set(wt, bs, mean, std)
        probes[name] = probe

    def ids_of(rows: torch.Tensor) -> list[Any]:
        return list(dict.fromkeys(ids[r] for r in rows.tolist()))

    rc, cc = test_acc.get("row_control"), test_acc.get("col_control")
    return ProbeResult(
        row_acc=test_acc["row"],
        col_acc=test_acc["col"],
        row_control_acc=rc,
        col_control_acc=cc,
        row_selectivity=None if rc is None else test_acc["row"] - rc,
        col_selectivity=None if cc is None else test_acc["col"] - cc,
        chance_row=1.0 / h,
        chance_col=1.0 / w,
        l2_row=best["row"][1],
        l2_col=best["col"][1],
        n_train_images=len(ids_of(split.train)),
        n_test_images=len(ids_of(split.test)),
        n_train_tokens=int(patch_idx.numel()),
        grid=(h, w),
        l2_grid=l2_grid,
        row_val_acc=[val_by_l2["row"][v] for v in l2_grid],
        col_val_acc=[val_by_l2["col"][v] for v in l2_grid],
        train_image_ids=ids_of(split.train),
        val_image_ids=ids_of(split.val),
        test_image_ids=ids_of(split.test),
        row_probe=probes["row"],
        col_probe=probes["col"],
        row_control_probe=probes.get("row_control"),
        col_control_probe=probes.get("col_control"),
    )


# --------------------------------------------------------------------------------------------
# Position probes across layers
# --------------------------------------------------------------------------------------------


@dataclass
class LayerProbeResults:
    """One ProbeResult per layer (ascending layer order), with per-layer metric lists."""

    layers: list[int]
    results: list[ProbeResult] = field(repr=False)

    def _metric(self, name: str) -> list[Any]:
        return [getattr(r, name) for r in self.results]

    @property
    def row_acc(self) -> list[float]:
        return self._metric("row_acc")

    @property
    def col_acc(self) -> list[float]:
        return self._metric("col_acc")

    @property
    def row_control_acc(self) -> list[float | None]:
        return self._metric("row_control_acc")

    @property
    def col_control_acc(self) -> list[float | None]:
        return self._metric("col_control_acc")

    @property
    def row_selectivity(self) -> list[float | None]:
        return self._metric("row_selectivity")

    @property
    def col_selectivity(self) -> list[float | None]:
        return self._metric("col_selectivity")

    @property
    def chance_row(self) -> float:
        return self.results[0].chance_row

    @property
    def chance_col(self) -> float:
        return self.results[0].chance_col

    def __getitem__(self, layer: int) -> ProbeResult:
        try:
            return self.results[self.layers.index(layer)]
        except ValueError:
            raise VitposError(f"layer {layer} was not probed; probed layers are {self.layers}") from None

    def to_json(self, site: str) -> dict[str, Any]:
        """The probe.json payload for activations captured at `site` (e.g. 'resid_post')."""
        return {
            "layers": list(self.layers),
            "site": site,
            "row_acc": self.row_acc,
            "col_acc": self.col_acc,
            "chance_row": self.chance_row,
            "chance_col": self.chance_col,
            "row_control_acc": self.row_control_acc,
            "col_control_acc": self.col_control_acc,
            "row_selectivity": self.row_selectivity,
            "col_selectivity": self.col_selectivity,
            "l2_row": self._metric("l2_row"),
            "l2_col": self._metric("l2_col"),
            "n_train_images": self.results[0].n_train_images,
            "n_test_images": self.results[0].n_test_images,
        }


def probe_layers(
    features_by_layer: dict[int, torch.Tensor], grid: Sequence[int], **kw: Any
) -> LayerProbeResults:
    """`fit_position_probes` on each layer's (num_images, H*W, D) features, all with one image split.

    Keyword arguments go to `fit_position_probes`; the same seed gives every layer the same
    train/val/test images, so layers are compared on identical data.
    """
    if not isinstance(features_by_layer, dict) or not features_by_layer:
        raise VitposError("features_by_layer must be a non-empty dict {layer: (num_images, num_patches, D) tensor}")
    layers = sorted(features_by_layer)
    shapes = {l: tuple(getattr(features_by_layer[l], "shape", ())) for l in layers}
    n_imgs = {s[0] if s else None for s in shapes.values()}
    if len(n_imgs) != 1:
        raise VitposError(f"every layer must hold the same images, got shapes {shapes}")
    results = []
    for layer in layers:
        try:
            results.append(fit_position_probes(features_by_layer[layer], grid, **kw))
        except VitposError as e:
            raise VitposError(f"layer {layer}: {e}") from e
    return LayerProbeResults(layers=[int(l) for l in layers], results=results)
