"""The idle fast path: the one gate, what it reads, and the per-op entries made from one template.

While nothing could record (no Python-started profiler, no capture open, no
coalescing block open, not compiling, and no slow-path call in flight whose
original may call a wrapper again) a plain collective only takes its
group's Seq and runs: that test is :data:`IDLE_GATE`, written once. Each
op's entry is generated from :data:`_ENTRY_TEMPLATE` with the gate in it,
with the original's own parameters where they can be copied (no
``*args, **kwargs`` packed per call) and over ``*args, **kwargs`` where
not; every call the entry does not run itself goes to the op's slow path
(:mod:`commtag.runtime.install.patch`) exactly as the caller split its arguments.
Everything here runs on every collective of the job, so each bytecode
counts (~5-10x its warm cost right after a collective).
"""

from __future__ import annotations

import functools
import inspect
import threading
from types import SimpleNamespace
from typing import Any, Callable, Optional

import torch
from torch.distributed import distributed_c10d as c10d
from torch.distributed.c10d_logger import _exception_logger

from commtag.runtime.record import recorder
from commtag.runtime.capture import OPEN_CAPTURES  # noqa: F401 - read by the generated entries (the gate)
from commtag.runtime.describe.groups import GROUP_STATES  # noqa: F401 - read by the generated entries

# What the idle hot path reads, bound once: each Python frame it avoids is ~30-80 ns. The slow
# path in commtag.runtime.install.patch reads the same bindings.
#: torch.compiler.is_compiling() without its two frames: Dynamo folds is_dynamo_compiling()
#: to True while tracing, and eagerly is_compiling() is the compiler module's flag (non-strict export).
is_dynamo_compiling: Callable[[], bool] = torch.compiler.is_dynamo_compiling
#: Its flag is read outside the fail-open guard, so a torch without it gets a stand-in
#: (Dynamo tracing is still caught by is_dynamo_compiling()).
compiler = torch.compiler if hasattr(torch.compiler, "_is_compiling_flag") else SimpleNamespace(_is_compiling_flag=False)
#: The process-wide half of recorder.profiler_enabled(): torch raises it for every Python-started profiler.
autograd_profiler = recorder.autograd_profiler
#: c10d's world: its ``_default_pg`` backs the ``default_pg`` property (a frame per call).
c10d_world = c10d._world
#: has_torch_function((x,)) as one C call: True when calling the original with ``x`` as its
#: dispatch argument would go through __torch_function__ (a tensor subclass or an active mode).
has_torch_function: Callable[[Any], bool] = getattr(torch._C, "_has_torch_function_unary", lambda _x: True)
#: The code of every function torch's ``_exception_logger`` returns: how its wrappers are recognized.
_EXCEPTION_LOGGER_CODE = _exception_logger(lambda: None).__code__

#: Process-wide reasons the idle fast path must not be taken now: coalescing blocks open on
#: any thread, and slow-path calls in flight whose original may call a wrapper again
#: (__torch_function__ dispatch, an op whose code could not be read), so that inner call
#: takes the slow path too and is skipped by its thread's depth, even if the profiler
#: stopped in between. A module global, so the fast path reads it with one LOAD_GLOBAL;
#: changed only on the slow path, under _slow_lock. (Open CUDA-graph captures are the
#: gate's own test of capture.OPEN_CAPTURES, which cannot go stale.)
_slow_reasons = 0
_slow_lock = threading.Lock()


def more_slow() -> None:
    """One more reason to keep every collective off the idle path (the slow path, before its original)."""
    global _slow_reasons
    with _slow_lock:
        _slow_reasons += 1


def less_slow() -> None:
    """One reason fewer (the slow path, after its original returned or raised)."""
    global _slow_reasons
    with _slow_lock:
        _slow_reasons -= 1


def slow_reasons() -> int:
    """How many reasons hold every collective off the idle path now (0 when none: tests)."""
    return _slow_reasons


def logged_body(original: Callable[..., Any]) -> Optional[Callable[..., Any]]:
    """The function inside torch's ``_exception_logger`` when ``original`` is that decorator's
    wrapper, else None.

    The decorator does nothing while the call succeeds; when it raises, it
    logs the call and re-raises, and describing the call reads the group from
    the caller's *keyword* arguments (a bad ``group=`` then fails with
    ValueError, a bad positional one with the original AttributeError). The
    idle path calls the body directly (a frame and a repacking of the
    arguments fewer) and, on an error, hands it to the decorator with the
    caller's own arguments (:func:`raise_as_logged`), so it fails exactly as
    without commtag.
    """
    body = getattr(original, "__wrapped__", None)
    if body is None or getattr(original, "__code__", None) is not _EXCEPTION_LOGGER_CODE:
        return None
    return body


def raise_as_logged(body: Callable[..., Any], error: Exception, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Raise ``error``, which ``body`` raised, the way torch's ``_exception_logger`` around it would have."""

    @_exception_logger
    @functools.wraps(body)
    def failed(*_args: Any, **_kwargs: Any) -> None:
        raise error

    failed(*args, **kwargs)


#: The idle gate, written once: while it is false nothing could record, so a plain collective
#: only takes its group's Seq and runs (see the module docstring). Every idle entry is made
#: from :data:`_ENTRY_TEMPLATE` with it; a name added here must be a global of this module.
IDLE_GATE = ("is_dynamo_compiling() or compiler._is_compiling_flag or _slow_reasons or OPEN_CAPTURES "
             "or autograd_profiler._is_profiler_enabled")

#: The idle entry of one op. Its prologue finds the group (a local, not searched for), and
#: ``handoff`` gives the call to the slow path exactly as the caller split it. Nothing in it
#: raises: the lookup and the dispatch test are inside try (free in CPython >= 3.11 when
#: nothing raises), a count's __next__ cannot fail, and an error of the collective itself is
#: re-raised as torch's exception logger would.
_ENTRY_TEMPLATE = """\
def make(original, body, general, defaults, U, as_given):
    def {name}({signature}):
{prologue}\
        if {gate}:
            {handoff}
        try:
            bump = GROUP_STATES[c10d_world._default_pg if _commtag_group is None else _commtag_group].bump
        except Exception:
            bump = None
        if bump is None{dispatch}:
            {handoff}
        bump()
{call}\
    return {name}
"""

#: A parameter of the idle entry that was not given (required ones, the group by position).
_UNSET = object()
#: The idle entry's parameter for a group given by position (``group=`` has its own, keyword-only).
_GROUP_BY_POSITION = "_commtag_group_by_position"


def _as_given(names: tuple[str, ...], values: tuple[Any, ...], group: Any, more: tuple[Any, ...],
              extra: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The idle entry's arguments as the caller split them: what was given by position (the
    parameters up to the first one not given, then ``more``) and by keyword (the rest, ``group=``
    and unknown keywords), so the original binds and logs the call exactly as it would have."""
    given = 0
    while given < len(values) and values[given] is not _UNSET:
        given += 1
    args = values[:given] + more if given == len(values) else values[:given]
    kwargs = {names[i]: values[i] for i in range(given, len(values)) if values[i] is not _UNSET}
    if group is not _UNSET:
        kwargs["group"] = group
    kwargs.update(extra)
    return args, kwargs


def _plain_source(name: str, names: tuple[str, ...], defaults: list[Any], group_index: int,
                  tf_index: Optional[int], logged: bool) -> str:
    """The entry with the original's own parameters (no ``*args, **kwargs`` packed per call)."""
    slot = _GROUP_BY_POSITION
    locals_ = [slot if i == group_index else n for i, n in enumerate(names)]
    required = [n for i, (n, d) in enumerate(zip(locals_, defaults)) if i != group_index and d is inspect.Parameter.empty]
    signature = ", ".join(
        f"{n}=U" if i == group_index or d is inspect.Parameter.empty else f"{n}=defaults[{i}]"
        for i, (n, d) in enumerate(zip(locals_, defaults)))
    values = "(" + "".join(f"{n}, " for n in locals_) + ")"
    # The original called as the caller split the group: by position (or not at all: its own
    # default, by position, which the exception logger does not read either), or as group=.
    positional = ", ".join(locals_)
    keyword = ", ".join([*locals_[:group_index], "group=group", *(f"{n}={n}" for n in locals_[group_index + 1:])])
    unusual = " or ".join([f"{slot} is not U and group is not U", *(f"{n} is U" for n in required)])
    passed = ", ".join("_commtag_group" if i == group_index else n for i, n in enumerate(locals_))
    prologue = (f"        if more or extra or {unusual}:\n"
                f"            args, kwargs = as_given({values}, group, more, extra)\n"
                f"            return general(*args, **kwargs)\n"
                f"        if group is U:\n"
                f"            if {slot} is U:\n"
                f"                {slot} = defaults[{group_index}]\n"
                f"            _commtag_group = {slot}\n"
                f"        else:\n"
                f"            _commtag_group = group\n")
    call = (f"        try:\n"
            f"            return body({passed})\n"
            f"        except Exception as error:\n"
            f"            raise_as_logged(body, error, *as_given({values}, group, more, extra))\n"
            ) if logged else f"        return original({passed})\n"
    return _ENTRY_TEMPLATE.format(
        name=name, signature=f"{signature}, *more, group=U, **extra", prologue=prologue, gate=IDLE_GATE,
        handoff=f"return general({positional}) if group is U else general({keyword})",
        dispatch=f" or has_torch_function({locals_[tf_index]})" if tf_index is not None else "", call=call)


def _packed_source(name: str, group_index: int, tf_index: Optional[int], logged: bool) -> str:
    """The entry for an original whose parameters cannot be copied: ``*args, **kwargs``."""
    prologue = (f'        _commtag_group = kwargs["group"] if "group" in kwargs else '
                f'(args[{group_index}] if len(args) > {group_index} else None)\n')
    call = ("        try:\n"
            "            return body(*args, **kwargs)\n"
            "        except Exception as error:\n"
            "            raise_as_logged(body, error, args, kwargs)\n"
            ) if logged else "        return original(*args, **kwargs)\n"
    dispatch = (f" or len(args) <= {tf_index} or has_torch_function(args[{tf_index}])"
                if tf_index is not None else "")
    return _ENTRY_TEMPLATE.format(name=name, signature="*args, **kwargs", prologue=prologue, gate=IDLE_GATE,
                                  handoff="return general(*args, **kwargs)", dispatch=dispatch, call=call)


def _names_in(code: Any) -> set[str]:
    """Every name a code object and the code nested in it use (globals, locals, attributes)."""
    names = {*code.co_names, *code.co_varnames, *code.co_cellvars, *code.co_freevars}
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names |= _names_in(const)
    return names


#: Names the entry's own code uses, read from the template itself: a parameter of the same name
#: would hide one of them, so such an op takes the packed entry. ("group" is the entry's own.)
_TEMPLATE_SOURCE = _plain_source("_commtag_op", ("_commtag_parameter", "group"), [inspect.Parameter.empty, None],
                                 1, 0, logged=True)
_ENTRY_NAMES = frozenset(
    _names_in(compile(_TEMPLATE_SOURCE, "<commtag idle path>", "exec"))  # commtag's own text, not input data
    - {"_commtag_op", "_commtag_parameter", "group"})


def idle_entry(original: Callable[..., Any], general: Callable[..., Any], name: str, group_index: int,
               tf_index: Optional[int]) -> Callable[..., Any]:
    """The idle fast path of op ``name`` in front of ``general`` (its slow path); ``tf_index``:
    the position of the argument the original dispatches to ``__torch_function__`` on, if any.

    Why generated: ``*args, **kwargs`` costs a tuple, a dict, a search for the
    group and a call that unpacks both again, on every collective of the job.
    With named parameters the group is a local and the original (its body, see
    :func:`logged_body`) is called positionally. One difference keeps the
    caller's split, which torch's exception logger reads when a call fails: a
    group given by position and ``group=`` land in different parameters, and
    required parameters, extra positional and unknown keyword arguments are
    caught too; any call that is not plain, and any error, is handed on with
    the arguments as the caller gave them (:func:`_as_given`). An original
    whose signature is not a plain list of parameters with its group called
    ``group`` gets the same entry over ``*args, **kwargs``.
    """
    body = logged_body(original)
    names: Optional[tuple[str, ...]] = None
    try:
        params = list(inspect.signature(original).parameters.values())
    except (TypeError, ValueError):
        params = []
    if (params and all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params)
            and group_index < len(params) and params[group_index].name == "group"
            and (tf_index is None or tf_index < len(params))):
        names = tuple(p.name for p in params)
        if len(set(names)) != len(names) or not all(n.isidentifier() for n in names) or _ENTRY_NAMES.intersection(names):
            names = None
    if names is None:
        source, defaults, as_given = _packed_source(name, group_index, tf_index, body is not None), None, None
    else:
        defaults = [p.default for p in params]
        source = _plain_source(name, names, defaults, group_index, tf_index, body is not None)
        as_given = functools.partial(_as_given, names)
    scope: dict[str, Any] = {}
    code = compile(source, f"<commtag idle path of {name}>", "exec")  # commtag's own text, not input data
    exec(code, globals(), scope)  # commtag's own text, not input data
    entry = scope["make"](original, body, general, defaults, _UNSET, as_given)
    functools.update_wrapper(entry, original)
    return entry
