"""Which frame of a stack is the user's code: where an exception was raised, or where a stalled
worker is, as the report and the status answer name it (`file:line in function`).

The user's code is every frame whose file is neither the Python library (its standard library,
any `site-packages` or `dist-packages` directory), nor this launcher's package, nor code without
a source file (`<string>`, `<frozen runpy>`); the script or module run as `__main__` is the
user's wherever it lies (`python -m` of a package installed into site-packages). The place is
the innermost such frame (the line of the user's code that called into json, torch or the
standard library), else the innermost frame of all.

Imports only the standard library, like every module of the launcher.
"""

from __future__ import annotations

import os
import re
import sysconfig
import types
from collections.abc import Sequence
from dataclasses import dataclass

from .contract import LOCATION_LIMIT

# Directories of installed packages, wherever an interpreter keeps them (a venv, conda, the
# distribution's /usr/lib/python3/dist-packages, which sysconfig does not name).
_PACKAGE_DIRS = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")
# This launcher's package (a directory in a checkout, `<archive>/torchrun_launcher/` in a pod).
_OWN = os.path.dirname(os.path.abspath(__file__)) + os.sep


@dataclass(frozen=True)
class Frame:
    """One frame: its file, line and function (None: a SyntaxError's place, which is in no
    function); `main`: it runs in the `__main__` module (known from a live traceback only)."""

    file: str
    line: int
    function: str | None
    main: bool = False


def library_dirs() -> tuple[str, ...]:
    """This interpreter's library directories (standard library and packages), each ending
    in a separator."""
    paths = sysconfig.get_paths()
    dirs = {paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    return tuple(sorted(d.rstrip(os.sep) + os.sep for d in dirs if d))


def is_users(frame: Frame, libs: Sequence[str]) -> bool:
    """Whether `frame` is the user's code (see the module's docstring)."""
    path = frame.file
    if not path or path.startswith("<"):
        return False
    if frame.main:
        return True
    if path.startswith(tuple(libs)) or any(d in path for d in _PACKAGE_DIRS):
        return False
    return not os.path.abspath(path).startswith(_OWN)


def users_frame(frames: Sequence[Frame], libs: Sequence[str] | None = None) -> Frame | None:
    """The innermost frame of `frames` (outermost first) that is the user's code, else the
    innermost frame; None when there are none."""
    if not frames:
        return None
    dirs = library_dirs() if libs is None else libs
    return next((f for f in reversed(frames) if is_users(f, dirs)), frames[-1])


def describe(frame: Frame) -> str:
    """`file:line in function` (`file:line` for a SyntaxError's place), at most
    LOCATION_LIMIT characters (the end kept: the file's name, line and function), characters
    that do not print (a line break in a file's name) shown as `?`."""
    text = f"{frame.file}:{frame.line}" + (f" in {frame.function}" if frame.function else "")
    return bound(text)


def bound(location: str) -> str:
    """`location` as the report carries it: printable, at most LOCATION_LIMIT characters."""
    text = "".join(c if c.isprintable() else "?" for c in location)
    return text if len(text) <= LOCATION_LIMIT else "…" + text[-(LOCATION_LIMIT - 1) :]


def traceback_frames(tb: types.TracebackType | None) -> list[Frame]:
    """The frames of a live traceback, outermost first."""
    out = []
    while tb is not None:
        code = tb.tb_frame.f_code
        main = tb.tb_frame.f_globals.get("__name__") == "__main__"
        out.append(Frame(code.co_filename, tb.tb_lineno, code.co_name, main))
        tb = tb.tb_next
    return out


def raised_at(e: BaseException, libs: Sequence[str] | None = None) -> str | None:
    """Where the user's code raised `e`: the innermost frame of the user's code in its
    traceback; for a SyntaxError in the user's code (the script itself, a module it imports),
    the bad line."""
    dirs = library_dirs() if libs is None else libs
    if isinstance(e, SyntaxError) and e.filename and e.lineno:
        place = Frame(e.filename, e.lineno, None)
        if is_users(place, dirs):
            return describe(place)
    frame = users_frame(traceback_frames(e.__traceback__), dirs)
    return describe(frame) if frame else None


_HEADER = re.compile(r"^[ |+-]*(?:Exception Group )?Traceback \(most recent call last\):$")
_FRAME_LINE = re.compile(r'^[ |]*File "(?P<file>.*)", line (?P<line>\d+)(?:, in (?P<func>.+))?$')


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" |"))


def text_frames(text: str) -> list[Frame]:
    """The frames of the last traceback in a formatted traceback (`traceback.format_exc()`,
    the error file's `py_callstack`): with chained exceptions, the one raised last. Only the
    `File` lines right below its header count, with their source and caret lines (indented
    further); the exception's own text below them is never read as frames."""
    lines = text.splitlines()
    start = next((i for i in range(len(lines) - 1, -1, -1) if _HEADER.match(lines[i])), None)
    if start is None:
        return []
    out: list[Frame] = []
    indent: int | None = None
    for line in lines[start + 1 :]:
        m = _FRAME_LINE.match(line)
        if m:
            indent = _indent(line)
            out.append(Frame(m.group("file"), int(m.group("line")), m.group("func")))
            continue
        # A frame's source line and carets sit deeper than its File line, a recursion's
        # "[Previous line repeated N more times]" beside it; anything else ends the frames.
        repeated = line.lstrip(" |").startswith("[Previous line repeated")
        if indent is None or (_indent(line) <= indent and not repeated):
            break
    return out
