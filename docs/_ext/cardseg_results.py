"""Numbers for the documentation, read from the committed result files.

A *reference* names one value: ``FILE#POINTER`` with an optional ``|FORMAT``, e.g.
``@shipped/test/dice.json#summary/mean|.3f``. ``FILE`` is a path from the repository root or starts
with a release: ``@shipped`` (the release that ``CARDSegment/cardseg/bundles/acdc/bundle.json``
names) or ``@acdc-X.Y.Z``; ``@bundle`` alone is that ``bundle.json``; a release's file that is not in its own folder
``Training/results/acdc-X.Y.Z/`` is looked up in the release its ``kept.json`` says it keeps it
from, and so on. ``POINTER`` is a JSON pointer (``/a/b/0``, or ``a/b/0``; ``~1`` is ``/``).
``FORMAT`` is a Python format spec (``.3f``, ``,d``) or ``%N``: a fraction shown as a percentage
with N decimals; ``len``: how many items a list or object holds.

The same references serve the Sphinx directives of :mod:`cardseg_docs` and the text templates
(``{{ REF }}``) that ``docs/tools/generate.py`` fills in for the README and the model card.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

REPO = Path(__file__).resolve().parents[2]
SHIPPED_BUNDLE = REPO / "CARDSegment" / "cardseg" / "bundles" / "acdc" / "bundle.json"
RESULTS = REPO / "Training" / "results"
RELEASES = REPO / "docs" / "_data" / "releases.json"
#: ``{{ REF }}`` in a text template
TEMPLATE_FIELD = re.compile(r"\{\{\s*([^{}]+?)\s*\}\}")


class ResultError(ValueError):
    """A reference that names no file, no value, or a value of the wrong kind."""


@dataclass(frozen=True)
class Source:
    """Where a value came from: the file (relative to the repository) and its release."""

    path: Path
    release: Optional[str]

    @property
    def relative(self) -> str:
        return self.path.relative_to(REPO).as_posix()


def shipped_release() -> str:
    """``acdc-X.Y.Z`` of the bundle shipped inside the package."""
    ident = json.loads(SHIPPED_BUNDLE.read_text(encoding="utf-8"))["id"]
    return f"{ident['name']}-{ident['version']}"


def freeze_commit(release: Optional[str]) -> Optional[str]:
    """The commit at which ``release``'s choices were frozen (``docs/_data/releases.json``)."""
    if release is None:
        return None
    table = json.loads(RELEASES.read_text(encoding="utf-8"))
    return table.get(release, {}).get("frozen_at")


def _kept_from(release: str) -> Optional[str]:
    kept = RESULTS / release / "kept.json"
    if not kept.is_file():
        return None
    return json.loads(kept.read_text(encoding="utf-8")).get("from")


def resolve_file(spec: str) -> Source:
    """The file a reference's ``FILE`` part names (see the module docstring)."""
    spec = spec.strip()
    if spec == "@bundle":
        return Source(SHIPPED_BUNDLE, None)
    if not spec.startswith("@"):
        path = (REPO / spec).resolve()
        if not path.is_file() or REPO not in path.parents:
            raise ResultError(f"{spec}: no such result file in the repository")
        release = next((p for p in path.relative_to(REPO).parts if p.startswith("acdc-")), None)
        return Source(path, release)
    head, _, rest = spec[1:].partition("/")
    release = shipped_release() if head == "shipped" else head
    seen = []
    while release is not None and release not in seen:
        seen.append(release)
        path = RESULTS / release / rest
        if path.is_file():
            return Source(path, release)
        release = _kept_from(release)
    raise ResultError(f"{spec}: not in {', '.join('Training/results/' + r for r in seen)}")


_JSON_CACHE: Dict[Path, Any] = {}


def load(path: Path) -> Any:
    if path not in _JSON_CACHE:
        _JSON_CACHE[path] = json.loads(path.read_text(encoding="utf-8"))
    return _JSON_CACHE[path]


def lookup(data: Any, pointer: str) -> Any:
    """The value at a JSON pointer (leading ``/`` optional; list items by index)."""
    node = data
    for raw in [p for p in pointer.strip().strip("/").split("/") if p != ""]:
        key = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, list):
            try:
                node = node[int(key)]
            except (ValueError, IndexError):
                raise ResultError(f"#{pointer}: no item {key!r}") from None
        elif isinstance(node, dict) and key in node:
            node = node[key]
        else:
            raise ResultError(f"#{pointer}: no key {key!r}")
    return node


def format_value(value: Any, spec: str = "") -> str:
    """``value`` as text: a format spec, ``%N`` (a fraction as a percentage), ``len`` (the number
    of items of a list or object), or ``str``; a boolean is ``yes`` or ``no``."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if spec == "len":
        if not isinstance(value, (list, dict)):
            raise ResultError(f"format 'len' needs a list or an object, not {value!r}")
        return str(len(value))
    if spec.startswith("%"):
        digits = int(spec[1:] or 0)
        return f"{100 * float(value):.{digits}f}%"
    if spec:
        if not isinstance(value, (int, float)):
            raise ResultError(f"format {spec!r} needs a number, not {value!r}")
        if isinstance(value, int) and spec.endswith(("f", "e", "g")):
            return str(value)  # a count stays a whole number
        return format(value, spec)
    return str(value)


def split_reference(ref: str) -> Tuple[str, str, str]:
    """``FILE#POINTER|FORMAT`` into its three parts (POINTER and FORMAT may be empty)."""
    body, _, spec = ref.partition("|")
    file_part, _, pointer = body.partition("#")
    return file_part.strip(), pointer.strip(), spec.strip()


def value_of(ref: str) -> Tuple[str, Source]:
    """The formatted value a reference names, and where it came from."""
    file_part, pointer, spec = split_reference(ref)
    source = resolve_file(file_part)
    return format_value(lookup(load(source.path), pointer), spec), source


def fill_template(text: str) -> Tuple[str, list]:
    """``text`` with every ``{{ REF }}`` replaced by its value; also the sources used, in order."""
    sources: list = []

    def one(match: "re.Match[str]") -> str:
        value, source = value_of(match.group(1))
        if source not in sources:
            sources.append(source)
        return value

    filled = TEMPLATE_FIELD.sub(one, text)
    return filled, sources


def provenance(source: Source) -> str:
    """One line naming a value's release, its freeze commit and its file."""
    if source.release is None:
        return f"from `{source.relative}`"
    commit = freeze_commit(source.release)
    frozen = f"frozen at commit {commit}" if commit else "freeze commit not recorded"
    return f"release {source.release} ({frozen}), from `{source.relative}`"
