"""HTML reports (`--html FILE` on run, compare, sweep and plan): one self-contained page a
person opens offline and shares.

The charts are plotly figures (plotly.py writes a figure as a JSON spec that its own JavaScript
library draws, zoomable, with hover text; the library is inlined once per page, so the file
works without a network: about 4.8 MB of it). plotly was chosen over bokeh and altair because
one library then serves every chart here (timelines as bars with a base, stacked breakdowns,
step lines, heatmaps, scatter with a front) and its HTML needs no server or notebook; over
matplotlib's SVG because a pipeline of hundreds of microbatches needs zooming.

Every number the page prints from a summary sits in an element with `data-key` (the summary's
key) and `data-value` (its JSON value), so a reader, or a test, can check the page against
summary.json. The only hand-written JavaScript is a table sorter (a click on a column head).
"""

from __future__ import annotations

import html
import json
from pathlib import Path

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 24px auto;
       max-width: 1280px; color: #222; padding: 0 16px; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
p.sub { color: #555; margin-top: 0; }
table { border-collapse: collapse; font-size: 0.9em; margin: 8px 0; }
th, td { border-bottom: 1px solid #ddd; padding: 4px 10px; text-align: right; white-space: nowrap; }
th { background: #f4f4f4; } td.l, th.l { text-align: left; }
table.sortable th { cursor: pointer; } table.sortable th:hover { background: #e8e8e8; }
tr.best td { font-weight: 600; } .note { color: #555; font-size: 0.9em; }
.scroll { overflow-x: auto; }
"""

_SORT_JS = """
document.querySelectorAll("table.sortable").forEach(function (table) {
  table.querySelectorAll("th").forEach(function (th, col) {
    th.addEventListener("click", function () {
      var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
      var asc = th.dataset.dir !== "asc";
      rows.sort(function (a, b) {
        var x = a.cells[col].dataset.value, y = b.cells[col].dataset.value;
        if (x === "null" || y === "null") { return (x === "null") - (y === "null"); }  // empty cells last
        var nx = parseFloat(x), ny = parseFloat(y);
        var c = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : String(x).localeCompare(String(y));
        return asc ? c : -c;
      });
      rows.forEach(function (r) { body.appendChild(r); });
      table.querySelectorAll("th").forEach(function (h) { delete h.dataset.dir; });
      th.dataset.dir = asc ? "asc" : "desc";
    });
  });
});
"""


def _plotly():
    try:
        import plotly.graph_objects as go
        import plotly.offline
    except ImportError:      # pragma: no cover - plotly is a dependency
        from sim.errors import ConfigError
        raise ConfigError("--html needs plotly (pip install plotly)", key="--html") from None
    return go, plotly.offline


def esc(text) -> str:
    return html.escape(str(text), quote=True)


def value_text(value, fmt: str | None = None) -> str:
    """How a summary value is printed: floats with 4 significant digits (or `fmt`), booleans as
    yes / no, None as a dash."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return format(value, fmt or ".4g")
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def cell(value, *, key: str | None = None, fmt: str | None = None, left: bool = False) -> str:
    """A table cell showing `value`, carrying it exactly in data-value (and its summary key)."""
    attrs = f' data-value="{esc(json.dumps(value))}"'
    if key is not None:
        attrs += f' data-key="{esc(key)}"'
    cls = ' class="l"' if left or isinstance(value, str) else ""
    return f"<td{cls}{attrs}>{esc(value_text(value, fmt))}</td>"


def key_value_table(rows: list[tuple]) -> str:
    """(label, summary key, value[, format]) rows as a two-column table."""
    out = ["<table>"]
    for row in rows:
        label, key, value = row[:3]
        fmt = row[3] if len(row) > 3 else None
        out.append(f'<tr><th class="l">{esc(label)}</th>{cell(value, key=key, fmt=fmt)}</tr>')
    out.append("</table>")
    return "\n".join(out)


def data_table(columns: list[tuple], rows: list[dict], *, sortable: bool = True, best: int | None = None,
               table_id: str = "", key_prefix: str | None = None) -> str:
    """A table of `rows` (dicts), columns (heading, row key[, format]); sortable by a click on a
    heading; row index `best` in bold. Each cell's data-key is its column's key, or with
    `key_prefix` the path "prefix.row index.key" (e.g. memory.per_stage.0.total_gib)."""
    cls = ' class="sortable"' if sortable else ""
    ident = f' id="{esc(table_id)}"' if table_id else ""
    head = "".join(f'<th class="l">{esc(c[0])}</th>' if rows and isinstance(rows[0].get(c[1]), str)
                   else f"<th>{esc(c[0])}</th>" for c in columns)
    out = [f'<div class="scroll"><table{cls}{ident}><thead><tr>{head}</tr></thead><tbody>']
    for i, r in enumerate(rows):
        tr = ' class="best"' if i == best else ""
        out.append(f"<tr{tr}>" + "".join(
            cell(r.get(c[1]), key=c[1] if key_prefix is None else f"{key_prefix}.{i}.{c[1]}",
                 fmt=c[2] if len(c) > 2 else None) for c in columns) + "</tr>")
    out.append("</tbody></table></div>")
    return "\n".join(out)


def figure(fig, div_id: str) -> str:
    """A plotly figure as a div (the library itself is inlined once by `page`)."""
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id,
                       config={"displaylogo": False, "responsive": True})


def page(title: str, subtitle: str, sections: list[tuple]) -> str:
    """The whole document: (heading, html) sections under a title, plotly.js inlined once."""
    _, offline = _plotly()
    body = "\n".join(f"<h2>{esc(h)}</h2>\n{content}" if h else content for h, content in sections)
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
            f"<title>{esc(title)}</title>\n<style>{_CSS}</style>\n"
            f"<script type=\"text/javascript\">{offline.get_plotlyjs()}</script>\n</head><body>\n"
            f"<h1>{esc(title)}</h1>\n<p class=\"sub\">{esc(subtitle)}</p>\n{body}\n"
            f"<script>{_SORT_JS}</script>\n</body></html>\n")


def check_path(path: Path, flag: str = "--html", example: str = "report.html") -> Path:
    """Fail before simulating, not after: the file `flag` names (the report's, or `example`'s
    kind) must be a writable file path."""
    from sim.errors import ConfigError

    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{flag} {path}: is a folder; give a file name such as {path / example}",
                          key=flag)
    from sim.paths import check_writable

    check_writable(path, flag)
    return path


CHART_SUFFIXES = (".png", ".svg", ".pdf", ".jpg", ".jpeg")
"""The chart files `--plot` writes (matplotlib's Agg canvas, by the name's suffix)."""


def check_chart_path(path: Path, flag: str = "--plot", example: str = "chart.png") -> Path:
    """`check_path` for a chart: its name must end in one of CHART_SUFFIXES (a name without one
    had been written with .png added, a file other than the one named and printed; another suffix
    failed after the work, in matplotlib)."""
    from sim.errors import ConfigError

    path = Path(path)
    if not path.is_dir() and path.suffix.lower() not in CHART_SUFFIXES:
        raise ConfigError(f"{flag} {path}: a chart is written as {', '.join(s[1:] for s in CHART_SUFFIXES)}, by "
                          f"the file name's suffix: name it e.g. {path.with_name(path.stem + '.png')}", key=flag)
    return check_path(path, flag, example)


def check_distinct(paths: dict, folders: dict | None = None, owned: tuple = ()) -> None:
    """The files a command will write ({flag: path, or None where not asked for}) must be distinct
    files: two flags naming one file, the second would overwrite the first (a sweep's table with
    its HTML report). With `folders` ({what: folder} it writes into) too: no file may be one of
    them, or a folder another output goes into, nor be a folder already; no folder a file
    already (`sim5d run --out R --html R/summary.json` had left summary.json holding the report,
    `--html R` and a folder named R/summary.json had ended in a traceback). `owned`: those of
    `folders` whose files the command names itself (run's traces/, plan's sweeps/): no other
    output in them (a report named like a trace or a sweep's table had replaced it)."""
    from sim.errors import ConfigError

    seen: dict = {}
    entries = [(flag, Path(path), True) for flag, path in (folders or {}).items() if path is not None]
    entries += [(flag, Path(path), False) for flag, path in paths.items() if path is not None]
    resolved = {}
    for flag, path, _ in entries:
        try:
            resolved[flag] = path.resolve()
        except (OSError, RuntimeError):         # (Python 3.11 raises RuntimeError on a link loop)
            raise ConfigError(f"{flag} {path}: is a symbolic link loop (or under one); give another path",
                              key=_flag(flag)) from None
    for flag, path, is_folder in entries:
        key = resolved[flag]
        if key in seen:
            other, folder = seen[key]
            raise ConfigError(f"{flag} {path}: {other} names the same {'path' if is_folder or folder else 'file'}; "
                              "give each its own", key=_flag(flag))
        seen[key] = (flag, is_folder)
    for flag, path, is_folder in entries:
        key = resolved[flag]
        derived = flag != _flag(flag)           # (a flag's own path: check_path / check_folder say more)
        if derived and is_folder and key.exists() and not key.is_dir():
            raise ConfigError(f"{flag} {path}: is a file, where a folder is written; move it or choose another "
                              "folder", key=_flag(flag))
        if is_folder:
            continue
        if derived and key.is_dir():
            raise ConfigError(f"{flag} {path}: is a folder, where a file is written; move it or name another file",
                              key=_flag(flag))
        if key.is_dir():                # (a flag's own folder: check_path names it and a file to give)
            continue
        home = next((f for f in owned if f in resolved and resolved[f] in key.parents), None)
        if home is not None:
            raise ConfigError(f"{flag} {path}: is inside {home} {resolved[home]}, whose files the command names "
                              f"itself; put {flag} elsewhere", key=_flag(flag))
        inside = next(((f, p) for f, p, _ in entries if f != flag and key in resolved[f].parents), None)
        if inside is not None:
            raise ConfigError(f"{flag} {path}: {inside[0]} {inside[1]} is written inside it, as a folder; give "
                              f"{flag} a file of its own", key=_flag(flag))


def _flag(what: str) -> str:
    """The flag of an output check_distinct names ("--out's summary.json": --out)."""
    return what.partition("'")[0]


def write(path: Path, text: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)         # (no half-written report left beside the path)
        raise
    return path
