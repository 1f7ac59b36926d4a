"""The disk tier: one file per KV block under DIR/<fingerprint>/, written behind the step, read back ahead
of the prefill that needs it, bounded in bytes with least-recently-used eviction, rebuilt at start-up.

    DIR/
      3f9c0e7a1b2d4c5e/            one folder per model fingerprint (fingerprint.py)
        manifest.json              what the fingerprint covers (model identity, dtypes, KV layout)
        <block key hex>.kv         one block (block_file.py): header, key, CRC-32, payload
        .<block key hex>.kv.tmp    a write in progress; left by a process killed mid-write, removed at start

Why one file per block (not an append-only segment per run): eviction by size is an unlink, not a
compaction; a write cut short loses one block, never a segment's tail; and the index is the folder
listing plus one header read per file. The cost, an inode per block, is small next to a block's bytes
(hundreds of KB for the models served here).

Writes: temporary file (0600) → write → optional fsync → rename over the final name. fsync policy
`never` (default): a process crash (kill -9) cannot tear a renamed file (the page cache keeps it), and a
power loss that does is caught by the CRC at read time; `always` fsyncs the file before and the folder
after the rename, for storage shared with something that must never see a lost block.
"""
from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from modelcall.core.errors import ConfigError
from modelcall.plugins.kv_cache.block_file import (
    HEAD, SUFFIX, BadBlockFile, check_payload, encode_header, file_name, parse_header,
)

log = logging.getLogger("modelcall.kv_cache.disk")

FSYNC_POLICIES = ("never", "always")
TMP = ".tmp"


class DiskTier:
    """Blocks of one model fingerprint in `directory`, at most `capacity_bytes` of files.

    The engine loop calls `has`, `put`, `prefetch` and `get`; one writer thread writes queued blocks
    (`queue_blocks` at most: a block offered to a full queue is dropped and counted, the step never
    waits), one reader thread reads prefetched ones. The index is shared under `lock`.
    """

    def __init__(self, directory: str, fingerprint: bytes, fields: dict[str, Any], block_bytes: int,
                 capacity_bytes: int, *, fsync: str = "never", queue_blocks: int = 256) -> None:
        if fsync not in FSYNC_POLICIES:
            raise ConfigError(f"kv_cache_fsync must be one of {', '.join(FSYNC_POLICIES)}, got {fsync!r}")
        if capacity_bytes < block_bytes:
            raise ConfigError(f"kv_cache_disk_gb holds no block: {capacity_bytes} bytes, a block takes {block_bytes}")
        self.root = directory
        self.fingerprint = fingerprint
        self.dir = os.path.join(directory, fingerprint.hex()[:16])
        self.block_bytes = block_bytes
        self.capacity_bytes = capacity_bytes
        self.fsync = fsync
        self.lock = threading.Lock()
        self.index: OrderedDict[bytes, int] = OrderedDict()   # key -> file size, least recently used first
        self.bytes_used = 0
        self.queued: set[bytes] = set()
        self.skipped: list[tuple[str, str]] = []   # (file, why) found unusable at start-up: never loaded
        self.other_fingerprints: list[str] = []    # folders of other models (or dtypes) in the same directory
        self.num_written = self.num_dropped = self.num_write_errors = self.num_evicted = 0
        self.num_read = self.num_rejected = 0
        self.bytes_written = 0
        self.write_s = 0.0
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        self._write_manifest(fields)
        self._scan()
        self._evict_over_budget()
        self._queue: queue.Queue = queue.Queue(queue_blocks)
        self._reads: dict[bytes, Future] = {}
        self._max_reads = max(8, (256 << 20) // block_bytes)   # prefetched bytes held at most: 256 MB
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="modelcall-kv-disk-read")
        self._writer = threading.Thread(target=self._write_loop, name="modelcall-kv-disk-write", daemon=True)
        self._writer.start()

    # ---- start-up: the index rebuilt from the folder ----------------------------------------------

    def _write_manifest(self, fields: dict[str, Any]) -> None:
        path = os.path.join(self.dir, "manifest.json")
        body = json.dumps({"format": 1, "fingerprint": self.fingerprint.hex(), **fields}, indent=1, sort_keys=True)
        self._atomic_write(path, [body.encode()])
        self.other_fingerprints = sorted(e.name for e in os.scandir(self.root)
                                         if e.is_dir() and e.name != os.path.basename(self.dir))

    def _scan(self) -> None:
        found: list[tuple[float, bytes, int]] = []
        for entry in os.scandir(self.dir):
            name = entry.name
            if name.endswith(TMP):
                self._skip(name, "an unfinished write (the process stopped mid-write)", remove=True)
            elif name.endswith(SUFFIX):
                try:
                    key, size, mtime = self._check_file(entry)
                except BadBlockFile as e:
                    self._skip(name, str(e), remove=True)
                    continue
                found.append((mtime, key, size))
        for _, key, size in sorted(found):   # NOTE: last written = most recently used, across a restart
            self.index[key] = size
            self.bytes_used += size
        if self.skipped:
            log.warning("KV disk tier %s: skipped %d file(s), none loaded: %s", self.dir, len(self.skipped),
                        "; ".join(f"{n}: {why}" for n, why in self.skipped[:8]))
        if self.other_fingerprints:
            log.info("KV disk tier %s: folders of other model fingerprints left alone: %s", self.root,
                     ", ".join(self.other_fingerprints))
        log.info("KV disk tier %s: %d block(s), %.1f MB, rebuilt from the folder", self.dir, len(self.index),
                 self.bytes_used / 1e6)

    def _check_file(self, entry: os.DirEntry) -> tuple[bytes, int, float]:
        st = entry.stat()
        with open(entry.path, "rb") as f:
            head = f.read(HEAD.size + 256)
        key, offset, _ = parse_header(head, self.fingerprint, self.block_bytes)
        if entry.name != file_name(key):
            raise BadBlockFile("the file name is not its key")
        if st.st_size != offset + self.block_bytes:
            raise BadBlockFile(f"{st.st_size} bytes, a block file has {offset + self.block_bytes}")
        return key, st.st_size, st.st_mtime

    def _skip(self, name: str, why: str, *, remove: bool) -> None:
        self.skipped.append((name, why))
        if remove:
            try:
                os.unlink(os.path.join(self.dir, name))
            except OSError:
                pass

    # ---- the engine loop's side --------------------------------------------------------------------

    def has(self, key: bytes) -> bool:
        return key in self.index

    def put(self, key: bytes, payload: Any) -> None:
        """Queue a block for writing; never waits (a full queue drops it and counts the drop)."""
        if key in self.index or key in self.queued:
            return
        self.queued.add(key)   # NOTE: before the put: the writer may finish it before put_nowait returns
        try:
            self._queue.put_nowait((key, payload))
        except queue.Full:
            self.queued.discard(key)
            self.num_dropped += 1

    def prefetch(self, keys: list[bytes]) -> None:
        """Start reading the blocks of `keys` on disk, so `get` finds them read."""
        for key in keys:
            if len(self._reads) >= self._max_reads:
                return
            if key in self.index and key not in self._reads:
                self._reads[key] = self._reader.submit(self._read, key)

    def get(self, key: bytes) -> Any:
        """The block's checked bytes, or None (not on disk, or refused: then deleted and counted)."""
        fut = self._reads.pop(key, None)
        payload = fut.result() if fut is not None else self._read(key)
        if payload is not None:
            with self.lock:
                if key in self.index:
                    self.index.move_to_end(key)
        return payload

    def drop_prefetched(self) -> None:
        """Forget reads nobody took (their requests were served from the pool or left)."""
        for fut in self._reads.values():
            fut.cancel()
        self._reads.clear()

    # ---- reads (reader thread or engine loop) -------------------------------------------------------

    def _read(self, key: bytes) -> Any:
        path = os.path.join(self.dir, file_name(key))
        try:
            with open(path, "rb") as f:
                data = bytearray(os.fstat(f.fileno()).st_size)
                n = f.readinto(data)
            if n != len(data):
                raise BadBlockFile("short read")
            k, offset, crc = parse_header(data, self.fingerprint, self.block_bytes)
            if k != key or len(data) != offset + self.block_bytes:
                raise BadBlockFile("key or size does not match the index")
            payload = memoryview(data)[offset:]
            check_payload(payload, crc)
        except FileNotFoundError:   # evicted by the writer meanwhile: a miss
            self._forget(key)
            return None
        except (BadBlockFile, OSError) as e:
            self.num_rejected += 1
            log.warning("KV disk tier: %s refused, not loaded: %s", path, e)
            self._forget(key)
            try:
                os.unlink(path)
            except OSError:
                pass
            return None
        self.num_read += 1
        return np.frombuffer(data, dtype=np.uint8, offset=offset)

    def _forget(self, key: bytes) -> None:
        with self.lock:
            size = self.index.pop(key, None)
            if size is not None:
                self.bytes_used -= size

    # ---- writes (writer thread) ---------------------------------------------------------------------

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            key, payload = item
            try:
                t0 = time.perf_counter()
                view = memoryview(payload).cast("B")
                path = os.path.join(self.dir, file_name(key))
                self._atomic_write(path, [encode_header(self.fingerprint, key, view), view])
                self.write_s += time.perf_counter() - t0
                size = HEAD.size + len(key) + view.nbytes
                self.bytes_written += size
                self.num_written += 1
                with self.lock:
                    self.index[key] = size
                    self.bytes_used += size
                self._evict_over_budget()
            except OSError as e:
                self.num_write_errors += 1
                log.warning("KV disk tier: writing a block failed: %s", e)
            finally:
                self.queued.discard(key)

    def _atomic_write(self, path: str, parts: list[Any]) -> None:
        """Write then rename: a reader (or the next start) sees the whole file or none of it."""
        head, name = os.path.split(path)
        tmp = os.path.join(head, "." + name + TMP)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.fchmod(fd, 0o600)   # an older file of that name may have had other bits
            for part in parts:
                view = memoryview(part)
                while view.nbytes:
                    view = view[os.write(fd, view):]
            if self.fsync == "always":
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        if self.fsync == "always":
            dfd = os.open(head, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)

    def _evict_over_budget(self) -> None:
        victims = []
        with self.lock:
            while self.bytes_used > self.capacity_bytes and self.index:
                key, size = self.index.popitem(last=False)
                self.bytes_used -= size
                victims.append(key)
        for key in victims:
            self.num_evicted += 1
            try:
                os.unlink(os.path.join(self.dir, file_name(key)))
            except OSError:
                pass

    # ---- life cycle ---------------------------------------------------------------------------------

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until every queued block is written (True) or `timeout_s` passed (False)."""
        deadline = time.monotonic() + timeout_s
        while self.queued and time.monotonic() < deadline:
            time.sleep(0.005)
        return not self.queued

    def clear(self) -> None:
        """Forget and delete every block of this fingerprint (the prefix cache was reset)."""
        self.flush()
        with self.lock:
            keys = list(self.index)
            self.index.clear()
            self.bytes_used = 0
        for key in keys:
            try:
                os.unlink(os.path.join(self.dir, file_name(key)))
            except OSError:
                pass

    def close(self, timeout_s: float = 30.0) -> None:
        self.flush(timeout_s)
        self._queue.put(None)
        self._writer.join(timeout_s)
        self.drop_prefetched()
        self._reader.shutdown(wait=True)

    def stats(self) -> dict[str, float]:
        return {"disk_blocks": float(len(self.index)), "disk_bytes": float(self.bytes_used),
                "disk_written": float(self.num_written), "disk_bytes_written": float(self.bytes_written),
                "disk_write_s": self.write_s, "disk_write_dropped": float(self.num_dropped),
                "disk_write_errors": float(self.num_write_errors), "disk_evicted": float(self.num_evicted),
                "disk_read": float(self.num_read), "disk_rejected": float(self.num_rejected),
                "disk_skipped_files": float(len(self.skipped))}
