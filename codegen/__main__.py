"""``python -m codegen``: regenerate, check, or generate bindings for new headers.

    python -m codegen                      regenerate every committed module from its pin
    python -m codegen --check              exit 1, with a diff, if a committed module is stale
    python -m codegen --header PATH --out FILE [--include DIR ...]
                                           generate from a cublasLt.h (or include directory)
    python -m codegen --clear-cache        delete the cached headers
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

from . import fetch, sources
from .pipeline import generate, summary

WHERE = """\
where the headers come from:
  NVIDIA's headers are never committed; each pin (headers/pins/) names the wheels and the sha256
  of each header. A header comes from an installed distribution of the pinned version, else the
  per-user cache, else the package index. From the index only the few headers needed are read
  out of each wheel, with HTTP range requests (about 40 KB of a 581 MB cuBLAS wheel); a
  server without range support gets a whole download, with progress, checked against the
  index's sha256. What is downloaded, and from where, is said on stderr before it starts.

  cache:  $NVBLASLT_CODEGEN_CACHE, else $XDG_CACHE_HOME/nvblaslt/codegen, else
          ~/.cache/nvblaslt/codegen (here: {cache})
  index:  $NVBLASLT_CODEGEN_INDEX_URL, else $PIP_INDEX_URL, else https://pypi.org/simple/;
          if it cannot be read, `pip download` fetches the whole wheel (your pip configuration)
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m codegen", description=__doc__,
                                     epilog=WHERE.format(cache=sources.cache_root()),
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
    parser.add_argument("--no-cache", action="store_true",
                        help="neither read nor write the header cache: fetch afresh, into a temporary "
                             "directory deleted on exit")
    parser.add_argument("--clear-cache", action="store_true",
                        help="delete the cached headers (only codegen's entries in the cache directory) and exit")
    args = parser.parse_args(argv)

    if args.clear_cache:
        count, size = sources.clear_cache()
        print(f"codegen: deleted {count} cache entries ({fetch.human(size)}) from {sources.cache_root()}")
        return 0
    sources.use_cache(not args.no_cache)
    try:
        return _run(parser, args)
    finally:
        if report := sources.fetch_report():
            fetch.log(report)
        sources.use_cache(True)


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
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
