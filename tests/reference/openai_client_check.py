#!/usr/bin/env python3
"""Checks `backpack serve` with the official OpenAI Python client: models, chat (whole and
streamed), text completions, error objects, transcriptions (every response format) and images.

Not part of CI (it needs `pip install openai`). Run against a server started with a text, a
Whisper and an image model, e.g. with the test fixtures:

    backpack serve --model tests/fixtures/models/tiny-qwen2 \\
        --model tests/fixtures/models/tiny-whisper \\
        --model tests/fixtures/models/tiny-sd-turbo --port 8080 --api-key sk-check
    python tests/reference/openai_client_check.py --base http://127.0.0.1:8080/v1 \\
        --key sk-check --audio tests/fixtures/audio/speech_short.wav

With --tools, also an agent's loop (a forced tool call, streamed and whole, its result sent
back) and structured outputs (`response_format` json_object, and `.parse()` with a pydantic
model as json_schema). Tool definitions outgrow the tiny fixture's 256-token context: serve a
real chat model for those, e.g. `--model Qwen/Qwen2.5-0.5B-Instruct-GGUF`.

Prints what the client sees for each endpoint; exits non-zero on the first surprise.
"""

import argparse
import base64
import struct
import sys

import openai
from openai import OpenAI


def check(what, ok, detail=""):
    print(f"{'ok ' if ok else 'FAIL'} {what}{': ' + detail if detail else ''}")
    if not ok:
        sys.exit(1)


def png_size(data):
    check("image is a PNG", data[:8] == b"\x89PNG\r\n\x1a\n")
    return struct.unpack(">II", data[16:24])


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city now",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


def tools_and_structured_outputs(client, model):
    import json
    from typing import Literal

    from pydantic import BaseModel

    ask = {"role": "user", "content": "What is the weather in Paris?"}
    answer = client.chat.completions.create(model=model, messages=[ask], tools=[WEATHER],
                                            tool_choice="required", max_tokens=64)
    choice = answer.choices[0]
    calls = choice.message.tool_calls or []
    check("forced tool call", choice.finish_reason == "tool_calls" and len(calls) >= 1,
          repr(choice.message))
    call = calls[0]
    args = json.loads(call.function.arguments)
    check("tool call arguments", call.function.name == "get_weather"
          and args.get("city") in ("Paris", "Oslo"), call.function.arguments)

    stream = client.chat.completions.create(model=model, messages=[ask], tools=[WEATHER],
                                            tool_choice="required", max_tokens=64, stream=True)
    names, finish = [], None
    for chunk in stream:
        if chunk.choices:
            for delta in chunk.choices[0].delta.tool_calls or []:
                names.append(delta.function.name)
            finish = chunk.choices[0].finish_reason or finish
    check("streamed tool call", names[:1] == ["get_weather"] and finish == "tool_calls",
          f"{names} {finish}")

    messages = [ask, choice.message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temp_c": 21})}]
    final = client.chat.completions.create(model=model, messages=messages, tools=[WEATHER],
                                           max_tokens=64)
    check("answer after the tool result", final.choices[0].message.content is not None,
          repr(final.choices[0].message.content))

    obj = client.chat.completions.create(model=model, messages=[ask], max_tokens=96,
                                         response_format={"type": "json_object"})
    if obj.choices[0].finish_reason == "stop":
        check("json_object parses", isinstance(json.loads(obj.choices[0].message.content), dict),
              obj.choices[0].message.content)

    class Weather(BaseModel):
        city: Literal["Paris", "Oslo"]
        celsius: int

    parsed = client.beta.chat.completions.parse(model=model, messages=[ask], max_tokens=96,
                                                response_format=Weather)
    check("json_schema via .parse()", parsed.choices[0].message.parsed is not None,
          repr(parsed.choices[0].message.content))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default="http://127.0.0.1:8080/v1")
    ap.add_argument("--key", default="sk-none")
    ap.add_argument("--tools", action="store_true",
                    help="also check tool calls and structured outputs (needs a real chat model)")
    ap.add_argument("--audio", help="an audio file for the transcription checks")
    ap.add_argument("--size", default="64x64", help="image size (multiples of the model's step)")
    args = ap.parse_args()
    client = OpenAI(base_url=args.base, api_key=args.key)

    models = [m.id for m in client.models.list().data]
    check("models.list", bool(models), ", ".join(models))
    text_model = models[0]

    chat = client.chat.completions.create(
        model=text_model,
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        temperature=0,
        max_tokens=12,
    )
    whole = chat.choices[0].message.content
    check(
        "chat.completions",
        chat.object == "chat.completion" and chat.usage.completion_tokens > 0,
        f"{whole!r}, finish {chat.choices[0].finish_reason}, usage {chat.usage}",
    )

    pieces, usage = [], None
    stream = client.chat.completions.create(
        model=text_model,
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        temperature=0,
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        if chunk.usage:
            usage = chunk.usage
    check("chat.completions stream", "".join(pieces) == whole and usage is not None,
          f"{len(pieces)} chunks, same text, usage {usage}")

    completion = client.completions.create(model=text_model, prompt="Once upon a time",
                                           temperature=0, max_tokens=8)
    check("completions", completion.choices[0].text is not None,
          repr(completion.choices[0].text))

    try:
        client.chat.completions.create(model=text_model, messages=[], max_tokens=1)
        check("empty messages refused", False)
    except openai.BadRequestError as e:
        check("empty messages refused (400)", e.status_code == 400, e.message)
    try:
        client.chat.completions.create(model=text_model, messages=[{"role": "user", "content": "x"}],
                                       logit_bias={"1": 5})
        check("logit_bias refused", False)
    except openai.BadRequestError as e:
        check("logit_bias refused (400)", e.status_code == 400, e.message)
    if args.tools:
        tools_and_structured_outputs(client, text_model)
    if args.key != "sk-none":
        try:
            OpenAI(base_url=args.base, api_key="wrong", max_retries=0).models.list()
            check("wrong key refused", False)
        except openai.AuthenticationError as e:
            check("wrong key refused (401)", e.status_code == 401, e.message)

    if args.audio:
        with open(args.audio, "rb") as f:
            audio = f.read()
        t = client.audio.transcriptions.create(model="whisper-1", file=("a.wav", audio),
                                               language="en", temperature=0.3)
        check("audio.transcriptions json", isinstance(t.text, str), repr(t.text))
        v = client.audio.transcriptions.create(model="whisper-1", file=("a.wav", audio),
                                               language="en", temperature=0.3,
                                               response_format="verbose_json")
        check("audio.transcriptions verbose_json", v.duration > 0 and v.segments is not None,
              f"{v.duration:.2f} s, {len(v.segments)} segments, language {v.language}")
        for fmt in ["text", "srt", "vtt"]:
            out = client.audio.transcriptions.create(model="whisper-1", file=("a.wav", audio),
                                                     language="en", temperature=0.3,
                                                     response_format=fmt)
            check(f"audio.transcriptions {fmt}", isinstance(out, str), repr(out[:60]))
        tr = client.audio.translations.create(model="whisper-1", file=("a.wav", audio),
                                              temperature=0.3)
        check("audio.translations", isinstance(tr.text, str), repr(tr.text))

    images = client.images.generate(model="sd", prompt="a red fox", size=args.size, n=2,
                                    response_format="b64_json")
    sizes = [png_size(base64.b64decode(d.b64_json)) for d in images.data]
    check("images.generate", len(sizes) == 2, f"{sizes}")
    print("all checks passed")


if __name__ == "__main__":
    main()
