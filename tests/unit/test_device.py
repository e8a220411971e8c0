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
