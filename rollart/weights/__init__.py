"""Moving policy weights from the trainer to the inference fleet: backends (Mooncake, local files)
and the bucketed, checksummed publish/pull built on them."""

from typing import TYPE_CHECKING

from rollart.weights.backends import (
    BackendError,
    MooncakeBackend,
    MooncakeMaster,
    WeightBackend,
    backend_choice,
    mooncake_installed,
    open_backends,
)

if TYPE_CHECKING:  # the names below, for readers and type checkers; at run time: __getattr__
    from rollart.weights.transfer import (
        CorruptWeightsError,
        Manifest,
        Publisher,
        Puller,
        PullStats,
        PushStats,
        unpack,
    )

_TRANSFER = ("CorruptWeightsError", "Manifest", "Publisher", "Puller", "PullStats", "PushStats",
             "unpack")


def __getattr__(name: str):
    """The publish/pull side imports torch (~1.4 s): loaded on first use, so processes that
    only start or reach a backend (the launcher, env and reward workers) do not pay for it."""
    if name in _TRANSFER:
        from rollart.weights import transfer

        return getattr(transfer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
