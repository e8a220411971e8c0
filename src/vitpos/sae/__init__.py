"""Sparse autoencoders over ViT activations and positional feature discovery."""

from vitpos.sae.features import FeatureScores, FeatureThresholds, score_codes, score_features
from vitpos.sae.model import SAE, SAEConfig, StepOutput, batch_total_variance
from vitpos.sae.stream import StoreBatches, store_batches
from vitpos.sae.train import TrainLog, TrainSettings, sae_metrics, train_sae

__all__ = [
    "SAE",
    "SAEConfig",
    "StepOutput",
    "batch_total_variance",
    "TrainLog",
    "TrainSettings",
    "train_sae",
    "sae_metrics",
    "store_batches",
    "StoreBatches",
    "score_features",
    "score_codes",
    "FeatureScores",
    "FeatureThresholds",
]
