"""Representation drift of a trained reward model from its pretrained reference: relative squared error and linear
CKA of hidden states, and :class:`DriftProbe`, which measures both on a fixed probe set during and after training.

Sources: the drift ANCHOR penalises (Le et al. 2026, arXiv 2605.25629: masked MSE to the frozen reference); linear
CKA from Kornblith et al. 2019 ("Similarity of neural network representations revisited", Eq. 1 with linear
kernels, centred features). The statistics are computed where the states are (the run's device), in float64.
"""

from __future__ import annotations

import numpy as np
import torch

from ..batching import batch_inputs, batches_by_tokens, bf16_autocast, module_device
from ..inference import compute_reference_states


def _mat(x, what: str, device=None) -> torch.Tensor:
    """``x`` as a (N, D) float tensor on ``device`` (default: where it is; numpy arrays go to the CPU), in float64
    where the device has it (CPU, CUDA), else float32 (MPS).

    Raises:
        ValueError: not a non-empty 2-D matrix, or non-finite values."""
    t = torch.as_tensor(x)
    if device is not None:
        t = t.to(device)
    t = t.to(torch.float32 if t.device.type == "mps" else torch.float64)
    if t.ndim != 2 or t.shape[0] == 0 or t.shape[1] == 0:
        raise ValueError(f"{what}: expected a non-empty (N, D) matrix, got shape {tuple(t.shape)}")
    if not bool(torch.isfinite(t).all()):
        raise ValueError(f"{what}: non-finite values")
    return t


def relative_squared_error(h, h_ref) -> float:
    """Relative squared drift of hidden states from the reference: sum_i ||h_i - ref_i||^2 / sum_i ||ref_i||^2.

    The quantity ANCHOR's loss penalises (Le et al. 2026, masked MSE to the frozen reference), normalised so
    that 0 is no drift and 1 is a change as large as the reference states themselves. Computed where ``h`` is
    (numpy arrays, or torch tensors on any device: the run's GPU keeps its states there), in float64.

    Args:
        h: (N, D) states of the trained student (e.g. N response tokens); h_ref: (N, D) the reference's.

    Raises:
        ValueError: shapes differ, non-finite values, or the reference is all zeros.
    """
    a = _mat(h, "h")
    r = _mat(h_ref, "h_ref", a.device)
    if a.shape != r.shape:
        raise ValueError(f"relative_squared_error: shapes differ {tuple(a.shape)} vs {tuple(r.shape)}")
    den = float((r * r).sum())
    if den == 0.0:
        raise ValueError("relative_squared_error: the reference states are all zero")
    return float(((a - r) ** 2).sum()) / den


def linear_cka(x, y) -> float:
    """Linear centred kernel alignment (Kornblith et al. 2019, Eq. 1 with linear kernels):

        CKA = ||Y_c^T X_c||_F^2 / (||X_c^T X_c||_F ||Y_c^T Y_c||_F),  X_c, Y_c column-centred.

    Invariant to orthogonal transforms and isotropic scaling of either side; 1 for identical representations.
    Computed where ``x`` is (numpy: the CPU; a torch tensor: its device), in float64, in feature space, or through
    the (N, N) Gram matrices when N is smaller than the width (O(N min(N, D)^2) either way).

    Args:
        x: (N, D1), y: (N, D2): two representations of the same N examples/tokens.

    Raises:
        ValueError: different N, N < 2, non-finite values, or a representation with no variance.
    """
    a = _mat(x, "x")
    b = _mat(y, "y", a.device)
    if a.shape[0] != b.shape[0]:
        raise ValueError(f"linear_cka: x has {a.shape[0]} rows, y has {b.shape[0]}")
    if a.shape[0] < 2:
        raise ValueError("linear_cka needs at least 2 rows")
    a = a - a.mean(0)
    b = b - b.mean(0)
    if a.shape[0] < max(a.shape[1], b.shape[1]):
        k, l_ = a @ a.T, b @ b.T  # centred Gram matrices: tr(K L) = ||Y^T X||_F^2
        num, nx, ny = (k * l_).sum(), torch.linalg.norm(k), torch.linalg.norm(l_)
    else:
        num = torch.linalg.norm(b.T @ a) ** 2
        nx, ny = torch.linalg.norm(a.T @ a), torch.linalg.norm(b.T @ b)
    num, nx, ny = float(num), float(nx), float(ny)
    if nx == 0.0 or ny == 0.0:
        raise ValueError("linear_cka: a representation is constant across rows (no variance)")
    return num / (nx * ny)


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
        self.ref = torch.cat(ref, 0)  # (R, K, H) over all response tokens, on the host
        self._ref_on = None  # its copy on the device of the models measured

    @torch.no_grad()
    def measure_during(self, model: torch.nn.Module) -> dict:
        """{"<layer>": {"rel_sq_err": float}} of ``model`` against the reference, as logged during training, with
        the probe's sequences shared between the processes: each runs the forwards of its share of the batches
        (the shares padded to the same number of forwards, so a sharded model's collective forwards stay in
        lockstep; a padding forward adds nothing) and keeps the per-layer sums sum ||h - h_ref||^2 and
        sum ||h_ref||^2 on the device, summed over processes once at the end (the value of one process measuring
        every sequence, up to the summation order). Every process must call it. Linear CKA, which needs every
        token together, is measured at the end of training only (:meth:`measure`)."""
        from ..distributed import all_mean, split_indices, world

        was_training = model.training
        model.eval()
        dev = module_device(model)
        if self._ref_on is None or self._ref_on.device != dev:
            self._ref_on = self.ref.to(dev)
        starts = np.concatenate([[0], np.cumsum([sum(m) for m in self.masks])])
        batches = sorted(batches_by_tokens([len(s) for s in self.seqs], self.max_tokens), key=min)
        own, padded = split_indices(len(batches))
        sums = torch.zeros((2, len(self.layers)), dtype=torch.float64, device=dev)
        try:
            for j, bi in enumerate(padded):
                b = batches[bi]
                inputs = batch_inputs(self.seqs, self.states, b, self.pad_id, dev)
                with bf16_autocast(self.bf16):
                    _, hs = model(**inputs, output_layers=self.layers)
                if j >= len(own):
                    continue  # a padding forward: run for the lockstep, not counted
                h = torch.stack(hs, dim=2)  # (n, T, K, H)
                for k, i in enumerate(b):
                    m = torch.tensor(self.masks[i], dtype=torch.bool, device=dev)
                    x = h[k, : len(self.seqs[i])][m].double()  # (R_i, K, H)
                    r = self._ref_on[starts[i] : starts[i + 1]].double()
                    sums[0] += ((x - r) ** 2).sum(dim=(0, 2))
                    sums[1] += (r * r).sum(dim=(0, 2))
        finally:
            model.train(was_training)
        if world()[1] > 1:
            sums = all_mean(sums).double()  # the mean over processes: the world size cancels in the ratio
        ratio = (sums[0] / sums[1].clamp_min(torch.finfo(torch.float64).tiny)).tolist()
        return {str(layer): {"rel_sq_err": float(v)} for layer, v in zip(self.layers, ratio)}

    @torch.no_grad()
    def measure(self, model: torch.nn.Module, with_rewards: bool = False):
        """{"<layer>": {"rel_sq_err": float, "cka": float}} of ``model`` (a RewardModel) against the reference.

        With ``with_rewards`` also the model's rewards (N,) float64 of the probe's sequences, in their order, from
        the same forwards: the same batches, inputs and precision as
        :func:`w2s_shift.inference.score_sequences` over these sequences, so the same values to the bit (a
        probe that holds a whole evaluation set saves its scoring pass). Returns (drift dict, rewards) then."""
        was_training = model.training
        model.eval()
        dev = module_device(model)
        chunks = []
        rewards = np.zeros(len(self.seqs), dtype=np.float64)
        try:
            for b in sorted(batches_by_tokens([len(s) for s in self.seqs], self.max_tokens), key=min):
                inputs = batch_inputs(self.seqs, self.states, b, self.pad_id, dev)
                with bf16_autocast(self.bf16):
                    r, hs = model(**inputs, output_layers=self.layers)
                rewards[b] = r.double().cpu().numpy()
                h = torch.stack(hs, dim=2)  # (n, T, K, H)
                for k, i in enumerate(b):
                    m = torch.tensor(self.masks[i], dtype=torch.bool, device=h.device)
                    chunks.append((i, h[k, : len(self.seqs[i])][m].float()))
        finally:
            model.train(was_training)
        chunks.sort(key=lambda x: x[0])
        cur = torch.cat([c for _, c in chunks], 0)  # (R, K, H) on the model's device: no copy to the host
        if self._ref_on is None or self._ref_on.device != cur.device:
            self._ref_on = self.ref.to(cur.device)  # the reference goes to the device once
        out = {}
        n = cur.shape[0]
        # CKA costs O(N H^2): on more than CKA_MAX_TOKENS tokens it uses an evenly spaced, fixed subset of them
        sub = np.linspace(0, n - 1, self.CKA_MAX_TOKENS).astype(int) if n > self.CKA_MAX_TOKENS else slice(None)
        for j, layer in enumerate(self.layers):
            x, y = cur[:, j], self._ref_on[:, j]
            out[str(layer)] = {
                "rel_sq_err": float(relative_squared_error(x, y)),
                "cka": float(linear_cka(x[sub], y[sub])),
            }
        return (out, rewards) if with_rewards else out


__all__ = ["DriftProbe", "linear_cka", "relative_squared_error"]
