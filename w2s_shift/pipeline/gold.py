"""The gold judge of best-of-n: an external reward model (folder or hub id, loaded as ``w2s-shift score`` loads
one), or a synthetic gold, the run's student architecture trained like the ceiling on every gold pair of the
source (Gao et al. 2022 train their gold reward model the same way: a larger RM on more human labels stands in for
humans). Its rewards of each candidate set are cached beside the best-of-n results, keyed on the judge and the set."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..data.render import encode
from ..data.responses import reward_matrix
from ..io import read_json, read_jsonl, write_json_atomic
from ..methods import method_entry, method_objective
from ..models.state import load_trained_state, saved_weights_problem
from ..training import train_pairs
from ..versions import stage_versions
from .featurizer import SourceContext
from .rundir import log, model_content, model_identity, stage_digest
from .score_stage import save_rewards, score_set
from .stages import train_args, trained_or_train

SYNTHETIC = "synthetic gold (ceiling retrained on every gold pair of the source)"


def synthetic_judge(n_pairs: int | None) -> str:
    """The synthetic gold as bon.json and the report name it: on every gold pair of the source, or on
    ``bon.gold_pairs`` of them (:func:`gold_training_pairs`)."""
    if n_pairs is None:
        return SYNTHETIC
    return (
        f"synthetic gold (ceiling retrained on a seeded sample of {n_pairs} of the source's gold pairs, "
        "bon.gold_pairs; on all of them where the source has fewer)"
    )


def gold_training_pairs(ctx: SourceContext, n_pairs: int | None = None, seed: int = 0) -> list:
    """The gold pairs of the run's source the synthetic gold trains on: its teacher-train, student-train and ID test
    splits (P,), or a seeded sample of ``n_pairs`` of them (in their order; all when ``n_pairs`` is None or at
    least P)."""
    pairs = [*ctx.splits["teacher_train"], *ctx.splits["student_train"], *ctx.splits["test"]]
    if n_pairs is None or n_pairs >= len(pairs):
        return pairs
    keep = np.sort(np.random.default_rng(seed).choice(len(pairs), n_pairs, replace=False))
    return [pairs[int(i)] for i in keep]


def train_synthetic_gold(
    train_ctx: SourceContext, out_dir: Path, seed: int, n_pairs: int | None = None, sample_seed: int = 0
):
    """Train (or load, when trained earlier with the same inputs) the synthetic gold: the student model trained with
    the ceiling's objective (gold labels, Bradley-Terry) on :func:`gold_training_pairs` (``n_pairs`` of them drawn
    with ``sample_seed``, ``bon.gold_pairs`` and ``bon.seed``; None: all), with the student's training settings.
    ``train_ctx``: the run's own source context (the student's training length). Logs what it trains on, and the
    training shows a progress bar labelled ``synthetic gold (<source>)``.

    Returns:
        (path of the weights, training digest)."""
    cfg = train_ctx.cfg
    pairs = gold_training_pairs(train_ctx, n_pairs, sample_seed)
    every = len(gold_training_pairs(train_ctx))
    ceiling = method_entry("ceiling")
    which = "gold: all splits" if len(pairs) == every else ["gold: a sample of all splits", len(pairs), sample_seed]
    digest = stage_digest(train_ctx.data_digest, model_identity(cfg.student), seed, which, stage_versions("student"))
    path = out_dir / "gold.safetensors"
    if _trained_earlier(path, digest):  # nothing to build: the gold's rewards load these weights when they need them
        log(f"{train_ctx.name}: synthetic gold trained earlier on {len(pairs)} gold pairs, reusing its weights")
        return path, digest
    sf = train_ctx.student()
    model = sf.new_model(seed)
    ds = sf.dataset("gold_train", pairs, [1.0] * len(pairs))
    steps = cfg.student.epochs * len(pairs) / cfg.student.batch_size  # batch_size: pairs per optimizer step
    log(
        f"{train_ctx.name}: synthetic gold: the student trained on gold labels of {len(pairs)} of the source's "
        f"{every} gold pairs ({'every split' if len(pairs) == every else 'a sample, bon.gold_pairs'}; "
        f"{cfg.student.epochs:g} epoch(s), about {max(1, round(steps))} optimizer steps)"
    )
    trained_or_train(
        model,
        path,
        digest,
        lambda: train_pairs(
            model,
            ds,
            sf.pad_id,
            train_args(cfg.student, seed, cfg, f"synthetic gold ({train_ctx.name})", model),
            str(out_dir / "checkpoints" / f"gold-{digest[:8]}"),
            callbacks=[],
            objective=method_objective(ceiling),
        ),
    )
    sf.forget({"gold_train"})
    return path, digest


def _trained_earlier(path: Path, digest: str) -> bool:
    """Whether ``path`` holds the synthetic gold of training digest ``digest``, saved whole (its marker beside it and
    its header's digest: :func:`w2s_shift.models.state.saved_weights_problem`)."""
    try:
        marker = read_json(path.with_suffix(".json"))
    except (OSError, ValueError):
        return False
    return isinstance(marker, dict) and marker.get("digest") == digest and saved_weights_problem(path, digest) is None


def gold_rewards(ctx: SourceContext, out_dir: Path, sets: dict, judge: str | None, trained=None, sm=None) -> dict:
    """The gold judge's rewards (P, N) of each candidate set, cached in ``out_dir/rewards/gold__<set>.jsonl``,
    keyed in ``gold__<set>.json`` (the judge's digest and the set's identity): a rerun with both unchanged reads
    them.

    Args:
        ctx: the scoring context (the candidate sets registered in ``ctx.eval_sets`` / ``ctx.eval_digests``).
        sets: {eval set name: [Candidates]}. judge: None (synthetic: ``trained`` = (weights, digest)) or a reward
            model folder / hub id (``sm``: it loaded by :func:`load_judge`, else loaded here).

    Raises:
        ModelError: the judge cannot be loaded, is not a one-label sequence classifier, or its tokenizer has more
            tokens than its embedding has rows (another model's tokenizer).
    """
    out = {}
    model = None
    # the judge's identity: the synthetic gold's training digest, or the external judge's name and files' content
    key_judge = stage_digest(trained[1]) if judge is None else stage_digest(judge, model_content(judge))
    for name, cands in sets.items():
        rfile, kfile = out_dir / "rewards" / f"gold__{name}.jsonl", out_dir / f"gold__{name}.json"
        key = stage_digest(key_judge, ctx.eval_digests[name])
        p, n = len(cands), len(cands[0].responses)
        try:
            if read_json(kfile).get("key") == key:
                out[name] = reward_matrix(read_jsonl(rfile), p, n)
                continue
        except (OSError, ValueError, KeyError, TypeError):
            pass
        pairs = ctx.eval_sets[name]
        if judge is None:
            sf = ctx.student()
            if model is None:
                model = sf.new_model(0)
                load_trained_state(model, trained[0], digest=trained[1])
                model.eval()
            log(f"{ctx.name}: gold judge scores {name} ({p} prompts x {n} responses)")
            r = score_set(sf, model, name, pairs, "gold")
        else:
            sm = sm or load_judge(judge)
            r = _judge_scores(sm, pairs, ctx.cfg.bon.max_length, name)
        save_rewards(out_dir, "gold", name, pairs, r)
        write_json_atomic(
            kfile, {"key": key, "judge": judge or synthetic_judge(ctx.cfg.bon.gold_pairs), "prompts": p, "samples": n}
        )
        out[name] = reward_matrix(read_jsonl(rfile), p, n)
    return out


def load_judge(judge: str):
    """The external gold judge, loaded and checked as ``w2s-shift score`` loads a reward model.

    Raises:
        ModelError: as :func:`~w2s_shift.score_model.load_reward_model` (e.g. a tokenizer of another model)."""
    from ..score_model import load_reward_model

    return load_reward_model(judge)


def _judge_scores(sm, pairs: list, max_length: int, name: str) -> np.ndarray:
    """Rewards (2B,) of the candidate pairs by an external judge, rendered and truncated as ``score`` does (a
    tokenizer that is not the judge's own was refused when it loaded: :func:`~w2s_shift.score_model.load_reward_model`).
    """
    from ..score import score_token_sequences

    length = min(max_length, sm.max_positions or max_length)
    enc = [encode(p.prompt, p.chosen, sm.tokenizer, length, where=f"{name} {p.id}") for p in pairs]
    enc += [encode(p.prompt, p.rejected, sm.tokenizer, length, where=f"{name} {p.id}") for p in pairs]
    seqs = [e.input_ids for e in enc]
    log(f"gold judge {sm.source} scores {name} ({len(seqs)} responses)")
    return score_token_sequences(sm, seqs, data=name, pairs=len(pairs))
