"""Datasets by name: fetched from their public sources into a data root, verified by SHA-256, and found
there again by recipes (``train = "dataset:tinyshakespeare/input.txt.gz"``). The names, files, sources
and hashes are ``tformer.data.registry``'s.

Where datasets live (a root holds ``NAME/`` folders, as ``../shared/data`` beside the project does):
``fetch`` writes into ``dir``, else ``TFORMER_DATA``, else the cache (``$XDG_CACHE_HOME/tformer/data``,
``~/.cache/tformer/data``); a recipe finds a dataset in ``TFORMER_DATA``, then its ``[data] root`` (when that
folder exists), then the cache, and never downloads (no network at run time): ``tformer data fetch`` does.

A download goes into ``FILE.URLHASH.part`` beside its final name, resumed with an HTTP Range request when a
transfer broke off (in this call, or the next); the file gets its final name only once its checksum holds,
and a part that fails the checksum is deleted. ``TFORMER_DATA_MIRROR=URL`` fetches every source from
``URL/HOST/PATH`` instead of ``https://HOST/PATH`` (a local copy laid out like the sources: tests, a site mirror).
Only the standard library speaks HTTP here (urllib).
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
import zlib
from dataclasses import dataclass
from pathlib import Path

from tformer.data.registry import DATASETS, DataFile, Dataset
from tformer.errors import TformerError, listed
from tformer.files import write_bytes_atomically

ROOT_VARIABLE = "TFORMER_DATA"
MIRROR_VARIABLE = "TFORMER_DATA_MIRROR"
PREFIX = "dataset:"  # a recipe's path to a file of a dataset by name: dataset:NAME/FILE
TIMEOUT = 60.0  # seconds without a byte before a connection counts as broken
ATTEMPTS = 3  # transfers of one file per call: a broken one resumes where it stopped
CHUNK = 1 << 16
BAR_BYTES = 1 << 20  # files from this size get a progress bar of their own


class DataFetchError(TformerError):
    """A dataset cannot be fetched or verified: unknown name, HTTP error, network down, wrong checksum."""


@dataclass(frozen=True)
class FetchReport:
    """What ``fetch_dataset`` did: the dataset's folder, its files verified, how many were downloaded."""

    folder: Path
    verified: int
    fetched: int


def cache_dir() -> Path:
    """The default data root: ``$XDG_CACHE_HOME/tformer/data``, else ``~/.cache/tformer/data``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "tformer" / "data"


def default_root() -> Path:
    """Where ``fetch`` writes without ``dir``: ``TFORMER_DATA``, else the cache."""
    given = os.environ.get(ROOT_VARIABLE)
    return Path(given).expanduser() if given else cache_dir()


def dataset(name: str) -> Dataset:
    """The registry's dataset ``name``; an unknown name is refused with the known ones."""
    if name not in DATASETS:
        raise DataFetchError(f"no dataset named {name!r}; datasets: {listed(sorted(DATASETS), limit=99)}")
    return DATASETS[name]


def fetch(name: str, dir: str | Path | None = None, offline: bool = False, progress: bool | None = None) -> Path:
    """The local folder of dataset ``name``, every file verified, the missing ones downloaded first into
    ``dir`` (default: ``TFORMER_DATA``, else the cache). ``offline``: download nothing, only verify what is
    there. ``progress``: progress bars (default: when standard error is a terminal)."""
    return fetch_dataset(name, dir, offline, progress).folder


def fetch_dataset(name: str, dir: str | Path | None = None, offline: bool = False,
                  progress: bool | None = None) -> FetchReport:
    """``fetch`` with what it did: files verified and downloaded."""
    from tqdm.auto import tqdm

    entry = dataset(name)
    folder = ((Path(dir).expanduser() if dir is not None else default_root()) / entry.name).resolve()
    progress = sys.stderr.isatty() if progress is None else progress
    problems: list[str] = []
    fetched = 0
    with tqdm(entry.files, desc=name, unit="file", disable=not progress or len(entry.files) < 2,
              leave=False) as files:
        for file in files:
            target = folder / file.path
            if target.is_file():
                digest = content_sha256(target)
                if digest != file.sha256:
                    problems.append(f"{target} does not match its checksum ({_mismatch(file.sha256, digest)}); "
                                    "delete it to fetch it again")
            elif offline:
                problems.append(f"{target} is missing (run without --offline to fetch it)")
            else:
                fetch_file(file, target, progress)
                fetched += 1
    if problems:
        more = f" (and {len(problems) - 1} more of its {len(entry.files)} files)" if len(problems) > 1 else ""
        raise DataFetchError(f"{name}: {problems[0]}{more}")
    return FetchReport(folder, len(entry.files), fetched)


def fetch_file(file: DataFile, target: Path, progress: bool = False) -> None:
    """Download ``file`` to ``target`` from the first of its URLs that answers, verified; a source that
    fails (HTTP error, unreachable, wrong checksum) passes to the next, and the last failure is raised."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise DataFetchError(f"cannot create {target.parent} ({error.strerror or error}); choose another folder "
                             f"(--dir, {ROOT_VARIABLE})") from None
    failures: list[str] = []
    for url in file.urls:
        url = mirrored(url)
        part = target.with_name(f"{target.name}.{hashlib.sha256(url.encode()).hexdigest()[:8]}.part")
        try:
            download(url, part, progress=progress, label=file.path)
            install(file, url, part, target)
        except DataFetchError as error:
            failures.append(str(error))
            continue
        for leftover in target.parent.glob(f"{target.name}.*.part"):  # partials from other sources
            leftover.unlink(missing_ok=True)
        return
    if len(failures) == 1:
        raise DataFetchError(failures[0])
    raise DataFetchError(f"{file.path}: every source failed: " + "; ".join(failures) if failures else
                         f"{file.path}: the registry names no source")


def mirrored(url: str) -> str:
    """``url`` as ``TFORMER_DATA_MIRROR`` rewrites it: ``https://HOST/PATH`` -> ``MIRROR/HOST/PATH``."""
    mirror = os.environ.get(MIRROR_VARIABLE)
    if not mirror:
        return url
    return f"{mirror.rstrip('/')}/{url.split('://', 1)[-1]}"


def download(url: str, part: Path, progress: bool = False, label: str = "", attempts: int | None = None) -> None:
    """Fetch ``url`` into ``part``, continuing a partial ``part`` with an HTTP Range request (from the start
    when the server ignores it); a transfer that breaks off is resumed up to ``attempts`` times in all, then
    the part is kept for the next call. Redirects are followed (urllib)."""
    attempts = attempts or ATTEMPTS
    broke = ""
    for _ in range(attempts):
        have = part.stat().st_size if part.is_file() else 0
        headers = {"User-Agent": "tformer-data-fetch", **({"Range": f"bytes={have}-"} if have else {})}
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=TIMEOUT) as response:
                if have and response.status != 206:  # the whole file again
                    have = 0
                total = _expected_size(response, have)
                received = _receive(response, part, have, total, progress, label)
        except urllib.error.HTTPError as error:
            if error.code == 416 and have:  # nothing past what is there: the part is stale, start afresh
                part.unlink(missing_ok=True)
                continue
            raise DataFetchError(f"{url}: HTTP {error.code} {error.reason}") from None
        except urllib.error.URLError as error:
            raise DataFetchError(f"{url}: cannot connect ({_reason(error.reason)}); check the network, or use "
                                 f"files already fetched (--offline, {ROOT_VARIABLE})") from None
        except (http.client.HTTPException, OSError) as error:  # reset, timeout or protocol error mid-transfer
            broke = _reason(error)
            continue
        if total is None or received >= total:
            return
        broke = f"the connection closed after {received:,} of {total:,} bytes"
    size = part.stat().st_size if part.is_file() else 0
    raise DataFetchError(f"{url}: the transfer broke off ({broke}; {attempts} attempt(s)); {part} keeps the "
                         f"{size:,} bytes received: run again to resume")


def _expected_size(response, have: int) -> int | None:
    """The whole file's size from Content-Range (a resumed transfer) or Content-Length, if the server says."""
    content_range = response.headers.get("Content-Range", "")
    if response.status == 206 and "/" in content_range and content_range.rsplit("/", 1)[1].strip().isdigit():
        return int(content_range.rsplit("/", 1)[1])
    length = response.headers.get("Content-Length")
    return have + int(length) if length and length.isdigit() else None


def _receive(response, part: Path, have: int, total: int | None, progress: bool, label: str) -> int:
    """Append the response's body to ``part`` (after its first ``have`` bytes); the bytes it then holds."""
    from tqdm.auto import tqdm

    try:
        out = open(part, "r+b" if have else "wb")  # closed by the with below
        out.seek(have)
        out.truncate()
    except OSError as error:
        raise DataFetchError(f"cannot write {part} ({_reason(error)}); choose another folder (--dir, "
                             f"{ROOT_VARIABLE})") from None
    with out, tqdm(total=total, initial=have, unit="B", unit_scale=True, unit_divisor=1024, desc=label,
                   leave=False, disable=not progress or (total or 0) < BAR_BYTES) as bar:
        while chunk := response.read(CHUNK):  # a network error here propagates: the transfer broke off
            try:
                out.write(chunk)
            except OSError as error:
                raise DataFetchError(f"cannot write {part} ({_reason(error)})") from None
            bar.update(len(chunk))
        return out.tell()


def install(file: DataFile, url: str, part: Path, target: Path) -> None:
    """Verify a downloaded ``part`` and give it its final name ``target`` (compressed first when the source
    is plain and the name ends in .gz; its first line replaced for a ``header``); a part that fails the
    checksum is deleted."""
    plain_source = not urllib.parse.urlsplit(url).path.endswith(".gz")
    if plain_source and (file.header is not None or target.name.endswith(".gz")):
        data = part.read_bytes()
        if file.header is not None:
            data = file.header.encode() + b"\n" + data.partition(b"\n")[2]
        _check(file, url, part, hashlib.sha256(data).hexdigest())
        write_bytes_atomically(target, gzip.compress(data, 9, mtime=0) if target.name.endswith(".gz") else data)
        part.unlink()
        return
    _check(file, url, part, content_sha256(part, gzipped=not plain_source))
    os.replace(part, target)


def _check(file: DataFile, url: str, part: Path, digest: str | None) -> None:
    if digest != file.sha256:
        part.unlink(missing_ok=True)
        raise DataFetchError(f"{file.path} from {url} does not match its checksum ({_mismatch(file.sha256, digest)}); "
                             "nothing was kept")


def content_sha256(path: Path, gzipped: bool | None = None) -> str | None:
    """The SHA-256 of a file's content: of what it decompresses to when it is gzip (``gzipped``, by default a
    name ending in .gz); None for a gzip file that does not decompress."""
    gzipped = path.name.endswith(".gz") if gzipped is None else gzipped
    digest = hashlib.sha256()
    try:
        with (gzip.open(path, "rb") if gzipped else open(path, "rb")) as handle:
            while block := handle.read(CHUNK * 16):
                digest.update(block)
    except (EOFError, zlib.error, gzip.BadGzipFile):
        return None
    return digest.hexdigest()


def _mismatch(expected: str, got: str | None) -> str:
    return f"expected sha256 {expected[:16]}..., got {got[:16] + '...' if got else 'a gzip file that does not open'}"


def _reason(error: object) -> str:
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return str(error) or type(error).__name__


# ---- recipes: dataset:NAME/FILE -----------------------------------------------------------------------


def data_roots(recipe_root: str | Path | None = None) -> list[Path]:
    """Where a recipe looks for datasets, in order: ``TFORMER_DATA``, the recipe's ``[data] root`` when that
    folder exists, the cache."""
    roots = [Path(os.environ[ROOT_VARIABLE]).expanduser()] if os.environ.get(ROOT_VARIABLE) else []
    if recipe_root is not None and Path(recipe_root).is_dir():
        roots.append(Path(recipe_root))
    return [*roots, cache_dir()]


def is_dataset_path(value: str) -> bool:
    """Whether a recipe's path names a dataset's file (``dataset:NAME/FILE``)."""
    return value.startswith(PREFIX)


def dataset_name(value: str) -> str:
    """The registry's name in ``dataset:NAME/FILE`` (a name may hold a slash: ``tokenizers/gpt2``)."""
    rest = value.removeprefix(PREFIX).strip("/")
    names = [name for name in DATASETS if rest == name or rest.startswith(name + "/")]
    if not names:
        raise DataFetchError(f"{value}: no dataset of that name; datasets: {listed(sorted(DATASETS), limit=99)}")
    return max(names, key=len)


def resolve(value: str, recipe_root: str | Path | None = None) -> Path:
    """The local path of ``dataset:NAME/FILE`` (FILE may be a prefix: a translation corpus's ``train``): in
    the first root of ``data_roots`` holding NAME's folder. Nothing is downloaded; a dataset found in no root
    is refused with the command that fetches it."""
    name, rest = dataset_name(value), value.removeprefix(PREFIX).strip("/")
    roots = data_roots(recipe_root)
    for root in roots:
        if (root / name).is_dir():
            return (root / rest).resolve()
    raise DataFetchError(f"{value}: the dataset {name} is not in {' or '.join(map(str, roots))}; fetch it with "
                         f"`tformer data fetch {name}` (or set {ROOT_VARIABLE} to a folder that holds it)")
