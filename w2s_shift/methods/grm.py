"""GRM's SFT regularizer: Naive W2S plus lambda times a language-model loss on the chosen response, read through the
student's pretrained language-model head (Yang et al. 2024, "Regularizing hidden states enables learning
generalizable reward model for LLMs", NeurIPS, arXiv 2406.10216: the SFT regularization; their reference
implementation ``GRMRewardTrainer`` with ``sft_only``):

    L = L_pair(d, q) + lambda * L_SFT,
    s_i = sum_{t in chosen response of pair i} log pi(y_t | x, y_<t),   log pi = log_softmax(h_{t-1} W^T),
    L_SFT = mean_i -log sigmoid(beta * s_i)        (``grm_form: logsigmoid``, GRM's default, beta 0.1)
          = mean_i -s_i                            (``grm_form: nll``, their ``no_logsigmoid_sft``: the LM's token loss
                                                    summed over each chosen response)

with h (N, T, H) the student's last hidden states (after the final norm; what the reward head reads), W (V, H) the
pretrained LM head (:func:`w2s_shift.models.lm.lm_head_weight`; an untied head read from the checkpoint,
:func:`w2s_shift.models.loading.untied_lm_head`). GRM writes (1 - alpha) L_reward + alpha L_reg (alpha 0.01): the
same minimizer as L_pair + lambda L_SFT with lambda = alpha / (1 - alpha), the learning rate scaled by 1 - alpha.
Units: s_i and L_SFT in nats (natural-log probabilities), like the pairwise loss; lambda is dimensionless.

Differences from GRM, said here: the LM head is a frozen copy of the pretrained one (GRM's full fine-tuning trains it
with the backbone), so the term keeps the hidden states readable by the pretrained head; it is not part of the reward
model and is neither saved nor exported with it. GRM's DPO variant is not implemented. Gemma's final logit
soft-capping is applied as in :mod:`w2s_shift.models.lm`.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field, field_validator

from .base import FixedWeightState, Method, MethodConfig, Objective

#: GRM's settings (their weight_ratio 0.01 -> lambda = 0.01 / 0.99, rounded; beta 0.1).
DEFAULT_LAMBDA = 0.01
DEFAULT_BETA = 0.1


class GRMConfig(MethodConfig):
    """Settings of GRM's SFT regularizer."""

    grm_lambda: float = Field(
        DEFAULT_LAMBDA,
        gt=0,
        le=1e6,
        description="Weight lambda > 0 of the SFT term on the chosen response (GRM's alpha / (1 - alpha); their "
        "alpha 0.01).",
    )
    grm_beta: float = Field(
        DEFAULT_BETA, gt=0, description="GRM's beta in -log sigmoid(beta * sum_t log pi(y_t)) (grm_form logsigmoid)."
    )
    grm_form: Literal["logsigmoid", "nll"] = Field(
        "logsigmoid",
        description="logsigmoid: -log sigmoid(beta * s), GRM's default SFT form; nll: -s, the LM's token loss summed "
        "over the chosen response (s: the chosen response's summed log-probability under the pretrained LM head).",
    )

    @field_validator("grm_lambda", "grm_beta", mode="before")
    @classmethod
    def _number(cls, v, info):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"{info.field_name} {v!r}: give a finite number > 0")
        return v


def chosen_sequence_index(inputs: dict, n_pairs: int) -> torch.Tensor:
    """(N, T) index of the chosen sequence (0..B-1) each token belongs to, -1 elsewhere (rejected sequences,
    padding). Padded rows: row k < B is chosen k. Packed rows: chosen k spans the flat positions ending at
    ``last_index[k]`` and starting ``position_ids`` there before it."""
    rm = inputs["response_mask"]
    out = torch.full(rm.shape, -1, dtype=torch.long, device=rm.device)
    if "last_index" not in inputs:
        out[:n_pairs] = torch.arange(n_pairs, device=rm.device).unsqueeze(1)
        if "attention_mask" in inputs:
            out[inputs["attention_mask"] == 0] = -1
        return out
    # chosen k spans flat positions start_k..end_k (disjoint): +(k + 1) at its start and -(k + 1) after its end, summed
    # along the flat rows, is k + 1 inside it and 0 outside; on the device, without reading an index on the host
    pos = inputs["position_ids"].reshape(-1)
    end = inputs["last_index"][:n_pairs]
    mark = torch.zeros(pos.numel() + 1, dtype=torch.long, device=rm.device)
    k1 = torch.arange(1, n_pairs + 1, device=rm.device)
    mark.index_add_(0, end - pos[end], k1).index_add_(0, end + 1, -k1)
    return (mark[:-1].cumsum(0) - 1).view(rm.shape)


def chosen_logprob_sums(hidden: torch.Tensor, inputs: dict, weight: torch.Tensor, n_pairs: int, softcap=None):
    """(s (B,), tokens): s_i = sum over chosen pair i's response tokens y_t of log softmax(h_{t-1} W^T)[y_t] (float32,
    differentiable in ``hidden``), and the number of those tokens (a 0-dim device tensor: no host synchronisation).
    ``hidden`` (N, T, H); the token ids are the batch's ``input_ids`` (``token_ids`` when cached trunk states replace
    them). Memory: the (M, V) float32 logits of
    the M chosen response tokens and their gradient (a 128k vocabulary at M = 4096: 2 GiB each).

    Raises:
        ValueError: the batch carries no token ids."""
    ids = inputs.get("input_ids", inputs.get("token_ids"))
    if ids is None:
        raise ValueError("grm: the batch has no token ids (input_ids or token_ids) for the SFT targets")
    seq = chosen_sequence_index(inputs, n_pairs)
    rm = inputs["response_mask"] > 0
    valid = (seq[:, 1:] >= 0) & (seq[:, 1:] == seq[:, :-1]) & rm[:, 1:]
    h = hidden[:, :-1][valid]  # (M, H): the states that predict the response tokens
    logits = h.float() @ weight.float().t()
    if softcap:
        logits = softcap * torch.tanh(logits / softcap)
    logp = -F.cross_entropy(logits, ids[:, 1:][valid], reduction="none")
    s = torch.zeros(n_pairs, dtype=torch.float32, device=hidden.device).index_add(0, seq[:, 1:][valid], logp)
    return s, valid.sum()


class GRMTerm(FixedWeightState):
    """GRM's SFT term of one training run, with the hooks :class:`w2s_shift.training.PairTrainer` calls (as
    :class:`w2s_shift.methods.anchor_term.AnchorTerm`'s). Each micro-batch adds lambda * sum_i L_i * P / N (P the
    process count, N the pairs of the optimizer step on all processes), so the step's term is lambda times the mean over
    its pairs, as the pairwise loss. Logged: ``loss_sft`` (L_SFT of the micro-batch) and ``sft_token_nll`` (the
    chosen responses' mean token loss under the pretrained head)."""

    output_layers = None  # the last hidden states (after the final norm)

    def __init__(
        self, lam: float, weight: torch.Tensor, beta: float = DEFAULT_BETA, form: str = "logsigmoid", softcap=None
    ):
        if form not in ("logsigmoid", "nll"):
            raise ValueError(f"grm_form {form!r}: logsigmoid or nll")
        self.lam, self.beta, self.form, self.softcap = float(lam), float(beta), form, softcap
        self.weight = weight.detach().clone().requires_grad_(False)

    def to(self, device) -> GRMTerm:
        self.weight = self.weight.to(device)
        return self

    def bind(self, ctx) -> None:
        """Checks the LM head against the student's hidden size; reads Gemma's soft-capping from its config.

        Raises:
            ValueError: the head's hidden size differs from the student's."""
        inner = ctx.unwrap(ctx.model)
        if self.softcap is None:
            self.softcap = getattr(
                getattr(getattr(inner, "backbone", None), "config", None), "final_logit_softcapping", None
            )
        size = getattr(inner, "hidden_size", None) or getattr(getattr(inner, "score", None), "in_features", None)
        if size is not None and self.weight.shape[1] != size:
            raise ValueError(f"grm: LM head of hidden size {self.weight.shape[1]} for a student of hidden size {size}")

    def prepare_step(self, ctx, batch_samples: list) -> None:
        """Nothing to prepare: the term is a mean over pairs, counted by the trainer."""

    def sft_loss(self, s: torch.Tensor) -> torch.Tensor:
        """Per-pair L_i from the summed log-probabilities s (B,)."""
        return -F.logsigmoid(self.beta * s) if self.form == "logsigmoid" else -s

    def loss(self, ctx, inputs, fwd, hidden, num_items_in_batch, scale: float, loss_w2s) -> tuple:
        """This micro-batch's lambda * L_SFT share (see the class docstring) and the logged parts."""
        n = int(inputs["labels"].numel())
        s, tokens = chosen_logprob_sums(hidden[0], inputs, self.weight, n, self.softcap)
        per_pair = self.sft_loss(s)
        denom = num_items_in_batch if num_items_in_batch is not None else float(n)  # a device tensor: no sync
        parts = {
            "loss_sft": per_pair.detach().mean(),
            "sft_token_nll": (-s.detach().sum() / tokens.clamp_min(1)),
        }
        return self.lam * per_pair.sum() * scale / denom, parts


class GRM(Method):
    """GRM's SFT regularizer (see the module docstring)."""

    config = GRMConfig

    def objective(self, cfg, layers=None, reference=None, lm_head=None) -> Objective:
        """Soft Bradley-Terry plus :class:`GRMTerm` on ``lm_head`` (V, H), the pretrained LM head the pipeline passes
        to a method with ``needs_lm_head``.

        Raises:
            ValueError: no LM head given."""
        if lm_head is None:
            raise ValueError("grm needs the student's pretrained language-model head (lm_head)")
        obj = super().objective(cfg)
        obj.regularizer = GRMTerm(cfg.grm_lambda, lm_head, cfg.grm_beta, cfg.grm_form)
        return obj

    def summary(self, cfg) -> str:
        form = f"-log sigmoid({cfg.grm_beta:g} s)" if cfg.grm_form == "logsigmoid" else "-s"
        return f"lambda {cfg.grm_lambda:g} x SFT loss {form} on the chosen response (pretrained LM head, frozen)"

    def describe(self, cfg) -> dict:
        return {"grm_lambda": cfg.grm_lambda, "grm_beta": cfg.grm_beta, "grm_form": cfg.grm_form}

    def table_text(self, d: dict) -> list:
        if d.get("grm_lambda") is None:
            return []
        form = f"β={d.get('grm_beta'):g}" if d.get("grm_form") == "logsigmoid" else "token NLL"
        return [f"λ={d['grm_lambda']:g} (GRM SFT, {form})"]


METHOD = GRM(
    name="grm",
    display="grm",
    description="soft Bradley-Terry on teacher labels + lambda x SFT loss on the chosen response (GRM, pretrained LM "
    "head)",
    needs_lm_head=True,
    objective_lm_head=True,
    competitor=True,
)
