"""A grid row's data: the source split by prompt (teacher-train, student-train, ID test), subsampled, and its OOD
targets with the source's prompts removed (protocol.md, Data)."""

from __future__ import annotations

from ..config import RunConfig
from ..data.resolve import resolve_dataset
from ..data.schema import LoadResult
from ..data.splits import prompt_keys, remove_prompt_overlap, split_by_prompt, subsample


def load_ref(ref, skip_invalid: bool) -> LoadResult:
    """Load a :class:`~w2s_shift.config.DatasetRef` (:func:`~w2s_shift.data.resolve.resolve_dataset`)."""
    return resolve_dataset(ref, skip_invalid=skip_invalid)


def split_seed(cfg: RunConfig, seed: int | None) -> int:
    """The seed of the source's split and subsample: data.seed, or with data.resplit_per_seed data.seed x 1000003
    + the training seed (each seed gets its own split)."""
    d = cfg.data
    return d.seed * 1_000_003 + int(seed) if d.resplit_per_seed and seed is not None else d.seed


MIN_SPLIT_PAIRS = 10  # a teacher_train / student_train / test split with fewer pairs than this is refused


def split_shortfalls(source: str, sizes: dict, caps: dict, n_pairs: int, fractions) -> list:
    """Requested split sizes the data cannot meet.

    Args:
        source: the source dataset's display name (for the message).
        sizes: split name -> pairs it holds after the cap; caps: split name -> requested cap (None: all).
        n_pairs: valid pairs of the source; fractions: data.split_fractions (for the message).

    Returns:
        ``[{"split", "requested", "available"}]`` for each split with a cap above what it holds, in split order.

    Raises:
        ValueError: a split holds fewer than :data:`MIN_SPLIT_PAIRS` pairs although more were asked for (a cap
            above its size, or no cap); naming the source, split, requested and available numbers. A cap set
            below 10 on purpose is honoured.
    """
    out = []
    for name, n in sizes.items():
        cap = caps.get(name)
        if cap is not None and n < cap:
            out.append({"split": name, "requested": int(cap), "available": int(n)})
        if n < MIN_SPLIT_PAIRS and (cap is None or n < cap):
            asked = "all" if cap is None else str(cap)
            raise ValueError(
                f"source {source!r}: split {name!r} has {n} pairs (requested {asked}; at least "
                f"{MIN_SPLIT_PAIRS} needed): {n_pairs} valid pairs in the source with split_fractions "
                f"{list(fractions)}; use more data or change split_fractions"
            )
    return out


def prepare_data(cfg: RunConfig, source=None, seed: int | None = None) -> tuple:
    """Load one source dataset and its OOD targets, split the source by prompt, subsample, remove OOD prompt
    overlap. ``source``: a DatasetRef of ``cfg.data.sources`` (default: the first); ``seed``: the training seed,
    which sets the split under ``data.resplit_per_seed`` (:func:`split_seed`; OOD subsamples keep data.seed).

    Returns:
        (splits {teacher_train, student_train, test: [pairs]}, ood {name: [pairs]}, summary dict)

    Raises:
        ValueError: an empty source or split, a split short of its request with fewer than 10 pairs
            (:func:`split_shortfalls`), or an OOD target with no pairs left after filtering. Requests met only in
            part are listed in ``summary["shortfalls"]``.
    """
    d = cfg.data
    source = source or d.sources[0]
    src = load_ref(source, d.skip_invalid)
    if not src.pairs:
        sk = src.skipped
        raise ValueError(
            f"source dataset {source.display!r} has no valid pairs"
            + (
                f": all {sk.total:,} rows invalid, e.g. {sk.examples[0]}; check the row format and the column "
                "mapping (format: and columns:)"
                if sk.total
                else ""
            )
        )
    sseed = split_seed(cfg, seed)
    splits = split_by_prompt(src.pairs, d.split_fractions, sseed)
    caps = {"teacher_train": d.n_teacher_train, "student_train": d.n_student_train, "test": d.n_test}
    splits = {k: subsample(v, caps[k], sseed) for k, v in splits.items()}
    for name, v in splits.items():
        if not v:
            raise ValueError(
                f"source {source.display!r}: split {name!r} is empty: too few prompts ({len(src.pairs)} pairs) "
                f"for split_fractions {list(d.split_fractions)}"
            )
    shortfalls = split_shortfalls(
        source.display, {k: len(v) for k, v in splits.items()}, caps, len(src.pairs), d.split_fractions
    )
    summary = {
        "source": src.summary(),
        "splits": {k: len(v) for k, v in splits.items()},
        "ood": {},
        "split_seed": sseed,
        "resplit_per_seed": bool(d.resplit_per_seed),
        "shortfalls": shortfalls,
    }
    src_keys = prompt_keys(src.pairs)
    ood = {}
    for ref in d.ood_for(source):
        res = load_ref(ref, d.skip_invalid)
        pairs, overlap = res.pairs, 0
        if d.remove_ood_overlap:
            pairs, overlap = remove_prompt_overlap(pairs, src_keys)
        pairs = subsample(pairs, d.n_ood, d.seed)
        if not pairs:
            skipped = res.skipped.total
            first = f" (first: {res.skipped.examples[0]})" if res.skipped.examples else ""
            raise ValueError(
                f"OOD target {ref.display!r} has no pairs left: {len(res.pairs)} valid pairs"
                + (f" ({skipped} invalid row(s) skipped{first})" if skipped else "")
                + f", {overlap} removed because their prompt is in the source dataset {source.display!r}"
            )
        ood[ref.display] = pairs
        if d.n_ood is not None and len(pairs) < d.n_ood:
            shortfalls.append({"split": f"ood:{ref.display}", "requested": int(d.n_ood), "available": len(pairs)})
        summary["ood"][ref.display] = {**res.summary(), "prompt_overlap_removed": overlap, "used": len(pairs)}
    return splits, ood, summary


def gold_validation_pairs(cfg: RunConfig, n_pairs: int, source=None, seed: int | None = None) -> tuple:
    """A validation split of gold pairs carved from the source's student-train pool: the pool's pairs that
    :func:`prepare_data` does not keep for training (beyond ``data.n_student_train``), minus any whose prompt is
    in the kept training pairs, so validation and training share no prompt. Never the ID test split and never an
    OOD target; for choosing training settings (lr, epochs) on gold labels without touching what is reported.

    Args:
        n_pairs: pairs wanted (the first ``n_pairs`` in seeded hash order of the remainder).
        source, seed: as :func:`prepare_data`.

    Returns:
        (validation pairs, training pairs the run uses): the second is ``prepare_data``'s ``student_train``.

    Raises:
        ValueError: fewer than :data:`MIN_SPLIT_PAIRS` pairs remain in the pool, naming the source, the pool size
            and what training keeps (lower ``data.n_student_train`` or raise the student share of
            ``data.split_fractions``).
    """
    d = cfg.data
    source = source or d.sources[0]
    src = load_ref(source, d.skip_invalid)
    sseed = split_seed(cfg, seed)
    pool = split_by_prompt(src.pairs, d.split_fractions, sseed)["student_train"]
    train = subsample(pool, d.n_student_train, sseed)
    kept = {id(p) for p in train}  # the same objects as the pool's (pairs with message prompts do not hash)
    rest, _ = remove_prompt_overlap([p for p in pool if id(p) not in kept], prompt_keys(train))
    if len(rest) < MIN_SPLIT_PAIRS:
        raise ValueError(
            f"source {source.display!r}: the student-train pool holds {len(pool)} pairs and training keeps "
            f"{len(train)}: {len(rest)} left for a gold validation split (at least {MIN_SPLIT_PAIRS} needed); "
            "lower data.n_student_train or raise the student share of data.split_fractions"
        )
    return subsample(rest, n_pairs, sseed), train


def _on_hub(ref) -> bool:
    """Whether loading ``ref`` would download it (a hub id, or a named dataset that lives on the hub only)."""
    from ..data.adapters import DATASETS

    spec = DATASETS.get(ref.name) if ref.name else None
    return bool(ref.hf) or (spec is not None and not spec.bundled and not spec.files)


def describe_data(cfg: RunConfig) -> str:
    """``run --dry-run``'s data lines: each source opened and split as the run splits it for its first seed, with its
    OOD targets (pairs used, of how many valid, the source's prompts removed) and every request met only in part.
    A source with a dataset on the hub is not opened (a dry run stays offline).

    Raises:
        DataError: an invalid row (file, row, field), unless ``data.skip_invalid``. ValueError: as
            :func:`prepare_data` (an empty source, split or OOD target)."""
    lines = []
    for source in cfg.data.sources:
        hub = [r.display for r in [source, *cfg.data.ood_for(source)] if _on_hub(r)]
        if hub:
            lines.append(f"data {source.display}: not opened ({', '.join(hub)} on the hub; a dry run stays offline)")
            continue
        splits, ood, summary = prepare_data(cfg, source, cfg.seeds[0])
        src = summary["source"]
        skipped = src["invalid_rows_skipped"]["skipped"]
        line = (
            f"data {source.display}: {src['pairs']:,} valid pairs"
            + (f" ({skipped:,} invalid rows skipped)" if skipped else "")
            + " -> "
            + ", ".join(f"{k.replace('_', '-')} {len(v):,}" for k, v in splits.items())
            + f" (split seed {summary['split_seed']}"
            + ("; each seed splits anew" if summary["resplit_per_seed"] else "")
            + ")"
        )
        for name, o in summary["ood"].items():
            removed = o["prompt_overlap_removed"]
            line += f"; OOD {name} {o['used']:,} of {o['pairs']:,}" + (
                f" ({removed:,} with a source prompt removed)" if removed else ""
            )
        lines.append(line)
        for s in summary["shortfalls"]:
            lines.append(f"  {s['split']}: {s['requested']:,} requested, {s['available']:,} available")
    return "\n".join(lines)
