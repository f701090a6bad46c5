"""``w2s-shift bon RUN_DIR``: best-of-n against a gold judge for every model of a finished run (evaluation only).

Per source: distinct prompts of the ID test split and of each OOD target (``bon.n_prompts`` each, a seeded choice
among those at most ``bon.max_prompt_tokens`` long), N = ``bon.n_samples`` responses each from the policy (sampled
once into ``RUN/bon/<source>/candidates/<set>.jsonl``, a journal a killed run resumes) or from ``bon.responses``
files; every model of every cell scores every candidate with the run's own scoring stages (the candidates enter as
pairs (r_1, r_2), (r_3, r_4), ... of an evaluation set ``bon-<set>``: ``rewards/<model>__bon-<set>.jsonl``), the
gold judge too (:mod:`w2s_shift.pipeline.gold`); then the exact best-of-n estimator
(:func:`w2s_shift.metrics.bon.best_of_n_curve`) gives each model's curve of gold reward against KL_bon with
bootstrap intervals over prompts. Writes ``RUN/bon.json`` (read by :func:`w2s_shift.results.bon.read_bon`) and
rebuilds the report (its best-of-n table and ``plots/<source>-bon.png``). Trains nothing but the synthetic gold.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import numpy as np

from .. import __version__
from ..config import BonConfig, RunConfig
from ..data.responses import candidate_pairs, read_responses_file, reward_matrix
from ..io import file_slug, read_jsonl, write_json_atomic
from ..metrics.bon import best_of_n_curve
from ..models.policy import EMPTY_RESPONSE
from ..results import open_run
from ..results.bon import BON_FORMAT, BonResult
from .evaluate import saved_models
from .featurizer import SourceContext
from .gold import gold_rewards, load_judge, synthetic_judge, train_synthetic_gold
from .rundir import RunDirError, fault, load_input_cache, log, refuse_links_out_of, stage_digest, stale_stages
from .score_stage import cell_scores

#: version of the candidate sampling and the candidate sets' layout (in their digests)
CANDIDATES_VERSION = 2


def bon_run(run_dir, settings: dict | None = None, wait: bool = False) -> dict:
    """Best-of-n for a finished run: see the module. ``settings`` override the run config's ``bon`` section;
    ``wait``: wait for another command holding the run directory to finish instead of refusing.

    Returns:
        bon.json's content.

    Raises:
        RunDirError: not a finished run, stages of other code, the lock held (and not ``wait``), saved weights
            missing.
        ConfigError / pydantic ValidationError: bad settings. DataError: a bad responses file or a prompt too long
            for the policy (file, row, field). ModelError: a policy that is not a causal LM, a bad judge.
    """
    from ..runlock import holding

    run_dir = Path(run_dir)
    run = open_run(run_dir, config=True)
    cfg = run.config
    bcfg = bon_settings(cfg, settings)
    refuse_set_name_clashes(cfg, run.metrics, bcfg)
    refuse_links_out_of(run_dir)
    stale = stale_stages(run_dir)
    if stale:
        raise RunDirError(
            f"{run_dir}: {len(stale)} finished stage(s) were computed by other w2s-shift code; rerun `w2s-shift run "
            f"{run_dir / 'config.yaml'} --output-dir {run_dir} --overwrite` first"
        )
    with holding(run_dir, wait=wait, command="bon"):
        run = open_run(run_dir, config=True)  # read again under the lock: another command may have written it
        fault("bon:read")
        return run_bon(run_dir, run.config, run.metrics, bcfg)


def bon_settings(cfg: RunConfig, settings: dict | None) -> BonConfig:
    """The run config's ``bon`` section with ``settings`` (``w2s-shift bon --set``) over it.

    Raises:
        ConfigError: every problem, one line each as ``run`` lists a config's (``bon.<field>: <message>``)."""
    from pydantic import ValidationError

    from ..config import ConfigError
    from ..config_io import format_errors

    try:
        return BonConfig.model_validate({**cfg.bon.model_dump(mode="json"), **(settings or {})})
    except ValidationError as e:
        lines = format_errors(e, "bon settings").splitlines()
        raise ConfigError("\n".join([lines[0], *(ln.replace("  - ", "  - bon.", 1) for ln in lines[1:])])) from None


def refuse_set_name_clashes(cfg: RunConfig, metrics: dict, bcfg: BonConfig) -> None:
    """Refuse a best-of-n set whose evaluation set ``bon-<set>`` has the name, up to case, of a dataset of the run
    (a source, a configured OOD target or one ``evaluate`` added, named so before such names were refused): both
    would write ``rewards/<model>__bon-<set>.jsonl``.

    Raises:
        ValueError: naming the set and the dataset."""
    datasets = [r.display for r in [*cfg.data.sources, *cfg.data.ood]]
    datasets += [e.get("name", "") for e in metrics.get("evaluated_targets") or []]
    taken = {str(n).casefold(): n for n in datasets}
    sets = list(bcfg.responses) or datasets[: len(cfg.data.sources) + len(cfg.data.ood)]
    for name in sets:
        other = taken.get(f"bon-{name}".casefold())
        if other is not None:
            raise ValueError(
                f"best-of-n set {name!r} would write the rewards files of the run's dataset {other!r} "
                f"(rewards/<model>__bon-{name}.jsonl); rename the prompt set (--responses NAME=FILE)"
            )


def run_bon(run_dir: Path, cfg: RunConfig, metrics: dict, bcfg: BonConfig) -> dict:
    """The work of :func:`bon_run` on an opened, locked run (also called by ``run`` when ``bon.enabled``)."""
    import transformers

    from ..models.precision import resolve_precisions
    from ..report import write_report

    transformers.logging.set_verbosity_error()
    t0 = time.time()
    cfg = resolve_precisions(cfg)  # bf16: auto -> this machine's precision, as the run's digests hold it
    load_input_cache(run_dir)
    # the run's models score the candidates at the best-of-n length; no drift or mechanism on candidate sets
    scfg = cfg.model_copy(
        update={
            "teacher": cfg.teacher.model_copy(update={"max_length": bcfg.max_length}),
            "student": cfg.student.model_copy(update={"max_length": bcfg.max_length}),
            "drift": False,
            "mechanism": False,
            "bon": bcfg,
        }
    )
    policy, sources, scored = None, {}, {}
    judge = load_judge(bcfg.gold) if bcfg.gold else None  # refused before anything is sampled or written
    given = {k: read_responses_file(v) for k, v in (bcfg.responses or {}).items()}  # every source's
    if given:
        log(
            f"best-of-n: candidates from files for the prompt sets {', '.join(given)}, for every source; nothing is "
            "sampled: they replace the sampled sets of every source's ID test split and OOD targets ("
            + "; ".join(f"{s.display}: {', '.join(replaced_sets(cfg, s))}" for s in cfg.data.sources)
            + ")"
        )
    for src in cfg.data.sources:
        ctx = SourceContext(scfg, src, run_dir)
        out_dir = run_dir / "bon" / file_slug(ctx.name)
        if bcfg.responses:
            cands = given
            origin = {k: {"file": str(v)} for k, v in bcfg.responses.items()}
        else:
            if policy is None:
                from ..models.policy import load_policy

                policy = load_policy(bcfg.policy)
            cands, origin = {}, {}
            for name, pairs in ctx.eval_sets.items():  # dataset names: file names as they are
                prompts, origin[name] = pick_prompts(policy, pairs, bcfg, where=f"{ctx.name}: set {name}")
                cands[name] = sample_set(policy, prompts, out_dir / "candidates" / f"{name}.jsonl", bcfg)
        sets = {}
        for name, cs in cands.items():
            if bcfg.ns and max(bcfg.ns) > len(cs[0].responses):
                raise ValueError(f"bon.ns {bcfg.ns}: set {name} has N = {len(cs[0].responses)} responses per prompt")
            set_name = f"bon-{name}"
            ctx.eval_sets[set_name] = candidate_pairs(cs, set_name)
            ctx.eval_digests[set_name] = stage_digest(_content_digest(cs), bcfg.max_length, CANDIDATES_VERSION)
            sets[set_name] = cs
        trained = None
        if bcfg.gold is None:
            train_ctx = SourceContext(cfg.model_copy(update={"drift": False}), src, run_dir)
            trained = train_synthetic_gold(train_ctx, out_dir, cfg.seeds[0], bcfg.gold_pairs, bcfg.seed)
            del train_ctx
        gold = gold_rewards(ctx, out_dir, sets, bcfg.gold, trained, judge)
        curves, mine = [], {}
        for cm in [c for c in metrics["cells"] if c["source"] == ctx.name]:
            cell_dir = run_dir / cm.get("dir", f"{cm['source']}/seed{cm['seed']}")
            for label, kind, digest in saved_models(cfg, cell_dir, cm):
                scored[f"{cell_dir.relative_to(run_dir)}/{label}"] = digest
                mine[f"{cell_dir.relative_to(run_dir)}/{label}"] = digest
                cell_scores(ctx, cell_dir, cm["seed"], label, kind, digest, sets=list(sets))
                for set_name, cs in sets.items():
                    rows = read_jsonl(cell_dir / "rewards" / f"{label}__{set_name}.jsonl")
                    proxy = reward_matrix(rows, len(cs), len(cs[0].responses))
                    curve = best_of_n_curve(proxy, gold[set_name], bcfg.ns, n_boot=cfg.bootstrap, seed=cm["seed"])
                    curves.append({"seed": cm["seed"], "model": label, "set": set_name[4:], **curve})
        g = {k[4:]: gold[k] for k in sets}
        sources[ctx.name] = {
            "sets": {
                k: {
                    **origin.get(k, {}),
                    "prompts": int(v.shape[0]),
                    "samples": int(v.shape[1]),
                    "gold_mean": float(v.mean()),
                    "gold_sd": float(v.std()),
                    "empty_responses": sum(r == EMPTY_RESPONSE for c in sets[f"bon-{k}"] for r in c.responses),
                }
                for k, v in g.items()
            },
            "curves": curves,
            "oracles": oracles(bcfg.gold, run_dir, mine),
            **({"replaced": replaced_sets(cfg, src)} if bcfg.responses else {}),
        }
        ctx = None
    result = BonResult.model_validate(
        {
            "bon_format": BON_FORMAT,
            "settings": bcfg.model_dump(mode="json"),
            "judge": bcfg.gold or synthetic_judge(bcfg.gold_pairs),
            "policy": None if bcfg.responses else bcfg.policy,
            "sources": sources,
            "models": scored,
            "seconds": round(time.time() - t0, 1),
            "w2s_shift_version": __version__,
        }
    )
    out = result.model_dump(mode="json")
    write_json_atomic(run_dir / "bon.json", out)
    write_report(run_dir, metrics)
    log(f"best-of-n: {run_dir / 'bon.json'} and the report's best-of-n table in {time.time() - t0:.0f} s")
    return out


def replaced_sets(cfg: RunConfig, src) -> list:
    """The prompt sets a source would sample (its ID test split and its OOD targets) that ``--responses`` replaces."""
    return [src.display, *[o.display for o in cfg.data.ood_for(src)]]


def oracles(judge: str | None, run_dir: Path, scored: dict) -> list:
    """The models of the run that are the external gold judge itself, so that their best-of-n curve is an oracle's:
    the judge folder is an export of the model (its ``w2s_shift_export.json`` has the model's weights digest), or its
    ``model.safetensors`` has the content of the model's export in the run (``<cell>/export/<label>/``; a copy
    without the marker).

    Args:
        judge: ``bon.gold`` (None: the synthetic gold, trained apart, never flagged). scored: {"<cell dir>/<label>":
            weights digest} of the models scored.

    Returns:
        [{"cell", "model", "why"}] (``cell`` the cell directory relative to the run)."""
    if judge is None or not Path(judge).is_dir():
        return []
    from ..io import file_sha256
    from ..models.export import read_export_info

    digest = ((read_export_info(judge) or {}).get("metadata") or {}).get("weights_digest")
    weights = Path(judge) / "model.safetensors"
    content = file_sha256(weights) if weights.is_file() else None
    out = []
    for key, d in scored.items():
        cell, label = key.rsplit("/", 1)
        export = run_dir / cell / "export" / label / "model.safetensors"
        if digest is not None and d == digest:
            why = "the judge is its export: the same weights digest in w2s_shift_export.json"
        elif content is not None and export.is_file() and file_sha256(export) == content:
            why = f"the judge's model.safetensors has the content of {cell}/export/{label}/model.safetensors"
        else:
            continue
        out.append({"cell": cell, "model": label, "why": why})
    return out


def pick_prompts(policy, pairs: list, bcfg: BonConfig, where: str = "best-of-n") -> tuple:
    """``bcfg.n_prompts`` distinct prompts of an evaluation set's pairs: the pairs in a seeded random order, the
    first of each prompt (:meth:`~w2s_shift.data.schema.PreferencePair.prompt_key`) kept when its policy tokens are
    at most ``bcfg.max_prompt_tokens``.

    Returns:
        ([(prompt id, prompt)], {"distinct_prompts", "too_long", "picked"}).

    Raises:
        ValueError: no prompt fits ``bcfg.max_prompt_tokens`` (``where``, the shortest prompt's length named)."""
    from ..models.policy import prompt_ids

    order = np.random.default_rng(bcfg.seed).permutation(len(pairs))
    seen, picked, too_long, shortest = set(), [], 0, None
    for i in order:
        p = pairs[int(i)]
        key = p.prompt_key()
        if key in seen:
            continue
        seen.add(key)
        if len(picked) >= bcfg.n_prompts:
            continue
        n_tokens = len(prompt_ids(policy, p.prompt))
        if n_tokens > bcfg.max_prompt_tokens:
            too_long += 1
            shortest = n_tokens if shortest is None else min(shortest, n_tokens)
            continue
        picked.append((p.id or f"pair{int(i) + 1}", p.prompt))
    if not picked:
        raise ValueError(
            f"{where}: none of its {len(seen)} distinct prompts has at most bon.max_prompt_tokens "
            f"{bcfg.max_prompt_tokens} policy tokens (the shortest has {shortest}); raise bon.max_prompt_tokens"
        )
    if len(picked) < bcfg.n_prompts:
        log(f"best-of-n: {len(picked)} prompts of {bcfg.n_prompts} asked ({too_long} longer than max_prompt_tokens)")
    return picked, {"distinct_prompts": len(seen), "too_long": too_long, "picked": len(picked)}


def sample_set(policy, prompts: list, journal: Path, bcfg: BonConfig) -> list:
    """The candidates of one prompt set (:func:`~w2s_shift.models.policy.sample_candidates`), keyed on the policy
    (its files' content), the sampling settings, the prompts and this code's version."""
    from ..models.policy import sample_candidates
    from .rundir import model_content

    settings = bcfg.model_dump(
        mode="json", include={"policy", "n_samples", "max_new_tokens", "temperature", "top_p", "batch_size", "seed"}
    )
    digest = stage_digest(
        settings, model_content(bcfg.policy), [[i, p] for i, p in prompts], CANDIDATES_VERSION, __version__
    )
    return sample_candidates(
        policy,
        prompts,
        journal,
        digest=digest,
        n_samples=bcfg.n_samples,
        max_new_tokens=bcfg.max_new_tokens,
        temperature=bcfg.temperature,
        top_p=bcfg.top_p,
        batch_size=bcfg.batch_size,
        seed=bcfg.seed,
        where=journal.stem,
    )


def _content_digest(cands: list) -> str:
    h = hashlib.sha256()
    for c in cands:
        h.update(json.dumps([c.id, c.prompt, c.responses], ensure_ascii=False).encode())
    return h.hexdigest()
