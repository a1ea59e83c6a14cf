"""Every point-to-point op issued on a gloo group, counted where torch issues it.

gloo's per-group count (:data:`commtag.runtime.describe.groups.BACKEND_SEQ`),
which gives a gloo collective its Seq, also advances once for each send and
receive this rank issues on the group, and only on the ranks that take part
(torch 2.13: ``isend``, ``irecv``, ``send``, ``recv``, a receive from any
source and each op of a ``batch_isend_irecv``). Where stages of a pipeline
make different numbers of them, the members' counts drift apart unless each
advance is taken off again (:meth:`GroupState.gloo_advanced`).

``isend`` and ``irecv`` cannot be replaced (``P2POp`` checks its op by
identity, against whichever object the caller holds), so the advances are
counted one level down: every one of those functions, and ``batch_isend_irecv``
through them, issues the op with ``ProcessGroup.send``, ``recv`` or
``recv_anysource``, and those three methods get a counting wrapper while
commtag is installed. The wrapper calls torch's own method exactly once with
the caller's arguments and returns its result; it counts only an op torch
accepted (one that raised never reached gloo's counter), and an error of
its own is logged once and ignored.

Not seen: ops issued while commtag is not installed, and ops issued on a
gloo backend object directly (``pg._get_backend(device).send``), which
bypass the group's methods.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable

from torch.distributed import distributed_c10d as c10d

from commtag.runtime.describe.groups import GROUP_STATES, lookup
from commtag.runtime.failopen import log_once

#: The ProcessGroup methods every Python-issued point-to-point op goes through.
P2P_METHODS = ("send", "recv", "recv_anysource")

_lock = threading.Lock()
#: Method name -> ProcessGroup's own entry for it before :func:`attach` (None: there was none).
_originals: dict[str, Any] = {}


def counted(original: Callable[..., Any]) -> Callable[..., Any]:
    """``original`` (a ProcessGroup p2p method), and one advance of its group's gloo count after it."""

    @functools.wraps(original)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        try:
            state = GROUP_STATES.get(self) or lookup(self)
            if state is not None:
                state.gloo_advanced(1)
        except Exception as exc:  # noqa: BLE001 - fail open: this op stays uncounted
            log_once("counting a point-to-point op", exc)
        return result

    method.__commtag_original__ = original  # type: ignore[attr-defined]
    return method


def attach() -> None:
    """Wrap the ProcessGroup p2p methods (idempotent; :mod:`commtag.runtime.install.hooks` calls it
    under its lock)."""
    group_class = c10d.ProcessGroup
    with _lock:
        if _originals:
            return
        for name in P2P_METHODS:
            own = group_class.__dict__.get(name)
            if own is None:
                continue
            _originals[name] = own
            setattr(group_class, name, counted(getattr(group_class, name)))


def detach() -> None:
    """Put ProcessGroup's own p2p methods back exactly (idempotent)."""
    group_class = c10d.ProcessGroup
    with _lock:
        for name, own in _originals.items():
            setattr(group_class, name, own)
        _originals.clear()
