/**
 * Formatters shared by the status bar and the sidebar, and an SVG sparkline. They print what
 * the Python side prints (gpuprof_jupyter/core/format.py): a missing value (null, undefined,
 * NaN, an infinity) is "n/a", a percentage "40 %", and numbers round as Python's format() does
 * (half to even on exact ties). tests/format_cases.json holds the cases both are tested against.
 */

export const MISSING = 'n/a';
const GIB = 1024 ** 3;

function present(value: unknown): value is number {
  return typeof value === 'number' && isFinite(value);
}

/** ``value.toFixed(digits)`` with Python's rounding: an exact tie goes to the even digit. */
export function fixed(value: number, digits: number): string {
  const scaled = Math.abs(value) * 10 ** digits;
  const floor = Math.floor(scaled);
  if (scaled - floor === 0.5 && Number.isInteger(value * 2 ** (digits + 1))) {
    const even = floor % 2 === 0 ? floor : floor + 1;
    return (value < 0 ? '-' : '') + (even / 10 ** digits).toFixed(digits);
  }
  return value.toFixed(digits);
}

/** A plain number with ``digits`` decimals (Python: fmt_number). */
export function num(value: unknown, digits = 1): string {
  return present(value) ? fixed(value, digits) : MISSING;
}

/** A percentage figure, 0..100 (Python: fmt_pct). */
export function pct(value: number | null | undefined, digits = 0): string {
  return present(value) ? `${fixed(value, digits)} %` : MISSING;
}

/** Watts (Python: fmt_watts). */
export function watts(value: number | null | undefined): string {
  return present(value) ? `${fixed(value, 0)} W` : MISSING;
}

/** Bytes as a number of GiB, without the unit (Python: fmt_gib). */
export function gib(value: number | null | undefined, digits = 1): string {
  return present(value) ? fixed(value / GIB, digits) : MISSING;
}

/** GPU memory used/total: '14.5/40.0 GiB' (Python: fmt_memory). */
export function memory(used: number | null | undefined, total: number | null | undefined): string {
  return `${gib(used)}/${gib(total)} GiB`;
}

/** A length of time in whole minutes: '45 s', '14 min', '2 h 05 min' (Python: fmt_idle). */
export function idle(seconds: number | null | undefined): string {
  if (!present(seconds)) {
    return MISSING;
  }
  const s = Math.max(0, Math.floor(seconds));
  if (s < 60) {
    return `${s} s`;
  }
  if (s < 3600) {
    return `${Math.floor(s / 60)} min`;
  }
  const minutes = Math.floor((s % 3600) / 60);
  return `${Math.floor(s / 3600)} h ${minutes < 10 ? '0' : ''}${minutes} min`;
}

/** An SVG polyline of ``values`` scaled to [0, max]; null values break the line. */
export function sparkline(
  values: Array<number | null>,
  max: number,
  width = 120,
  height = 24,
  className = 'jp-gpuprof-spark'
): SVGSVGElement {
  const ns = 'http://www.w3.org/2000/svg';
  const svg = document.createElementNS(ns, 'svg');
  svg.setAttribute('class', className);
  svg.setAttribute('width', String(width));
  svg.setAttribute('height', String(height));
  svg.setAttribute('viewBox', `0 0 ${width} ${height}`);
  const n = values.length;
  const scale = max > 0 ? max : Math.max(1, ...values.filter((v): v is number => v !== null));
  let points: string[] = [];
  const flush = () => {
    if (points.length > 1) {
      const line = document.createElementNS(ns, 'polyline');
      line.setAttribute('points', points.join(' '));
      svg.appendChild(line);
    }
    points = [];
  };
  values.forEach((v, i) => {
    if (v === null) {
      flush();
      return;
    }
    const x = n > 1 ? (i / (n - 1)) * (width - 2) + 1 : width / 2;
    const y = height - 1 - Math.min(1, Math.max(0, v / scale)) * (height - 2);
    points.push(`${x.toFixed(1)},${y.toFixed(1)}`);
  });
  flush();
  return svg;
}
