"""runtime.device: what the run reports about the machine it runs on."""

def test_peak_memory_sees_an_allocation():
    """The run logs its peak memory after each stage: it must move when memory is touched."""
    import numpy as np

    from vitpos.runtime.device import peak_memory_gb

    before = peak_memory_gb()
    assert before is not None and 0.01 < before < 1000
    block = np.ones(400_000_000 // 8)  # 0.4 GB, every page written
    after = peak_memory_gb()
    assert after is not None and after >= max(before, block.nbytes / 1e9)


def test_trimmed_yields_every_batch_and_releases_memory_after_each_body(monkeypatch):
    from vitpos.runtime import device

    events: list[str] = []
    monkeypatch.setattr(device, "release_freed_memory", lambda: events.append("release"))
    for b in device.trimmed(iter(["a", "b", "c"])):
        events.append(b)
    assert events == ["a", "release", "b", "release", "c", "release"]


def test_release_freed_memory_reaches_glibc_on_linux():
    import sys

    from vitpos.runtime import device

    device.release_freed_memory()  # never raises, on any platform
    if sys.platform.startswith("linux") and device._load_libc() is not False:
        assert device._LIBC is not False and device._LIBC is not None
