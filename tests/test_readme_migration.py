"""The migration page's section (docs/migrating.md) (issue 24, section 6): what to change in an `mp.spawn` script
(`init_method='tcp://127.0.0.1:...'`, `world_size=nprocs`). The section's converted script, as printed
there, runs under `up local` as one job of 2 ranks."""

from __future__ import annotations

from helpers import REPO, cddp


def mp_spawn_section() -> str:
    text = (REPO / "docs" / "migrating.md").read_text()
    return text.split("\n**`mp.spawn` scripts.**", 1)[1].split("\n**`--local-rank-arg`.**", 1)[0]


def test_the_readmes_converted_mp_spawn_script_runs_as_one_job(tmp_path):
    section = mp_spawn_section()
    for change in ("`main()` once instead of `mp.spawn`", "no `init_method`, `rank` or\n`world_size`",
                   "`LOCAL_RANK`, not the rank"):
        assert change in section, change
    script = section.split("```python\n", 1)[1].split("\n```", 1)[0]
    assert "mp.spawn(" not in script.replace("# was: mp.spawn(", "") and "127.0.0.1" not in script.replace(
        '# was: init_method="tcp://127.0.0.1', "")
    (tmp_path / "spawned.py").write_text(script)
    r = cddp("up", "local", "spawned.py", "--gpus", "2", "--runs-dir", "runs", cwd=tmp_path, check_rc=0)
    for rank in (0, 1):
        # not "[local] rank ..." at a line's start: with PYTHONUNBUFFERED (set on these machines) print writes
        # the text and its newline apart, and two ranks' lines can share one
        assert f"rank {rank} of 2: sum 2" in r.stdout, r.stdout
