/** Small formatting helpers and an SVG sparkline, shared by the status bar and the sidebar. */

export function pct(value: number | null | undefined): string {
  return value === null || value === undefined ? '–' : `${Math.round(value)}%`;
}

export function watts(value: number | null | undefined): string {
  return value === null || value === undefined ? '–' : `${Math.round(value)} W`;
}

export function gib(value: number | null | undefined): string {
  return value === null || value === undefined ? '–' : (value / 1024 ** 3).toFixed(1);
}

export function memory(used: number | null | undefined, total: number | null | undefined): string {
  return `${gib(used)}/${gib(total)} GiB`;
}

export function num(value: unknown, digits = 1): string {
  return typeof value === 'number' && isFinite(value) ? value.toFixed(digits) : '–';
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
