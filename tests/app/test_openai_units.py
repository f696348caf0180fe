"""The OpenAI endpoint's parts that need no model: the request checks, stop sequences over a stream, the key, and
launch.py's refusals (a key on the command line, an API others reach without a key)."""

from __future__ import annotations

import argparse

import pytest

from app.openai_api.keys import ENV_VAR, ApiKeyError, allows, read_key
from app.openai_api.schema import ApiError, chat_request, completion_request, parse_body
from app.openai_api.stops import StopWatch
from app.cli import api_key_for, build_parser


def _chat(**fields) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}


def test_a_good_chat_request_is_read_with_openai_defaults():
    request = chat_request(_chat(stop="\n", max_tokens=5, seed=3, stream=True, stream_options={"include_usage": True},
                                 frequency_penalty=0.5, user="someone"))  # unused fields are ignored
    assert request.messages == (("user", "hi"),) and request.stop == ("\n",) and request.max_tokens == 5
    assert request.temperature == 1.0 and request.seed == 3 and request.stream and request.include_usage
    parts = chat_request(_chat(messages=[{"role": "developer", "content": "be brief"},
                                         {"role": "user", "content": [{"type": "text", "text": "a"},
                                                                      {"type": "text", "text": "b"}]}]))
    assert parts.messages == (("system", "be brief"), ("user", "ab"))
    assert completion_request({"model": "m", "prompt": ["once"]}).prompt == "once"


@pytest.mark.parametrize("fields, param", [
    ({"temperature": "hot"}, "temperature"), ({"temperature": 2.5}, "temperature"), ({"top_p": 0}, "top_p"),
    ({"max_tokens": 0}, "max_tokens"), ({"max_tokens": 2.5}, "max_tokens"), ({"max_tokens": True}, "max_tokens"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"), ({"stop": [""]}, "stop"), ({"stop": 3}, "stop"),
    ({"seed": "x"}, "seed"), ({"stream": "yes"}, "stream"), ({"n": 2}, "n"), ({"messages": []}, "messages"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": 7}]}, "messages[0].content"), ({"model": 3}, "model"),
    ({"stream_options": {"include_usage": "y"}}, "stream_options"),
])
def test_a_wrong_field_is_a_400_naming_it(fields, param):
    with pytest.raises(ApiError) as refused:
        chat_request(_chat(**fields))
    assert refused.value.status == 400 and refused.value.param == param
    body = refused.value.body()["error"]
    assert set(body) == {"message", "type", "code", "param"} and body["type"] == "invalid_request_error"


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b"\xff\xfe", b""])
def test_bad_json_is_a_400(raw):
    with pytest.raises(ApiError) as refused:
        parse_body(raw)
    assert refused.value.status == 400 and refused.value.code == "invalid_json"


def test_stop_sequences_hold_back_what_could_begin_one_and_cut_before_it():
    watch = StopWatch(("END", "\n\n"))
    pieces = [watch.push(text) for text in ("Hello E", "Hello EN", "Hello ENx", "Hello ENx wor", "Hello ENx world\n",
                                            "Hello ENx world\n\nmore")]
    assert pieces == ["Hello ", "", "ENx", " wor", "ld", ""] and watch.hit
    assert watch.text == "Hello ENx world" and watch.push("Hello ENx world\n\nmore and more") == ""
    ending = StopWatch(("END",))
    assert ending.push("it ends E") == "it ends " and ending.finish("it ends E") == "E"  # the answer ended: no hold
    assert StopWatch(()).push("free") == "free"


def test_the_key_comes_from_a_file_or_the_environment_never_the_command_line(tmp_path):
    file = tmp_path / "key"
    file.write_text("k" * 20 + "\n")
    assert read_key(str(file), environ={}) == "k" * 20
    assert read_key(None, environ={ENV_VAR: "e" * 20}) == "e" * 20
    assert read_key(None, environ={}) is None
    with pytest.raises(ApiKeyError, match="no file"):
        read_key("sk-this-is-a-key-typed-in-plain", environ={})
    file.write_text("short")
    with pytest.raises(ApiKeyError, match="at least"):
        read_key(str(file), environ={})
    assert allows("k" * 20, "Bearer " + "k" * 20) and allows("k" * 20, "bearer " + "k" * 20)
    assert not allows("k" * 20, "Bearer " + "x" * 20) and not allows("k" * 20, None) and not allows("k" * 20, "k" * 20)
    assert allows(None, None)


def test_launch_refuses_an_api_others_reach_without_a_key(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    args = build_parser().parse_args(["--api"])
    assert api_key_for(args, reachable=False) is None  # loopback, no logins: as open as the page itself
    with pytest.raises(ValueError, match="needs a key"):
        api_key_for(args, reachable=True)
    monkeypatch.setenv(ENV_VAR, "s" * 24)
    assert api_key_for(args, reachable=True) == "s" * 24
    with pytest.raises(ValueError, match="needs --api"):
        api_key_for(argparse.Namespace(api=False, api_key="file"), reachable=False)
