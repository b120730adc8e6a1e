"""Replay files and commands: the printed command works from any directory, a replayed case
saved again keeps its file name, and the replay folder stays bounded across runs."""

import os
import shlex
import time

import torch

from pagedattn.cases import grid, save_case
from pagedattn.runner.replay import KEEP_FILES, case_name, is_saved_case
from tests.helpers import import_session_modules, run_inprocess

import_session_modules()  # before the in-process runs below (see its docstring)

DECODE = "pagedattn.conformance.test_decode"
ONE = ("-k", "fp32 and L300")  # one failing case of the quick decode family
WRONG = "--backend=bad_backends.py:WrongScale"  # relative to the run's directory on purpose


def _run(pytester, *args):
    return run_inprocess(pytester, "-p", "no:cacheprovider", *args)


def _replay_args(result) -> list[str]:
    """The arguments of the first printed replay command (after ``pytest``)."""
    line = next(line for line in result.stdout.lines if "replay: pytest " in line)
    args = shlex.split(line.split("replay: ", 1)[1])
    assert args[0] == "pytest", line
    return args[1:]


def test_the_replay_command_works_from_any_directory_and_keeps_its_file_name(pytester, bad, monkeypatch):
    first = _run(pytester, "--pyargs", DECODE, WRONG, *ONE)
    first.assert_outcomes(failed=1)
    args = _replay_args(first)
    suite, backend, replay = args[0], args[1], args[args.index("--replay") + 1]
    assert os.path.isabs(suite) and os.path.isdir(suite), args
    assert backend == f"--backend={os.path.abspath(bad)}:WrongScale", args
    assert os.path.isabs(replay) and os.path.isfile(replay), args
    name = os.path.basename(replay)

    elsewhere = pytester.mkdir("elsewhere")
    monkeypatch.chdir(elsewhere)
    again = _run(pytester, *args)
    again.assert_outcomes(failed=1)
    second = _replay_args(again)
    assert os.path.basename(second[second.index("--replay") + 1]) == name, second
    # and a replay of that replay: the name comes from the case id, not the file's name
    third = _run(pytester, *second)
    third.assert_outcomes(failed=1)
    replayed = _replay_args(third)
    assert os.path.basename(replayed[replayed.index("--replay") + 1]) == name, replayed
    assert "replay-replay" not in third.stdout.str()


def test_only_saved_cases_count_as_saved_cases(tmp_path):
    save_case(grid("quick", "gather")[0].build(), tmp_path / "case.pt")
    torch.save({"weights": torch.zeros(2)}, tmp_path / "weights.pt")
    (tmp_path / "empty.pt").write_bytes(b"")
    assert is_saved_case(str(tmp_path / "case.pt"))
    assert not is_saved_case(str(tmp_path / "weights.pt")) and not is_saved_case(str(tmp_path / "empty.pt"))


def test_case_names_drop_the_replay_prefixes():
    assert case_name("replay-replay-decode-x") == "decode-x" and case_name("decode-x") == "decode-x"


def test_the_replay_folder_keeps_only_the_newest_files(pytester, bad):
    folder = pytester.path / ".pagedattn" / "failures"
    folder.mkdir(parents=True)
    save_case(grid("quick", "gather")[0].build(), folder / "model.pt")
    saved_case = (folder / "model.pt").read_bytes()
    torch.save({"weights": torch.zeros(2)}, folder / "model.pt")  # not a saved case: never pruned
    old = time.time() - 3600
    os.utime(folder / "model.pt", (old - 1, old - 1))
    for i in range(KEEP_FILES + 5):  # earlier runs' cases, oldest first
        path = folder / f"old-{i:04d}.pt"
        path.write_bytes(saved_case)
        os.utime(path, (old + i, old + i))
    (folder / "notes.txt").write_text("not a saved case: kept")
    result = _run(pytester, "--pyargs", DECODE, WRONG, *ONE)
    result.assert_outcomes(failed=1)
    names = sorted(p.name for p in folder.iterdir())
    olds = [n for n in names if n.startswith("old-")]
    assert len(olds) == KEEP_FILES and olds[0] == "old-0005.pt", olds[:3]
    assert "notes.txt" in names and "model.pt" in names, names
    args = _replay_args(result)
    saved = [n for n in names if not n.startswith("old-") and n.endswith(".pt") and n != "model.pt"]
    assert saved == [os.path.basename(args[args.index("--replay") + 1])], saved
