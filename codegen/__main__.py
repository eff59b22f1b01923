"""``python -m codegen``: regenerate, check, or generate bindings for new headers.

    python -m codegen                      regenerate every committed module from its pin
    python -m codegen --check              exit 1, with a diff, if a committed module is stale
    python -m codegen --header PATH --out FILE [--include DIR ...]
                                           generate from a cublasLt.h (or include directory)
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

from . import sources
from .pipeline import generate, summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m codegen", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true",
                        help="compare committed modules with freshly generated ones; exit 1 on drift")
    parser.add_argument("--pin", action="append", metavar="NAME",
                        help="only this pin (cuda12, cuda13); repeatable")
    parser.add_argument("--header", type=Path, metavar="PATH",
                        help="a cublasLt.h, or an include directory holding one")
    parser.add_argument("--include", type=Path, action="append", default=[], metavar="DIR",
                        help="more directories to find cublas_api.h / library_types.h in")
    parser.add_argument("--out", type=Path, metavar="FILE", help="where --header output goes")
    args = parser.parse_args(argv)

    try:
        if args.header:
            if args.out is None:
                parser.error("--header needs --out")
            with sources.from_path(args.header, args.include) as headers:
                text, bindings = generate(headers)
            args.out.write_text(text)
            print(f"wrote {args.out}: {summary(bindings)}")
            return 0

        pins = [p for p in sources.pins() if not args.pin or p.name in args.pin]
        if args.pin and len(pins) != len(args.pin):
            parser.error(f"unknown pin in {args.pin}; known: {[p.name for p in sources.pins()]}")
        stale = 0
        for pin in pins:
            with sources.from_pin(pin) as headers:
                text, bindings = generate(headers)
            relative = pin.module.relative_to(sources.ROOT)
            if args.check:
                committed = pin.module.read_text() if pin.module.exists() else ""
                if committed != text:
                    stale += 1
                    sys.stdout.writelines(difflib.unified_diff(
                        committed.splitlines(keepends=True), text.splitlines(keepends=True),
                        f"{relative} (committed)", f"{relative} (generated)"))
                    print(f"STALE {relative}: regenerate with `python -m codegen`")
                else:
                    print(f"ok    {relative}: {summary(bindings)}")
            else:
                pin.module.parent.mkdir(parents=True, exist_ok=True)
                pin.module.write_text(text)
                print(f"wrote {relative}: {summary(bindings)}")
        return 1 if stale else 0
    except (sources.SourceError, RuntimeError) as exc:
        print(f"codegen: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
