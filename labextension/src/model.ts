import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import { requestAPI, requestIfChanged } from './handler';
import { DEFAULT_RATES, IRefreshable, IRefreshRates } from './settings';
import {
  IDevicesPayload,
  IExperimentPayload,
  IExperimentsPayload,
  ISessionsPayload,
  Series
} from './types';

/** A model fed by a Lumino Poll: backoff on errors, standby while the page is hidden. */
abstract class PolledModel<T> {
  constructor(name: string, interval: number) {
    this._poll = new Poll<void, unknown>({
      auto: true,
      factory: () => this._tick(),
      frequency: { interval, backoff: true, max: 30 * 1000 },
      name,
      standby: 'when-hidden'
    });
  }

  get changed(): ISignal<this, void> {
    return this._changed;
  }

  get data(): T | null {
    return this._data;
  }

  /** The last request's error text ('' after a success). */
  get error(): string {
    return this._error;
  }

  refresh(): Promise<void> {
    return this._poll.refresh();
  }

  /** Poll every ``ms`` milliseconds from the next tick on (a JupyterLab setting). */
  setInterval(ms: number): void {
    if (ms !== this._poll.frequency.interval) {
      this._poll.frequency = { ...this._poll.frequency, interval: ms };
    }
  }

  dispose(): void {
    this._poll.dispose();
    Signal.clearData(this);
  }

  protected abstract fetch(): Promise<T | null>;

  private async _tick(): Promise<void> {
    try {
      const data = await this.fetch();
      const changed = data !== null || this._error !== '';
      if (data !== null) {
        this._data = data;
      }
      this._error = '';
      if (changed) {
        this._changed.emit(); // an unchanged answer (null) draws nothing again
      }
    } catch (error) {
      this._error = String((error as Error).message ?? error);
      this._changed.emit();
      throw error; // the Poll backs off
    }
  }

  protected _data: T | null = null;
  private _error = '';
  private _poll: Poll<void, unknown>;
  private _changed = new Signal<this, void>(this);
}

/** The server's devices (one poller per server, shared by every tab), about once a second. */
export class DevicesModel extends PolledModel<IDevicesPayload> implements IRefreshable {
  constructor(interval = DEFAULT_RATES.devicesMs) {
    super('gpuprof:devices', interval);
  }

  setRefreshRates(rates: IRefreshRates): void {
    this.setInterval(rates.devicesMs);
  }

  protected fetch(): Promise<IDevicesPayload> {
    return requestAPI<IDevicesPayload>('devices');
  }
}

/** The sessions' poll: a kernel's state file is rewritten every 30 s and 2 s after a cell. */
export const SESSIONS_MS = 10 * 1000;

/** This server's kernels' session states (the idle GPU held), every ``interval`` ms. */
export class SessionsModel extends PolledModel<ISessionsPayload> {
  constructor(interval = SESSIONS_MS) {
    super('gpuprof:sessions', interval);
  }

  protected fetch(): Promise<ISessionsPayload> {
    return requestAPI<ISessionsPayload>('sessions');
  }
}

/**
 * The experiments of one store (the current notebook's directory's .gpuprof). Polls send the
 * last ETag: an unchanged listing comes back as a bodyless 304 and nothing is redrawn.
 */
export class ExperimentsModel extends PolledModel<IExperimentsPayload> {
  constructor(interval = DEFAULT_RATES.experimentsMs) {
    super('gpuprof:experiments', interval);
  }

  get store(): string {
    return this._store;
  }

  set store(value: string) {
    if (value !== this._store) {
      this._store = value;
      this._data = null;
      this._etag = '';
      void this.refresh();
    }
  }

  protected async fetch(): Promise<IExperimentsPayload | null> {
    const store = this._store;
    const answer = await requestIfChanged<IExperimentsPayload>('experiments', { store }, this._etag);
    if (answer === null || store !== this._store) {
      return null; // unchanged (304), or the store changed while this request was out
    }
    this._etag = answer.etag;
    return answer.data;
  }

  private _store = '.gpuprof';
  private _etag = '';
}

const LIVE_POINTS = 600;

/**
 * A running experiment followed from the store: one full (server-decimated) read, then
 * offset-based tail reads of its stream, so only new rows travel.
 */
export class LiveModel extends PolledModel<IExperimentPayload> {
  constructor(store: string, id: string, interval = DEFAULT_RATES.liveMs) {
    super('gpuprof:live', interval);
    this.store = store;
    this.id = id;
  }

  readonly store: string;
  readonly id: string;

  /** Device -> series so far (the tail reads appended, the oldest points dropped). */
  get series(): Record<string, Series> {
    return this._series;
  }

  get running(): boolean {
    return this._data?.running ?? true;
  }

  /** Tail reads done (each read only the bytes after the previous offset). */
  get tailReads(): number {
    return this._tailReads;
  }

  protected async fetch(): Promise<IExperimentPayload | null> {
    if (this._data !== null && !this._data.running) {
      return null; // finished: nothing more to follow
    }
    const offset = this._offset === null ? undefined : String(this._offset);
    const payload = await requestAPI<IExperimentPayload>(`experiments/${encodeURIComponent(this.id)}`, {
      store: this.store,
      offset
    });
    if (!payload.running || !payload.tail) {
      this._series = payload.series;
    } else {
      this._tailReads += 1;
      for (const [device, part] of Object.entries(payload.series)) {
        const series = (this._series[device] = this._series[device] ?? {});
        for (const [name, values] of Object.entries(part)) {
          const column = (series[name] = series[name] ?? []);
          column.push(...values);
          if (column.length > LIVE_POINTS) {
            column.splice(0, column.length - LIVE_POINTS);
          }
        }
      }
    }
    this._offset = payload.offset;
    return payload;
  }

  private _offset: number | null = null;
  private _series: Record<string, Series> = {};
  private _tailReads = 0;
}

/** A widget drawn from one model: ``render()`` runs now and on every change of the model. */
export abstract class ModelView<M extends { changed: ISignal<any, void> }> extends Widget {
  constructor(model: M, className: string) {
    super();
    this.addClass(className);
    this.model = model;
    model.changed.connect(this.render, this);
  }

  dispose(): void {
    this.model.changed.disconnect(this.render, this);
    super.dispose();
  }

  protected abstract render(): void;

  protected readonly model: M;
}
