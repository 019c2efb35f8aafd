import { PathExt } from '@jupyterlab/coreutils';
import { Widget } from '@lumino/widgets';

import { apiUrl, requestAPI } from './handler';
import { memory, num, pct, sparkline, watts } from './format';
import { DevicesModel, ExperimentsModel, LiveModel, ModelView } from './model';
import { DEFAULT_RATES, IRefreshable, IRefreshRates } from './settings';
import { IExperimentRow, IExportPayload } from './types';

function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className?: string,
  text?: string
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (className) {
    node.className = className;
  }
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

/** The devices section: live values and sparklines of the GPUs this server sees. */
class DevicesView extends ModelView<DevicesModel> {
  constructor(model: DevicesModel) {
    super(model, 'jp-gpuprof-devices');
    this.render();
  }

  protected render(): void {
    const data = this.model.data;
    this.node.textContent = '';
    this.node.appendChild(el('h3', 'jp-gpuprof-heading', 'Devices'));
    if (data === null || data.state === 'starting') {
      this.node.appendChild(el('div', 'jp-gpuprof-empty', this.model.error || 'reading the GPUs…'));
      return;
    }
    if (data.state === 'no_gpu') {
      const box = el('div', 'jp-gpuprof-nogpu');
      box.appendChild(el('strong', undefined, 'No GPU'));
      box.appendChild(el('div', undefined, data.message));
      this.node.appendChild(box);
      return;
    }
    for (const device of data.devices) {
      const row = el('div', 'jp-gpuprof-device');
      row.dataset.key = device.key;
      const l = device.latest;
      row.appendChild(el('div', 'jp-gpuprof-device-name', `${device.key} · ${device.name}`));
      const values = el('div', 'jp-gpuprof-device-values');
      values.textContent = `SM ${pct(l?.sm_util ?? l?.gpu_busy)} · mem BW ${pct(l?.mem_bw_util)} · ${memory(
        l?.gpu_mem_used_bytes,
        l?.gpu_mem_total_bytes ?? device.memory_total_bytes
      )} · ${watts(l?.power_w)}`;
      row.appendChild(values);
      const sparks = el('div', 'jp-gpuprof-sparks');
      const h = device.history;
      if (h) {
        const sm = h.sm_util.some(v => v !== null) ? h.sm_util : h.gpu_busy;
        sparks.appendChild(el('span', 'jp-gpuprof-spark-label', 'SM'));
        sparks.appendChild(sparkline(sm, 100));
        sparks.appendChild(el('span', 'jp-gpuprof-spark-label', 'W'));
        sparks.appendChild(sparkline(h.power_w, device.power_limit_w ?? 0, 120, 24, 'jp-gpuprof-spark jp-gpuprof-spark-power'));
      }
      row.appendChild(sparks);
      this.node.appendChild(row);
    }
  }
}

const COLUMNS: Array<[string, string, (row: IExperimentRow) => string]> = [
  ['name', 'name', r => r.name + (r.simulated ? ' (sim)' : '')],
  ['status', 'status', r => (r.running ? 'running' : r.status)],
  ['duration_s', 'time s', r => num(r.duration_s, 1)],
  ['sm_util_mean', 'SM %', r => num(r.sm_util_mean, 0)],
  ['mem_bw_util_mean', 'mem BW %', r => num(r.mem_bw_util_mean, 0)],
  ['power_mean_w', 'W', r => num(r.power_mean_w, 0)],
  ['energy_kwh', 'kWh', r => num(r.energy_kwh, 4)]
];

/** Under a multi-node job's row: its parts, and those missing or still running. */
function partsRow(row: IExperimentRow): HTMLElement {
  const tr = el('tr', 'jp-gpuprof-job-parts');
  tr.dataset.job = row.id;
  tr.appendChild(el('td'));
  const td = el('td', 'jp-gpuprof-col-parts', `job · parts ${row.parts}`);
  td.colSpan = COLUMNS.length;
  tr.appendChild(td);
  return tr;
}

/** The experiment a running row's live view follows: a job's newest running part, else the row's own. */
function followed(row: IExperimentRow): string {
  const running = row.running_ids ?? [];
  return running.length ? running[running.length - 1] : row.id;
}

/**
 * The "GPU Profiler" sidebar: devices, the experiments of the current notebook's directory
 * (select some to compare in a report, export one to pipeline.yaml), a running one followed live.
 */
export class GPUProfilerPanel extends Widget implements IRefreshable {
  constructor(devices: DevicesModel) {
    super();
    this.id = 'gpuprof-sidebar';
    this.addClass('jp-gpuprof-panel');
    this.title.caption = 'GPU Profiler';
    this._experiments = new ExperimentsModel();
    this._experiments.changed.connect(this._renderExperiments, this);
    this._devicesView = new DevicesView(devices);
    this.node.appendChild(this._devicesView.node);
    this._experimentsNode = el('div', 'jp-gpuprof-experiments');
    this._liveNode = el('div', 'jp-gpuprof-live');
    this._message = el('div', 'jp-gpuprof-message');
    this.node.append(this._liveNode, this._experimentsNode, this._message);
    this._renderExperiments();
  }

  /** The directory (relative to the server root) whose .gpuprof store is listed. */
  setDirectory(directory: string): void {
    this._directory = directory;
    this._experiments.store = PathExt.join(directory, '.gpuprof');
  }

  get store(): string {
    return this._experiments.store;
  }

  refresh(): Promise<void> {
    return this._experiments.refresh();
  }

  setRefreshRates(rates: IRefreshRates): void {
    this._rates = rates;
    this.node.dataset.refreshMs = `${rates.devicesMs},${rates.experimentsMs},${rates.liveMs}`;
    this._experiments.setInterval(rates.experimentsMs);
    this._live?.setInterval(rates.liveMs);
  }

  dispose(): void {
    this._experiments.dispose();
    this._devicesView.dispose();
    this._live?.dispose();
    super.dispose();
  }

  private _renderExperiments(): void {
    const data = this._experiments.data;
    const node = this._experimentsNode;
    node.textContent = '';
    node.appendChild(el('h3', 'jp-gpuprof-heading', `Experiments · ${this._experiments.store}`));
    if (this._experiments.error) {
      node.appendChild(el('div', 'jp-gpuprof-error', this._experiments.error));
    }
    if (data === null) {
      return;
    }
    const ids = new Set(data.rows.map(r => r.id));
    for (const id of [...this._selected]) {
      if (!ids.has(id)) {
        this._selected.delete(id);
      }
    }
    if (data.rows.length === 0) {
      node.appendChild(el('div', 'jp-gpuprof-empty', 'No experiment here yet: run a cell with %%gpuprofile.'));
    } else {
      const table = el('table', 'jp-gpuprof-table');
      const head = el('tr');
      head.appendChild(el('th'));
      for (const [key, label] of COLUMNS) {
        head.appendChild(el('th', `jp-gpuprof-col-${key}`, label));
      }
      table.appendChild(head);
      for (const row of [...data.rows].reverse()) {
        const tr = el('tr', 'jp-gpuprof-row');
        tr.dataset.id = row.id;
        const box = el('input');
        box.type = 'checkbox';
        box.checked = this._selected.has(row.id);
        box.title = `select ${row.name}`;
        box.addEventListener('change', () => {
          if (box.checked) {
            this._selected.add(row.id);
          } else {
            this._selected.delete(row.id);
          }
          this._renderButtons();
        });
        const cell = el('td');
        cell.appendChild(box);
        tr.appendChild(cell);
        for (const [key, , format] of COLUMNS) {
          const td = el('td', `jp-gpuprof-col-${key}`, format(row));
          tr.appendChild(td);
        }
        table.appendChild(tr);
        if (row.parts) {
          table.appendChild(partsRow(row));
        }
      }
      node.appendChild(table);
    }
    this._buttons = el('div', 'jp-gpuprof-buttons');
    node.appendChild(this._buttons);
    this._renderButtons();
    this._follow(data.rows.filter(r => r.running).pop());
  }

  private _renderButtons(): void {
    const bar = this._buttons;
    if (!bar) {
      return;
    }
    bar.textContent = '';
    const n = this._selected.size;
    const report = el('button', 'jp-mod-styled jp-mod-accept jp-gpuprof-report', n > 1 ? `Compare ${n} in a report` : 'Open report');
    report.disabled = n === 0;
    report.addEventListener('click', () => this._openReport());
    const exportButton = el('button', 'jp-mod-styled jp-gpuprof-export', 'Export to pipeline.yaml');
    exportButton.disabled = n !== 1;
    exportButton.addEventListener('click', () => void this._export());
    bar.append(report, exportButton);
  }

  private _openReport(): void {
    const url = apiUrl('report', { ids: [...this._selected].join(','), store: this._experiments.store });
    window.open(url, '_blank');
  }

  private async _export(): Promise<void> {
    const [id] = [...this._selected];
    try {
      const result = await requestAPI<IExportPayload>('export', undefined, {
        method: 'POST',
        body: JSON.stringify({
          id,
          store: this._experiments.store,
          path: PathExt.join(this._directory, 'pipeline.yaml')
        })
      });
      this._say(result.message, false);
    } catch (error) {
      this._say(String((error as Error).message ?? error), true);
    }
  }

  private _say(text: string, error: boolean): void {
    this._message.textContent = text;
    this._message.classList.toggle('jp-gpuprof-error', error);
  }

  /** Follow the newest running experiment (offset-based tail reads), or stop following. */
  private _follow(row: IExperimentRow | undefined): void {
    const key = row ? `${this._experiments.store}/${row.id}` : '';
    if (key === this._liveKey) {
      return;
    }
    this._live?.dispose();
    this._live = null;
    this._liveKey = key;
    this._liveNode.textContent = '';
    if (!row) {
      return;
    }
    this._live = new LiveModel(this._experiments.store, followed(row), this._rates.liveMs);
    this._live.changed.connect(this._renderLive, this);
  }

  private _renderLive(): void {
    const live = this._live;
    const node = this._liveNode;
    node.textContent = '';
    if (!live || !live.data) {
      return;
    }
    node.appendChild(el('h3', 'jp-gpuprof-heading', `Running · ${live.data.name}`));
    for (const [device, series] of Object.entries(live.series)) {
      const t = series.t ?? [];
      const last = t.length ? t[t.length - 1] : null;
      const values = series.sm_util ?? series.cpu_util ?? [];
      const row = el('div', 'jp-gpuprof-live-device');
      row.dataset.device = device;
      row.dataset.lastT = last === null ? '' : String(last);
      row.appendChild(el('span', 'jp-gpuprof-spark-label', `${device} ${series.sm_util ? 'SM' : 'CPU'}`));
      row.appendChild(sparkline(values, 100, 160, 24));
      row.appendChild(el('span', 'jp-gpuprof-live-t', last === null ? '' : `t=${num(last, 0)} s`));
      node.appendChild(row);
    }
    node.dataset.tailReads = String(live.tailReads);
    if (!live.running) {
      this._live?.dispose();
      this._live = null;
      this._liveKey = '';
      void this._experiments.refresh();
    }
  }

  private _buttons: HTMLElement | null = null;
  private _devicesView: DevicesView;
  private _directory = '';
  private _experiments: ExperimentsModel;
  private _experimentsNode: HTMLElement;
  private _live: LiveModel | null = null;
  private _liveKey = '';
  private _liveNode: HTMLElement;
  private _message: HTMLElement;
  private _rates: IRefreshRates = DEFAULT_RATES;
  private _selected = new Set<string>();
}
