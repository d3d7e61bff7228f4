"""Reading an offline wandb run back from its ``run-<id>.wandb`` file, without a server.

The file is wandb's transaction log: a 7-byte header (``:W&B``, a magic number, a
version), then LevelDB-style log records (4-byte checksum, 2-byte length, 1-byte type:
full, first, middle, last) in 32 KiB blocks, each carrying one protobuf ``Record``.
"""

from __future__ import annotations

import glob
import os
import struct

from wandb.proto import wandb_internal_pb2

_BLOCK, _HEADER, _FILE_HEADER = 32768, 7, 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def records(path: str) -> list[wandb_internal_pb2.Record]:
    data = open(path, "rb").read()
    assert data[:4] == b":W&B", f"{path} is not a wandb transaction log"
    out, pos, pending = [], _FILE_HEADER, b""
    while pos + _HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:  # the rest of a block too short for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + _HEADER])
        chunk = data[pos + _HEADER : pos + _HEADER + length]
        pos += _HEADER + length
        if kind == 0 and length == 0:
            break
        pending = chunk if kind in (_FULL, _FIRST) else pending + chunk
        if kind in (_FULL, _LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            out.append(record)
    return out


def offline_run(folder: str) -> dict:
    """What an offline run folder says about its run: role, group, tags, config keys, the
    names of logged history keys, logged artifacts, and its files."""
    (path,) = glob.glob(os.path.join(folder, "run-*.wandb"))
    run, history, artifacts, config = None, set(), [], {}
    for record in records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
            config.update({item.key: item.value_json for item in record.run.config.update})
        elif kind == "config":
            config.update({item.key: item.value_json for item in record.config.update})
        elif kind == "history":
            history |= {item.key for item in record.history.item}
        elif kind == "artifact":
            artifacts.append(record.artifact)
    files = [os.path.relpath(p, folder) for p in glob.glob(os.path.join(folder, "files", "**", "*"), recursive=True)]
    return {"job_type": run.job_type, "group": run.run_group, "tags": list(run.tags), "config": config,
            "history": history, "artifacts": artifacts, "files": files}
