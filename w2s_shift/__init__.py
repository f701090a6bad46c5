"""w2s-shift: weak-to-strong reward models, judged under preference shift (Le et al. 2026)."""

__version__ = "0.1.0"
