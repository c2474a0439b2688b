"""Sphinx extension: tables and numbers rendered at build time from the committed result files.

``result-table`` renders a table whose cell (row, column) is the value at ``path`` (default
``{col}``) in ``file``, both formatted with ``{row}`` and ``{col}``; ``:rows: @POINTER|KEY`` makes
one row per item of a list in the file, labelled by the item's KEY::

    ```{result-table}
    :file: @shipped/test/calibration.json
    :path: pooled/{col}/{row}/nll
    :rows: uc=Primary (UC); ts=Primary+TS; card=CARD
    :columns: clean; bias; motion=motion|.2f
    :format: .3f
    ```

A column's label may end in ``|FORMAT``, its own format. Below the table a line names each file read, its release and the commit its choices were frozen
at. ``{result}`` renders one value in running text: ``{result}`@shipped/test/dice.json#summary/mean|.3f```.
References are those of :mod:`cardseg_results`; one that names no value fails the build.
"""

from __future__ import annotations

from typing import List, Tuple

from docutils import nodes
from docutils.parsers.rst import Directive, directives

import cardseg_results as results


def _pairs(text: str) -> List[Tuple[str, str]]:
    """``key=Label; key2; ...`` into ``[(key, label), ...]`` (the label defaults to the key)."""
    out = []
    for item in [t.strip() for t in (text or "").split(";") if t.strip()]:
        key, _, label = item.partition("=")
        out.append((key.strip(), (label or key).strip()))
    return out


def _fill(template: str, row: str, col: str) -> str:
    """``template`` with ``{col}`` and then ``{row}`` replaced (a column key may hold ``{row}``)."""
    return template.replace("{col}", col).replace("{row}", row)


def _rows(spec: str, file_spec: str) -> List[Tuple[str, str]]:
    """The table's rows: ``key=Label; ...``, or ``@POINTER|KEY``: one row per item of the list at
    POINTER in the (row-independent) file, keyed ``POINTER/index`` and labelled by its KEY."""
    if not spec.strip().startswith("@"):
        return _pairs(spec)
    pointer, _, label_key = spec.strip()[1:].partition("|")
    items = results.lookup(results.load(results.resolve_file(file_spec).path), pointer)
    if not isinstance(items, list):
        raise results.ResultError(f"#{pointer}: not a list")
    return [(f"{pointer.strip('/')}/{i}", str(item.get(label_key, i))) for i, item in enumerate(items)]


def _cell(text: str) -> nodes.entry:
    entry = nodes.entry()
    entry += nodes.paragraph(text=text)
    return entry


def _row(cells: List[str]) -> nodes.row:
    row = nodes.row()
    for text in cells:
        row += _cell(text)
    return row


class ResultTable(Directive):
    """The ``result-table`` directive (see the module docstring)."""

    has_content = False
    option_spec = {
        "file": directives.unchanged_required,
        "path": directives.unchanged_required,
        "rows": directives.unchanged_required,
        "columns": directives.unchanged_required,
        "format": directives.unchanged,
        "header": directives.unchanged,
        "caption": directives.unchanged,
    }

    def run(self):
        opts = self.options
        for key in ("file", "rows", "columns"):
            if key not in opts:
                raise self.error(f"result-table needs :{key}:")
        path = opts.get("path", "{col}")
        cols = [(key, *label.partition("|")[::2]) for key, label in _pairs(opts["columns"])]
        sources: List[results.Source] = []
        body = []
        try:
            rows = _rows(opts["rows"], opts["file"])
            for rkey, rlabel in rows:
                cells = [rlabel]
                for ckey, _, fmt in cols:
                    source = results.resolve_file(_fill(opts["file"], rkey, ckey))
                    value = results.lookup(results.load(source.path), _fill(path, rkey, ckey))
                    cells.append(results.format_value(value, fmt or opts.get("format", "")))
                    if source not in sources:
                        sources.append(source)
                body.append(cells)
        except results.ResultError as exc:
            raise self.error(f"result-table: {exc}") from None
        table = nodes.table(classes=["result-table"])
        group = nodes.tgroup(cols=len(cols) + 1)
        table += group
        for _ in range(len(cols) + 1):
            group += nodes.colspec(colwidth=1)
        head = nodes.thead()
        head += _row([opts.get("header", "")] + [label for _, label, _ in cols])
        group += head
        tbody = nodes.tbody()
        for cells in body:
            tbody += _row(cells)
        group += tbody
        if opts.get("caption"):
            title = nodes.title(text=opts["caption"])
            table.insert(0, title)
        note = nodes.paragraph(classes=["result-source"])
        note += nodes.Text("Generated from the result files: " + "; ".join(_plain(s) for s in sources) + ".")
        return [table, note]


def _plain(source: results.Source) -> str:
    return results.provenance(source).replace("`", "")


def result_role(name, rawtext, text, lineno, inliner, options=None, content=None):
    """``{result}`REF```: one value from a result file, in running text."""
    try:
        value, source = results.value_of(text)
    except results.ResultError as exc:
        msg = inliner.reporter.error(f"result: {exc}", line=lineno)
        return [inliner.problematic(rawtext, rawtext, msg)], [msg]
    node = nodes.inline(text=value, classes=["result-value"])
    return [node], []


def setup(app):
    app.add_directive("result-table", ResultTable)
    app.add_role("result", result_role)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
