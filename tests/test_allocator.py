"""The process's allocator (harness/allocator.py): memory a decode frees stays mapped for its next growth."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from dspark_bench.harness.allocator import glibc

# Six 16 MiB blocks made, freed and made again, counting the page faults of the second making (in a
# process of its own: the test process's allocator is whatever earlier tests left it).
SCRIPT = textwrap.dedent("""
    import resource, sys
    import numpy as np
    from dspark_bench.harness.allocator import keep_freed_memory
    if sys.argv[1] == "keep":
        assert keep_freed_memory()
    blocks = [np.ones(4 * 1024 * 1024, dtype=np.float32) for _ in range(6)]
    del blocks
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    blocks = [np.ones(4 * 1024 * 1024, dtype=np.float32) for _ in range(6)]
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
""")


def faults(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, check=True)
    return int(done.stdout.strip())


@pytest.mark.skipif(glibc() is None, reason="glibc's mallopt only")
def test_memory_made_again_is_not_faulted_in_again():
    pages = 6 * 16 * 1024 * 1024 // 4096
    kept = faults("keep")
    assert kept < pages // 100  # every page was still mapped
    assert faults("default") > 10 * max(kept, 10)  # glibc's own thresholds hand some of it back
