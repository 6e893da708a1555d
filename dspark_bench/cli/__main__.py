"""`python -m dspark_bench.cli`: the same app (sweep workers start this way)."""

from dspark_bench.cli import main

main()
