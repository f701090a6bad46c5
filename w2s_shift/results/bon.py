"""``RUN/bon.json``, the best-of-n results of a run (:mod:`w2s_shift.pipeline.bon`), typed and read in one place."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from ..io import read_json
from .errors import RunDirError

#: layout version of bon.json
BON_FORMAT = 1


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow")


class BonCurve(_Model):
    """One model's best-of-n curve on one prompt set of one seed: at each n, the mean over prompts of the expected
    gold reward of the proxy's pick (gold units) with its 95% bootstrap interval over prompts, the gain over a
    random pick (gold(n) - gold(1), gold units, its interval from the same resamples), KL_bon (nats), and each
    prompt's expected gold (P, len(n)) for paired comparisons."""

    seed: int
    model: str
    set: str
    n: list[int]
    kl: list[float]
    gold: list[float]
    ci: list[list[float] | None]
    gain: list[float]
    gain_ci: list[list[float] | None]
    per_prompt: list[list[float]]
    prompts: int
    samples: int


class BonSet(_Model):
    """A prompt set's candidates: P prompts x N samples, the gold rewards' mean and standard deviation over all of
    them (the report's unit), and how the prompts were picked or which file they came from."""

    prompts: int
    samples: int
    gold_mean: float
    gold_sd: float


class BonOracle(_Model):
    """A model that is the gold judge itself (its curve is an oracle's, not a proxy's): its cell directory (relative
    to the run), its label, and why it is flagged."""

    cell: str
    model: str
    why: str


class BonSource(_Model):
    sets: dict[str, BonSet]
    curves: list[BonCurve]
    oracles: list[BonOracle] = []
    replaced: list[str] = []  # with responses from files: the sampled prompt sets they replace


class BonResult(_Model):
    bon_format: int
    settings: dict
    judge: str
    policy: str | None
    sources: dict[str, BonSource]
    models: dict[str, str]
    seconds: float

    def stale_models(self, run_dir) -> list:
        """Models scored here (``<cell dir>/<label>``) whose saved weights now carry another training digest (the
        run was retrained since): their curves are not the current models'."""
        out = []
        for key, digest in self.models.items():
            meta = Path(run_dir) / f"{key.rsplit('/', 1)[0]}/models/{key.rsplit('/', 1)[1]}.json"
            if not meta.is_file():
                continue  # a model that does not train (zero-shot) has no weights to change
            try:
                now = read_json(meta).get("digest")
            except (OSError, ValueError, AttributeError):
                now = None
            if now != digest:
                out.append(key)
        return out


def read_bon(run_dir) -> BonResult | None:
    """``RUN/bon.json`` validated, or None when the run has none.

    Raises:
        RunDirError: not JSON, a field missing or of the wrong type (named), or a newer layout than this version
            reads."""
    path = Path(run_dir) / "bon.json"
    if not path.is_file():
        return None
    try:
        data = read_json(path)
    except ValueError as e:
        raise RunDirError(f"{path}: not JSON ({e}); run `w2s-shift bon {run_dir}` again") from None
    if isinstance(data, dict) and isinstance(data.get("bon_format"), int) and data["bon_format"] > BON_FORMAT:
        raise RunDirError(f"{path}: bon_format {data['bon_format']} is newer than this w2s-shift reads ({BON_FORMAT})")
    try:
        return BonResult.model_validate(data)
    except ValidationError as e:
        x = e.errors()[0]
        where = ".".join(str(p) for p in x["loc"])
        raise RunDirError(f"{path}: field {where}: {x['msg']}; run `w2s-shift bon {run_dir}` again") from None


def versus(curves: list, model: str, reference: str, n_boot: int = 2000) -> dict | None:
    """``model`` minus ``reference`` in expected gold at the largest n on one prompt set, over every seed, by the
    claims' seeds-and-pairs interval (:func:`w2s_shift.metrics.significance.seed_pair_interval`): per seed the mean
    over prompts of the paired difference, the prompts resampled once for every seed (they share the candidates),
    so with several seeds the interval covers seed noise and with one it covers prompts only (``seed_noise`` False).

    Args:
        curves: :class:`BonCurve` of one set, any seeds.

    Returns:
        seed_pair_interval's dict ("value", "ci", "mde", "seed_noise", ... in gold units), or None when either model
        is missing in some seed."""
    import numpy as np

    from ..metrics.significance import seed_pair_interval

    seeds = sorted({c.seed for c in curves})
    by = {(c.seed, c.model): c for c in curves}
    if any((sd, m) not in by for sd in seeds for m in (model, reference)):
        return None
    d = np.array(
        [[a[-1] - b[-1] for a, b in zip(by[sd, model].per_prompt, by[sd, reference].per_prompt)] for sd in seeds]
    )
    idx = np.random.default_rng(0).integers(0, d.shape[1], size=(n_boot, d.shape[1]))
    replicates = d[:, idx].mean(axis=2).T  # (n_boot, seeds)
    return seed_pair_interval(d.mean(axis=1), replicates)
