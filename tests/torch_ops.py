"""What the installed torch has and does, read from that torch, so a test expects what it does.

``pyproject.toml`` allows every torch from 2.11 on and ``launch/compat.sh`` runs the tests
under each: whether this torch has an op is asked of it (:func:`has`), and which ops only pass
their call on to another op is watched on a real gloo group (:func:`delegating_ops`), not copied
from one torch release.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist

from gloo_world import run_world


def has(name: str) -> bool:
    """Whether this torch's ``torch.distributed`` has ``name``."""
    return callable(getattr(dist, name, None))


def _calls() -> dict[str, Callable[[], Any]]:
    """One valid call per op on a world of one rank (plain tensors, the default group), made
    through c10d's module attribute, where a recorder (or commtag) sits."""
    from torch.distributed import distributed_c10d as c10d

    x = lambda: torch.ones(4)  # noqa: E731 - a fresh tensor per call
    return {
        "all_reduce": lambda: c10d.all_reduce(x()),
        "broadcast": lambda: c10d.broadcast(x(), src=0),
        "reduce": lambda: c10d.reduce(x(), dst=0),
        "all_gather": lambda: c10d.all_gather([torch.empty(4)], x()),
        "all_gather_single": lambda: c10d.all_gather_single(torch.empty(4), x()),
        "all_gather_into_tensor": lambda: c10d.all_gather_into_tensor(torch.empty(4), x()),
        "_all_gather_base": lambda: c10d._all_gather_base(torch.empty(4), x()),
        "reduce_scatter_single": lambda: c10d.reduce_scatter_single(torch.empty(4), x()),
        "reduce_scatter_tensor": lambda: c10d.reduce_scatter_tensor(torch.empty(4), x()),
        "_reduce_scatter_base": lambda: c10d._reduce_scatter_base(torch.empty(4), x()),
        "all_to_all_single": lambda: c10d.all_to_all_single(torch.empty(4), x()),
        "gather": lambda: c10d.gather(x(), [torch.empty(4)], dst=0),
        "gather_single": lambda: c10d.gather_single(x(), torch.empty(4), dst=0),
        "gather_into_tensor": lambda: c10d.gather_into_tensor(x(), torch.empty(4), dst=0),
        "scatter": lambda: c10d.scatter(torch.empty(4), [x()], src=0),
        "barrier": lambda: c10d.barrier(),
    }


def _watch_delegations(rank: int, world: int, names: list[str]) -> dict[str, list[str]]:
    """Call each op once with every op of ``names`` replaced by a recorder: the ops entered from
    inside an op are the ones it passes its call on to (torch looks them up as module globals)."""
    import functools
    import warnings

    from torch.distributed import distributed_c10d as c10d

    warnings.simplefilter("ignore", FutureWarning)  # all_gather_into_tensor & co. are deprecated
    entered: list[str] = []
    originals = {name: getattr(c10d, name) for name in names}

    def recorder(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def record(*args: Any, **kwargs: Any) -> Any:
            entered.append(name)
            return original(*args, **kwargs)

        return record

    inner: dict[str, list[str]] = {}
    calls = _calls()
    for name in names:
        setattr(c10d, name, recorder(name, originals[name]))
    try:
        for name in names:
            if name not in calls:
                continue
            entered.clear()
            try:
                calls[name]()
            except RuntimeError as exc:
                # gloo has no gather_single (torch 2.15): the Python layer has delegated by then.
                if "does not support" not in str(exc):
                    raise
            inner[name] = entered[1:]
    finally:
        for name, original in originals.items():
            setattr(c10d, name, original)
    return inner


def delegating_ops(names: list[str]) -> dict[str, list[str]]:
    """Of ``names`` (ops this torch has), those whose call enters another of them, with which."""
    present = [name for name in names if has(name)]
    inner = run_world(_watch_delegations, 1, present)[0]
    return {name: ops for name, ops in inner.items() if ops}
