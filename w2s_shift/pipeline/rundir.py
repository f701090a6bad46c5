"""The run directory: atomic result writers, stage markers (a stage is done when its marker holds the digest of
what it depends on), the config check that refuses another config's directory, and the digests."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml
from transformers import TrainerCallback

from .. import __version__
from .. import io as _io
from ..config import RunConfig
from ..distributed import run_on_main
from ..io import read_json, read_jsonl
from ..results.errors import RunDirError
from ..runlock import hold_at
from ..versions import STAGE_FORMATS, versions_of


# Under several processes (accelerate launch) every result file is written once, by the main process; the
# others wait for it (run_on_main holds a barrier). In one process these are the plain atomic writers.
def write_json_on_main(path, obj):
    run_on_main(_io.write_json_atomic, path, obj)


def write_jsonl_on_main(path, rows):
    run_on_main(_io.write_jsonl_atomic, path, rows)


def write_text_on_main(path, text):
    run_on_main(_io.write_text_atomic, path, text)


@dataclass
class Stage:
    """A cached stage: done when ``stages/<name>.json`` exists with the same digest."""

    run_dir: Path
    name: str
    digest: str
    started: float = field(default_factory=time.time)

    @property
    def marker(self) -> Path:
        return self.run_dir / "stages" / f"{self.name}.json"

    def done(self) -> bool:
        """True when the marker has this digest and every output it lists is there and parses, each JSON-lines
        output with the rows and SHA-256 recorded (if any: a file cut at a line boundary parses, an edit keeps rows)."""
        try:
            info = read_json(self.marker)
            if not isinstance(info, dict) or info.get("digest") != self.digest:
                return False
            rows, sums = info.get("jsonl_rows") or {}, info.get("sha256") or {}
            for rel in info.get("outputs", []):  # a missing, truncated or edited output redoes the stage
                if rel in sums and _io.file_sha256(self.run_dir / rel) != sums[rel]:
                    return False
                if rel.endswith(".json"):
                    read_json(self.run_dir / rel)
                    continue
                n = len(read_jsonl(self.run_dir / rel))
                if rel in rows and n != rows[rel]:
                    return False
            return True
        except (OSError, ValueError):
            return False

    def finish(self, outputs: list, **info) -> None:
        """Write the marker last (on the main process), listing the stage's output files (relative to the run
        dir), the rows of each JSON-lines output and the SHA-256 of each but the logs (written by this stage alone,
        so :meth:`done` can tell a truncated or edited one)."""
        run_on_main(self._write_marker, [str(p) for p in outputs], info)

    def _write_marker(self, outputs: list, info: dict) -> None:
        results = [r for r in outputs if r.endswith(".jsonl") and not r.startswith("logs/")]  # logs hold wall times
        _io.write_json_atomic(
            self.marker,
            {
                "digest": self.digest,
                "seconds": round(time.time() - self.started, 2),
                "outputs": outputs,
                "jsonl_rows": {rel: len(read_jsonl(self.run_dir / rel)) for rel in outputs if rel.endswith(".jsonl")},
                "sha256": {r: _io.file_sha256(self.run_dir / r) for r in results},
                "versions": versions_of(self.name),
                **info,
            },
        )


def refuse_cell_dir(out: Path) -> None:
    """Refuse a cell directory (``<source>/seed<k>``) of another run as a run directory, even with ``--overwrite``:
    a run inside a cell would mix two runs' files.

    Raises:
        RunDirError: naming the cell and its run directory."""
    out = Path(out)
    if (out / "stages").is_dir() and not (out / "run.json").is_file() and (out.parent.parent / "run.json").is_file():
        raise RunDirError(
            f"{out} is a cell directory (<source>/seed<k>) of the run in {out.parent.parent}; give that run "
            "directory, or an output_dir outside it"
        )


def refuse_file_as_run_dir(out: Path) -> None:
    """Refuse a run directory that is a file, or lies under one (mkdir would say only "File exists").

    Raises:
        RunDirError: naming the file."""
    out = Path(out)
    for p in (out, *out.parents):
        if p.exists() or p.is_symlink():
            if not p.is_dir():
                raise RunDirError(
                    f"{out}: cannot write to the run directory: {p} is a file, not a directory; give another output_dir"
                )
            return


def refuse_links_out_of(out: Path) -> None:
    """Refuse a symbolic link inside the run directory whose target lies outside it (``seed0/logs -> /elsewhere``):
    a rerun would write its results there. Links within the run directory are kept.

    Raises:
        RunDirError: naming the first such link and its target."""
    out = Path(out)
    root = out.resolve()
    for here, dirs, files in os.walk(out):  # never descends into linked folders: each link is looked at once
        for name in sorted(dirs + files):
            p = Path(here) / name
            if p.is_symlink():
                try:
                    target = p.resolve()
                except (OSError, RuntimeError):  # a loop of links
                    raise RunDirError(f"{p}: a symbolic link that does not resolve (a loop); remove it") from None
                if target != root and root not in target.parents:
                    raise RunDirError(
                        f"{p}: a symbolic link to {target}, outside the run directory {out}; the run would write "
                        "there: remove the link (or put a copy of what it points to in its place)"
                    )


def prepare_run_dir(cfg: RunConfig, overwrite: bool) -> Path:
    """Create/check the run directory: refuse one that belongs to a different config unless ``overwrite``.

    Raises:
        RunDirError: a file, not writable, a symbolic link in it to outside it, too little free disk space, or
            without overwrite: a different config's run,
            or results (config.yaml, metrics.json, report.md, a <source>/seed<k> cell) with no run.json; a cell
            directory of another run (even with overwrite).
    """
    out = Path(cfg.output_dir)
    refuse_file_as_run_dir(out)
    refuse_cell_dir(out)
    refuse_links_out_of(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write-test-{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise RunDirError(f"{out}: cannot write to the run directory: {e}") from None
    free = shutil.disk_usage(out).free
    if free < cfg.min_free_disk_mb * 2**20:
        raise RunDirError(
            f"{out}: only {free / 2**20:.0f} MiB free on its disk; the run needs at least "
            f"{cfg.min_free_disk_mb} MiB (min_free_disk_mb) for checkpoints and results"
        )
    digest = cfg.digest()
    marker = out / "run.json"
    if marker.exists():
        try:
            was = read_json(marker)
            old = was["config_digest"]
        except (OSError, ValueError, KeyError, TypeError):
            raise RunDirError(f"{marker}: not a w2s-shift run marker; use another output_dir or --overwrite") from None
        if old != digest and isinstance(was, dict) and was.get("training_digest") == training_digest(cfg):
            log(
                f"{out}: the config differs from the run's only in what is evaluated (OOD targets, n_ood, overlap "
                "removal, bootstrap, drift_pairs): every training stage is kept, only new scoring stages run"
            )
            old = digest
        stale = [] if overwrite else stale_stages(out)
        if (old != digest or stale) and not overwrite:
            why = (
                [f"holds a run of a different config (digest {old}, now {digest}{_changes_text(out, cfg)})"]
                if (old != digest)
                else []
            )
            if stale:  # code versions: say what an upgrade would recompute
                why.append(
                    f"was written by w2s-shift {was.get('w2s_shift_version', '?')} (stage formats "
                    f"{was.get('stage_formats', 'not recorded')}; this is {__version__} with {STAGE_FORMATS}): "
                    f"{len(stale)} finished stage(s) computed by other code would be recomputed: {', '.join(stale)}"
                )
            raise RunDirError(
                f"{out} " + "; it ".join(why) + "; use another output_dir or --overwrite (finished "
                "stages whose inputs and code are unchanged are kept)"
            )
    elif not overwrite:  # results without the run.json that says whose they are: never replace them silently
        found = [n for n in ("config.yaml", "metrics.json", "report.md") if (out / n).exists()]
        found += sorted(str(p.relative_to(out)) for p in out.glob("*/seed*") if p.is_dir())
        if found:
            raise RunDirError(
                f"{out} holds results ({', '.join(found[:4])}{', ...' if len(found) > 4 else ''}) but no "
                "run.json saying which config made them; use another output_dir or --overwrite"
            )
    return out


#: Config fields outside every digest (RunConfig.digest), never named as a change.
_UNDIGESTED = {
    "output_dir",
    "threads",
    "export",
    "report_to",
    "device",
    "min_free_disk_mb",
    "teacher.threads",
    "student.threads",
}


def changed_fields(old, new, prefix: str = "") -> list:
    """Dotted names of the fields whose values differ between two config dicts (``model_dump(mode="json")``); a
    list (methods, data.ood) is one field. Fields outside the digest (output_dir, threads, ...) are left out."""
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new) and old != new:
        if all(isinstance(x, dict) for x in [*old, *new]):  # same entries, other settings: methods.1.anchor_lambda
            return [k for i, (a, b) in enumerate(zip(old, new)) for k in changed_fields(a, b, f"{prefix}.{i}")]
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return [] if old == new or prefix in _UNDIGESTED else [prefix]
    out = []
    for k in [*old, *(k for k in new if k not in old)]:
        key = f"{prefix}.{k}" if prefix else str(k)
        if key not in _UNDIGESTED:
            out += changed_fields(old.get(k), new.get(k), key)
    return out


def _changes_text(out: Path, cfg: RunConfig) -> str:
    """'; changed: student.epochs 1.0 -> 2.0, ...' from the run's config.yaml to ``cfg`` ('' when the file cannot
    be read); when only evaluation settings changed, why they still change what is trained (the drift probe)."""
    try:
        old = yaml.safe_load((out / "config.yaml").read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return ""
    if not isinstance(old, dict):
        return ""
    new = cfg.model_dump(mode="json")
    keys = changed_fields(old, new)
    if not keys:
        return ""

    def val(d, key):
        for k in key.split("."):
            d = (
                d[int(k)]
                if isinstance(d, list) and k.isdigit() and int(k) < len(d)
                else (d.get(k) if isinstance(d, dict) else None)
            )
        if isinstance(d, list) and all(isinstance(x, dict) for x in d):  # methods, datasets: by name
            d = [x.get("label") or x.get("name") or x.get("path") or x.get("hf") for x in d]
        t = json.dumps(d, default=str)
        return t if len(t) <= 60 else t[:57] + "..."

    text = "; changed: " + ", ".join(f"{k} {val(old, k)} -> {val(new, k)}" for k in keys[:6])
    text += f", and {len(keys) - 6} more" if len(keys) > 6 else ""
    eval_only = {*(f"data.{k}" for k in EVAL_DATA_FIELDS), "bootstrap", "drift_pairs", "mechanism"}  # evaluation
    if set(keys) <= eval_only and cfg.drift and cfg.drift_interval:
        text += (
            f"; these are evaluation settings, but with drift_interval {cfg.drift_interval} > 0 the first OOD target "
            "of each source (its pairs after data.n_ood and data.remove_ood_overlap) probes drift during training, "
            "so the students would train anew; keep that target first and its settings, or set drift_interval: 0"
        )
    return text


def stale_stages(out: Path) -> list:
    """Finished stages of the run directory ``out`` (``<source>/seed<k>/stages/<name>.json``) whose recorded code
    versions differ from this code's (:func:`w2s_shift.versions.versions_of`; a marker without them was written
    before versions were recorded): these would be recomputed. Returns ``<source>/seed<k>/<stage>`` names, sorted."""
    stale = []
    for m in sorted(Path(out).glob("*/*/stages/*.json")):
        try:
            info = read_json(m)
            versions = versions_of(m.stem)
        except (OSError, ValueError):
            continue
        if not isinstance(info, dict) or info.get("versions") != versions:
            stale.append(f"{m.parent.parent.relative_to(out).as_posix()}/{m.stem}")
    return stale


def claim_run_dir(cfg: RunConfig, out: Path) -> None:
    """Record the config in the run directory (after the inputs were checked, so a failed start claims nothing)."""
    write_text_on_main(out / "config.yaml", yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    from ..models.precision import environment

    write_json_on_main(
        out / "run.json",
        {
            "config_digest": cfg.digest(),
            "training_digest": training_digest(cfg),
            "w2s_shift_version": __version__,
            "stage_formats": dict(STAGE_FORMATS),
            "environment": environment(cfg, DEFAULT_THREADS),
        },
    )
    record_inputs(out, cfg)


def log(msg: str) -> None:
    from ..distributed import is_main_process

    if is_main_process():
        print(f"[w2s-shift] {msg}", flush=True)


def fault(point: str) -> None:
    """Fault injection for the kill-and-resume tests: ``W2S_SHIFT_FAULT=<point>`` SIGKILLs this process at that
    point (e.g. ``teacher:labels``, ``student-naive:eval``; training steps via :class:`FaultCallback`);
    ``W2S_SHIFT_HOLD=<point>`` holds it there for the concurrency tests (:func:`w2s_shift.runlock.hold_at`)."""
    if os.environ.get("W2S_SHIFT_FAULT") == point:
        os.kill(os.getpid(), signal.SIGKILL)
    hold_at(point)


class FaultCallback(TrainerCallback):
    def __init__(self, stage: str):
        self.stage = stage

    def on_step_end(self, args, state, control, **kwargs):
        fault(f"{self.stage}:step{state.global_step}")


#: Data settings that shape only the OOD evaluation sets, not the source's splits: not part of a training digest.
EVAL_DATA_FIELDS = ("ood", "n_ood", "remove_ood_overlap")


def source_digest(cfg: RunConfig, src) -> dict:
    """What a source's training data depends on: the data settings that shape its splits, and the source with the
    content of its file(s) (:func:`data_content`). The OOD targets are evaluation sets with scoring stages of their
    own (:func:`eval_set_digest`), so adding one to a config trains nothing again."""
    d = cfg.data.model_dump(mode="json", exclude={"sources", *EVAL_DATA_FIELDS})
    return {**d, "source": src.model_dump(mode="json"), "source_content": data_content(src)}


def eval_set_digest(cfg: RunConfig, src, ref) -> str:
    """Identity of one OOD evaluation set of the grid row ``src``: the target, the settings that pick its pairs
    (data.n_ood, data.seed, data.skip_invalid) and the overlap removal, which reads the source's prompts."""
    d = cfg.data
    return stage_digest(
        ref.model_dump(mode="json"),
        d.n_ood,
        d.seed,
        d.skip_invalid,
        d.remove_ood_overlap,
        src.model_dump(mode="json"),
        data_content(ref),
        data_content(src),
    )


def training_digest(cfg: RunConfig) -> str:
    """The config digest without what only evaluation reads (the OOD targets and their settings, bootstrap,
    drift_pairs, mechanism): two configs with the same training digest train the same models, so a run directory accepts
    the other one without ``--overwrite`` and only the new scoring stages run. With drift logged during training
    (``drift_interval`` > 0) the first OOD target of each source is a training input (its probe pairs,
    :func:`w2s_shift.pipeline.stages.drift_probe_sets`), so its identity counts here too."""
    d = cfg.data.model_copy(update=dict.fromkeys(EVAL_DATA_FIELDS))
    base = cfg.model_copy(update={"data": d, "bootstrap": 0, "drift_pairs": 0, "mechanism": True}).digest()
    if not (cfg.drift and cfg.drift_interval):
        return base
    probes = [eval_set_digest(cfg, s, cfg.data.ood_for(s)[0]) for s in cfg.data.sources if cfg.data.ood_for(s)]
    return stage_digest(base, probes)


# ---------------------------------------------------------------------------------------------------------------
# The content of what the stages read: data files and local model folders. A stage digest includes it, so a file
# changed in place (same path, other rows or weights) makes the stages that read it run again.

INPUTS_FILE = "inputs.json"


def data_content(ref) -> str | None:
    """sha256 of the file(s) a dataset reference reads (:func:`w2s_shift.data.resolve.dataset_files`); None for a
    hub dataset (its id, subset and split are its identity) or files that are not there (their load fails)."""
    from ..data.resolve import dataset_files

    try:
        files = dataset_files(ref)  # per file, so that each one's hash is cached in inputs.json
        return hashlib.sha256("".join(map(_io.file_sha256, files)).encode()).hexdigest() if files else None
    except OSError:
        return None


def model_files(name: str) -> list:
    """The files that make a model given by ``name``: every regular, non-hidden file at the top of a local folder
    (config, weights, tokenizer), sorted; a ``.gguf`` file itself; [] for a preset (pinned by its sha256 sums) or a
    hub id."""
    p = Path(os.path.expanduser(str(name)))
    if p.is_dir():
        return sorted(f for f in p.iterdir() if f.is_file() and not f.name.startswith("."))
    return [p] if p.is_file() else []


def model_content(name: str) -> str | None:
    """sha256 over a model's files (:func:`model_files`, each named), None when it has none to hash."""
    files = model_files(name)
    if not files:
        return None
    try:
        return hashlib.sha256("".join(f"{f.name}\0{_io.file_sha256(f)}\n" for f in files).encode()).hexdigest()
    except OSError:
        return None


def model_identity(mcfg) -> dict:
    """What a stage reading a model depends on: its config (threads aside) and the content of its files."""
    return {**mcfg.model_dump(mode="json", exclude={"threads"}), "content": model_content(mcfg.name)}


def input_contents(cfg: RunConfig) -> dict:
    """Every input of a run with content: ``{"data <name>" | "teacher" | "student": {"what", "sha256"}}``; inputs
    with nothing to hash (hub ids, presets) are left out."""
    out = {}
    for ref in [*cfg.data.sources, *cfg.data.ood]:
        sha = data_content(ref)
        if sha:
            out[f"data {ref.display}"] = {"what": ref.path or ref.name, "sha256": sha}
    for role in ("teacher", "student"):
        name = getattr(cfg, role).name
        sha = model_content(name)
        if sha:
            out[role] = {"what": name, "sha256": sha}
    return out


def load_input_cache(out: Path) -> dict:
    """Read ``out/inputs.json`` (written by :func:`record_inputs`): its files' hashes seed the cache of
    :func:`w2s_shift.io.file_sha256`, so a rerun does not read unchanged files again. Returns its recorded inputs
    ({} if none)."""
    try:
        info = read_json(Path(out) / INPUTS_FILE)
        _io.remember_sha256(info.get("files") or {})
        return dict(info.get("inputs") or {})
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def changed_inputs(out: Path, cfg: RunConfig) -> list:
    """Inputs whose content differs from what the run directory's last run read (same path or name, other bytes),
    each logged with the stages that run again because of it. Returns their keys (:func:`input_contents`)."""
    before = load_input_cache(out)
    now = input_contents(cfg)
    changed = [
        k
        for k, v in now.items()
        if k in before and before[k].get("what") == v["what"] and before[k].get("sha256") != v["sha256"]
    ]
    for k in changed:
        what = {"teacher": "the teacher and everything trained after it", "student": "every student"}.get(
            k, "the stages that read it"
        )
        log(
            f"{k} ({now[k]['what']}) changed since the last run in this directory (sha256 "
            f"{str(before[k].get('sha256'))[:12]} -> {now[k]['sha256'][:12]}): {what} run again"
        )
    return changed


def record_inputs(out: Path, cfg: RunConfig) -> None:
    """Write ``out/inputs.json``: the run's inputs with their sha256 (:func:`input_contents`) and, per file read,
    the size and modification time it had when hashed (the cache :func:`load_input_cache` reads back)."""
    from ..data.resolve import dataset_files

    paths = [f for r in [*cfg.data.sources, *cfg.data.ood] for f in dataset_files(r)]
    paths += model_files(cfg.teacher.name) + model_files(cfg.student.name)
    files = _io.sha256_records(paths)
    write_json_on_main(Path(out) / INPUTS_FILE, {"inputs": input_contents(cfg), "files": files})


def stage_digest(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


DEFAULT_THREADS = torch.get_num_threads()


def use_threads(mcfg, cfg: RunConfig) -> None:
    """torch CPU threads for one model's work: its own setting, else the run's, else torch's default."""
    torch.set_num_threads(mcfg.threads or cfg.threads or DEFAULT_THREADS)
