/**
 * Real-time collaboration: another person's output changes keep their place in this page.
 *
 * Runs in the browser (JupyterLab's page).
 *
 * With jupyter-collaboration, a cell's outputs live in the shared notebook (a Y document) and
 * each page mirrors them into its own output model. JupyterLab 4.6 mirrors another page's change
 * by removing at the right place but appending every inserted output
 * (`CodeCellModel._onSharedModelChanged` in @jupyterlab/cells: "Inserting an output always
 * results in appending it"). An output replaced in place that is not the cell's last (a display
 * handle's update: the profiler's static ending puts its PNG where the live view was) so lands at
 * the end of the cell in every other page, and the next in-place update there removes the wrong
 * output. The page that ran the cell is right; so is the shared notebook.
 *
 * This mends the other pages: after JupyterLab has applied such a change (one that inserted an
 * output before the end), the cell's output model is read again from the shared notebook. The
 * mend writes nothing back (the model's link to the shared notebook is unhooked meanwhile), so
 * no other page sees a change.
 */
import type { ICellModel, ICodeCellModel } from '@jupyterlab/cells';
import type { NotebookPanel } from '@jupyterlab/notebook';

/** One step of a Y array's change, as JupyterLab hands it over. */
export interface IDeltaStep {
  insert?: readonly unknown[];
  delete?: number;
  retain?: number;
}

/**
 * Whether a change to a list of ``length`` items (after it) inserted an item that has other
 * items after it: the change JupyterLab mirrors in the wrong place.
 */
export function insertsBeforeEnd(delta: readonly IDeltaStep[], length: number): boolean {
  let index = 0; // position in the list after the change; deleted items take none
  for (const step of delta) {
    index += step.retain ?? 0;
    if (step.insert) {
      index += step.insert.length;
      if (index < length) {
        return true;
      }
    }
  }
  return false;
}

/** The parts of JupyterLab's code cell model the mend reaches into (not public API). */
interface ICodeCellInternals {
  onOutputsChange: (...args: unknown[]) => void;
  _connectStreamListener?: (output: unknown, index: number) => void;
}

/** Read a code cell's outputs again from the shared notebook, without writing them back. */
function mirrorAgain(cell: ICodeCellModel): void {
  const internals = cell as unknown as ICodeCellInternals;
  const outputs = cell.outputs;
  outputs.changed.disconnect(internals.onOutputsChange, cell);
  try {
    outputs.fromJSON(cell.sharedModel.getOutputs());
  } finally {
    outputs.changed.connect(internals.onOutputsChange, cell);
  }
  // the link also carries this page's own stream text to the shared notebook (as JupyterLab
  // sets it up for outputs it adds)
  for (let i = 0; i < outputs.length; i++) {
    if (outputs.get(i).type === 'stream') {
      internals._connectStreamListener?.call(cell, outputs.get(i), i);
    }
  }
}

function watchCell(cell: ICellModel): void {
  if (cell.type !== 'code') {
    return;
  }
  const code = cell as ICodeCellModel;
  // connected after the cell model's own handler, so this runs once JupyterLab has applied the change
  code.sharedModel.changed.connect((_, change) => {
    const delta = change.outputsChange as readonly IDeltaStep[] | undefined;
    if (delta && insertsBeforeEnd(delta, code.outputs.length)) {
      mirrorAgain(code);
    }
  });
}

/** Keep every code cell of a notebook (present and to come) mirrored in the right order. */
export function keepOutputsInPlace(panel: NotebookPanel): void {
  void panel.context.ready.then(() => {
    const model = panel.content.model;
    if (!model) {
      return;
    }
    for (let i = 0; i < model.cells.length; i++) {
      watchCell(model.cells.get(i));
    }
    model.cells.changed.connect((_, args) => {
      if (args.type === 'add' || args.type === 'set') {
        args.newValues.forEach(watchCell);
      }
    });
  });
}
