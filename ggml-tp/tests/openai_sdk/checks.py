"""The official `openai` Python client against a running `ggml-tp serve`.

Run by `ggml-tp/tests/openai_sdk.rs` (which starts the server on the tiny llama fixture) as
`python checks.py --base-url http://127.0.0.1:PORT/v1`. Every check is one function taking a
`Context`, registered with `@check` in `CHECKS` and run in that order; a feature gets its own
function (logprobs, logit_bias, n, roles, tools, constrained output, ... are added the same way).
The server's model has a Hermes-style template, so tool calls can be forced.
Each check prints `ok NAME` or `FAILED NAME` with the traceback; the last line is
`openai sdk checks: P ok, F failed`, and the exit status is 1 when any check failed.
"""

import argparse
import asyncio
import json
import sys
import traceback
import urllib.error
import urllib.request

import openai
from openai import AsyncOpenAI, OpenAI

CHECKS = []


def check(fn):
    """Registers `fn` as a check."""
    CHECKS.append(fn)
    return fn


class Context:
    """The clients and what the checks share: the served model's id and a user prompt."""

    def __init__(self, base_url):
        self.base_url = base_url
        self.client = OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)
        self.model = self.client.models.list().data[0].id
        self.messages = [{"role": "user", "content": "Tell me a story about a cat."}]

    def chat(self, **kwargs):
        args = {"model": self.model, "messages": self.messages, "temperature": 0}
        args.update(kwargs)
        return self.client.chat.completions.create(**args)

    def greedy_text(self, max_tokens):
        return self.chat(max_tokens=max_tokens).choices[0].message.content


def raw_request(url, body=None):
    """The status and JSON answer of a GET (or a POST of the bytes `body`) outside the SDK."""
    request = urllib.request.Request(url, data=body, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def expect_400(call, needle=""):
    """`call()` must raise the SDK's BadRequestError with an OpenAI error object naming `needle`."""
    try:
        call()
    except openai.BadRequestError as e:
        assert e.status_code == 400, e.status_code
        error = e.response.json()["error"]
        assert isinstance(error["message"], str) and error["message"], error
        assert isinstance(error["type"], str), error
        assert needle in error["message"], (needle, error)
        return
    raise AssertionError("no 400 for a bad request")


@check
def models_list(ctx):
    models = ctx.client.models.list()
    assert models.object == "list", models
    assert len(models.data) == 1, models
    assert models.data[0].object == "model" and models.data[0].id, models


@check
def chat(ctx):
    r = ctx.chat(max_tokens=8)
    assert r.object == "chat.completion" and r.id, r
    assert r.model == ctx.model, r
    choice = r.choices[0]
    assert choice.message.role == "assistant", choice
    assert isinstance(choice.message.content, str), choice
    assert choice.finish_reason in ("stop", "length"), choice
    u = r.usage
    assert u.prompt_tokens > 0 and 0 < u.completion_tokens <= 8, u
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens, u
    # The same question as content parts gets the same greedy answer.
    parts = [{"role": "user", "content": [{"type": "text", "text": ctx.messages[0]["content"]}]}]
    again = ctx.chat(max_tokens=8, messages=parts)
    assert again.choices[0].message.content == choice.message.content, (again, r)


@check
def completions(ctx):
    r = ctx.client.completions.create(model=ctx.model, prompt="Once upon a time", max_tokens=6, temperature=0)
    assert r.object == "text_completion" and r.id, r
    assert isinstance(r.choices[0].text, str), r
    assert r.choices[0].finish_reason in ("stop", "length"), r
    assert 0 < r.usage.completion_tokens <= 6, r.usage


@check
def streaming_with_usage(ctx):
    want = ctx.greedy_text(12)
    stream = ctx.chat(max_tokens=12, stream=True, stream_options={"include_usage": True})
    text, finish, usage, chunks = "", None, None, 0
    for chunk in stream:
        chunks += 1
        assert chunk.object == "chat.completion.chunk", chunk
        if chunk.usage is not None:
            assert chunk.choices == [], chunk
            usage = chunk.usage
            continue
        delta = chunk.choices[0].delta
        text += delta.content or ""
        finish = chunk.choices[0].finish_reason or finish
    assert text == want, (text, want)
    assert finish in ("stop", "length"), finish
    assert chunks >= 2, chunks
    assert usage is not None and 0 < usage.completion_tokens <= 12, usage
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens, usage
    # Completions stream too.
    pieces = ctx.client.completions.create(
        model=ctx.model, prompt="Once upon a time", max_tokens=6, temperature=0, stream=True
    )
    streamed = "".join(c.choices[0].text for c in pieces if c.choices)
    plain = ctx.client.completions.create(model=ctx.model, prompt="Once upon a time", max_tokens=6, temperature=0)
    assert streamed == plain.choices[0].text, (streamed, plain)


@check
def stop(ctx):
    full = ctx.greedy_text(24)
    assert len(full) > 6, repr(full)
    middle = len(full) // 2
    stop = full[middle : middle + 2]
    want = full[: full.find(stop)]
    r = ctx.chat(max_tokens=24, stop=["never-appears", stop])
    assert r.choices[0].message.content == want, (r, want, stop)
    assert r.choices[0].finish_reason == "stop", r
    stream = ctx.chat(max_tokens=24, stop=[stop], stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == want, (text, want)


@check
def seed(ctx):
    sampled = [ctx.chat(max_tokens=10, temperature=0.9, seed=7).choices[0].message.content for _ in range(2)]
    assert sampled[0] == sampled[1], sampled


@check
def max_tokens(ctx):
    for n in (1, 5):
        r = ctx.chat(max_tokens=n)
        used = r.usage.completion_tokens
        assert 0 < used <= n, (n, r.usage)
        assert r.choices[0].finish_reason == ("length" if used == n else "stop"), r
    r = ctx.chat(max_completion_tokens=3)
    assert r.usage.completion_tokens <= 3, r.usage


@check
def errors(ctx):
    expect_400(lambda: ctx.chat(messages=[]), "empty")
    expect_400(lambda: ctx.chat(max_tokens=8, top_p=2), "top_p")
    expect_400(lambda: ctx.chat(max_tokens="many"))
    expect_400(lambda: ctx.client.completions.create(model=ctx.model, prompt=[10**7], max_tokens=2), "vocabulary")
    # A body that is not JSON at all (the SDK always sends JSON).
    status, answer = raw_request(ctx.base_url + "/chat/completions", b"{not json")
    assert status == 400 and answer["error"]["message"], (status, answer)
    # Still answering after the errors.
    assert ctx.chat(max_tokens=2).choices[0].message.role == "assistant"


SMALL_SCHEMA = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "n": {"type": "integer", "minimum": 0, "maximum": 9},
        "tag": {"enum": ["a", "b"]},
    },
    "required": ["ok", "n", "tag"],
    "additionalProperties": False,
}


def check_small(value):
    """`value` (parsed) follows SMALL_SCHEMA."""
    assert set(value) == {"ok", "n", "tag"}, value
    assert isinstance(value["ok"], bool) and value["tag"] in ("a", "b"), value
    assert isinstance(value["n"], int) and 0 <= value["n"] <= 9, value


@check
def response_format_json_schema(ctx):
    fmt = {"type": "json_schema", "json_schema": {"name": "small", "schema": SMALL_SCHEMA, "strict": True}}
    for seed in (1, 2):
        r = ctx.chat(max_tokens=64, temperature=1.0, seed=seed, response_format=fmt)
        assert r.choices[0].finish_reason == "stop", r
        check_small(json.loads(r.choices[0].message.content))
    # The SDK's typed helper sends the class's strict schema and parses the answer into it.
    from typing import Literal

    from pydantic import BaseModel, Field

    class Small(BaseModel):
        ok: bool
        n: int = Field(ge=0, le=9)
        tag: Literal["a", "b"]

    completions = getattr(ctx.client.chat.completions, "parse", None) or ctx.client.beta.chat.completions.parse
    parsed = completions(model=ctx.model, messages=ctx.messages, max_tokens=64, response_format=Small, seed=3)
    small = parsed.choices[0].message.parsed
    assert isinstance(small, Small), parsed
    check_small(small.model_dump())
    # A schema that is not one is refused.
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}}
    expect_400(lambda: ctx.chat(max_tokens=4, response_format=bad), "JSON schema")


@check
def response_format_json_object(ctx):
    # A bias towards "}" acts within the grammar: the object closes as soon as it may.
    status, tokens = raw_request(ctx.base_url.removesuffix("/v1") + "/tokenize", b'{"content": "}"}')
    assert status == 200 and len(tokens["tokens"]) == 1, tokens
    close = tokens["tokens"][0]
    r = ctx.chat(max_tokens=64, response_format={"type": "json_object"}, logit_bias={str(close): 100})
    assert r.choices[0].finish_reason == "stop", r
    assert json.loads(r.choices[0].message.content) == {}, r
    stream = ctx.chat(max_tokens=64, temperature=1.0, seed=4, stream=True,
                      response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": SMALL_SCHEMA}})
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    check_small(json.loads(text))


@check
def forced_tool_call(ctx):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 6}, "days": {"type": "integer", "minimum": 1, "maximum": 3}},
        "required": ["city", "days"], "additionalProperties": False}}}]
    r = ctx.chat(max_tokens=64, temperature=1.0, seed=5, tools=tools, tool_choice="required")
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", r
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.id and call.function.name == "get_weather", call
    args = json.loads(call.function.arguments)
    assert isinstance(args["city"], str) and len(args["city"]) <= 6, args
    assert args["days"] in (1, 2, 3), args
    # The call and its result go back; the answer that follows is plain text.
    messages = ctx.messages + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"temp": 3}'},
    ]
    final = ctx.chat(max_tokens=8, tools=tools, messages=messages)
    assert isinstance(final.choices[0].message.content, str), final


async def concurrent_streams(ctx, n_streams, n_cancelled, max_tokens):
    """`n_streams` streams at once; the first `n_cancelled` are closed after their first chunk."""
    client = AsyncOpenAI(base_url=ctx.base_url, api_key="unused", max_retries=0, timeout=120)

    async def one(i):
        stream = await client.chat.completions.create(
            model=ctx.model, messages=ctx.messages, temperature=0, max_tokens=max_tokens, stream=True
        )
        text, finish = "", None
        async for chunk in stream:
            if i < n_cancelled:
                await stream.close()
                return None
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
        return text, finish

    try:
        return await asyncio.gather(*(one(i) for i in range(n_streams)))
    finally:
        await client.close()


@check
def concurrency_with_cancellation(ctx):
    want = ctx.greedy_text(16)
    results = asyncio.run(concurrent_streams(ctx, n_streams=8, n_cancelled=3, max_tokens=16))
    assert results[:3] == [None] * 3, results
    for text, finish in results[3:]:
        assert text == want, (text, want)
        assert finish in ("stop", "length"), finish
    # The cancelled streams gave their slots back: the server answers as before.
    assert ctx.greedy_text(16) == want
    status, health = raw_request(ctx.base_url.removesuffix("/v1") + "/health")
    assert status == 200 and health["status"] == "ok", (status, health)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True, help="the server's /v1 URL")
    parser.add_argument("--only", action="append", default=[], help="run only this check (repeatable)")
    args = parser.parse_args()
    unknown = set(args.only) - {c.__name__ for c in CHECKS}
    if unknown:
        parser.error(f"unknown checks: {', '.join(sorted(unknown))}")
    ctx = Context(args.base_url.rstrip("/"))
    print(f"openai {openai.__version__} against {ctx.base_url}, model {ctx.model}")
    passed, failed = 0, 0
    for fn in CHECKS:
        if args.only and fn.__name__ not in args.only:
            continue
        try:
            fn(ctx)
        except Exception:
            failed += 1
            print(f"FAILED {fn.__name__}\n{traceback.format_exc()}", flush=True)
        else:
            passed += 1
            print(f"ok {fn.__name__}", flush=True)
    print(f"openai sdk checks: {passed} ok, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
