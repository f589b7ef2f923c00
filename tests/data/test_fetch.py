"""Datasets by name (tformer.data.cache, tformer data fetch) against a loopback HTTP server serving files the
tests make: a good download, a wrong checksum, a broken transfer resumed with Range, a 404, a redirect, the
network down, offline verification, the command line's one-line errors; recipes' dataset:NAME/FILE paths; and
the registry against the shipped recipes and the copies in ../shared/data. Nothing here leaves 127.0.0.1."""

from __future__ import annotations

import gzip
import hashlib
import re
import socket
import threading
import tomllib
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from shared_data import SHARED_DATA

from tformer.cli import main
from tformer.data import cache
from tformer.data.cache import DataFetchError, fetch, fetch_dataset
from tformer.data.registry import DATASETS, DataFile, Dataset
from tformer.training.recipe import RecipeError, load_recipe

REPO = Path(__file__).resolve().parents[2]
TEXT = b"".join(b"line %d of a small corpus\n" % number for number in range(4000))  # 110,890 bytes


@dataclass
class Route:
    """What the server answers for one path: ``body`` (Range honoured unless ``ignore_range``), a redirect to
    ``location``, or the first answer cut after ``cut`` bytes (the full length announced, then the close)."""

    body: bytes = b""
    location: str | None = None
    cut: int | None = None
    ignore_range: bool = False


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.server.requests.append((self.path, self.headers.get("Range")))
        route = self.server.routes.get(self.path)
        if route is None:
            self.send_error(404)
            return
        if route.location is not None:
            self.send_response(302)
            self.send_header("Location", route.location)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        start = 0
        asked = self.headers.get("Range")
        if asked and not route.ignore_range:
            start = int(re.fullmatch(r"bytes=(\d+)-", asked).group(1))
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(route.body) - 1}/{len(route.body)}")
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(len(route.body) - start))
        self.end_headers()
        payload = route.body[start:]
        if route.cut is not None:
            payload, route.cut = payload[: route.cut], None  # only the first answer breaks off
        self.wfile.write(payload)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def server(monkeypatch, tmp_path):
    """A loopback server standing in for every source (TFORMER_DATA_MIRROR), the cache in tmp_path."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.routes, httpd.requests = {}, []
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    monkeypatch.setenv("TFORMER_DATA_MIRROR", f"http://127.0.0.1:{httpd.server_port}")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("TFORMER_DATA", raising=False)
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def register(monkeypatch, name: str, *files: DataFile) -> None:
    monkeypatch.setitem(DATASETS, name, Dataset(name, files, "the test's own files", "none"))


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def parts(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.part"))


def test_a_good_download_is_verified_and_named_only_then(server, monkeypatch, tmp_path):
    """A plain file kept as served, a plain source stored gzip'd under its .gz name, a gzip source kept as it is;
    a second fetch verifies and downloads nothing."""
    packed = gzip.compress(TEXT[:5000])
    large = TEXT * 10  # over BAR_BYTES: a progress bar of its own
    server.routes.update({"/example.org/toy/a.txt": Route(large), "/example.org/toy/b.txt": Route(TEXT[:999]),
                          "/example.org/toy/c.txt.gz": Route(packed)})
    register(monkeypatch, "toy", DataFile("a.txt", ("https://example.org/toy/a.txt",), sha256(large)),
             DataFile("sub/b.txt.gz", ("https://example.org/toy/b.txt",), sha256(TEXT[:999])),
             DataFile("c.txt.gz", ("https://example.org/toy/c.txt.gz",), sha256(TEXT[:5000])))
    report = fetch_dataset("toy", progress=True)  # bars drawn (on stderr) for the files and the 1 MiB one
    folder = tmp_path / "cache" / "tformer" / "data" / "toy"
    assert report.folder == folder and (report.verified, report.fetched) == (3, 3)
    assert (folder / "a.txt").read_bytes() == large
    assert gzip.decompress((folder / "sub" / "b.txt.gz").read_bytes()) == TEXT[:999]
    assert (folder / "c.txt.gz").read_bytes() == packed and not parts(folder)
    served = len(server.requests)
    assert fetch_dataset("toy").fetched == 0 and len(server.requests) == served


def test_a_wrong_checksum_is_refused_and_nothing_is_kept(server, monkeypatch, tmp_path):
    server.routes["/example.org/toy/a.txt"] = Route(TEXT + b"tampered")
    register(monkeypatch, "toy", DataFile("a.txt", ("https://example.org/toy/a.txt",), sha256(TEXT)))
    with pytest.raises(DataFetchError, match=r"a\.txt from http://127\.0\.0\.1:\d+/example\.org/toy/a\.txt does not "
                                             r"match its checksum \(expected sha256 [0-9a-f]{16}\.\.\., got"):
        fetch("toy", dir=tmp_path / "data")
    folder = tmp_path / "data" / "toy"
    assert not (folder / "a.txt").exists() and not parts(folder)


def test_a_broken_transfer_is_resumed_with_a_range_request(server, monkeypatch, tmp_path):
    """Broken off once with one attempt a call: the part keeps what arrived, the final name is absent; the next
    call asks for the rest (Range) and finishes. With the default attempts one call does both."""
    server.routes["/example.org/toy/a.txt"] = Route(TEXT, cut=30_000)
    register(monkeypatch, "toy", DataFile("a.txt", ("https://example.org/toy/a.txt",), sha256(TEXT)))
    monkeypatch.setattr(cache, "ATTEMPTS", 1)
    with pytest.raises(DataFetchError, match=r"broke off \(the connection closed after 30,000 of 110,890 bytes; "
                                             r"1 attempt\(s\)\); .*keeps the 30,000 bytes received: run again to "
                                             r"resume"):
        fetch("toy")
    folder = tmp_path / "cache" / "tformer" / "data" / "toy"
    (part,) = parts(folder)
    assert part.stat().st_size == 30_000 and not (folder / "a.txt").exists()
    fetch("toy")
    assert (folder / "a.txt").read_bytes() == TEXT and not parts(folder)
    assert server.requests == [("/example.org/toy/a.txt", None), ("/example.org/toy/a.txt", "bytes=30000-")]

    monkeypatch.setattr(cache, "ATTEMPTS", 3)
    server.routes["/example.org/toy/b.txt"] = Route(TEXT, cut=1000)
    register(monkeypatch, "again", DataFile("b.txt", ("https://example.org/toy/b.txt",), sha256(TEXT)))
    assert (fetch("again") / "b.txt").read_bytes() == TEXT
    assert server.requests[-1] == ("/example.org/toy/b.txt", "bytes=1000-")


def test_a_server_that_ignores_range_sends_the_file_afresh(server, monkeypatch, tmp_path):
    server.routes["/example.org/toy/a.txt"] = Route(TEXT, cut=40_000, ignore_range=True)
    register(monkeypatch, "toy", DataFile("a.txt", ("https://example.org/toy/a.txt",), sha256(TEXT)))
    assert (fetch("toy") / "a.txt").read_bytes() == TEXT


def test_a_404_is_named_and_the_next_source_is_tried(server, monkeypatch, tmp_path):
    register(monkeypatch, "toy", DataFile("a.txt", ("https://example.org/gone/a.txt",), sha256(TEXT)))
    with pytest.raises(DataFetchError, match=r"^http://127\.0\.0\.1:\d+/example\.org/gone/a\.txt: HTTP 404 "):
        fetch("toy")
    assert not (tmp_path / "cache" / "tformer" / "data" / "toy" / "a.txt").exists()

    server.routes["/mirror.example.org/a.txt"] = Route(TEXT)
    register(monkeypatch, "toy", DataFile("a.txt", ("https://example.org/gone/a.txt",
                                                    "https://mirror.example.org/a.txt"), sha256(TEXT)))
    assert (fetch("toy") / "a.txt").read_bytes() == TEXT


def test_a_redirect_is_followed(server, monkeypatch):
    port = server.server_port
    server.routes.update({"/example.org/old/a.txt": Route(location=f"http://127.0.0.1:{port}/example.org/new/a.txt"),
                          "/example.org/new/a.txt": Route(TEXT)})
    register(monkeypatch, "toy", DataFile("a.txt", ("https://example.org/old/a.txt",), sha256(TEXT)))
    assert (fetch("toy") / "a.txt").read_bytes() == TEXT
    assert [path for path, _ in server.requests] == ["/example.org/old/a.txt", "/example.org/new/a.txt"]


def test_the_network_down_is_one_clear_error(monkeypatch, tmp_path):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("TFORMER_DATA_MIRROR", f"http://127.0.0.1:{port}")
    register(monkeypatch, "toy", DataFile("a.txt", ("https://example.org/toy/a.txt",), sha256(TEXT)))
    with pytest.raises(DataFetchError, match=r"a\.txt: cannot connect \(.*\); check the network"):
        fetch("toy", dir=tmp_path)


def test_offline_only_verifies_what_is_there(server, monkeypatch, tmp_path):
    server.routes["/example.org/toy/a.txt"] = Route(TEXT)
    register(monkeypatch, "toy", DataFile("a.txt", ("https://example.org/toy/a.txt",), sha256(TEXT)))
    with pytest.raises(DataFetchError, match=r"a\.txt is missing \(run without --offline to fetch it\)"):
        fetch("toy", offline=True)
    assert server.requests == []
    folder = fetch("toy")
    assert fetch("toy", offline=True) == folder and len(server.requests) == 1
    (folder / "a.txt").write_bytes(TEXT[:-1])
    with pytest.raises(DataFetchError, match=r"a\.txt does not match its checksum .*; delete it to fetch it again"):
        fetch("toy", offline=True)
    with pytest.raises(DataFetchError, match="does not match its checksum"):  # never overwritten behind one's back
        fetch("toy")


def test_the_command_line_prints_the_folder_or_one_line_and_exit_2(server, monkeypatch, tmp_path, capsys):
    server.routes["/example.org/toy/a.txt"] = Route(TEXT)
    register(monkeypatch, "toy", DataFile("a.txt", ("https://example.org/toy/a.txt",), sha256(TEXT)))
    register(monkeypatch, "gone", DataFile("a.txt", ("https://example.org/gone/a.txt",), sha256(TEXT)))
    assert main(["data", "fetch", "toy", "--dir", str(tmp_path / "d")]) == 0
    out, err = capsys.readouterr()
    assert out == f"{tmp_path / 'd' / 'toy'}\n" and err == "tformer data: toy: 1 file(s) verified, 1 downloaded\n"
    for argv, message in ((["data", "fetch", "gone"], r"gone/a\.txt: HTTP 404 Not Found"),
                          (["data", "fetch", "nothing"], r"no dataset named 'nothing'; datasets: .*tinyshakespeare"),
                          (["data", "fetch", "toy", "--offline"], r"toy: .*a\.txt is missing")):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert re.match(rf"tformer data: error: .*{message}", err), err


def test_recipes_find_a_dataset_by_name_in_the_data_roots(monkeypatch, tmp_path):
    """TFORMER_DATA, then [data] root when it exists, then the cache; absent everywhere: the fetch command."""
    for root in ("env", "recipe-root", "cache/tformer/data"):
        (tmp_path / root / "tinyshakespeare").mkdir(parents=True)
        (tmp_path / root / "tinyshakespeare" / "input.txt.gz").write_bytes(gzip.compress(b"to be or not to be\n"))
    recipe = tmp_path / "r.toml"
    recipe.write_text('[model]\npreset = "gpt-nano"\n\n[data]\nroot = "recipe-root"\n'
                      'train = "dataset:tinyshakespeare/input.txt.gz"\n', encoding="utf-8")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("TFORMER_DATA", str(tmp_path / "env"))
    assert load_recipe(recipe).data.train == str(tmp_path / "env" / "tinyshakespeare" / "input.txt.gz")
    monkeypatch.delenv("TFORMER_DATA")
    assert load_recipe(recipe).data.train == str(tmp_path / "recipe-root" / "tinyshakespeare" / "input.txt.gz")
    assert load_recipe(recipe, ["data.root=elsewhere"]).data.train == \
        str(tmp_path / "cache" / "tformer" / "data" / "tinyshakespeare" / "input.txt.gz")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "empty"))
    with pytest.raises(RecipeError, match=r"r\.toml: \[data\] train: dataset:tinyshakespeare/input\.txt\.gz: the "
                                          r"dataset tinyshakespeare is not in .*; fetch it with `tformer data fetch "
                                          r"tinyshakespeare`"):
        load_recipe(recipe, ["data.root=elsewhere"])
    with pytest.raises(RecipeError, match=r"dataset:shakespeare/x: no dataset of that name; datasets: "):
        load_recipe(recipe, ["data.train=dataset:shakespeare/x"])


def test_the_registry_pins_its_sources():
    for entry in DATASETS.values():
        assert entry.files and entry.license and entry.source
        for file in entry.files:
            assert re.fullmatch(r"[0-9a-f]{64}", file.sha256) and file.urls, (entry.name, file.path)
            for url in file.urls:
                assert url.startswith(("https://", "http://fashion-mnist.s3-website")), url
                if "raw.githubusercontent.com" in url:
                    assert re.match(r"https://raw\.githubusercontent\.com/[^/]+/[^/]+/[0-9a-f]{40}/", url), url


def recipe_datasets() -> dict[str, set[str]]:
    """Each dataset the shipped recipes name (dataset:NAME/FILE), with the recipes naming it."""
    named: dict[str, set[str]] = {}
    for path in sorted((REPO / "configs").glob("*.toml")):
        data = tomllib.loads(path.read_text(encoding="utf-8")).get("data", {})
        values = [*data.values(), *(value for source in data.get("sources", []) for value in source.values())]
        for value in values:  # a text-to-text recipe's sources name their own files
            if isinstance(value, str) and cache.is_dataset_path(value):
                named.setdefault(cache.dataset_name(value), set()).add(path.name)
    return named


def test_every_dataset_a_recipe_names_is_registered():
    named = recipe_datasets()  # dataset_name refuses a name the registry does not hold
    assert set(named) == {"tinyshakespeare", "wikitext-2", "tokenizers/bert-base-uncased", "tokenizers/gpt2", "mnist",
                          "fashion-mnist", "multi30k", "sst2", "wnut17", "squad-v1.1", "gsm8k"}
    # every shipped recipe but fsdd-digits and t5-span-pretrain, whose data a script builds from fetched datasets
    assert len(set().union(*named.values())) == len(list((REPO / "configs").glob("*.toml"))) - 2


@pytest.mark.slow  # hashes every registered file in ../shared/data (about 150 MB of content): seconds
def test_the_registry_hashes_verify_the_shared_copies():
    if not SHARED_DATA.is_dir():
        pytest.skip(f"{SHARED_DATA} is absent (a fresh clone): the registry's hashes were not checked against it")
    for name, entry in DATASETS.items():
        assert fetch(name, dir=SHARED_DATA, offline=True, progress=False) == (SHARED_DATA / name).resolve()
        assert all((SHARED_DATA / name / file.path).is_file() for file in entry.files)
