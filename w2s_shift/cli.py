"""Command line: ``w2s-shift run [CONFIG]``, ``w2s-shift data list``, ``w2s-shift data inspect NAME_OR_FILE``,
``w2s-shift report RUN_DIR``, ``w2s-shift evaluate RUN_DIR NAME_OR_FILE...``, ``w2s-shift export RUN_DIR LABEL...``,
``w2s-shift compare RUN_DIR...``,
``w2s-shift score MODEL NAME_OR_FILE``, ``w2s-shift select``, ``w2s-shift plan``, ``w2s-shift bon``: the parser and
:func:`main`, which maps bad input to exit 2; what each command does is in :mod:`w2s_shift.commands`. Every
NAME_OR_FILE is resolved by one rule, :func:`w2s_shift.data.resolve.dataset_ref_for`."""

from __future__ import annotations

import argparse
import sys

from . import commands


def _add_wait(parser) -> None:
    parser.add_argument(
        "--wait",
        action="store_true",
        help="if another command is writing to the run directory, wait for it to finish instead of refusing",
    )


def build_parser() -> argparse.ArgumentParser:
    """The ``w2s-shift`` parser: each subcommand's arguments, and its function of :mod:`w2s_shift.commands` (or of
    :mod:`w2s_shift.score` and :mod:`w2s_shift.plan.command`) as ``func``."""
    from .plan.command import add_plan_parser
    from .score import add_score_parser

    p = argparse.ArgumentParser(prog="w2s-shift", description="Weak-to-strong reward models under preference shift.")
    sub = p.add_subparsers(dest="cmd")
    _add_run(sub)
    _add_data(sub)
    _add_run_dir_commands(sub)
    _add_select(sub)
    add_score_parser(sub)  # `w2s-shift score MODEL NAME_OR_FILE`
    add_plan_parser(sub)  # `w2s-shift plan CONFIG_OR_MODEL`: GPU memory per device, per backend and GPU count
    return p


def _add_run(sub) -> None:
    """``run [CONFIG]``: the grid, a dry run, or seeds added until the claims decide."""
    r = sub.add_parser("run", help="run the protocol (default: the offline Helpful quickstart)")
    r.add_argument("config", nargs="?", default=None, help="YAML config file or preset name (default: quickstart)")
    r.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config field, e.g. student.epochs=2")
    r.add_argument("--output-dir", help="run directory (overrides output_dir)")
    r.add_argument("--skip-invalid", action="store_true", help="skip and count invalid data rows instead of stopping")
    r.add_argument("--overwrite", action="store_true", help="reuse an output dir that holds a run of another config")
    r.add_argument(
        "--wait",
        action="store_true",
        help="if another run is writing to the output dir, wait for it to finish instead of refusing",
    )
    r.add_argument(
        "--dry-run", action="store_true", help="validate the config offline and print the grid; train nothing"
    )
    r.add_argument("--until-decided", action="store_true", help="add seeds until the claims decide (docs/protocol.md)")
    r.add_argument("--max-seeds", type=int, metavar="N", help="the most seeds --until-decided may reach (2 to 100)")
    r.set_defaults(func=commands.cmd_run)


def _add_data(sub) -> None:
    """``data list`` and ``data inspect NAME_OR_FILE``."""
    from .data.registry import format_names

    d = sub.add_parser("data", help="datasets")
    dsub = d.add_subparsers(dest="data_cmd")
    dl = dsub.add_parser("list", help="list supported datasets")
    dl.set_defaults(func=commands.cmd_data_list)
    di = dsub.add_parser("inspect", help="counts, lengths, length bias, duplicates and overlap of a dataset")
    di.add_argument(
        "dataset", metavar="NAME_OR_FILE", help="a name from `w2s-shift data list`, a data file, or hf:<hub id>"
    )
    di.add_argument(
        "--tokenizer",
        metavar="MODEL",
        help="measure token lengths with this model's tokenizer (local folder, .gguf, preset or hub id)",
    )
    di.add_argument(
        "--max-length", type=int, metavar="N", help="count pairs truncated at N tokens per sequence (needs --tokenizer)"
    )
    di.add_argument(
        "--overlap-with",
        action="append",
        metavar="NAME_OR_FILE",
        help="report prompts shared with this dataset (repeatable)",
    )
    di.add_argument(
        "--format",
        default=None,
        help=f"row format of a file ({', '.join(format_names())}; default prompt_chosen_rejected; "
        "`w2s-shift data list` says what each reads)",
    )
    di.add_argument(
        "--columns",
        nargs="+",
        metavar="FIELD=COLUMN",
        help="the file's column for each of prompt, chosen, rejected, id (a config entry's columns:), e.g. "
        "--columns prompt=question chosen=good rejected=bad",
    )
    di.add_argument(
        "--skip-invalid", action="store_true", help="skip and count invalid rows instead of stopping at the first"
    )
    di.add_argument("--json", action="store_true", help="print the result as JSON")
    di.set_defaults(func=commands.cmd_data_inspect)


def _add_run_dir_commands(sub) -> None:
    """The commands that read or add to a finished run directory: report, evaluate, bon, export, compare."""
    from .data.registry import format_names

    rp = sub.add_parser(
        "report", help="rewrite report.md, report.html and plots/ of a finished run and print its tables"
    )
    rp.add_argument("run_dir")
    _add_wait(rp)
    rp.set_defaults(func=commands.cmd_report)
    sn = sub.add_parser(
        "snapshot",
        help="read a run still going through its finished seeds: copy them to OUT_DIR and build its metrics and "
        "report there from their stages (the run is only read and goes on)",
    )
    sn.add_argument("run_dir", metavar="RUN_DIR", help="a run directory whose run has not finished")
    sn.add_argument("out_dir", metavar="OUT_DIR", help="a new folder for the snapshot (outside RUN_DIR)")
    sn.set_defaults(func=commands.cmd_snapshot)
    ev = sub.add_parser(
        "evaluate",
        help="score every model of a finished run on new OOD sets and add them to its metrics and report (no "
        "training): side targets, beside the headline, unless --headline",
    )
    ev.add_argument("run_dir", metavar="RUN_DIR", help="a finished run directory (run.json, config.yaml, metrics.json)")
    ev.add_argument(
        "targets",
        nargs="*",
        metavar="NAME_OR_FILE",
        help="a name from `w2s-shift data list`, a pair file, or hf:<hub id>",
    )
    ev.add_argument(
        "--format",
        default=None,
        help=f"row format of the pair files ({', '.join(format_names())}; default prompt_chosen_rejected)",
    )
    ev.add_argument(
        "--n-pairs",
        default="all",
        metavar="N|all",
        help="pairs scored per target (a subsample with the run's data.seed); default all of them",
    )
    ev.add_argument(
        "--skip-invalid",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="skip and count invalid rows of the targets instead of stopping at the first (default: the run's "
        "data.skip_invalid)",
    )
    ev.add_argument(
        "--headline",
        action="store_true",
        help="add the sets as headline OOD targets (in AOG mean, NTS and the claims) instead of side targets "
        "(reported beside, never moving the headline)",
    )
    ev.add_argument(
        "--remove",
        nargs="+",
        default=None,
        metavar="NAME",
        help="take sets an earlier evaluate added out of the metrics and report (their rewards files stay)",
    )
    _add_wait(ev)
    ev.set_defaults(func=commands.cmd_evaluate)
    bo = sub.add_parser(
        "bon",
        help="best-of-n against a gold judge for every model of a finished run: N responses per prompt from a "
        "policy (or files), the gold reward of each model's pick against KL (evaluation only)",
    )
    bo.add_argument("run_dir", metavar="RUN_DIR", help="a finished run directory")
    bo.add_argument("--set", action="append", metavar="KEY=VALUE", help="a field of the bon section, e.g. n_prompts=20")
    bo.add_argument("--gold", default=None, help="gold judge: a reward model folder or hub id (default: synthetic)")
    bo.add_argument(
        "--responses",
        action="append",
        metavar="NAME=FILE",
        help="a prompt set's candidates made elsewhere ({prompt, responses: [...]} rows); repeatable",
    )
    _add_wait(bo)
    bo.set_defaults(func=commands.cmd_bon)
    ex = sub.add_parser(
        "export",
        help="save trained students of a finished run as Hugging Face reward models from their saved weights (no "
        "training, scoring or report rebuilt)",
    )
    ex.add_argument("run_dir", metavar="RUN_DIR", help="a finished run directory")
    ex.add_argument("labels", nargs="+", metavar="LABEL", help="student labels (the report lists them) or all")
    ex.add_argument("--source", nargs="+", default=None, help="only these sources' cells (default every source)")
    ex.add_argument("--seed", nargs="+", type=int, default=None, help="only these seeds (default every seed)")
    ex.add_argument("--dry-run", action="store_true", help="list the folders it would write; write nothing")
    _add_wait(ex)
    ex.set_defaults(func=commands.cmd_export)
    cp = sub.add_parser(
        "compare", help="one Markdown table comparing finished runs side by side (ID acc, OOD acc, NTS)"
    )
    cp.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    cp.set_defaults(func=commands.cmd_compare)


def _add_select(sub) -> None:
    """``select`` (the student's lr and epochs) and ``select-method`` (one setting of a W2S method), each on gold
    validation pairs from the student-train pool."""
    se = sub.add_parser(
        "select",
        help="choose the student's lr and epochs on gold validation pairs from the student-train pool (the ceiling "
        "trained at each setting; never the test split)",
    )
    se.add_argument("config", help="YAML config file or preset name")
    se.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config field")
    se.add_argument(
        "--learning-rates", type=float, nargs="+", required=True, metavar="LR", help="student learning rates to try"
    )
    se.add_argument("--epochs", type=float, nargs="+", required=True, metavar="N", help="numbers of epochs to try")
    se.add_argument("--val-pairs", type=int, default=250, metavar="N", help="gold validation pairs (default 250)")
    se.add_argument("--out", default=None, help="output folder (default <output_dir>-select)")
    se.set_defaults(func=commands.cmd_select)
    sm = sub.add_parser(
        "select-method",
        help="choose one setting of a W2S method (e.g. l2sp_lambda) on gold validation pairs from the student-train "
        "pool (the method trained on the teacher's labels at each value; never the test split)",
    )
    sm.add_argument("config", help="YAML config file or preset name")
    sm.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config field")
    sm.add_argument("--method", required=True, help="a registered W2S method, e.g. l2sp, wise_ft, grm")
    sm.add_argument("--field", required=True, help="its setting to choose, e.g. l2sp_lambda")
    sm.add_argument("--values", nargs="+", required=True, metavar="V", help="values to try (YAML scalars)")
    sm.add_argument("--val-pairs", type=int, default=250, metavar="N", help="gold validation pairs (default 250)")
    sm.add_argument("--out", default=None, help="output folder (default <output_dir>-select-<method>)")
    sm.set_defaults(func=commands.cmd_select_method)


def main(argv=None) -> int:
    """Entry point. Exit codes: 0 done, 2 bad input (config, data, model, run dir, usage), 1 an unexpected
    error (its type and message; set W2S_SHIFT_DEBUG=1 for the traceback), 130 interrupted. In a process of a
    launched multi-process run (a process group started) it does not return: it ends the process with that code
    (:func:`w2s_shift.distributed.end_process`)."""
    import os

    from .config import ConfigError
    from .data.schema import DataError
    from .models.loading import ModelError
    from .pipeline import RunDirError
    from .training import TrainingDiverged

    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        if args.cmd is None:  # `w2s-shift` alone: show help
            parser.print_help()
            return 0
        parser.parse_args([args.cmd, "--help"])  # prints that command's usage
        return 2
    from .progress import log_progress

    try:
        with log_progress():  # stderr not a terminal: one progress line per bar at most every 30 s
            code = args.func(args)
    except (ConfigError, DataError, ModelError, RunDirError, TrainingDiverged, ValueError) as e:
        print(f"w2s-shift: error: {e}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        print("w2s-shift: interrupted; rerun the same command to resume", file=sys.stderr)
        code = 130
    except OSError as e:
        print(f"w2s-shift: error: {e.strerror or e}{': ' + str(e.filename) if e.filename else ''}", file=sys.stderr)
        code = 2
    except Exception as e:  # a bug of ours: say what, without a library traceback unless asked
        if os.environ.get("W2S_SHIFT_DEBUG"):
            import torch.distributed as dist

            if not dist.is_initialized():
                raise
            import traceback

            traceback.print_exc()  # a launched process ends without the interpreter's report of an exception
            return _end_launched_process(1)
        print(
            f"w2s-shift: unexpected error ({type(e).__name__}): {e}\n"
            "  (please report it; W2S_SHIFT_DEBUG=1 shows the traceback)",
            file=sys.stderr,
        )
        code = 1
    return _end_launched_process(code)


def _end_launched_process(code: int) -> int:
    """``code`` in one process; in a process of a launched run, finish the open wandb run and end the process with
    ``code`` (:func:`w2s_shift.distributed.end_process`: no interpreter teardown, which gloo's threads can abort)."""
    from .distributed import end_process
    from .tracking import finish_wandb

    finish_wandb()
    return end_process(code)


if __name__ == "__main__":
    sys.exit(main())
