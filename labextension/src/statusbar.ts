import { Notification } from '@jupyterlab/apputils';

import { gib, idle, memory, pct, watts } from './format';
import { DevicesModel, ModelView, SessionsModel } from './model';
import { ISessionState } from './types';

/** Status bar item: per GPU sm_util, memory and power, or "no GPU"; a click opens the sidebar. */
export class DeviceStatusItem extends ModelView<DevicesModel> {
  constructor(model: DevicesModel, onClick: () => void) {
    super(model, 'jp-gpuprof-status');
    this.node.title = 'GPU Profiler: GPUs this server sees (click to open the sidebar)';
    this.node.addEventListener('click', onClick);
    this.render();
  }

  protected render(): void {
    const data = this.model.data;
    const node = this.node;
    node.textContent = '';
    const label = document.createElement('span');
    label.className = 'jp-gpuprof-status-label';
    if (data === null) {
      label.textContent = this.model.error ? 'GPU: server unreachable' : 'GPU: …';
      node.appendChild(label);
      node.dataset.state = 'starting';
      return;
    }
    node.dataset.state = data.state;
    if (data.state === 'no_gpu') {
      label.textContent = 'no GPU';
      node.title = `GPU Profiler: no GPU (${data.message})`;
      node.appendChild(label);
      return;
    }
    if (data.state === 'starting' || data.devices.length === 0) {
      label.textContent = 'GPU: …';
      node.appendChild(label);
      return;
    }
    for (const device of data.devices) {
      const item = document.createElement('span');
      item.className = 'jp-gpuprof-status-gpu';
      item.dataset.key = device.key;
      const l = device.latest;
      const sm = l?.sm_util ?? l?.gpu_busy ?? null;
      item.textContent = `${device.key.toUpperCase()} ${pct(sm)} · ${memory(
        l?.gpu_mem_used_bytes,
        l?.gpu_mem_total_bytes ?? device.memory_total_bytes
      )} · ${watts(l?.power_w)}`;
      node.appendChild(item);
    }
  }
}

/** Idle this long while holding GPU memory, and the status bar says so. */
export const IDLE_SHOWN_S = 60;

/**
 * The text for a kernel whose GPUs sit idle while it holds their memory: "GPU idle 14 min,
 * holding 22 GiB"; '' when that is not so.
 */
export function idleHeldText(state: ISessionState | undefined): string {
  if (!state || state.cell_running || !state.memory_held_bytes || state.idle_s < IDLE_SHOWN_S) {
    return '';
  }
  const text = `GPU idle ${idle(state.idle_s)}, holding ${gib(state.memory_held_bytes, 0)} GiB`;
  return state.cull_at ? `${text} · shut down in ${idle(state.cull_at - Date.now() / 1000)}` : text;
}

/** The warning GPU-aware culling gives the notebook ahead of the shutdown. */
export function cullWarning(state: ISessionState): string {
  return (
    `GPU Profiler: this notebook's kernel will be shut down in ${idle((state.cull_at ?? 0) - Date.now() / 1000)}: ` +
    `its GPUs have sat idle ${idle(state.idle_s)} while it held ${gib(state.memory_held_bytes, 0)} GiB. ` +
    'Run a cell or free the memory to keep it.'
  );
}

/**
 * Status bar item: the current notebook's kernel (``kernelId()``), when its GPUs have sat idle
 * while it held their memory; hidden otherwise. A click opens the sidebar.
 */
export class IdleHeldStatusItem extends ModelView<SessionsModel> {
  constructor(model: SessionsModel, kernelId: () => string | null, onClick: () => void) {
    super(model, 'jp-gpuprof-idle-held');
    this._kernelId = kernelId;
    this.node.addEventListener('click', onClick);
    this.render();
  }

  protected render(): void {
    const id = this._kernelId();
    const state = this.model.data?.sessions.find(s => s.kernel === id);
    const text = idleHeldText(state);
    this.node.textContent = text;
    this.node.style.display = text ? '' : 'none';
    this.node.dataset.cullAt = state?.cull_at ? String(state.cull_at) : '';
    if (state?.cull_at && id !== null && !this._warned.has(id)) {
      this._warned.add(id); // once per kernel: the status bar keeps counting down
      Notification.warning(cullWarning(state), { autoClose: false });
    }
    this.node.title = text
      ? `GPU Profiler: this notebook's kernel holds GPU memory others cannot use while its GPUs sit idle ` +
        `(${state?.memory_provenance ?? 'memory per NVML'}); %gpuprofile session shows when`
      : '';
  }

  /** Draw again (the current notebook changed). */
  redraw(): void {
    this.render();
  }

  private _kernelId: () => string | null;
  private _warned = new Set<string>();
}
