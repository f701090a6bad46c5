"""w2s-shift: weak-to-strong reward models, judged under preference shift (Le et al. 2026).

``from w2s_shift import run_grid, load_run``: the notebook API (:mod:`w2s_shift.api`), imported on first use.
"""

__version__ = "0.1.0"
__all__ = ["load_run", "run_grid"]


def __getattr__(name: str):
    if name in __all__:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'w2s_shift' has no attribute {name!r}")
