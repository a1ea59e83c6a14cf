"""commtag lets go of a destroyed world's groups, so torch frees them when the job does.

A group commtag kept past ``destroy_process_group`` was freed at the interpreter's teardown, where
its gloo threads could abort the process ("terminate called without an active exception", exit 134;
about one exit in six of a one-rank gloo job on torch 2.13 and 2.15). Each case is a real one-rank
gloo process that watches its default group through a weak reference: freed at ``destroy_process_group``
while commtag is installed, and, where commtag was uninstalled first, by commtag's exit handler, which
runs before the teardown (the case's own exit handler, registered before commtag's, runs after it).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow

_CASE = textwrap.dedent("""
    import atexit, gc, os, sys, weakref
    import torch, torch.distributed as dist
    watched = []
    atexit.register(lambda: print("at exit:", "freed" if watched[0]() is None else "alive", flush=True))
    import commtag
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2])
    dist.init_process_group("gloo", rank=0, world_size=1)
    commtag.install()
    pair = dist.new_group([0])
    for group in (None, pair):
        dist.all_reduce(torch.ones(4), group=group)
    watched.append(weakref.ref(dist.group.WORLD))
    del pair
    if sys.argv[1] == "uninstalled":
        commtag.uninstall()
    dist.destroy_process_group()
    gc.collect()
    print("after destroy:", "freed" if watched[0]() is None else "alive", flush=True)
    print("groups known:", len(commtag.runtime.describe.groups.known_groups()), flush=True)
""")


def _run(mode: str, port: int) -> list[str]:
    done = subprocess.run([sys.executable, "-c", _CASE, mode, str(port)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and "terminate called" not in done.stderr, done.stderr[-2000:]
    return [line for line in done.stdout.splitlines() if line]


def test_a_destroyed_world_is_freed_at_its_destroy_while_installed() -> None:
    assert _run("installed", 29881) == ["after destroy: freed", "groups known: 2", "at exit: freed"]


def test_a_world_destroyed_after_uninstall_is_freed_before_the_interpreters_teardown() -> None:
    assert _run("uninstalled", 29882) == ["after destroy: alive", "groups known: 2", "at exit: freed"]
