"""The wheels a lent GPU machine lacks for bench/gpu_ray.sh (and the Liger rows of gpu_session.sh), in .wheels/.

    python bench/gpu_wheels.py                                  # for the GPU machine: CPython 3.12, x86-64
    python bench/gpu_wheels.py --python 3.11 --dest /tmp/w311   # the same set for this machine's Python (tests)

The GPU machine has torch, transformers and their usual company (numpy, pyarrow, pyyaml, msgpack, click,
filelock, packaging, protobuf, requests, attrs, aiohttp, ...) but reaches no package registry, and has neither
Ray nor tensordict. What it lacks comes with the work tree, which may carry 64 MiB in all, so the wheels must
stay under MAX_MIB. Ray 2.60.0's wheel is 79 MiB: it is repacked here without what a Tandem run never loads
(DROPPED: the Java jar, the dashboard's web client, the libraries rllib, tune, serve, data, train, llm, air,
workflow), a valid wheel still (its RECORD lists what is left, with the hashes checked), which
`pip install --no-index --no-deps --target DIR` installs as any other. The versions are constraints-cuda.txt's.
The full downloads are kept in --cache, so a second run downloads nothing.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_MIB = 52.0
# the distributions to carry: Ray and what it requires beyond the machine's packages (jsonschema's family, with
# attrs and typing-extensions, which torch's machine has but referencing needs: without typing-extensions on
# Python < 3.13 importing it fails), tensordict and its own (pyvers, cloudpickle), Liger (gpu_session.sh).
# bench/gpu_ray.sh installs only those the machine lacks.
WANTED = [
    "ray",
    "jsonschema",
    "jsonschema-specifications",
    "referencing",
    "rpds-py",
    "attrs",
    "typing-extensions",
    "tensordict",
    "pyvers",
    "cloudpickle",
    "liger-kernel",
]
PINS = {"liger-kernel": "0.8.5"}  # not in constraints-cuda.txt (no extra of Tandem requires it)
PLATFORMS = [
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
]
# what the slimmed Ray wheel leaves out: prefixes of paths in the wheel
DROPPED = (
    "ray/jars/",
    "ray/dashboard/client/",
    *(f"ray/{library}/" for library in ("rllib", "tune", "serve", "data", "train", "llm", "air", "workflow")),
)
# what a local Ray needs to start and run tasks (ray.init, the GCS, the raylet, workers, the dashboard
# agent and runtime-env agent that the raylet starts even without a dashboard, GPU detection): must stay
REQUIRED = (
    "ray/__init__.py",
    "ray/_raylet.so",
    "ray/core/src/ray/gcs/gcs_server",
    "ray/core/src/ray/raylet/raylet",
    "ray/core/libjemalloc.so",
    "ray/_private/worker.py",
    "ray/_private/node.py",
    "ray/_private/services.py",
    "ray/_private/workers/default_worker.py",
    "ray/_private/log_monitor.py",
    "ray/_private/runtime_env/agent/main.py",
    "ray/_private/thirdparty/pynvml/__init__.py",
    "ray/_private/accelerators/nvidia_gpu.py",
    "ray/autoscaler/_private/monitor.py",
    "ray/dashboard/agent.py",
    "ray/dashboard/consts.py",
    "ray/util/placement_group.py",
    "ray/util/scheduling_strategies.py",
)
EXECUTABLES = ("ray/core/src/ray/gcs/gcs_server", "ray/core/src/ray/raylet/raylet")


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins() -> dict[str, str]:
    """{normalised name: version} of constraints-cuda.txt's `name==version` lines, with PINS over them."""
    found = {}
    for line in (ROOT / "constraints-cuda.txt").read_text().splitlines():
        if "==" in line and not line.lstrip().startswith("#"):
            name, version = line.split("==", 1)
            found[normalise(name.strip())] = version.strip()
    return {**found, **PINS}


def download(name: str, version: str, python: str, cache: Path) -> Path:
    """The wheel of name==version for CPython `python` on x86-64 Linux, from the cache or pip."""
    cache.mkdir(parents=True, exist_ok=True)
    tag = "cp" + python.replace(".", "")

    def cached() -> list[Path]:
        return [
            w
            for w in cache.glob("*.whl")
            if normalise(w.name.split("-")[0]) == normalise(name)
            and w.name.split("-")[1] == version
            and any(part in w.name for part in ("-none-", f"-{tag}-", "-abi3-"))
        ]

    if not cached():
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
        command += ["--python-version", python, "--implementation", "cp", "-d", str(cache)]
        command += [arg for platform in [*PLATFORMS, "any"] for arg in ("--platform", platform)]
        subprocess.run([*command, f"{name}=={version}"], check=True)
    wheels = cached()
    if len(wheels) != 1:
        raise SystemExit(f"expected one wheel of {name}=={version} for {tag} in {cache}, found {wheels}")
    return wheels[0]


def record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def wheel_record(names: list[str] | set[str]) -> str:
    """The wheel's own RECORD (<name>-<version>.dist-info/RECORD; Ray also holds vendored packages' ones)."""
    return next(n for n in names if n.count("/") == 1 and n.endswith(".dist-info/RECORD"))


def slim_ray(source: Path, dest: Path) -> tuple[int, int]:
    """Repack Ray's wheel `source` as `dest` (same file name) without DROPPED; (files kept, files dropped)."""
    kept, dropped = 0, 0
    with zipfile.ZipFile(source) as zin:
        names = zin.namelist()
        record_name = wheel_record(names)
        entry_points = record_name.replace("/RECORD", "/entry_points.txt")
        records = []
        with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zout:
            for info in zin.infolist():
                if info.filename.startswith(DROPPED):
                    dropped += 1
                    continue
                if info.filename == record_name:
                    continue
                data = zin.read(info)
                if (
                    info.filename == entry_points
                ):  # the `serve` and `tune` commands are gone with their libraries
                    text = data.decode()
                    lines = [line for line in text.splitlines() if not line.startswith(("serve ", "tune "))]
                    data = ("\n".join(lines) + "\n").encode()
                zout.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
                if not info.is_dir():
                    records.append(f"{info.filename},{record_hash(data)},{len(data)}")
                kept += 1
            # RECORD last, as wheel builders write it
            record = zipfile.ZipInfo(record_name, date_time=zin.getinfo(record_name).date_time)
            record.external_attr = zin.getinfo(record_name).external_attr
            zout.writestr(record, "\n".join([*records, f"{record_name},,"]) + "\n", zipfile.ZIP_DEFLATED, 9)
    return kept, dropped


def check_wheel(path: Path) -> None:
    """A readable zip whose RECORD lists every file with its right hash and size (what pip's installer and
    `wheel`'s checks read); Ray's: REQUIRED present, its two servers executable."""
    with zipfile.ZipFile(path) as z:
        bad = z.testzip()
        if bad is not None:
            raise SystemExit(f"{path.name}: {bad} is damaged")
        names = {info.filename for info in z.infolist() if not info.is_dir()}
        record_name = wheel_record(names)
        listed = {}
        for line in z.read(record_name).decode().splitlines():
            if line.strip():
                file, digest, size = line.rsplit(",", 2)
                listed[file] = (digest, size)
        if set(listed) != names:
            raise SystemExit(
                f"{path.name}: RECORD and the files differ: not listed {sorted(names - set(listed))[:5]}, "
                f"listed but absent {sorted(set(listed) - names)[:5]}"
            )
        for file, (digest, size) in listed.items():
            if file == record_name:
                continue
            data = z.read(file)
            if digest != record_hash(data) or int(size) != len(data):
                raise SystemExit(f"{path.name}: {file} does not match its RECORD line")
        if path.name.startswith("ray-"):
            missing = [file for file in REQUIRED if file not in names]
            if missing:
                raise SystemExit(f"{path.name}: the slimmed wheel lacks {missing}")
            for file in EXECUTABLES:
                if not (z.getinfo(file).external_attr >> 16) & 0o111:
                    raise SystemExit(f"{path.name}: {file} lost its executable bit")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default="3.12", help="the CPython version the wheels are for")
    parser.add_argument("--dest", type=Path, default=ROOT / ".wheels", help="where the wheels go")
    parser.add_argument(
        "--cache", type=Path, default=Path.home() / ".cache" / "tandem-gpu-wheels", help="the full downloads"
    )
    args = parser.parse_args()
    versions = pins()
    args.dest.mkdir(parents=True, exist_ok=True)
    wanted = {normalise(name) for name in WANTED}
    for old in args.dest.glob("*.whl"):  # an earlier version of one of ours; others' wheels stay
        if normalise(old.name.split("-")[0]) in wanted:
            old.unlink()
    for name in WANTED:
        wheel = download(name, versions[normalise(name)], args.python, args.cache / f"cp{args.python}")
        target = args.dest / wheel.name
        if name == "ray":
            kept, dropped = slim_ray(wheel, target)
            print(f"{wheel.name}: {dropped} files dropped, {kept} kept", flush=True)
        else:
            shutil.copy(wheel, target)
        check_wheel(target)
    total = 0
    for wheel in sorted(args.dest.iterdir()):
        size = wheel.stat().st_size
        total += size
        mark = "" if normalise(wheel.name.split("-")[0]) in wanted else "   (not this script's; carried too)"
        print(f"{size / 2**20:8.2f} MiB  {wheel.name}{mark}")
    print(f"{total / 2**20:8.2f} MiB  in all, in {args.dest} (at most {MAX_MIB:g})")
    if total > MAX_MIB * 2**20:
        raise SystemExit(f"{args.dest} holds {total / 2**20:.1f} MiB, over {MAX_MIB:g} MiB: it cannot travel")


if __name__ == "__main__":
    main()
