"""clusterddp.sizes: the one byte formatter, in the forms its callers print (upload and prune, check's disk
line, top's table, check --collective's message sizes)."""

from __future__ import annotations

from clusterddp.check import human_bytes
from clusterddp.collective import size_text
from clusterddp.sizes import human_size


def test_long_short_and_whole_forms():
    assert [human_size(n) for n in (0, 1, 1023, 1024, 5107, 8000, 3 << 29, 2 << 40, 5 << 50)] == [
        "0 B", "1 B", "1023 B", "1.0 KiB", "5.0 KiB", "7.8 KiB", "1.5 GiB", "2.0 TiB", "5120.0 TiB"]
    short = [human_size(n, short=True) for n in (100, 1536, 512 << 20, 500 << 30)]
    assert short == ["100B", "1.5K", "512.0M", "500.0G"]
    assert [human_size(n, digits=0) for n in (1, 1024, 64 << 10, 16 << 20)] == ["1 B", "1 KiB", "64 KiB", "16 MiB"]


def test_the_callers_print_through_it():
    assert human_bytes(512 << 20) == "512.0M" and size_text(64 << 20) == "64 MiB"
