"""A sidecar file read: the one reader of both wings, so a file one accepts the other accepts
too, and a bad one is refused with the same words wherever it is read.

The runtime writes its bytes through :func:`check_sidecar_bytes` and the merge reads them
through :func:`read_sidecar` (whole, for a rank's conversion) and :func:`read_sidecar_head`
(run, rank and trace, for discovery). Each file is parsed once, by pydantic's own JSON parser:
its kind and schema version are fields validated before the others, so a file of another kind
or a newer format is said to be that, not a list of the fields it lacks. NaN and Infinity parse
as floats and fail every field (no field of a sidecar is a float): refused, naming the field.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar, Union

from commtag.constants import GZIP_MAGIC, SIDECAR_KIND
from commtag.errors import CommtagError

if TYPE_CHECKING:
    from pydantic import ValidationError
    from pydantic_core import ErrorDetails

    from commtag.schema import Sidecar, SidecarHead

_Model = TypeVar("_Model", bound="SidecarHead")

#: What a JSON value other than an object is called, by the Python type it parses to.
_JSON_TYPES = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "true or false",
               type(None): "null"}
#: What gzip.decompress raises on a stream that is corrupt or cut short.
_GZIP_ERRORS = (EOFError, gzip.BadGzipFile, zlib.error)


class SidecarError(CommtagError, ValueError):
    """A sidecar that cannot be used. ``path`` and ``problem`` are kept apart so the merge can
    hand them on as its own input error, with the message unchanged."""

    def __init__(self, path: Union[str, Path], problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


def read_sidecar(path: Union[str, Path]) -> Sidecar:
    """A sidecar file (plain or gzip), validated in full; :class:`SidecarError` names the file."""
    from commtag.schema import Sidecar  # pydantic's start-up is paid only where a sidecar is read

    return _read(Path(path), Sidecar)


def read_sidecar_head(path: Union[str, Path]) -> SidecarHead:
    """Only a sidecar's kind, version, run, rank, world size and trace; its other fields are
    parsed past, not validated (a tenth of a full validation's cost)."""
    from commtag.schema import SidecarHead

    return _read(Path(path), SidecarHead)


def check_sidecar_bytes(raw: bytes, path: Union[str, Path]) -> Sidecar:
    """The sidecar ``raw`` is, as a reader of the file at ``path`` will see it."""
    from commtag.schema import Sidecar

    return _parsed(raw, path, Sidecar)


def _read(path: Path, model: type[_Model]) -> _Model:
    try:
        raw = path.read_bytes()
        if raw[:2] == GZIP_MAGIC:
            raw = gzip.decompress(raw)
    except _GZIP_ERRORS as exc:
        raise SidecarError(path, f"truncated or corrupt gzip ({exc})") from None
    except OSError as exc:
        raise SidecarError(path, f"cannot read: {exc}") from None
    return _parsed(raw, path, model)


def _parsed(raw: bytes, path: Union[str, Path], model: type[_Model]) -> _Model:
    from pydantic import ValidationError

    try:
        sidecar = model.model_validate_json(raw)
    except ValidationError as exc:
        raise SidecarError(path, _problem(raw, exc)) from None
    if "kind" not in sidecar.model_fields_set:  # the model's default serves Python callers, not files
        raise SidecarError(path, f"not a commtag sidecar (it names no kind, expected {SIDECAR_KIND!r})")
    return sidecar


def _problem(raw: bytes, exc: ValidationError) -> str:
    """The first error pydantic found (fields are validated in order: kind, then schema_version,
    then the rest), in words that do not call a file of another kind an invalid sidecar."""
    first = exc.errors()[0]
    loc = first.get("loc", ())
    kind = first.get("type")
    found = first.get("input")
    if kind == "json_invalid":
        return f"invalid sidecar: {_not_json(raw, first)}"
    if not loc and kind == "model_type":
        return f"not a commtag sidecar (its JSON is {_JSON_TYPES.get(type(found), 'no object')}, not an object)"
    if loc == ("kind",):
        return f"not a commtag sidecar (kind is {found!r}, expected {SIDECAR_KIND!r})"
    if len(loc) == 1 and kind == "missing" and isinstance(found, dict) and "kind" not in found:
        return f"not a commtag sidecar (it names no kind, expected {SIDECAR_KIND!r})"
    where = ".".join(str(p) for p in loc)
    return f"invalid sidecar: {where + ': ' if where else ''}{first.get('msg')}"


def _not_json(raw: bytes, error: ErrorDetails) -> str:
    """Why a sidecar's bytes are not JSON: text that is not UTF-8, or the parser's reason (a file
    cut short ends "EOF while parsing")."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})"
    return f"not valid JSON ({(error.get('ctx') or {}).get('error') or error.get('msg')})"
