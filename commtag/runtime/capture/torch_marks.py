"""torch's own CUDA-graph annotations, where a capture records them (torch 2.14+, driver 13.1+).

``torch.cuda.graph(g, enable_annotations=True)`` makes torch record, for every node made
inside a ``mark_kernels(annotation)`` scope, the annotation under the node's tools id
(re-keyed to the exec graph when the graph is instantiated); torch 2.15's
``export_chrome_trace(..., cuda_graph_annotations=get_kernel_annotations())`` then bakes
each annotation into the replayed events' args. commtag wraps each collective captured
in such a capture in a scope of its own, so that torch joins the collective's nodes to
the replayed kernels, and the merge tries that join first:

* the annotation carries :data:`~commtag.vocab.TORCH_MARK_KEY` (capture id and the
  collective's number in it), which the sidecar's captured collective carries too, so a
  baked kernel names its call exactly;
* when the sidecar is written, the tools ids torch holds under each mark are copied into
  it (for a trace exported without the annotations baked in);
* it names the call's group the way torch lays lanes out: "Process Group Name",
  "Process Group Description" (torch's lane name) and ``"stream"`` = commtag's lane id of
  the group, the same on every rank.

Where torch does not record (annotations not enabled for the capture, no cuda-bindings,
a driver before 13.1), ``mark_kernels`` is a no-op and this costs a function call per
captured collective. It is loaded only when a capture is open (a GPU machine): a CPU
install never imports ``torch.cuda.graph_annotations`` through commtag. Every call fails
open: the scope is the user's capture, not commtag's.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Callable, Mapping, Optional

from commtag.runtime.failopen import log_once
from commtag.vocab import PG_NAME_KEY, TORCH_GRAPH_ANNOTATIONS_MODULE, TORCH_LANE_KEY, TORCH_LANE_NAME_KEY, TORCH_MARK_KEY


class TorchMarks:
    """commtag's scopes in torch's annotation registry, over its two public functions."""

    def __init__(self, mark_kernels: Callable[..., Any], get_kernel_annotations: Callable[[], Mapping[int, Any]]) -> None:
        self._mark_kernels = mark_kernels
        self._annotations = get_kernel_annotations
        # Torch documents the keyword's presence as the probe for backward annotation; commtag
        # marks only the collective's own (forward) nodes.
        try:
            self.scope_kwargs = {"backward": False} if "backward" in inspect.signature(mark_kernels).parameters else {}
        except (TypeError, ValueError):
            self.scope_kwargs = {}

    @staticmethod
    def annotation(mark: str) -> dict[str, Any]:
        """The dict handed to torch for one call, named before the call runs (see :meth:`name_group`)."""
        return {TORCH_MARK_KEY: mark}

    @staticmethod
    def name_group(annotation: dict[str, Any], pg_name: str, pg_desc: str, lane_id: int) -> None:
        """Add the call's group once it is known. torch's default (edge-walk) backend reads the
        dict when it resolves the scope, after the call; its CUPTI backend copies it as the
        scope opens, so there only the mark reaches the trace (which is all the merge needs)."""
        annotation.update({PG_NAME_KEY: pg_name, TORCH_LANE_NAME_KEY: pg_desc, TORCH_LANE_KEY: lane_id})

    def open(self, annotation: dict[str, Any]) -> Optional[Any]:
        """Enter a ``mark_kernels`` scope; None (logged once) if torch refused it."""
        try:
            scope = self._mark_kernels(annotation, **self.scope_kwargs)
            scope.__enter__()
            return scope
        except Exception as exc:  # noqa: BLE001 - fail open: the collective is captured unmarked
            log_once("opening torch's mark_kernels scope", exc)
            return None

    @staticmethod
    def close(scope: Any) -> None:
        """Leave a scope :meth:`open` entered."""
        try:
            scope.__exit__(None, None, None)
        except Exception as exc:  # noqa: BLE001 - fail open: the capture goes on; only the scope is left
            log_once("closing torch's mark_kernels scope", exc)

    def tools_ids(self) -> dict[str, list[int]]:
        """Every commtag mark in torch's registry -> the tools ids torch holds for it, sorted."""
        registry = self._annotations()
        copy = getattr(registry, "copy", None)  # torch's live view copies itself under its lock
        entries = copy() if copy is not None else dict(registry)
        found: dict[str, list[int]] = {}
        for tools_id, values in entries.items():
            for value in values if isinstance(values, list) else [values]:
                if isinstance(value, dict) and TORCH_MARK_KEY in value:
                    found.setdefault(str(value[TORCH_MARK_KEY]), []).append(int(tools_id))
        return {mark: sorted(ids) for mark, ids in found.items()}


def load_torch_marks() -> Optional[TorchMarks]:
    """torch's public annotation API, or None where this torch has none (before 2.14) or it is unusable."""
    try:
        module = importlib.import_module(TORCH_GRAPH_ANNOTATIONS_MODULE)
        if not module.is_available():
            return None
        return TorchMarks(module.mark_kernels, module.get_kernel_annotations)
    except Exception:  # noqa: BLE001 - an older torch, or no cuda-bindings: commtag's own path only
        return None
