"""The stack supervisor's restart policy and bookkeeping (stack/restarts.py), the job records it resubmits from
(stack/jobs.py), and its state file's lock: pure, no processes started except where a test says so."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest

from infersight.stack import jobs, statefile
from infersight.stack.restarts import Backoff, RestartBook, describe_exit


def test_backoff_doubles_from_one_second_to_thirty():
    policy = Backoff()
    assert [policy.delay(n) for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]
    with pytest.raises(ValueError):
        policy.delay(0)


def test_a_death_waits_its_backoff_then_restarts_once():
    book = RestartBook(Backoff(initial_s=1, factor=2, max_s=30, reset_after_s=60))
    assert not book.step("kafka", 100, alive=True, now=0.0)
    assert not book.step("kafka", 100, alive=False, now=10.0, exit_how="killed by SIGKILL")  # found dead
    assert book.records["kafka"].waiting
    assert not book.step("kafka", 100, alive=False, now=10.5)
    assert book.step("kafka", 100, alive=False, now=11.0)  # 1 s after: due
    book.started("kafka", 200, now=11.0)
    r = book.records["kafka"]
    assert (r.restarts, r.pid, r.waiting, r.last_exit, r.deaths_in_row) == (1, 200, False, "killed by SIGKILL", 1)
    assert not book.step("kafka", 200, alive=True, now=12.0)


def test_deaths_in_a_row_double_the_wait_and_a_stable_run_resets_it():
    book = RestartBook(Backoff(initial_s=1, factor=2, max_s=30, reset_after_s=60))
    now, pid, waits = 0.0, 1, []
    for _ in range(4):  # dies right after each start
        book.step("gw", pid, alive=False, now=now)
        waits.append(book.records["gw"].restart_at - now)
        now = book.records["gw"].restart_at
        assert book.step("gw", pid, alive=False, now=now)
        pid += 1
        book.started("gw", pid, now)
    assert waits == [1, 2, 4, 8]
    book.step("gw", pid, alive=True, now=now + 59)
    assert book.records["gw"].deaths_in_row == 4  # not yet: up 59 s
    book.step("gw", pid, alive=True, now=now + 61)
    assert book.records["gw"].deaths_in_row == 0
    book.step("gw", pid, alive=False, now=now + 100)
    assert book.records["gw"].restart_at == now + 101  # back to 1 s
    assert book.records["gw"].restarts == 4


def test_a_process_started_by_someone_else_is_adopted_and_cancels_the_pending_restart():
    book = RestartBook()
    book.step("tm", 5, alive=False, now=0.0)
    assert book.records["tm"].waiting
    assert not book.step("tm", 6, alive=True, now=0.5)  # `infersight up` started it meanwhile
    r = book.records["tm"]
    assert (r.pid, r.waiting, r.restarts) == (6, False, 0)


def test_a_failed_start_backs_off_further_and_forget_cancels():
    book = RestartBook()
    book.step("jm", 5, alive=False, now=0.0)
    book.start_failed("jm", now=1.0, why="prepare failed")
    r = book.records["jm"]
    assert (r.deaths_in_row, r.restart_at, r.restarts) == (2, 3.0, 0)
    assert r.last_exit == "start failed: prepare failed"
    book.forget("jm")  # stopped on purpose
    assert not book.records["jm"].waiting


def test_the_book_round_trips_through_json():
    book = RestartBook(Backoff(initial_s=2, reset_after_s=10))
    book.step("a", 1, alive=False, now=0.0, exit_how="exit code 1")
    book.step("a", 1, alive=False, now=5.0)
    book.started("a", 2, now=5.0)
    again = RestartBook.from_json(book.to_json())
    assert again == book


def test_exit_statuses_read_as_words():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    os.kill(proc.pid, signal.SIGKILL)
    _, status = os.waitpid(proc.pid, 0)
    assert describe_exit(status) == "killed by SIGKILL"
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    _, status = os.waitpid(proc.pid, 0)
    assert describe_exit(status) == "exit code 3"
    assert describe_exit(None) == "exited (status unknown)"


def test_the_state_lock_serialises_read_modify_write(tmp_path):
    path = tmp_path / "counter.json"
    statefile.write_json(path, {"n": 0})

    def bump() -> None:
        for _ in range(50):
            with statefile.locked(tmp_path):
                n = statefile.read_json(path)["n"]
                time.sleep(0.0005)
                statefile.write_json(path, {"n": n + 1})

    threads = [threading.Thread(target=bump) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert statefile.read_json(path) == {"n": 200}


def fake_layout(tmp_path):
    return SimpleNamespace(state_dir=tmp_path, data=tmp_path / "data")


def test_jobs_are_remembered_until_stopped_and_a_resubmission_takes_over_the_record(tmp_path):
    layout = fake_layout(tmp_path)
    jobs._remember(layout, "a" * 32, {"module": "m", "args": ["--x"], "py_files": []})
    jobs._remember(layout, "b" * 32, {"module": "n", "args": [], "py_files": []})
    jobs._remember(layout, "c" * 32, {"module": "m", "args": ["--x"], "py_files": []}, replaces="a" * 32)
    records = jobs.remembered(layout)
    assert set(records) == {"b" * 32, "c" * 32}
    assert records["c" * 32]["recovered"] == 1
    jobs.forget(layout, "b" * 32)
    assert set(jobs.remembered(layout)) == {"c" * 32}
    jobs.forget_all(layout)
    assert jobs.remembered(layout) == {}
    assert jobs.remembered(SimpleNamespace()) == {}  # a layout without a state folder (docker-compose) keeps none


def test_retained_checkpoints_are_the_completed_ones_newest_first(tmp_path):
    layout = fake_layout(tmp_path)
    root = layout.data / "flink" / "checkpoints" / ("a" * 32)
    for n, complete in ((3, True), (12, True), (13, False), (9, True)):
        (root / f"chk-{n}").mkdir(parents=True)
        if complete:
            (root / f"chk-{n}" / "_metadata").write_bytes(b"x")
    (root / "shared").mkdir()
    assert [p.name for p in jobs.retained_checkpoints(layout, "a" * 32)] == ["chk-12", "chk-9", "chk-3"]
    assert jobs.retained_checkpoints(layout, "f" * 32) == []


def test_reconcile_resubmits_what_the_job_manager_lost_from_the_newest_checkpoint(tmp_path, monkeypatch):
    layout = SimpleNamespace(state_dir=tmp_path, data=tmp_path / "data", flink_rest_url="http://jm")
    lost, ended, running = "a" * 32, "b" * 32, "c" * 32
    for job_id in (lost, ended, running):
        jobs._remember(layout, job_id, {"module": f"mod-{job_id[0]}", "args": ["--brokers", "k"], "py_files": []})
    (layout.data / "flink" / "checkpoints" / lost / "chk-7").mkdir(parents=True)
    (layout.data / "flink" / "checkpoints" / lost / "chk-7" / "_metadata").write_bytes(b"x")
    submitted = []

    def fake_submit(layout_, module, args, restore_from=None, py_files=(), replaces=None):
        submitted.append((module, args, restore_from, replaces))
        jobs._remember(layout_, "d" * 32, {"module": module, "args": args, "py_files": []}, replaces)
        return "d" * 32

    class Overview:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def read(self):
            import json

            return json.dumps({"jobs": [{"jid": ended, "state": "CANCELED"},
                                        {"jid": running, "state": "RUNNING"}]}).encode()

    monkeypatch.setattr(jobs.urllib.request, "urlopen", lambda *a, **k: Overview())
    monkeypatch.setattr(jobs, "submit", fake_submit)
    monkeypatch.setattr(jobs, "job_state", lambda *_: "RUNNING")
    moved = jobs.reconcile(layout, log=lambda _: None)
    assert moved == {lost: "d" * 32}
    checkpoint = str(layout.data / "flink" / "checkpoints" / lost / "chk-7")
    assert submitted == [("mod-a", ["--brokers", "k"], checkpoint, lost)]
    assert set(jobs.remembered(layout)) == {running, "d" * 32}  # the cancelled job is no longer kept running


def test_a_task_manager_whose_embedded_python_can_never_start_is_found_from_the_exception_history(monkeypatch):
    import json

    poisoned = ("java.lang.Error: java.lang.InterruptedException\n\tat pemja.core.PythonInterpreter$MainInterpreter"
                ".initialize(PythonInterpreter.java:406)")
    replies = {
        "/jobs/overview": {"jobs": [{"jid": "j1", "state": "RESTARTING"}, {"jid": "j2", "state": "CANCELED"}]},
        "/jobs/j1/exceptions?maxExceptions=10": {"exceptionHistory": {"entries": [
            {"stacktrace": poisoned, "timestamp": 5_000, "taskManagerId": "flink-taskmanager-2",
             "concurrentExceptions": [{"stacktrace": poisoned, "timestamp": 7_000,
                                       "taskManagerId": "flink-taskmanager-2"}]},
            {"stacktrace": "java.lang.RuntimeException: other", "timestamp": 9_000,
             "taskManagerId": "flink-taskmanager"},
        ]}},
    }

    class Reply:
        def __init__(self, url):
            self.body = json.dumps(replies[url.removeprefix("http://jm")]).encode()

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def read(self):
            return self.body

    monkeypatch.setattr(jobs.urllib.request, "urlopen", lambda url, timeout=None: Reply(url))
    layout = SimpleNamespace(flink_rest_url="http://jm")
    assert jobs.task_managers_without_python(layout) == {"flink-taskmanager-2": 7.0}
