"""Label-construction methods for weak-to-strong reward models (currently SEAM, :mod:`w2s_shift.methods.seam`)."""
