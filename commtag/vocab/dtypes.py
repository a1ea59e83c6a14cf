"""torch's dtypes as the profiler names them, and their element sizes."""

from __future__ import annotations

from typing import NamedTuple, Optional


class Dtype(NamedTuple):
    """One torch dtype as the profiler names it."""

    #: ``torch.<attr>`` (the canonical attribute; aliases such as ``half`` are the same dtype).
    attr: str
    #: c10 ScalarType name, as ``toString(ScalarType)`` prints it into "dtype".
    scalar_type: str
    #: Bytes per element for bandwidth; None for sub-byte shells (no defined element size).
    nbytes: Optional[int]


#: Every dtype torch 2.x defines (attributes a given torch lacks are skipped by the runtime).
#: The runtime reads it to name a tensor's dtype, on the Python-wrapper path and at operator
#: level alike; the merge reads the byte sizes for bandwidth and the names to validate a sidecar.
DTYPES: tuple[Dtype, ...] = (
    Dtype("uint8", "Byte", 1), Dtype("int8", "Char", 1), Dtype("int16", "Short", 2),
    Dtype("int32", "Int", 4), Dtype("int64", "Long", 8), Dtype("float16", "Half", 2),
    Dtype("float32", "Float", 4), Dtype("float64", "Double", 8), Dtype("complex32", "ComplexHalf", 4),
    Dtype("complex64", "ComplexFloat", 8), Dtype("complex128", "ComplexDouble", 16), Dtype("bool", "Bool", 1),
    Dtype("qint8", "QInt8", 1), Dtype("quint8", "QUInt8", 1), Dtype("qint32", "QInt32", 4),
    Dtype("bfloat16", "BFloat16", 2), Dtype("quint4x2", "QUInt4x2", 1), Dtype("quint2x4", "QUInt2x4", 1),
    Dtype("bits1x8", "Bits1x8", 1), Dtype("bits2x4", "Bits2x4", 1), Dtype("bits4x2", "Bits4x2", 1),
    Dtype("bits8", "Bits8", 1), Dtype("bits16", "Bits16", 2),
    Dtype("float8_e5m2", "Float8_e5m2", 1), Dtype("float8_e4m3fn", "Float8_e4m3fn", 1),
    Dtype("float8_e5m2fnuz", "Float8_e5m2fnuz", 1), Dtype("float8_e4m3fnuz", "Float8_e4m3fnuz", 1),
    Dtype("uint16", "UInt16", 2), Dtype("uint32", "UInt32", 4), Dtype("uint64", "UInt64", 8),
    Dtype("uint1", "UInt1", None), Dtype("uint2", "UInt2", None), Dtype("uint3", "UInt3", None),
    Dtype("uint4", "UInt4", None), Dtype("uint5", "UInt5", None), Dtype("uint6", "UInt6", None),
    Dtype("uint7", "UInt7", None), Dtype("int1", "Int1", None), Dtype("int2", "Int2", None),
    Dtype("int3", "Int3", None), Dtype("int4", "Int4", None), Dtype("int5", "Int5", None),
    Dtype("int6", "Int6", None), Dtype("int7", "Int7", None),
    Dtype("float8_e8m0fnu", "Float8_e8m0fnu", 1), Dtype("float4_e2m1fn_x2", "Float4_e2m1fn_x2", 1),
)
#: The ScalarType name of a dtype the profiler does not know.
UNDEFINED_DTYPE = "Undefined"
#: ``torch.<attr>`` name -> ScalarType name.
SCALAR_TYPE_OF: dict[str, str] = {d.attr: d.scalar_type for d in DTYPES}
#: Every ScalarType name a "dtype" key may hold.
SCALAR_TYPE_NAMES = frozenset({d.scalar_type for d in DTYPES} | {UNDEFINED_DTYPE})
#: Bytes per element by ScalarType name; used for bandwidth.
SCALAR_TYPE_BYTES: dict[str, int] = {d.scalar_type: d.nbytes for d in DTYPES if d.nbytes is not None}
#: The profiler records a complex tensor as its real view (``view_as_real``): this dtype,
#: twice the elements.
RECORDED_AS_REAL: dict[str, str] = {"ComplexHalf": "Half", "ComplexFloat": "Float", "ComplexDouble": "Double"}
