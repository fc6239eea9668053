"""SVG scatter plots: latency (x) against a quality metric (y), marker area by model size.

Every point is a ``<g class="point">`` with its data attributes (``data-build``, ``data-version``)
and an SVG ``<title>`` (the browser's tooltip). A build that lacks one of the two figures is still
drawn, once, in a strip beside the axis it lacks, under a note saying so ("no latency"); labels
go where they overlap no other label or marker, or are left to the legend.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from zoo.site.svg import element, esc, text_width
from zoo.site.text import number

WIDTH, HEIGHT = 680, 380
LEFT, RIGHT, TOP, BOTTOM = 76, 16, 16, 56
STRIP = 92  # width of the "no latency" strip, height of the "no <metric>" strip is STRIP_Y
STRIP_Y = 38
GAP = 10
R_MIN, R_MAX = 4.5, 13.0
# The quality axis spans at least this fraction of its largest magnitude: padded around its own
# min and max, accuracies of 0.930 and 0.933 filled the plot's height, and a 0.3-point gap looked
# like a gulf. With it, a difference looks as large as it is next to the values themselves (an
# accuracy near 0.93: about 0.09, nine points, kept within [0, 1]); the tick labels and each
# point's tooltip give the exact figures.
Y_MIN_SPAN = 0.1
Y_AXIS_NOTE = ("The vertical axis spans at least a tenth of its largest value, so a small difference "
               "looks small; hover a point for its exact figures.")


@dataclass
class Point:
    """One marker: `x`/`y` may be None (drawn in the strip of the missing axis); `size` in bytes."""

    x: float | None
    y: float | None
    size: int | None
    colour: str
    title: str
    data: dict[str, str] = field(default_factory=dict)
    label: str | None = None
    emphasis: bool = False


@dataclass
class Axis:
    """A scale from data values to pixels over [lo, hi] → [start, end]."""

    lo: float
    hi: float
    start: float
    end: float
    log: bool = False

    def __call__(self, value: float) -> float:
        if self.log:
            value, lo, hi = math.log10(value), math.log10(self.lo), math.log10(self.hi)
        else:
            lo, hi = self.lo, self.hi
        return self.start + (value - lo) / (hi - lo) * (self.end - self.start)


def scatter(points: list[Point], *, x_label: str, y_label: str, css_class: str, description: str,
            no_x: str = "no latency", no_y: str = "no metric") -> str:
    """The SVG of a scatter plot of `points` (x: latency in ms, y: the metric)."""
    has_x_strip = any(p.x is None or p.x <= 0 for p in points)  # no latency (0 ms is none either)
    has_y_strip = any(p.y is None for p in points)
    plot_right = WIDTH - RIGHT - (STRIP + GAP if has_x_strip else 0)
    plot_bottom = HEIGHT - BOTTOM - (STRIP_Y + GAP if has_y_strip else 0)
    xs = [p.x for p in points if p.x is not None and p.x > 0]
    ys = [p.y for p in points if p.y is not None]
    x_axis = _x_axis(xs, LEFT, plot_right)
    y_axis = _y_axis(ys, plot_bottom, TOP)
    x_label += " (log scale)" if x_axis.log else ""
    parts = [_frame(x_axis, y_axis, plot_right, plot_bottom, x_label, y_label)]
    if has_x_strip:
        x0 = plot_right + GAP
        parts.append(element("rect", x=float(x0), y=float(TOP), width=float(STRIP), height=float(HEIGHT - BOTTOM - TOP),
                             class_="strip"))
        parts.append(element("text", esc(no_x), x=x0 + STRIP / 2, y=float(TOP + 12), class_="strip-note",
                             text_anchor="middle"))
    if has_y_strip:
        y0 = plot_bottom + GAP
        parts.append(element("rect", x=float(LEFT), y=float(y0), width=float(plot_right - LEFT), height=float(STRIP_Y),
                             class_="strip"))
        parts.append(element("text", esc(no_y), x=float(LEFT + 6), y=y0 + STRIP_Y - 6, class_="strip-note"))
    placed = _positions(points, x_axis, y_axis, plot_right, plot_bottom)
    radii = _radii(points)
    for p, (cx, cy), r in zip(points, placed, radii):
        circle = element("circle", cx=cx, cy=cy, r=r, fill=p.colour, class_="marker emphasis" if p.emphasis else "marker")
        data = {f"data_{k.replace('-', '_')}": v for k, v in p.data.items()}
        parts.append(element("g", element("title", esc(p.title)) + circle, class_="point", **data))
    parts.extend(_labels(points, placed, radii))
    return element("svg", "".join(parts), xmlns="http://www.w3.org/2000/svg", viewBox=f"0 0 {WIDTH} {HEIGHT}",
                   class_=f"plot {css_class}", role="img", aria_label=description)


def _x_axis(xs: list[float], start: float, end: float) -> Axis:
    if not xs:
        return Axis(0.0, 1.0, start, end)
    lo, hi = min(xs), max(xs)
    if lo > 0 and hi / lo >= 8:  # orders of magnitude apart: a log scale keeps the small ones apart
        return Axis(lo / 1.35, hi * 1.35, start, end, log=True)
    lo, hi = _padded(lo, hi, floor=0.0)
    return Axis(lo, hi, start, end)


def _y_axis(ys: list[float], start: float, end: float) -> Axis:
    """The quality axis: the values with a margin, at least `Y_MIN_SPAN` of the largest magnitude
    tall (see there), never below 0 for values that are not, nor above 1 for fractions."""
    if not ys:
        return Axis(0.0, 1.0, start, end)
    lo, hi = min(ys), max(ys)
    fraction = 0 <= lo and hi <= 1
    floor, ceiling = (0.0 if lo >= 0 else None), (1.0 if fraction else None)
    least = Y_MIN_SPAN * max(abs(lo), abs(hi)) or 1e-3  # relative: an mae of 0.004 is no accuracy
    if hi - lo < least:  # widen around the values' middle, then slide back inside [floor, ceiling]
        middle = (lo + hi) / 2
        lo, hi = middle - least / 2, middle + least / 2
        if floor is not None and lo < floor:
            lo, hi = floor, floor + least
        if ceiling is not None and hi > ceiling:
            lo, hi = ceiling - least, ceiling
    lo, hi = _padded(lo, hi, floor=floor)
    if ceiling is not None:
        hi = min(hi, ceiling)
    return Axis(lo, hi, start, end)


def _padded(lo: float, hi: float, floor: float | None = None) -> tuple[float, float]:
    """[lo, hi] with a margin (a lone value gets a small range around it), not below `floor`."""
    span = hi - lo
    pad = span * 0.12 if span > 0 else max(abs(hi) * 0.02, 1e-3)
    lo, hi = lo - pad, hi + pad
    if floor is not None and lo < floor <= lo + pad:  # the margin crossed the floor (0 ms): stop there
        lo = floor
    return lo, hi


def ticks(axis: Axis, count: int = 5) -> list[tuple[float, str]]:
    """(value, label) of the ticks inside `axis`: 1-2-5 steps, or decades (and 2×, 5×) on a log scale."""
    if axis.log:
        first, last = math.floor(math.log10(axis.lo)), math.ceil(math.log10(axis.hi))
        for multipliers in ((1,), (1, 2, 5), (1, 2, 3, 5, 7)):
            values = [m * 10.0 ** e for e in range(first, last + 1) for m in multipliers]
            values = [v for v in values if axis.lo <= v <= axis.hi]
            if len(values) >= 3:
                break
        return [(v, number(v, 3)) for v in values]
    raw = (axis.hi - axis.lo) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    decimals = max(0, -math.floor(math.log10(step)) + (1 if step / magnitude == 2.5 else 0))
    first = math.ceil(axis.lo / step)
    out = []
    k = first
    while k * step <= axis.hi + step * 1e-9:
        value = k * step
        out.append((value, f"{value:.{decimals}f}"))
        k += 1
    return out


def _frame(x_axis: Axis, y_axis: Axis, plot_right: float, plot_bottom: float, x_label: str, y_label: str) -> str:
    parts = [element("rect", x=float(LEFT), y=float(TOP), width=float(plot_right - LEFT),
                     height=float(plot_bottom - TOP), class_="plot-area")]
    for value, label in ticks(x_axis):
        x = x_axis(value)
        parts.append(element("line", x1=x, x2=x, y1=float(TOP), y2=float(plot_bottom), class_="grid"))
        parts.append(element("text", esc(label), x=x, y=plot_bottom + 16, class_="tick", text_anchor="middle"))
    for value, label in ticks(y_axis):
        y = y_axis(value)
        parts.append(element("line", x1=float(LEFT), x2=float(plot_right), y1=y, y2=y, class_="grid"))
        parts.append(element("text", esc(label), x=float(LEFT - 6), y=y + 4, class_="tick", text_anchor="end"))
    parts.append(element("line", x1=float(LEFT), x2=float(plot_right), y1=float(plot_bottom), y2=float(plot_bottom),
                         class_="axis"))
    parts.append(element("line", x1=float(LEFT), x2=float(LEFT), y1=float(TOP), y2=float(plot_bottom), class_="axis"))
    parts.append(element("text", esc(x_label), x=(LEFT + plot_right) / 2, y=float(HEIGHT - 10), class_="axis-label",
                         text_anchor="middle"))
    mid = (TOP + plot_bottom) / 2
    parts.append(element("text", esc(y_label), x=18.0, y=mid, class_="axis-label", text_anchor="middle",
                         transform=f"rotate(-90 18 {mid:.1f})"))
    return "".join(parts)


def _positions(points: list[Point], x_axis: Axis, y_axis: Axis, plot_right: float,
               plot_bottom: float) -> list[tuple[float, float]]:
    """Pixel centres: on the axes, or in the strip of the missing figure (spread out there)."""
    strip_x = plot_right + GAP
    strip_y = plot_bottom + GAP + STRIP_Y / 2 + 4
    in_x_strip = 0
    out = []
    for p in points:
        has_x = p.x is not None and p.x > 0
        if has_x and p.y is not None:
            out.append((x_axis(p.x), y_axis(p.y)))
            continue
        if has_x:  # no metric: the bottom strip, at its latency
            out.append((x_axis(p.x), strip_y))
            continue
        cx = strip_x + 20 + (in_x_strip % 3) * 26
        in_x_strip += 1
        out.append((cx, y_axis(p.y) if p.y is not None else strip_y))
    return out


def _radii(points: list[Point]) -> list[float]:
    largest = max((p.size for p in points if p.size), default=0)
    return [R_MIN + (R_MAX - R_MIN) * math.sqrt(p.size / largest) if p.size and largest else R_MIN for p in points]


def _labels(points: list[Point], placed: list[tuple[float, float]], radii: list[float]) -> list[str]:
    """Labels beside their markers, first fit wins: never over another label or marker, never out of the plot."""
    boxes = [(cx - r, cy - r, cx + r, cy + r) for (cx, cy), r in zip(placed, radii)]
    taken: list[tuple[float, float, float, float]] = []
    out = []
    for i, (p, (cx, cy), r) in enumerate(zip(points, placed, radii)):
        if not p.label:
            continue
        w, h = text_width(p.label), 12.0
        for x, y, anchor in _candidates(cx, cy, r):
            left = x if anchor == "start" else x - w if anchor == "end" else x - w / 2
            box = (left, y - h + 2, left + w, y + 2)
            if box[0] < 2 or box[2] > WIDTH - 2 or box[1] < 2 or box[3] > HEIGHT - BOTTOM + 8:
                continue
            others = [b for j, b in enumerate(boxes) if j != i] + taken
            if any(_overlap(box, b) for b in others):
                continue
            taken.append(box)
            out.append(element("text", esc(p.label), x=x, y=y, class_="point-label", text_anchor=anchor))
            break
    return out


def _candidates(cx: float, cy: float, r: float):
    yield cx + r + 4, cy + 4, "start"
    yield cx - r - 4, cy + 4, "end"
    yield cx, cy - r - 5, "middle"
    yield cx, cy + r + 13, "middle"
    for k in range(1, 5):
        yield cx + r + 4, cy - r - 2 - 13 * (k - 1), "start"
        yield cx + r + 4, cy + r + 11 + 13 * (k - 1), "start"
        yield cx - r - 4, cy - r - 2 - 13 * (k - 1), "end"
        yield cx - r - 4, cy + r + 11 + 13 * (k - 1), "end"


def _overlap(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]
