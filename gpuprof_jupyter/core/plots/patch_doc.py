"""The PATCH-DOC messages the live plots apply, written by hand: the JSON Bokeh itself would
send (checked against Bokeh's own by tests/test_live_model.py), without importing Bokeh.

Runs in the sampler process, which prepares the live view's changes; the kernel forwards the
(header, content) texts to the page as they are.
"""

from __future__ import annotations

import json
import uuid

_JSON_NUMBERS = (("-Infinity", '{"type":"number","value":"-inf"}'), ("Infinity", '{"type":"number","value":"+inf"}'),
                 ("NaN", '{"type":"number","value":"nan"}'))


def _map_json(data: dict[str, list]) -> str:
    """``{"type":"map","entries":[...]}`` of columns of numbers or of text, as Bokeh writes a
    dict of lists (NaN and infinities in number columns as Bokeh's number objects)."""
    entries = []
    for name, values in data.items():
        text = json.dumps(values, separators=(",", ":"), allow_nan=True)
        if not (values and isinstance(values[0], str)):
            for word, rep in _JSON_NUMBERS:
                if word in text:
                    text = text.replace(word, rep)
        entries.append(f"[{json.dumps(name)},{text}]")
    return '{"type":"map","entries":[%s]}' % ",".join(entries)


def _message(event: str) -> tuple[str, str]:
    header = json.dumps({"msgid": uuid.uuid4().hex, "msgtype": "PATCH-DOC", "num_buffers": 0})
    return header, '{"events":[%s]}' % event


def stream_message(source_id: str, data: dict[str, list], rollover: int | None) -> tuple[str, str]:
    """(header, content) of the PATCH-DOC that appends ``data`` to a ColumnDataSource."""
    return _message('{"kind":"ColumnsStreamed","model":{"id":%s},"attr":"data","data":%s,"rollover":%s}'
                    % (json.dumps(source_id), _map_json(data), "null" if rollover is None else int(rollover)))


def replace_message(source_id: str, data: dict[str, list]) -> tuple[str, str]:
    """(header, content) of the PATCH-DOC that replaces a ColumnDataSource's data."""
    return _message('{"kind":"ColumnDataChanged","model":{"id":%s},"attr":"data","data":%s,"cols":null}'
                    % (json.dumps(source_id), _map_json(data)))


__all__ = ["stream_message", "replace_message"]
