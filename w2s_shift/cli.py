"""Command line: ``w2s-shift run [CONFIG]``, ``w2s-shift data list``, ``w2s-shift report RUN_DIR``."""

from __future__ import annotations

import argparse
import sys


def _cmd_run(a) -> int:
    from .config import load_config
    from .pipeline import run

    overrides = list(a.set or [])
    if a.output_dir:
        overrides.append(f"output_dir={a.output_dir}")
    if a.skip_invalid:
        overrides.append("data.skip_invalid=true")
    cfg = load_config(a.config, overrides)
    run(cfg, overwrite=a.overwrite)
    return 0


def _cmd_data_list(a) -> int:
    from .data.adapters import DATASETS

    print(f"{'name':30} {'category':9} {'where':9} {'license':32} origin")
    for s in DATASETS.values():
        where = "bundled" if s.bundled else ("shared" if s.files else "hub")
        print(f"{s.name:30} {s.category:9} {where:9} {s.license:32} {s.origin}")
    return 0


def _cmd_report(a) -> int:
    from pathlib import Path

    from .io import read_json
    from .report import write_report

    print(write_report(Path(a.run_dir), read_json(Path(a.run_dir) / "metrics.json")))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="w2s-shift", description="Weak-to-strong reward models under preference shift.")
    sub = p.add_subparsers(dest="cmd")
    r = sub.add_parser("run", help="run the protocol (default: the offline Helpful quickstart)")
    r.add_argument("config", nargs="?", default=None, help="YAML config file or preset name (default: quickstart)")
    r.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config field, e.g. student.epochs=2")
    r.add_argument("--output-dir", help="run directory (overrides output_dir)")
    r.add_argument("--skip-invalid", action="store_true", help="skip and count invalid data rows instead of stopping")
    r.add_argument("--overwrite", action="store_true", help="reuse an output dir that holds a run of another config")
    r.set_defaults(func=_cmd_run)
    d = sub.add_parser("data", help="datasets")
    dsub = d.add_subparsers(dest="data_cmd")
    dl = dsub.add_parser("list", help="list supported datasets")
    dl.set_defaults(func=_cmd_data_list)
    rp = sub.add_parser("report", help="rewrite report.md of a finished run and print its table")
    rp.add_argument("run_dir")
    rp.set_defaults(func=_cmd_report)
    return p


def main(argv=None) -> int:
    from .config import ConfigError
    from .data.schema import DataError
    from .models.loading import ModelError
    from .pipeline import RunDirError
    from .train import TrainingDiverged

    args = build_parser().parse_args(argv)
    if not hasattr(args, "func"):
        if args.cmd is None:  # `w2s-shift` alone: show help
            build_parser().print_help()
            return 0
        build_parser().parse_args([args.cmd, "--help"])
    try:
        return args.func(args)
    except (ConfigError, DataError, ModelError, RunDirError, TrainingDiverged, ValueError) as e:
        print(f"w2s-shift: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("w2s-shift: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
