"""A random-init timm model is the same model on every load: the study keys its stage cache by the
spec alone, so a resumed run must never mix stages measured on two different random inits."""

from conftest import TIMM_TINY
from vitpos.models import load_model


def test_a_random_init_timm_model_loads_the_same_weights_twice():
    import torch

    torch.manual_seed(123)
    a = load_model(TIMM_TINY["vit"])
    state = torch.random.get_rng_state()
    b = load_model(TIMM_TINY["vit"])
    assert a.weights_digest() == b.weights_digest()
    assert torch.equal(torch.random.get_rng_state(), state)  # the caller's generator is left as it was
