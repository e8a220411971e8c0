import json

import pytest
import torch
from safetensors import safe_open
from torch.profiler import ProfilerActivity, profile

from vitpos.errors import VitposError
from vitpos.io import read_safetensors, write_safetensors
from vitpos.store.manifest import ROUNDTRIP_ERROR
from vitpos.store.reader import ActivationStore
from vitpos.store.writer import ActivationWriter

GRID = (3, 5)
N = 15
SITES = ["blocks.0.resid_post", "blocks.3.attn.out"]
DIMS = {"blocks.0.resid_post": 8, "blocks.3.attn.out": 6}
META = {"model": {"name": "tiny", "pos": "ape"}, "data": "shapes", "split": "val", "seed": 0}


def make_acts(n_images, prefix, seed=0, dims=DIMS):
    g = torch.Generator().manual_seed(seed)
    return {s: torch.randn(n_images, prefix + N, d, generator=g) for s, d in dims.items()}


def write(out, acts, *, prefix=1, batches=(3,), shard_images=4, meta=META, **kw):
    n = next(iter(acts.values())).shape[0]
    labels, ids = torch.arange(n) % 3, torch.arange(n) + 1000
    with ActivationWriter(out, sites=list(acts), grid=GRID, num_prefix_tokens=prefix, meta=meta,
                          shard_images=shard_images, **kw) as w:
        i, k = 0, 0
        while i < n:
            b = batches[k % len(batches)]
            w.add({s: a[i : i + b] for s, a in acts.items()}, labels[i : i + b], ids[i : i + b])
            i, k = i + b, k + 1
    return labels, ids


def test_roundtrip_bit_identical_across_shards_with_partial_last(tmp_path):
    acts = make_acts(11, prefix=1)
    labels, ids = write(tmp_path, acts, batches=(3, 5, 2, 1), shard_images=4)
    m = json.loads((tmp_path / "manifest.json").read_text())
    assert [s["num_images"] for s in m["shards"]] == [4, 4, 3]
    assert sorted(p.name for p in tmp_path.glob("shard-*")) == [f"shard-0000{i}.safetensors" for i in range(3)]
    assert m["complete"] is True and m["num_images"] == 11 and m["d"] == DIMS and m["dtype"] == "float32"

    st = ActivationStore(tmp_path)
    assert st.sites == SITES and st.grid == GRID and st.num_images == 11 and st.complete and st.meta == META
    for site in SITES:
        got = list(st.iter_images(site, batch_images=3))
        assert [x.shape[0] for x, _, _ in got] == [3, 3, 3, 2]  # batches cross shard boundaries
        x = torch.cat([g[0] for g in got])
        want = acts[site][:, 1:]
        assert x.dtype == torch.float32 and x.shape == (11, N, DIMS[site])
        assert torch.equal(x.view(torch.int32), want.contiguous().view(torch.int32))  # bit-identical
        assert torch.equal(torch.cat([g[1] for g in got]), labels)
        assert torch.equal(torch.cat([g[2] for g in got]), ids)
        assert torch.equal(st.load_site(site), want)
        assert torch.equal(st.load_site(site, max_images=5), want[:5])
    lab, iid = st.load_labels()
    assert torch.equal(lab, labels) and torch.equal(iid, ids)


def test_prefix_tokens_stripped_or_kept_separately(tmp_path):
    acts = make_acts(6, prefix=2)
    for a in acts.values():
        a[:, :2] = 1e4  # prefix tokens are recognisable; patches are randn
    write(tmp_path / "drop", acts, prefix=2)
    write(tmp_path / "keep", acts, prefix=2, keep_prefix=True)

    drop, keep = ActivationStore(tmp_path / "drop"), ActivationStore(tmp_path / "keep")
    for site in SITES:
        x = drop.load_site(site)
        assert x.shape == (6, N, DIMS[site]) and x.abs().max() < 100
        assert torch.equal(x, acts[site][:, 2:])
        assert torch.equal(keep.load_site(site), acts[site][:, 2:])
        p = keep.load_site(site, prefix=True)
        assert p.shape == (6, 2, DIMS[site]) and torch.equal(p, acts[site][:, :2])
        assert torch.equal(torch.cat([b[0] for b in keep.iter_images(site, 4, prefix=True)]), acts[site][:, :2])
    with safe_open(str(tmp_path / "drop" / "shard-00000.safetensors"), "pt") as f:
        assert set(f.keys()) == {*SITES, "labels", "image_ids"}
    with safe_open(str(tmp_path / "keep" / "shard-00000.safetensors"), "pt") as f:
        assert set(f.keys()) == {*SITES, *(s + "::prefix" for s in SITES), "labels", "image_ids"}
    with pytest.raises(VitposError, match="keep_prefix"):
        drop.load_site(SITES[0], prefix=True)


def test_rows_cols_for_3x5_grid_match_token_positions(tmp_path):
    # Encode each patch's (row, col) in its activation so the reader's indices can be checked against the data.
    acts = {"s": torch.zeros(7, 1 + N, 3)}
    for n in range(N):
        acts["s"][:, 1 + n, 0] = n // 5
        acts["s"][:, 1 + n, 1] = n % 5
    acts["s"][:, 0] = -1
    acts["s"][:, :, 2] = torch.arange(7, dtype=torch.float32)[:, None]
    labels, ids = write(tmp_path, acts, shard_images=3)
    st = ActivationStore(tmp_path)
    assert st.rows.tolist() == [0] * 5 + [1] * 5 + [2] * 5
    assert st.cols.tolist() == [0, 1, 2, 3, 4] * 3
    assert st.rows.dtype == st.cols.dtype == torch.int64
    for shuffle in (False, True):
        seen = 0
        for x, r, c, iid in st.iter_tokens("s", batch_tokens=8, shuffle=shuffle, seed=1):
            assert torch.equal(x[:, 0].long(), r) and torch.equal(x[:, 1].long(), c)
            assert torch.equal(ids[x[:, 2].long()], iid)
            seen += x.shape[0]
        assert seen == 7 * N


def test_resume_after_crash_equals_uninterrupted_write(tmp_path):
    acts = make_acts(14, prefix=1, seed=3)
    labels, ids = torch.arange(14) % 3, torch.arange(14) + 1000
    write(tmp_path / "full", acts, batches=(3,), shard_images=4)

    out = tmp_path / "resumed"
    kw = dict(sites=SITES, grid=GRID, num_prefix_tokens=1, meta=META, shard_images=4)
    with pytest.raises(RuntimeError, match="killed"):
        with ActivationWriter(out, **kw) as w:
            for i in range(0, 9, 3):
                w.add({s: a[i : i + 3] for s, a in acts.items()}, labels[i : i + 3], ids[i : i + 3])
            raise RuntimeError("killed")
    m = json.loads((out / "manifest.json").read_text())
    assert m["complete"] is False and m["num_images"] == 8 and len(m["shards"]) == 2
    with pytest.raises(VitposError, match="interrupted; rerun the same capture command to resume"):
        ActivationStore(out)
    partial = ActivationStore(out, allow_incomplete=True)
    assert not partial.complete
    assert torch.equal(partial.load_site(SITES[0]), acts[SITES[0]][:8, 1:])  # shards written are intact
    # A kill between writing a shard and recording it leaves an unlisted file: resume must drop it.
    (out / "shard-00002.safetensors").write_bytes(b"half-written")

    with ActivationWriter(out, **kw) as w:
        assert w.num_done == 8 and not w.was_complete
        assert not (out / "shard-00002.safetensors").exists()
        for i in range(w.num_done, 14, 3):
            w.add({s: a[i : i + 3] for s, a in acts.items()}, labels[i : i + 3], ids[i : i + 3])
    full_files = sorted(p.name for p in (tmp_path / "full").iterdir())
    assert full_files == sorted(p.name for p in out.iterdir())
    assert (out / "manifest.json").read_text() == (tmp_path / "full" / "manifest.json").read_text()
    for name in full_files[1:]:  # same shards, tensor for tensor, bit for bit
        got, want = read_safetensors(out / name), read_safetensors(tmp_path / "full" / name)
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want), name
        with safe_open(str(out / name), "pt") as f, safe_open(str(tmp_path / "full" / name), "pt") as g:
            assert f.metadata() == g.metadata()
    st = ActivationStore(out)
    assert st.complete and torch.equal(st.load_site(SITES[1]), acts[SITES[1]][:, 1:])

    # Reopening a complete store: nothing to do, and it stays complete.
    with ActivationWriter(out, **kw) as w:
        assert w.num_done == 14 and w.was_complete
    assert ActivationStore(out).complete


def test_resume_with_different_meta_or_settings_is_refused(tmp_path):
    acts = make_acts(5, prefix=1)
    write(tmp_path, acts)
    kw = dict(sites=SITES, grid=GRID, num_prefix_tokens=1, shard_images=4)
    with pytest.raises(VitposError, match=r"seed.*--out.*--force"):
        ActivationWriter(tmp_path, meta={**META, "seed": 1}, **kw)
    with pytest.raises(VitposError, match="num_prefix_tokens"):
        ActivationWriter(tmp_path, meta=META, **{**kw, "num_prefix_tokens": 0})
    with pytest.raises(VitposError, match="dtype"):
        ActivationWriter(tmp_path, meta=META, dtype=torch.float16, **kw)
    with pytest.raises(VitposError, match="sites"):
        ActivationWriter(tmp_path, meta=META, **{**kw, "sites": SITES[:1]})
    # The refused attempts left the store untouched.
    assert torch.equal(ActivationStore(tmp_path).load_site(SITES[0]), acts[SITES[0]][:, 1:])
    # Same meta with another key order is not a mismatch.
    with ActivationWriter(tmp_path, meta={**META, "model": {"pos": "ape", "name": "tiny"}}, **kw) as w:
        assert w.num_done == 5
    with ActivationWriter(tmp_path, meta={**META, "seed": 1}, force=True, **kw) as w:
        assert w.num_done == 0
    assert list(tmp_path.glob("shard-*")) == [] and ActivationStore(tmp_path).num_images == 0


def _peak_cpu_alloc_bytes(fn):
    """Peak of live CPU tensor bytes allocated during fn(), from the allocator events the profiler records."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted(
        (e.start_ns(), e.nbytes())
        for e in prof.profiler.kineto_results.events()
        if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU
    )
    cur = peak = 0
    for _, b in events:
        cur += b
        peak = max(peak, cur)
    return peak


def test_reader_memory_stays_bounded_to_about_two_shards(tmp_path):
    n_shards, s_img, d = 10, 16, 64
    with ActivationWriter(tmp_path, sites=["s"], grid=GRID, num_prefix_tokens=1, meta={}, shard_images=s_img) as w:
        for k in range(n_shards):
            w.add({"s": torch.randn(s_img, 1 + N, d)}, torch.zeros(s_img, dtype=torch.long),
                  torch.arange(s_img) + k * s_img)
    st = ActivationStore(tmp_path)
    shard = s_img * N * d * 4
    slack = 8 * 1024  # safetensors header bytes, index tensors

    # Sanity: the measurement sees a whole-store load.
    assert _peak_cpu_alloc_bytes(lambda: st.load_site("s")) >= n_shards * shard

    def consume_images():
        for x, _, _ in st.iter_images("s", batch_images=5):
            x.sum()

    peak = _peak_cpu_alloc_bytes(consume_images)
    batch = 5 * N * d * 4
    # One shard being read, the previous one pinned by the consumer's last batch view, plus a
    # shard-straddling batch being assembled (its carried tail + the concatenated batch).
    assert shard <= peak <= 2 * shard + 2 * batch + slack, (peak, shard)
    assert shard <= st.peak_buffer_bytes <= 2 * shard

    def consume_shuffled():
        for x, *_ in st.iter_tokens("s", batch_tokens=100, shuffle=True, seed=0):
            x.sum()

    peak = _peak_cpu_alloc_bytes(consume_shuffled)
    buffer = (s_img * N + 100 + s_img * N) * (d * 4 + 16)  # default buffer = one shard, + batch + incoming shard
    assert peak <= buffer + shard + 2 * 100 * d * 4 + slack, (peak, shard)
    assert peak < n_shards * shard / 2


def test_shuffled_tokens_are_a_deterministic_permutation(tmp_path):
    n_img = 23  # shards of 5,5,5,5,3
    acts = torch.zeros(n_img, 1 + N, 2)
    acts[:, 1:, 0] = torch.arange(n_img * N, dtype=torch.float32).view(n_img, N)  # unique token id
    write(tmp_path, {"s": acts}, batches=(4,), shard_images=5)
    st = ActivationStore(tmp_path)

    def run(**kw):
        batches = list(st.iter_tokens("s", batch_tokens=32, **kw))
        tok = torch.cat([b[0][:, 0] for b in batches]).long()
        # indices travel with their token
        for x, r, c, iid in batches:
            t = x[:, 0].long()
            assert torch.equal(r, (t % N) // 5) and torch.equal(c, t % 5) and torch.equal(iid, t // N + 1000)
        return tok, [b[0].shape[0] for b in batches]

    plain, _ = run()
    assert torch.equal(plain, torch.arange(n_img * N))
    a, sizes = run(shuffle=True, seed=7)
    assert torch.equal(a.sort().values, torch.arange(n_img * N))  # nothing lost or duplicated
    assert all(s == 32 for s in sizes[:-1]) and sum(sizes) == n_img * N
    b, _ = run(shuffle=True, seed=7)
    c, _ = run(shuffle=True, seed=8)
    assert torch.equal(a, b) and not torch.equal(a, c) and not torch.equal(a, plain)
    for buf in (0, 1000):
        t, _ = run(shuffle=True, seed=1, buffer_tokens=buf)
        assert torch.equal(t.sort().values, torch.arange(n_img * N))
    # Worker split: disjoint shard subsets together cover every token once.
    parts = [torch.cat([x[:, 0] for x, *_ in st.iter_tokens("s", 32, shuffle=True, shard_indices=range(k, 5, 2))])
             for k in (0, 1)]
    assert torch.equal(torch.cat(parts).long().sort().values, torch.arange(n_img * N))

    ds = st.token_dataset("s", batch_tokens=50, shuffle=True, seed=2)
    loader = torch.utils.data.DataLoader(ds, batch_size=None)
    e0 = torch.cat([x[:, 0] for x, *_ in loader]).long()
    ds.set_epoch(1)
    e1 = torch.cat([x[:, 0] for x, *_ in loader]).long()
    assert torch.equal(e0.sort().values, torch.arange(n_img * N)) and not torch.equal(e0, e1)
    singles = list(st.token_dataset("s", batch_tokens=None))
    assert len(singles) == n_img * N and singles[0][0].shape == (2,)


@pytest.mark.parametrize("dtype,name", [(torch.float16, "float16"), (torch.bfloat16, "bfloat16")])
def test_low_precision_roundtrip_within_documented_bound(tmp_path, dtype, name):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(9, 1 + N, 16, generator=g)
    x = x * 10 ** (torch.rand(9, 1 + N, 16, generator=g) * 9 - 6)  # |x| ~ 1e-6..1e3
    write(tmp_path, {"s": x}, dtype=dtype)
    st = ActivationStore(tmp_path)
    assert st.dtype == name
    with safe_open(str(tmp_path / "shard-00000.safetensors"), "pt") as f:
        assert f.get_slice("s").get_dtype() == {"float16": "F16", "bfloat16": "BF16"}[name]
    y = st.load_site("s")
    assert y.dtype == torch.float32
    rel, abs_ = ROUNDTRIP_ERROR[name]
    want = x[:, 1:]
    err = (y - want).abs()
    assert (err <= rel * want.abs() + abs_).all()
    assert err.max() > 0  # really stored at low precision
    assert (err / (rel * want.abs() + abs_)).max() > 0.3  # and the bound is not vacuous


def test_fp16_overflow_is_refused(tmp_path):
    x = torch.randn(2, 1 + N, 4)
    x[0, 3, 1] = 1e5
    with pytest.raises(VitposError, match="float16"):
        write(tmp_path, {"s": x}, dtype=torch.float16)


def test_corrupt_missing_or_incomplete_store_errors(tmp_path):
    with pytest.raises(VitposError, match="no activation store"):
        ActivationStore(tmp_path / "nope")
    acts = make_acts(10, prefix=1)
    write(tmp_path / "a", acts, shard_images=4)
    shard1 = tmp_path / "a" / "shard-00001.safetensors"
    good = shard1.read_bytes()

    shard1.write_bytes(good[: len(good) // 2])  # truncated
    st = ActivationStore(tmp_path / "a")
    with pytest.raises(VitposError, match=r"shard-00001.*corrupt"):
        list(st.iter_images(SITES[0]))
    with pytest.raises(VitposError, match="shard-00001"):
        st.load_site(SITES[0])
    with pytest.raises(VitposError, match="shard-00001"):
        ActivationWriter(tmp_path / "a", sites=SITES, grid=GRID, num_prefix_tokens=1, meta=META, shard_images=4)

    shard1.write_bytes(b"\x07" * 64)  # garbage
    with pytest.raises(VitposError, match="shard-00001"):
        list(st.iter_tokens(SITES[1]))

    # A valid safetensors file with the wrong contents is caught by the header check.
    write_safetensors(shard1, {SITES[0]: torch.zeros(4, N, 3), "labels": torch.zeros(4, dtype=torch.int64),
                               "image_ids": torch.zeros(4, dtype=torch.int64)})
    with pytest.raises(VitposError, match=r"shard-00001.*expected"):
        st.load_site(SITES[0])

    shard1.unlink()
    with pytest.raises(VitposError, match="missing"):
        ActivationStore(tmp_path / "a")
    (tmp_path / "a" / "manifest.json").write_text("{not json")
    with pytest.raises(VitposError, match="not valid JSON"):
        ActivationStore(tmp_path / "a")


def test_writer_rejects_bad_batches_and_loader_guards_memory(tmp_path):
    with ActivationWriter(tmp_path, sites=["s"], grid=GRID, num_prefix_tokens=1, meta={}, shard_images=4) as w:
        with pytest.raises(VitposError, match=r"expected shape \(2, 16, D\)"):
            w.add({"s": torch.zeros(2, 15, 4)}, torch.zeros(2, dtype=torch.long), torch.arange(2))
        with pytest.raises(VitposError, match="missing"):
            w.add({"t": torch.zeros(2, 16, 4)}, torch.zeros(2, dtype=torch.long), torch.arange(2))
        with pytest.raises(VitposError, match="integers"):
            w.add({"s": torch.zeros(2, 16, 4)}, torch.zeros(2), torch.arange(2))
        w.add({"s": torch.zeros(6, 16, 4)}, torch.zeros(6, dtype=torch.long), torch.arange(6))
        with pytest.raises(VitposError, match="D=5"):
            w.add({"s": torch.zeros(1, 16, 5)}, torch.zeros(1, dtype=torch.long), torch.arange(1))
        assert w.num_done == 6
    st = ActivationStore(tmp_path)
    assert st.num_images == 6  # rejected batches stored nothing
    with pytest.raises(VitposError, match="max_bytes"):
        st.load_site("s", max_bytes=1000)
    assert st.load_site("s", max_images=2, max_bytes=1000).shape == (2, N, 4)
    with pytest.raises(VitposError, match="not in the store"):
        st.iter_images("nope")


def test_a_shard_copied_from_another_store_or_slot_is_refused(tmp_path):
    """Every shard's header names its capture (a digest of the store's meta) and its index: a shard
    of a store of other meta (another model) with the very same shapes, or a shard moved to another
    slot, is one VitposError naming it, not read as this store's activations."""
    import shutil

    acts = make_acts(8, 1)
    write(tmp_path / "a", acts)
    write(tmp_path / "b", make_acts(8, 1, seed=1), meta={**META, "model": "other"})
    shutil.copy(tmp_path / "b" / "shard-00001.safetensors", tmp_path / "a" / "shard-00001.safetensors")
    with pytest.raises(VitposError, match=r"shard-00001\.safetensors was captured by another capture"):
        ActivationStore(tmp_path / "a").load_site(SITES[0])
    shutil.copy(tmp_path / "a" / "shard-00000.safetensors", tmp_path / "a" / "shard-00001.safetensors")
    with pytest.raises(VitposError, match=r"is shard 0 of its store, but manifest\.json lists it as shard 1"):
        ActivationStore(tmp_path / "a").load_site(SITES[0])
