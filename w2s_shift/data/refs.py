"""A reference to a dataset (:class:`DatasetRef`: a name of ``w2s-shift data list``, a file with its row format and
columns, or a hub id) and the one rule that reads a command-line string as one (:func:`ref_kind`). The config's
``data.sources`` and ``data.ood`` entries are these; :mod:`.resolve` loads them."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..io import SAFE_NAME
from .rewardbench import HUB_FORMATS


class DatasetRef(BaseModel):
    """A dataset: a bundled/shared ``name``, a file ``path`` (with ``format`` and ``columns``), or a hub id."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    name: str | None = Field(None, min_length=1, description="Dataset name from `w2s-shift data list`.")
    path: str | None = Field(None, min_length=1, description="A JSONL/JSON/CSV/Parquet file.")
    hf: str | None = Field(None, min_length=1, description="A Hugging Face dataset id (needs the hub).")
    format: str = Field("prompt_chosen_rejected", description="Row format of a file or hub dataset.")
    columns: dict[Literal["prompt", "chosen", "rejected", "id"], str] = Field(
        default_factory=dict, description="Map of prompt/chosen/rejected/id to the file's column names."
    )
    split: str = Field("test", description="Hub split.")
    subset: str | None = Field(None, description="Hub subset (configuration).")
    label: str | None = Field(
        None, pattern=SAFE_NAME, description="Short name in tables and file names (default: the name or file stem)."
    )

    @model_validator(mode="after")
    def _one_source(self):
        n = sum(x is not None for x in (self.name, self.path, self.hf))
        if n != 1:
            raise ValueError("give exactly one of name, path, hf")
        return self

    def identity(self) -> tuple:
        """What the dataset is (kind, name/path/hub id, subset, split): equal identities are the same data."""
        if self.name:
            return ("name", self.name)
        if self.path:
            return ("path", str(Path(self.path).resolve()), self.format)
        return ("hf", self.hf, self.subset, self.split, self.format)

    @property
    def display(self) -> str:
        """The name used in tables and in file names: letters, digits, '.', '_' and '-' only."""
        if self.label:
            return self.label
        raw = self.name or (Path(self.path).name.split(".")[0] if self.path else self.hf.split("/")[-1])
        return re.sub(r"[^A-Za-z0-9._-]", "_", raw).lstrip(".") or "dataset"


def ref_kind(spec: str) -> dict:
    """What a dataset string names, the one rule of every command and config entry, first match wins:
    ``hf:<id>`` a hub id (before the suffix test: a hub id may hold a '.', org/set-v1.5); a name of
    ``w2s-shift data list``; a string with a suffix or a path separator, or an existing path, a file; anything
    else a dataset name (unknown names are refused, with the known ones, when the data is loaded).
    A RewardBench hub id (:data:`~w2s_shift.data.rewardbench.HUB_FORMATS`) comes with its row format and split.
    Returns {"hf": id} (RewardBench: {"hf", "format", "split"}) | {"name": name} | {"path": path}."""
    from .adapters import DATASETS

    if spec.startswith("hf:") and len(spec) > 3:
        fmt_split = HUB_FORMATS.get(spec[3:])
        return {"hf": spec[3:], **({"format": fmt_split[0], "split": fmt_split[1]} if fmt_split else {})}
    if spec in DATASETS:
        return {"name": spec}
    p = Path(spec)
    if p.suffix or "/" in spec or os.sep in spec or p.exists():
        return {"path": spec}
    return {"name": spec}


def coerce_ref(v):
    """A config entry given as a string, as the dict of :func:`ref_kind`; other values as they are."""
    return ref_kind(v) if isinstance(v, str) and v else v


def dataset_ref(spec: str, format: str | None = None) -> DatasetRef:
    """The dataset a string names (:func:`ref_kind`), as an entry of ``data.sources`` / ``data.ood``.
    ``format``: the row format of a file or hub id (None: the default)."""
    return DatasetRef.model_validate({**coerce_ref(spec), **({"format": format} if format is not None else {})})
