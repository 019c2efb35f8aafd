import { ISettingRegistry } from '@jupyterlab/settingregistry';

/** How often the status bar and sidebar ask the server (JupyterLab settings: schema/plugin.json). */
export interface IRefreshRates {
  devicesMs: number;
  experimentsMs: number;
  liveMs: number;
}

export const DEFAULT_RATES: IRefreshRates = { devicesMs: 1000, experimentsMs: 5000, liveMs: 2000 };

/** Anything that polls at one of these rates. */
export interface IRefreshable {
  setRefreshRates(rates: IRefreshRates): void;
}

function rate(settings: ISettingRegistry.ISettings, key: string, fallback: number): number {
  const value = settings.get(key).composite;
  return typeof value === 'number' && value > 0 ? value : fallback;
}

/** Apply the plugin's settings to ``targets`` now and whenever the user changes them. */
export async function followRefreshRates(
  registry: ISettingRegistry,
  pluginId: string,
  targets: IRefreshable[]
): Promise<void> {
  const settings = await registry.load(pluginId);
  const apply = () => {
    const rates: IRefreshRates = {
      devicesMs: rate(settings, 'devicesRefreshMs', DEFAULT_RATES.devicesMs),
      experimentsMs: rate(settings, 'experimentsRefreshMs', DEFAULT_RATES.experimentsMs),
      liveMs: rate(settings, 'liveRefreshMs', DEFAULT_RATES.liveMs)
    };
    for (const target of targets) {
      target.setRefreshRates(rates);
    }
  };
  apply();
  settings.changed.connect(apply);
}
