"""The one way this project reads a file that a stranger may have planted in a sweep folder.

A sweep folder is shared: anything in it may be truncated, NUL-filled, a link, a FIFO, a device, huge,
nested a million deep, or a YAML alias bomb. Every reader of a run or sweep file goes through here, and
here a file is

- opened without following a link (O_NOFOLLOW) and without waiting for a writer (O_NONBLOCK), and read
  only if it is a regular file: a FIFO, a device or a folder at a file's name is refused, never read;
- read to a cap on its size (`CAPS`, checked against fstat before a byte is read, and again while
  reading), or line by line to a cap on a line, so memory stays bounded whatever is on the disk;
- parsed as strict JSON (no NaN or Infinity, integers within int64, nesting at most `MAX_DEPTH`), or as
  plain YAML: no tags, no anchors, no aliases, the same nesting limit.

A file that breaks a rule raises `Broken`, whose message is one line: the file and why. A missing file
raises FileNotFoundError, so a caller can tell "not written yet" from "damaged".
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
from functools import lru_cache
from pathlib import Path
from typing import Iterator

import orjson
import yaml

from . import safefs

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
MAX_DEPTH = 64  # the deepest a contract file nests is 4 (a snapshot's matrix in a row): 64 is generous
INT_MIN, INT_MAX = -(1 << 63), (1 << 63) - 1

_READ = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


class Broken(ValueError):
    """A file that breaks the contract (README, "Faults"): one line naming the file and the rule."""
    def __init__(self, path, why: str):
        self.path, self.why = str(path), why
        super().__init__(f"{path}: {why}")


def open_regular(path, what: str):
    """A binary file object for a regular file at `path`, never through a link, never blocking."""
    try:
        fd = safefs.open_file(path, _READ)  # in its folder's handle: no link on the way is followed
    except safefs.PlantedLink:
        raise Broken(path, f"{what} is reached through a symbolic link; it is not followed") from None
    except OSError as e:
        if e.errno == errno.ENOENT:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path)) from None
        if e.errno == errno.ELOOP:
            raise Broken(path, f"{what} is a symbolic link; it is not followed") from None
        raise Broken(path, f"{what} cannot be opened ({os.strerror(e.errno or 0) or e})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Broken(path, f"{what} is not a regular file ({_kind(st.st_mode)}); it is not read")
        fh = os.fdopen(fd, "rb", buffering=1 << 16)
    except BaseException:
        os.close(fd)
        raise
    return fh, st


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a file"


def read_bytes(path, cap: int, what: str | None = None) -> bytes:
    """A regular file's bytes, at most `cap` of them (Broken if it holds more: by its size, or as read)."""
    what = what or Path(path).name
    fh, st = open_regular(path, what)
    with fh:
        if st.st_size > cap:
            raise Broken(path, f"{what} is {st.st_size:,} bytes; its cap is {cap:,}")
        free = memory_available()
        if free is not None and st.st_size > free:  # a planted sparse file costs its finder no disk
            raise Broken(path, f"{what} is {st.st_size:,} bytes, more than this machine's free memory "
                               f"({free:,} bytes): not read")
        # as much as the file holds, plus one byte to see it grew: read(n) allocates n bytes first, and a
        # 256 MiB cap read that way costs 256 MiB for a 1 KB record
        want = min(cap, st.st_size) + 1
        raw = fh.read(want)
        if len(raw) == want and want <= cap:  # it grew since it was looked at: read on, to the cap
            raw += fh.read(cap + 1 - len(raw))
    if len(raw) > cap:
        raise Broken(path, f"{what} holds more than its cap of {cap:,} bytes")
    return raw


def memory_available() -> int | None:
    """The bytes this machine can still give a process (Linux's MemAvailable), None where it does not say: a
    file read whole that is larger could only end the reader, for lack of memory."""
    try:
        with open("/proc/meminfo", "rb") as fh:
            for line in fh:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def lines(path, line_cap: int, total_cap: int, what: str | None = None) -> Iterator[bytes]:
    """A regular file's lines (without their newline), each at most `line_cap` bytes, all at most `total_cap`:
    memory bounded by one line, whatever the file's size."""
    what = what or Path(path).name
    fh, st = open_regular(path, what)
    with fh:
        if st.st_size > total_cap:
            raise Broken(path, f"{what} is {st.st_size:,} bytes; its cap is {total_cap:,}")
        total, n = 0, 0
        while True:
            line = fh.readline(line_cap + 1)
            if not line:
                return
            n += 1
            total += len(line)
            if total > total_cap:
                raise Broken(path, f"{what} holds more than its cap of {total_cap:,} bytes")
            if len(line) > line_cap and not (len(line) == line_cap + 1 and line.endswith(b"\n")):
                raise Broken(path, f"{what}: line {n} is longer than its cap of {line_cap:,} bytes")
            yield line.rstrip(b"\n")


# ------------------------------------------------------------------------------------------ JSON
def json_value(raw: bytes, path, what: str | None = None):
    """Strict JSON: no NaN/Infinity (orjson refuses them, and numbers that overflow a double), integers within
    int64, nesting at most MAX_DEPTH (orjson stops at 1024 without recursing in Python; `bounded` at 64)."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise Broken(path, f"{what or Path(path).name} is not valid JSON ({_short(e)})") from None
    # orjson reads an integer beyond 64 bits as a float: ask the standard parser. The regex (~5 µs a history row)
    # runs only where the text has a run of 19 digits at all (every digit as 0, then a substring test: ~0.5 µs)
    if _NINETEEN in raw.translate(_DIGITS_AS_0) and _LONG_DIGITS.search(raw):
        _no_long_ints(raw, path, what)
    # What is left to check is the nesting: orjson's numbers are finite (it refuses NaN, Infinity and numbers
    # that overflow a double) and every integer of 19 digits or more was checked exactly above, so a text with
    # at most MAX_DEPTH brackets cannot break a rule, and is not walked (a history row is read at orjson's speed)
    if raw.count(b"[") + raw.count(b"{") > MAX_DEPTH:
        bounded(value, path, what)
    return value


# a run of 19 digits or more not inside a fraction or exponent (it may be inside a string: checked exactly):
# every integer outside int64 has 19 digits or more
_LONG_DIGITS = re.compile(rb"(?<![\d.eE+])\d{19,}")
_DIGITS_AS_0, _NINETEEN = bytes.maketrans(b"123456789", b"000000000"), b"0" * 19


def _no_long_ints(raw: bytes, path, what) -> None:
    """Broken if the JSON holds an integer outside int64 (the standard parser keeps its integers exact; the
    text already parsed with orjson, so its nesting is at most 1024)."""
    def parse_int(text: str) -> int:
        if len(text.lstrip("-")) > 19 or not INT_MIN <= int(text) <= INT_MAX:
            raise Broken(path, f"{what or Path(path).name} holds an integer outside int64 ({text[:24]}…)")
        return int(text)

    try:
        json.loads(raw, parse_int=parse_int)
    except RecursionError:
        raise Broken(path, f"{what or Path(path).name} nests deeper than {MAX_DEPTH} levels") from None


def read_json(path, cap: int, what: str | None = None):
    """A JSON file (read_bytes, then json_value)."""
    return json_value(read_bytes(path, cap, what), path, what)


def bounded(value, path, what: str | None = None) -> None:
    """Broken unless every number is finite and every integer within int64, and nesting is at most MAX_DEPTH.
    Iterative: a value nested deeper than Python's recursion limit is judged, not crashed on."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        t = type(v)
        if t is int:
            if not INT_MIN <= v <= INT_MAX:
                raise Broken(path, f"{what or Path(path).name} holds an integer outside int64 ({str(v)[:24]}…)")
        elif t is float:
            if v != v or v in (float("inf"), float("-inf")):
                raise Broken(path, f"{what or Path(path).name} holds a non-finite number")
        elif t is dict or t is list:
            if depth > MAX_DEPTH:
                raise Broken(path, f"{what or Path(path).name} nests deeper than {MAX_DEPTH} levels")
            items = v.values() if t is dict else v
            stack.extend((x, depth + 1) for x in items if type(x) in (dict, list, int, float))


# ------------------------------------------------------------------------------------------ YAML
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_SAFE = yaml.SafeLoader("")
# `<indent>- item` | `<indent>key:` | `<indent>key: value`
_LINE = re.compile(r"( *)(?:- (.*)|([A-Za-z_][\w.-]*):(?: (.*))?)\Z")


class NotPlain(Exception):
    """A line outside the plain block subset: PyYAML reads the file instead (after the event check)."""

def yaml_value(text: str, path, what: str | None = None):
    """Plain YAML, as `yaml.safe_load` reads it, refusing tags, anchors and aliases (an alias bomb expands
    a kilobyte into gigabytes) and nesting deeper than MAX_DEPTH. The configs this project writes are
    plain block YAML, read by a fast line reader (each distinct scalar typed by PyYAML's own resolver);
    anything else is first checked event by event, which builds nothing, then loaded."""
    what = what or Path(path).name
    try:
        value = block_yaml(text)
    except NotPlain:
        _check_events(text, path, what)
        try:
            value = yaml.load(text, Loader=_Loader)
        except yaml.YAMLError as e:
            raise Broken(path, f"{what} is not valid YAML ({_short(e)})") from None
    except RecursionError:
        raise Broken(path, f"{what} nests deeper than {MAX_DEPTH} levels") from None
    bounded(value, path, what)
    return value


def read_yaml(path, cap: int, what: str | None = None):
    """A YAML file (read_bytes as UTF-8, then yaml_value)."""
    raw = read_bytes(path, cap, what)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise Broken(path, f"{what or Path(path).name} is not UTF-8 text ({_short(e)})") from None
    return yaml_value(text, path, what)


def _check_events(text: str, path, what: str) -> None:
    depth = 0
    try:
        for ev in yaml.parse(text, Loader=_Loader):
            if isinstance(ev, yaml.AliasEvent) or getattr(ev, "anchor", None) is not None:
                raise Broken(path, f"{what} uses a YAML anchor or alias; the contract allows neither")
            tag = getattr(ev, "tag", None)
            implicit = getattr(ev, "implicit", True)
            if tag is not None and not (implicit is True or (isinstance(implicit, tuple) and any(implicit))):
                raise Broken(path, f"{what} uses a YAML tag ({tag[:40]}); the contract allows none")
            if isinstance(ev, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > MAX_DEPTH:
                    raise Broken(path, f"{what} nests deeper than {MAX_DEPTH} levels")
            elif isinstance(ev, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
    except yaml.YAMLError as e:
        raise Broken(path, f"{what} is not valid YAML ({_short(e)})") from None


def block_yaml(text: str):
    """The plain block subset of YAML this project writes (nested `key: value` mappings, `- item` lists,
    plain scalars), read line by line, ~3× faster than libyaml; NotPlain for any other line."""
    root: dict = {}
    stack: list = [(0, root)]    # open containers, innermost last, with their lines' indent
    pending = None               # (indent, dict, key) of a `key:` whose block may follow
    for line in text.splitlines():
        if not line.strip():
            continue
        m = _LINE.match(line)
        if not m:
            raise NotPlain(line)
        indent, item, key, value = len(m[1]), m[2], m[3], m[4]
        if pending:              # open the block of the last `key:`: a list or a mapping
            p_indent, parent, p_key = pending
            pending = None
            if item is not None and indent >= p_indent:   # lists may sit at the key's indent
                parent[p_key] = []
                stack.append((indent, parent[p_key]))
            elif indent > p_indent:
                parent[p_key] = {}
                stack.append((indent, parent[p_key]))
            if len(stack) > MAX_DEPTH + 1:
                raise NotPlain(line)  # the event check names the rule
        while stack[-1][0] > indent or (item is None and isinstance(stack[-1][1], list)
                                         and stack[-1][0] == indent):
            stack.pop()
        depth, box = stack[-1]
        if depth != indent or isinstance(box, list) != (item is not None):
            raise NotPlain(line)
        if item is not None:
            box.append(_scalar(item))
        elif value is None:      # null unless a block follows
            if key in box:
                raise NotPlain(line)  # a repeated key: PyYAML's own rule decides
            box[key] = None
            pending = (indent, box, key)
        else:
            if key in box:
                raise NotPlain(line)
            box[key] = _scalar(value)
    return root


def _scalar(v: str):
    if v == "[]":                # fresh containers: never shared through the cache
        return []
    if v == "{}":
        return {}
    return _plain(v)


@lru_cache(maxsize=1 << 16)
def _plain(v: str):
    if (v[:1] in "'\"[]{}&*!|>%@`#?,-:" and not (v[:1] == "-" and v[1:2].isdigit())) \
            or ": " in v or " #" in v or v.endswith(":") or v != v.strip():
        raise NotPlain(v)
    tag = _SAFE.resolve(yaml.ScalarNode, v, (True, False))
    return _SAFE.yaml_constructors[tag](_SAFE, yaml.ScalarNode(tag, v))


def _short(e: BaseException) -> str:
    return " ".join(str(e).split())[:160]


def digest(path, cap: int, what: str | None = None, line_cap: int | None = None,
           block: int = 1 << 20) -> bytes | None:
    """The BLAKE2b digest of a regular file's bytes, read in blocks (memory bounded), at most `cap` of them;
    None if there is no file. Broken for a link, a FIFO, a device or a file over its cap, and, for a file of
    lines (`line_cap`), at its first line longer than `lines` allows, with `lines`' words: what a reader of
    its lines stops at is where hashing stops too (a 2 GiB sparse file is 32 MiB of reading, not 2 GiB)."""
    what = what or Path(path).name
    try:
        fh, st = open_regular(path, what)
    except FileNotFoundError:
        return None
    h = hashlib.blake2b(digest_size=16)
    with fh:
        if st.st_size > cap:
            raise Broken(path, f"{what} is {st.st_size:,} bytes; its cap is {cap:,}")
        total, n, run = 0, 1, 0  # bytes read; the line being read (1-based) and its bytes so far
        while data := fh.read(block):
            if line_cap is not None:
                n, run = _line_ends(data, n, run, line_cap, total, cap, path, what)
            total += len(data)
            if total > cap:
                raise Broken(path, f"{what} holds more than its cap of {cap:,} bytes")
            h.update(data)
    return h.digest()


def _line_ends(block: bytes, n: int, run: int, line_cap: int, before: int, cap: int, path, what: str):
    """(line number, its bytes so far) after `block`; Broken at the first line over `line_cap`, unless the
    file's cap is passed first, as `lines` would say it (it reads line_cap + 1 bytes of that line)."""
    pos = 0
    while True:
        end = block.find(b"\n", pos)
        start = before + pos - run  # where the line began in the file
        run += (end if end >= 0 else len(block)) - pos
        if run > line_cap:
            if start + line_cap + 1 > cap:
                raise Broken(path, f"{what} holds more than its cap of {cap:,} bytes")
            raise Broken(path, f"{what}: line {n} is longer than its cap of {line_cap:,} bytes")
        if end < 0:
            return n, run
        n, run, pos = n + 1, 0, end + 1
