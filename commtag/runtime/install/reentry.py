"""Which patched collectives can call back into another wrapper, read once at install from torch's code.

The idle fast path numbers a collective without any per-thread state, so it
must know that the original it calls will not enter a wrapper again on the
same thread (the inner call would be numbered a second time). In torch 2.13
an original re-enters a wrapper in exactly two ways, both through names it
looks up in ``distributed_c10d``'s globals at call time (which install()
replaced with the wrappers):

* **nesting**: ``all_gather_into_tensor`` and ``_all_gather_base`` are
  ``return all_gather_single(...)``, ``reduce_scatter_tensor`` and
  ``_reduce_scatter_base`` are ``return reduce_scatter_single(...)``.
* **torch-function dispatch**: nearly every op starts with
  ``relevant_args = (tensor,); if has_torch_function(relevant_args): return
  handle_torch_function(<op>, ...)``, and ``<op>`` is the wrapper. A tensor
  subclass, or any active TorchFunctionMode (``with torch.device(...)``
  included), therefore calls the wrapper again from inside the original.

:func:`classify` reads the unwrapped original's bytecode (following
``__wrapped__``) and says, per op:

* ``PLAIN`` with ``tf_index``: no other patched op is called; torch-function
  dispatch is decided on the positional argument ``tf_index`` alone (None:
  the op has no dispatch). The fast path checks that argument with
  ``torch._C._has_torch_function_unary`` (what ``has_torch_function`` does
  for a 1-tuple) and leaves a call that will dispatch to the slow path.
* ``NESTING`` with ``inner``: the original's only patched call is one call of
  ``inner``, and it has no dispatch of its own. Its wrapper just calls the
  original: the inner wrapper numbers, describes and records the call (the
  pairs above share one describer), once, on whichever path it takes.
* ``UNKNOWN``: anything else (no code object, several patched names, a
  reference to itself without dispatch, a ``relevant_args`` that is not one
  plain parameter): always the slow path, whose per-thread depth handles
  any re-entry.

Only names loaded with LOAD_GLOBAL count: ``group.broadcast(...)`` loads
``broadcast`` as an attribute, which is the backend, not a wrapper.
"""

from __future__ import annotations

import dis
import types
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Optional

PLAIN = "plain"
NESTING = "nesting"
UNKNOWN = "unknown"

#: Globals through which an original dispatches to __torch_function__.
_DISPATCH = frozenset({"has_torch_function", "handle_torch_function"})
_LOAD_FAST = frozenset({"LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_BORROW"})


@dataclass(frozen=True)
class Shape:
    kind: str
    #: PLAIN: positional index of the argument torch-function dispatch is decided on (None: no dispatch).
    tf_index: Optional[int] = None
    #: NESTING: the patched op the original calls once.
    inner: Optional[str] = None
    #: Why UNKNOWN (for logs and tests).
    reason: str = ""


def _chain(func: Any) -> list[Any]:
    """func, then what each ``__wrapped__`` points to (decorators: _exception_logger, deprecated)."""
    seen: list[Any] = []
    while func is not None and all(func is not s for s in seen):
        seen.append(func)
        func = getattr(func, "__wrapped__", None)
    return seen


def _codes(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def _globals_loaded(codes: Iterable[types.CodeType]) -> list[str]:
    return [ins.argval for code in codes for ins in dis.get_instructions(code) if ins.opname == "LOAD_GLOBAL"]


def _relevant_index(code: types.CodeType) -> Optional[int]:
    """Positional index of ``p`` in the original's ``relevant_args = (p,)``, None if it is not that shape.

    ``p`` must be a positional parameter that is not reassigned before the
    tuple is built (so the argument the caller passed is what is checked).
    """
    instructions = [ins for ins in dis.get_instructions(code) if ins.opname not in ("CACHE", "NOP", "RESUME")]
    stores = [i for i, ins in enumerate(instructions) if ins.opname == "STORE_FAST" and ins.argval == "relevant_args"]
    if len(stores) != 1 or stores[0] < 2:
        return None
    at = stores[0]
    load, build = instructions[at - 2], instructions[at - 1]
    if load.opname not in _LOAD_FAST or not isinstance(load.argval, str):
        return None
    if build.opname != "BUILD_TUPLE" or build.arg != 1:
        return None
    if any(ins.is_jump_target for ins in (load, build, instructions[at])):
        return None  # one branch of a conditional (all_to_all: tuple(list) if a list else (x,))
    name = load.argval
    if any(ins.opname.startswith("STORE") and ins.argval == name for ins in instructions[:at]):
        return None
    positional = code.co_varnames[: code.co_argcount]
    return positional.index(name) if name in positional else None


def classify(original: Callable[..., Any], name: str, patched: Iterable[str], countable: Iterable[str]) -> Shape:
    """How the wrapper of ``name`` may treat ``original`` (see the module docstring).

    ``patched``: every name install() replaces in distributed_c10d;
    ``countable``: the collectives a NESTING op may delegate its number to.
    """
    patched, countable = frozenset(patched), frozenset(countable)
    chain = _chain(original)
    codes = [getattr(f, "__code__", None) for f in chain]
    if codes[-1] is None or not isinstance(codes[-1], types.CodeType):
        return Shape(UNKNOWN, reason="the original has no Python code")
    every = _globals_loaded(c for code in codes if isinstance(code, types.CodeType) for c in _codes(code))
    body = codes[-1]
    loaded = set(every)
    others = (loaded & patched) - {name}
    dispatch = bool(loaded & _DISPATCH)
    if others:
        (inner,) = others if len(others) == 1 else (None,)
        if inner is None or inner not in countable:
            return Shape(UNKNOWN, reason=f"calls {sorted(others)}")
        if dispatch or name in loaded or every.count(inner) != 1:
            return Shape(UNKNOWN, reason=f"calls {inner} and more")
        return Shape(NESTING, inner=inner)
    if not dispatch:
        if name in loaded:
            return Shape(UNKNOWN, reason="refers to itself without torch-function dispatch")
        return Shape(PLAIN)
    index = _relevant_index(body)
    if index is None:
        return Shape(UNKNOWN, reason="torch-function dispatch on something other than one positional parameter")
    return Shape(PLAIN, tf_index=index)
