"""Low-level reading helpers shared by the format modules: UTF-8 lines with line numbers, JSON with
positions, field checks that raise one `DataError` naming file, line/record and field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

from dpr.errors import DataError


def iter_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """Yield ``(line_number, line)`` (1-based, without the line ending; CRLF accepted).

    The file is read as bytes and decoded line by line so a non-UTF-8 byte is reported with its line
    (text mode would only say "position N" of some internal buffer).
    """
    path = Path(path)
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise DataError(path, f"not UTF-8 (byte {raw[err.start]:#04x} at column {err.start + 1})", line=lineno) from None
            if line.endswith("\n"):
                line = line[:-1]
            if line.endswith("\r"):
                line = line[:-1]
            if lineno == 1 and line.startswith("\ufeff"):  # a BOM from Windows editors is not data
                line = line[1:]
            yield lineno, line


def load_json_file(path: str | Path) -> Any:
    """Parse a whole JSON file; bad bytes and broken JSON become a `DataError` with the line."""
    path = Path(path)
    data = path.read_bytes()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise DataError(path, f"not UTF-8 (byte {data[err.start]:#04x})", line=line) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise DataError(path, f"broken JSON: {err.msg} (column {err.colno})", line=err.lineno) from None
    except RecursionError:
        raise DataError(path, "JSON nested too deeply") from None


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, dict]]:
    """Yield ``(line_number, object)`` for each non-blank line of a JSON-lines file."""
    for lineno, line in iter_lines(path):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataError(path, f"broken JSON: {err.msg} (column {err.colno})", line=lineno) from None
        except RecursionError:
            raise DataError(path, "JSON nested too deeply", line=lineno) from None
        if not isinstance(obj, dict):
            raise DataError(path, f"expected a JSON object, got {type(obj).__name__}", line=lineno)
        yield lineno, obj


def expect_list(path: str | Path, obj: Any, where: str | None = None, field: str | None = None) -> list:
    if not isinstance(obj, list):
        raise DataError(path, f"expected a JSON list, got {type(obj).__name__}", line=where, field=field)
    return obj


def get_str(
    path: str | Path,
    obj: dict,
    key: str,
    where: int | str | None,
    *,
    nonempty: bool = True,
    required: bool = True,
    default: str = "",
    field: str | None = None,
) -> str:
    """``obj[key]`` checked to be a string (non-blank unless ``nonempty=False``)."""
    name = field or key
    if not isinstance(obj, dict):
        raise DataError(path, f"expected a JSON object, got {type(obj).__name__}", line=where, field=name)
    if key not in obj:
        if not required:
            return default
        raise DataError(path, "missing", line=where, field=name)
    value = obj[key]
    if not isinstance(value, str):
        raise DataError(path, f"expected a string, got {type(value).__name__}", line=where, field=name)
    if nonempty and not value.strip():
        raise DataError(path, "empty", line=where, field=name)
    return value


def get_id(path: str | Path, obj: dict, key: str, where: int | str | None, field: str | None = None) -> str:
    """An identifier: a non-empty string; a JSON integer is accepted and turned into its decimal string
    (some published files store numeric passage ids as numbers)."""
    name = field or key
    if isinstance(obj, dict) and isinstance(obj.get(key), int) and not isinstance(obj.get(key), bool):
        return str(obj[key])
    value = get_str(path, obj, key, where, field=name)
    if any(c in value for c in "\t\n\r"):
        raise DataError(path, "identifier contains a tab or line break", line=where, field=name)
    return value


def get_str_list(
    path: str | Path, obj: dict, key: str, where: int | str | None, *, nonempty: bool = False, field: str | None = None
) -> list[str]:
    """``obj[key]`` checked to be a list of non-blank strings (and non-empty if ``nonempty``)."""
    name = field or key
    if key not in obj:
        raise DataError(path, "missing", line=where, field=name)
    value = obj[key]
    if not isinstance(value, list):
        raise DataError(path, f"expected a list of strings, got {type(value).__name__}", line=where, field=name)
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise DataError(path, f"item {i} is {type(item).__name__}, expected a string", line=where, field=name)
        if not item.strip():
            raise DataError(path, f"item {i} is empty", line=where, field=name)
    if nonempty and not value:
        raise DataError(path, "empty list", line=where, field=name)
    return value


def record(i: int) -> str:
    """Position of the i-th (0-based, like the JSON index) element of a top-level JSON list."""
    return f"record {i}"


def get_list(path: str | Path, obj: dict, key: str, where: int | str | None, field: str | None = None) -> list:
    """``obj[key]`` checked to be present and a list."""
    name = field or key
    if not isinstance(obj, dict):
        raise DataError(path, f"expected a JSON object, got {type(obj).__name__}", line=where, field=name)
    if key not in obj:
        raise DataError(path, "missing", line=where, field=name)
    return expect_list(path, obj[key], where, field=name)


_JSON_WS = " \t\r\n"
_JSON_END = _JSON_WS + ",]"


def iter_json_array(path: str | Path, block: int = 1 << 22) -> Iterator[tuple[int, Any]]:
    """Yield ``(index, element)`` of a file holding one top-level JSON list, without holding the whole list.

    DPR's biencoder training files are one JSON list of several GB; `load_json_file` would hold the text and
    every parsed example at once. Here only the current element (and a read block) is in memory. Errors are a
    `DataError` naming the record (0-based, as `record` writes it).
    """
    path = Path(path)
    decoder = json.JSONDecoder()
    with open(path, encoding="utf-8-sig", newline="") as f:
        buf, pos, eof, i = "", 0, False, 0

        def more() -> bool:
            nonlocal buf, pos, eof
            try:
                chunk = f.read(block)
            except UnicodeDecodeError:
                raise DataError(path, "not UTF-8", line=record(i)) from None
            buf, pos = buf[pos:] + chunk, 0
            eof = not chunk
            return bool(chunk)

        def skip_ws() -> str:
            nonlocal pos
            while True:
                while pos < len(buf) and buf[pos] in _JSON_WS:
                    pos += 1
                if pos < len(buf) or not more():
                    return buf[pos] if pos < len(buf) else ""

        if skip_ws() != "[":
            raise DataError(path, "expected a JSON list", line=1)
        pos += 1
        if skip_ws() == "]":
            return
        while True:
            skip_ws()  # raw_decode does not skip leading whitespace
            while True:
                try:
                    obj, end = decoder.raw_decode(buf, pos)
                    # a number cut at the block's end ("0" of "0.5") parses short: read on until a delimiter follows
                    if eof or (end < len(buf) and buf[end] in _JSON_END):
                        break
                except json.JSONDecodeError as err:
                    if eof:
                        raise DataError(path, f"broken JSON: {err.msg}", line=record(i)) from None
                except RecursionError:
                    raise DataError(path, "JSON nested too deeply", line=record(i)) from None
                more()
            pos = end
            yield i, obj
            i += 1
            sep = skip_ws()
            if sep == "]":
                pos += 1
                if skip_ws():
                    raise DataError(path, "text after the closing ']'", line=record(i - 1))
                return
            if sep != ",":
                raise DataError(path, f"expected ',' or ']' after the element, got {sep[:1]!r}" if sep
                                else "the list is not closed (file cut short?)", line=record(i - 1))
            pos += 1
