"""What each benchmark figure is held against: one place for the aims the tables show.

The benches measure, their tables print a figure next to its aim with ``ok`` or
a warning, and ``bench.all`` repeats them in the one summary table.
"""

AIM_HALVES_PER_S = 20_000
"""The checker's scan rate over a backlog of halves, on one half partition."""

AIM_RSS_MB = 300
"""The checker's peak resident memory while it walks the large backlog."""

AIM_COMMITS_PER_S = 20_000
"""Commits the relay publishes per second, on one half partition."""

AIM_VISIBLE_P99_MS = 50.0
"""Commit to visible on the real topic (read_committed), p99, with the relay running."""

AIM_CLIENT_US_RATIO = 2.2
"""A transactional send's client CPU over a plain send's: two acknowledged writes and
little more (the producer bench, at its most senders)."""
