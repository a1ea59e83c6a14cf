"""commtag: eager-style collective metadata for CUDA-graph and gloo traces.

Public API: :func:`install`, :func:`uninstall`, :func:`is_installed`,
:func:`trace_handler`, and the models :class:`CollectiveAnnotation` and
:class:`Sidecar`. Nothing here imports cuda-python.
"""

from commtag.schema import CollectiveAnnotation, Sidecar

__all__ = ["CollectiveAnnotation", "Sidecar"]
