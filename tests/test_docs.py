"""The docs agree with the code: every command the README and docs/ show parses with the CLI's own parser (and a
preset named with ``--set`` overrides validates), every ``make`` target exists, every YAML block is a valid run
config, every TOML block declares a method in the group the registry reads, every accelerate config named exists,
and every Python block runs somewhere in the suite (the README's notebook block in tests/test_api.py;
docs/using-models.md's in tests/test_export.py)."""

import re
import shlex
from pathlib import Path

import pytest
import yaml

import w2s_shift
from w2s_shift.cli import build_parser
from w2s_shift.config import RunConfig
from w2s_shift.config_io import load_config, preset_names
from w2s_shift.methods import ENTRY_POINT_GROUP

ROOT = Path(w2s_shift.__file__).parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^( *)```(\w*)\n(.*?)^\1```$", re.S | re.M)
# placeholders the docs write for a value, and a value of the type the parser expects
PLACEHOLDERS = {"LR": "1e-4", "N": "2", "F": "jsonl", "M": "2"}
# the Python blocks and the test that runs each (matched on a line of the block)
PYTHON_BLOCKS = {
    "README.md": ("from w2s_shift import load_run, run_grid", "tests/test_api.py"),
    "using-models.md": ("AutoModelForSequenceClassification.from_pretrained(path)", "tests/test_export.py"),
}


def blocks() -> list:
    """(file name, language, text) of every fenced block."""
    out = []
    for f in DOCS:
        for m in FENCE.finditer(f.read_text(encoding="utf-8")):
            out.append((f.name, m.group(2), "\n".join(ln[len(m.group(1)) :] for ln in m.group(3).splitlines())))
    return out


def shell_commands(text: str) -> list:
    """The commands of a bash block: continuation lines joined, comments dropped, a ``NAME=( ... )`` array expanded
    where ``"${NAME[@]}"`` uses it."""
    text = re.sub(r"\\\n\s*", " ", text)
    arrays = {m.group(1): m.group(2) for m in re.finditer(r"^(\w+)=\((.*?)\)\s*$", text, re.S | re.M)}
    text = re.sub(r"^(\w+)=\((.*?)\)\s*$", "", text, flags=re.S | re.M)
    for name, value in arrays.items():
        text = text.replace(f'"${{{name}[@]}}"', value.replace("\n", " "))
    return [ln.split("#", 1)[0].strip() for ln in text.splitlines() if ln.split("#", 1)[0].strip()]


def inline_commands() -> list:
    """(file name, command) of every inline ``w2s-shift ...`` code span, with ``[optional]`` brackets opened and
    ``...`` (more of the same) dropped (of alternatives ``A | B``, :func:`check_cli` takes the first)."""
    out = []
    for f in DOCS:
        for span in re.findall(r"`(w2s-shift [^`]+)`", f.read_text(encoding="utf-8")):
            if "${" in span or span.rstrip().endswith("..."):
                continue  # a shortened form (`w2s-shift run ... --overwrite`); full forms are parsed elsewhere
            out.append((f.name, span.replace("[no-]", "").replace("[", " ").replace("]", " ").replace("...", "")))
    return out


def check_cli(args: list, where: str) -> None:
    """Parse ``args`` with the CLI's parser; a preset given to ``run`` or ``plan`` must validate with its
    ``--set`` overrides."""
    while "|" in args:  # alternatives `A | B`: the first
        i = args.index("|")
        del args[i : i + 2]
    args = [PLACEHOLDERS.get(a.split("|")[0], a.split("|")[0]) for a in args]
    try:
        ns = build_parser().parse_args(args)
    except SystemExit as e:
        pytest.fail(f"{where}: `w2s-shift {shlex.join(args)}` does not parse (exit {e.code})")
    target = getattr(ns, "config", None) if ns.cmd == "run" else getattr(ns, "model", None)
    if ns.cmd in ("run", "plan") and target in preset_names():
        load_config(target, getattr(ns, "set", None) or [])


def test_every_documented_command_parses_and_its_preset_validates(capsys):
    seen = 0
    for name, lang, text in blocks():
        if lang != "bash":
            continue
        for cmd in shell_commands(text):
            words = shlex.split(cmd)
            where = f"{name}: {cmd}"
            if words[0] == "make":
                assert re.search(rf"^{words[1]}:", (ROOT / "Makefile").read_text(), re.M), where
            elif words[0] == "w2s-shift":
                check_cli(words[1:], where)
            elif words[:2] == ["accelerate", "launch"]:
                cfg = words[words.index("--config_file") + 1]
                assert (ROOT / cfg).is_file(), where
                check_cli(words[words.index("w2s_shift") + 1 :], where)
            else:
                pytest.fail(f"{where}: a command this test does not know how to check")
            seen += 1
    for name, span in inline_commands():
        args = shlex.split(span)[1:]
        if all(re.fullmatch(r"[a-z][a-z-]*", a) for a in args):  # a command named, not run (`w2s-shift evaluate`)
            with pytest.raises(SystemExit) as e:
                build_parser().parse_args([*args, "--help"])
            assert e.value.code == 0, f"{name}: `{span}` names no command"
        else:
            check_cli(args, f"{name}: `{span}`")
        seen += 1
    capsys.readouterr()
    assert seen >= 40


def test_a_wrong_flag_in_the_docs_would_fail():
    with pytest.raises(pytest.fail.Exception, match="does not parse"):
        check_cli(["evaluate", "RUN_DIR", "FILE", "--no-such-flag"], "here")
    with pytest.raises(Exception, match="no_such_field"):
        check_cli(["run", "quickstart", "--set", "student.no_such_field=1"], "here")


def test_every_yaml_block_is_a_run_config_and_every_toml_block_names_the_entry_point_group():
    langs = {}
    for _name, lang, text in blocks():
        langs[lang] = langs.get(lang, 0) + 1
        if lang == "yaml":
            RunConfig.model_validate(yaml.safe_load(text))
        elif lang == "toml":  # a pyproject section declaring a method plugin
            group = re.match(r'\[project\.entry-points\."([^"]+)"\]\n\w+ = "[\w.]+:\w+"\n?$', text)
            assert group and group.group(1) == ENTRY_POINT_GROUP, text
    assert langs.get("yaml") and langs.get("toml")
    assert set(langs) <= {"bash", "yaml", "toml", "python", "text", ""}, langs  # "": a drawing


def test_every_python_block_is_run_by_a_named_test():
    for name, lang, text in blocks():
        if lang != "python":
            continue
        assert name in PYTHON_BLOCKS, f"{name}: a Python block no test runs"
        marker, test = PYTHON_BLOCKS[name]
        assert marker in text, f"{name}: the block {test} runs has changed"
        assert name.removesuffix(".md") in (ROOT / test).read_text(encoding="utf-8") or name == "README.md"


TABLE = re.compile(r"^(?:### [^\n]*\(`(\w+)`\)|Fields of `(\w+)` \(`\w+`\):)\n\n((?:\|[^\n]*\n)+)", re.M)


def _type_text(annotation) -> str:
    """An annotation as the reference writes it: ``int | None``, ``list[int]``, ``Literal['a', 'b']``."""
    text = annotation.__name__ if isinstance(annotation, type) else str(annotation).replace("typing.", "")
    # Annotated[X, constraints or serialization]: X
    text = re.sub(r"Annotated\[([^\[\],]+), (?:FieldInfo\([^\]]*\]\)|SerializeAsAny\(\))\]", r"\1", text)
    return re.sub(r"\b[a-z_]\w*(?:\.[a-z_]\w*)*\.(?=[A-Z])", "", text)


def _default_text(field) -> str:
    from pydantic import BaseModel

    if field.is_required():
        return "required"
    value = field.default_factory() if field.default_factory is not None else field.default
    if isinstance(value, BaseModel):  # a section: only what it sets apart from its own defaults
        set_ = {k: v for k, v in value if v != type(value).model_fields[k].get_default(call_default_factory=True)}
        return f"{type(value).__name__}({', '.join(f'{k}={v!r}' for k, v in set_.items())})"
    if isinstance(value, list):
        return repr([getattr(v, "name", v) if isinstance(v, BaseModel) else v for v in value])
    return repr(value)


def field_rows(model) -> list:
    """The reference's rows of a pydantic model: | `field` | `type` | `default` | help |, a method's settings model
    without the fields every method entry has (name, label, seeds)."""
    from w2s_shift.methods import MethodConfig

    common = set(MethodConfig.model_fields) if issubclass(model, MethodConfig) and model is not MethodConfig else set()
    rows = []
    for k, f in model.model_fields.items():
        if k in common:
            continue
        cells = [f"`{k}`", f"`{_type_text(f.annotation)}`", f"`{_default_text(f)}`", f.description or ""]
        rows.append("| " + " | ".join(c.replace("|", "\\|") if i else c for i, c in enumerate(cells)) + " |")
    return rows


def _reference_tables(text: str) -> list:
    """(match, model) of each table of configuration.md's field reference."""
    from w2s_shift import config
    from w2s_shift.methods import get_method

    start = text.index("## Field reference")
    out = []
    for m in TABLE.finditer(text, start):
        out.append((m, getattr(config, m.group(1)) if m.group(1) else get_method(m.group(2)).config))
    return out


def test_the_field_reference_is_generated_from_the_models():
    """docs/configuration.md's field reference equals the models' fields, types, defaults and help texts
    (``W2S_WRITE_DOCS=1`` rewrites its tables from the code)."""
    import os

    f = ROOT / "docs" / "configuration.md"
    text = f.read_text(encoding="utf-8")
    tables = _reference_tables(text)
    assert len(tables) >= 11
    new = text
    for m, model in reversed(tables):
        want = "\n".join(m.group(3).splitlines()[:2] + field_rows(model)) + "\n"
        new = new[: m.start(3)] + want + new[m.end(3) :]
    if os.environ.get("W2S_WRITE_DOCS"):
        f.write_text(new, encoding="utf-8")
    diff = [a for a, b in zip(text.splitlines(), new.splitlines()) if a != b]
    assert new == text, "docs/configuration.md differs from the models (W2S_WRITE_DOCS=1 rewrites it):\n" + "\n".join(
        diff[:5]
    )
