"""Preference data: pairs and their checks (:mod:`.schema`), row formats registered beside their converters
(:mod:`.registry`, :mod:`.formats`, :mod:`.adapters`, :mod:`.paper_sets`), named datasets and dataset references
(:mod:`.adapters`, :mod:`.refs`, :mod:`.resolve`), splits, rendering and inspection."""

from . import adapters  # noqa: F401 (importing it registers every built-in row format)
