"""``tformer data fetch NAME``: download a dataset the recipes and benchmarks read, by name, verified by
SHA-256, and print its local folder; ``tformer data list``: the names, where each is found."""

from __future__ import annotations

import argparse
import sys


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "data", help="fetch the datasets recipes name (dataset:NAME/FILE), verified by checksum",
        description="Datasets by name (tformer.data.registry): their public sources and SHA-256 checksums. "
                    "Files go into DIR/NAME/ (default: TFORMER_DATA, else $XDG_CACHE_HOME/tformer/data or "
                    "~/.cache/tformer/data), where recipes find them; TFORMER_DATA_MIRROR=URL fetches from "
                    "URL/HOST/PATH instead of https://HOST/PATH.",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", title="actions", required=True)
    fetch = actions.add_parser(
        "fetch", help="download and verify datasets; print each one's folder",
        description="Download the files of each NAME that are not there yet (resuming a broken transfer), verify "
                    "every file's checksum, and print the dataset's folder. A file whose checksum fails is not "
                    "kept. Exit status 2, with one line, when a name is unknown, a source fails or a checksum "
                    "differs.",
    )
    fetch.add_argument("names", nargs="+", metavar="NAME", help="a dataset name (tformer data list)")
    fetch.add_argument("--dir", help="the data root to fetch into (default: TFORMER_DATA, else the cache)")
    fetch.add_argument("--offline", action="store_true",
                       help="download nothing: only verify the files already there (missing ones fail)")
    fetch.add_argument("--no-progress", action="store_true",
                       help="no progress bars (there are none either when stderr is not a terminal)")
    fetch.set_defaults(run=run_fetch)
    listing = actions.add_parser("list", help="the dataset names, their files, licenses and where each is found",
                                 description="The datasets tformer can fetch; the root column says where a recipe "
                                             "finds each (TFORMER_DATA, then the cache; '-': not fetched).")
    listing.set_defaults(run=run_list)


def run_fetch(args: argparse.Namespace) -> int:
    from tformer.cli import show_progress
    from tformer.data.cache import fetch_dataset

    for name in args.names:
        report = fetch_dataset(name, args.dir, offline=args.offline, progress=show_progress(args))
        fetched = f", {report.fetched} downloaded" if report.fetched else ""
        print(f"tformer data: {name}: {report.verified} file(s) verified{fetched}", file=sys.stderr)
        print(report.folder, flush=True)
    return 0


def run_list(args: argparse.Namespace) -> int:
    from tformer.data.cache import data_roots
    from tformer.data.registry import DATASETS

    roots = data_roots()
    rows = [("name", "files", "license", "root")]
    for name, entry in DATASETS.items():
        found = next((str(root) for root in roots if (root / name).is_dir()), "-")
        rows.append((name, str(len(entry.files)), entry.license, found))
    widths = [max(len(row[column]) for row in rows) for column in range(3)]
    for row in rows:
        print("  ".join(value.ljust(width) for value, width in zip(row, widths, strict=False)) + "  " + row[3])
    return 0
