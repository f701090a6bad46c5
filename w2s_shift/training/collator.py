"""Training pairs and their batches: :class:`PairDataset` (index records), :class:`PairCollator` (chosen and
rejected of a pair in one forward, padded or padding-free packed) and :class:`LengthGroupedPairSampler`."""

from __future__ import annotations

import random

import torch
from torch.utils.data import Dataset, Sampler

from ..models.reward_model import pack_sequences, packed_positions


class PairDataset(Dataset):
    """Training pairs as index records; the features themselves live in ``store``.

    Args:
        pairs: list of :class:`~w2s_shift.data.render.EncodedPair`.
        labels: (B,) soft labels q_i in [0, 1] (1.0 for gold).
        states: optional list of per-pair (chosen_states (Tc, H), rejected_states (Tr, H)) trunk outputs.
        ref_states: optional list of per-pair (chosen (Rc, K, H), rejected (Rr, K, H)) cached ANCHOR reference
            states of K anchored layers on response tokens only (Rc = response tokens of the chosen sequence);
            (Rc, H) is read as K = 1.
    """

    def __init__(self, pairs: list, labels: list, states: list | None = None, ref_states: list | None = None):
        if len(pairs) != len(labels):
            raise ValueError(f"{len(pairs)} pairs but {len(labels)} labels")
        for what, x in (("trunk states", states), ("reference states", ref_states)):
            if x is not None and len(x) != len(pairs):
                raise ValueError(f"{len(pairs)} pairs but {len(x)} {what}")
        self.pairs, self.labels, self.states, self.ref_states = pairs, [float(q) for q in labels], states, ref_states

    def __len__(self) -> int:
        return len(self.pairs)

    def lengths(self) -> list:
        return [max(len(p.chosen.input_ids), len(p.rejected.input_ids)) for p in self.pairs]

    def __getitem__(self, i: int) -> dict:
        d = {"pair": self.pairs[i], "label": self.labels[i], "index": i}
        if self.states is not None:
            d["states"] = self.states[i]
        if self.ref_states is not None:
            d["ref_states"] = self.ref_states[i]
        return d


class PairCollator:
    """Collates a list of pairs into one forward's batch of 2B sequences, [chosen_1..chosen_B, rejected_1..rejected_B].

    Padded (``packing=False``): ``attention_mask`` (2B, T), ``response_mask`` (2B, T), ``labels`` (B,), and either
    ``input_ids`` (2B, T) or ``inputs_embeds`` (2B, T, H) float32 (then the ids as ``token_ids``, targets of a
    language-model loss, not a forward input); with cached reference states also
    ``ref_hidden`` (2B, T, K, H), zero outside response tokens. Padding is on the right with ``pad_id``; pooling
    reads the last attention-mask position, so the pad id is never looked for.

    Packed (``packing=True``, padding-free): the 2B sequences are first-fit-decreasing packed into R rows of at
    most T tokens (T = the batch's longest sequence; see
    :func:`~w2s_shift.models.reward_model.pack_sequences`): ``input_ids`` (R, L) or ``inputs_embeds`` (R, L, H),
    ``position_ids`` (R, L) restarting at each sequence, ``last_index`` (2B,) flat positions of each sequence's
    last token (same sequence order as padded), ``response_mask`` (R, L), ``ref_hidden`` (R, L, K, H); no
    attention mask. The same tokens are computed with the same positions and causal context, so rewards,
    losses and gradients equal the padded batch's up to float rounding (tested), with no compute on padding.
    """

    def __init__(self, pad_id: int, packing: bool = False):
        self.pad_id = int(pad_id)
        self.packing = bool(packing)

    def __call__(self, items: list) -> dict:
        seqs = [it["pair"].chosen for it in items] + [it["pair"].rejected for it in items]
        lengths = [len(s.input_ids) for s in seqs]
        n = len(seqs)
        if self.packing:
            rows = pack_sequences(lengths, max(lengths))
            pos, starts, last = packed_positions(rows, lengths)
            shape = tuple(pos.shape)
            where = [slice(int(starts[k, 1]), int(starts[k, 1]) + lengths[k]) for k in range(n)]
            at = [int(starts[k, 0]) for k in range(n)]
        else:
            shape = (n, max(lengths))
            where = [slice(0, ln) for ln in lengths]
            at = list(range(n))
        ids = torch.full(shape, self.pad_id, dtype=torch.long)
        rm = torch.zeros(shape, dtype=torch.long)
        for k, s in enumerate(seqs):
            ids[at[k], where[k]] = torch.tensor(s.input_ids)
            rm[at[k], where[k]] = torch.tensor(s.response_mask)
        batch = {"response_mask": rm, "labels": torch.tensor([it["label"] for it in items], dtype=torch.float32)}
        if self.packing:
            batch.update(position_ids=pos, last_index=last)
        else:
            am = torch.zeros(shape, dtype=torch.long)
            for k in range(n):
                am[k, where[k]] = 1
            batch["attention_mask"] = am
        if "index" in items[0]:
            batch["pair_index"] = torch.tensor([it["index"] for it in items], dtype=torch.long)
        if "states" in items[0]:
            states = [it["states"][0] for it in items] + [it["states"][1] for it in items]
            # one buffer in the stored dtype, cast once (a per-sequence cast costs up to 0.5 s a batch on a loaded
            # 2-core CPU)
            emb = torch.zeros(shape + (states[0].shape[-1],), dtype=states[0].dtype)
            for k, st in enumerate(states):
                emb[at[k], where[k]] = st
            batch["inputs_embeds"] = emb.float()
            batch["token_ids"] = ids  # not a forward input: the token targets of a language-model loss (GRM)
        else:
            batch["input_ids"] = ids
        if "ref_states" in items[0]:
            refs = [it["ref_states"][0] for it in items] + [it["ref_states"][1] for it in items]
            refs = [r if r.dim() == 3 else r.unsqueeze(1) for r in refs]  # (R_k, K, H)
            ref = torch.zeros(shape + tuple(refs[0].shape[1:]), dtype=torch.float32)
            for k, r in enumerate(refs):
                ref[at[k], where[k]][rm[at[k], where[k]] > 0] = r.float()
            batch["ref_hidden"] = ref
        return batch


class LengthGroupedPairSampler(Sampler):
    """Seeded length grouping: shuffle, cut into mega-batches of ``group`` batches, sort each by length.

    Batches then hold pairs of similar length (little padding) while the order stays random across
    mega-batches; the longest mega-batch's batch comes first so an out-of-memory error shows at once.
    """

    def __init__(self, lengths: list, batch_size: int, group: int, seed: int):
        self.lengths, self.batch_size, self.group, self.seed = lengths, batch_size, group, seed
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.lengths)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        rng = random.Random(self.seed * 1000003 + self.epoch)
        idx = list(range(len(self.lengths)))
        rng.shuffle(idx)
        self.epoch += 1
        if self.group <= 0:
            return iter(idx)
        mega = self.batch_size * self.group
        out = []
        for s in range(0, len(idx), mega):
            out.extend(sorted(idx[s : s + mega], key=lambda i: -self.lengths[i]))
        return iter(out)


def forward_inputs(inputs: dict) -> dict:
    """The inputs of a backbone forward in a training batch (ids or cached trunk states, mask, positions)."""
    return {k: inputs[k] for k in ("input_ids", "inputs_embeds", "attention_mask", "position_ids") if k in inputs}
