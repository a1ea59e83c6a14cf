"""Read a Chrome-JSON trace's ``traceEvents`` in batches, never the whole file at once.

Why: orjson turns a trace into Python dicts about ten times the size of its
text, so parsing a rank whole breaks the merge's memory bound (a few times
one rank's JSON). This reader decompresses a bounded window of text and hands
orjson one slice of the event array at a time.

How a slice is cut without a JSON scanner in Python: the array's elements are
objects, so a cut is made just after a ``}`` that is followed by ``,`` and a
``{``. Such a place may also lie inside a nested value or a string; then the
slice does not parse (its brackets or quotes are unbalanced) and it is
extended to the next cut. A slice that parses is therefore exactly a run of
whole elements. The other top-level keys (``distributedInfo``,
``baseTimeNanoseconds``, ...) are small and parsed whole, wherever they are.

Long whitespace runs (a pretty-printer's indentation gone wild: megabytes of
blanks between two events) are squeezed to one character as they are read,
so they never fill the window: text held and time spent stay proportional to
the events, not to the gaps. A run inside a string is kept as it is: runs with
a line break or tab cannot be inside a valid JSON string (squeezed to that one
character, an invalid file stays invalid), and a run of spaces alone is kept
when a scan of the strings before it says it is inside one.
"""

from __future__ import annotations

import gzip
import re
import types
import zlib
from pathlib import Path
from typing import BinaryIO, Iterator, Optional

import orjson

from commtag.constants import GZIP_MAGIC
from commtag.errors import CommtagError

_gzip: types.ModuleType
_InflateError: type[Exception]
try:  # ISA-L's inflate reads a Kineto trace ~3x faster than zlib's (docs/benchmarks.md, "Where the time goes")
    from isal import igzip as _gzip
    from isal.isal_zlib import error as _InflateError  # type: ignore[assignment]  # isal's stub calls the class an instance
except ImportError:  # no wheel for this platform: the standard library's, the same bytes
    _gzip = gzip
    _InflateError = zlib.error
#: Decompressed bytes read at a time.
READ_BYTES = 1 << 20
#: JSON bytes per batch of events (about 1.3k Kineto events, ~2.5 MB as dicts).
BATCH_BYTES = 1 << 18
#: Whitespace runs this long or longer are squeezed as they are read (module docstring).
_GAP = 1 << 16
_BLANKS = b" \t\r\n"
#: Every run of ``_GAP`` blanks covers an offset that is a multiple of this: only runs through
#: such an offset are looked at (a few byte tests per read, no pass over the text).
_PROBE_STEP = _GAP // 2
_BLANK_BYTES = frozenset(_BLANKS)
_RUN = re.compile(rb"[ \t\r\n]+")
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_CUT = re.compile(rb"\}\s*,\s*\{")
_ARRAY_END = re.compile(rb"\}\s*\]")
_SPACE = re.compile(rb"\s*")
_KEY = re.compile(rb'"((?:[^"\\]|\\.)*)"\s*:\s*')
#: Tokens that matter when finding where a small top-level value ends.
_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]|[,}\]]')
_SCALAR = re.compile(rb'[^,}\]\s]+')


#: What reading a gzip stream raises when it is corrupt or cut short.
GZIP_ERRORS = (EOFError, gzip.BadGzipFile, zlib.error, _InflateError)


def open_decompressed(path: Path) -> BinaryIO:
    """``path`` for reading, decompressed on the fly when it is gzip. Raises OSError."""
    with open(path, "rb") as stream:
        gzipped = stream.read(2) == GZIP_MAGIC
    return _gzip.open(path, "rb") if gzipped else open(path, "rb")


class TraceFormatError(CommtagError):
    """The file is not a readable Chrome-JSON trace; the message says why."""


class TraceStream:
    """One trace file, read front to back once.

    Iterate :meth:`batches` to get the events (lists of parsed elements, in
    file order); afterwards :attr:`header` holds every other top-level key.
    Keys that precede ``traceEvents`` (as Kineto writes them) are in
    :attr:`header` before the first batch.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.header: dict = {}
        self._raw: BinaryIO  # set by _open, which batches calls first
        self._buf = b""
        self._pos = 0
        self._eof = False
        self._seen_events = False

    # -- input -------------------------------------------------------------
    def _open(self) -> None:
        try:
            self._raw = open_decompressed(self.path)
        except OSError as exc:
            raise TraceFormatError(f"cannot read: {exc.strerror or exc}") from None

    def _more(self) -> bool:
        """Append the next decompressed chunk; False at the end of the file.

        Offsets up to :attr:`_pos` stay valid (only :meth:`_compact` moves that
        text); squeezing whitespace may move text after it, so a later offset
        kept across a read is only a hint where to look.
        """
        if self._eof:
            return False
        try:
            chunk = self._raw.read(READ_BYTES)
        except GZIP_ERRORS as exc:
            raise TraceFormatError(f"truncated or corrupt gzip ({exc})") from None
        except OSError as exc:
            raise TraceFormatError(f"cannot read: {exc.strerror or exc}") from None
        if not chunk:
            self._eof = True
            return False
        old = len(self._buf)
        self._buf += chunk
        self._squeeze(old)
        return True

    def _squeeze(self, old: int) -> None:
        """Squeeze the long whitespace runs of the text read after ``old`` (module docstring).

        A run that reached ``old`` was shorter than :data:`_GAP` then (or kept,
        inside a string), so it is looked at again from its start; any other
        text is looked at once.
        """
        buf = self._buf
        low = max(self._pos, old - _GAP)
        start = at = low + len(buf[low:old].rstrip(_BLANKS))  # where the run reaching ``old`` starts
        parts = []
        kept = start
        for probe in range(-(-start // _PROBE_STEP) * _PROBE_STEP, len(buf), _PROBE_STEP):
            if probe < at or buf[probe] not in _BLANK_BYTES:
                continue
            # The run through ``probe`` starts within a step before it: had it started earlier,
            # the probe a step back would have found it (or it starts at ``start``).
            before = buf[max(start, probe - _PROBE_STEP):probe]
            run = _RUN.match(buf, probe - (len(before) - len(before.rstrip(_BLANKS))))
            assert run is not None, "it starts at a blank"
            at = run.end()
            if at - run.start() < _GAP:
                continue
            breaks = run.group().lstrip(b" ")[:1]
            if breaks:
                replacement = breaks  # a line break or tab: never inside a valid string
            elif not _inside_string(buf, self._pos, run.start()):
                replacement = b" "
            else:
                continue
            parts.append(buf[kept:run.start()])
            parts.append(replacement)
            kept = at
        if parts:
            parts.append(buf[kept:])
            self._buf = buf[:start] + b"".join(parts)

    def _compact(self) -> None:
        """Drop the text already consumed (once it is a read's worth: each drop copies the rest)."""
        if self._pos >= READ_BYTES:
            self._buf = self._buf[self._pos:]
            self._pos = 0

    def _skip_space(self) -> None:
        while True:
            space = _SPACE.match(self._buf, self._pos)
            assert space is not None, "it matches the empty string"
            self._pos = space.end()
            if self._pos < len(self._buf) or not self._more():
                return

    def _peek(self) -> bytes:
        self._skip_space()
        return self._buf[self._pos:self._pos + 1]

    def _expect(self, char: bytes, what: str) -> None:
        if self._peek() != char:
            raise TraceFormatError(f"not valid JSON (expected {char.decode()!r} {what})")
        self._pos += 1

    # -- top level ---------------------------------------------------------
    def batches(self) -> Iterator[list]:
        """The elements of ``traceEvents``, a batch at a time; fills :attr:`header` on the way."""
        self._open()
        try:
            if self._peek() != b"{":
                raise TraceFormatError("not a profiler trace: no traceEvents list")
            self._pos += 1
            first = True
            while True:
                if self._peek() == b"}":
                    self._pos += 1
                    break
                if not first:
                    self._expect(b",", "between top-level keys")
                    self._skip_space()
                first = False
                key = self._key()
                if key == "traceEvents" and self._peek() == b"[":
                    self._pos += 1
                    self._seen_events = True
                    yield from self._events()
                else:
                    self.header[key] = self._value()
            self._skip_space()
            if self._pos < len(self._buf):
                raise TraceFormatError("not valid JSON (text after the top-level object)")
            if not self._seen_events:
                raise TraceFormatError("not a profiler trace: no traceEvents list")
        finally:
            self._raw.close()
            self._buf = b""

    def _key(self) -> str:
        while True:
            match = _KEY.match(self._buf, self._pos)
            if match is not None:
                self._pos = match.end()
                try:
                    return orjson.loads(b'"' + match.group(1) + b'"')
                except orjson.JSONDecodeError as exc:
                    raise TraceFormatError(f"not valid JSON ({exc})") from None
            if len(self._buf) - self._pos > (1 << 16) or not self._more():
                raise TraceFormatError("not valid JSON (expected a top-level key)")

    def _value(self) -> object:
        """A top-level value other than the event array, parsed whole."""
        while True:
            end = _value_end(self._buf, self._pos)
            if end is not None:
                text = self._buf[self._pos:end]
                self._pos = end
                try:
                    return orjson.loads(text)
                except orjson.JSONDecodeError as exc:
                    raise TraceFormatError(f"not valid JSON ({exc})") from None
            if not self._more():
                raise TraceFormatError("not valid JSON (the file ends inside a top-level value)")

    # -- the event array ---------------------------------------------------
    def _events(self) -> Iterator[list]:
        if self._peek() == b"]":
            self._pos += 1
            return
        while True:
            self._compact()
            while len(self._buf) - self._pos <= BATCH_BYTES and self._more():
                pass
            batch, done = self._slice()
            yield batch
            if done:
                return

    def _slice(self) -> tuple[list, bool]:
        """Parse the next run of whole elements; True when it ended the array."""
        start = self._pos
        search_from = start + BATCH_BYTES
        while True:
            cut = _CUT.search(self._buf, search_from) if search_from < len(self._buf) else None
            if cut is not None:
                parsed = _parse_run(self._buf, start, cut.start() + 1)
                if parsed is not None:
                    self._pos = cut.end() - 1  # at the next element's "{"
                    return parsed, False
                # Inside a nested value or a string, or the run holds bad JSON: take twice as
                # much next time, so a bad file costs a few parses, not one per cut.
                search_from = max(cut.end(), start + 2 * (cut.start() - start))
                continue
            if self._more():
                continue
            # The whole rest of the file is in the buffer: the array must end in it.
            for end in _ARRAY_END.finditer(self._buf, start):
                parsed = _parse_run(self._buf, start, end.start() + 1)
                if parsed is not None:
                    self._pos = end.end()
                    return parsed, True
            try:
                orjson.loads(b"[" + self._buf[start:])
            except orjson.JSONDecodeError as exc:
                raise TraceFormatError(f"not valid JSON (in the event array: {exc})") from None
            raise TraceFormatError("not valid JSON (the event array is not closed)")


def _inside_string(buf: bytes, start: int, at: int) -> bool:
    """Whether offset ``at`` lies inside a JSON string, scanning from ``start`` (outside any string)."""
    pos = start
    while True:
        quote = buf.find(b'"', pos, at)
        if quote < 0:
            return False
        string = _STRING.match(buf, quote)
        if string is None or string.end() > at:
            return True  # opened before ``at`` and not closed before it
        pos = string.end()


def _parse_run(buf: bytes, start: int, end: int) -> Optional[list]:
    try:
        return orjson.loads(b"[" + buf[start:end] + b"]")
    except orjson.JSONDecodeError:
        return None


def _value_end(buf: bytes, pos: int) -> Optional[int]:
    """Where the JSON value at ``pos`` ends, or None if ``buf`` ends first."""
    if pos >= len(buf):
        return None
    head = buf[pos:pos + 1]
    if head not in (b"{", b"[", b'"'):
        match = _SCALAR.match(buf, pos)
        return match.end() if match and match.end() < len(buf) else None
    depth = 0
    for token in _TOKEN.finditer(buf, pos):
        text = token.group()
        if text[:1] == b'"':
            if depth == 0:
                return token.end()
        elif text in (b"{", b"["):
            depth += 1
        elif text in (b"}", b"]"):
            depth -= 1
            if depth == 0:
                return token.end()
    return None


class WholeTrace:
    """A trace served like :class:`TraceStream`, but read whole first: for callers that need
    every event afterwards (``--json`` writes them back annotated), which find
    the trace in :attr:`trace` once :meth:`batches` has run."""

    def __init__(self, path: Path) -> None:
        self._stream = TraceStream(path)
        self.header = self._stream.header
        self.trace: Optional[dict] = None

    def batches(self) -> Iterator[list]:
        events = [e for batch in self._stream.batches() for e in batch]
        self.trace = {**self.header, "traceEvents": events}
        yield events
