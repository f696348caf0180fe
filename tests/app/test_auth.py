"""Logins for several people (issue 54): hashed users files and HEADINFER_AUTH, never a password on the command line,
wrong passwords slowed per name and per address (a fake clock, no timed test), Gradio's real login route, and the
warning when others can reach the app with no login."""

from __future__ import annotations

import inspect
import os
import stat
import subprocess
import sys
from pathlib import Path

import gradio as gr
import httpx
import pytest
from ports import free_port

import launch
from app import auth, cli, startup
from app.auth import Authenticator, AuthError, LoginRefused, LoginThrottle

ROOT = Path(__file__).resolve().parents[2]
FAST = {"n": 2**10, "r": 8, "p": 1}  # the format's smallest settings: the tests hash many times


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def fast_hashes(monkeypatch):
    original = auth.hash_password

    def quick(password, *, salt=None, n=FAST["n"], r=8, p=1):
        return original(password, salt=salt, n=n, r=r, p=p)

    monkeypatch.setattr(auth, "hash_password", quick)
    return quick


# -- hashes and users files ---------------------------------------------------------------------------------
def test_a_hash_describes_itself_and_checks_only_its_password():
    encoded = auth.hash_password("correct horse")
    kind, n, r, p, salt, digest = encoded.split("$")
    assert (kind, int(n), int(r), int(p)) == ("scrypt", 2**14, 8, 1) and salt and digest
    assert auth.verify_password("correct horse", encoded)
    assert not auth.verify_password("correct hors", encoded)
    assert auth.hash_password("correct horse") != encoded  # a salt of its own each time


@pytest.mark.parametrize(("line", "words"), [
    ("ada", "write name:hash"),
    ("ada:hunter2", "holds no password hash"),  # a plain password in a users file
    ("ada:scrypt$16384$8$1$c2FsdA", "not a scrypt$n$r$p$salt$hash"),
    ("ada:scrypt$16$8$1$c2FsdHNhbHRzYWx0$" + "A" * 43, "weak or impossible settings"),
    ("ada:scrypt$16384$8$1$!!!$" + "A" * 43, "unreadable fields"),
    ("ada:Scrypt$16384$8$1$c2FsdHNhbHRzYWx0$" + "A" * 43, "holds no password hash"),
    ("bad name:scrypt$16384$8$1$c2FsdHNhbHRzYWx0$" + "A" * 43, "is not a user name"),
])
def test_bad_users_file_lines_are_refused_with_the_line(line, words):
    with pytest.raises(AuthError) as error:
        auth.parse_users(["# the team", "", line], where="users.txt", plain_allowed=False)
    assert "users.txt, line 3" in str(error.value) and words in str(error.value)


def test_add_user_writes_a_0600_file_and_replaces_a_users_line(tmp_path, fast_hashes):
    path = tmp_path / "users.txt"
    assert auth.add_user(path, "ada", "pw-ada") is False
    assert auth.add_user(path, "bob", "pw-bob") is False
    assert auth.add_user(path, "ada", "new-ada") is True
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert "pw-" not in path.read_text() and "new-ada" not in path.read_text()
    users = auth.read_users_file(path)
    assert sorted(users) == ["ada", "bob"]
    assert auth.verify_password("new-ada", users["ada"]) and not auth.verify_password("pw-ada", users["ada"])


def test_a_users_file_others_may_write_is_refused(tmp_path, fast_hashes):
    path = tmp_path / "users.txt"
    auth.add_user(path, "ada", "pw")
    os.chmod(path, 0o666)
    with pytest.raises(AuthError, match="may be written by other users"):
        auth.read_users_file(path)


def test_env_var_takes_plain_pairs_and_hashed_lines(fast_hashes):
    hashed = fast_hashes("pw-bob")
    users = auth.users_from_env({auth.ENV_VAR: f"ada:pw-ada:with:colons\nbob:{hashed}\n"})
    assert users["bob"] == hashed and users["ada"].startswith("scrypt$")  # the plain one hashed as it is read
    assert auth.verify_password("pw-ada:with:colons", users["ada"])
    assert auth.users_from_env({}) is None and auth.users_from_env({auth.ENV_VAR: "  "}) is None


# -- launch.py ------------------------------------------------------------------------------------------------
def test_auth_on_the_command_line_is_refused_saying_why(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.build_parser().parse_args(["--auth", "ada:secret"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--auth" in err and "shows in `ps`" in err and "--auth-file" in err and "HEADINFER_AUTH" in err


def test_launch_reads_users_from_the_file_then_the_env_var(tmp_path, monkeypatch, fast_hashes):
    path = tmp_path / "users.txt"
    auth.add_user(path, "ada", "pw-ada")
    monkeypatch.setenv(auth.ENV_VAR, "bob:pw-bob")
    from_file = cli.make_authenticator(cli.build_parser().parse_args(["--auth-file", str(path)]))
    assert sorted(from_file.users) == ["ada"]
    from_env = cli.make_authenticator(cli.build_parser().parse_args([]))
    assert sorted(from_env.users) == ["bob"] and from_env.verify("bob", "pw-bob")
    monkeypatch.delenv(auth.ENV_VAR)
    assert cli.make_authenticator(cli.build_parser().parse_args([])) is None
    with pytest.raises(AuthError, match="cannot read the users file"):
        cli.make_authenticator(cli.build_parser().parse_args(["--auth-file", str(tmp_path / "none")]))


def test_a_bad_users_file_stops_the_start_before_the_model_loads(tmp_path):
    path = tmp_path / "users.txt"
    path.write_text("ada:hunter2\n")
    os.chmod(path, 0o600)
    result = subprocess.run([sys.executable, "launch.py", "--auth-file", str(path), "--port", "1"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "line 1: holds no password hash" in result.stderr
    assert "Traceback" not in result.stderr


def test_add_user_prompts_for_the_password_and_writes_its_hash(tmp_path, monkeypatch, fast_hashes):
    answers = iter(["s3cret", "s3cret"])
    monkeypatch.setattr("getpass.getpass", lambda prompt="": next(answers))
    path = tmp_path / "users.txt"
    with pytest.raises(SystemExit) as exit_info:
        launch.main(["--add-user", "ada", "--auth-file", str(path)])
    assert exit_info.value.code == 0
    assert auth.verify_password("s3cret", auth.read_users_file(path)["ada"])


# -- the throttle ---------------------------------------------------------------------------------------------
def test_the_sixth_wrong_password_is_refused_unchecked_and_the_lock_doubles(fast_hashes):
    clock = _Clock()
    gate = Authenticator({"ada": fast_hashes("pw-ada")}, throttle=LoginThrottle(clock=clock))
    for _ in range(auth.FREE_FAILURES):
        assert gate.verify("ada", "guess", "10.0.0.9") is False
        clock.now += 0.01
    with pytest.raises(LoginRefused) as refused:  # even the right password: it is not checked during the lock
        gate.verify("ada", "pw-ada", "10.0.0.9")
    assert 0 < refused.value.seconds <= auth.FIRST_LOCK_SECONDS and "try again in" in str(refused.value)
    clock.now += auth.FIRST_LOCK_SECONDS
    assert gate.verify("ada", "guess", "10.0.0.9") is False  # checked again, and failed: a lock twice as long
    assert gate.throttle.wait_seconds("ada", "10.0.0.9") == pytest.approx(2 * auth.FIRST_LOCK_SECONDS)
    clock.now += 2 * auth.FIRST_LOCK_SECONDS
    assert gate.verify("ada", "pw-ada", "10.0.0.9") is True  # the right password, once the lock passed
    assert gate.throttle.wait_seconds("ada", "10.0.0.8") == 0


def test_one_address_trying_many_names_is_slowed_too(fast_hashes):
    clock = _Clock()
    gate = Authenticator({"ada": fast_hashes("pw-ada")}, throttle=LoginThrottle(clock=clock))
    for number in range(auth.FREE_FAILURES_PER_ADDRESS):
        assert gate.verify(f"name{number}", "guess", "10.0.0.9") is False
    with pytest.raises(LoginRefused):
        gate.verify("someone-new", "guess", "10.0.0.9")
    assert gate.verify("ada", "pw-ada", "10.0.0.7") is True  # another address, another name: unaffected
    for number in range(2 * auth.FREE_FAILURES_PER_ADDRESS):  # through the share tunnel: every visitor is loopback
        gate.verify(f"tunnel{number}", "guess", "127.0.0.1")
    assert gate.verify("ada", "pw-ada", "127.0.0.1") is True


def test_a_streak_is_forgotten_after_a_quiet_minute(fast_hashes):
    clock = _Clock()
    gate = Authenticator({"ada": fast_hashes("pw-ada")}, throttle=LoginThrottle(clock=clock))
    for _ in range(auth.FREE_FAILURES - 1):
        gate.verify("ada", "guess", "")
    clock.now += auth.FORGET_SECONDS + 1
    gate.verify("ada", "guess", "")  # a first failure again, not the fifth
    assert gate.throttle.wait_seconds("ada", "") == 0


def test_tracked_names_are_bounded(monkeypatch):
    monkeypatch.setattr(auth, "MAX_TRACKED", 50)
    throttle = LoginThrottle(clock=_Clock())
    for number in range(200):
        throttle.failed(f"made-up-{number}", "")
    assert len(throttle._streaks) == 50


# -- through Gradio's own login route -------------------------------------------------------------------------
def test_gradio_awaits_the_check_and_a_locked_name_gets_429(fast_hashes, caplog):
    gate = Authenticator({"ada": fast_hashes("pw-ada")})
    assert inspect.iscoroutinefunction(gate.check)  # Gradio would call a plain function on its event loop
    with gr.Blocks() as demo:
        gr.Markdown("inside")
    options = startup.with_login_address({"app_kwargs": {"middleware": []}})
    demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True,
                auth=gate.check, auth_message=auth.LOGIN_MESSAGE, **options)
    try:
        login = f"{demo.local_url.rstrip('/')}/login"
        codes = [httpx.post(login, data={"username": "ada", "password": "guess"}, timeout=60).status_code
                 for _ in range(auth.FREE_FAILURES)]
        assert codes == [400] * auth.FREE_FAILURES
        refused = httpx.post(login, data={"username": "ada", "password": "pw-ada"}, timeout=60)
        assert refused.status_code == 429 and "try again in" in refused.json()["detail"]
        assert int(refused.headers["retry-after"]) >= 1
        # The address reached the check through the middleware; loopback (the share tunnel's) locks no one else.
        assert "failed login for 'ada' from 127.0.0.1" in caplog.text
        assert gate.throttle.wait_seconds("someone", "127.0.0.1") == 0
        assert httpx.post(login, data={"username": "bob", "password": "x"}, timeout=60).status_code == 400
    finally:
        demo.close()


# -- the open app's warning -----------------------------------------------------------------------------------
def test_the_page_shows_the_open_warning_only_when_asked():
    from app.ui import build_ui

    with_notice = build_ui(lambda: None, model_info={}, private=True, notice=auth.OPEN_NOTICE)
    without = build_ui(lambda: None, model_info={}, private=True)
    html = [block.value for block in with_notice.blocks.values() if isinstance(block, gr.HTML)
            and block.elem_id == "visitor-notice"]
    assert len(html) == 1 and "open to anyone who has its link" in html[0] and "status-warn" in html[0]
    assert not [b for b in without.blocks.values() if getattr(b, "elem_id", None) == "visitor-notice"]


def test_the_console_warns_when_others_can_reach_the_app_with_no_login(caplog):
    startup.announce_visitors(True, has_auth=False)
    [warning] = [record for record in caplog.records if record.levelname == "WARNING"]
    assert "no login is asked" in warning.getMessage() and "upload documents" in warning.getMessage()
    assert "--auth-file" in warning.getMessage()
    caplog.clear()
    startup.announce_visitors(True, has_auth=True)
    startup.announce_visitors(False, has_auth=False)
    assert not [record for record in caplog.records if record.levelname == "WARNING"]
