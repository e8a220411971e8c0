"""sae.json as the measurements that read a trained SAE see it: the keys they need, checked once
(the rest of the file is kept as written)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from vitpos.io import read_json, validate_doc


class SAEDescription(BaseModel):
    """The keys of sae.json that ape-permute and the latent browser read (the rest is kept as it is)."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    layer: int = Field(ge=0)
    site: Literal["resid_post", "resid_pre", "attn_out", "mlp_out"] = "resid_post"
    row_features: list[Annotated[int, Field(ge=0)]]
    col_features: list[Annotated[int, Field(ge=0)]]
    mixed_features: list[Annotated[int, Field(ge=0)]] = []
    run: dict[str, Any] = {}


def load_sae_doc(sae_dir: str | Path) -> dict[str, Any]:
    """SAE_DIR/sae.json, checked for the keys ape-permute reads (one VitposError otherwise)."""
    path = Path(sae_dir) / "sae.json"
    doc = read_json(path, "it is not an SAE description; retrain the SAE with `vitpos sae`")
    validate_doc(SAEDescription, doc, path, "it is not an SAE description; retrain the SAE with `vitpos sae`")
    return doc
