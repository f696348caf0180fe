"""``--backend``'s key (a file or ``HEADINFER_BACKEND_KEY``, never the command line) and the stream's event parsing,
without a server."""

from __future__ import annotations

import pytest

from app.backend_client import ENV_VAR, BackendClient, BackendError, _event, read_backend_key


def test_key_from_file_or_environment(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text("sk-team-engine\nignored\n")
    assert read_backend_key(str(key_file), environ={ENV_VAR: "other"}) == "sk-team-engine"  # the file wins
    assert read_backend_key(None, environ={ENV_VAR: " sk-env "}) == "sk-env"
    assert read_backend_key(None, environ={}) is None
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(BackendError, match="empty"):
        read_backend_key(str(tmp_path / "empty"))
    with pytest.raises(BackendError, match="no file"):
        read_backend_key("sk-a-key-typed-on-the-command-line")


def test_base_url_and_key_header():
    client = BackendClient("http://gpu-box:8000/", key="sk-x")
    assert client.base == "http://gpu-box:8000/v1" == BackendClient("http://gpu-box:8000/v1").base
    assert client._http.headers["Authorization"] == "Bearer sk-x"
    assert "Authorization" not in BackendClient("http://gpu-box:8000")._http.headers


def test_stream_events():
    assert _event(": keep-alive") is None and _event("data: [DONE]") is None and _event("data: {oops") is None
    piece = _event('data: {"choices":[{"delta":{"content":"Hi"},"index":0}]}')
    assert piece.text == "Hi" and piece.completion_tokens is None
    end = _event('data: {"choices":[{"delta":{},"finish_reason":"length"}],"usage":{"prompt_tokens":31,'
                 '"completion_tokens":3}}')
    assert (end.text, end.prompt_tokens, end.completion_tokens, end.finish_reason) == ("", 31, 3, "length")
    assert _event('data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":0}}').prompt_tokens == 5


@pytest.mark.parametrize(("argv", "said"), [
    (["--backend-key-file", "k"], "needs --backend"),
    (["--backend", "http://127.0.0.1:9", "--api"], "--api serves this machine's engine"),
    (["--backend", "http://127.0.0.1:9"], "could not be reached"),  # the discard port: nothing listens
])
def test_launch_refuses(argv, said, capsys):
    import launch

    with pytest.raises(SystemExit) as exited:
        launch.main(argv)
    assert exited.value.code == 2 and said in capsys.readouterr().err
