"""Quarantine's documented rules pinned in absolute numbers (issue 40): the strike window is one day,
the state folder is 0700, and no time past what the C library can say gets in (``--for`` of 10^22
hours, a hand-edited ``until``): each a clear refusal, never "internal error: OverflowError"."""

from __future__ import annotations

import json
import os
import stat

from clusterddp import quarantine as quarantines
from helpers import cddp

NOW = 1_800_000_000.0
DAY = 24 * 3600.0  # docs: "within a day"; written here, not read from the constant


def test_a_strike_counts_for_one_day_and_no_longer():
    _, strikes = quarantines.decide({"m:22": "b"}, [], [], "r1", NOW, 7200)
    added, _ = quarantines.decide({"m:22": "b"}, [], strikes, "r2", NOW + DAY - 60, 7200)
    assert [e.machine for e in added] == ["m:22"]  # lost again within the day: set aside
    added, left = quarantines.decide({"m:22": "b"}, [], strikes, "r2", NOW + DAY + 60, 7200)
    assert added == [] and left == [quarantines.Strike("m:22", "b", "r2", NOW + DAY + 60)]  # a day later: a new strike


def test_the_state_folder_is_made_0700_and_the_file_0600(tmp_path):
    old = os.umask(0o022)
    try:
        q = quarantines.Quarantine(tmp_path / "state" / "clusterddp" / "quarantine.json")
        q.add([quarantines.Entry("10.0.0.2:22", "b", NOW, NOW + 3600, "by hand", None)])
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(q.path.parent).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(q.path).st_mode) == 0o600


def test_a_time_past_the_year_9999_is_refused_and_every_stamp_is_said(tmp_path):
    for until in (1e20, 2 ** 63, -5.0):
        doc = {"hosts": [{"machine": "10.0.0.2:22", "host": "b", "since": NOW, "until": until, "why": "x",
                          "run_id": None}]}
        try:
            quarantines.parse(json.dumps(doc).encode(), "/s/q.json")
            raise AssertionError(f"{until} accepted")
        except quarantines.QuarantineError as e:
            assert "hosts[0].until: not a time between 1970 and 9999" in e.message
    for t in (0.0, NOW, quarantines.LAST_TIME, 1e20, float("inf"), float("nan"), -1e20):
        assert isinstance(quarantines.stamp(t), str) and quarantines.stamp(t)


def test_the_commands_refuse_a_far_time_with_a_message_not_an_overflow(tmp_path):
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    inv = tmp_path / "inv.yaml"
    inv.write_text("hosts:\n  - {name: gpu-01, address: 10.0.0.11}\n")
    (tmp_path / "t.py").write_text("print(1)\n")
    r = cddp("quarantine", "add", str(inv), "gpu-01", "--for", "9999999999999999999999h", env=env, check_rc=2)
    assert "--for 9999999999999999999999h: longer than 100 years" in r.stderr and "internal error" not in r.stderr
    assert "no host is quarantined" in cddp("quarantine", "list", env=env, check_rc=0).stdout
    r = cddp("quarantine", "add", str(inv), "gpu-01", "--for", "5200w", env=env, check_rc=0)
    assert "is quarantined until" in r.stdout
    path = tmp_path / "state" / "clusterddp" / "quarantine.json"
    doc = json.loads(path.read_text())
    doc["hosts"][0]["until"] = 1e25  # edited by hand
    path.write_text(json.dumps(doc))
    for args in (("quarantine", "list"), ("up", str(inv), str(tmp_path / "t.py"), "--dry-run")):
        r = cddp(*args, env=env, check_rc=2)
        assert "damaged quarantine file" in r.stderr and "hosts[0].until" in r.stderr, r.stderr
        assert "internal error" not in r.stderr and "Traceback" not in r.stderr
