"""``python -m commtag.merge`` under torchrun, the way users run the merge on several workers;
code run only in the workers a ``-j`` merge starts; Ctrl-C as at a terminal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Optional

import commtag
from commtag.testing.bench import free_port

#: The folder of commtag's own code, wherever the clone is and whatever it is named (a clone named
#: ``commtag`` holds the venv's files under ``.../commtag/`` too).
_PACKAGE = Path(commtag.__file__).resolve().parent


def traceback_in_commtag(stderr: str) -> bool:
    """Whether ``stderr`` shows a traceback frame in commtag's own code (torchrun's own may be there)."""
    return f'File "{_PACKAGE}{os.sep}' in stderr or f'File "{Path(commtag.__file__).parent}{os.sep}' in stderr


def torchrun_command(args: list[str], workers: int = 2,
                     env: Optional[dict[str, str]] = None) -> tuple[list[str], dict[str, str]]:
    """The command line and environment that run the merge CLI with ``workers`` torchrun workers."""
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", **(env or {})}
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={workers}", "--master-addr=127.0.0.1",
           f"--master-port={free_port()}", "-m", "commtag.merge", *args]
    return cmd, env


def torchrun_merge(args: list[str], workers: int = 2, env: Optional[dict[str, str]] = None) -> subprocess.CompletedProcess:
    """Run the merge CLI with ``workers`` torchrun workers on this host; its result, never raising on failure."""
    cmd, env = torchrun_command(args, workers, env)
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


def in_started_workers(tmp_path: Path, code: str) -> str:
    """A PYTHONPATH under which ``code`` runs at start in the workers a -j merge starts
    (``python -c``) and nowhere else: a sitecustomize that checks how it was started."""
    inject = tmp_path / "inject"
    inject.mkdir()
    body = "".join(f"    {line}\n" for line in code.splitlines())
    (inject / "sitecustomize.py").write_text(f"import sys\nif sys.argv[:1] == ['-c']:\n{body}")
    return os.pathsep.join(filter(None, [str(inject), os.environ.get("PYTHONPATH")]))


def ctrl_c_as_at_a_terminal() -> None:
    """``preexec_fn`` of a merge a test stops with SIGINT: a terminal's Ctrl-C reaches it even where
    the tests run as a background job, which starts every process with SIGINT ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
