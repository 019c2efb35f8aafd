import { memory, pct, watts } from './format';
import { DevicesModel, ModelView } from './model';

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
