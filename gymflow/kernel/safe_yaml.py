"""YAML written by a user, read without letting it cost more than its size.

PyYAML's safe loader builds an alias as a shared reference, so a "billion laughs" file of 1 kB loads fast and
then explodes in whatever walks it (interpolation, validation: 771 MB and counting for `gymflow report`).
This loader refuses aliases outright (a config has no need for them), bounds the nesting depth and the file
size, refuses duplicate keys (the second silently won), and names the file, line and column of each problem.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode
from yaml.resolver import Resolver

from gymflow.kernel.errors import ConfigError

MAX_YAML_BYTES = 1 << 20  # a real config is a few kB; this bounds the parse to about a second
MAX_YAML_DEPTH = 64  # far below Python's recursion limit in the composer and in every walk after it

_MERGE_TAG = "tag:yaml.org,2002:merge"


class YAMLFileError(ConfigError):
    """A YAML file that is too big, malformed, or uses what this loader refuses; the message says where."""


def _where(mark: Any) -> str:
    """`file, line L, column C` from a `yaml.Mark` (pure-Python or libyaml's)."""
    if mark is None:
        return "<yaml>"
    return f"{mark.name}, line {mark.line + 1}, column {mark.column + 1}"


class _Checks:
    """The refusals, mixed in ahead of PyYAML's Composer and SafeConstructor."""

    _depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise YAMLFileError(f"{_where(event.start_mark)}: YAML aliases (*{event.anchor}) are not allowed; "
                                "write the value out")
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                mark = self.peek_event().start_mark
                raise YAMLFileError(f"{_where(mark)}: nested deeper than {MAX_YAML_DEPTH} levels")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_object(self, node: Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except ValueError as e:  # int('9' * 5000), a 30 February: Python's errors carry no position
            raise YAMLFileError(f"{_where(node.start_mark)}: {e}") from None

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[tuple[str, str]] = set()
        for key, _ in node.value:
            if isinstance(key, ScalarNode) and key.tag != _MERGE_TAG:
                if (key.tag, key.value) in seen:
                    raise YAMLFileError(f"{_where(key.start_mark)}: duplicate key {key.value[:100]!r}")
                seen.add((key.tag, key.value))
        return super().construct_mapping(node, deep)


class _PyLoader(_Checks, yaml.SafeLoader):
    pass


if yaml.__with_libyaml__:
    from yaml._yaml import CParser

    class _CLoader(_Checks, Composer, CParser, SafeConstructor, Resolver):
        """libyaml scans and parses (4x faster on a big file); PyYAML's Composer builds the nodes, so the
        checks above see every alias and every level."""

        def __init__(self, stream: Any) -> None:
            CParser.__init__(self, stream)
            Composer.__init__(self)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)

    _Loader: type = _CLoader
else:  # pragma: no cover - PyYAML built without libyaml
    _Loader = _PyLoader


def _line_column(stream: io.IOBase, offset: int, *, chars: bool) -> str:
    """`line L, column C` of a reader error's offset, which counts characters of the decoded text (PyYAML's
    printable check) or bytes of UTF-8 (a decoding error, and every libyaml one)."""
    data = stream.getvalue() if isinstance(stream, (io.BytesIO, io.StringIO)) else None
    if data is None:
        return f"position {offset}"
    if chars:
        text = data if isinstance(data, str) else data.decode("utf-8", "replace")
        head = text[:offset]
    else:
        raw = data if isinstance(data, bytes) else data.encode("utf-8", "surrogatepass")
        head = raw[:offset].decode("utf-8", "replace")
    return f"line {head.count(chr(10)) + 1}, column {len(head) - head.rfind(chr(10))}"


def _load(stream: io.IOBase, loader: type) -> Any:
    ldr = None
    try:
        ldr = loader(stream)  # the pure-Python reader already decodes (and may refuse) the first characters
        return ldr.get_single_data()
    except yaml.MarkedYAMLError as e:
        what = f"{e.context}: {e.problem}" if e.context else e.problem
        raise YAMLFileError(f"{_where(e.problem_mark or e.context_mark)}: not valid YAML ({what})") from None
    except yaml.reader.ReaderError as e:  # bad encoding or a control character: an offset, no line
        char = f"character #x{e.character:04x}: " if isinstance(e.character, int) and e.character >= 0 else ""
        where = _line_column(stream, e.position, chars=e.encoding == "unicode")
        raise YAMLFileError(f"{e.name}, {where}: not valid YAML ({char}{e.reason})") from None
    except yaml.YAMLError as e:
        raise YAMLFileError(f"{getattr(stream, 'name', '<yaml>')}: not valid YAML ({e})") from None
    finally:
        if ldr is not None:
            ldr.dispose()


def loads(text: str | bytes, name: str = "<yaml>", *, loader: type | None = None) -> Any:
    """Parse one YAML document; `name` is what errors call it (the file)."""
    stream: io.IOBase = io.BytesIO(text) if isinstance(text, bytes) else io.StringIO(text)
    stream.name = name  # both parsers put the stream's name in their marks
    return _load(stream, loader or _Loader)


def load_file(path: str | Path, *, max_bytes: int = MAX_YAML_BYTES) -> Any:
    """Read and parse the YAML file at `path`, refusing one over `max_bytes` before parsing any of it."""
    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)  # never more than the limit in memory, whatever the file is
    except OSError as e:
        raise YAMLFileError(f"{path}: cannot read: {e.strerror or e}") from None
    if len(data) > max_bytes:
        raise YAMLFileError(f"{path}: larger than {max_bytes:,} bytes, the limit for a YAML file")
    return loads(data, str(path))
