"""commtag: eager-style collective metadata for CUDA-graph and gloo traces.

Public API: :func:`install`, :func:`uninstall`, :func:`is_installed`,
:func:`trace_handler`, and the models :class:`CollectiveAnnotation` and
:class:`Sidecar`. Nothing here imports cuda-python, torch is imported only when
the runtime is used, and pydantic (the models) only when first named, so the
offline merge starts fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Union

if TYPE_CHECKING:
    from commtag.schema import CollectiveAnnotation, Sidecar

__all__ = ["CollectiveAnnotation", "Sidecar", "install", "uninstall", "is_installed", "trace_handler"]


def install() -> None:
    """Annotate every torch.distributed collective from now on (idempotent, thread-safe).

    Call it once per process, before any CUDA-graph capture; before or after
    init_process_group both work.
    """
    from commtag.runtime.install import hooks

    hooks.install()


def uninstall() -> None:
    """Restore the exact original torch.distributed functions and CUDAGraph methods (idempotent,
    thread-safe)."""
    from commtag.runtime.install import hooks

    hooks.uninstall()


def is_installed() -> bool:
    """True between :func:`install` and :func:`uninstall`."""
    from commtag.runtime.install import hooks

    return hooks.is_installed()


def trace_handler(dir_name: Union[str, Path]) -> Callable[[Any], None]:
    """A profiler ``on_trace_ready`` writing ``rank{R}.step{S}.pt.trace.json.gz`` and
    ``rank{R}.step{S}.commtag.json`` into ``dir_name`` (S: the profiler steps the trace
    holds, "2-3"), never over an existing file."""
    from commtag.runtime.record import recorder

    return recorder.trace_handler(dir_name)


def __getattr__(name: str) -> Any:
    """Load the pydantic models on first use (PEP 562): ``import commtag`` stays cheap."""
    if name in ("CollectiveAnnotation", "Sidecar"):
        from commtag import schema

        return getattr(schema, name)
    raise AttributeError(f"module 'commtag' has no attribute {name!r}")
