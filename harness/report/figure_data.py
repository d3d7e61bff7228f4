"""What a figure draws, as data, and the contract every figure is held to where it is saved.

A figure is checked through what it draws, not its pixels: :func:`figure_data` reads the
matplotlib figure (size, and per panel its title, axis labels, legend entries with their colours,
and each series with its colour, marker, line style and points) and :func:`save` writes it beside
the PNG and PDF as ``<name>.figure.json``, so a regenerated figure can be compared with a committed one
and a test can read what a reader would see. :func:`check` refuses, naming the figure, what a
reader of a paper would take for a defect:

- wider than a two-column page (7.16 in, as saved: the tight box around everything drawn);
- a colour drawn as bars that no legend entry explains (a timeline's action kinds), or two legend
  entries with one look (colour, marker and line style);
- a machine's path in the name, a title, a label or a legend entry;
- no title: a figure pasted into a paper names its model, data and (simulated) cluster.

A figure none of whose panels' lines and points spread over two x values (:func:`one_valued`) is
not drawn at all: a curve of one point says nothing a table does not.
"""

from __future__ import annotations

import json
import os
import re

from matplotlib.collections import Collection, PathCollection
from matplotlib.colors import to_hex
from matplotlib.container import Container
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

BARS = "bars"  # the gid of a collection of bars (broken_barh): each of its paths is a bar
SUFFIX = ".figure.json"  # beside NAME.png: what it draws (a trace_*.json beside it is a Perfetto trace)
MAX_WIDTH_IN = 7.16  # a two-column page's text width
PAD_IN = 0.1  # what savefig's tight box adds on each side (savefig.pad_inches)
# an absolute path of a machine: /home/x, /tmp/y, /work/..., C:\Users
_MACHINE_PATH = re.compile(r"(^|[\s(\"'=:])(/(home|root|tmp|work|Users|var|mnt|scratch)/|[A-Za-z]:\\)")


class FigureContractError(ValueError):
    """A figure that breaks the contract; the message names the figure and what to change, and
    ``paths`` what was written beside it (the other figures of a set that drew)."""

    def __init__(self, message: str, paths: list[str] | None = None):
        super().__init__(message)
        self.paths = paths or []


def _colour(value) -> str | None:
    try:
        return to_hex(value, keep_alpha=False)
    except (TypeError, ValueError):
        return None


def _look(handle) -> dict:
    """How a legend entry's handle looks: colour, marker, line style (lines), hatch (bars)."""
    if isinstance(handle, Container) and len(handle):  # an errorbar's or a bar chart's artists
        handle = handle[0]
    if isinstance(handle, Line2D):
        return {
            "colour": _colour(handle.get_color()),
            "marker": str(handle.get_marker()),
            "line": handle.get_linestyle(),
        }
    if isinstance(handle, Patch):
        return {"colour": _colour(handle.get_facecolor()), "hatch": handle.get_hatch() or ""}
    if isinstance(handle, Collection):
        faces = handle.get_facecolor() if len(handle.get_facecolor()) else handle.get_edgecolor()
        return {"colour": _colour(faces[0]) if len(faces) else None}
    return {"colour": None}


def _legend_entries(fig) -> list[dict]:
    entries = []
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]
    for legend in legends:
        # the artists the legend was made from, where kept (a legend draws an errorbar as its bar)
        handles = getattr(legend, "source_handles", legend.legend_handles)
        for handle, text in zip(handles, legend.get_texts()):
            entries.append({"label": text.get_text(), **_look(handle)})
    return entries


def _rounded(points) -> list[list[float]]:
    return [[float(f"{v:.6g}") for v in p] for p in points]


def _panel(ax) -> dict:
    series = []
    for line in ax.get_lines():
        series.append(
            {
                "kind": "line",
                "label": line.get_label(),
                "colour": _colour(line.get_color()),
                "marker": str(line.get_marker()),
                "line": line.get_linestyle(),
                "points": _rounded(line.get_xydata()),
            }
        )
    bars: dict[str, int] = {}
    for patch in ax.patches:
        if isinstance(patch, Rectangle):
            colour = _colour(patch.get_facecolor())
            bars[colour] = bars.get(colour, 0) + 1
    for collection in ax.collections:
        if collection.get_gid() == BARS:  # bars drawn as one collection (a timeline's spans)
            colour = _colour(collection.get_facecolor()[0])
            bars[colour] = bars.get(colour, 0) + len(collection.get_paths())
            continue
        if not isinstance(collection, PathCollection):  # error bars, bands: drawn with their series
            continue
        faces = collection.get_facecolor()
        series.append(
            {
                "kind": "points",
                "label": collection.get_label(),
                "colours": sorted({_colour(f) for f in faces}),
                "points": _rounded(collection.get_offsets()),
            }
        )
    return {
        "title": ax.get_title(loc="left") or ax.get_title(),
        "x": {"label": ax.get_xlabel(), "scale": ax.get_xscale()},
        "y": {"label": ax.get_ylabel(), "scale": ax.get_yscale()},
        "series": series,
        "bar_colours": bars,
    }


def figure_data(fig, name: str) -> dict:
    """The figure as the data it draws (see the module's docstring)."""
    renderer = fig.canvas.get_renderer()
    box = fig.get_tightbbox(renderer)
    return {
        "name": name,
        "size_in": [round(box.width + 2 * PAD_IN, 2), round(box.height + 2 * PAD_IN, 2)],
        "title": fig._suptitle.get_text() if fig._suptitle else "",
        "legend": _legend_entries(fig),
        "panels": [_panel(ax) for ax in fig.axes],
    }


def one_valued(data: dict) -> bool:
    """Whether every panel that draws lines or points draws them at one x value."""
    spans = [{p[0] for series in panel["series"] for p in series["points"]} for panel in data["panels"]]
    drawn = [xs for xs in spans if xs]
    return bool(drawn) and all(len(xs) == 1 for xs in drawn)


def check(data: dict) -> None:
    """Refuse a figure that breaks the contract (the module's docstring)."""
    name = data["name"]
    problems = []
    width = data["size_in"][0]
    if width > MAX_WIDTH_IN + 0.01:
        problems.append(f"it is {width:.2f} in wide, over a page's {MAX_WIDTH_IN} in (fewer legend columns or panels)")
    if not (data["title"] or any(panel["title"] for panel in data["panels"])):
        problems.append("it has no title (the model, the data, and a simulated run's cluster)")
    legend_colours = {e.get("colour") for e in data["legend"]}
    for panel in data["panels"]:
        unexplained = sorted(c for c in panel["bar_colours"] if c not in legend_colours)
        if data["legend"] and unexplained:
            problems.append(f"bars coloured {', '.join(unexplained)} have no legend entry")
    looks = [(e.get("colour"), e.get("marker"), e.get("line"), e.get("hatch")) for e in data["legend"]]
    twins = sorted({e["label"] for e, look in zip(data["legend"], looks) if looks.count(look) > 1})
    if twins:
        problems.append(f"legend entries {', '.join(twins)} look the same")
    texts = [name, data["title"], *(e["label"] for e in data["legend"])]
    for panel in data["panels"]:
        texts += [panel["title"], panel["x"]["label"], panel["y"]["label"]]
    pathy = [t for t in texts if t and _MACHINE_PATH.search(t)]
    if pathy:
        problems.append(f"a machine's path is in {pathy[0]!r}")
    if problems:
        raise FigureContractError(f"figure {name}: " + "; ".join(problems))


def write(data: dict, out_dir: str) -> str:
    path = os.path.join(out_dir, f"{data['name']}{SUFFIX}")
    with open(path, "w") as f:
        json.dump(data, f, sort_keys=True, separators=(",", ":"))  # compact: curves hold thousands of points
        f.write("\n")
    return path
