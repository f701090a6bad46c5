"""``w2s-shift score MODEL FILE``: rewards of an exported reward model on a dataset, with plain transformers.

MODEL is a Hugging Face ``AutoModelForSequenceClassification`` folder with one label (what
:func:`w2s_shift.models.export.export_reward_model` writes, or any such reward model, local or hub id), or a
w2s-shift run directory holding exactly one exported student. FILE is a dataset name (``w2s-shift data
list``), a pair file in one of the ``data inspect`` formats (``--format``) or ``hf:<hub id>``, resolved as every
command does (:func:`w2s_shift.data.resolve.resolve_dataset`), or with ``--single`` a file of single responses
(rows with ``prompt`` and ``response``, optional ``id``).

Every sequence is rendered and truncated exactly as in training (:func:`w2s_shift.data.render.encode`:
chat template or plain transcript, the template's own special tokens only, the response end never cut), at
the length the export records it was trained at unless ``--max-length`` says otherwise
(:func:`resolve_max_length`), right-padded with the model's pad id, batched by
a token budget, and scored by the model's own forward: the reward is ``logits[:, 0]``. No w2s-shift code
touches the weights or the pooling, so the numbers are what any transformers user gets.

Output: one JSONL row per pair ``{index, id, reward_chosen, reward_rejected, margin, correct}`` (margin =
r_chosen - r_rejected; correct = margin > 0, ties wrong) and a printed summary: pairwise accuracy in pp with
a 95% percentile bootstrap interval (pairs resampled, 2,000 draws), the number of truncated pairs and the
share of pairs whose response was cut.

``--output-format rewardbench`` (``--format rewardbench`` also selects it, reading the file as
prompt/chosen/rejected rows, RewardBench's own data layout) matches RewardBench v1 (allenai/reward-bench,
``rewardbench`` CLI in ``rewardbench/rewardbench.py`` and ``scripts/run_rm.py``, 2024-2025 main branch): per-example
rows with the fields of its scores file, ``{id, subset, results, scores_chosen, scores_rejected}``
(``results`` 1 when chosen scores strictly higher, else 0), and beside them ``<out>.results.json`` with the
fields of its results file, ``{accuracy (a fraction), num_prompts, model, ref_model, tokenizer, chat_template,
extra_results (accuracy per subset)}``. The prompt and response texts RewardBench's scores file also carries
are left out.

A RewardBench file (``--format rewardbench2`` or ``rewardbench``, or ``hf:allenai/reward-bench-2`` /
``hf:allenai/reward-bench``, which pick those formats) is scored pair by pair as above (a RewardBench 2 row is one
pair per chosen x rejected; each distinct sequence is scored once) and then by the benchmark's official rules
(:mod:`w2s_shift.metrics.rewardbench`): the summary adds the RewardBench 2 score and per-subset scores (best-of-4
rows, the Ties rule), or RewardBench 1's per-subset accuracy and section scores, also written to
``<out>.rewardbench.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from .runlock import enclosing_run_dir
from .score_model import (  # noqa: F401 (the names score has always offered)
    DEFAULT_MAX_LENGTH,
    ScoringModel,
    checked_export_info,
    load_reward_model,
    resolve_max_length,
    resolve_model,
)

OUTPUT_FORMATS = ("rows", "rewardbench")


def score_token_sequences(
    sm: ScoringModel, seqs: list, max_tokens: int = 8192, data: str = "", pairs: int = 0
) -> np.ndarray:
    """Rewards of token sequences (lists of ids) by the model's own forward, in input order.

    Sequences are right-padded with ``sm.pad_id`` (attention mask 0 there) in batches of at most
    ``max_tokens`` padded tokens; a model without a pad id gets one sequence per forward. ``data``: the file the
    sequences come from, for the error; ``pairs`` > 0: the sequences are the chosen responses of that many pairs
    followed by their rejected ones (the error names the first pair with a non-finite reward), else one row each.

    Returns:
        (N,) float64 rewards.

    Raises:
        ValueError: a non-finite reward (the model and the first sequence named).
    """
    import torch

    from .batching import batches_by_tokens, module_device, pad_sequences

    out = np.zeros(len(seqs), dtype=np.float64)
    dev = module_device(sm.model)
    max_rows = 64 if sm.pad_id is not None else 1
    with torch.no_grad():
        for b in batches_by_tokens([len(s) for s in seqs], max_tokens, max_rows=max_rows):
            ids, am = pad_sequences([seqs[i] for i in b], sm.pad_id if sm.pad_id is not None else 0)
            logits = sm.model(input_ids=ids.to(dev), attention_mask=am.to(dev)).logits
            out[b] = logits[:, 0].float().cpu().numpy()
    bad = ~np.isfinite(out)
    if bad.any():
        first = int(min(np.flatnonzero(bad), key=lambda i: i % pairs if pairs else i))
        side = "chosen" if first < pairs else "rejected"
        where = f"pair {first % pairs + 1}, {side}" if pairs else f"row {first + 1}"
        dtype = next(sm.model.parameters()).dtype
        advice = (  # float32 is the widest dtype score offers: there the weights themselves overflow
            "try --dtype float32"
            if dtype != torch.float32
            else "in float32, so its weights overflow or are broken; no --dtype can help"
        )
        raise ValueError(
            f"{sm.source}: {int(bad.sum())} of {len(seqs)} rewards are not finite (first: "
            f"{data + ' ' if data else ''}{where}, reward {out[first]}); {advice}"
        )
    return out


def _count_pad_inside(seqs: list, pad_id: int | None) -> int:
    return 0 if pad_id is None else sum(pad_id in s for s in seqs)


def _default_out(data: str, single: bool) -> Path:
    stem = Path(data).name.split(".")[0] or "scores"
    return Path.cwd() / f"{stem}.{'single.' if single else ''}rewards.jsonl"


def score_pairs_command(
    sm: ScoringModel,
    data: str,
    fmt: str | None,
    skip_invalid: bool,
    max_length: int,
    max_tokens: int,
    out: Path,
    output_format: str,
) -> dict:
    """Score a pair dataset and write the rows; returns the summary dict (accuracy in pp)."""
    from .data.render import cut_counts, encode_pairs
    from .data.resolve import dataset_ref_for, resolve_dataset, row_subsets, with_skip_hint
    from .data.schema import DataError
    from .io import write_json_atomic, write_jsonl_atomic
    from .metrics.rewardbench import SCORERS
    from .metrics.stats import accuracy_interval, pairwise_accuracy

    ref = None
    try:
        ref = dataset_ref_for(data, fmt)
        res = resolve_dataset(ref, skip_invalid=skip_invalid)
    except DataError as e:
        if skip_invalid:
            raise
        raise with_skip_hint(e, ref=ref) from None
    rb_scorer = SCORERS.get(ref.format) if not ref.name else None
    if ref.format == "rewardbench2" and output_format == "rewardbench":
        raise ValueError(
            "--output-format rewardbench is RewardBench 1's layout; RewardBench 2 scores are printed and written to "
            "<out>.rewardbench.json with the default rows output"
        )
    pairs = res.pairs
    if not pairs:
        raise ValueError(f"{data}: no valid pairs to score")
    enc, n_trunc = encode_pairs(pairs, sm.tokenizer, max_length)
    cuts = cut_counts(enc)
    b = len(enc)
    seqs = [e.chosen.input_ids for e in enc] + [e.rejected.input_ids for e in enc]
    if rb_scorer is not None:  # a response shared by several pairs of a row is scored once: one reward each
        uniq: dict = {}
        inv = np.array([uniq.setdefault(tuple(x), len(uniq)) for x in seqs])
        r = score_token_sequences(sm, [list(k) for k in uniq], max_tokens, data=data)[inv]
    else:
        r = score_token_sequences(sm, seqs, max_tokens, data=data, pairs=b)
    rc, rr = r[:b], r[b:]
    correct = rc > rr
    acc = pairwise_accuracy(rc, rr)
    lo, hi = accuracy_interval(correct.astype(np.float64))  # the report's bootstrap (metrics.stats), seed 0
    if output_format == "rewardbench":
        subsets = row_subsets(data, fmt, pairs) if rb_scorer is None else [p.group.subset for p in pairs]
        rows = [
            {
                "id": p.id if p.id is not None else i,
                "subset": subsets[i],
                "results": int(correct[i]),
                "scores_chosen": float(rc[i]),
                "scores_rejected": float(rr[i]),
            }
            for i, p in enumerate(pairs)
        ]
        per_subset = {}
        for s in sorted(set(subsets)):
            m = np.array([x == s for x in subsets])
            per_subset[s] = float(correct[m].mean())
        results_path = out.with_name(out.name.removesuffix(".jsonl") + ".results.json")
        write_jsonl_atomic(out, rows)
        write_json_atomic(
            results_path,
            {
                "accuracy": float(correct.mean()),
                "num_prompts": b,
                "model": sm.source,
                "ref_model": None,
                "tokenizer": sm.source,
                "chat_template": None if getattr(sm.tokenizer, "chat_template", None) else "w2s-shift plain transcript",
                "extra_results": per_subset,
            },
        )
    else:
        results_path = None
        rows = [
            {
                "index": i,
                "id": p.id,
                "reward_chosen": float(rc[i]),
                "reward_rejected": float(rr[i]),
                "margin": float(rc[i] - rr[i]),
                "correct": bool(correct[i]),
            }
            for i, p in enumerate(pairs)
        ]
        write_jsonl_atomic(out, rows)
    rb = rb_scorer(pairs, rc, rr) if rb_scorer is not None else None
    rb_path = out.with_name(out.name.removesuffix(".jsonl") + ".rewardbench.json") if rb else None
    if rb:
        write_json_atomic(rb_path, rb)
    return {
        "model": sm.source,
        "data": data,
        "pairs": b,
        "accuracy_pp": acc,
        "ci95_pp": [lo, hi],
        "truncated_pairs": int(n_trunc),
        "response_cut_pairs": cuts["response_cut"],
        "response_cut_share": cuts["response_cut_share"],
        "max_length": max_length,
        "sequences_with_pad_id": _count_pad_inside(seqs, sm.pad_id),
        "skipped_rows": res.skipped.total,
        "out": str(out),
        **({"results": str(results_path)} if results_path else {}),
        **({"rewardbench": rb, "rewardbench_out": str(rb_path)} if rb else {}),
    }


def score_single_command(sm: ScoringModel, data: str, max_length: int, max_tokens: int, out: Path) -> dict:
    """Score single responses (:func:`~w2s_shift.data.resolve.load_single_responses`) and write
    ``{index, id, reward}`` rows; returns the summary."""
    from .data.render import encode
    from .data.resolve import load_single_responses
    from .io import write_jsonl_atomic

    items = load_single_responses(data)
    enc = [
        encode(p, resp, sm.tokenizer, max_length, where=f"{data} row {k + 1}") for k, (p, resp, _) in enumerate(items)
    ]
    seqs = [e.input_ids for e in enc]
    r = score_token_sequences(sm, seqs, max_tokens, data=data)
    write_jsonl_atomic(out, [{"index": i, "id": it[2], "reward": float(r[i])} for i, it in enumerate(items)])
    return {
        "model": sm.source,
        "data": data,
        "responses": len(items),
        "mean_reward": float(r.mean()),
        "std_reward": float(r.std()),
        "truncated": int(sum(e.truncated for e in enc)),
        "response_cut": int(sum(e.response_cut for e in enc)),
        "max_length": max_length,
        "sequences_with_pad_id": _count_pad_inside(seqs, sm.pad_id),
        "out": str(out),
    }


def _length_note(s: dict) -> str:
    src = s.get("max_length_source")
    return {"export": ", the length the model was trained at", "default": ", the default"}.get(src, "")


def format_summary(s: dict) -> str:
    """The printed summary of a score run."""
    lines = [f"model: {s['model']}", f"data: {s['data']}"]
    if "pairs" in s:
        lo, hi = s["ci95_pp"]
        lines += [
            f"pairs: {s['pairs']}" + (f" ({s['skipped_rows']} invalid rows skipped)" if s.get("skipped_rows") else ""),
            f"pairwise accuracy: {s['accuracy_pp']:.1f} pp "
            f"(95% bootstrap interval {lo:.1f}-{hi:.1f}; ties count as wrong)",
            f"truncated pairs: {s['truncated_pairs']} (at {s['max_length']} tokens{_length_note(s)}); share of pairs "
            f"whose response was cut: {100 * s.get('response_cut_share', 0.0):.1f}%",
        ]
    else:
        lines += [
            f"responses: {s['responses']}",
            f"mean reward: {s['mean_reward']:.4f} (std {s['std_reward']:.4f})",
            f"truncated: {s['truncated']} (at {s['max_length']} tokens{_length_note(s)}); responses cut: "
            f"{s.get('response_cut', 0)}",
        ]
    if s.get("rewardbench"):
        from .metrics.rewardbench import format_rewardbench

        lines += format_rewardbench(s["rewardbench"])
    lines.append(
        f"rewards: {s['out']}"
        + (f"; results: {s['results']}" if s.get("results") else "")
        + (f"; RewardBench scores: {s['rewardbench_out']}" if s.get("rewardbench_out") else "")
    )
    return "\n".join(lines)


def resolve_dtype(requested: str | None, export_info: dict | None) -> tuple:
    """The dtype ``score`` computes in, and a note to print (None: nothing to say).

    Rule: ``--dtype`` when given; else the precision the run scored the model in (``w2s_shift_export.json``,
    ``metadata.precision``: "bfloat16" or "float32"); else float32. A ``--dtype`` other than the run's precision is
    noted: rewards then differ slightly from the run's rewards files (a bfloat16 run computes under autocast, so
    even ``--dtype bfloat16`` is close, not equal; ``w2s-shift evaluate`` on the run directory reproduces them)."""
    ran = ((export_info or {}).get("metadata") or {}).get("precision")
    ran = ran if ran in ("float32", "bfloat16") else None
    if requested is None:
        return (ran or "float32"), (f"scoring in {ran}, the precision the run scored this model in" if ran else None)
    if ran and requested != ran:
        return requested, (
            f"--dtype {requested}: the run scored this model in {ran}; rewards differ slightly from the run's (to "
            "reproduce the report's numbers exactly, `w2s-shift evaluate RUN_DIR FILE` scores as the run did)"
        )
    return requested, None


def cmd_score(a) -> int:
    """The ``score`` sub-command (see the module docstring)."""
    output_format, fmt = a.output_format, a.format
    if fmt == "rewardbench":  # RewardBench 1 rows (prompt/chosen/rejected/subset); emit its output layout too
        output_format = "rewardbench"
    if a.max_length is not None and a.max_length < 2:
        raise ValueError(f"--max-length must be >= 2, got {a.max_length}")
    if a.max_tokens < 2:
        raise ValueError(f"--max-tokens must be >= 2, got {a.max_tokens}")
    if a.single and (fmt is not None or output_format == "rewardbench"):
        raise ValueError("--single reads rows with prompt and response; --format and rewardbench output apply to pairs")
    if a.single and not Path(a.data).is_file():
        raise ValueError(f"{a.data}: --single needs a data file (rows with prompt and response)")
    out = Path(a.out) if a.out else _default_out(a.data, a.single)
    if out.is_dir():
        raise ValueError(f"--out {out}: is a directory; give a .jsonl file")
    run_dir = enclosing_run_dir(out.parent)
    if run_dir is not None:  # a run's files (metrics.json, rewards, ...) have one writer: its own commands
        raise ValueError(
            f"--out {out}: lies in the run directory {run_dir}, whose files only w2s-shift run, evaluate, report, "
            "export and bon write (`w2s-shift evaluate RUN_DIR FILE` adds a set's rewards to a run); give a file "
            "outside it"
        )
    if Path(a.data).is_file():
        src = Path(a.data).resolve()
        for o in (out, out.with_suffix(".results.json"), out.with_suffix(".rewardbench.json")):
            if o.resolve() == src:
                raise ValueError(f"--out {out}: would overwrite the input file {a.data}; give another file")
    dtype, note = resolve_dtype(
        a.dtype, checked_export_info(resolve_model(a.model)) if Path(a.model).is_dir() else None
    )
    if note:
        print(f"w2s-shift: note: {note}", file=sys.stderr)
    sm = load_reward_model(
        a.model,
        dtype=dtype,
        trust_remote_code=a.trust_remote_code,
        allow_pickle=a.allow_pickle,
        allow_unused=a.allow_unused,
    )
    max_length, length_source, warns = resolve_max_length(a.max_length, sm.export_info, sm.max_positions)
    for w in warns:
        print(f"w2s-shift: warning: {w}", file=sys.stderr)
    if a.single:
        summary = score_single_command(sm, a.data, max_length, a.max_tokens, out)
    else:
        summary = score_pairs_command(sm, a.data, fmt, a.skip_invalid, max_length, a.max_tokens, out, output_format)
    summary["max_length_source"], summary["max_length_warnings"] = length_source, warns
    summary["dtype"] = dtype
    if summary["sequences_with_pad_id"]:
        print(
            f"w2s-shift: warning: {summary['sequences_with_pad_id']} sequences contain the pad id {sm.pad_id}; "
            "transformers reads the last token that is not padding, which there is not the last token",
            file=sys.stderr,
        )
    print(json.dumps(summary, indent=2) if a.json else format_summary(summary))
    return 0


def add_score_parser(sub) -> None:
    """Register ``score`` on the CLI's sub-parsers (:func:`w2s_shift.cli.build_parser`)."""
    from .data.registry import format_names

    s = sub.add_parser("score", help="rewards and pairwise accuracy of an exported reward model on a dataset")
    s.add_argument(
        "model",
        metavar="MODEL",
        help="an exported reward-model folder (AutoModelForSequenceClassification, "
        "num_labels 1), a run directory with one exported student, or a hub id",
    )
    s.add_argument(
        "data",
        metavar="NAME_OR_FILE",
        help="a name from `w2s-shift data list`, a pair file, or with --single a file of rows with prompt and response",
    )
    s.add_argument(
        "--format",
        default=None,
        help=f"row format of a pair file ({', '.join(format_names())}; default "
        "prompt_chosen_rejected); 'rewardbench' also selects RewardBench output",
    )
    s.add_argument(
        "--output-format",
        choices=OUTPUT_FORMATS,
        default="rows",
        help="rows: {index, id, reward_chosen, reward_rejected, margin, correct}; rewardbench: RewardBench v1 "
        "fields plus <out>.results.json",
    )
    s.add_argument("--single", action="store_true", help="score single responses (rows with prompt, response, id)")
    s.add_argument(
        "--out", metavar="FILE.jsonl", help="rewards file (default: <data stem>.rewards.jsonl in the current directory)"
    )
    s.add_argument(
        "--max-length",
        type=int,
        default=None,
        metavar="N",
        help="tokens per sequence (default: the length a w2s-shift export was trained at, else "
        f"{DEFAULT_MAX_LENGTH}; capped at the model's positions)",
    )
    s.add_argument("--max-tokens", type=int, default=8192, metavar="N", help="padded tokens per forward (default 8192)")
    s.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16"),
        default=None,
        help="compute dtype (default: the precision the run scored a w2s-shift export in, else float32)",
    )
    s.add_argument(
        "--skip-invalid", action="store_true", help="skip and count invalid rows instead of stopping at the first"
    )
    s.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="let a model folder's own Python code (auto_map) run; off by default, never asked on the terminal",
    )
    s.add_argument(
        "--allow-pickle",
        action="store_true",
        help="load .bin/.pt pickle checkpoints (they can run code; off by default)",
    )
    s.add_argument(
        "--allow-unused",
        action="store_true",
        help="score although the checkpoint holds weights its config.json does not use (refused by default)",
    )
    s.add_argument("--json", action="store_true", help="print the summary as JSON")
    s.set_defaults(func=cmd_score)
