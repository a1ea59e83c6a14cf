"""The runtime wing: what runs inside the training process.

One folder per stage, each importing only those before it: ``describe/`` (what a
call is: its group, fields and annotation), ``capture/`` (CUDA graphs while they
are captured), ``record/`` (what the profiled window keeps, and its sidecar) and
``install/`` (what commtag puts into torch: the wrappers, c10d's hooks,
install/uninstall). :mod:`commtag.runtime.failopen` is under all of them.
"""
