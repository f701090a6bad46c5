"""Scoring pairs, pairwise accuracy and the W2S-under-shift metrics (bootstrap intervals: :mod:`w2s_shift.diagnostics`).

Metrics (Le et al. 2026, arXiv 2605.25629, Sec. "Evaluation"; PGR from Burns et al. 2023), accuracies in
percentage points (pp):
  WRG = Acc_student(ID) - Acc_teacher(ID)
  AOG_t = Acc_student(t) - Acc_teacher(t) for each OOD target t; AOG = mean over targets
  NTS = AOG - max(0, Acc_teacher(ID) - Acc_student(ID))
  PGR = (Acc_student - Acc_teacher) / (Acc_ceiling - Acc_teacher)
"""

from __future__ import annotations

import numpy as np
import torch
from tqdm.auto import tqdm


def _batches_by_tokens(lengths: list, max_tokens: int, max_rows: int = 64) -> list:
    """Index batches in descending length with at most ``max_tokens`` padded tokens each."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    out, cur, cur_max = [], [], 0
    for i in order:
        new_max = max(cur_max, lengths[i])
        if cur and (new_max * (len(cur) + 1) > max_tokens or len(cur) >= max_rows):
            out.append(cur)
            cur, new_max = [], lengths[i]
        cur.append(i)
        cur_max = new_max
    if cur:
        out.append(cur)
    return out


def _device(module: torch.nn.Module) -> torch.device:
    p = next(module.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def _autocast(enabled: bool):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.autocast(device, dtype=torch.bfloat16, enabled=enabled)


def _pad(seqs: list, pad_id: int) -> tuple:
    t = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), t), pad_id, dtype=torch.long)
    am = torch.zeros((len(seqs), t), dtype=torch.long)
    for k, s in enumerate(seqs):
        ids[k, : len(s)] = torch.tensor(s)
        am[k, : len(s)] = 1
    return ids, am


def _batch_inputs(seqs: list, states: list | None, b: list, pad_id: int, dev) -> dict:
    """Model inputs for the sequences ``b``: ``input_ids`` or, with cached trunk states, ``inputs_embeds``
    (len(b), T, H) float32; always ``attention_mask`` (len(b), T)."""
    ids, am = _pad([seqs[i] for i in b], pad_id)
    if states is None:
        return {"input_ids": ids.to(dev), "attention_mask": am.to(dev)}
    emb = torch.zeros((len(b), ids.shape[1], states[b[0]].shape[-1]), dtype=torch.float32)
    for k, i in enumerate(b):
        emb[k, : states[i].shape[0]] = states[i].float()
    return {"inputs_embeds": emb.to(dev), "attention_mask": am.to(dev)}


@torch.no_grad()
def compute_trunk_states(
    trunk: torch.nn.Module,
    seqs: list,
    pad_id: int,
    max_tokens: int = 8192,
    dtype: torch.dtype = torch.bfloat16,
    desc: str = "trunk states",
) -> list:
    """Run the frozen trunk once over token sequences; return each sequence's states (T_i, H) in ``dtype``.

    Args:
        trunk: module returning ``last_hidden_state`` (N, T, H) from ``input_ids``/``attention_mask``.
        seqs: list of token id lists.
        max_tokens: padded tokens per forward.
        dtype: storage dtype (bfloat16 halves memory; the trunk also runs in it when it is bfloat16).
    """
    out: list = [None] * len(seqs)
    trunk.eval()
    dev = _device(trunk)
    for b in tqdm(_batches_by_tokens([len(s) for s in seqs], max_tokens), desc=desc, leave=False):
        ids, am = (x.to(dev) for x in _pad([seqs[i] for i in b], pad_id))
        h = trunk(input_ids=ids, attention_mask=am, use_cache=False).last_hidden_state
        for k, i in enumerate(b):
            out[i] = h[k, : len(seqs[i])].to("cpu", dtype).clone()
    return out


@torch.no_grad()
def score_sequences(
    model: torch.nn.Module,
    seqs: list,
    pad_id: int,
    states: list | None = None,
    max_tokens: int = 8192,
    desc: str = "scoring",
    bf16: bool = False,
) -> np.ndarray:
    """Rewards r(x, y) of token sequences, in input order.

    Args:
        model: a :class:`~w2s_shift.models.reward_model.RewardModel`.
        seqs: list of token id lists (N sequences).
        states: optional cached trunk states per sequence (then ``model`` is a split head).
        bf16: run under bfloat16 autocast (as in training).

    Returns:
        (N,) float64 rewards.
    """
    model.eval()
    dev = _device(model)
    out = np.zeros(len(seqs), dtype=np.float64)
    for b in tqdm(_batches_by_tokens([len(s) for s in seqs], max_tokens), desc=desc, leave=False):
        inputs = _batch_inputs(seqs, states, b, pad_id, dev)
        with _autocast(bf16):
            r, _ = model(**inputs)
        out[b] = r.double().cpu().numpy()
    return out


def pairwise_accuracy(chosen: np.ndarray, rejected: np.ndarray) -> float:
    """Share of pairs with r(chosen) > r(rejected), in pp; ties count as wrong. Inputs: (B,) each."""
    chosen, rejected = np.asarray(chosen), np.asarray(rejected)
    if chosen.shape != rejected.shape or chosen.size == 0:
        raise ValueError("pairwise_accuracy needs two non-empty arrays of the same shape")
    return float(100.0 * np.mean(chosen > rejected))


def w2s_metrics(acc: dict, id_name: str, ood_names: list, teacher: str, student: str, ceiling: str | None) -> dict:
    """WRG, AOG (per target and mean), NTS and PGR of ``student`` against ``teacher`` (and ``ceiling``).

    Args:
        acc: {model: {dataset: accuracy in pp}}.
        id_name: the ID test set's name; ood_names: OOD target names.

    Returns:
        {"WRG": pp, "AOG": {target: pp}, "AOG_mean": pp, "NTS": pp, "PGR": {dataset: ratio or None}}.
        PGR is None where the ceiling does not beat the teacher (the ratio is then meaningless).
    """
    s, t = acc[student], acc[teacher]
    wrg = s[id_name] - t[id_name]
    aog = {d: s[d] - t[d] for d in ood_names}
    aog_mean = float(np.mean(list(aog.values()))) if aog else float("nan")
    nts = aog_mean - max(0.0, t[id_name] - s[id_name])
    pgr = {}
    if ceiling is not None:
        for d in [id_name, *ood_names]:
            gap = acc[ceiling][d] - t[d]
            pgr[d] = (s[d] - t[d]) / gap if gap > 0 else None
    return {"WRG": wrg, "AOG": aog, "AOG_mean": aog_mean, "NTS": nts, "PGR": pgr}


def finite_or_raise(values: np.ndarray, what: str) -> None:
    """Raise ValueError if any reward is NaN/inf, so that no NaN reaches a metric."""
    bad = ~np.isfinite(values)
    if bad.any():
        raise ValueError(f"{what}: {int(bad.sum())} non-finite rewards (first at index {int(np.argmax(bad))})")


__all__ = ["compute_trunk_states", "score_sequences", "pairwise_accuracy", "w2s_metrics"]


@torch.no_grad()
def compute_reference_states(
    backbone: torch.nn.Module,
    seqs: list,
    response_masks: list,
    pad_id: int,
    states: list | None = None,
    max_tokens: int = 8192,
    dtype: torch.dtype = torch.bfloat16,
    desc: str = "reference states",
    bf16: bool = False,
    layers: list | None = None,
    layer_offset: int = 0,
) -> list:
    """ANCHOR reference states computed once: the frozen backbone's outputs on response tokens only.

    Args:
        backbone: the reference (pre-training copy) returning ``last_hidden_state``.
        seqs: N token id lists; response_masks: N lists of 0/1 (1 on response tokens).
        states: optional cached trunk states (then ``backbone`` is a split head taking inputs_embeds).
        layers: 1-based global blocks (see :func:`~w2s_shift.models.reward_model.select_layers`); None: the last
            layer's normalized output. layer_offset: blocks below ``backbone`` (a split head's trunk).

    Returns:
        N tensors (R_i, H) in ``dtype`` (``layers`` None) or (R_i, K, H) for K layers; R_i = number of response
        tokens of sequence i.
    """
    from .models.reward_model import select_layers

    out: list = [None] * len(seqs)
    backbone.eval()
    dev = _device(backbone)
    for b in tqdm(_batches_by_tokens([len(s) for s in seqs], max_tokens), desc=desc, leave=False):
        inputs = _batch_inputs(seqs, states, b, pad_id, dev)
        with _autocast(bf16):
            o = backbone(**inputs, use_cache=False, output_hidden_states=layers is not None)
        h = o.last_hidden_state if layers is None else torch.stack(select_layers(o, layers, layer_offset), dim=2)
        for k, i in enumerate(b):
            m = torch.tensor(response_masks[i], dtype=torch.bool, device=h.device)
            out[i] = h[k, : len(seqs[i])][m].to("cpu", dtype).clone()
    return out


class DriftProbe:
    """Representation drift of a trained model from its pretrained reference on a fixed probe set (Le et al. 2026:
    OOD loss comes with drift of the representation the head reads; ANCHOR limits it).

    The reference's outputs at ``layers`` on the probe's response tokens are computed once at construction;
    :meth:`measure` runs a model on the same inputs and returns, per layer, the relative squared error
    sum ||h - h_ref||^2 / sum ||h_ref||^2 and linear CKA (Kornblith et al. 2019) over all response tokens.

    Args:
        reference: the pretrained backbone (or split head) the student started from.
        seqs, masks: N token id lists and their response masks; states: cached trunk states or None.
        layers: 1-based global blocks; layer_offset: blocks below ``reference``.
    """

    CKA_MAX_TOKENS = 8192

    def __init__(
        self,
        reference: torch.nn.Module,
        seqs: list,
        masks: list,
        states: list | None,
        pad_id: int,
        layers: list,
        layer_offset: int,
        max_tokens: int,
        bf16: bool,
    ):
        self.seqs, self.masks, self.states, self.pad_id = seqs, masks, states, pad_id
        self.layers, self.max_tokens, self.bf16 = list(layers), max_tokens, bf16
        ref = compute_reference_states(
            reference,
            seqs,
            masks,
            pad_id,
            states=states,
            max_tokens=max_tokens,
            dtype=torch.bfloat16 if bf16 else torch.float32,
            bf16=bf16,
            layers=self.layers,
            layer_offset=layer_offset,
            desc="drift reference",
        )
        self.ref = torch.cat(ref, 0)  # (R, K, H) over all response tokens

    @torch.no_grad()
    def measure(self, model: torch.nn.Module) -> dict:
        """{"<layer>": {"rel_sq_err": float, "cka": float}} of ``model`` (a RewardModel) against the reference."""
        from .diagnostics import linear_cka, relative_squared_error

        was_training = model.training
        model.eval()
        dev = _device(model)
        chunks = []
        try:
            for b in sorted(_batches_by_tokens([len(s) for s in self.seqs], self.max_tokens), key=min):
                inputs = _batch_inputs(self.seqs, self.states, b, self.pad_id, dev)
                with _autocast(self.bf16):
                    _, hs = model(**inputs, output_layers=self.layers)
                h = torch.stack(hs, dim=2)  # (n, T, K, H)
                for k, i in enumerate(b):
                    m = torch.tensor(self.masks[i], dtype=torch.bool, device=h.device)
                    chunks.append((i, h[k, : len(self.seqs[i])][m].float().cpu()))
        finally:
            model.train(was_training)
        chunks.sort(key=lambda x: x[0])
        cur = torch.cat([c for _, c in chunks], 0)
        out = {}
        n = cur.shape[0]
        # CKA costs O(N H^2): on more than CKA_MAX_TOKENS tokens it uses an evenly spaced, fixed subset of them
        sub = np.linspace(0, n - 1, self.CKA_MAX_TOKENS).astype(int) if n > self.CKA_MAX_TOKENS else slice(None)
        for j, layer in enumerate(self.layers):
            x, y = cur[:, j].double().numpy(), self.ref[:, j].double().numpy()
            out[str(layer)] = {
                "rel_sq_err": float(relative_squared_error(x, y)),
                "cka": float(linear_cka(x[sub], y[sub])),
            }
        return out
