"""Property-based: the checkpoint mirror's index (``<run>/mirror.json``, read back by ``read_index`` before
an attempt is seeded, and by ``up --resume``) and its chooser (``ranked``/``choose``, over the paths,
sizes and times a node lists). An index as the mirror writes it reads back equal; an edited or damaged
one (any JSON value in any field, huge numbers, nesting, invalid UTF-8) gives checked entries or a
MirrorError naming the file; the chooser never raises on any listing, and picks per series the newest
checkpoint whose files are all listed."""

from __future__ import annotations

import json
import re

from hypothesis import given
from hypothesis import strategies as st

from clusterddp import mirror
from clusterddp.errors import MirrorError
from clusterddp.store import RunStore
from fuzzing import case, fuzz, hostile_bytes, json_edited, spliced_bytes

HEX = st.from_regex(r"[0-9a-f]{64}", fullmatch=True)
NAMES = st.sampled_from(["checkpoints/step-5.pt", "checkpoints/step-12.pt", "snapshot.pt", "ckpt_000100.pt",
                         "checkpoint-500/model.safetensors", "checkpoint-500/optimizer.pt", "out/model.ckpt",
                         "global_step100/mp_rank_00_model_states.pt", "latest.pth", "data/train.bin"])
FILES = st.lists(st.tuples(NAMES, st.integers(0, 1 << 40), HEX), min_size=1, max_size=4, unique_by=lambda f: f[0])
HELD = st.builds(lambda series, step, host, files: mirror.Held(series, tuple(step), host, "2026-12-06T05:00:00+00:00",
                                                               tuple(files), tuple(range(len(files)))),
                 st.sampled_from(["checkpoints/step-#.pt", "snapshot.pt", "checkpoint-#/*"]),
                 st.lists(st.integers(0, 10 ** 6), max_size=2), st.sampled_from(["node1", "gpu-01"]), FILES)


def index_of(held: list[mirror.Held]) -> bytes:
    doc = {"version": mirror.INDEX_VERSION, "checkpoints": [h.to_json() for h in held]}
    return (json.dumps(doc, indent=1) + "\n").encode()


def read(tmp_path, data: bytes) -> list[mirror.Held] | None:
    store = RunStore(tmp_path / "runs")
    store.run_dir("r1").mkdir(parents=True, exist_ok=True)
    path = store.mirror_index_path("r1")
    path.write_bytes(data)
    got = None

    def located(e: BaseException) -> None:
        assert isinstance(e, MirrorError) and str(e).startswith(str(path)) and "hint: " in str(e), e

    with case("mirror index", MirrorError, located, size=len(data)):
        got = mirror.read_index(store, "r1")
    return got


def checked(held: list[mirror.Held]) -> None:
    for h in held:
        assert h.files and all(re.fullmatch(r"[0-9a-f]{64}", d) for _, _, d in h.files), h
        assert all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for _, s, _ in h.files), h
        assert all(p and not p.startswith("/") and ".." not in p.split("/") for p, _, _ in h.files), h
        assert mirror._describe(h)  # what seed says of it


@fuzz(30, share=0.25)
@given(held=st.lists(HELD, max_size=3))
def test_an_index_as_the_mirror_writes_it_reads_back_equal(tmp_path_factory, held):
    got = read(tmp_path_factory.mktemp("m"), index_of(held))
    assert got == held
    checked(got)


@fuzz(120)
@given(data=st.data(), held=st.lists(HELD, min_size=1, max_size=2))
def test_any_edited_or_damaged_index_is_read_or_refused_cleanly(tmp_path_factory, data, held):
    good = index_of(held)
    raw = data.draw(st.one_of(
        st.builds(lambda d: json.dumps(d).encode(), json_edited(json.loads(good))),
        spliced_bytes(good), hostile_bytes()))
    got = read(tmp_path_factory.mktemp("m"), raw)
    if got is not None:
        checked(got)


PATHS = st.one_of(NAMES, st.from_regex(r"[a-z0-9_.-]{1,12}(/[a-z0-9_.#*-]{1,12}){0,3}", fullmatch=True))
LISTINGS = st.dictionaries(PATHS, st.tuples(st.integers(0, 1 << 40), st.integers(0, 1 << 62)), max_size=12)


@fuzz(200)
@given(listing=LISTINGS, before=st.none() | LISTINGS,
       globs=st.sampled_from([mirror.DEFAULT_GLOBS, ("checkpoints/**",), ("**/*.pt", "out/*"), ("*",)]))
def test_the_chooser_never_raises_and_picks_the_newest_whole_checkpoint_of_each_series(listing, before, globs):
    with case("mirror chooser"):
        by_series = mirror.ranked(listing, globs, before)
        chosen = mirror.choose(listing, globs, before)
    assert [c.series for c in chosen] == sorted(by_series)
    for series, found in by_series.items():
        assert found[0] in chosen and all(c.series == series for c in found)
        ranks = [(c.step, max(m for _, _, m in c.files)) for c in found]
        assert ranks == sorted(ranks, reverse=True)  # newest first
        for c in found:
            assert all(listing.get(p) == (s, m) for p, s, m in c.files)  # only what the node listed
            if before is not None and len(c.files) > 1:  # a folder: listed alike by the look before
                assert all(before.get(p) == (s, m) for p, s, m in c.files)
