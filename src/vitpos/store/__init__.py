"""The on-disk activation store: captured activations streamed to disk in safetensors shards and
read back in bounded memory. ``manifest`` is the format (file names, storage dtypes, the validated
``Manifest``), ``writer`` the resumable ``ActivationWriter``, ``reader`` the ``ActivationStore`` and
``TokenDataset``, and ``capture`` fills a store from a model surface in one process or under
torchrun (docs/store-format.md, docs/distributed.md).
"""
