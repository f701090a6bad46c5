"""Worker of tests/test_distributed.py: run once plainly (one process) and once under
``accelerate launch --config_file w2s_shift/configs/accelerate/cpu-2proc.yaml`` (two gloo processes).

It (a) scores 61 sequences with a tiny random-init Llama reward model through
:func:`w2s_shift.distributed.score_sequences_sharded` (61 is odd, so one shard gets a padding slot),
checks that a shard set with a missing or a doubled index is refused on every process, that a scoring function
failing on one process makes every process raise (none hangs), and writes a file through :func:`run_on_main`; then (b)
trains the same model with :func:`w2s_shift.training.train_pairs` on 24 soft-labelled
pairs (global batch 4, 2 epochs: 12 optimizer steps) recording which pairs each process took at each step,
and scores the 61 sequences again. The first scoring runs once more, handing back the pooled states too. The
main process writes everything to ``--out`` as JSON.

Usage: python tests/dist_worker.py --model-dir DIR --out FILE --work DIR
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

import torch
from accelerate.utils import gather_object

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from w2s_shift import distributed as D  # noqa: E402
from w2s_shift.data.render import Encoded, EncodedPair  # noqa: E402
from w2s_shift.io import write_json_atomic  # noqa: E402
from w2s_shift.models.reward_model import RewardModel  # noqa: E402
from w2s_shift.training import PairDataset, PairTrainingArguments, train_pairs  # noqa: E402

N_EVAL_PAIRS, N_TRAIN, BATCH, EPOCHS = 31, 24, 4, 2


def encoded_pairs(tok, n: int, offset: int) -> list:
    """n pairs from the bundled UltraFeedback subset: prompt (<= 20 tokens) + response (<= 20 tokens) + eos."""
    f = ROOT / "w2s_shift" / "data" / "bundled" / "ultrafeedback_binarized_subset" / "eval_clean.jsonl.gz"
    out = []
    with gzip.open(f, "rt", encoding="utf-8") as fh:
        rows = [json.loads(line) for _, line in zip(range(offset + n), fh)][offset:]
    for r in rows:
        p = tok(r["prompt"], add_special_tokens=False)["input_ids"][:20]

        def enc(resp: str, p=p) -> Encoded:
            ids = tok(resp, add_special_tokens=False)["input_ids"][:20] + [tok.eos_token_id]
            return Encoded(input_ids=p + ids, response_mask=[0] * len(p) + [1] * len(ids), truncated=False)

        out.append(EncodedPair(enc(r["chosen"]), enc(r["rejected"])))
    return out


def new_model(model_dir: str) -> RewardModel:
    from transformers import AutoModel

    torch.manual_seed(0)
    backbone = AutoModel.from_pretrained(model_dir)
    return RewardModel(backbone, backbone.config.hidden_size)


class LoggedDataset(PairDataset):
    """A PairDataset that records which pair indices this process fetched, in order."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.seen: list = []

    def __getitem__(self, i: int) -> dict:
        self.seen.append(int(i))
        return super().__getitem__(i)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    torch.set_num_threads(1)
    import transformers
    from transformers import AutoTokenizer

    transformers.logging.set_verbosity_error()
    tok = AutoTokenizer.from_pretrained(a.model_dir)
    rank, ws = D.init_distributed()

    # (a) sharded scoring of an odd number of sequences
    ev = encoded_pairs(tok, N_EVAL_PAIRS, 0)
    seqs = [p.chosen.input_ids for p in ev] + [p.rejected.input_ids for p in ev][:-1]  # 61 sequences
    model = new_model(a.model_dir)
    before = D.score_sequences_sharded(model, seqs, tok.pad_token_id, max_tokens=256)
    # the scoring pass that also hands back each sequence's pooled state (the mechanism stage's features)
    with_r, pooled = D.score_sequences_sharded(model, seqs, tok.pad_token_id, max_tokens=256, with_pooled=True)
    own, _ = D.split_indices(len(seqs))
    broken = [i for i in own if i != 7]  # index 7 lost on whichever process holds it
    doubled = own + ([30] if rank == ws - 1 else [])  # index 30 claimed again by the last process
    errors = []
    for idx in (broken, doubled):
        try:
            D.gather_in_order([0.0] * len(idx), idx, len(seqs))
            errors.append(None)
        except ValueError as e:
            errors.append(str(e))
    broken_error, doubled_error = errors

    def fails_on_last(xs: list) -> list:
        if rank == ws - 1:
            raise ValueError("boom on the last process")
        return [0.0] * len(xs)

    try:
        D.sharded(fails_on_last, list(range(5)))
        failure_seen = None
    except (ValueError, RuntimeError) as e:
        failure_seen = f"{type(e).__name__}: {e}"
    # every process decides alike from its own free memory: the smallest value, None if any process cannot tell
    agreed = [D.min_over_processes(1000 - rank), D.min_over_processes(None if rank == ws - 1 else 5)]
    marker = Path(a.work) / f"main-wrote-{ws}.json"
    D.run_on_main(write_json_atomic, marker, {"world": ws})
    marker_seen_after_barrier = marker.is_file()

    # (b) training: same data, seed and global batch
    tr = encoded_pairs(tok, N_TRAIN, N_EVAL_PAIRS)
    labels = [0.15 + 0.7 * ((i * 7) % 11) / 10 for i in range(N_TRAIN)]
    ds = LoggedDataset(tr, labels)
    cfg = PairTrainingArguments(
        num_train_epochs=EPOCHS,
        batch_size=BATCH,
        learning_rate=3e-3,
        warmup_ratio=0.0,
        logging_steps=1,
        length_group_size=2,
        seed=0,
        checkpoint_fraction=0.0,
        packing=False,
    )
    model = new_model(a.model_dir)
    hist = train_pairs(model, ds, tok.pad_token_id, cfg, str(Path(a.work) / f"trainer-{ws}"))
    after = D.score_sequences_sharded(model, seqs, tok.pad_token_id, max_tokens=256)

    seen = gather_object([ds.seen])
    if D.is_main_process():
        write_json_atomic(
            a.out,
            {
                "world": ws,
                "rewards_before": before.tolist(),
                "rewards_with_pooled": with_r.tolist(),
                "pooled": pooled.tolist(),
                "rewards_after": after.tolist(),
                "broken_error": broken_error,
                "doubled_error": doubled_error,
                "marker_seen_after_barrier": marker_seen_after_barrier,
                "failure_seen": failure_seen,
                "agreed": agreed,
                "seen": seen,
                "per_device_batch": BATCH // ws,
                "loss": [h["loss"] for h in hist if "loss" in h],
                "loss_w2s": [h["loss_w2s"] for h in hist if "loss_w2s" in h],
                "steps": max(h.get("step", 0) for h in hist),
            },
        )
    else:  # the other process reports what it saw too, for the broken-gather check
        write_json_atomic(
            Path(a.out).with_suffix(f".rank{rank}.json"),
            {
                "broken_error": broken_error,
                "doubled_error": doubled_error,
                "marker_seen_after_barrier": marker_seen_after_barrier,
                "failure_seen": failure_seen,
                "agreed": agreed,
                "rewards_before": before.tolist(),
                "rewards_with_pooled": with_r.tolist(),
                "pooled": pooled.tolist(),
            },
        )
    D.barrier()


if __name__ == "__main__":
    main()
    D.end_process(0)  # as the command line ends a launched process
