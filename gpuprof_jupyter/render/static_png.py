"""The static plots as a PNG, drawn straight with Pillow (no browser, no matplotlib).

Runs in the kernel, the Jupyter server and the ``gpuprof`` command.

What a saved notebook, an offline export, GitHub's viewer or an untrusted notebook shows
(docs/facts.md, "Exported pages"). It is drawn at the end of every profiled cell, so it must be cheap: the
matplotlib version cost 0.7-1.0 s a cell (tick and text machinery, ``tight_layout``); this
one lays the panels out with fixed margins and draws lines, bands, ticks and a few labels
with Pillow's C drawing functions, supersampled 2x for smooth lines (about 20-40 ms).

The picture follows the Bokeh panels: one panel per ``PlotSpec`` panel, shared time axis,
phase and gap bands, power-limit lines, a legend per panel, provenance words in the axis
labels and the titles, and a SIMULATED title when the data are not measurements.
"""

from __future__ import annotations

import io
import math
from functools import lru_cache

import numpy as np

from gpuprof_jupyter.core.analysis.stats import gap_spans

SS = 2  # supersampling factor (drawn at 2x, reduced with a box filter)
PHASE_RGB = (0x8D, 0xD3, 0xC7)
GAP_RGB = (0x9E, 0x9E, 0x9E)
LIMIT_RGB = (0xC6, 0x28, 0x28)
GRID_RGB = (0xE6, 0xE6, 0xE6)
FRAME_RGB = (0x44, 0x44, 0x44)
TEXT_RGB = (0x22, 0x22, 0x22)
SIM_RGB = (0x5C, 0x44, 0x00)
DASHES = {"dashed": (5, 3), "dotted": (1.5, 2)}  # on, off in output pixels


def _blend(rgb, alpha: float) -> tuple[int, int, int]:
    """``rgb`` at ``alpha`` over white (bands are drawn first, on the white background)."""
    return tuple(int(round(255 + (c - 255) * alpha)) for c in rgb)


def _hex(colour: str) -> tuple[int, int, int]:
    colour = colour.lstrip("#")
    return tuple(int(colour[i:i + 2], 16) for i in (0, 2, 4))


@lru_cache(maxsize=16)
def _font(size_px: int):
    """Pillow's own TrueType font (bundled since Pillow 10.1): the same picture on every machine,
    no font package or matplotlib needed. Pillow without FreeType: its bitmap font."""
    from PIL import ImageFont

    return ImageFont.load_default(size=size_px)


def nice_ticks(lo: float, hi: float, n: int = 4) -> tuple[list[float], int]:
    """About ``n`` round tick values in [lo, hi] and the decimals their labels need."""
    span = hi - lo
    if not (span > 0) or not math.isfinite(span):
        return [lo], 0
    raw = span / n
    mag = 10.0 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw * 0.999)
    first = math.ceil(lo / step - 1e-9)
    ticks = [k * step for k in range(first, int(math.floor(hi / step + 1e-9)) + 1)]
    decimals = max(0, -int(math.floor(math.log10(step) + 1e-9)))
    if step / 10.0 ** -decimals % 1 > 1e-6 and decimals < 6:  # 2.5 x 10^k
        decimals += 1
    return ticks, decimals


def _fmt(value: float, decimals: int) -> str:
    text = f"{value:.{decimals}f}"
    return "0" if text.strip("-0.") == "" else text


def _y_limits(panel, data) -> tuple[float, float]:
    if panel.y_range:
        return float(panel.y_range[0]), float(panel.y_range[1])
    lo, hi = math.inf, -math.inf
    for s in panel.series:
        v = data.get(s.column)
        if v is not None and len(v) and not np.isnan(v).all():
            lo, hi = min(lo, float(np.nanmin(v))), max(hi, float(np.nanmax(v)))
    for y, _ in panel.limit_lines:
        lo, hi = min(lo, y), max(hi, y)
    if not math.isfinite(lo):
        lo, hi = 0.0, 1.0
    if panel.zero_based:
        lo = min(lo, 0.0)
    pad = (hi - lo) * 0.08 or max(abs(hi) * 0.1, 1.0)
    return (lo if panel.zero_based and lo == 0.0 else lo - pad), hi + pad


def _runs(mask: np.ndarray):
    """(start, stop) of runs of True."""
    if not len(mask):
        return []
    edges = np.flatnonzero(np.diff(np.concatenate(([0], mask.view(np.int8), [0]))))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist()))


@lru_cache(maxsize=32)
def _stripes(width: int, height: int, on: int, off: int):
    """An 'L' mask of vertical stripes: dashes along x for a line drawn through it."""
    from PIL import Image

    row = np.zeros(width, dtype=np.uint8)
    period = on + off
    row[(np.arange(width) % period) < on] = 255
    return Image.fromarray(np.broadcast_to(row, (height, width)).copy(), "L")


def render_png(spec, data: dict, meta, dpi: int = 72) -> bytes:
    """The panels of ``spec`` filled with decimated ``data`` (``wide_columns``) as PNG bytes."""
    from PIL import Image, ImageChops, ImageDraw

    from gpuprof_jupyter.core.plots.spec import device_colour

    k = dpi / 72.0 * SS  # pixels per point, supersampled
    panels = spec.panels or []
    n_colours = max([s.colour_index for s in spec.series()] + [0]) + 1
    f_title, f_panel, f_label, f_tick, f_legend = (_font(max(6, int(round(p * k)))) for p in (10, 9, 8, 7, 6.5))

    # layout (points): fixed margins, a legend column as wide as its longest label needs
    row_h, plot_h = 8.5, 110.0
    legend_cols = []
    for panel in panels:
        labels = [s.label for s in panel.series] + [label for _, label in panel.limit_lines]
        rows = max(1, int(plot_h // row_h))
        legend_cols.append((labels, rows, max(1, math.ceil(len(labels) / rows))))
    col_w = max([f_legend.getlength(label) / k for labels, _, _ in legend_cols for label in labels] + [20.0]) + 26
    ncol = max([c for _, _, c in legend_cols] + [1])
    left, plot_w = 64.0, 640.0
    width = left + plot_w + 8 + ncol * col_w + 6
    top, panel_title_h, gap_h, bottom = 24.0, 15.0, 6.0, 34.0
    n = max(len(panels), 1)
    height = top + n * (panel_title_h + plot_h) + (n - 1) * gap_h + bottom
    W, H = int(round(width * k)), int(round(height * k))
    img = Image.new("RGB", (W, H), "white")
    draw = ImageDraw.Draw(img)

    t = np.asarray(data.get("t", []), dtype="float64")
    finite_t = t[np.isfinite(t)]
    x_lo, x_hi = (float(finite_t.min()), float(finite_t.max())) if len(finite_t) else (0.0, 1.0)
    if meta.duration_s and not len(finite_t):
        x_hi = float(meta.duration_s)
    pad = (x_hi - x_lo) * 0.01 or 0.5
    x_lo, x_hi = x_lo - pad, x_hi + pad
    x_ticks, x_dec = nice_ticks(x_lo, x_hi, 8)
    x0p, x1p = left * k, (left + plot_w) * k

    def xpix(v):
        return x0p + (np.asarray(v, dtype="float64") - x_lo) * ((x1p - x0p) / (x_hi - x_lo))

    bands = []
    for p in meta.phases or []:
        end = p.get("end_s") if p.get("end_s") is not None else meta.duration_s
        bands.append((p["start_s"], end if end is not None else p["start_s"], _blend(PHASE_RGB, 0.3)))
    for start, end in gap_spans(meta.gaps):
        bands.append((start, end, _blend(GAP_RGB, 0.3)))

    lw = max(1, int(round(1.0 * k)))
    for i, panel in enumerate(panels):
        y0p = (top + i * (panel_title_h + plot_h + gap_h) + panel_title_h) * k
        y1p = y0p + plot_h * k
        box = (int(x0p), int(y0p), int(x1p), int(y1p))
        y_lo, y_hi = _y_limits(panel, data)

        def ypix(v, y_lo=y_lo, y_hi=y_hi, y0p=y0p, y1p=y1p):
            return y1p - (np.asarray(v, dtype="float64") - y_lo) * ((y1p - y0p) / ((y_hi - y_lo) or 1.0))

        for start, end, rgb in bands:  # bands, then grid, then data
            a, b = (float(np.clip(xpix(v), x0p, x1p)) for v in (start, end))
            if b > a:
                draw.rectangle((a, y0p, b, y1p), fill=rgb)
        y_ticks, y_dec = nice_ticks(y_lo, y_hi, 5)
        for v in y_ticks:
            yy = float(ypix(v))
            draw.line((x0p, yy, x1p, yy), fill=GRID_RGB, width=max(1, lw // 2))
            draw.text((x0p - 3 * k, yy), _fmt(v, y_dec), fill=TEXT_RGB, font=f_tick, anchor="rm")
        for v in x_ticks:
            xx = float(xpix(v))
            draw.line((xx, y0p, xx, y1p), fill=GRID_RGB, width=max(1, lw // 2))
            if i == len(panels) - 1:
                draw.line((xx, y1p, xx, y1p + 3 * k), fill=FRAME_RGB, width=lw)
                draw.text((xx, y1p + 4 * k), _fmt(v, x_dec), fill=TEXT_RGB, font=f_tick, anchor="ma")

        for y, _ in panel.limit_lines:
            yy = float(ypix(y))
            if y0p <= yy <= y1p:
                _dashed_hline(draw, x0p, x1p, yy, LIMIT_RGB, lw, 5 * k, 3 * k)
        for s in panel.series:
            colour = _hex(device_colour(s.colour_index, n_colours))
            y = data.get(s.column)
            if y is None or not len(y):
                continue
            px, py = xpix(t), np.clip(ypix(y), y0p, y1p)
            ok = np.isfinite(py) & np.isfinite(px)
            dash = DASHES.get(s.dash)
            target = draw
            if dash:
                layer = Image.new("L", (box[2] - box[0] + 2 * lw, box[3] - box[1] + 2 * lw), 0)
                target = ImageDraw.Draw(layer)
                px, py = px - (box[0] - lw), py - (box[1] - lw)
            xy = np.column_stack((px, py))
            for a, b in _runs(ok):
                if b - a >= 2:
                    target.line(xy[a:b].ravel().tolist(), fill=255 if dash else colour, width=lw)
                elif b - a == 1:
                    x, yv = xy[a]
                    target.ellipse((x - lw, yv - lw, x + lw, yv + lw), fill=255 if dash else colour)
            if dash:
                mask = ImageChops.multiply(layer, _stripes(layer.width, layer.height, max(1, int(dash[0] * k)),
                                                           max(1, int(dash[1] * k))))
                img.paste(colour, (box[0] - lw, box[1] - lw), mask)
        draw.rectangle(box, outline=FRAME_RGB, width=lw)
        draw.text((x0p, y0p - 2 * k), panel.title, fill=TEXT_RGB, font=f_panel, anchor="ld")
        _vertical_text(img, panel.y_label, f_label, 10 * k, (y0p + y1p) / 2, TEXT_RGB)

        labels, rows, _ = legend_cols[i]
        styles = [(_hex(device_colour(s.colour_index, n_colours)), s.dash) for s in panel.series]
        styles += [(LIMIT_RGB, "dashed")] * len(panel.limit_lines)
        lx0 = x1p + 8 * k
        for j, (label, (rgb, dash)) in enumerate(zip(labels, styles)):
            col, row = divmod(j, rows)
            lx = lx0 + col * col_w * k
            ly = y0p + (row + 0.5) * row_h * k
            if dash in DASHES:
                on, off = DASHES[dash]
                _dashed_hline(draw, lx, lx + 16 * k, ly, rgb, lw, on * k, off * k)
            else:
                draw.line((lx, ly, lx + 16 * k, ly), fill=rgb, width=lw)
            draw.text((lx + 20 * k, ly), label, fill=TEXT_RGB, font=f_legend, anchor="lm")

    if panels:  # phase names on the first panel, the time axis label under the last
        y0p = (top + panel_title_h) * k
        for p in meta.phases or []:
            xx = float(xpix(p["start_s"]))
            if x0p <= xx <= x1p:
                draw.text((xx + 2 * k, y0p + 2 * k), p["name"], fill=TEXT_RGB, font=f_tick, anchor="la")
        last_bottom = (top + n * (panel_title_h + plot_h) + (n - 1) * gap_h) * k
        draw.text(((x0p + x1p) / 2, last_bottom + 15 * k), "time since start (s)", fill=TEXT_RGB, font=f_label,
                  anchor="ma")
    title = f"gpuprof: {meta.name} [{meta.status}]"
    if meta.simulated:
        title += "  SIMULATED GPU (not measurements)"
    draw.text((W / 2, 6 * k), title, fill=SIM_RGB if meta.simulated else TEXT_RGB, font=f_title, anchor="ma")

    if SS > 1:
        img = img.reduce(SS)
    # a 64-colour palette: half the bytes of RGB and half the encoding time (flat colours, few
    # anti-aliasing shades; no dithering)
    try:
        img = img.quantize(colors=64, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE)
    except Exception:  # noqa: BLE001 - very old Pillow: an unquantised PNG
        pass
    buf = io.BytesIO()
    img.save(buf, format="png", compress_level=1)
    return buf.getvalue()


def _dashed_hline(draw, xa: float, xb: float, y: float, rgb, width: int, on: float, off: float) -> None:
    x = xa
    while x < xb:
        draw.line((x, y, min(x + on, xb), y), fill=rgb, width=width)
        x += on + off


def _vertical_text(img, text: str, font, x: float, y_mid: float, rgb) -> None:
    """``text`` rotated 90 degrees (reading upwards), centred on ``y_mid``, left edge at ``x``."""
    from PIL import Image, ImageDraw

    if not text:
        return
    l, t, r, b = font.getbbox(text)
    layer = Image.new("L", (int(r - l) + 2, int(b - t) + 2), 0)
    ImageDraw.Draw(layer).text((1 - l, 1 - t), text, fill=255, font=font)
    layer = layer.transpose(Image.Transpose.ROTATE_90)
    img.paste(rgb, (int(x), int(y_mid - layer.height / 2)), layer)


__all__ = ["render_png", "nice_ticks"]
