"""Refresh the curated PNGs of ``docs/figures/`` (shown in ``docs/gallery.md``) from the cached
data of a report run, re-rendered at a small resolution.

Usage: ``python -m analysis report`` (or the figure subcommands) first, then
``python -m analysis.figures.gallery [--out reports] [--docs docs/figures] [NAME ...]``.
Nothing is recomputed: each figure's data comes from ``<out>/figures/_cache/<name>.json``.
Without a NAME every figure with cached data is redrawn and the others are skipped (said on
stderr); a NAME without cached data fails the command (exit 1). Exit 2 on a usage error: an
unknown NAME, an ``--out`` that holds no cached figure data, a ``--docs`` that cannot be written.
"""

from __future__ import annotations

import importlib
import json
import pathlib
import sys
import tempfile

from PIL import Image

from ..argtypes import HelpFormatter, OneLineParser, did_you_mean, folder, plain, writable_folder
from . import FIGURES
from . import _common as C

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _small_png(src: pathlib.Path, dst: pathlib.Path) -> None:
    """Copy a PNG as a 256-colour palette image (line plots lose nothing visible; ~3x smaller)."""
    with Image.open(src) as im:
        im.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(
            dst, optimize=True
        )


def cache_file(out: pathlib.Path, name: str) -> pathlib.Path:
    """Where a report run in ``out`` caches the data of figure ``name``."""
    return out / "figures" / "_cache" / f"{name}.json"


def refresh(out: pathlib.Path, docs: pathlib.Path, names=None) -> list:
    """Re-render every cached figure at ``GALLERY_DPI`` into ``docs``; returns the PNGs written.
    A figure without cached data is skipped, said on stderr."""
    docs.mkdir(parents=True, exist_ok=True)
    written = []
    for name in names or FIGURES:
        mod = importlib.import_module(f"analysis.figures.{name}")
        cache = cache_file(out, mod.NAME)
        if not cache.exists():
            print(
                f"skip {mod.NAME}: no cached data at {cache} (run the figure first)",
                file=sys.stderr,
            )
            continue
        entry = json.loads(cache.read_text())
        dpi = C.FIGURE_DPI
        C.FIGURE_DPI = C.GALLERY_DPI
        try:
            with tempfile.TemporaryDirectory() as tmp:
                C.render_stamped(mod.render, pathlib.Path(tmp), entry["params"], entry["data"])
                target = docs / f"{mod.NAME}.png"
                _small_png(pathlib.Path(tmp) / f"{mod.NAME}.png", target)
        finally:
            C.FIGURE_DPI = dpi
        written.append(target)
        print(f"wrote {target}")
    return written


def _parser() -> OneLineParser:
    p = OneLineParser(
        prog="python -m analysis.figures.gallery",
        description=plain(__doc__),
        formatter_class=HelpFormatter,
    )
    p.add_argument(
        "--out",
        type=folder,
        default=ROOT / "reports",
        metavar="DIR",
        help="the report folder with the cached data (DIR/figures/_cache/)",
    )
    p.add_argument(
        "--docs",
        type=folder,
        default=ROOT / "docs" / "figures",
        metavar="DIR",
        help="where the PNGs go (created if missing)",
    )
    p.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help=f"figures to redraw (default: every one with cached data): {', '.join(FIGURES)}",
    )
    return p


def main(argv=None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    for name in args.names:
        if name not in FIGURES:
            p.error(f"argument NAME: unknown figure {name!r}{did_you_mean(name, FIGURES)}")
    if not args.out.is_dir():
        p.error(f"argument --out: no such folder {str(args.out)!r}")
    if not any(cache_file(args.out, name).exists() for name in args.names or FIGURES):
        p.error(
            f"argument --out: no cached figure data in {str(args.out / 'figures' / '_cache')!r} "
            "(run python -m analysis NAME --out DIR first)"
        )
    writable_folder(p, args.docs, "--docs")
    written = refresh(args.out, args.docs, args.names or None)
    return 1 if args.names and len(written) < len(args.names) else 0  # a named one skipped


if __name__ == "__main__":
    raise SystemExit(main())
