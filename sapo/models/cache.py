"""sapo's on-disk cache of built models and tokenizers, and how entries are created safely.

Root: ``$SAPO_CACHE_DIR``, else ``sapo-swarm`` in the user's cache directory as `platformdirs` finds it:
``$XDG_CACHE_HOME/sapo-swarm`` when that is set (the images point it at a writable volume, since their
HOME is read-only), ``~/.cache/sapo-swarm`` otherwise on Linux. Entries are built in a temporary sibling
directory and renamed into place, under an advisory file lock, so several processes doing their first
load at once build the entry once and never observe a half-written directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import platformdirs

log = logging.getLogger(__name__)

CACHE_ENV = "SAPO_CACHE_DIR"
APP_NAME = "sapo-swarm"


def cache_root() -> Path:
    """Root of sapo's on-disk cache: ``$SAPO_CACHE_DIR``, else the user cache directory's ``sapo-swarm``
    (``$XDG_CACHE_HOME`` honoured); see the module docstring."""
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path(platformdirs.user_cache_dir(APP_NAME, appauthor=False))


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Exclusive advisory lock (flock) held for the duration of the block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def materialize_dir(final: Path, build: Callable[[Path], None]) -> Path:
    """Return ``final``, first creating it with ``build(tmp_dir)`` if it does not exist yet.

    ``build`` writes into a fresh temporary sibling directory which is then renamed to ``final``, so a
    crash never leaves a partial entry. The flock makes concurrent first callers wait for one build
    instead of repeating it; if the lock is not honoured (some network filesystems) the rename race is
    still safe: renaming onto an existing non-empty directory fails and the loser discards its copy.
    """
    if final.is_dir():
        return final
    with _file_lock(final.with_name(final.name + ".lock")):
        if final.is_dir():
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
        try:
            build(tmp)
            tmp.chmod(0o755)  # mkdtemp makes it owner-only; the cache may be shared by several users
            os.rename(tmp, final)
        except OSError:
            if not final.is_dir():
                raise
            log.info("another process created %s first; using its copy", final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final
