"""What each ``w2s-shift`` command does, given its parsed arguments (:mod:`w2s_shift.cli` builds the parser and
maps bad input to exit 2): one function per command, returning its exit code. ``score`` and ``plan`` live beside
their own code (:mod:`w2s_shift.score`, :mod:`w2s_shift.plan.command`)."""

from __future__ import annotations


def cmd_run(a) -> int:
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


def cmd_select_method(a) -> int:
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


def cmd_select(a) -> int:
    from .config_io import load_config
    from .pipeline.select import select_student_settings, selection_markdown

    cfg = load_config(a.config, list(a.set or []))
    if a.val_pairs < 1:
        raise ValueError(f"--val-pairs must be >= 1, got {a.val_pairs}")
    print(selection_markdown(select_student_settings(cfg, a.learning_rates, a.epochs, a.val_pairs, a.out)))
    return 0


def cmd_data_list(a) -> int:
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


def cmd_data_inspect(a) -> int:
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


def cmd_report(a) -> int:
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


def cmd_snapshot(a) -> int:
    from .pipeline.snapshot import snapshot

    snapshot(a.run_dir, a.out_dir)
    print(f"next: `w2s-shift plan --power {a.out_dir}`; the report is {a.out_dir}/report.md")
    return 0


def cmd_evaluate(a) -> int:
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


def cmd_bon(a) -> int:
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


def cmd_export(a) -> int:
    from .pipeline.export_run import export_run

    folders = export_run(a.run_dir, a.labels, sources=a.source, seeds=a.seed, dry_run=a.dry_run, wait=a.wait)
    print("\n".join(("would write " if a.dry_run else "") + str(f) for f in folders))
    return 0


def cmd_compare(a) -> int:
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
