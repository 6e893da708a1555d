"""The process's memory allocator, set before any model loads so that timings see a server's steady state.

A decoder's caches grow as its batch fills and its rows' contexts lengthen. glibc hands freed memory
back to the system (a chunk past its mmap threshold at once, the heap's top past its trim threshold),
so a process growing its caches again pays first-touch page faults on every page anew. A server that
has run a while has its memory mapped; a benchmark process that just started has not. Worse, where
two decoders take turns in one process (plain decoding and a policy, side by side: the runner, a
load run), whichever grows its caches second pays for mapping the memory the first already holds: on
the long pair at B = 8 (12 long-code prompts) each of the 6th to 8th joins of the second cache took
0.25-0.4 s more than the first's, about 1 s a run charged to one side, which side depending on which
stepped first (so fixed γ = 2 and 6 read 11-25 % below replay and γ = 4 at it, alternating with the
runner's order). Keeping freed memory mapped makes the warm-up's growth the only one paid.
"""

from __future__ import annotations

import ctypes
import ctypes.util

# mallopt's parameters (malloc.h) and their values: the heap's top never trimmed (-1, mallopt(3): a
# top kept up to 2 GiB was still trimmed after two long-pair caches of 0.8 GB and their copies), and
# every allocation under 32 MiB (glibc's largest mmap threshold on 64-bit) served from the heap,
# where freed memory stays mapped.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
NEVER_TRIM, LARGEST_MMAP_THRESHOLD = -1, 32 * 1024 * 1024


def glibc():
    """The C library, where it is glibc (it has mallopt); else None (macOS, musl)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "mallopt") else None


def keep_freed_memory() -> bool:
    """Keep what the process frees mapped for its next allocation (glibc's mallopt); False where the
    C library is not glibc, whose allocator is left as it is."""
    libc = glibc()
    if libc is None:
        return False
    return bool(libc.mallopt(M_TRIM_THRESHOLD, NEVER_TRIM)) and bool(libc.mallopt(M_MMAP_THRESHOLD,
                                                                                LARGEST_MMAP_THRESHOLD))
