"""Reading a run configuration: YAML files and shipped presets (``w2s_shift/configs/``) with PyYAML's safe
loader (duplicate keys, aliases and deep nesting refused), ``--set a.b=value`` overrides, validation into a
:class:`~w2s_shift.config.RunConfig`, every problem in one :class:`~w2s_shift.config.ConfigError`.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import yaml
from pydantic import ValidationError

from .config import ConfigError, RunConfig


def format_errors(e: ValidationError, origin: str) -> str:
    """The pydantic errors as "<origin>: N problem(s) ..." and one "  - <field.path>: <message>" line each."""
    lines = [f"{origin}: {e.error_count()} problem(s) in the configuration:"]
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
        lines.append(f"  - {loc}: {err['msg']}")
    return "\n".join(lines)


def preset_names() -> list:
    """Names of the presets shipped in ``w2s_shift/configs/`` (file stems), sorted."""
    return sorted(p.name[:-5] for p in resources.files("w2s_shift.configs").iterdir() if p.name.endswith(".yaml"))


MAX_CONFIG_DEPTH = 50  # a real config nests 4 levels; deeper is a mistake or a bomb for the validators


def _depth_exceeds(obj, limit: int) -> bool:
    """True when lists/mappings nest deeper than ``limit`` (checked iteratively: no recursion)."""
    stack = [(obj, 1)]
    while stack:
        o, d = stack.pop()
        if isinstance(o, (dict, list)):
            if d > limit:
                return True
            stack.extend((v, d + 1) for v in (o.values() if isinstance(o, dict) else o))
    return False


class _NumberLoader(yaml.SafeLoader):
    """PyYAML's safe loader reading every number spelling of YAML 1.2 as a number: ``1e-2`` and ``5E3`` (no dot)
    are floats, as YAML 1.2 and JSON read them, not the strings YAML 1.1 makes of them; so every numeric field
    takes ``1e-2`` the way ``1.0e-2`` is taken."""


_NumberLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+.0123456789"),
)


def parse_value(text: str):
    """A command-line value (``--set k=VALUE``, ``select-method --values``) read as YAML by the config's rules
    (:class:`_NumberLoader`: ``1e-2`` is a number).

    Raises:
        yaml.YAMLError: the text is not valid YAML."""
    loader = _NumberLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


class _UniqueKeyLoader(_NumberLoader):
    """PyYAML's safe loader (numbers as YAML 1.2 reads them), refusing a mapping that repeats a key (YAML 1.2
    forbids it; PyYAML keeps the last) and aliases (``*name``): nested aliases expand exponentially (a few hundred
    bytes make billions of nodes).

    Raises:
        ConfigError: "<file>, line N: duplicate key 'k' (first on line M)"; "<file>, line N: YAML alias '*a'".
    """

    origin = "config"

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise ConfigError(
                f"{self.origin}, line {event.start_mark.line + 1}: YAML alias '*{event.anchor}' is not allowed in "
                "configs (write the value out)"
            )
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    if key in seen:
                        raise ConfigError(
                            f"{self.origin}, line {key_node.start_mark.line + 1}: duplicate key {key!r} "
                            f"(first on line {seen[key]})"
                        )
                    seen[key] = key_node.start_mark.line + 1
                except TypeError:  # an unhashable key: the constructor names it
                    continue
        return super().construct_mapping(node, deep=deep)


def read_yaml(path_or_preset: str | None) -> tuple:
    """Read a YAML config file or a shipped preset by name; (dict, origin). Safe loader only."""
    if path_or_preset is None:
        path_or_preset = "quickstart"
    p = Path(path_or_preset)
    if p.is_file():
        origin = str(p)
        try:
            text = p.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise ConfigError(f"{origin}: not valid UTF-8 (byte {e.start})") from None
    elif path_or_preset in preset_names():
        text = resources.files("w2s_shift.configs").joinpath(f"{path_or_preset}.yaml").read_text(encoding="utf-8")
        origin = f"preset {path_or_preset}"
    else:
        raise ConfigError(f"{path_or_preset}: no such config file or preset (presets: {', '.join(preset_names())})")
    loader = _UniqueKeyLoader(text)
    loader.origin = origin
    try:
        data = loader.get_single_data()
    except yaml.YAMLError as e:
        raise ConfigError(f"{origin}: invalid YAML: {e}") from None
    except RecursionError:
        raise ConfigError(f"{origin}: nested too deeply") from None
    finally:
        loader.dispose()
    if data is None:
        raise ConfigError(f"{origin}: config file is empty (no settings; omit the file to run the quickstart)")
    if _depth_exceeds(data, MAX_CONFIG_DEPTH):
        raise ConfigError(f"{origin}: nested too deeply (more than {MAX_CONFIG_DEPTH} levels)")
    if not isinstance(data, dict):
        raise ConfigError(f"{origin}: the top level must be a mapping")
    return data, origin


def apply_overrides(data: dict, overrides: list) -> dict:
    """Apply ``a.b.c=value`` overrides (value parsed as YAML) to a config dict. A section the config file
    leaves out starts from its defaults, so ``--set teacher.epochs=1`` changes only that field.

    Raises:
        ConfigError: no ``=``, an empty key, a key through a non-section, or a value that is not YAML.
    """
    for o in overrides or []:
        if "=" not in o:
            raise ConfigError(f"--set {o!r}: expected KEY=VALUE, e.g. student.epochs=2")
        key, val = o.split("=", 1)
        try:
            value = parse_value(val)
        except yaml.YAMLError as e:
            raise ConfigError(f"--set {o!r}: the value is not valid YAML ({str(e).splitlines()[0]})") from None
        set_field(data, key, value, where=f"--set {o!r}")
    return data


def set_field(data: dict, key: str, value, where: str | None = None) -> dict:
    """Set the field ``key`` (dotted: ``a.b.c``) of a config dict to ``value`` taken as it is (never parsed as
    YAML: a path given on the command line keeps ``' #'``, newlines, trailing spaces and words such as ``yes``).
    A section the dict leaves out starts from its defaults.

    Raises:
        ConfigError: an empty key part, or a key through a field that is not a section (``where`` names it).
    """
    where = where or key
    parts = key.split(".")
    if not all(parts):
        raise ConfigError(f"{where}: empty key")
    cur, dflt = data, _defaults()
    for k in parts[:-1]:
        dflt = dflt.get(k, {}) if isinstance(dflt, dict) else {}
        if k not in cur:
            cur[k] = dict(dflt) if isinstance(dflt, dict) else {}
        cur = cur[k]
        if not isinstance(cur, dict):
            raise ConfigError(f"{where}: {k} is not a section")
    cur[parts[-1]] = value
    twin = _ALIASES.get(tuple(parts))  # `--set data.source=x` replaces a sources list, and back
    if twin:
        cur.pop(twin, None)
    return data


def _defaults() -> dict:
    return RunConfig().model_dump(mode="json")


_ALIASES = {("data", "source"): "sources", ("data", "sources"): "source", ("seed",): "seeds", ("seeds",): "seed"}


def load_config(
    path_or_preset: str | None = None, overrides: list | None = None, values: dict | None = None
) -> RunConfig:
    """Load, override and validate a config. ``overrides``: ``--set`` strings (values parsed as YAML);
    ``values``: ``{dotted key: value}`` set as they are after them (a command-line path such as ``--output-dir``).

    Raises:
        ConfigError: listing every problem (unknown keys, wrong types, out-of-range values).
    """
    data, origin = read_yaml(path_or_preset)
    data = apply_overrides(data, overrides or [])
    for key, value in (values or {}).items():
        set_field(data, key, value)
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_errors(e, origin)) from None


def check_anchor_layers_offline(cfg) -> None:
    """Explicit ANCHOR layers past the student's depth, where the depth is known without loading the model
    (a preset's recorded depth, or a local folder's config.json num_hidden_layers).

    Raises:
        ConfigError: naming the method, the layers and the depth.
    """
    import json
    from pathlib import Path

    from .models.loading import PRESETS

    name = cfg.student.name
    depth = PRESETS[name].n_layers if name in PRESETS else None
    if depth is None and (Path(name) / "config.json").is_file():
        try:
            depth = json.loads((Path(name) / "config.json").read_text(encoding="utf-8")).get("num_hidden_layers")
        except (OSError, ValueError, AttributeError):
            depth = None
    if not isinstance(depth, int):
        return
    for m in cfg.expanded_methods():
        bad = m.method.layers_outside(m, depth)
        if bad:
            raise ConfigError(
                f"method {m.display}: anchor_layers {bad} outside 1..{depth}: the student {name} has {depth} layers"
            )
