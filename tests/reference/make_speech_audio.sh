#!/usr/bin/env bash
# Speak the test sentences below with espeak-ng and write the speech fixtures:
#
#   tests/fixtures/audio/speech_short.wav   one sentence, 16 kHz mono 16-bit PCM
#   tests/fixtures/audio/speech_two.flac    two sentences, about 1 s apart, 16 kHz FLAC
#   tests/fixtures/audio/speech_long.flac   ten sentences with pauses, over 30 s, 16 kHz FLAC
#   tests/fixtures/audio/speech_short.ogg   the short one as Ogg/Vorbis at 22.05 kHz (lossy)
#   tests/fixtures/audio/speech_short.mp3   the short one as MP3 at 44.1 kHz (lossy)
#
#   apt-get install -y espeak-ng sox libsox-fmt-all
#   tests/reference/make_speech_audio.sh
#
# The voices and rates vary a little from sentence to sentence. Another espeak-ng or sox
# version gives slightly different samples, so after regenerating the audio, regenerate the
# transcripts too (tests/reference/make_whisper_goldens.py).
set -euo pipefail

out="$(cd "$(dirname "$0")/../fixtures" && pwd)/audio"
mkdir -p "$out"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# sox: repeatable (-R), no dither (-D), so the same speech gives the same samples.
SOX=(sox -R -D)
n=0

# say VOICE WORDS_PER_MINUTE "TEXT": speak one sentence, resampled to 16 kHz mono 16-bit.
say() {
    n=$((n + 1))
    espeak-ng -v "$1" -s "$2" -w "$tmp/raw$n.wav" "$3"
    "${SOX[@]}" "$tmp/raw$n.wav" -r 16000 -c 1 -b 16 "$tmp/s$n.wav"
    last="$tmp/s$n.wav"
}

# silence SECONDS: a gap of digital silence at 16 kHz.
silence() {
    n=$((n + 1))
    "${SOX[@]}" -n -r 16000 -c 1 -b 16 "$tmp/z$n.wav" trim 0 "$1"
    last="$tmp/z$n.wav"
}

# One sentence: a name, a time, a day.
say en-us 150 "Doctor Smith will call you back at four o'clock on Tuesday."
"${SOX[@]}" "$last" "$out/speech_short.wav"

# Two sentences, a question first, about one second apart.
parts=()
silence 0.3; parts+=("$last")
say en-gb+f2 165 "Could you send the report to Maria before Friday?"; parts+=("$last")
silence 1.0; parts+=("$last")
say en-us+m3 155 "She needs forty two printed copies for the meeting."; parts+=("$last")
silence 0.4; parts+=("$last")
"${SOX[@]}" "${parts[@]}" -C 8 "$out/speech_two.flac"

# Ten sentences with pauses of different lengths: longer than one 30 s window.
parts=()
silence 0.5; parts+=("$last")
long=(
    "en-us|165|Good afternoon, and welcome to the weekly planning call.|0.8"
    "en-gb|160|Our first topic is the new warehouse in Denver.|0.9"
    "en-us+m3|155|Construction started in March and should finish by the end of October.|1.1"
    "en-us|150|The budget is three point two million dollars, slightly more than we planned.|1.0"
    "en-us|145|After that, Priya will show the new version of the mobile app.|1.4"
    "en-us|150|The number of users grew by eighteen percent in the last quarter.|0.8"
    "en-gb|160|We also fixed most of the crashes reported on older phones.|1.2"
    "en-us|160|Finally, please remember that the office is closed on Monday.|0.9"
    "en-gb|150|Is there anything else we should discuss today?|1.5"
    "en-gb+f2|165|Thank you all, and see you next week.|0.6"
)
for line in "${long[@]}"; do
    IFS='|' read -r voice rate text pause <<<"$line"
    say "$voice" "$rate" "$text"; parts+=("$last")
    silence "$pause"; parts+=("$last")
done
"${SOX[@]}" "${parts[@]}" -C 8 "$out/speech_long.flac"

# Lossy copies of the short sentence, at other sample rates.
"${SOX[@]}" "$out/speech_short.wav" -r 22050 -C 3 "$out/speech_short.ogg"
"${SOX[@]}" "$out/speech_short.wav" -r 44100 -C 64 "$out/speech_short.mp3"

for f in "$out"/speech_*; do
    printf '%-22s %8d bytes  %6.2f s\n' "$(basename "$f")" "$(stat -c %s "$f")" "$(soxi -D "$f")"
done
