"""commtag: eager-style collective metadata for CUDA-graph and gloo traces.

Public API: :func:`install`, :func:`uninstall`, :func:`is_installed`,
:func:`trace_handler`, and the models :class:`CollectiveAnnotation` and
:class:`Sidecar`. Nothing here imports cuda-python, torch is imported only when
the runtime is used, and pydantic (the models) only when first named, so the
offline merge starts fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

if TYPE_CHECKING:
    from commtag.schema import CollectiveAnnotation, Sidecar

__all__ = ["CollectiveAnnotation", "Sidecar", "install", "uninstall", "is_installed", "trace_handler", "dump"]


def install(dump_dir: Union[str, Path, None] = None, ring_size: Optional[int] = None) -> None:
    """Annotate every torch.distributed collective from now on (idempotent, thread-safe).

    Call it once per process, before any CUDA-graph capture; before or after
    init_process_group both work. With ``dump_dir`` (or ``COMMTAG_DUMP_DIR``), also keep this
    rank's last ``ring_size`` calls (``COMMTAG_RING_SIZE``, default 2000) whether or not a profiler
    runs, and write them there as a Flight Recorder dump when a collective raises, on SIGTERM,
    SIGINT and SIGUSR1, and on :func:`dump` (`commtag summary DIR` names who hung where).
    """
    import os

    from commtag.runtime.install import dumping, hooks
    from commtag.runtime.record import ring

    hooks.install()
    dump_dir = dump_dir if dump_dir is not None else os.environ.get(ring.DUMP_DIR_ENV) or None
    if dump_dir is not None:
        if ring_size is not None and ring_size < 1:
            raise ValueError(f"ring_size must be 1 or more, not {ring_size}")
        dumping.enable(Path(dump_dir), ring_size if ring_size is not None else ring.size_from_environment())


def dump() -> Optional[Path]:
    """Write this rank's ring now (the job goes on): the file written, or None where
    ``install(dump_dir=...)`` did not turn the ring on."""
    from commtag.runtime.install import dumping

    return dumping.dump()


def uninstall() -> None:
    """Restore the exact original torch.distributed functions and CUDAGraph methods (idempotent,
    thread-safe)."""
    from commtag.runtime.install import dumping, hooks

    dumping.disable()
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
