"""The main job, a grid: for every source dataset x seed, a weak teacher -> soft labels -> strong students
(Naive, Confidence, SEAM, ANCHOR at each lambda and layer spec) + ceiling (+ zero-shot) -> ID/OOD tables.

Protocol (protocol.md; Burns et al. 2023; Le et al. 2026): each source dataset is split by prompt into
teacher-train (gold labels train the weak teacher), student-train (the teacher's soft labels train each
student; gold labels train the strong ceiling) and the ID test split; OOD targets are the other datasets,
never trained on. A grid row (source) loads each model once and computes the frozen trunk's states and the
ANCHOR reference states once for all seeds and methods. The teacher and its labels are computed once per
(source, teacher, seed) and reused by every student. Stages are split by what they depend on: a training stage
per model (teacher with its labels, SEAM labels, each student) keyed on its training inputs, and a scoring stage
per (model, evaluation set), so adding an OOD target to a config scores only. Each stage writes its files
atomically and a marker holding the hash of what it depends on last; a rerun skips finished stages, and a
killed stage resumes from its last training checkpoint (or from its saved weights when training had finished).

Layout: ``RUN/<source>/seed<k>/`` holds rewards/, teacher_labels.jsonl, logs/, drift/, models/ (trained
weights), stages/ and metrics.json; ``RUN/metrics.json``, ``report.md``, ``report.html``, ``plots/``.

Modules, in the order of the flow: :mod:`.rundir` (run directory, stage markers, digests), :mod:`.prepare` (splits
and OOD sets), :mod:`.featurizer` (loaded models, cached trunk states), :mod:`.preflight` (load checks before any
training), :mod:`.stages` (training stages: teacher and labels, SEAM, students), :mod:`.score_stage` (a scoring stage
per model and evaluation set, export), :mod:`.grid` (the whole grid: :func:`run`), :mod:`.snapshot` (a run still
going read through its finished seeds).
"""

from .featurizer import Featurizer, SourceContext
from .grid import describe_grid, run
from .preflight import load_check
from .prepare import load_ref, prepare_data, split_seed, split_shortfalls
from .rundir import RunDirError, Stage, claim_run_dir, prepare_run_dir, stale_stages, training_digest
from .score_stage import save_rewards, zero_shot_rewards

__all__ = [
    "Featurizer",
    "RunDirError",
    "SourceContext",
    "Stage",
    "claim_run_dir",
    "describe_grid",
    "load_check",
    "load_ref",
    "prepare_data",
    "prepare_run_dir",
    "run",
    "save_rewards",
    "split_seed",
    "split_shortfalls",
    "stale_stages",
    "training_digest",
    "zero_shot_rewards",
]
