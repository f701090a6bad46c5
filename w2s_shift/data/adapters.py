"""Dataset adapters: converters of single datasets (registered as row formats, :mod:`.registry`), named datasets.

Named datasets (:data:`DATASETS`) are bundled, in the shared data dir, or on the hub. A bad row raises
:class:`~w2s_shift.data.schema.DataError` naming file, row and field (with ``skip_invalid``: skipped and
counted). Rows a dataset's definition drops (ties in PandaLM, HelpSteer3, UltraFeedback raw) and kept HH pairs
whose transcripts have different prompts are counted too: every loader returns a
:class:`~w2s_shift.data.schema.LoadResult`, nothing is dropped silently. Files are read by
:mod:`w2s_shift.data.formats`; which loader a string or config entry goes to, by :mod:`w2s_shift.data.resolve`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import paper_sets, rewardbench  # noqa: F401 (importing them registers their formats)
from .formats import Dropped, get_field, number_cell, read_rows
from .registry import FORMATS, get_format, register_format
from .schema import DataError, LoadResult, PreferencePair, check_text, make_pair
from .splits import dedupe_by_prompt

BUNDLED_DIR = Path(__file__).parent / "bundled"


@register_format("pandalm", help="PandaLM test set: response1, response2, majority of annotator1..3 (0: tie)")
def convert_pandalm(row: Any, path: str, rowno: int, source: str, columns: dict | None = None) -> PreferencePair:
    """PandaLM test set: majority vote of annotator1..3 (1: response1 better, 2: response2 better, 0: tie);
    ties and split votes are dropped by definition (counted)."""
    votes = []
    for k in (1, 2, 3):
        v = get_field(row, f"annotator{k}", path, rowno)
        if isinstance(v, bool) or v not in (0, 1, 2):  # True == 1 in Python: a bool is not a vote
            raise DataError(path, rowno, f"annotator{k}", f"expected 0, 1 or 2, got {v!r}")
        votes.append(v)
    best = max((0, 1, 2), key=votes.count)
    if votes.count(best) < 2 or best == 0:
        raise Dropped("tie or no majority (PandaLM definition)")
    instruction = check_text(get_field(row, "instruction", path, rowno), path, rowno, "instruction")
    extra = row.get("input")
    if extra is None or (isinstance(extra, float) and math.isnan(extra)):
        extra = ""
    if not isinstance(extra, str):  # else an int or a list would be pasted into the prompt as text
        raise DataError(path, rowno, "input", f"expected a string, got {type(extra).__name__}")
    prompt = instruction if not extra else f"{instruction}\n\n{extra}"
    r1, r2 = get_field(row, "response1", path, rowno), get_field(row, "response2", path, rowno)
    chosen, rejected = (r1, r2) if best == 1 else (r2, r1)
    return make_pair(prompt, chosen, rejected, source, path=path, row=rowno, id=row.get("idx"))


@register_format("pku_pairs", help="PKU-SafeRLHF derived pairs: prompt, response = [safer, less safe]")
def convert_pku_pairs(row: Any, path: str, rowno: int, source: str, columns: dict | None = None) -> PreferencePair:
    """PKU-SafeRLHF derived pair files: ``prompt`` and ``response`` = [safer, less safe]."""
    resp = get_field(row, "response", path, rowno)
    if not isinstance(resp, list) or len(resp) != 2:
        raise DataError(path, rowno, "response", "expected a list of two responses [safer, less safe]")
    return make_pair(get_field(row, "prompt", path, rowno), resp[0], resp[1], source, path=path, row=rowno)


@register_format("safer_instruct", help="Safer-Instruct CSV: instruction, chosen, rejected")
def convert_safer_instruct(row: Any, path: str, rowno: int, source: str, columns: dict | None = None) -> PreferencePair:
    """Safer-Instruct CSV: instruction, chosen, rejected."""
    return make_pair(
        get_field(row, "instruction", path, rowno),
        get_field(row, "chosen", path, rowno),
        get_field(row, "rejected", path, rowno),
        source,
        path=path,
        row=rowno,
    )


# an UltraFeedback aspect rating: "4" (text), or "N/A" for none
_RATING = {"text_ok": True, "missing": ("N/A",), "text_hint": "a numeric rating or 'N/A'"}


def _uf_aspect_mean(ann: Any, path: str, rowno: int, name: str) -> float:
    """Mean of the available per-aspect ``Rating`` values of an UltraFeedback ``annotations`` object."""
    if not isinstance(ann, dict) or not ann:
        raise DataError(path, rowno, name, "expected an object of per-aspect ratings ({aspect: {'Rating': '4'}})")
    ratings = []
    for aspect, v in ann.items():
        if isinstance(v, dict):
            if "Rating" not in v:
                raise DataError(path, rowno, f"{name}.{aspect}.Rating", "missing field")
            r = number_cell(v["Rating"], path, rowno, f"{name}.{aspect}.Rating", **_RATING)
        else:
            r = number_cell(v, path, rowno, f"{name}.{aspect}", **_RATING)
        if r is not None:
            ratings.append(r)
    if not ratings:
        raise DataError(path, rowno, name, "no aspect rating available (all N/A)")
    return sum(ratings) / len(ratings)


@register_format("ultrafeedback_raw", help="UltraFeedback raw: instruction, completions (chosen: the higher score)")
def convert_ultrafeedback_raw(
    row: Any, path: str, rowno: int, source: str, columns: dict | None = None
) -> PreferencePair:
    """UltraFeedback raw (``openbmb/UltraFeedback``): ``instruction`` (the prompt) and ``completions``, a
    list of ``{response, overall_score | fine-grained_score | annotations, ...}``; one pair per row.

    Score of a completion, one kind per row so that scores are on one scale: ``overall_score`` when any
    completion of the row has one (1-10); else ``fine-grained_score`` when any has one; else the mean of
    the available per-aspect ratings in ``annotations`` (``{"helpfulness": {"Rating": "4"}, ...}``, 1-5,
    ``"N/A"`` = missing). Every completion of the row must then have that score.

    Pair: chosen = the highest-scored completion, rejected = the lowest-scored (the first one in the list
    on equal scores). UltraFeedback binarized (HuggingFaceH4/ultrafeedback_binarized) also takes the
    highest-scored completion as chosen, but a *random* lower one as rejected; best vs worst here gives
    a deterministic label (and the largest score gap). ``strength`` is that gap, on the row's scale.

    Dropped by definition (counted): best and worst tie (all completions scored equal: no preference),
    and rows with fewer than two completions (as in UltraFeedback binarized).

    Raises:
        DataError: a field is missing or malformed, naming it, e.g. ``completions[2].overall_score`` for a
            score that is NaN, infinite, a bool or not a number, or ``completions[0].response`` for an
            empty response of the chosen or rejected completion.
    """
    prompt = check_text(get_field(row, "instruction", path, rowno), path, rowno, "instruction")
    comps = get_field(row, "completions", path, rowno)
    if not isinstance(comps, list):
        raise DataError(path, rowno, "completions", f"expected a list of completions, got {type(comps).__name__}")
    for k, c in enumerate(comps):
        if not isinstance(c, dict):
            raise DataError(path, rowno, f"completions[{k}]", f"expected a completion object, got {type(c).__name__}")
    if len(comps) < 2:
        raise Dropped("fewer than two completions (UltraFeedback raw: no pair)")
    kind = next(
        (key for key in ("overall_score", "fine-grained_score") if any(c.get(key) is not None for c in comps)),
        "annotations",
    )
    scores = []
    for k, c in enumerate(comps):
        name = f"completions[{k}].{kind}"
        if kind not in c:
            raise DataError(
                path,
                rowno,
                name,
                "missing field (other completions of this row have one: scores must be on one scale)"
                if kind != "annotations"
                else "missing field (a completion needs overall_score, fine-grained_score or annotations)",
            )
        if c[kind] is None:
            raise DataError(path, rowno, name, "missing value")
        if kind == "annotations":
            scores.append(_uf_aspect_mean(c[kind], path, rowno, name))
        else:
            scores.append(number_cell(c[kind], path, rowno, name, text_ok=False))
    best = max(range(len(scores)), key=lambda i: (scores[i], -i))
    worst = min(range(len(scores)), key=lambda i: (scores[i], i))
    if scores[best] == scores[worst]:
        raise Dropped("tie (UltraFeedback raw: best and worst completions have the same score)")
    chosen = check_text(comps[best].get("response"), path, rowno, f"completions[{best}].response")
    rejected = check_text(comps[worst].get("response"), path, rowno, f"completions[{worst}].response")
    gap = scores[best] - scores[worst]  # inf only for absurd scores near the float limit
    return make_pair(
        prompt,
        chosen,
        rejected,
        source,
        path=path,
        row=rowno,
        id=row.get("id"),
        strength=gap if math.isfinite(gap) else None,
    )


# ---------------------------------------------------------------------------------------------------------
# Named datasets


@dataclass(frozen=True)
class DatasetSpec:
    """A named dataset: where its files are, its format, category (Helpful / Harmless) and license."""

    name: str
    category: str
    license: str
    origin: str
    format: str
    files: tuple = ()  # paths relative to the bundled dir, or to the shared data dir when not bundled
    bundled: bool = True
    hub_id: str | None = None
    hub_subset: str | None = None  # the hub dataset's config (HelpSteer3: "preference")
    hub_split: str = "test"  # the split read from the hub (HelpSteer3 has no test split: "validation")
    dedupe_prompts: bool = False
    description: str = ""


DATASETS: dict[str, DatasetSpec] = {
    s.name: s
    for s in [
        DatasetSpec(
            "ultrafeedback",
            "Helpful",
            "MIT",
            "openbmb/UltraFeedback via HuggingFaceH4/ultrafeedback_binarized (two random subsets)",
            "prompt_chosen_rejected",
            (
                "ultrafeedback_binarized_subset/train_clean.jsonl.gz",
                "ultrafeedback_binarized_subset/eval_clean.jsonl.gz",
                "ultrafeedback_binarized_subset_tnlp/train_prefs.jsonl.gz",
                "ultrafeedback_binarized_subset_tnlp/test_prefs.jsonl.gz",
            ),
            hub_id="HuggingFaceH4/ultrafeedback_binarized",
            dedupe_prompts=True,
            description="UltraFeedback binarized, 2,200 pairs from two subsets, deduplicated by prompt",
        ),
        DatasetSpec(
            "hh-helpful-base",
            "Helpful",
            "MIT",
            "Anthropic/hh-rlhf helpful-base, test split",
            "hh",
            ("hh_rlhf_helpful_base/test.jsonl.gz",),
            hub_id="Anthropic/hh-rlhf",
        ),
        DatasetSpec(
            "hh-helpful-online",
            "Helpful",
            "MIT",
            "Anthropic/hh-rlhf helpful-online, test split",
            "hh",
            ("hh_rlhf_helpful_online/test.jsonl.gz",),
            hub_id="Anthropic/hh-rlhf",
        ),
        DatasetSpec(
            "hh-helpful-rejection-sampled",
            "Helpful",
            "MIT",
            "Anthropic/hh-rlhf helpful-rejection-sampled, test split",
            "hh",
            ("hh_rlhf_helpful_rejection_sampled/test.jsonl.gz",),
            hub_id="Anthropic/hh-rlhf",
        ),
        DatasetSpec(
            "hh-harmless-base",
            "Harmless",
            "MIT",
            "Anthropic/hh-rlhf harmless-base, test split",
            "hh",
            ("hh_rlhf_harmless_base/test.jsonl.gz",),
            hub_id="Anthropic/hh-rlhf",
        ),
        DatasetSpec(
            "pandalm",
            "Helpful",
            "Apache-2.0",
            "WeOpenML/PandaLM testset-v1 (3 annotators, majority vote)",
            "pandalm",
            ("pandalm_testset_v1/testset-v1.json",),
        ),
        DatasetSpec(
            "llamafactory-dpo-en-demo",
            "Helpful",
            "Apache-2.0",
            "hiyouga/LLaMA-Factory data/dpo_en_demo.json",
            "sharegpt_dpo",
            ("llamafactory_dpo_en_demo/dpo_en_demo.json",),
        ),
        DatasetSpec(
            "pku-saferlhf-safer-pairs",
            "Harmless",
            "CC-BY-NC-4.0 (not bundled)",
            "PKU-SafeRLHF test split, safe-vs-unsafe pairs",
            "pku_pairs",
            ("pku_saferlhf_safer_pairs_5k/pku_seferlhf_realign_dpo_5k.json",),
            bundled=False,
        ),
        DatasetSpec(
            "safer-instruct",
            "Harmless",
            "academic use only (not bundled)",
            "uscnlp-lime/safer-instruct hate + self-harm",
            "safer_instruct",
            ("safer_instruct/safer_instruct_hate.csv", "safer_instruct/safer_instruct_self-harm.csv"),
            bundled=False,
        ),
        DatasetSpec(
            "pku-saferlhf",
            "Harmless",
            "CC-BY-NC-4.0",
            "PKU-Alignment/PKU-SafeRLHF test split, label safer_response_id (hub only)",
            "pku_saferlhf",
            bundled=False,
            hub_id="PKU-Alignment/PKU-SafeRLHF",
        ),
        DatasetSpec(
            "pku-saferlhf-better",
            "Helpful",
            "CC-BY-NC-4.0",
            "PKU-Alignment/PKU-SafeRLHF test split, label better_response_id (hub only)",
            "pku_saferlhf_better",
            bundled=False,
            hub_id="PKU-Alignment/PKU-SafeRLHF",
        ),
        DatasetSpec(
            "helpsteer3",
            "Helpful",
            "CC-BY-4.0",
            "nvidia/HelpSteer3 preference subset, validation split (hub only)",
            "helpsteer3",
            bundled=False,
            hub_id="nvidia/HelpSteer3",
            hub_subset="preference",
            hub_split="validation",
        ),
        DatasetSpec(
            "rail-hh-10k",
            "Harmless",
            "MIT (dataset card)",
            "responsible-ai-labs/RAIL-HH-10K test split, strength = RAIL score margin (hub only)",
            "rail_hh",
            bundled=False,
            hub_id="responsible-ai-labs/RAIL-HH-10K",
        ),
    ]
}


def shared_data_dir() -> Path | None:
    """Where non-bundled datasets live: ``$W2S_SHIFT_DATA_DIR``, else a ``shared/data`` folder beside or
    above the current directory (the project's development layout)."""
    env = os.environ.get("W2S_SHIFT_DATA_DIR")
    if env:
        return Path(env)
    here = Path.cwd().resolve()
    for base in [here, *here.parents][:4]:
        for cand in (base / "shared" / "data", base.parent / "shared" / "data"):
            if cand.is_dir():
                return cand
    return None


def convert_rows(
    rows: Iterator,
    convert: Callable,
    path: str,
    source: str,
    columns: dict | None,
    skip_invalid: bool,
    result: LoadResult,
) -> None:
    """Convert ``(rowno, row)`` items with ``convert`` into ``result``: a pair (or a list of pairs, from a row of
    several responses), a drop (counted by reason) or, with ``skip_invalid``, a skipped row; without it the first
    DataError propagates. A row whose pairs carry the row id (:class:`~w2s_shift.data.schema.PairGroup`, the
    RewardBench formats) of an earlier row is invalid (field ``id``): row scores group pairs by that id."""
    group_rows: dict = {}  # row id -> the row that first had it
    for rowno, row in rows:
        try:
            out = convert(row, path, rowno, source, columns)
            firsts = out[:1] if isinstance(out, list) else [out[0] if isinstance(out, tuple) else out]
            group = getattr(firsts[0], "group", None) if firsts else None
            if group is not None and group_rows.setdefault(group.row, rowno) != rowno:
                raise DataError(
                    path,
                    rowno,
                    "id",
                    f"{group.row!r} is also the id of row {group_rows[group.row]}; row ids must be unique within the "
                    "file (the benchmark scores each row from its pairs)",
                )
        except Dropped as d:
            result.dropped_by_definition[d.reason] = result.dropped_by_definition.get(d.reason, 0) + 1
        except DataError as e:
            if not skip_invalid:
                raise
            result.skipped.add(e)
        else:
            if isinstance(out, tuple):  # (pair, prompt_mismatch)
                out, mismatch = out
                result.prompt_mismatch += bool(mismatch)
            result.rows_kept += 1
            if isinstance(out, list):  # a row of several responses: one pair per (chosen, rejected)
                result.pairs.extend(out)
            else:
                result.pairs.append(out)


def load_named(name: str, *, skip_invalid: bool = False, data_dir: str | os.PathLike | None = None) -> LoadResult:
    """Load a named dataset from :data:`DATASETS` (bundled files, the shared data dir, or the hub).

    Raises:
        DataError: unknown name, files not found (with where they were looked for), or an invalid row.
    """
    if name not in DATASETS:
        raise DataError(name, None, None, f"unknown dataset name (known: {', '.join(DATASETS)}); or give a file path")
    spec = DATASETS[name]
    if not spec.files:
        return load_hub(
            spec.hub_id,
            format=spec.format,
            source=name,
            split=spec.hub_split,
            subset=spec.hub_subset,
            skip_invalid=skip_invalid,
        )
    base = BUNDLED_DIR if spec.bundled else (Path(data_dir) if data_dir else shared_data_dir())
    if base is None:
        raise DataError(
            name,
            None,
            None,
            "not bundled (license); set W2S_SHIFT_DATA_DIR to the folder holding "
            f"{spec.files[0].split('/')[0]}/ or give its file path",
        )
    result = LoadResult(name=name, pairs=[])
    for rel in spec.files:
        p = base / rel
        if not p.is_file():
            raise DataError(str(p), None, None, "dataset file not found")
        rows = read_rows(p, result.skipped if skip_invalid else None)
        convert_rows(rows, FORMATS[spec.format], str(p), name, None, skip_invalid, result)
    if spec.dedupe_prompts:
        dedupe_by_prompt(result)
    return result


def load_hub(
    hub_id: str | None,
    *,
    format: str = "prompt_chosen_rejected",
    source: str | None = None,
    split: str = "test",
    subset: str | None = None,
    columns: dict | None = None,
    skip_invalid: bool = False,
) -> LoadResult:
    """Load a Hugging Face dataset id through ``datasets`` (needs the hub and the ``datasets`` package).

    Raises:
        DataError: ``datasets`` missing, the hub unreachable (offline), or an invalid row.
    """
    label = f"hf:{hub_id}" + (f"/{subset}" if subset else "") + f"[{split}]"
    try:
        import datasets  # noqa: F401
    except ImportError:
        raise DataError(
            label,
            None,
            None,
            "the 'datasets' package is not installed (pip install datasets); "
            "offline, download the files and give their path instead",
        ) from None
    try:
        ds = datasets.load_dataset(hub_id, subset, split=split)
    except Exception as e:
        raise DataError(
            label, None, None, f"cannot load from the Hugging Face hub (offline?): {type(e).__name__}: {e}"
        ) from None
    result = LoadResult(name=source or hub_id, pairs=[])
    convert_rows(enumerate(ds, 1), get_format(format, label), label, source or hub_id, columns, skip_invalid, result)
    return result
