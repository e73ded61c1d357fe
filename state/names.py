"""Names of the states the built-in keyed operators keep (operators/keyed_kinds.py), for the code
below operators that reads them back: savepoint export shows the per-epoch entries of
`WINDOW_KEYS` as per-key partials.
"""

from __future__ import annotations

#: Time windows: per key group, window and epoch, the keys that got the window that epoch.
WINDOW_KEYS = "window_keys"
