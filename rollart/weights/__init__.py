"""Moving policy weights from the trainer to the inference fleet: backends (Mooncake, local files)
and the bucketed, checksummed publish/pull built on them."""

from rollart.weights.backends import (
    BackendError,
    MooncakeBackend,
    MooncakeMaster,
    WeightBackend,
    backend_choice,
    mooncake_installed,
    open_backends,
)
from rollart.weights.transfer import (
    CorruptWeightsError,
    Manifest,
    Publisher,
    Puller,
    PullStats,
    PushStats,
    unpack,
)

__all__ = [
    "BackendError",
    "CorruptWeightsError",
    "Manifest",
    "MooncakeBackend",
    "MooncakeMaster",
    "Publisher",
    "PullStats",
    "Puller",
    "PushStats",
    "WeightBackend",
    "backend_choice",
    "mooncake_installed",
    "open_backends",
    "unpack",
]
