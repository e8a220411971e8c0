"""vitpos: where Vision Transformers keep spatial position (APE vs RoPE)."""

__version__ = "0.1.0"
