"""The forkserver's first preload: make the forkserver die with the study process.

Importing this module has an effect only inside multiprocessing's forkserver, during its preload
(``multiprocessing.forkserver.main`` is on the stack): it asks for SIGKILL when the study
process goes, and exits at once if the study (whose pid :func:`tuner._lifeline.start_forkserver`
leaves in the forkserver's environment) went before the forkserver got this far. Anywhere else
the import does nothing, so a stray import ties no process to its parent.

It sits at the top of ``tuner`` and imports only :mod:`tuner._lifeline` (standard library), so
it runs a fraction of a second after the forkserver starts; importing ``tuner.trial`` already
imports torch. The preload imports torch and ``torch._dynamo`` next (seconds), and the
forkserver's own loop, which exits once its "alive" pipe closes, does not run until they are
done; nor is that pipe a sign of life, since the study's first request, queued on the
forkserver's socket, holds a copy of its write end. Without this, a study killed in its first
seconds left the forkserver importing on, and then serving that queued request.
"""

from __future__ import annotations

import os
import sys

from tuner._lifeline import STUDY_PID_ENV, die_with_parent

__all__: list[str] = []


def _in_forkserver_preload() -> bool:
    from multiprocessing import forkserver

    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is forkserver.main.__code__:
            return True
        frame = frame.f_back
    return False


def _tie_forkserver_to_study() -> None:
    if not _in_forkserver_preload():
        return
    study_pid = os.environ.pop(STUDY_PID_ENV, "")  # the trial children need not see it
    die_with_parent(int(study_pid) if study_pid.isdigit() else None)


_tie_forkserver_to_study()
