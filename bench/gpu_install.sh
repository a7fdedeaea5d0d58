# Sourced by bench/gpu_ray.sh and bench/gpu_session.sh on a lent GPU machine: installs into $SITE the wheels of
# $WHEELS (made here by `python bench/gpu_wheels.py`) whose distributions $PYTHON lacks, so that the machine's
# own packages (torch, transformers, attrs, ...) stay in charge. Sets nothing else; the caller puts $SITE on
# PYTHONPATH.
PYTHON=${PYTHON:-python3}
SITE=${SITE:-/tmp/site}
WHEELS=${WHEELS:-.wheels}
# install only the wheels whose distributions this Python lacks: the machine's own packages stay in charge
rm -rf "$SITE"
mapfile -t missing < <(env -u PYTHONPATH "$PYTHON" - "$WHEELS" << 'EOF'
import importlib.metadata as md
import pathlib
import sys

for wheel in sorted(pathlib.Path(sys.argv[1]).glob("*.whl")):
    name = wheel.name.split("-")[0]
    try:
        print(f"the machine has {name} {md.version(name)}: {wheel.name} not installed", file=sys.stderr)
    except md.PackageNotFoundError:
        print(wheel)
EOF
)
if ((${#missing[@]})); then
    if [[ ${INSTALLER:-pip} == pip ]] && "$PYTHON" -m pip --version > /dev/null 2>&1; then
        "$PYTHON" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile --target "$SITE" \
            "${missing[@]}" || { echo "gpu_ray.sh: pip could not install ${missing[*]} into $SITE"; return 1; }
    else  # no pip here (or INSTALLER=unzip): a wheel without a .data folder installs by unzipping it
        echo "gpu_ray.sh: unzipping the wheels into $SITE (no pip)"
        "$PYTHON" - "$SITE" "${missing[@]}" << 'EOF' || return 1
import os
import sys
import zipfile

for wheel in sys.argv[2:]:
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            path = z.extract(info, sys.argv[1])
            if (info.external_attr >> 16) & 0o111:  # Ray's gcs_server and raylet
                os.chmod(path, 0o755)
EOF
    fi
fi
