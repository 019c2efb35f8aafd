import {
  ILabShell,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette, ToolbarButton } from '@jupyterlab/apputils';
import { PathExt } from '@jupyterlab/coreutils';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';
import { LabIcon } from '@jupyterlab/ui-components';

import { keepOutputsInPlace } from './collaboration';
import { DevicesModel, SessionsModel } from './model';
import { followRefreshRates } from './settings';
import { GPUProfilerPanel } from './sidebar';
import { DeviceStatusItem, IdleHeldStatusItem } from './statusbar';

const ICON_SVG =
  '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24"><g class="jp-icon3" fill="#616161">' +
  '<path d="M4 6h16v12H4zM2 9h2v2H2zm0 4h2v2H2zm18-4h2v2h-2zm0 4h2v2h-2zM7 20h2v2H7zm4 0h2v2h-2zm4 0h2v2h-2z"/>' +
  '</g><path d="M6 15l3-4 3 2 3-5 3 3" fill="none" stroke="#fff" stroke-width="1.6"/></svg>';

export const gpuIcon = new LabIcon({ name: 'gpuprof:gpu', svgstr: ICON_SVG });

export namespace CommandIDs {
  export const open = 'gpuprof:open';
  export const profileCell = 'gpuprof:profile-cell';
}

const MAGIC = '%%gpuprofile';

/** Add ``%%gpuprofile`` as the first line of a cell's source (unchanged if it has it). */
export function withMagic(source: string): string {
  return source.startsWith(MAGIC) ? source : `${MAGIC}\n${source}`;
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'gpuprof-jupyter:plugin',
  description: 'GPU Profiler sidebar, status bar and commands (gpuprof_jupyter).',
  autoStart: true,
  optional: [ILabShell, INotebookTracker, ICommandPalette, IStatusBar, ISettingRegistry],
  activate: (
    app: JupyterFrontEnd,
    labShell: ILabShell | null,
    tracker: INotebookTracker | null,
    palette: ICommandPalette | null,
    statusBar: IStatusBar | null,
    settingRegistry: ISettingRegistry | null
  ) => {
    const devices = new DevicesModel();
    const panel = new GPUProfilerPanel(devices);
    panel.title.icon = gpuIcon;
    app.shell.add(panel, 'right', { rank: 900 });
    if (settingRegistry) {
      followRefreshRates(settingRegistry, plugin.id, [devices, panel]).catch(reason =>
        console.warn('gpuprof-jupyter: settings not loaded, default refresh rates kept', reason)
      );
    }

    const follow = () => {
      const current = tracker?.currentWidget;
      panel.setDirectory(current ? PathExt.dirname(current.context.path) : '');
    };
    follow();
    tracker?.currentChanged.connect(follow);

    app.commands.addCommand(CommandIDs.open, {
      label: 'Open GPU Profiler',
      caption: 'Show the GPU Profiler sidebar: devices, experiments, reports',
      icon: gpuIcon,
      execute: () => {
        follow();
        app.shell.activateById(panel.id);
        void panel.refresh();
      }
    });
    app.commands.addCommand(CommandIDs.profileCell, {
      label: 'Profile current cell',
      caption: 'Add %%gpuprofile to the active cell',
      icon: gpuIcon,
      isEnabled: () => !!tracker?.activeCell && tracker.activeCell.model.type === 'code',
      execute: () => {
        const cell = tracker?.activeCell;
        if (!cell || cell.model.type !== 'code') {
          return;
        }
        const source = cell.model.sharedModel.getSource();
        cell.model.sharedModel.setSource(withMagic(source));
      }
    });
    if (palette) {
      palette.addItem({ command: CommandIDs.open, category: 'GPU Profiler' });
      palette.addItem({ command: CommandIDs.profileCell, category: 'GPU Profiler' });
    }
    app.contextMenu.addItem({ command: CommandIDs.profileCell, selector: '.jp-Notebook .jp-CodeCell', rank: 20 });
    app.contextMenu.addItem({ command: CommandIDs.open, selector: '.jp-Notebook', rank: 21 });
    tracker?.widgetAdded.connect((_, notebook: NotebookPanel) => {
      const button = new ToolbarButton({
        className: 'jp-gpuprof-toolbar-button',
        icon: gpuIcon,
        tooltip: 'Profile current cell (%%gpuprofile)',
        onClick: () => void app.commands.execute(CommandIDs.profileCell)
      });
      notebook.toolbar.insertItem(10, 'gpuprofile', button);
      keepOutputsInPlace(notebook); // real-time collaboration: others' outputs in their place
    });

    if (statusBar) {
      const item = new DeviceStatusItem(devices, () => void app.commands.execute(CommandIDs.open));
      statusBar.registerStatusItem('gpuprof-jupyter:status', {
        item,
        align: 'left',
        rank: 5
      });
      const sessions = new SessionsModel();
      const kernelId = () => tracker?.currentWidget?.sessionContext.session?.kernel?.id ?? null;
      const idleHeld = new IdleHeldStatusItem(sessions, kernelId, () => void app.commands.execute(CommandIDs.open));
      tracker?.currentChanged.connect(() => idleHeld.redraw());
      statusBar.registerStatusItem('gpuprof-jupyter:idle-held', {
        item: idleHeld,
        align: 'left',
        rank: 6
      });
    }
    void labShell;
  }
};

export default plugin;
