"""The ``commtag`` console script: a thin layer over the library API."""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

import orjson


def _cmd_schema(args: argparse.Namespace) -> int:
    from commtag.schema import CollectiveAnnotation, Sidecar

    model = Sidecar if args.sidecar else CollectiveAnnotation
    schema = model.model_json_schema(by_alias=True)
    sys.stdout.write(orjson.dumps(schema, option=orjson.OPT_INDENT_2).decode() + "\n")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="commtag", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    schema = sub.add_parser("schema", help="print the JSON Schema of an annotation (or a sidecar)")
    schema.add_argument("--sidecar", action="store_true", help="the whole sidecar file instead")
    schema.set_defaults(func=_cmd_schema)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))
