/**
 * Payloads of the server extension (gpuprof_jupyter/server/handlers.py). Keep in step with
 * the Python side: tests/test_server_api.py checks every key named here against real answers.
 */

export type DeviceMetric =
  | 'sm_util'
  | 'gpu_busy'
  | 'mem_bw_util'
  | 'gpu_mem_used_bytes'
  | 'gpu_mem_total_bytes'
  | 'power_w'
  | 'gpu_temp_c';

export interface IDeviceLatest extends Partial<Record<DeviceMetric, number | null>> {
  t: number;
  provenance: Partial<Record<DeviceMetric, string>>;
}

export interface IDevice {
  key: string;
  name: string;
  index: number | null;
  uuid: string | null;
  power_limit_w: number | null;
  memory_total_bytes: number | null;
  mig_parent_uuid: string | null;
  latest: IDeviceLatest | null;
  history?: Record<'t' | DeviceMetric, Array<number | null>>;
}

export interface IDevicesPayload {
  /** ok: devices read; starting: first read not in yet; no_gpu: see reason and message. */
  state: 'ok' | 'starting' | 'no_gpu';
  reason: string | null;
  message: string;
  interval_s: number;
  updated: number | null;
  devices: IDevice[];
  notes: string[];
}

export interface IExperimentRow {
  id: string;
  name: string;
  status: string;
  started_at: string;
  duration_s: number | null;
  devices: string;
  source: string;
  simulated: boolean;
  sm_util_mean: number | null;
  mem_bw_util_mean: number | null;
  power_mean_w: number | null;
  energy_kwh: number | null;
  running: boolean;
  /** a multi-node job's row (its id the job's key): "2/3 (missing: 2) (running: node-b)" */
  parts?: string;
  /** the job's parts, and those still running (the newest is followed live) */
  part_ids?: string[];
  running_ids?: string[];
  /** params and logged metrics: a row lacks those its run lacks */
  [column: string]: unknown;
}

export interface IExperimentsPayload {
  store: string;
  columns: string[];
  rows: IExperimentRow[];
  problems: string[];
}

/** One device's series: t (s since start) and one column per metric, null = not measured. */
export type Series = Record<string, Array<number | null>>;

export interface IExperimentPayload {
  id: string;
  name: string;
  status: string;
  running: boolean;
  tail: boolean;
  /** Bytes of the running experiment's stream read so far; ask from here next time. */
  offset: number | null;
  summary: Record<string, unknown> | null;
  series: Record<string, Series>;
}

export interface IExportPayload {
  path: string;
  step: string;
  experiment: string;
  created: boolean;
  baseline: string | null;
  message: string;
  changes: Array<{ key: string; old: string | null; new: string | null; comment: string }>;
}

/** One kernel's session state (GET sessions: server/sessions.py), this server's kernels only. */
export interface ISessionState {
  kernel: string;
  user: string;
  on: boolean;
  cell_running: boolean;
  /** Seconds the GPUs have sat idle while this kernel held their memory (0 while a cell runs). */
  idle_s: number;
  memory_held_bytes: number | null;
  memory_provenance: string | null;
  updated: number | null;
  stale: boolean;
  /** When GPU-aware culling (c.GPUProfiler.cull_idle_gpu_s) will shut the kernel down; null: not warned. */
  cull_at: number | null;
}

export interface ISessionsPayload {
  sessions: ISessionState[];
}
