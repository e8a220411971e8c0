"""How work runs, as opposed to what it computes: the device and mixed precision of a step and the
retry of a batch that runs out of memory (``device``), the torchrun process group and its rank
environment (``dist``), and the settings a command hands down explicitly to the library calls that
do the work (``options.RunOptions``). Nothing here knows about models, stores or SAEs.
"""
