"""Each rank's output on the local backend, kept under a size cap: written by the supervisor, read by anyone.

The supervisor reads a rank's stdout and stderr through pipes (``CapturedOutput``), one thread per
pipe, and appends every line to the rank's log (``CappedLog``). A rank that writes faster than that
blocks on its full pipe, so nothing is lost and nothing piles up in memory: at most one read and one
unfinished line per stream.

Files in the run dir, for rank N (``storehost`` for the c10d store's process):

- ``rank<N>.log``: the newest segment; ``rank<N>.log.1``: the one before it. Each holds at most half
  the cap, so the two never hold more than the cap. When the newest is full it becomes ``.1`` and the
  old ``.1``, the oldest lines, is dropped.

A segment is text, one record a line::

    #polychip-log {"segment": 3, "first_line": 5120, "bytes_before": 401234}
    5120 1717171717.123456 o epoch 3: loss 0.41
    5121 1717171717.130001 e a warning on stderr

The header names the segment (0, 1, ... as they are made), the number of its first line and how many
bytes of output came before it. Each record: the line's number in the rank's output (from 0), the unix
time the supervisor read it, ``o`` (stdout) or ``e`` (stderr), and the line's bytes without its newline
(lines longer than ``MAX_LINE_BYTES`` are split into several records). The lines the cap dropped are
those numbered below the oldest segment's ``first_line``.

``read_logs`` reads them back (no torch, no Django): one rank or all of them interleaved by time, from
a cursor that continues exactly after the last line an earlier read returned, or from a time.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from runtime.backends.base import LogLine, LogPage

DEFAULT_CAP_BYTES = 8 * 1024 * 1024
# Longer lines are split into records of this size.
MAX_LINE_BYTES = 64 * 1024
# Each half of the cap holds many of the longest records.
MIN_CAP_BYTES = 1024 * 1024
HEADER_PREFIX = b"#polychip-log "
OLDER_SUFFIX = ".1"
_READ_BYTES = 64 * 1024
_SCAN_BYTES = 256 * 1024
_STREAM_TAGS = {"out": b"o", "err": b"e"}
_TAG_STREAMS = {b"o": "out", b"e": "err"}
_RANK_LOG = re.compile(r"^rank(\d+)\.log(?:\.1)?$")


def rank_log(run_dir: Path, rank: int) -> Path:
    """The newest segment of rank N's log (the older one is this path plus ``.1``)."""
    return run_dir / f"rank{rank}.log"


def log_ranks(run_dir: Path) -> list[int]:
    """The ranks that have a log in the run dir."""
    try:
        names = os.listdir(run_dir)
    except OSError:
        return []
    return sorted({int(m.group(1)) for name in names if (m := _RANK_LOG.match(name))})


def check_cap(cap_bytes: int) -> int:
    if isinstance(cap_bytes, bool) or not isinstance(cap_bytes, int) or cap_bytes < MIN_CAP_BYTES:
        raise ValueError(f"log_cap_bytes: at least {MIN_CAP_BYTES} bytes (1 MiB) per rank, got {cap_bytes!r}")
    return cap_bytes


# --- writing ----------------------------------------------------------------------------------------


class CappedLog:
    """One process's log: two segments of half the cap each, the oldest dropped when the newest is full.

    ``write`` is called by both streams' reader threads; a lock keeps records whole and numbered in order.
    """

    def __init__(self, path: Path, cap_bytes: int = DEFAULT_CAP_BYTES) -> None:
        self.path = path
        self.older = path.with_name(path.name + OLDER_SUFFIX)
        self.segment_cap = check_cap(cap_bytes) // 2
        self._lock = threading.Lock()
        self._segment = -1
        self._next_line = 0
        self._bytes = 0  # bytes of output written so far, newlines not counted
        self._size = 0  # of the newest segment
        self._closed = False
        self._last_at = 0.0
        # One supervisor per run dir: a log left there is not this run's.
        self.older.unlink(missing_ok=True)
        self._fh = self._new_segment()

    def _new_segment(self) -> IO[bytes]:
        """A new newest segment, its header written and in place under ``path``.

        Made under a temporary name first so that ``path`` is missing only between the two renames of
        a rotation (readers retry then), never without its header."""
        self._segment += 1
        header = {"segment": self._segment, "first_line": self._next_line, "bytes_before": self._bytes}
        data = HEADER_PREFIX + json.dumps(header, sort_keys=True).encode() + b"\n"
        tmp = self.path.with_name(f".{self.path.name}.new")
        fh = os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb")
        fh.write(data)
        fh.flush()
        if self._segment > 0:
            os.replace(self.path, self.older)  # the old .1 goes: those are the lines the cap drops
        os.replace(tmp, self.path)
        self._size = len(data)
        return fh

    def write(self, stream: str, lines: Iterable[bytes], at: float) -> None:
        """Append lines (without their newlines, each at most ``MAX_LINE_BYTES``) read at unix time ``at``."""
        tag = b" " + _STREAM_TAGS[stream] + b" "
        with self._lock:
            if self._closed:
                return
            # Never before the line above it: a log in time order reads and merges in time order (the
            # two streams' threads take their times before the lock, and the clock may step back).
            self._last_at = max(at, self._last_at)
            stamp = f"{self._last_at:.6f}".encode()
            for text in lines:
                record = b"%d %s%s%s\n" % (self._next_line, stamp, tag, text)
                if self._size + len(record) > self.segment_cap:
                    self._fh.close()
                    self._fh = self._new_segment()
                self._fh.write(record)
                self._size += len(record)
                self._next_line += 1
                self._bytes += len(text)
            # Readers see each read's lines at once (a follower streams them within its poll).
            self._fh.flush()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._fh.close()


def _whole_lines(pieces: Iterable[bytes]) -> Iterator[bytes]:
    for piece in pieces:
        if piece.endswith(b"\r"):
            piece = piece[:-1]
        if len(piece) <= MAX_LINE_BYTES:
            yield piece
            continue
        for start in range(0, len(piece), MAX_LINE_BYTES):
            yield piece[start : start + MAX_LINE_BYTES]


def pump(fd: int, stream: str, log: CappedLog) -> None:
    """Copy a pipe into the log line by line until the writer closes it; closes ``fd``.

    Holds one read and one unfinished line at most: a line with no end in sight is cut at
    ``MAX_LINE_BYTES`` and its rest comes as further records."""
    partial = b""
    try:
        while True:
            try:
                chunk = os.read(fd, _READ_BYTES)
            except OSError:
                break
            if not chunk:
                break
            pieces = (partial + chunk).split(b"\n")
            partial = pieces.pop()
            whole = len(partial) - len(partial) % MAX_LINE_BYTES
            if whole:
                pieces.extend(partial[i : i + MAX_LINE_BYTES] for i in range(0, whole, MAX_LINE_BYTES))
                partial = partial[whole:]
            if pieces:
                log.write(stream, _whole_lines(pieces), time.time())
        if partial:  # the last line had no newline
            log.write(stream, _whole_lines([partial]), time.time())
    finally:
        os.close(fd)


class CapturedOutput:
    """A child process's stdout and stderr, through pipes, into its capped log (a reader thread each)."""

    def __init__(self, path: Path, cap_bytes: int = DEFAULT_CAP_BYTES) -> None:
        self.log = CappedLog(path, cap_bytes)
        self._threads: list[threading.Thread] = []
        self._waited_out = False

    @contextlib.contextmanager
    def pipes(self) -> Iterator[tuple[int, int]]:
        """The write ends for the child's stdout and stderr, while it is started. Afterwards this
        process's copies are closed (so the readers see the end when the child's are) and the readers
        start; if starting the child failed, the pipes are closed and nothing starts."""
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        started = False
        try:
            yield out_write, err_write
            started = True
        finally:
            os.close(out_write)
            os.close(err_write)
            if started:
                for fd, stream in ((out_read, "out"), (err_read, "err")):
                    thread = threading.Thread(
                        target=pump, args=(fd, stream, self.log), name=f"{self.log.path.name}:{stream}", daemon=True
                    )
                    thread.start()
                    self._threads.append(thread)
            else:
                os.close(out_read)
                os.close(err_read)

    def drain(self, timeout_s: float) -> bool:
        """Wait until both pipes reached their end (the child and whatever inherited them are gone), at
        most ``timeout_s``; whether they did. A grandchild that keeps a pipe open is not waited for."""
        # Waited out once: something else holds the pipe, and waiting again would only stall the caller.
        deadline = time.monotonic() + (0.0 if self._waited_out else timeout_s)
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._waited_out = any(t.is_alive() for t in self._threads)
        return not self._waited_out

    def close(self) -> None:
        self.log.close()


# --- reading ----------------------------------------------------------------------------------------


@dataclass
class _Segment:
    number: int
    first_line: int
    body_start: int  # offset of its first record
    fh: IO[bytes]


@dataclass(frozen=True)
class _Position:
    """Where a rank's reading goes on: in segment ``segment`` at byte ``offset`` (0: its first record),
    the next line being number ``line``."""

    segment: int
    offset: int
    line: int


def _open_segment(path: Path) -> _Segment | None:
    try:
        fh = open(path, "rb")  # noqa: SIM115 (held open across the read; closed by _segments' caller)
    except FileNotFoundError:
        return None
    header = fh.readline(4096)
    try:
        if not header.startswith(HEADER_PREFIX) or not header.endswith(b"\n"):
            raise ValueError("no header")
        fields = json.loads(header[len(HEADER_PREFIX) :])
        return _Segment(int(fields["segment"]), int(fields["first_line"]), len(header), fh)
    except (ValueError, KeyError, TypeError):
        fh.close()
        return None


def _segments(path: Path) -> list[_Segment]:
    """The log's segments, oldest first, opened together (a rotation between the two opens is seen by
    their numbers and the opening retried); open files read on unchanged whatever is renamed later."""
    older_path = path.with_name(path.name + OLDER_SUFFIX)
    for _ in range(50):
        older = _open_segment(older_path)
        newer = _open_segment(path)
        if newer is not None and (older is None or older.number == newer.number - 1):
            return [s for s in (older, newer) if s is not None]
        for segment in (older, newer):
            if segment is not None:
                segment.fh.close()
        if newer is None and older is None:
            return []  # nothing captured (yet)
        time.sleep(0.002)  # in the middle of a rotation
    return []


def _parse(record: bytes, rank: int) -> LogLine | None:
    parts = record.split(b" ", 3)
    if len(parts) != 4 or parts[2] not in _TAG_STREAMS:
        return None
    try:
        number, at = int(parts[0]), float(parts[1])
    except ValueError:
        return None
    return LogLine(rank, number, at, _TAG_STREAMS[parts[2]], parts[3].decode("utf-8", errors="replace"))


class _RankReader:
    """A rank's lines from a position on, in order, each with the positions before and after it.

    ``position`` follows the scan (past lines skipped as older than ``since_time``, too); ``dropped`` is
    how many lines the cap took between the starting position and the first line there still is."""

    def __init__(
        self, segments: list[_Segment], rank: int, start: _Position | None = None, since_time: float | None = None
    ) -> None:
        self.rank = rank
        self.since_time = since_time
        self.segments = segments
        self.dropped = 0
        self.skipped_by_time = False
        segments = self.segments
        if not segments:
            self.position = start or _Position(0, 0, 0)
            self._from = len(segments)
            return
        oldest, newest = segments[0], segments[-1]
        if start is None:
            self.position = _Position(oldest.number, 0, oldest.first_line)
            self.dropped = oldest.first_line
            self._from = 0
        elif start.segment < oldest.number:
            # The cap dropped lines that this reader had not read yet.
            self.position = _Position(oldest.number, 0, oldest.first_line)
            self.dropped = max(0, oldest.first_line - start.line)
            self._from = 0
        elif start.segment > newest.number:
            self.position = start  # a cursor from some other log: nothing here comes after it
            self._from = len(segments)
        else:
            self.position = start
            self._from = start.segment - oldest.number

    def __iter__(self) -> Iterator[tuple[LogLine, _Position, _Position]]:
        for segment in self.segments[self._from :]:
            offset = self.position.offset if self.position.segment == segment.number else 0
            offset = max(offset, segment.body_start)
            if self.position.segment != segment.number:
                self.position = _Position(segment.number, offset, max(self.position.line, segment.first_line))
            segment.fh.seek(offset)
            buffered, base = b"", offset
            while chunk := segment.fh.read(_SCAN_BYTES):
                buffered += chunk
                start = 0
                while (end := buffered.find(b"\n", start)) >= 0:
                    line = _parse(buffered[start:end], self.rank)
                    before = self.position
                    self.position = _Position(
                        segment.number, base + end + 1, line.number + 1 if line else self.position.line
                    )
                    start = end + 1
                    if line is None:
                        continue
                    if self.since_time is not None and line.time < self.since_time:
                        self.skipped_by_time = True
                        continue
                    yield line, before, self.position
                base += start
                buffered = buffered[start:]
            # An unfinished record at the end is one the supervisor is writing: read it next time.

    def close(self) -> None:
        for segment in self.segments:
            segment.fh.close()


def encode_cursor(positions: dict[int, _Position]) -> str:
    return "c" + "_".join(f"{rank}-{p.segment}-{p.offset}-{p.line}" for rank, p in sorted(positions.items()))


def decode_cursor(cursor: str) -> dict[int, _Position]:
    """A cursor's positions per rank; ``ValueError`` naming the problem when it is not one."""
    if not cursor.startswith("c"):
        raise ValueError("not a log cursor (use the cursor a previous read returned)")
    positions = {}
    for part in filter(None, cursor[1:].split("_")):
        numbers = part.split("-")
        if len(numbers) != 4 or not all(n.isdigit() for n in numbers):
            raise ValueError(f"not a log cursor: {part!r} (use the cursor a previous read returned)")
        rank, segment, offset, line = (int(n) for n in numbers)
        positions[rank] = _Position(segment, offset, line)
    return positions


def read_logs(
    run_dir: Path,
    rank: int | None = None,
    since: str | float | None = None,
    *,
    limit: int = 1000,
    tail: int | None = None,
) -> LogPage:
    """A page of the run's logs: one rank's, or (``rank`` None) every rank's interleaved by time.

    ``since``: a cursor from an earlier page (continue exactly after its last line, per rank) or a unix
    time (lines read at or after it). ``limit``: at most this many lines; ``more`` says whether it cut
    the page short. ``tail``: the last ``tail`` lines of what ``since`` selects instead (``limit`` does
    not apply); its cursor is the end of every rank's log. ``dropped`` counts the lines that the cap
    took before the first line the page could start with, per rank. Pure file reads."""
    if limit < 1 or (tail is not None and tail < 0):
        raise ValueError("limit must be >= 1 and tail >= 0")
    positions = decode_cursor(since) if isinstance(since, str) else {}
    since_time = float(since) if isinstance(since, int | float) else None
    ranks = [rank] if rank is not None else sorted(set(log_ranks(run_dir)) | set(positions))
    readers = [_RankReader(_segments(rank_log(run_dir, r)), r, positions.get(r), since_time) for r in ranks]
    try:
        if tail is not None:
            return _tail_page(readers, tail)
        return _page(readers, limit)
    finally:
        for reader in readers:
            reader.close()


def _page(readers: list[_RankReader], limit: int) -> LogPage:
    iterators = {r.rank: iter(r) for r in readers}
    heads = {rank: head for rank, it in iterators.items() if (head := next(it, None)) is not None}
    taken: list[LogLine] = []
    while heads and len(taken) < limit:
        rank = min(heads, key=lambda k: (heads[k][0].time, k))
        taken.append(heads[rank][0])
        if (head := next(iterators[rank], None)) is None:
            del heads[rank]
        else:
            heads[rank] = head
    # A rank whose next line did not fit goes on from that line; the others from where their scan ended.
    cursor = {r.rank: heads[r.rank][1] if r.rank in heads else r.position for r in readers}
    return LogPage(tuple(taken), encode_cursor(cursor), _dropped(readers, taken), more=bool(heads))


def _tail_page(readers: list[_RankReader], count: int) -> LogPage:
    kept: list[LogLine] = []
    firsts: dict[int, int] = {}
    for reader in readers:
        window: deque[LogLine] = deque(maxlen=count)
        for line, _, _ in reader:
            firsts.setdefault(reader.rank, line.number)
            window.append(line)
        kept.extend(window)
    kept.sort(key=lambda line: (line.time, line.rank))
    taken = kept[len(kept) - count :] if count else []
    # The cap's losses matter only to a tail that reaches back to a rank's first line there is.
    reached = {line.rank for line in taken if firsts.get(line.rank) == line.number}
    dropped = {r: n for r, n in _dropped(readers, taken).items() if r in reached}
    return LogPage(tuple(taken), encode_cursor({r.rank: r.position for r in readers}), dropped)


def _dropped(readers: list[_RankReader], taken: list[LogLine]) -> dict[int, int]:
    # Lines skipped as older than ``since`` were older than what the cap dropped: nothing of interest was.
    return {r.rank: r.dropped for r in readers if r.dropped and not r.skipped_by_time}


def last_lines(path: Path, count: int = 15, stream: str | None = None, rank: int = -1) -> list[LogLine]:
    """The last ``count`` lines of one log (``stream`` "out" or "err" alone, or both), oldest first.

    For failure reasons: the newest segment is read first, the older one only when it is needed."""
    segments = _segments(path)
    found: list[LogLine] = []
    try:
        for segment in reversed(segments):
            window: deque[LogLine] = deque(maxlen=count)
            reader = _RankReader([segment], rank)
            window.extend(line for line, _, _ in reader if stream is None or line.stream == stream)
            found = [*window, *found][-count:] if count else []
            if len(found) >= count:
                break
    finally:
        for segment in segments:
            segment.fh.close()
    return found
