"""The "pyav" backend: a PyAV container a Dataset opened in __init__, with decoder threading, decodes in
forked workers.

FFmpeg starts a threaded decoder's threads at its first decode: torch's forked workers inherit
the parent's decoder without them and wait forever at their next decode. safeloader's workers
each open their own copy of the container, with the same stream thread settings.
"""

from __future__ import annotations

import ast

import pytest

from .subproc import check_script, run_script

pytestmark = pytest.mark.timeout(90)

pytest.importorskip("av")


@pytest.fixture(scope="module")
def video(tmp_path_factory):
    from .pyav_data import write_video

    return write_video(tmp_path_factory.mktemp("pyav") / "clip.mp4")


def _read(out: str) -> tuple[list[list[tuple]], list[tuple], list[str], str, str]:
    """(each epoch's items, the parent's own reads, the warnings, the parent's state, workers left)."""
    lines = out.splitlines()
    epochs = [ast.literal_eval(line) for line in lines if line.startswith("[(")]
    expected = ast.literal_eval(next(line for line in lines if line.startswith("EXPECTED "))[9:])
    warned = [line for line in lines if "Warning:" in line]
    parent = next(line for line in lines if line.startswith("PARENT "))
    left = next(line for line in lines if line.startswith("LEFT "))
    return epochs, expected, warned, parent, left


@pytest.mark.torch_baseline
def test_torch_workers_wait_forever_in_the_parents_threaded_decoder(video):
    result = run_script("pyav_in_dataset.py", "torch", video, "default", timeout=60, expect_hang=True)
    assert result.timed_out and result.stdout == "", result


@pytest.mark.parametrize("variant", ["default", "persistent"])
def test_fork_workers_decode_the_frames_the_parent_decodes_and_the_parents_container_still_works(video, variant):
    # "persistent": two epochs, and the Dataset also holds the stream's codec context and the container in a list.
    epochs, expected, warned, parent, left = _read(
        check_script("pyav_in_dataset.py", "safeloader", video, variant, timeout=60).stdout
    )
    assert len(epochs) == (1 if variant == "default" else 2), epochs
    for items in epochs:
        assert [item[:2] for item in items] == expected, (items, expected)
        # Forked by this process (no forkserver switch), decoding with the parent's thread settings.
        assert all(forked and thread_type == "AUTO" for _, _, forked, thread_type in items), items
    assert len({checksum for _, checksum in expected}) == 6, expected  # six different frames
    assert not warned, warned  # no UnsafeForkWarning: FFmpeg's threads are handled
    assert parent == "PARENT True AUTO", parent
    assert left == "LEFT 0", left


# A container the Dataset does not hold (a module global): nothing reopens it, so its threads are a
# hazard as an unknown pool's are, not handled by the backend.


@pytest.mark.torch_baseline
def test_torch_workers_wait_forever_in_a_global_containers_decoder(video):
    result = run_script("pyav_in_a_global.py", "torch", video, timeout=60, expect_hang=True)
    assert result.timed_out and result.stdout == "", result


def test_a_container_the_dataset_does_not_hold_gets_forkserver_workers_and_a_warning_naming_it(video):
    lines = check_script("pyav_in_a_global.py", "safeloader", video, timeout=90).stdout.splitlines()
    items = ast.literal_eval(lines[0])
    expected = ast.literal_eval(lines[1].removeprefix("EXPECTED "))
    assert [tuple(item[:2]) for item in items] == expected and len({c for _, c in expected}) == 6, lines
    assert not any(forked for _, _, forked in items), items  # started by a forkserver, not forked from here
    assert len(lines) == 3 and lines[2].startswith("UnsafeForkWarning: safeloader: DataLoader workers would be "
                                                   "forked from a process holding av's native threads"), lines
    assert "its backend 'pyav' reopens only the input containers the Dataset holds" in lines[2], lines
