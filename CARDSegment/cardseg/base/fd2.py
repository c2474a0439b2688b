"""File descriptor 2 (the process's stderr) is one for all threads: whoever points it elsewhere for
a while (to mute or catch what native libraries print there) holds :data:`FD2_LOCK` meanwhile.

``cardseg batch`` reads the next case and writes the last one in threads
(:mod:`cardseg.cohort.pipeline`); the reader mutes fd 2 (:mod:`cardseg.io.inputs`) and the writer
catches it (:mod:`cardseg.io.written`). Two such redirections that overlap restore each other's
saved descriptor in the wrong order and leave stderr on ``/dev/null`` for the rest of the run."""

import threading

#: held for the whole time fd 2 points elsewhere (re-entrant: a nested redirection in one thread)
FD2_LOCK = threading.RLock()
