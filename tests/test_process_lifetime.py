"""No process outlives a run, on every exit path, and a dead worker is seen at once
(``pagedprefix.conformance.running.lifetime``).

The conform cases run the real ``pagedprefix conform`` in a subprocess whose environment carries
a marker unique to the test; every process below it inherits the marker (its engine worker, the
keeper, and a daemon the engine's factory starts that leaves its session with ``setsid`` and
double-forks). Processes are counted by that marker in ``/proc/*/environ`` before, during (the
count must see the whole tree: a counter that sees nothing cannot fail) and after the run, for a
normal end, an engine error, SIGINT, SIGTERM, SIGHUP and SIGKILL of ``conform`` itself. What each
catches: before this module, SIGTERM and SIGHUP skipped ``atexit`` (the engine worker and the
daemon were left), SIGKILL left them too, and the daemon (its own session) survived every path
because only the worker's process group was killed.

The sweep cases break cells through :data:`pagedprefix.cluster.sweep.CELL_HOOK_ENV`
(``tests/lifetime_cells.py``): a cell that ``os._exit``s or SIGKILLs its worker waited out
``--cell-timeout`` (3600 s) before; it must fail within seconds. A cell raising ``SystemExit(0)``
or ``KeyboardInterrupt`` must be a FAIL (exit 1, one line), never a PASS.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from pagedprefix.cluster.sweep import CELL_HOOK_ENV, CellFailed, grid, run_sweep
from pagedprefix.conformance.running.lifetime import descendants, kill_tree

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts processes in /proc")

TESTS = Path(__file__).parent
MARK = "PAGEDPREFIX_TEST_LIFETIME"

ENGINE = textwrap.dedent('''
    """A spec engine whose factory starts a daemon: it leaves its session (setsid), double-forks,
    keeps the worker's stdout open and sleeps; the grandchild writes its pid to daemon.pid."""
    import os, pathlib, subprocess, sys, time
    from pagedprefix.conformance.protocol.adapters import SpecShapedAdapter, spec_capabilities
    from pagedprefix.spec import SpecCache

    HERE = pathlib.Path(__file__).parent
    DAEMON = """
    import os, sys, time
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            open(sys.argv[1] + ".tmp", "w").write(str(os.getpid()))
            os.rename(sys.argv[1] + ".tmp", sys.argv[1])
            time.sleep(300)
        os._exit(0)
    time.sleep(300)
    """
    _daemon = []
    _calls = [0]

    def _spawn():
        if not _daemon:
            _daemon.append(subprocess.Popen([sys.executable, "-c", DAEMON, str(HERE / "daemon.pid")],
                                            start_new_session=True, stdin=subprocess.DEVNULL))
            deadline = time.monotonic() + 30
            while not (HERE / "daemon.pid").exists() and time.monotonic() < deadline:
                time.sleep(0.01)

    class Spawns(SpecShapedAdapter):
        def __init__(self, config):
            _spawn()
            super().__init__(SpecCache.create(config), spec_capabilities(config, groups=False))

    class Raises(Spawns):
        def step(self):
            raise RuntimeError("step() of an engine that spawned a daemon")

    class Sleeps(Spawns):
        def allocate(self, *args, **kwargs):
            (HERE / "sleeping").write_text("")
            time.sleep(1000)

    class Dies(Spawns):
        def free(self, request_id):
            _calls[0] += 1
            if _calls[0] > 20 and not (HERE / "died").exists():  # once per run
                (HERE / "died").write_text("")
                os._exit(3)
            super().free(request_id)

    spawns, raises, sleeps, dies = Spawns, Raises, Sleeps, Dies
''')


def marked(token: str) -> list[int]:
    """Live (not zombie) processes whose environment carries ``MARK=token``."""
    needle = f"{MARK}={token}".encode()
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{name}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in env and state not in (b"Z", b"X"):
            pids.append(int(name))
    return pids


def gone(token: str, seconds: float = 10) -> list[int]:
    """The marked processes still alive after waiting up to ``seconds`` for them to go."""
    deadline = time.monotonic() + seconds
    while (left := marked(token)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


@pytest.fixture
def token() -> Iterator[str]:
    """A marker for this test's processes; whatever still carries it at the end is killed."""
    value = uuid.uuid4().hex
    yield value
    for pid in marked(value):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def engine(tmp_path: Path) -> str:
    name = f"lifetime_{uuid.uuid4().hex[:10]}"
    (tmp_path / f"{name}.py").write_text(ENGINE)
    return name


def start_conform(tmp_path: Path, token: str, engine: str, factory: str,
                  *extra: str) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "pagedprefix", "conform", "--no-trace", "--max-examples", "20",
            "--engine", f"{engine}:{factory}", "--path", str(tmp_path), *extra]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            env={**os.environ, MARK: token})


def daemon_pid(tmp_path: Path) -> int:
    return int((tmp_path / "daemon.pid").read_text())


def wait_until_sleeping(tmp_path: Path, proc: subprocess.Popen[str]) -> None:
    """Wait (up to 120 s) for the engine's call to reach its sleep; ``proc`` must stay alive."""
    deadline = time.monotonic() + 120
    while not (tmp_path / "sleeping").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-2000:]  # type: ignore[union-attr]
        time.sleep(0.05)


def test_the_counter_sees_a_setsid_daemon(token: str) -> None:
    """The broken candidate for the counter itself: a daemon that is left behind is counted."""
    script = "import os,time\nif os.fork()==0:\n    os.setsid()\n    time.sleep(60)\nos._exit(0)"
    subprocess.run([sys.executable, "-c", script], env={**os.environ, MARK: token}, timeout=30, check=True)
    assert len(marked(token)) == 1
    assert gone(token, seconds=0.5) != []  # nothing kills it: the counter says so


@pytest.mark.parametrize(("factory", "code", "text"), [
    ("spawns", 0, "PASS"),
    ("raises", 1, "step() raised RuntimeError"),
])
def test_a_run_that_ends_leaves_no_process(tmp_path: Path, token: str, engine: str, factory: str,
                                           code: int, text: str) -> None:
    assert marked(token) == []
    proc = start_conform(tmp_path, token, engine, factory)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == code, out[-2000:] + err[-2000:]
    assert text in out
    assert (tmp_path / "daemon.pid").exists()  # the daemon did start
    assert gone(token) == []


SIGNALS = [
    (signal.SIGINT, 130),
    (signal.SIGTERM, 128 + signal.SIGTERM),
    (signal.SIGHUP, 128 + signal.SIGHUP),
    (signal.SIGKILL, -signal.SIGKILL),
]


@pytest.mark.parametrize(("signum", "code"), SIGNALS, ids=[s.name for s, _ in SIGNALS])
def test_a_signal_to_conform_leaves_no_process(tmp_path: Path, token: str, engine: str, signum: int,
                                               code: int) -> None:
    proc = start_conform(tmp_path, token, engine, "sleeps", "--call-timeout", "300")
    try:
        wait_until_sleeping(tmp_path, proc)
        during = marked(token)
        # conform, the engine worker, the daemon and its setsid grandchild (and the keeper)
        assert len(during) >= 4 and proc.pid in during and daemon_pid(tmp_path) in during
        start = time.monotonic()
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == code, err[-2000:]
        assert time.monotonic() - start < 30  # not the 300 s call limit
        assert "Traceback" not in err
        if signum in (signal.SIGTERM, signal.SIGHUP):
            assert err.strip().splitlines()[-1] == f"pagedprefix: terminated by {signal.Signals(signum).name}"
        assert gone(token) == []
    finally:
        proc.kill()
        proc.wait()


INDEXER = textwrap.dedent('''
    """The reference indexer behind a factory that starts the same setsid, double-forked daemon;
    its queries never return once the daemon is up."""
    import time
    from pagedprefix.cluster import ReferenceIndexer
    from {engine} import _spawn, HERE

    class Sleeps(ReferenceIndexer):
        def query(self, keys, num_tokens):
            (HERE / "sleeping").write_text("")
            time.sleep(1000)

    def sleeps(config):
        _spawn()
        return Sleeps(config)
''')


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_signal_to_indexer_conform_over_jsonl_leaves_no_process(
        tmp_path: Path, token: str, engine: str, signum: int) -> None:
    indexer = f"ix_{engine}"
    (tmp_path / f"{indexer}.py").write_text(INDEXER.format(engine=engine))
    command = f"jsonl:{sys.executable} -m pagedprefix.cluster.jsonl_server --indexer {indexer}:sleeps"
    env = {**os.environ, MARK: token,
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "pagedprefix", "indexer-conform", "--indexer", command,
                             "--call-timeout", "300", "--generated", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env)
    try:
        wait_until_sleeping(tmp_path, proc)
        during = marked(token)
        assert len(during) >= 4 and daemon_pid(tmp_path) in during
        proc.send_signal(signum)
        proc.communicate(timeout=60)
        assert proc.returncode == (128 + signum if signum != signal.SIGKILL else -signum)
        assert gone(token) == []
    finally:
        proc.kill()
        proc.wait()


def test_a_worker_that_dies_is_seen_at_once_though_its_daemon_holds_stdout(
        tmp_path: Path, token: str, engine: str) -> None:
    """The daemon inherited the worker's stdout: only killing the worker's tree when the worker exits
    lets end-of-file through (before, the run waited out the call limit, 300 s here)."""
    start = time.monotonic()
    proc = start_conform(tmp_path, token, engine, "dies", "--call-timeout", "300")
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 1, out[-2000:] + err[-2000:]
    assert "exited with status 3 during free" in out
    assert time.monotonic() - start < 120
    assert gone(token) == []


def test_kill_tree_reaches_a_double_forked_setsid_grandchild() -> None:
    """kill_tree on a subreaper keeper finds the orphan that reparented to it."""
    script = textwrap.dedent("""
        import os, sys, time
        from pagedprefix.conformance.running.lifetime import set_subreaper
        assert set_subreaper()
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(60)
            os._exit(0)
        os.wait()
        print("ready", flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        below = descendants(proc.pid)
        assert len(below) == 1  # the grandchild, reparented to the subreaper
        kill_tree(proc.pid, timeout=5)
        assert descendants(proc.pid) == []
    finally:
        proc.kill()
        proc.wait()


# ----- sweep ------------------------------------------------------------------------------------


def sweep_workers() -> list[int]:
    """This process's live descendants that are multiprocessing workers (not its resource tracker)."""
    found = []
    for pid in descendants(os.getpid()):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"spawn_main" in cmdline:
            found.append(pid)
    return found

REST = ["--limit", "20", "--num-blocks", "unbounded", "--max-output", "8"]
CELLS = grid({"replicas": ["1", "2"]}, REST)


@pytest.mark.parametrize(("hook", "what"), [
    ("exits_3", "killed its worker (exit status 3)"),
    ("sigkills_itself", "killed its worker (killed by SIGKILL)"),
    ("raises_system_exit_0", "raised SystemExit(0)"),
    ("raises_keyboard_interrupt", "raised KeyboardInterrupt()"),
    ("raises_value_error", "raised ValueError('a cell that raises')"),
])
def test_a_cell_that_breaks_its_worker_fails_within_seconds(
        monkeypatch: pytest.MonkeyPatch, hook: str, what: str) -> None:
    monkeypatch.setenv(CELL_HOOK_ENV, f"lifetime_cells:{hook}")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    start = time.monotonic()
    with pytest.raises(CellFailed) as caught:
        run_sweep(CELLS, "local", 2, cell_timeout=3600)
    assert time.monotonic() - start < 60  # not the 3600 s cell limit
    message = str(caught.value)
    assert message == f"cell 'pagedprefix replay {' '.join(CELLS[1])}' {what}"
    assert sweep_workers() == []  # every worker is gone


def test_sweep_command_fails_a_cell_that_exits_its_worker(tmp_path: Path, token: str) -> None:
    env = {**os.environ, MARK: token, CELL_HOOK_ENV: "lifetime_cells:exits_3",
           "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pagedprefix", "sweep", "--replicas", "1,2",
                           "--workers", "2", "--", *REST],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert time.monotonic() - start < 60
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert lines[0].startswith("pagedprefix sweep: error: cell 'pagedprefix replay --replicas 2")
    assert lines[0].endswith("killed its worker (exit status 3)")
    assert gone(token) == []


def test_sweep_command_fails_a_cell_that_raises_system_exit_0(tmp_path: Path, token: str) -> None:
    env = {**os.environ, MARK: token, CELL_HOOK_ENV: "lifetime_cells:raises_system_exit_0",
           "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "pagedprefix", "sweep", "--replicas", "2", "--workers", "1",
                           "--", *REST], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].endswith("raised SystemExit(0)"), proc.stderr
    assert gone(token) == []


def _running_a_ray_cell(token: str) -> bool:
    for pid in marked(token):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::_ray_cell"):
                return True
    return False


@pytest.mark.cluster
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_signal_to_a_ray_sweep_leaves_no_process(tmp_path: Path, token: str, signum: int) -> None:
    """The local Ray cluster (GCS, raylet, workers) goes with the sweep; on SIGTERM the sweep still
    exits 143 although Ray installs SIGTERM handlers of its own and turns the signal into
    ``SystemExit(1)`` inside ``ray.wait``."""
    if os.environ.get("PAGEDPREFIX_REQUIRE_CLUSTER") != "1":
        pytest.importorskip("ray")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.Popen([sys.executable, "-m", "pagedprefix", "sweep", "--executor", "ray",
                             "--workers", "1",
                             "--replicas", "2", "--", "--limit", "20000", "--num-blocks", "unbounded"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            env={**env, MARK: token})
    try:
        deadline = time.monotonic() + 180
        while not _running_a_ray_cell(token):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-2000:]  # type: ignore[union-attr]
            time.sleep(0.2)
        assert len(marked(token)) >= 4  # the sweep, the GCS, the raylet, the worker running the cell
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == (128 + signum if signum != signal.SIGKILL else -signum), err[-2000:]
        if signum == signal.SIGTERM:
            assert err.strip().splitlines()[-1] == "pagedprefix: terminated by SIGTERM"
        assert gone(token, seconds=20) == []  # Ray alone took up to a minute after a SIGKILL
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.cluster
@pytest.mark.parametrize(("hook", "what"), [
    ("raises_system_exit_0", "raised SystemExit(0)"),
    ("exits_3", "killed its worker"),
])
def test_a_ray_cell_that_breaks_fails(monkeypatch: pytest.MonkeyPatch, hook: str, what: str) -> None:
    if os.environ.get("PAGEDPREFIX_REQUIRE_CLUSTER") != "1":
        pytest.importorskip("ray")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv(CELL_HOOK_ENV, f"lifetime_cells:{hook}")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    start = time.monotonic()
    with pytest.raises(CellFailed) as caught:
        run_sweep(CELLS, "ray", 2, cell_timeout=3600)
    assert time.monotonic() - start < 120
    assert str(caught.value).startswith(f"cell 'pagedprefix replay {' '.join(CELLS[1])}' {what}")
