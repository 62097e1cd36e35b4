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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default="http://127.0.0.1:8080/v1")
    ap.add_argument("--key", default="sk-none")
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
