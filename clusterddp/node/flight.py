"""``flight``: the flight recorder dumps torch left in a node's control folder, for the failure summary.

launch.sh points ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` at ``$CTL/flight/rank`` (``clusterddp.flight.env_lines``),
so a NCCL rank whose collective times out writes its flight recorder there as ``rank<global rank>`` (a
pickle), and the other ranks, told through the store, write theirs. After a failure this program sends
each such file, as it is: the bytes are read here, bounded, and never unpickled on the node or trusted on
the launcher (``clusterddp.flight.parse_dump`` reads them with an unpickler that refuses every global).

``flight CTL`` prints one line: :data:`MARK` and a JSON object ``{"dumps": [{"rank": N, "size": bytes,
"data": base64 of zlib of the bytes, or null, "note": why null}]}``. Regular files only (a link is not
followed), at most :data:`MOST_FILES`, each at most :data:`MOST_BYTES`. Python 3.8 grammar, standard
library only.
"""

from __future__ import annotations

import base64
import json
import os
import re
import stat
import sys
import zlib

MARK = "CLUSTERDDP_FLIGHT "
FOLDER = "flight"                # in the control folder
PREFIX = "rank"                  # torch appends the global rank to TORCH_NCCL_DEBUG_INFO_TEMP_FILE
MOST_FILES = 64                  # a node runs at most a few dozen ranks
MOST_BYTES = 16 << 20            # of one dump: 2000 entries with their Python frames are a few MiB
MOST_REPLY = 96 << 20            # of the whole answer (compressed dumps, base64), which the reader refuses beyond
NAME = re.compile(PREFIX + r"([0-9]{1,7})")


def _read(path: str) -> tuple:
    """(bytes, note): the file's first MOST_BYTES + 1 bytes, or None and why there are none."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        return None, "cannot open: %s" % (e.strerror or e)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None, "not a regular file"
        chunks, size = [], 0
        while size <= MOST_BYTES:
            b = os.read(fd, min(1 << 20, MOST_BYTES + 1 - size))
            if not b:
                break
            chunks.append(b)
            size += len(b)
        return b"".join(chunks), ""
    except OSError as e:
        return None, "cannot read: %s" % (e.strerror or e)
    finally:
        os.close(fd)


def dumps(ctl: str) -> list:
    folder = os.path.join(ctl, FOLDER)
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    out = []  # type: list
    for name in names:
        m = NAME.fullmatch(name)
        if m is None:
            continue
        if len(out) >= MOST_FILES:
            break
        data, note = _read(os.path.join(folder, name))
        entry = {"rank": int(m.group(1)), "size": len(data) if data is not None else 0, "data": None, "note": note}
        if data is not None and len(data) > MOST_BYTES:
            entry["note"] = "over %d bytes: not sent" % MOST_BYTES
        elif data is not None:
            entry["data"] = base64.b64encode(zlib.compress(data, 6)).decode("ascii")
        out.append(entry)
    return out


def main(argv: list) -> int:
    print(MARK + json.dumps({"dumps": dumps(argv[0])}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
