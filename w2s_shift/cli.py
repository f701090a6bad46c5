"""Command line: ``w2s-shift run [CONFIG]``, ``w2s-shift data list``, ``w2s-shift data inspect NAME_OR_FILE``,
``w2s-shift report RUN_DIR``, ``w2s-shift evaluate RUN_DIR NAME_OR_FILE...``, ``w2s-shift export RUN_DIR LABEL...``,
``w2s-shift compare RUN_DIR...``,
``w2s-shift score MODEL NAME_OR_FILE``. Every NAME_OR_FILE is resolved by one rule,
:func:`w2s_shift.data.resolve.dataset_ref_for`."""

from __future__ import annotations

import argparse
import sys


def _cmd_run(a) -> int:
    from .config_io import check_anchor_layers_offline, load_config
    from .pipeline import describe_grid, run
    from .pipeline.until_decided import check_flags, run_until_decided

    check_flags(a.until_decided, a.max_seeds, a.dry_run)  # --until-decided: seeds added until the claims decide
    overrides = list(a.set or [])
    if a.skip_invalid:
        overrides.append("data.skip_invalid=true")
    from .data.resolve import ref_of_error, with_skip_hint
    from .data.schema import DataError

    # a path is taken as it is, never parsed as YAML (' #' would start a comment, 'yes' would be a boolean)
    cfg = load_config(a.config, overrides, values=None if a.output_dir is None else {"output_dir": a.output_dir})
    check_anchor_layers_offline(cfg)
    try:
        if a.dry_run:  # the grid, then each source opened and split: a bad row or mapping fails here
            from .pipeline.prepare import describe_data

            print(describe_grid(cfg), flush=True)
            print(describe_data(cfg))
            return 0
        run_until_decided(cfg, a.max_seeds, a.overwrite, a.wait) if a.until_decided else run(cfg, a.overwrite, a.wait)
    except DataError as e:
        if cfg.data.skip_invalid:
            raise
        raise with_skip_hint(e, ref=ref_of_error([*cfg.data.sources, *cfg.data.ood], e)) from None
    return 0


def _cmd_select_method(a) -> int:
    import yaml

    from .config_io import load_config, parse_value
    from .pipeline.select_method import method_selection_markdown, select_method_setting

    cfg = load_config(a.config, list(a.set or []))
    if a.val_pairs < 1:
        raise ValueError(f"--val-pairs must be >= 1, got {a.val_pairs}")
    values = []
    for v in a.values:  # YAML scalars, as a config would read them
        try:
            value = parse_value(v)
        except yaml.YAMLError:
            value = v
        if isinstance(value, (list, dict)) or value is None:
            raise ValueError(
                f"--values {v!r}: give one value per argument (e.g. --values 0.2 0.4), each a number, word or "
                "true/false, not a list, a mapping or nothing"
            )
        values.append(value)
    result = select_method_setting(cfg, a.method, a.field, values, a.val_pairs, a.out)
    print(method_selection_markdown(result))
    return 0


def _cmd_select(a) -> int:
    from .config_io import load_config
    from .pipeline.select import select_student_settings, selection_markdown

    cfg = load_config(a.config, list(a.set or []))
    if a.val_pairs < 1:
        raise ValueError(f"--val-pairs must be >= 1, got {a.val_pairs}")
    print(selection_markdown(select_student_settings(cfg, a.learning_rates, a.epochs, a.val_pairs, a.out)))
    return 0


def _cmd_data_list(a) -> int:
    from .data.adapters import DATASETS
    from .data.registry import FORMAT_HELP, FORMATS, format_names

    print(f"{'name':30} {'category':9} {'where':9} {'license':32} origin")
    for s in DATASETS.values():
        where = "bundled" if s.bundled else ("shared" if s.files else "hub")
        print(f"{s.name:30} {s.category:9} {where:9} {s.license:32} {s.origin}")
    print(f"\n{'row format (--format, data.*.format)':38} reads")
    for name in format_names():
        if name in FORMAT_HELP:
            aliases = [a for a, fn in FORMATS.items() if fn is FORMATS[name] and a != name and a not in FORMAT_HELP]
            shown = name + (f" ({', '.join(aliases)})" if aliases else "")
            print(f"{shown:38} {FORMAT_HELP[name]}")
    return 0


def _load_tokenizer(spec: str):
    """Only the tokenizer of a model spec (local folder, .gguf, preset or hub id); no weights."""
    from .models.loading import load_tokenizer

    return load_tokenizer(spec, trust_remote_code=False)


def _cmd_data_inspect(a) -> int:
    import json

    from .data.adapters import DATASETS
    from .data.inspect import format_inspection, inspect_dataset
    from .data.resolve import dataset_ref_for, ref_of_error, resolve_dataset, with_skip_hint
    from .data.schema import DataError

    if a.max_length is not None and not a.tokenizer:
        raise ValueError("--max-length needs --tokenizer (truncation is counted in tokens)")
    if a.max_length is not None and a.max_length < 2:
        raise ValueError(f"--max-length must be >= 2, got {a.max_length}")
    columns = _columns(a.columns)
    refs = []
    try:
        refs.append(dataset_ref_for(a.dataset, a.format, columns))
        # --format applies to every file given (the dataset and the --overlap-with files), never to a name;
        # --columns to the dataset only
        refs += [dataset_ref_for(o, None if o in DATASETS else a.format) for o in (a.overlap_with or [])]
        result = resolve_dataset(refs[0], skip_invalid=a.skip_invalid)
        others = {
            o: resolve_dataset(r, skip_invalid=a.skip_invalid).pairs for o, r in zip(a.overlap_with or [], refs[1:])
        }
    except DataError as e:
        if a.skip_invalid:
            raise
        hint = "pass --skip-invalid to skip and count invalid rows instead of stopping at the first"
        raise with_skip_hint(e, hint, ref_of_error(refs, e)) from None
    tok = _load_tokenizer(a.tokenizer) if a.tokenizer else None
    d = inspect_dataset(result, tokenizer=tok, max_length=a.max_length, others=others)
    if a.tokenizer:
        d["tokenizer"] = a.tokenizer
    print(json.dumps(d, indent=2, ensure_ascii=False) if a.json else format_inspection(d))
    return 0


def _columns(items: list | None) -> dict | None:
    """``--columns FIELD=COLUMN...`` as a config entry's ``columns`` mapping (None: not given).

    Raises:
        ValueError: an item that is not FIELD=COLUMN with FIELD one of prompt, chosen, rejected, id, or a field
            given twice."""
    if not items:
        return None
    out: dict = {}
    for item in items:
        field, sep, column = item.partition("=")
        if not sep or field not in ("prompt", "chosen", "rejected", "id") or not column or field in out:
            why = f"{field} given twice" if field in out else "give FIELD=COLUMN"
            raise ValueError(
                f"--columns {item!r}: {why}, FIELD one of prompt, chosen, rejected, id, once each (e.g. --columns "
                "prompt=question chosen=good rejected=bad)"
            )
        out[field] = column
    return out


def _cmd_report(a) -> int:
    from .pipeline import RunDirError
    from .pipeline.rundir import fault, refuse_links_out_of
    from .report import write_report
    from .results import open_run
    from .runlock import holding

    run = open_run(a.run_dir, rewards=True)  # a non-run is refused before the lock file is created
    refuse_links_out_of(run.path)  # the check of every writer: nothing is written through a link out of the run
    # one writer: an evaluate or bon cannot write between read and write
    with holding(run.path, wait=a.wait, command="report"):
        run = open_run(a.run_dir, rewards=True)  # the rewards files the metrics were computed from: unchanged
        fault("report:read")
        try:
            print(write_report(run.path, run.metrics))
        except (ValueError, KeyError, TypeError) as e:
            f = run.path / "metrics.json"
            raise RunDirError(f"{f}: not a w2s-shift metrics file ({type(e).__name__}: {e})") from None
    return 0


def _cmd_evaluate(a) -> int:
    from .pipeline.evaluate import MAX_N_PAIRS, evaluate_run

    n = a.n_pairs.strip().lower()
    if n != "all" and not (n.isascii() and n.isdigit() and 1 <= int(n) <= MAX_N_PAIRS):
        raise ValueError(f"--n-pairs must be a whole number from 1 to {MAX_N_PAIRS:,} or 'all', got {a.n_pairs!r}")
    evaluate_run(
        a.run_dir,
        a.targets,
        fmt=a.format,
        skip_invalid=a.skip_invalid,
        n_pairs=None if n == "all" else int(n),
        headline=a.headline,
        remove=a.remove,
        wait=a.wait,
    )
    return 0


def _cmd_bon(a) -> int:
    from .config_io import apply_overrides
    from .pipeline.bon import bon_run

    sets = [o if o.startswith("bon.") else f"bon.{o}" for o in a.set or []]
    settings = apply_overrides({"bon": {}}, sets)["bon"]  # only the fields given: the rest is the run's bon section
    if a.gold is not None:  # a path or hub id as it is, never parsed as YAML
        if not a.gold.strip():
            raise ValueError(
                "--gold is empty: give a reward model folder or hub id, or leave --gold out for the synthetic gold"
            )
        settings["gold"] = a.gold
    for r in a.responses or []:
        name, sep, path = r.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--responses {r!r}: expected NAME=FILE")
        settings.setdefault("responses", {})[name] = path
    out = bon_run(a.run_dir, settings, wait=a.wait)
    print(f"best-of-n: {len(out['sources'])} source(s); table in {a.run_dir}/report.md, curves in {a.run_dir}/bon.json")
    return 0


def _cmd_export(a) -> int:
    from .pipeline.export_run import export_run

    folders = export_run(a.run_dir, a.labels, sources=a.source, seeds=a.seed, dry_run=a.dry_run, wait=a.wait)
    print("\n".join(("would write " if a.dry_run else "") + str(f) for f in folders))
    return 0


def _cmd_compare(a) -> int:
    from pathlib import Path

    from .report import compare

    seen = {}
    for r in a.run_dirs:  # the same run twice (also by two spellings of its path) would print one column twice
        key = Path(r).resolve()
        if key in seen:
            raise ValueError(f"{r}: given twice (as {seen[key]} before); compare takes different runs")
        seen[key] = r
    print(compare(a.run_dirs))  # ValueError (exit 2) names a missing or unreadable run directory
    return 0


def _add_wait(parser) -> None:
    parser.add_argument(
        "--wait",
        action="store_true",
        help="if another command is writing to the run directory, wait for it to finish instead of refusing",
    )


def build_parser() -> argparse.ArgumentParser:
    from .data.registry import format_names

    p = argparse.ArgumentParser(prog="w2s-shift", description="Weak-to-strong reward models under preference shift.")
    sub = p.add_subparsers(dest="cmd")
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
    r.add_argument("--max-seeds", type=int, metavar="N", help="the most seeds --until-decided may reach")
    r.set_defaults(func=_cmd_run)
    d = sub.add_parser("data", help="datasets")
    dsub = d.add_subparsers(dest="data_cmd")
    dl = dsub.add_parser("list", help="list supported datasets")
    dl.set_defaults(func=_cmd_data_list)
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
    di.set_defaults(func=_cmd_data_inspect)
    rp = sub.add_parser(
        "report", help="rewrite report.md, report.html and plots/ of a finished run and print its tables"
    )
    rp.add_argument("run_dir")
    _add_wait(rp)
    rp.set_defaults(func=_cmd_report)
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
    ev.set_defaults(func=_cmd_evaluate)
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
    bo.set_defaults(func=_cmd_bon)
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
    ex.set_defaults(func=_cmd_export)
    cp = sub.add_parser(
        "compare", help="one Markdown table comparing finished runs side by side (ID acc, OOD acc, NTS)"
    )
    cp.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    cp.set_defaults(func=_cmd_compare)
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
    se.set_defaults(func=_cmd_select)
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
    sm.set_defaults(func=_cmd_select_method)
    from .plan.command import add_plan_parser
    from .score import add_score_parser

    add_score_parser(sub)  # `w2s-shift score MODEL NAME_OR_FILE`
    add_plan_parser(sub)  # `w2s-shift plan CONFIG_OR_MODEL`: GPU memory per device, per backend and GPU count
    return p


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
