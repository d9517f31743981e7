"""What a wandb run has written to its transaction log, `run-<id>.wandb`: the file wandb-core
writes as the run goes, offline and online, and `wandb sync` uploads. wandb has no reader of it in
Python; its records are wandb's own protobuf `Record`s, read here with wandb's classes, in the file's
framing (below). A resumed run reads what the parts before it wrote, so that it sends exactly the
rest (`common.tracking.WandbHistory`)."""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HEADER = b":W&B\xe1\xbe\x00"
BLOCK = 32768
CHUNK_HEADER = 7


def records(data: bytes, position: int = len(HEADER)) -> Iterator[tuple[bytes, int]]:
    """Each whole record of a `.wandb` file's `data` from `position` (the start of a record), with
    the position after it.

    LevelDB's log framing as wandb-core writes it: a 7-byte file header (b":W&B", the magic 0xBEE1
    as a little-endian uint16, version 0), then 32 KiB blocks counted from the file's start (the
    header sits in the first). A record is one or more chunks, each behind a 7-byte header: checksum
    (uint32, the plain zlib CRC-32 of the type byte and the data, not LevelDB's masked CRC-32C),
    length (uint16), type (FULL=1, or FIRST=2, MIDDLE=3..., LAST=4 when split across blocks); all
    little-endian. A block's tail shorter than a chunk header is padding. A record cut short at the
    end (a writer still at work, or killed) ends it; a corrupt chunk is a ValueError."""
    if data[: len(HEADER)] != HEADER:
        raise ValueError(f"not a wandb file (header {data[: len(HEADER)]!r})")
    yield from _records(data, position)


def _records(data: bytes, position: int) -> Iterator[tuple[bytes, int]]:
    """`records` of `data` that start at a block's start in the file."""
    parts: list[bytes] = []
    while position + CHUNK_HEADER <= len(data):
        if (room := BLOCK - position % BLOCK) < CHUNK_HEADER:
            position += room
            continue
        checksum, length, kind = struct.unpack_from("<IHB", data, position)
        chunk = data[position + CHUNK_HEADER : position + CHUNK_HEADER + length]
        if len(chunk) < length <= room - CHUNK_HEADER:
            return
        bad_kind = kind not in (1, 2, 3, 4) or (kind < 3) == bool(parts)  # FULL or FIRST...LAST
        if len(chunk) < length or zlib.crc32(bytes([kind]) + chunk) != checksum or bad_kind:
            raise ValueError(f"corrupt chunk at byte {position} (type {kind}, length {length})")
        position += CHUNK_HEADER + length
        parts.append(chunk)
        if kind in (1, 4):
            yield b"".join(parts), position
            parts = []


def item_key(item: Any) -> str:
    """The key of a history, config or summary item: nested keys joined by '/'."""
    return item.key or "/".join(item.nested_key)


def history_row(record: Any) -> dict[str, Any]:
    """A history record's row (what one `wandb.log` call gave, with wandb's `_step`, `_runtime` and
    `_timestamp`)."""
    return {item_key(item): json.loads(item.value_json) for item in record.history.item}


class TransactionLog:
    """The history rows of one `.wandb` file, read as it grows: each `new_rows()` reads what was
    written since the last."""

    def __init__(self, path: Path):
        self.path, self.position = Path(path), len(HEADER)

    def new_rows(self) -> list[dict[str, Any]]:
        """The history rows written since the last call (none while the file does not exist)."""
        from wandb.proto.wandb_internal_pb2 import Record

        if not self.path.is_file():
            return []
        start = self.position - self.position % BLOCK  # the blocks from the first record not read
        with open(self.path, "rb") as file:
            file.seek(start)
            data = file.read()
        if start == 0 and len(data) < len(HEADER):
            return []
        rows = []
        read = records if start == 0 else _records  # the header checked once
        for data_of_record, end in read(data, self.position - start):
            self.position = start + end
            record = Record.FromString(data_of_record)
            if record.WhichOneof("record_type") == "history":
                rows.append(history_row(record))
        return rows
