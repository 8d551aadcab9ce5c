"""Known torch noise (clusterddp/noise.py), on the lines torch 2.13 really prints: what `--quiet` hides,
what `top`'s last-line column and a failure's log tail leave out."""

from __future__ import annotations

import dataclasses
import sys

from clusterddp import failure
from clusterddp import top as top_view
from clusterddp.noise import NoiseFilter, without_noise
from clusterddp.transport.local import LocalTransport
from helpers import make_record

# torchrun's banner as a node's log has it (clusterddp's launch.sh gives torchrun's logger no header)
BANNER = [
    b"/v/lib/python3.11/site-packages/torch/_subclasses/functional_tensor.py:368: UserWarning: Failed to initialize "
    b"NumPy: No module named 'numpy' (Triggered internally at "
    b"/__w/pytorch/pytorch/torch/csrc/utils/tensor_numpy.cpp:84.)",
    b'  cpu = _conversion_method_template(device=torch.device("cpu"))',
    b"",
    b"*****************************************",
    b"Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid your system being "
    b"overloaded, please further tune the variable for optimal performance in your application as needed. ",
    b"*****************************************",
]
SOCKET = (b"[W1201 23:43:23.765698226 socket.cpp:767] [c10d] The hostname of the client socket cannot be retrieved. "
          b"err=-3")

# torch elastic's agent, when another node's agent finished first and took the store with it: one log
# record, every line under the same header (torch's log formatter repeats it), 30-40 lines
_H = b"E1201 23:43:23.638000 18527 /v/lib/python3.11/site-packages/torch/distributed/elastic/agent/server/api.py:963] "
EXIT_BARRIER = [_H + b"Error waiting on exit barrier. Elapsed: 0.4112 seconds",
                _H + b"Traceback (most recent call last):"] + [
    _H + line for i in range(16) for line in (
        b'  File "/v/lib/python3.11/site-packages/torch/distributed/elastic/utils/store.py", line %d, in barrier' % i,
        b"    store.wait([last_member_key])")] + [
    _H + b"torch.distributed.DistNetworkError: failed to recv, got 0 bytes",
    _H + b"Exception raised from recvBytes at /pytorch/torch/csrc/distributed/c10d/Utils.hpp:678 "
         b"(most recent call first):"]


def shown(lines: list[bytes]) -> list[bytes]:
    hide = NoiseFilter()
    return [line for line in lines if not hide("node-2", line)]


def test_quiet_leaves_no_empty_line_where_the_banner_was():
    """The banner starts with an empty line: `--quiet` left `[node-2] ` alone on its line."""
    job = [b"[clusterddp] node 1/2 on vm", *BANNER, b"epoch 0 loss 1.0", b"", b"epoch 1 loss 0.5"]
    # the job's own empty line stays
    assert shown(job) == [b"[clusterddp] node 1/2 on vm", b"epoch 0 loss 1.0", b"", b"epoch 1 loss 0.5"]
    # with a logger header (torchrun's default format), the header-only first line is noise too
    assert shown([b"W1201 23:42:47.995000 15025 torch/distributed/run.py:874] ", b"job line"]) == [b"job line"]


def test_the_exit_barrier_block_of_a_successful_run_is_noise_as_a_whole():
    assert len(EXIT_BARRIER) >= 35
    after = b"E1201 23:43:24.001000 18527 torch/distributed/other.py:12] not part of it"
    lines = [b"done rank 2", *EXIT_BARRIER, after, b"[clusterddp] node 1 exit 0"]
    hide = NoiseFilter()
    kept = [line for line in lines if not hide("node-2", line)]
    assert kept == [b"done rank 2", after, b"[clusterddp] node 1 exit 0"]
    assert hide.hidden == len(EXIT_BARRIER)
    # a traceback of the job's own (no such first line) is never hidden, even under a torch header
    own = [_H + b"Traceback (most recent call last):", _H + b"ValueError: boom"]
    assert shown(own) == own


def test_a_failures_log_tail_leaves_out_the_socket_hostname_warning():
    log = b"\n".join([b"step 1", SOCKET, b"ValueError: boom on rank 4", SOCKET, *EXIT_BARRIER[:3], SOCKET]) + b"\n"
    tail = failure._tail(log)
    assert tail == ("step 1", "ValueError: boom on rank 4")
    assert without_noise(["a", SOCKET.decode(), "b"]) == ["a", "b"]
    # the failing rank's own last lines too
    rank = ["[rank4]: step 3", "[rank4]:" + SOCKET.decode(), "[rank4]: ValueError: boom on rank 4", SOCKET.decode()]
    assert failure.rank_tail(rank, 4) == ("[rank4]: step 3", "[rank4]: ValueError: boom on rank 4")


def test_tops_last_line_is_the_last_one_that_is_no_noise(tmp_path):
    """The whole path: the command a Watch sends, run by bash here, read back as the view's last line."""
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    (ctl / "node.log").write_bytes(b"\n".join([b"step 7 loss 0.5", SOCKET, SOCKET, b""]))
    rec = make_record("run-1", hosts=("a",))
    node = rec.nodes[0]
    rec = dataclasses.replace(rec, nodes=(dataclasses.replace(
        node, control_dir=str(ctl), settings=dataclasses.replace(node.settings, python=sys.executable,
                                                                 workdir=str(tmp_path))),))
    with top_view.Watch([rec], connect=lambda h: LocalTransport(h.name)) as w:
        [view] = w.look().runs[0].nodes
    assert (view.state, view.last_line, view.step) == ("lost", "step 7 loss 0.5", 7)
