"""Files at the edges: small text inputs read with bounds, outputs written safely.

`read_small_text` reads a user's text input (a job, a layer table): it must exist, be under a size
bound and be UTF-8, and each error names the file.

Writing output files safely: atomically, never onto an input, never through a symlink.

Every file a command writes (`--trace`, `--out`, `--plot`) goes through `write_output`: the bytes
land in a temporary file beside the target and replace it in one rename (a reader never sees half
a file, an interrupted write leaves the old one), and the target may not be one of the command's
inputs, a directory, a symlink, or in a directory that does not exist.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from itercast.errors import ConfigError


def read_small_text(path: Path, what: str, max_bytes: int) -> str:
    """The text of a small input file; `what` names it in errors ("job file", "layer-times file")."""
    if path.is_dir():
        raise ConfigError(f"{path}: a directory; expected a {what}")
    if not path.is_file():
        raise ConfigError(f"{path}: no such {what}")
    size = path.stat().st_size
    if size > max_bytes:
        raise ConfigError(f"{path}: {what} of {size} bytes; expected < {max_bytes}")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def read_json_file(path: Path, what: str, max_bytes: int) -> Any:
    """A small JSON input file parsed (read_small_text's checks); malformed or too deeply nested JSON is
    a ConfigError naming the file, not a traceback."""
    text = read_small_text(path, what, max_bytes)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    except RecursionError:
        raise ConfigError(f"{path}: {what} nested too deeply to be one") from None


def check_output(path: str | Path, inputs: Iterable[str | Path | None] = (), suffixes: tuple[str, ...] = ()) -> Path:
    """An output path a command may write: not a symbolic link or a directory, in a directory that
    exists, not one of the command's `inputs` (files, or directories whose files it reads: an
    existing file inside one is refused too), and ending in one of `suffixes` where given (an HTML report
    written over a job.yaml, a PNG into cdf.txt); a ConfigError naming the path otherwise."""
    path = Path(path)
    if path.is_symlink():
        raise ConfigError(f"{path}: is a symbolic link; give the real path to write")
    if path.is_dir():
        raise ConfigError(f"{path}: is a directory; expected a file name")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise ConfigError(f"{path}: directory {parent} does not exist")
    for source in inputs:
        if source is None or not path.exists() or not Path(source).exists():
            continue
        if path.samefile(source):
            raise ConfigError(f"{path}: is an input of this command; write the output elsewhere")
        if Path(source).is_dir() and path.resolve().is_relative_to(Path(source).resolve()):
            raise ConfigError(f"{path}: is a file of {source}, an input of this command; write the output elsewhere")
    if suffixes and path.suffix.lower() not in suffixes:
        raise ConfigError(
            f"{path}: expected a file name ending in {' or '.join(suffixes)}; got {path.suffix or 'none'}"
        )
    return path


def write_output(
    path: str | Path, data: bytes | str, inputs: Iterable[str | Path | None] = (), suffixes: tuple[str, ...] = ()
) -> Path:
    """Write `data` to `path` atomically after check_output; the error names the path."""
    path = check_output(path, inputs, suffixes)
    parent = path.parent if str(path.parent) else Path(".")
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=parent)
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; a written file gets the usual mode
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
